//! The reference edge's HTTPS (docs/edge.md, "HTTPS"): the real nginx
//! rendered from roles/edge/nginx.conf.tmpl, a real redis-server holding
//! `tls:<host>` documents made from real openssl certificates, curl with
//! HTTP/2, an nginx stream proxy sending PROXY protocol as the routers'
//! 443 pool does.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use harness::nginx::{Edge, EdgeOptions};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output().expect("run")
}

/// A self-signed certificate for `names` (the first is the CN), P-256:
/// (chain PEM, key PEM, lowercase hex SHA-256 of the DER).
fn certificate(dir: &Path, file: &str, names: &[&str]) -> (String, String, String) {
    let (crt, key) = (
        dir.join(format!("{file}.crt")),
        dir.join(format!("{file}.key")),
    );
    let san: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    let o = run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "30", "-subj"])
        .arg(format!("/CN={}", names[0]))
        .arg("-addext")
        .arg(format!("subjectAltName={}", san.join(",")))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (
        std::fs::read_to_string(&crt).unwrap(),
        std::fs::read_to_string(&key).unwrap(),
        fingerprint_of(&std::fs::read_to_string(&crt).unwrap()),
    )
}

/// Lowercase hex SHA-256 of a PEM certificate's DER.
fn fingerprint_of(pem: &str) -> String {
    let mut c = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(pem.as_bytes()).unwrap();
    let out = String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap();
    out.trim()
        .split_once('=')
        .map(|(_, f)| f.replace(':', "").to_ascii_lowercase())
        .unwrap_or_default()
}

fn tls_doc(chain: &str, key: &str, fp: &str, not_after: u64) -> String {
    format!(
        "{{\"chain\":{},\"fingerprint\":\"{fp}\",\"key\":{},\"not_after\":{not_after}}}",
        json_str(chain),
        json_str(key)
    )
}

/// A certificate for `host`, valid for a day, stored as `tls:<host>` on
/// the Redis at `port`: its fingerprint.
fn store_certificate(port: u16, dir: &Path, file: &str, host: &str) -> String {
    let (chain, key, fp) = certificate(dir, file, &[host]);
    set(
        port,
        &format!("tls:{host}"),
        &tls_doc(&chain, &key, &fp, now() + 86400),
    );
    fp
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `SET key value` through redis-cli (values with newlines).
fn set(port: u16, key: &str, value: &str) {
    let mut c = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "-x", "SET", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
    assert!(c.wait().unwrap().success());
}

fn redis_cli(port: u16, args: &[&str]) {
    let o = run(Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args));
    assert!(o.status.success());
}

/// A new generation: the edge re-reads documents, certificates and the
/// routing table within its 200 ms poll.
fn bump(port: u16) {
    redis_cli(port, &["HINCRBY", "edgeform:meta", "generation", "1"]);
    std::thread::sleep(Duration::from_millis(600));
}

fn site_doc(origin: &str, extra: &str) -> String {
    format!(
        "{{\"cache_rules\":[],\"cached\":false,\"cors_mode\":\"off\",\"edge_rules\":[],\
         \"geo_codes\":\"\",\"geo_mode\":\"off\",\"hotlink_mode\":\"off\",\"ip_list\":\"\",\
         \"ip_mode\":\"off\",\"origin\":\"{origin}\",\"rate_mode\":\"off\",\"waf_mode\":\"off\"{extra}}}"
    )
}

/// The fingerprint of the certificate the edge serves for `sni` on
/// `port` (`None`: the handshake failed), with openssl s_client.
fn served(port: u16, sni: Option<&str>) -> Option<String> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &format!("127.0.0.1:{port}")]);
    match sni {
        Some(s) => cmd.args(["-servername", s]),
        None => cmd.arg("-noservername"),
    };
    let o = run(cmd.stdin(Stdio::null()));
    let text = String::from_utf8_lossy(&o.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text.find("-----END CERTIFICATE-----")? + "-----END CERTIFICATE-----".len();
    Some(fingerprint_of(&text[begin..end]))
}

/// curl over HTTPS to `port` for `url`'s host: (exit code, stdout).
fn curl(port: u16, host: &str, extra: &[&str], path: &str) -> (i32, String) {
    let o = run(Command::new("curl")
        .args(["-sk", "--max-time", "5", "--resolve"])
        .arg(format!("{host}:{port}:127.0.0.1"))
        .args(extra)
        .arg(format!("https://{host}:{port}{path}")));
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

struct Setup {
    redis: harness::Process,
    _origin: Edge,
    edge: Edge,
    dir: tempfile::TempDir,
    origin_url: String,
}

fn setup() -> Setup {
    let redis = harness::redis(&[]);
    let origin = harness::nginx::lua_runner(
        &[],
        "ngx.say('host=', ngx.var.host, ' xff=', ngx.var.http_x_forwarded_for or '', \
         ' upgrade=', ngx.var.http_upgrade or '', ' connection=', ngx.var.http_connection or '')",
    );
    let origin_url = format!("http://127.0.0.1:{}", origin.process.port);
    let dir = tempfile::tempdir().unwrap();
    let p = redis.port;
    redis_cli(p, &["HSET", "edgeform:meta", "generation", "1"]);
    set(
        p,
        "edgeform:routing",
        r#"{"trusted_proxies":[],"nodes":{"router-1":{"roles":["router"],"addresses":["127.0.0.1"]},"edge-1":{"roles":["edge"],"addresses":["127.0.0.5"]}}}"#,
    );
    for host in ["a.test", "x.w.test", "old.test", "bad.test", "other.test"] {
        set(p, &format!("site:{host}"), &site_doc(&origin_url, ""));
    }
    let edge = harness::nginx::edge(&EdgeOptions::new(p));
    Setup {
        redis,
        _origin: origin,
        edge,
        dir,
        origin_url,
    }
}

#[test]
fn certificates_by_sni_from_redis_and_every_bad_case_fails_only_its_handshake() {
    let s = setup();
    let (p, https) = (s.redis.port, s.edge.https_port);
    let (chain, key, fp_a) = certificate(s.dir.path(), "a", &["a.test"]);
    set(
        p,
        "tls:a.test",
        &tls_doc(&chain, &key, &fp_a, now() + 86400),
    );
    let (wc, wk, fp_w) = certificate(s.dir.path(), "w", &["*.w.test"]);
    set(p, "tls:*.w.test", &tls_doc(&wc, &wk, &fp_w, now() + 86400));
    let (oc, ok_, fp_o) = certificate(s.dir.path(), "old", &["old.test"]);
    set(p, "tls:old.test", &tls_doc(&oc, &ok_, &fp_o, now() - 60));
    // Truncated: the first half of a good document.
    let good = tls_doc(&chain, &key, &fp_a, now() + 86400);
    set(p, "tls:bad.test", &good[..good.len() / 2]);
    bump(p);

    assert_eq!(served(https, Some("a.test")), Some(fp_a.clone()), "leaf");
    assert_eq!(served(https, Some("A.Test")), Some(fp_a.clone()), "case");
    assert_eq!(
        served(https, Some("x.w.test")),
        Some(fp_w.clone()),
        "wildcard"
    );
    // One label only: y.x.w.test is not covered by *.w.test.
    assert_eq!(served(https, Some("y.x.w.test")), None, "two labels");
    assert_eq!(served(https, Some("nope.test")), None, "no certificate");
    assert_eq!(served(https, None), None, "no SNI");
    assert_eq!(served(https, Some("old.test")), None, "expired");
    assert_eq!(served(https, Some("bad.test")), None, "corrupt document");
    let long = format!("{}.test", "a".repeat(260));
    assert_eq!(served(https, Some(&long)), None, "oversized SNI");
    // Others keep working after every failure.
    assert_eq!(served(https, Some("a.test")), Some(fp_a.clone()));
    let log = s.edge.error_log();
    assert_eq!(
        log.matches("tls:bad.test is a bad certificate document")
            .count(),
        1,
        "logged once per generation: {log}"
    );
    assert!(!log.contains("PRIVATE KEY"), "{log}");

    // HTTP/2 negotiated (ALPN), TLS 1.2+ only.
    let (code, out) = curl(https, "a.test", &["--http2", "-w", " %{http_version}"], "/");
    assert_eq!(code, 0);
    assert!(out.ends_with(" 2"), "{out}");
    assert!(out.starts_with("host=a.test"), "{out}");
    let (code, _) = curl(https, "a.test", &["--tlsv1.1", "--tls-max", "1.1"], "/");
    assert_ne!(code, 0, "TLS 1.1 refused");

    // Session resumption: a second handshake with the first's session.
    let sess = s.dir.path().join("session.pem");
    let resume = |flag: &str| {
        let o = run(Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{https}")])
            .args(["-servername", "a.test", "-tls1_2", flag])
            .arg(&sess)
            .stdin(Stdio::null()));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(resume("-sess_out").contains("New, TLSv1.2"));
    assert!(resume("-sess_in").contains("Reused, TLSv1.2"), "resumed");

    // A Host other than the SNI: 421 (misdirected request).
    let (_, out) = curl(
        https,
        "a.test",
        &[
            "--http2",
            "-H",
            "Host: other.test",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ],
        "/",
    );
    assert_eq!(out, "421");

    // Renewal: a new certificate under the same key, an apply (new
    // generation), the same worker processes, the new one served.
    let pids = s.edge.worker_pids();
    let (chain2, key2, fp_a2) = certificate(s.dir.path(), "a2", &["a.test"]);
    assert_ne!(fp_a, fp_a2);
    set(
        p,
        "tls:a.test",
        &tls_doc(&chain2, &key2, &fp_a2, now() + 86400),
    );
    // The corrupt one repaired in the same apply.
    set(
        p,
        "tls:bad.test",
        &tls_doc(&chain, &key, &fp_a, now() + 86400),
    );
    bump(p);
    assert_eq!(served(https, Some("a.test")), Some(fp_a2));
    assert_eq!(served(https, Some("bad.test")), Some(fp_a));
    assert_eq!(s.edge.worker_pids(), pids, "no reload, no new workers");
}

/// A viewer behind the routers: PROXY protocol from a router is believed,
/// from anyone else refused, a malformed header closes the connection.
#[test]
fn the_viewer_address_comes_through_a_router_proxy_header_only() {
    let s = setup();
    let (p, proxy_port) = (s.redis.port, s.edge.proxy_port);
    store_certificate(p, s.dir.path(), "a", "a.test");
    bump(p);
    // A router's 443 pool as `edgeform build` writes it: a stream proxy
    // with `proxy_protocol on` to the edge's proxy listener.
    let router = harness::nginx::stream(|listen| {
        format!(
            "stream {{\n upstream edges {{ server 127.0.0.1:{proxy_port}; }}\n \
             server {{ listen {listen}; proxy_pass edges; proxy_protocol on; }}\n}}\n"
        )
    });
    let via = router.process.port;
    // The viewer at 127.0.0.9 (a source address of its own on loopback).
    let (code, out) = curl(via, "a.test", &["--http2", "--interface", "127.0.0.9"], "/");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("xff=127.0.0.9 "),
        "origin saw the viewer: {out}"
    );

    // The same header sent by a non-router (127.0.0.5 is an edge): refused.
    let (code, out) = curl(
        proxy_port,
        "a.test",
        &[
            "--haproxy-protocol",
            "--interface",
            "127.0.0.5",
            "-w",
            "%{http_code}",
        ],
        "/",
    );
    assert!(code != 0 || out.ends_with("000"), "refused: {code} {out}");
    assert!(!out.contains("host="), "{out}");

    // A router added to the routing table works without a reload.
    set(
        p,
        "edgeform:routing",
        r#"{"trusted_proxies":[],"nodes":{"router-1":{"roles":["router"],"addresses":["127.0.0.1"]},"router-2":{"roles":["router"],"addresses":["127.0.0.5"]}}}"#,
    );
    bump(p);
    let (code, out) = curl(
        proxy_port,
        "a.test",
        &["--haproxy-protocol", "--interface", "127.0.0.5"],
        "/",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("xff=127.0.0.5 "), "{out}");

    // A malformed PROXY header: the connection is closed before TLS.
    let mut c = std::net::TcpStream::connect(("127.0.0.1", proxy_port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c.write_all(b"PROXY TCP4 not-an-address 127.0.0.1 1 2\r\n\x16\x03\x01")
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)), "closed");

    // A PROXY header on the direct HTTPS listener is not TLS: refused.
    let (code, _) = curl(s.edge.https_port, "a.test", &["--haproxy-protocol"], "/");
    assert_ne!(code, 0);
    let _ = &s.origin_url;
}

/// Body size, WebSocket upgrades, HTTPS origins verified (a self-signed
/// origin refused unless the site opts out).
#[test]
fn proxy_defaults_body_limit_websocket_and_verified_https_origins() {
    let s = setup();
    let p = s.redis.port;
    let edge = s.edge.process.port;
    // The answer's head to a POST announcing `length` bytes and sending
    // none; `None`: no answer within a second (the edge waits for the body).
    let answer = |host: &str, length: u64| -> Option<String> {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", edge)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        c.write_all(
            format!("POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: {length}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    // Over a site's default 100m: 413 body-too-large from the decision,
    // from the Content-Length alone.
    let a = answer("a.test", 104_857_601).expect("answered before the body");
    assert!(a.starts_with("HTTP/1.1 413"), "{a}");
    assert!(a.contains("X-Edgeform-Reason: body-too-large"), "{a}");
    // A site's max_body_size up to the 1g ceiling raises it, as `explain`
    // says: 200m announced to a 500m site is taken (the edge waits for it).
    set(
        p,
        "site:big.test",
        &site_doc(&s.origin_url, ",\"max_body_size\":524288000"),
    );
    bump(p);
    assert_eq!(answer("big.test", 209_715_200), None, "200m refused");
    // Over the ceiling: nginx's own 413 (client_max_body_size), before
    // any Lua, so without a reason.
    let c = answer("big.test", 1_073_741_825).expect("answered before the body");
    assert!(c.starts_with("HTTP/1.1 413"), "{c}");
    assert!(!c.contains("X-Edgeform-Reason"), "{c}");
    // A site's own max_body_size: 413 body-too-large from the decision.
    set(
        p,
        "site:other.test",
        &site_doc(&s.origin_url, ",\"max_body_size\":10"),
    );
    bump(p);
    let o = run(Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: other.test",
        ])
        .args(["--data-binary", "0123456789abcdef"])
        .arg(format!("http://127.0.0.1:{edge}/")));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "413");

    // WebSocket: Upgrade and Connection reach the origin only when asked.
    let o = run(Command::new("curl")
        .args(["-s", "-H", "Host: a.test"])
        .arg(format!("http://127.0.0.1:{edge}/plain")));
    let plain = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(plain.contains("upgrade= connection=\n"), "{plain}");
    let ws = websocket_origin();
    set(
        p,
        "site:ws.test",
        &site_doc(&format!("http://127.0.0.1:{}", ws.0), ""),
    );
    bump(p);
    let mut c = std::net::TcpStream::connect(("127.0.0.1", edge)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c.write_all(
        b"GET /chat HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // Bytes flow both ways through the tunnel.
    c.write_all(b"ping").unwrap();
    let n = c.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping");
    let seen = ws.1.recv_timeout(Duration::from_secs(3)).unwrap();
    assert!(
        seen.to_ascii_lowercase().contains("upgrade: websocket"),
        "{seen}"
    );
    assert!(
        seen.to_ascii_lowercase().contains("connection: upgrade"),
        "{seen}"
    );

    // An https:// origin with a self-signed certificate: refused (502);
    // the site's explicit opt-out reaches it.
    let origin_tls = tls_origin(s.dir.path());
    // By address (the test edge's resolver answers nothing): verified
    // against the certificate's name `127.0.0.1`.
    let url = format!("https://127.0.0.1:{}", origin_tls.process.port);
    set(p, "site:tls-origin.test", &site_doc(&url, ""));
    set(
        p,
        "site:optout.test",
        &site_doc(&url, ",\"origin_tls_verify\":false"),
    );
    // The same through the TTL hop (a `ttl` cache rule on `.js`).
    let ttl = |extra: &str| {
        site_doc(&url, extra)
            .replace("\"cache_rules\":[]", "\"cache_rules\":[{\"action\":\"ttl\",\"match_type\":\"ext\",\"match_value\":\".js\",\"ttl\":60}]")
            .replace("\"cached\":false", "\"cached\":true")
    };
    set(p, "site:ttl-origin.test", &ttl(""));
    set(
        p,
        "site:ttl-optout.test",
        &ttl(",\"origin_tls_verify\":false"),
    );
    bump(p);
    let code = |host: &str, port: u16| {
        let o = run(Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Host: {host}"))
            .arg(format!("http://127.0.0.1:{port}/")));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(code("tls-origin.test", edge), "502");
    assert_eq!(code("optout.test", edge), "200", "{}", s.edge.error_log());
    let code_js = |host: &str, port: u16| {
        let o = run(Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Host: {host}"))
            .arg(format!("http://127.0.0.1:{port}/a.js")));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(
        code_js("ttl-origin.test", edge),
        "502",
        "the hop verifies too"
    );
    assert_eq!(
        code_js("ttl-optout.test", edge),
        "200",
        "{}",
        s.edge.error_log()
    );
    // A viewer's own X-Edgeform-TLS-Verify changes nothing.
    let o = run(Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .args([
            "-H",
            "Host: ttl-origin.test",
            "-H",
            "X-Edgeform-TLS-Verify: off",
        ])
        .arg(format!("http://127.0.0.1:{edge}/b.js")));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "502");
    // The same origin, its CA trusted (the edge's trust store replaced):
    // verified and served.
    let mut o = EdgeOptions::new(p);
    o.origin_ca = Some(s.dir.path().join("origin.crt"));
    let trusting = harness::nginx::edge(&o);
    assert_eq!(code("tls-origin.test", trusting.process.port), "200");
    assert!(
        s.edge
            .error_log()
            .contains("upstream SSL certificate verify error"),
        "{}",
        s.edge.error_log()
    );
}

/// An origin answering one WebSocket upgrade (101) and echoing bytes;
/// sends the request head it received.
fn websocket_origin() -> (u16, std::sync::mpsc::Receiver<String>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = c.read(&mut buf).unwrap_or(0);
            if n == 0 {
                return;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
        let _ = c.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        );
        let n = c.read(&mut buf).unwrap_or(0);
        let _ = c.write_all(&buf[..n]);
    });
    (port, rx)
}

/// An nginx origin over TLS with a self-signed certificate for
/// `127.0.0.1` (`<dir>/origin.crt`).
fn tls_origin(dir: &Path) -> Edge {
    let _ = certificate(dir, "origin", &["127.0.0.1"]);
    let crt: PathBuf = dir.join("origin.crt");
    let key: PathBuf = dir.join("origin.key");
    harness::nginx::tls_origin(&crt, &key)
}

/// A viewer at a real public address reaches the edge over HTTPS through
/// the router's stream pool (PROXY protocol) and is geo-decided GB there:
/// a site blocking GB refuses it, the same site allowing only GB serves
/// it, and the origin sees it in X-Forwarded-For.
#[test]
fn a_viewer_in_great_britain_through_the_router_pool_is_geo_decided_gb() {
    let s = setup();
    let (p, proxy_port) = (s.redis.port, s.edge.proxy_port);
    let (chain, key, fp) = certificate(s.dir.path(), "geo", &["gb-block.test", "gb-only.test"]);
    for host in ["gb-block.test", "gb-only.test"] {
        set(
            p,
            &format!("tls:{host}"),
            &tls_doc(&chain, &key, &fp, now() + 86400),
        );
    }
    let block = ",\"geo_codes\":\"GB\",\"geo_mode\":\"block\"";
    let only = ",\"geo_codes\":\"GB\",\"geo_mode\":\"allow\"";
    let doc = |extra: &str| {
        site_doc(&s.origin_url, "").replace(",\"geo_codes\":\"\",\"geo_mode\":\"off\"", extra)
    };
    set(p, "site:gb-block.test", &doc(block));
    set(p, "site:gb-only.test", &doc(only));
    bump(p);
    let viewer = harness::netns::Viewer::new(std::net::Ipv4Addr::new(81, 2, 69, 142));
    let gateway = viewer.gateway;
    // The router's 443 pool on every address of this host (the viewer
    // reaches it at its gateway), PROXY protocol to the edge.
    let router = harness::nginx::stream(|listen| {
        let port = listen.rsplit_once(':').unwrap().1;
        format!(
            "stream {{\n upstream edges {{ server 127.0.0.1:{proxy_port}; }}\n \
             server {{ listen {port}; proxy_pass edges; proxy_protocol on; }}\n}}\n"
        )
    });
    let via = router.process.port;
    let get = |host: &str| {
        let o = run(viewer.command("curl").args([
            "-sk",
            "--http2",
            "--max-time",
            "5",
            "-w",
            " %{http_code}",
            "--resolve",
            &format!("{host}:{via}:{gateway}"),
            &format!("https://{host}:{via}/"),
        ]));
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, out) = get("gb-block.test");
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with(" 403"), "blocked as GB: {out}");
    let (code, out) = get("gb-only.test");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("xff=81.2.69.142 "), "{out}");
    assert!(out.ends_with(" 200"), "allowed as GB: {out}");
}

/// Redis emptied (FLUSHALL: its data lost) or unreachable: every worker
/// keeps serving the certificate any one of them last read — a worker
/// that never read the name too (the workers' shared `edge_certs`).
#[test]
fn every_worker_keeps_the_last_read_certificate_when_redis_is_emptied_or_down() {
    let mut redis = harness::redis(&[]);
    let p = redis.port;
    let dir = tempfile::tempdir().unwrap();
    redis_cli(p, &["HSET", "edgeform:meta", "generation", "1"]);
    let fp = store_certificate(p, dir.path(), "a", "a.test");
    let mut o = EdgeOptions::new(p);
    o.workers = 4;
    let edge = harness::nginx::edge(&o);
    let https = edge.https_port;
    // One handshake: one worker has read the certificate.
    assert_eq!(served(https, Some("a.test")), Some(fp.clone()));

    // At once: a worker whose poll has not seen the loss yet must not take
    // Redis's empty answer for the name's.
    redis_cli(p, &["FLUSHALL"]);
    for i in 0..16 {
        assert_eq!(
            served(https, Some("a.test")),
            Some(fp.clone()),
            "emptied, handshake {i}; the edge's log:\n{}",
            edge.error_log()
        );
    }
    redis.kill();
    for i in 0..16 {
        assert_eq!(
            served(https, Some("a.test")),
            Some(fp.clone()),
            "down, handshake {i}"
        );
    }
    assert_eq!(
        served(https, Some("b.test")),
        None,
        "never read: no certificate"
    );
}

/// nginx started: the warm reads every certificate of its own name into
/// the workers' shared cache before any handshake, so a Redis lost right
/// after the start still serves it; a wildcard certificate is not warmed
/// (the names under it are known only when asked for).
#[test]
fn a_started_edge_warms_its_certificates_and_serves_them_through_an_outage() {
    let mut redis = harness::redis(&[]);
    let p = redis.port;
    let dir = tempfile::tempdir().unwrap();
    redis_cli(p, &["HSET", "edgeform:meta", "generation", "1"]);
    let fp = store_certificate(p, dir.path(), "a", "a.test");
    store_certificate(p, dir.path(), "w", "*.wild.test");
    let mut o = EdgeOptions::new(p);
    o.workers = 2;
    let edge = harness::nginx::edge(&o);
    let https = edge.https_port;
    let t = std::time::Instant::now();
    while !edge.error_log().contains("warmed the shared cache") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{}",
            edge.error_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        edge.error_log()
            .contains("0 documents added of 0 read, 1 certificates added of 2 read (generation 1)"),
        "{}",
        edge.error_log()
    );
    redis.kill();
    std::thread::sleep(Duration::from_millis(400));
    for i in 0..8 {
        assert_eq!(
            served(https, Some("a.test")),
            Some(fp.clone()),
            "handshake {i} during the outage\n{}",
            edge.error_log()
        );
    }
    assert_eq!(served(https, Some("x.wild.test")), None);
}
