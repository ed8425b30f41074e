//! The edge's and router's Redis client (`roles/edge/lua/edge_redis.lua`)
//! inside a real nginx against real Redis servers: an ACL user and
//! `requirepass`, a Redis that speaks only TLS (verified against the CA,
//! a wrong CA or name refused, a client certificate presented), and a
//! Sentinel pair through a real failover. Its pure parts run with plain
//! LuaJIT (`scripts/lua/edge_redis_test.lua`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use harness::nginx::Edge;

/// The runner's requests: `/get?key=K` (connect, GET, release),
/// `/set?key=K&value=V`, `/state` (the worker's master).
const CONTENT: &str = r#"
local er = require "edge_redis"
local uri = ngx.var.uri
if uri == "/state" then
  local s = er.state()
  ngx.say(s.master or "none")
  return
end
local r, err = er.connect()
if not r then
  ngx.status = 503
  ngx.say("connect: ", err)
  return
end
local v, e
if uri == "/set" then
  v, e = r:set(ngx.var.arg_key, ngx.var.arg_value)
else
  v, e = r:get(ngx.var.arg_key)
end
if v == nil or v == false then
  ngx.status = 502
  ngx.say("command: ", e)
  return
end
er.release(r)
ngx.say(v == ngx.null and "(nil)" or v)
"#;

/// A Lua runner whose `edge_redis` is initialised with `block` (the node's
/// redis block as JSON); `env` are `env NAME=value;` lines, `ca` the
/// trusted CA file, `hosts` an /etc/hosts text for host names.
fn runner(block: &str, env: &[(&str, &str)], ca: Option<&Path>, hosts: Option<&Path>) -> Edge {
    let root = harness::nginx::repo_root();
    let main: String = env.iter().map(|(k, v)| format!("env {k}={v};\n")).collect();
    let mut http = String::new();
    if let Some(ca) = ca {
        http.push_str(&format!(
            "lua_ssl_trusted_certificate {};\nlua_ssl_verify_depth 3;\n",
            ca.display()
        ));
    }
    // A generous timeout: these tests are about behaviour, on a machine
    // that may be busy (a TLS handshake under load can take 200 ms).
    let hosts = hosts.map_or_else(
        || "{ timeout = 2000 }".to_owned(),
        |h| format!("{{ timeout = 2000, hosts_file = \"{}\" }}", h.display()),
    );
    http.push_str(&format!(
        "init_by_lua_block {{ require(\"edge_redis\").init([==[{block}]==], {hosts}) }}\n"
    ));
    harness::nginx::lua_runner_with(&[root.join("roles/edge/lua")], &main, &http, CONTENT)
}

/// GET `path` from the runner: (status, body).
fn request(port: u16, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: runner\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.trim_end().to_owned())
}

fn redis_cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn set(port: u16, key: &str, value: &str) {
    let reply = harness::raw_command(port, &format!("SET {key} {value}")).unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
}

#[test]
fn the_redis_clients_pure_parts_pass_with_plain_luajit() {
    let root = harness::nginx::repo_root();
    let out = Command::new("luajit")
        .arg(root.join("scripts/lua/edge_redis_test.lua"))
        .arg(&root)
        .output()
        .expect("luajit (apt-get install luajit2)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(", 0 failure(s)"), "{err}");
}

#[test]
fn an_acl_user_and_the_default_user_authenticate_with_the_password_from_the_environment() {
    let r = harness::redis(&["requirepass def4ult", "user reader on >r3ader ~* &* +@all"]);
    let set_auth = |k: &str, v: &str| {
        let reply = harness::raw_command(r.port, &format!("AUTH def4ult\r\nSET {k} {v}")).unwrap();
        assert!(reply.contains("+OK\r\n+OK"), "{reply}");
    };
    set_auth("site:a.example", "doc-a");
    // The ACL user, as `username` and as the URL's user part.
    for block in [
        format!(
            r#"{{"url": "redis://127.0.0.1:{}", "username": "reader", "password_env": "EDGE_TEST_REDIS_PW"}}"#,
            r.port
        ),
        format!(
            r#"{{"url": "redis://reader@127.0.0.1:{}", "password_env": "EDGE_TEST_REDIS_PW"}}"#,
            r.port
        ),
    ] {
        let edge = runner(&block, &[("EDGE_TEST_REDIS_PW", "r3ader")], None, None);
        let port = edge.process.port;
        assert_eq!(
            request(port, "/get?key=site:a.example"),
            (200, "doc-a".into())
        );
        // Again: a pooled connection, already authenticated.
        assert_eq!(
            request(port, "/get?key=site:a.example"),
            (200, "doc-a".into())
        );
        let clients = redis_cli(&[
            "-p",
            &r.port.to_string(),
            "--user",
            "default",
            "--pass",
            "def4ult",
            "--no-auth-warning",
            "CLIENT",
            "LIST",
        ]);
        assert!(clients.contains("user=reader"), "{clients}");
    }
    // The default user (requirepass).
    let block = format!(
        r#"{{"url": "redis://127.0.0.1:{}", "password_env": "EDGE_TEST_REDIS_PW"}}"#,
        r.port
    );
    let edge = runner(&block, &[("EDGE_TEST_REDIS_PW", "def4ult")], None, None);
    assert_eq!(
        request(edge.process.port, "/get?key=site:a.example"),
        (200, "doc-a".into())
    );
}

#[test]
fn a_wrong_or_missing_password_is_an_error_naming_it_and_nginx_keeps_running() {
    let r = harness::redis(&["requirepass def4ult", "user reader on >r3ader ~* +@all"]);
    let block = format!(
        r#"{{"url": "redis://127.0.0.1:{}", "username": "reader", "password_env": "EDGE_TEST_REDIS_PW"}}"#,
        r.port
    );
    let edge = runner(&block, &[("EDGE_TEST_REDIS_PW", "wrong")], None, None);
    let (status, body) = request(edge.process.port, "/get?key=k");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("AUTH as reader refused") && body.contains("WRONGPASS"),
        "{body}"
    );
    assert!(
        !body.contains("wrong"),
        "the password is never shown: {body}"
    );
    // Still serving (the worker did not crash).
    assert_eq!(request(edge.process.port, "/get?key=k").0, 503);
    assert!(
        !edge.error_log().contains("exited on signal"),
        "{}",
        edge.error_log()
    );
    // No variable: refused before connecting unauthenticated.
    let edge = runner(&block, &[], None, None);
    let (status, body) = request(edge.process.port, "/get?key=k");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("environment variable EDGE_TEST_REDIS_PW is not set"),
        "{body}"
    );
}

/// An /etc/hosts naming 127.0.0.1 `redis.test` (not in the certificate)
/// and `localhost` (in it).
fn hosts_file(dir: &Path) -> PathBuf {
    let p = dir.join("hosts");
    std::fs::write(&p, "127.0.0.1 localhost redis.test\n").unwrap();
    p
}

#[test]
fn rediss_connects_with_tls_verified_against_the_ca_and_refuses_a_wrong_ca_or_name() {
    let certs = harness::Certs::new();
    let r = harness::redis_tls_only(&certs, false, &[]);
    let ca = certs.file("ca.pem");
    let cli = |args: &[&str]| {
        let mut all = vec!["--tls", "--cacert", ca.to_str().unwrap(), "-h", "127.0.0.1"];
        let port = r.port.to_string();
        all.extend(["-p", &port]);
        all.extend(args);
        redis_cli(&all)
    };
    assert_eq!(cli(&["SET", "site:a.example", "doc-a"]), "OK");
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(dir.path());
    let block = |host: &str, ca: &Path| {
        format!(
            r#"{{"url": "rediss://{host}:{}", "tls": {{"ca_file": "{}"}}}}"#,
            r.port,
            ca.display()
        )
    };
    // By name (checked, sent as SNI) and by IP address (the chain only).
    for host in ["localhost", "127.0.0.1"] {
        let edge = runner(&block(host, &ca), &[], Some(&ca), Some(&hosts));
        let port = edge.process.port;
        assert_eq!(
            request(port, "/get?key=site:a.example"),
            (200, "doc-a".into()),
            "{host}: {}",
            edge.error_log()
        );
        assert_eq!(
            request(port, "/get?key=site:a.example"),
            (200, "doc-a".into())
        );
    }
    // A name the certificate does not carry.
    let edge = runner(&block("redis.test", &ca), &[], Some(&ca), Some(&hosts));
    let (status, body) = request(edge.process.port, "/get?key=site:a.example");
    assert_eq!(status, 503, "{body}\n{}", edge.error_log());
    assert!(body.contains("TLS: "), "{body}");
    assert!(
        edge.error_log()
            .contains("certificate does not match host \"redis.test\""),
        "{}",
        edge.error_log()
    );
    // Another CA.
    let other = harness::Certs::new();
    let other_ca = other.file("ca.pem");
    let edge = runner(
        &block("localhost", &other_ca),
        &[],
        Some(&other_ca),
        Some(&hosts),
    );
    let (status, body) = request(edge.process.port, "/get?key=site:a.example");
    assert_eq!(status, 503, "{body}\n{}", edge.error_log());
    assert!(body.contains("TLS: "), "{body}");
}

#[test]
fn a_client_certificate_is_presented_when_the_redis_requires_one() {
    let certs = harness::Certs::new();
    let r = harness::redis_tls_only(
        &certs,
        true,
        &["requirepass def4ult", "user reader on >r3ader ~* +@all"],
    );
    let ca = certs.file("ca.pem");
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(dir.path());
    let with_cert = format!(
        r#"{{"url": "rediss://reader@localhost:{}", "password_env": "PW", "tls": {{"ca_file": "{}", "cert_file": "{}", "key_file": "{}"}}}}"#,
        r.port,
        ca.display(),
        certs.file("client.pem").display(),
        certs.file("client.key").display()
    );
    let edge = runner(&with_cert, &[("PW", "r3ader")], Some(&ca), Some(&hosts));
    assert_eq!(
        request(edge.process.port, "/set?key=k&value=v1"),
        (200, "OK".into()),
        "{}",
        edge.error_log()
    );
    assert_eq!(request(edge.process.port, "/get?key=k"), (200, "v1".into()));
    // Without it the server ends the handshake.
    let without = format!(
        r#"{{"url": "rediss://reader@localhost:{}", "password_env": "PW", "tls": {{"ca_file": "{}"}}}}"#,
        r.port,
        ca.display()
    );
    let edge = runner(&without, &[("PW", "r3ader")], Some(&ca), Some(&hosts));
    let (status, body) = request(edge.process.port, "/get?key=k");
    assert_ne!(status, 200, "{body}");
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + limit;
    loop {
        let seen = done();
        if seen.is_none() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {}", seen.unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_sentinel_master_is_resolved_and_followed_through_a_failover() {
    let mut master = harness::redis(&[]);
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", master.port)]);
    let sentinel = harness::sentinel("edge-1", master.port);
    set(master.port, "site:a.example", "v1");
    let block = format!(
        r#"{{"sentinels": ["127.0.0.1:{}"], "master": "edge-1"}}"#,
        sentinel.port
    );
    let edge = runner(&block, &[], None, None);
    let port = edge.process.port;
    assert_eq!(request(port, "/get?key=site:a.example"), (200, "v1".into()));
    assert_eq!(
        request(port, "/state").1,
        format!("127.0.0.1:{}", master.port)
    );
    wait_for("replication", Duration::from_secs(10), || {
        let r = harness::raw_command(replica.port, "GET site:a.example").unwrap_or_default();
        (!r.contains("v1")).then_some(r)
    });
    master.kill();
    // Until Sentinel promotes the replica, connecting fails (the callers
    // keep serving what they hold); nginx keeps answering.
    let (status, body) = request(port, "/get?key=site:a.example");
    assert_ne!(status, 200, "{body}");
    wait_for("failover", Duration::from_secs(30), || {
        let r = harness::raw_command(sentinel.port, "SENTINEL get-master-addr-by-name edge-1")
            .unwrap_or_default();
        (!r.contains(&replica.port.to_string())).then_some(r)
    });
    // The new master's documents.
    wait_for("writable new master", Duration::from_secs(15), || {
        let r = harness::raw_command(replica.port, "SET site:a.example v2").unwrap_or_default();
        (!r.starts_with("+OK")).then_some(r)
    });
    wait_for(
        "the edge on the new master",
        Duration::from_secs(10),
        || {
            let got = request(port, "/get?key=site:a.example");
            (got != (200, "v2".to_owned())).then(|| format!("{got:?}"))
        },
    );
    assert_eq!(
        request(port, "/state").1,
        format!("127.0.0.1:{}", replica.port)
    );
    assert!(
        edge.error_log()
            .contains("lost; asking the Sentinels again")
    );
}

#[test]
fn a_demoted_master_is_left_on_readonly_and_on_its_role() {
    let a = harness::redis(&[]);
    let b = harness::redis(&[&format!("replicaof 127.0.0.1 {}", a.port)]);
    let sentinel = harness::sentinel("edge-1", a.port);
    let block = format!(
        r#"{{"sentinels": ["127.0.0.1:{}"], "master": "edge-1"}}"#,
        sentinel.port
    );
    let edge = runner(&block, &[], None, None);
    let port = edge.process.port;
    assert_eq!(request(port, "/set?key=probe&value=1"), (200, "OK".into()));
    assert_eq!(request(port, "/state").1, format!("127.0.0.1:{}", a.port));
    wait_for("the replica in sync", Duration::from_secs(10), || {
        let r = harness::raw_command(b.port, "GET probe").unwrap_or_default();
        (!r.contains('1')).then_some(r)
    });
    // A failover without a crash: `a` stays up, as a replica of `b`, and
    // the worker's pooled connection to it still works for reads.
    wait_for("manual failover", Duration::from_secs(30), || {
        let _ = harness::raw_command(sentinel.port, "SENTINEL FAILOVER edge-1");
        let r = harness::raw_command(sentinel.port, "SENTINEL get-master-addr-by-name edge-1")
            .unwrap_or_default();
        (!r.contains(&b.port.to_string())).then_some(r)
    });
    wait_for("a demoted", Duration::from_secs(15), || {
        let r = harness::raw_command(a.port, "ROLE").unwrap_or_default();
        (!r.contains("slave")).then_some(r)
    });
    // A write is refused (-READONLY) or the role check finds a replica;
    // either way the worker asks the Sentinel again and lands on `b`.
    wait_for("writes on the new master", Duration::from_secs(10), || {
        let got = request(port, "/set?key=probe&value=2");
        (got != (200, "OK".to_owned())).then(|| format!("{got:?}"))
    });
    assert_eq!(request(port, "/state").1, format!("127.0.0.1:{}", b.port));
    let r = harness::raw_command(b.port, "GET probe").unwrap();
    assert!(r.contains('2'), "{r}");
}

// The geo router reads its table through the same client.

/// A loopback HTTP "edge" at `addr:port` answering every request with
/// `name`.
fn edge_listener(addr: &str, port: u16, name: &'static str) {
    let listener = std::net::TcpListener::bind((addr, port)).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
            });
        }
    });
}

/// The routing table naming one edge at `addr`, and its generation.
fn routing(port: u16, password: Option<&str>, generation: u32, edge: &str, addr: &str) {
    let table = format!(
        r#"{{"nodes":{{"{edge}":{{"roles":["edge"],"location":{{"lat":51.5,"lon":-0.1}},"addresses":["{addr}"]}}}},"trusted_proxies":["127.0.0.1/32"]}}"#
    );
    let port = port.to_string();
    let mut args = vec!["-p", port.as_str(), "--no-auth-warning"];
    if let Some(p) = password {
        args.extend(["-a", p]);
    }
    let with = |more: &[&str]| {
        let mut all = args.clone();
        all.extend(more);
        redis_cli(&all)
    };
    assert_eq!(with(&["SET", "edgeform:routing", &table]), "OK");
    let generation = generation.to_string();
    with(&["HSET", "edgeform:meta", "generation", &generation]);
}

/// A health snapshot with `edges` online, written now.
fn health(path: &Path, edges: &[&str]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let nodes: Vec<String> = edges
        .iter()
        .map(|e| format!(r#""{e}":{{"online":true}}"#))
        .collect();
    std::fs::write(
        path,
        format!(r#"{{"at":{now},"nodes":{{{}}}}}"#, nodes.join(",")),
    )
    .unwrap();
}

/// A request through the router from a London viewer: (status, the
/// `X-Edgeform-Stale` header, body).
fn through(router: &Edge) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", router.process.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET / HTTP/1.0\r\nHost: a.example\r\nX-Forwarded-For: 81.2.69.142\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let stale = head
        .lines()
        .find_map(|l| l.strip_prefix("X-Edgeform-Stale: "))
        .unwrap_or("")
        .to_owned();
    (status, stale, body.to_owned())
}

fn router(o: harness::nginx::RouterOptions) -> Edge {
    harness::nginx::router(&o)
}

/// `user`'s rules as docs/operations.md gives them (`ACL SETUSER <user>
/// …`), with `password`.
fn documented_rules(user: &str, password: &str) -> Vec<String> {
    let docs =
        std::fs::read_to_string(harness::nginx::repo_root().join("docs/operations.md")).unwrap();
    let rules = docs
        .lines()
        .find_map(|l| l.strip_prefix(&format!("ACL SETUSER {user} ")))
        .unwrap_or_else(|| panic!("docs/operations.md has the {user} user"));
    rules
        .split_whitespace()
        .map(|w| {
            if w == "><password>" {
                format!(">{password}")
            } else {
                w.to_owned()
            }
        })
        .collect()
}

#[test]
fn the_router_reads_a_password_redis_and_keeps_its_table_when_the_password_stops_working() {
    let r = harness::redis(&["requirepass def4ult"]);
    let port = r.port.to_string();
    let admin = |more: &[&str]| {
        let mut all = vec!["-p", port.as_str(), "--no-auth-warning", "-a", "def4ult"];
        all.extend(more);
        redis_cli(&all)
    };
    // The router's user with exactly the rules docs/operations.md gives it.
    let rules = documented_rules("router-lua", "r0uter");
    let mut setuser = vec!["ACL", "SETUSER", "router"];
    setuser.extend(rules.iter().map(String::as_str));
    assert_eq!(admin(&setuser), "OK");
    let edge_port = harness::free_port();
    edge_listener("127.0.0.2", edge_port, "edge-a");
    routing(r.port, Some("def4ult"), 1, "edge-a", "127.0.0.2");
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("health.json");
    health(&hf, &["edge-a"]);
    let mut o = harness::nginx::RouterOptions::new(r.port, hf.clone(), edge_port);
    o.redis = Some(format!(
        r#"{{"url": "redis://router@127.0.0.1:{}", "password_env": "ROUTER_TEST_PW"}}"#,
        r.port
    ));
    o.redis_password = Some(("ROUTER_TEST_PW".into(), "r0uter".into()));
    let rt = router(o.clone());
    wait_for(
        "the table read with the password",
        Duration::from_secs(10),
        || {
            let got = through(&rt);
            (got != (200, String::new(), "edge-a".into())).then(|| format!("{got:?}"))
        },
    );
    // The user's password changes and its connections are dropped: the
    // router keeps routing with the table it holds, says so, logs why.
    assert_eq!(
        admin(&["ACL", "SETUSER", "router", "resetpass", ">changed"]),
        "OK"
    );
    admin(&["CLIENT", "KILL", "USER", "router"]);
    wait_for("stale routing", Duration::from_secs(10), || {
        health(&hf, &["edge-a"]);
        let got = through(&rt);
        (got != (200, "routing".into(), "edge-a".into())).then(|| format!("{got:?}"))
    });
    assert!(
        rt.error_log().contains("AUTH as router refused: WRONGPASS"),
        "{}",
        rt.error_log()
    );
    assert!(!rt.error_log().contains("r0uter"));
    // A router that never had the password never has a table.
    o.redis_password = Some(("ROUTER_TEST_PW".into(), "wrong".into()));
    let wrong = router(o);
    std::thread::sleep(Duration::from_millis(500));
    let (status, stale, _) = through(&wrong);
    assert_eq!((status, stale.as_str()), (503, "routing"));
}

#[test]
fn the_router_reads_a_tls_only_redis_and_refuses_another_ca() {
    let certs = harness::Certs::new();
    let r = harness::redis_tls_only(&certs, false, &[]);
    let ca = certs.file("ca.pem");
    let table = r#"{"nodes":{"edge-t":{"roles":["edge"],"location":{"lat":51.5,"lon":-0.1},"addresses":["127.0.0.3"]}},"trusted_proxies":["127.0.0.1/32"]}"#;
    let port = r.port.to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["--tls", "--cacert", ca.to_str().unwrap(), "-h", "127.0.0.1"];
        all.extend(["-p", &port]);
        all.extend(args);
        redis_cli(&all)
    };
    assert_eq!(cli(&["SET", "edgeform:routing", table]), "OK");
    assert_eq!(cli(&["HSET", "edgeform:meta", "generation", "1"]), "1");
    let edge_port = harness::free_port();
    edge_listener("127.0.0.3", edge_port, "edge-t");
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("health.json");
    health(&hf, &["edge-t"]);
    let mut o = harness::nginx::RouterOptions::new(r.port, hf.clone(), edge_port);
    o.redis = Some(format!(
        r#"{{"url": "rediss://127.0.0.1:{}", "tls": {{"ca_file": "{}"}}}}"#,
        r.port,
        ca.display()
    ));
    o.redis_ca = Some(ca.clone());
    let rt = router(o.clone());
    wait_for("the table over TLS", Duration::from_secs(10), || {
        let got = through(&rt);
        (got != (200, String::new(), "edge-t".into())).then(|| format!("{got:?}"))
    });
    let other = harness::Certs::new();
    o.redis = Some(format!(
        r#"{{"url": "rediss://127.0.0.1:{}", "tls": {{"ca_file": "{}"}}}}"#,
        r.port,
        other.file("ca.pem").display()
    ));
    o.redis_ca = Some(other.file("ca.pem"));
    let refused = router(o);
    std::thread::sleep(Duration::from_millis(500));
    let (status, stale, _) = through(&refused);
    assert_eq!((status, stale.as_str()), (503, "routing"));
    assert!(
        refused.error_log().contains("TLS: "),
        "{}",
        refused.error_log()
    );
}

#[test]
fn the_router_follows_a_sentinel_failover_and_routes_meanwhile() {
    let mut master = harness::redis(&[]);
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", master.port)]);
    let sentinel = harness::sentinel("router-1", master.port);
    let edge_port = harness::free_port();
    edge_listener("127.0.0.4", edge_port, "edge-old");
    edge_listener("127.0.0.5", edge_port, "edge-new");
    routing(master.port, None, 1, "edge-old", "127.0.0.4");
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("health.json");
    health(&hf, &["edge-old", "edge-new"]);
    let mut o = harness::nginx::RouterOptions::new(master.port, hf.clone(), edge_port);
    o.redis = Some(format!(
        r#"{{"sentinels": ["127.0.0.1:{}"], "master": "router-1"}}"#,
        sentinel.port
    ));
    let rt = router(o);
    wait_for("the table via Sentinel", Duration::from_secs(10), || {
        let got = through(&rt);
        (got != (200, String::new(), "edge-old".into())).then(|| format!("{got:?}"))
    });
    wait_for("replication", Duration::from_secs(10), || {
        let r = harness::raw_command(replica.port, "GET edgeform:routing").unwrap_or_default();
        (!r.contains("edge-old")).then_some(r)
    });
    master.kill();
    // During the failover: the last table keeps routing.
    let (status, _, body) = through(&rt);
    assert_eq!((status, body.as_str()), (200, "edge-old"));
    wait_for("failover", Duration::from_secs(30), || {
        health(&hf, &["edge-old", "edge-new"]);
        let r = harness::raw_command(sentinel.port, "SENTINEL get-master-addr-by-name router-1")
            .unwrap_or_default();
        (!r.contains(&replica.port.to_string())).then_some(r)
    });
    wait_for("a writable new master", Duration::from_secs(15), || {
        let r = harness::raw_command(replica.port, "SET probe 1").unwrap_or_default();
        (!r.starts_with("+OK")).then_some(r)
    });
    routing(replica.port, None, 2, "edge-new", "127.0.0.5");
    wait_for("the new master's table", Duration::from_secs(10), || {
        health(&hf, &["edge-old", "edge-new"]);
        let got = through(&rt);
        (got != (200, String::new(), "edge-new".into())).then(|| format!("{got:?}"))
    });
}

// The reference edge (the installed template, harness::nginx::edge) reads
// its documents through the same client.

/// A site document proxying to `origin`.
fn site_doc(origin: &str) -> String {
    format!(
        r#"{{"cache_rules":[],"cached":false,"cors_mode":"off","edge_rules":[],"geo_codes":"","geo_mode":"off","hotlink_mode":"off","ip_list":"","ip_mode":"off","origin":"{origin}","rate_mode":"off","waf_mode":"off"}}"#
    )
}

/// `site:<host>` and the generation, with redis-cli `args` (port, auth, TLS).
fn publish(args: &[&str], host: &str, origin: &str, generation: u32) {
    let with = |more: &[&str]| {
        let mut all = args.to_vec();
        all.extend(more);
        redis_cli(&all)
    };
    assert_eq!(
        with(&["SET", &format!("site:{host}"), &site_doc(origin)]),
        "OK"
    );
    with(&[
        "HSET",
        "edgeform:meta",
        "generation",
        &generation.to_string(),
    ]);
}

/// GET / for `host` from the edge: (status, body).
fn get_host(edge: &Edge, host: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", edge.process.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET / HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// An origin at 127.0.0.1:<port> answering `name`.
fn origin(name: &'static str) -> String {
    let port = harness::free_port();
    edge_listener("127.0.0.1", port, name);
    format!("http://127.0.0.1:{port}")
}

#[test]
fn the_edge_authenticates_and_keeps_serving_what_it_read_when_the_password_stops_working() {
    let r = harness::redis(&["requirepass def4ult"]);
    let port = r.port.to_string();
    let admin = ["-p", port.as_str(), "--no-auth-warning", "-a", "def4ult"];
    // The edge's user with exactly the rules docs/operations.md gives it.
    let mut setuser = admin.to_vec();
    setuser.extend(["ACL", "SETUSER", "edge"]);
    let rules = documented_rules("edge-lua", "3dge");
    setuser.extend(rules.iter().map(String::as_str));
    assert_eq!(redis_cli(&setuser), "OK");
    let o1 = origin("origin-1");
    publish(&admin, "a.example", &o1, 1);
    let mut o = harness::nginx::EdgeOptions::new(r.port);
    o.redis = Some(serde_json::json!({
        "url": format!("redis://edge@127.0.0.1:{}", r.port),
        "password_env": "EDGE_TEST_REDIS_PW",
    }));
    o.redis_password = Some(("EDGE_TEST_REDIS_PW".into(), "3dge".into()));
    let edge = harness::nginx::edge(&o);
    assert!(
        !std::fs::read_to_string(&edge.conf)
            .unwrap()
            .contains("3dge\n"),
        "the rendered file names the variable, not the password"
    );
    wait_for(
        "a document as the ACL user",
        Duration::from_secs(10),
        || {
            let got = get_host(&edge, "a.example");
            (got != (200, "origin-1".to_owned())).then(|| format!("{got:?}\n{}", edge.error_log()))
        },
    );
    // The user may SCAN: the edge warmed its shared cache (a.example,
    // added unless the first request had read it already).
    wait_for("the warm", Duration::from_secs(10), || {
        let log = edge.error_log();
        (!log.contains(" of 1 read, 0 certificates added of 0 read (generation 1)")).then_some(log)
    });
    // Written after the warm, and never read by a request.
    assert_eq!(
        redis_cli(&[&admin[..], &["SET", "site:b.example", &site_doc(&o1)]].concat()),
        "OK"
    );
    // The user's password changes, its connections dropped.
    assert_eq!(
        redis_cli(
            &[
                &admin[..],
                &["ACL", "SETUSER", "edge", "resetpass", ">other"]
            ]
            .concat()
        ),
        "OK"
    );
    redis_cli(&[&admin[..], &["CLIENT", "KILL", "USER", "edge"]].concat());
    std::thread::sleep(Duration::from_millis(500));
    // What it read keeps serving; a host it never read cannot be.
    assert_eq!(get_host(&edge, "a.example"), (200, "origin-1".into()));
    assert_eq!(get_host(&edge, "b.example").0, 503);
    let log = edge.error_log();
    assert!(log.contains("AUTH as edge refused: WRONGPASS"), "{log}");
    assert!(!log.contains("exited on signal"), "{log}");
    // An edge with the wrong password from the start reads nothing.
    o.redis_password = Some(("EDGE_TEST_REDIS_PW".into(), "wrong".into()));
    let wrong = harness::nginx::edge(&o);
    assert_eq!(get_host(&wrong, "a.example").0, 503);
    drop(wrong);
    // A user of an older release's rules (no SCAN): the warm is refused,
    // said once, and requests read Redis as before.
    let mut older = admin.to_vec();
    older.extend(["ACL", "SETUSER", "edge", "resetpass", ">3dge", "-scan"]);
    assert_eq!(redis_cli(&older), "OK");
    o.redis_password = Some(("EDGE_TEST_REDIS_PW".into(), "3dge".into()));
    let older = harness::nginx::edge(&o);
    wait_for("the refused warm", Duration::from_secs(10), || {
        let log = older.error_log();
        (!log.contains("cannot warm the shared cache (documents are read on first use): NOPERM"))
            .then_some(log)
    });
    assert_eq!(get_host(&older, "b.example"), (200, "origin-1".into()));
    assert_eq!(
        older.error_log().matches("cannot warm").count(),
        1,
        "{}",
        older.error_log()
    );
}

#[test]
fn the_edge_reads_a_tls_only_redis_and_refuses_another_ca() {
    let certs = harness::Certs::new();
    let r = harness::redis_tls_only(&certs, false, &[]);
    let ca = certs.file("ca.pem");
    let port = r.port.to_string();
    let cli = [
        "--tls",
        "--cacert",
        ca.to_str().unwrap(),
        "-h",
        "127.0.0.1",
        "-p",
        port.as_str(),
    ];
    let o1 = origin("origin-tls");
    publish(&cli, "a.example", &o1, 1);
    // `localhost` by /etc/hosts, checked against the certificate.
    let mut o = harness::nginx::EdgeOptions::new(r.port);
    o.redis = Some(serde_json::json!({
        "url": format!("rediss://localhost:{}", r.port),
        "tls": {"ca_file": ca.display().to_string()},
    }));
    let edge = harness::nginx::edge(&o);
    let conf = std::fs::read_to_string(&edge.conf).unwrap();
    assert!(
        conf.contains(&format!("lua_ssl_trusted_certificate {};", ca.display())),
        "{conf}"
    );
    // (Eventually: a TLS handshake on a busy machine may pass the edge's
    // 200 ms Redis timeout once.)
    wait_for("a document over TLS", Duration::from_secs(10), || {
        let got = get_host(&edge, "a.example");
        (got != (200, "origin-tls".to_owned())).then(|| format!("{got:?}\n{}", edge.error_log()))
    });
    let other = harness::Certs::new();
    o.redis = Some(serde_json::json!({
        "url": format!("rediss://localhost:{}", r.port),
        "tls": {"ca_file": other.file("ca.pem").display().to_string()},
    }));
    let refused = harness::nginx::edge(&o);
    assert_eq!(get_host(&refused, "a.example").0, 503);
    assert!(
        refused.error_log().contains("TLS: "),
        "{}",
        refused.error_log()
    );
}

#[test]
fn the_edge_keeps_serving_through_a_sentinel_failover_then_reads_the_new_master() {
    let mut master = harness::redis(&[]);
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", master.port)]);
    let sentinel = harness::sentinel("edge-1", master.port);
    let (o1, o2) = (origin("origin-old"), origin("origin-new"));
    let mport = master.port.to_string();
    publish(&["-p", mport.as_str()], "a.example", &o1, 1);
    let mut o = harness::nginx::EdgeOptions::new(master.port);
    o.redis = Some(serde_json::json!({
        "sentinels": [format!("127.0.0.1:{}", sentinel.port)],
        "master": "edge-1",
    }));
    let edge = std::sync::Arc::new(harness::nginx::edge(&o));
    wait_for("a document via Sentinel", Duration::from_secs(10), || {
        let got = get_host(&edge, "a.example");
        (got != (200, "origin-old".to_owned())).then(|| format!("{got:?}\n{}", edge.error_log()))
    });
    wait_for("replication", Duration::from_secs(10), || {
        let r = harness::raw_command(replica.port, "GET site:a.example").unwrap_or_default();
        (!r.contains("origin")).then_some(r)
    });
    // Traffic all along: every answer is a document's.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (edge, stop) = (edge.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                answers.push(get_host(&edge, "a.example"));
                std::thread::sleep(Duration::from_millis(20));
            }
            answers
        })
    };
    master.kill();
    wait_for("failover", Duration::from_secs(30), || {
        let r = harness::raw_command(sentinel.port, "SENTINEL get-master-addr-by-name edge-1")
            .unwrap_or_default();
        (!r.contains(&replica.port.to_string())).then(|| format!("{r}\n{}", sentinel.log()))
    });
    wait_for("a writable new master", Duration::from_secs(15), || {
        let r = harness::raw_command(replica.port, "SET probe 1").unwrap_or_default();
        (!r.starts_with("+OK")).then_some(r)
    });
    let rport = replica.port.to_string();
    publish(&["-p", rport.as_str()], "a.example", &o2, 2);
    wait_for("the new master's document", Duration::from_secs(20), || {
        let got = get_host(&edge, "a.example");
        (got != (200, "origin-new".to_owned())).then(|| format!("{got:?}\n{}", edge.error_log()))
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = traffic.join().unwrap();
    assert!(answers.len() > 10, "{}", answers.len());
    let bad: Vec<_> = answers
        .iter()
        .filter(|(s, b)| *s != 200 || (b != "origin-old" && b != "origin-new"))
        .collect();
    assert!(bad.is_empty(), "{bad:?}\n{}", edge.error_log());
}
