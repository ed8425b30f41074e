//! The HTTPS differential: the reference edge (real nginx, its Lua, its
//! certificates from Redis) against `edgeform explain --batch` with
//! `"scheme":"https"`, for requests sent by curl over HTTP/1.1 and h2,
//! directly to the edge's HTTPS listener and through a router's 443 pool
//! (`nginx_stream` as `build` renders it, PROXY protocol) into the edge's
//! PROXY listener — the viewer's address decided through the PROXY
//! header, from network namespaces with MaxMind test addresses. Certificates
//! are made with openssl, imported with `edgeform certs import` and pushed
//! by `edgeform apply`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use compiler::compile::{Addresses, StreamOptions, nginx_stream, pool_with};
use harness::nginx::{Edge, EdgeOptions};

use super::edge::{Origin, Req, Resp, SECRET, compare, explain_batch_in, generate, origin, sites};
use crate::util::{Fixture, edgeform_with_state as edgeform_at, stderr};

/// Every certificate is valid from this date; `apply` runs "then" (the
/// global `--now`), so one that has expired since is pushed, as a
/// certificate that expires after its apply is.
const ISSUED: &str = "20240101000000Z";
const APPLIED: &str = "2024-06-01T00:00:00Z";

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A CA and leaves with chosen validity dates (`openssl ca`).
struct Ca {
    dir: tempfile::TempDir,
}

impl Ca {
    fn new() -> Ca {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("ca.cnf"),
            "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n\
             serial = serial\ndefault_md = sha256\npolicy = p\nunique_subject = no\n\
             copy_extensions = none\n[p]\ncommonName = supplied\n\
             [v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n",
        )
        .unwrap();
        std::fs::write(d.join("index.txt"), "").unwrap();
        std::fs::write(d.join("serial"), "1000\n").unwrap();
        openssl(
            d,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                "/CN=edgeform https differential CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.csr",
            ],
        );
        openssl(
            d,
            &[
                "ca",
                "-batch",
                "-notext",
                "-config",
                "ca.cnf",
                "-selfsign",
                "-keyfile",
                "ca.key",
                "-in",
                "ca.csr",
                "-out",
                "ca.pem",
                "-extensions",
                "v3_ca",
                "-startdate",
                ISSUED,
                "-enddate",
                "20361231000000Z",
            ],
        );
        Ca { dir }
    }

    /// `<name>.chain.pem` (leaf, CA) and `<name>.key` for `dns`, valid
    /// from [`ISSUED`] to `until`.
    fn sign(&self, name: &str, dns: &[&str], until: &str) {
        let d = self.dir.path();
        let san: Vec<String> = dns.iter().map(|n| format!("DNS:{n}")).collect();
        std::fs::write(
            d.join(format!("{name}.ext")),
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\n",
                san.join(",")
            ),
        )
        .unwrap();
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            d,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={}", dns[0]),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        openssl(
            d,
            &[
                "ca",
                "-batch",
                "-notext",
                "-config",
                "ca.cnf",
                "-cert",
                "ca.pem",
                "-keyfile",
                "ca.key",
                "-in",
                &csr,
                "-out",
                &pem,
                "-extfile",
                &format!("{name}.ext"),
                "-startdate",
                ISSUED,
                "-enddate",
                until,
            ],
        );
        let chain = [
            std::fs::read_to_string(d.join(&pem)).unwrap(),
            std::fs::read_to_string(d.join("ca.pem")).unwrap(),
        ]
        .concat();
        std::fs::write(d.join(format!("{name}.chain.pem")), chain).unwrap();
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The generated sites (the HTTP differential's) behind certificate
/// `all`, the wildcard behind `wild`, and the HTTPS cases.
fn https_sites(a: &Origin, b: &Origin) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = sites(a.port, b.port)
        .into_iter()
        .map(|(file, text)| {
            let cert = if file.contains("star") { "wild" } else { "all" };
            (file, format!("{text}tls: {{certificate: {cert}}}\n"))
        })
        .collect();
    let oa = format!("origin: http://127.0.0.1:{}\nloopback: true\n", a.port);
    for (host, extra) in [
        (
            "redirect.test",
            "https_redirect: true\ntls: {certificate: all}\n",
        ),
        ("small.test", "max_body_size: 10\ntls: {certificate: all}\n"),
        (
            "gbblock.test",
            "geo_mode: block\ngeo_codes: [GB]\ntls: {certificate: all}\n",
        ),
        ("expired.test", "tls: {certificate: old}\n"),
        ("notls.test", ""),
    ] {
        list.push((
            format!("sites/{host}.yaml"),
            format!("host: {host}\n{oa}{extra}"),
        ));
    }
    list
}

/// Every name of certificate `all`.
const ALL_NAMES: &[&str] = &[
    "plain.test",
    "www.plain.test",
    "nocache.test",
    "rules.test",
    "geoblock.test",
    "geoallow.test",
    "ipallow.test",
    "ipblock.test",
    "wafdetect.test",
    "wafstrict.test",
    "corsperm.test",
    "corsstrict.test",
    "hotlink.test",
    "strict.test",
    "normal.test",
    "suspended.test",
    "everything.test",
    "redirect.test",
    "small.test",
    "gbblock.test",
];

struct Setup {
    repo: Fixture,
    /// The state directory (made by `certs import`, mode 0700).
    state: PathBuf,
    _state_root: tempfile::TempDir,
    ca: Ca,
    _redis: harness::Process,
    edge: Edge,
    router: Edge,
    a: Origin,
    b: Origin,
}

fn setup() -> Setup {
    let redis = harness::redis(&[]);
    let (a, b) = (origin(), origin());
    let ca = Ca::new();
    ca.sign("all", ALL_NAMES, "20361231000000Z");
    ca.sign("wild", &["*.wild.test"], "20361231000000Z");
    ca.sign("old", &["expired.test"], "20240701000000Z");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    let repo = Fixture::empty();
    repo.write(
        "cluster.yaml",
        b"name: test\ntrusted_proxies: [127.0.0.1/32]\n",
    );
    repo.write(
        "nodes/edge-1.yaml",
        crate::util::edge_1_node(redis.port).as_bytes(),
    );
    // The router whose PROXY header the edge believes: 127.0.0.1.
    repo.write(
        "nodes/router-1.yaml",
        b"name: router-1\nroles: [router]\nregion: eu\nlocation: {lat: 52.0, lon: 4.1}\n\
          addresses: [127.0.0.1]\nloopback: true\n",
    );
    for (file, text) in https_sites(&a, &b) {
        repo.write(&file, text.as_bytes());
    }
    for name in ["all", "wild", "old"] {
        let out = edgeform_at(
            repo.path(),
            &state,
            &[
                "--now",
                APPLIED,
                "certs",
                "import",
                name,
                "--cert",
                ca.file(&format!("{name}.chain.pem")).to_str().unwrap(),
                "--key",
                ca.file(&format!("{name}.key")).to_str().unwrap(),
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "import {name}: {}",
            stderr(&out)
        );
    }
    let mut o = EdgeOptions::new(redis.port);
    o.challenge_secret = SECRET.into();
    o.workers = 2;
    // The edge reads certificates: declared before the apply.
    harness::nginx::declare_bundle(&o);
    let out = edgeform_at(repo.path(), &state, &["--now", APPLIED, "apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let edge = harness::nginx::edge(&o);
    // The router's 443 pool as `build` renders it, listening on every
    // address (netns viewers reach it at their gateway), to the edge's
    // PROXY listener.
    let checked = repo.check();
    let config = checked.config.as_ref().expect("valid repository");
    let router_node = config.nodes.iter().find(|n| n.name == "router-1").unwrap();
    let members = pool_with(config, router_node, Addresses::Any);
    assert_eq!(members.len(), 1, "{members:?}");
    let proxy_port = edge.proxy_port;
    let router = harness::nginx::stream(|listen| {
        let port = listen.rsplit_once(':').unwrap().1;
        let o = StreamOptions {
            listen: port.to_owned(),
            edge_port: Some(proxy_port),
        };
        nginx_stream(config, router_node, &members, &o).replace("198.51.100.1:", "127.0.0.1:")
    });
    Setup {
        repo,
        state,
        _state_root: state_root,
        ca,
        _redis: redis,
        edge,
        router,
        a,
        b,
    }
}

/// How a request is sent.
#[derive(Debug, Clone)]
struct Way {
    /// The URL's host (the SNI); `None`: an address, no SNI.
    name: Option<String>,
    /// Where curl connects: address and port.
    addr: String,
    port: u16,
    http2: bool,
    /// `https` (else plain http).
    tls: bool,
    /// curl's own PROXY header (`--haproxy-protocol`) from `--interface`.
    haproxy_from: Option<String>,
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// One curl process for `shots`, in order (connections reused where
/// curl reuses them): each request's answer (status 0: no answer —
/// handshake failed or the connection was closed) and `<HTTP version>
/// <curl's exit code>`.
fn curl(cmd: Command, ca: &Path, shots: &[(Req, Way)]) -> Vec<(Resp, String)> {
    let mut cmd = cmd;
    let mut conf = String::new();
    for (i, (r, w)) in shots.iter().enumerate() {
        if i > 0 {
            conf.push_str("next\n");
        }
        let scheme = if w.tls { "https" } else { "http" };
        let url_host = w.name.clone().unwrap_or_else(|| w.addr.clone());
        conf.push_str(&format!(
            "url = {}\n",
            quote(&format!("{scheme}://{url_host}:{}{}", w.port, r.url))
        ));
        if let Some(n) = &w.name {
            conf.push_str(&format!(
                "resolve = {}\n",
                quote(&format!("{n}:{}:{}", w.port, w.addr))
            ));
        }
        conf.push_str("path-as-is\nsilent\nmax-time = 5\noutput = \"/dev/null\"\n");
        conf.push_str(&format!("cacert = {}\n", quote(&ca.display().to_string())));
        conf.push_str(if w.http2 { "http2\n" } else { "http1.1\n" });
        if let Some(from) = &w.haproxy_from {
            conf.push_str(&format!("haproxy-protocol\ninterface = {}\n", quote(from)));
        }
        conf.push_str(&format!(
            "header = {}\n",
            quote(&format!("Host: {}", r.host))
        ));
        conf.push_str(&format!("header = \"X-Test-Id: {}\"\n", r.id));
        for (k, v) in &r.headers {
            if !k.eq_ignore_ascii_case("content-length") {
                conf.push_str(&format!("header = {}\n", quote(&format!("{k}: {v}"))));
            }
        }
        match r.method.as_str() {
            "HEAD" => conf.push_str("head\n"),
            "POST" => {
                let n: usize = r
                    .headers
                    .get("Content-Length")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(2);
                conf.push_str(&format!("data-binary = {}\n", quote(&"h".repeat(n))));
            }
            "GET" => {}
            m => conf.push_str(&format!("request = {}\n", quote(m))),
        }
        conf.push_str(&format!(
            "write-out = \"{{\\\"i\\\":{i},\\\"code\\\":\\\"%{{http_code}}\\\",\\\"v\\\":\\\"%{{http_version}}\\\",\\\"exit\\\":%{{exitcode}},\\\"h\\\":%{{header_json}}}}#END#\\n\"\n"
        ));
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), conf).unwrap();
    let out = cmd.arg("-K").arg(file.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut got: Vec<(Resp, String)> = (0..shots.len()).map(|_| Default::default()).collect();
    for rec in text.split("#END#\n").filter(|r| !r.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(rec.trim())
            .unwrap_or_else(|e| panic!("curl's write-out {rec:?}: {e}"));
        let i = v["i"].as_u64().unwrap() as usize;
        let headers = v["h"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, vals)| {
                        Some((k.to_ascii_lowercase(), vals.get(0)?.as_str()?.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        got[i] = (
            Resp {
                status: v["code"].as_str().and_then(|c| c.parse().ok()).unwrap_or(0),
                headers,
            },
            format!(
                "{} {}",
                v["v"].as_str().unwrap_or_default(),
                v["exit"].as_i64().unwrap_or(-1)
            ),
        );
    }
    got
}

/// A counter for the requests' ids (the origins record them).
struct Ids(u64);

impl Ids {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

fn request(id: u64, host: &str, url: &str, method: &str, headers: &[(&str, &str)]) -> Req {
    Req {
        id,
        host: host.into(),
        url: url.into(),
        ip: "127.0.0.1".into(),
        method: method.into(),
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        scheme: Some("https".into()),
        sni: None,
        proxy: None,
    }
}

/// Compare one sent request's answer with explain's; `None`: agree.
fn judge(
    s: &Setup,
    r: &Req,
    w: &Way,
    got: &(Resp, String),
    want: &serde_json::Value,
    cached: &mut BTreeSet<String>,
) -> Option<String> {
    let resp = &got.0;
    // No certificate or an expired one: the handshake fails. A name
    // mismatch is a handshake that succeeds (the SNI's certificate) for a
    // request the decision then answers (421, or nginx's 400).
    let handshake_fails = matches!(want["tls"].as_str(), Some("no-certificate" | "expired"));
    let status = want["status"].as_u64().unwrap_or(0);
    let (version, exit) = got.1.split_once(' ').unwrap_or_default();
    let problem = if handshake_fails {
        // curl's "SSL connect error": the edge failed the handshake.
        (resp.status != 0 || exit != "35").then(|| {
            format!(
                "answered {} (curl exit {exit}) where the handshake fails",
                resp.status
            )
        })
    } else if status == 444 {
        // The connection closed (an empty reply, a reset stream).
        (resp.status != 0 || exit == "35" || exit == "0").then(|| {
            format!(
                "answered {} (curl exit {exit}) where explain says no answer",
                resp.status
            )
        })
    } else if version != if w.http2 { "2" } else { "1.1" } {
        Some(format!("HTTP version {version}"))
    } else {
        let scheme = if w.tls { "https" } else { "http" };
        compare((&s.a, &s.b), scheme, r, resp, want, cached).map(|p| p.replace('\n', " "))
    };
    problem.map(|p| format!("{w:?} {r:?}: {p}\n    explain: {want}"))
}

/// The edge's answers against explain's for `shots`; the disagreements.
fn differ(
    s: &Setup,
    cmd: Command,
    shots: &[(Req, Way)],
    cached: &mut BTreeSet<String>,
    seen: &mut Vec<serde_json::Value>,
) -> (usize, Vec<String>) {
    let reqs: Vec<Req> = shots.iter().map(|(r, _)| r.clone()).collect();
    let want = explain_batch_in(s.repo.path(), Some(&s.state), &reqs);
    assert_eq!(want.len(), reqs.len());
    // One curl per protocol: curl reuses a connection across its
    // transfers, an HTTP/1.1 one even for a transfer that asks for h2.
    let mut order = Vec::new();
    let mut got = vec![Default::default(); shots.len()];
    for http2 in [false, true] {
        let (at, part): (Vec<usize>, Vec<(Req, Way)>) = shots
            .iter()
            .enumerate()
            .filter(|(_, (_, w))| w.http2 == http2)
            .map(|(i, shot)| (i, shot.clone()))
            .unzip();
        if part.is_empty() {
            continue;
        }
        let mut c = Command::new(cmd.get_program());
        c.args(cmd.get_args());
        for (i, g) in at.iter().zip(curl(c, &s.ca.file("ca.pem"), &part)) {
            got[*i] = g;
        }
        order.extend(at);
    }
    let mut bad = Vec::new();
    for i in order {
        let ((r, w), g, e) = (&shots[i], &got[i], &want[i]);
        let mut e2 = e.clone();
        e2["http2_answered"] = serde_json::Value::Bool(g.1.starts_with("2 "));
        seen.push(e2);
        assert_eq!(e["id"], r.id);
        if let Some(p) = judge(s, r, w, g, e, cached) {
            eprintln!("DISAGREE {p}");
            bad.push(p);
        }
    }
    (shots.len(), bad)
}

fn way(name: Option<&str>, port: u16, http2: bool) -> Way {
    Way {
        name: name.map(str::to_owned),
        addr: "127.0.0.1".into(),
        port,
        http2,
        tls: true,
        haproxy_from: None,
    }
}

/// The URL host (SNI) curl can send for a Host header: the host without
/// its port and trailing dot, when that is a name.
fn sni_for(host: &str) -> String {
    let h = edgestate::edge::normalize_host(host);
    if h.is_empty() || h.contains("..") || h.contains(':') {
        "plain.test".into()
    } else {
        h
    }
}

const VIEWERS: &[([u8; 4], &str)] = &[
    ([81, 2, 69, 142], "GB"),
    ([89, 160, 20, 112], "SE"),
    ([216, 160, 83, 56], "US"),
    ([2, 125, 160, 216], "GB"),
];

#[test]
fn explain_equals_the_edge_over_https_directly_and_through_a_router() {
    // Network-namespace viewers need root (the effective uid).
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("skipped: network-namespace viewers need root (CI runs as root)");
        return;
    }
    let started = Instant::now();
    let s = setup();
    std::thread::sleep(Duration::from_millis(400));
    let (https, router) = (s.edge.https_port, s.router.process.port);
    let mut cached = BTreeSet::new();
    let mut ids = Ids(100_000);
    let mut compared = 0;
    let mut bad = Vec::new();
    let mut seen = Vec::new();

    // 1. Generated requests (the HTTP differential's generator), over
    // HTTP/1.1 and h2, directly and through the router from loopback
    // (the router's PROXY address 127.0.0.1 is a trusted proxy: its
    // X-Forwarded-For names the client, as on the direct listener).
    let mut shots = Vec::new();
    for mut r in generate(1500) {
        if r.url.contains('#') {
            continue; // a fragment: curl does not send it
        }
        let k = r.id % 4;
        let sni = sni_for(&r.host);
        r.id = ids.next();
        r.scheme = Some("https".into());
        r.sni = Some(sni.clone());
        let via_router = k >= 2;
        if via_router {
            r.proxy = Some("127.0.0.1".into());
        }
        let w = way(
            Some(&sni),
            if via_router { router } else { https },
            k % 2 == 1,
        );
        shots.push((r, w));
    }
    let (n, mut b) = differ(&s, Command::new("curl"), &shots, &mut cached, &mut seen);
    compared += n;
    bad.append(&mut b);

    // 2. Hostile and HTTPS-specific requests, each four ways.
    let mut hostile: Vec<(Req, Option<&'static str>)> = Vec::new();
    let mut add =
        |host: &str, sni: Option<&'static str>, url: &str, method: &str, h: &[(&str, &str)]| {
            hostile.push((request(0, host, url, method, h), sni));
        };
    add("nocache.test", Some("plain.test"), "/", "GET", &[]); // SNI ≠ Host: 421
    add("plain.test", Some("plain.test"), "/", "GET", &[]);
    add("PLAIN.test:443", Some("plain.test"), "/q?x=1", "GET", &[]);
    add("plain.test", None, "/", "GET", &[]); // no SNI
    add("unknown.test", Some("unknown.test"), "/", "GET", &[]);
    add("notls.test", Some("notls.test"), "/", "GET", &[]);
    add("expired.test", Some("expired.test"), "/", "GET", &[]);
    add("a.wild.test", Some("a.wild.test"), "/", "GET", &[]);
    add("x.y.wild.test", Some("x.y.wild.test"), "/", "GET", &[]);
    add("b.wild.test", Some("a.wild.test"), "/", "GET", &[]);
    add("redirect.test", Some("redirect.test"), "/p?q=1", "GET", &[]);
    add(
        "small.test",
        Some("small.test"),
        "/up",
        "POST",
        &[("Content-Length", "16")],
    );
    add(
        "small.test",
        Some("small.test"),
        "/up",
        "POST",
        &[("Content-Length", "10")],
    );
    for p in [
        "/%2e%2e/etc/passwd",
        "/a%2Fb",
        "/x/..%2Fgone",
        "/%67one",
        "//gone",
        "/caf%c3%a9",
    ] {
        add("rules.test", Some("rules.test"), p, "GET", &[]);
    }
    add(
        "geoallow.test",
        Some("geoallow.test"),
        "/",
        "GET",
        &[("X-Forwarded-For", "216.160.83.56")],
    );
    add(
        "geoallow.test",
        Some("geoallow.test"),
        "/",
        "GET",
        &[("X-Forwarded-For", "81.2.69.142")],
    );
    let mut shots = Vec::new();
    for (r, sni) in &hostile {
        for k in 0..4 {
            let mut r = r.clone();
            r.id = ids.next();
            r.sni = Some(sni.unwrap_or_default().to_owned());
            let via_router = k >= 2;
            if via_router {
                r.proxy = Some("127.0.0.1".into());
            }
            let w = way(*sni, if via_router { router } else { https }, k % 2 == 1);
            shots.push((r, w));
        }
    }
    // https_redirect on plain HTTP: 301 to https.
    let mut r = request(ids.next(), "redirect.test", "/p?q=1", "GET", &[]);
    r.scheme = None;
    shots.push((
        r,
        Way {
            tls: false,
            ..way(Some("redirect.test"), s.edge.process.port, false)
        },
    ));
    // A PROXY header straight to the edge's PROXY listener: from a
    // router's address believed, from another (127.0.0.5) refused — before
    // the path check (a non-canonical or bad path is not answered either).
    for (from, http2, path) in [
        ("127.0.0.1", false, "/"),
        ("127.0.0.5", false, "/"),
        ("127.0.0.5", true, "/"),
        ("127.0.0.1", false, "//a/./b"),
        ("127.0.0.5", false, "//a/./b"),
        ("127.0.0.5", false, "/a/%2e%2e/%2e%2e/b"),
    ] {
        let mut r = request(ids.next(), "plain.test", path, "GET", &[]);
        r.ip = from.into();
        r.proxy = Some(from.into());
        r.sni = Some("plain.test".into());
        shots.push((
            r,
            Way {
                haproxy_from: Some(from.into()),
                ..way(Some("plain.test"), s.edge.proxy_port, http2)
            },
        ));
    }
    let (n, mut b) = differ(&s, Command::new("curl"), &shots, &mut cached, &mut seen);
    compared += n;
    bad.append(&mut b);

    // 3. Viewers at public addresses through the router: the viewer is
    // the PROXY address (not a trusted proxy: its own X-Forwarded-For is
    // ignored), geo- and IP-decided at the edge.
    let mut countries = BTreeMap::new();
    for (addr, country) in VIEWERS {
        let addr = Ipv4Addr::from(*addr);
        let viewer = harness::netns::Viewer::new(addr);
        let gw = viewer.gateway.to_string();
        let mut shots = Vec::new();
        for host in [
            "geoblock.test",
            "geoallow.test",
            "gbblock.test",
            "ipallow.test",
            "ipblock.test",
            "everything.test",
            "plain.test",
            "normal.test",
        ] {
            for (k, xff) in [
                (0, None),
                (1, Some("81.2.69.142")),
                (2, Some("175.16.199.1")),
            ] {
                let headers: Vec<(&str, &str)> =
                    xff.map(|x| ("X-Forwarded-For", x)).into_iter().collect();
                let mut r = request(ids.next(), host, "/", "GET", &headers);
                r.sni = Some(host.into());
                r.proxy = Some(addr.to_string());
                let mut w = way(Some(host), router, k % 2 == 1);
                w.addr = gw.clone();
                shots.push((r, w));
            }
        }
        let (n, mut b) = differ(&s, viewer.command("curl"), &shots, &mut cached, &mut seen);
        compared += n;
        bad.append(&mut b);
        // Decided on the viewer: its country, whatever X-Forwarded-For said.
        for e in &seen[seen.len() - n..] {
            assert_eq!(e["client_ip"], addr.to_string(), "{e}");
            assert_eq!(e["country"], *country, "{e}");
        }
        countries.insert(addr.to_string(), *country);
    }

    // 4. The rate limit and the challenge are the viewer's, not the
    // router's: on strict.test (5/s, burst 10) one viewer with its own
    // clearance cookie goes over the burst, the next viewer through the
    // same router is served.
    let strict = |viewer: &harness::netns::Viewer, n: usize, ids: &mut Ids| {
        let token = edgestate::edge::clearance_token(
            SECRET.as_bytes(),
            "strict.test",
            std::net::IpAddr::V4(viewer.addr),
            4_000_000_000,
        );
        let cookie = format!("edgeform_clearance={token}");
        let mut w = way(Some("strict.test"), router, true);
        w.addr = viewer.gateway.to_string();
        let shots: Vec<(Req, Way)> = (0..n)
            .map(|_| {
                let r = request(
                    ids.next(),
                    "strict.test",
                    "/",
                    "GET",
                    &[("Cookie", &cookie)],
                );
                (r, w.clone())
            })
            .collect();
        curl(viewer.command("curl"), &s.ca.file("ca.pem"), &shots)
    };
    let over = strict(
        &harness::netns::Viewer::new(Ipv4Addr::new(89, 160, 20, 112)),
        30,
        &mut ids,
    );
    let limited = over
        .iter()
        .filter(|(r, _)| r.status == 429 && r.header("x-edgeform-reason") == Some("rate-limited"))
        .count();
    assert_eq!(over[0].0.status, 200, "the viewer's own clearance cookie");
    assert!(limited > 0, "no 429 after 30 requests from one viewer");
    let next = strict(
        &harness::netns::Viewer::new(Ipv4Addr::new(216, 160, 83, 56)),
        1,
        &mut ids,
    );
    assert_eq!(
        next[0].0.status, 200,
        "another viewer through the same router"
    );

    // Every HTTPS outcome and the viewer-address answers were exercised.
    let said = |field: &str| -> BTreeSet<String> {
        seen.iter()
            .filter_map(|e| e[field].as_str().map(str::to_owned))
            .collect()
    };
    for t in ["ok", "no-certificate", "expired", "name-mismatch"] {
        assert!(said("tls").contains(t), "no tls `{t}`: {:?}", said("tls"));
    }
    for r in [
        "misdirected-request",
        "https-redirect",
        "body-too-large",
        "proxy-refused",
        "geo-blocked",
        "geo-not-allowed",
        "ip-not-allowed",
        "ip-blocked",
        "non-canonical-path",
        "bad-path",
    ] {
        assert!(said("reason").contains(r), "no `{r}`: {:?}", said("reason"));
    }
    let h2 = seen.iter().filter(|e| e["http2_answered"] == true).count();
    assert!(h2 > 100, "only {h2} answers over h2");
    eprintln!(
        "https differential: {compared} requests compared, {} disagreements, viewers {countries:?}, \
         {limited} of 30 rate-limited, {h2} answered over h2, {:.1} s",
        bad.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        bad.is_empty(),
        "{} of {compared} requests disagree (first: {})\n{}",
        bad.len(),
        bad[0],
        s.edge
            .error_log()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// One request to `127.0.0.1:port` over TLS (SNI the agent's probe host,
/// which the edge's placeholder certificate serves; Host `host`; no
/// certificate check), after `header` sent in the clear (a PROXY line):
/// the response's status line, or what ended it (`closed …`).
fn behind_header(port: u16, header: &str, host: &str) -> String {
    let script = r#"
import socket, ssl, sys
port, header, host = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sni = "edgeform-probe.invalid"
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(header.encode().decode("unicode_escape").encode("latin-1"))
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname=sni)
    t.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode())
    data = t.recv(4096)
    print(data.split(b"\r\n")[0].decode() if data else "closed without an answer")
except (ssl.SSLError, OSError) as e:
    print("closed: %s" % type(e).__name__)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &port.to_string(), header, host])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// A PROXY header without an address (`PROXY UNKNOWN`, or a v2 LOCAL
// header) on the routers' listener from a peer that is not a router is
// refused like one with an address: nginx leaves no address to check, so
// the template marks the listener. Only the agent's serving probe (its
// reserved host, answered 204 and nothing else) passes behind one; any
// other host is answered on a direct connection (404: unknown host).
#[test]
fn a_proxy_header_without_an_address_from_a_non_router_is_refused() {
    let r = harness::redis(&[]);
    let edge = harness::nginx::edge(&harness::nginx::EdgeOptions::new(r.port));
    let probe = "edgeform-probe.invalid";
    let other = "other.test";
    assert_eq!(
        behind_header(edge.https_port, "", other),
        "HTTP/1.1 404 Not Found"
    );
    let v2_local = "\\r\\n\\r\\n\\x00\\r\\nQUIT\\n\\x20\\x00\\x00\\x00";
    for header in ["PROXY UNKNOWN\\r\\n", v2_local] {
        let got = behind_header(edge.proxy_port, header, other);
        assert!(got.starts_with("closed"), "{header}: {got}");
        assert_eq!(
            behind_header(edge.proxy_port, header, probe),
            "HTTP/1.1 204 No Content",
            "{header}"
        );
    }
    // With an address, from a non-router: refused, the probe host too.
    for host in [other, probe] {
        let got = behind_header(
            edge.proxy_port,
            "PROXY TCP4 81.2.69.142 127.0.0.1 5000 443\\r\\n",
            host,
        );
        assert!(got.starts_with("closed"), "{host}: {got}");
    }
}
