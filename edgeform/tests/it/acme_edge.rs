//! ACME HTTP-01 challenges answered by the real reference edge (nginx +
//! Lua) from its real Redis (`acme:<token>`), before every site rule, and
//! reached through the real geo router when GeoIP has no location for the
//! CA's address (docs/edge.md and docs/router.md, "ACME challenges").
//! `explain` and `edgeform route --geo --acme-host` decide alike.

use std::collections::BTreeMap;
use std::time::Duration;

use harness::nginx::{EdgeOptions, RouterOptions};

use super::edge::{Req, explain_batch};
use crate::util::{
    Answer, Fixture, edge_1_node, edgeform, edgeform_with_state as edgeform_at, exchange, stderr,
    stdout,
};

/// A token as CAs send them (43 base64url characters) and its key
/// authorization (`<token>.<account key thumbprint>`).
const TOKEN: &str = "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0";
const KEY_AUTH: &str =
    "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0.9jg46WB3rR_AHD-EBXdN7cBkH1WOu0tA3M9fm21mqTI";

/// Sites whose rules would refuse or redirect a viewer: none applies to a
/// challenge.
const SITES: &[(&str, &str)] = &[
    ("geo.test", "geo_mode: allow\ngeo_codes: [DE]\n"),
    ("ipdeny.test", "ip_mode: allow\nip_list: [10.0.0.0/8]\n"),
    (
        "redirect.test",
        "https_redirect: true\ntls: {certificate: redirect}\n",
    ),
    ("waf.test", "waf_mode: strict\n"),
    ("strict.test", "rate_mode: strict\n"),
    (
        "rules.test",
        "edge_rules:\n  - {match_type: prefix, match_value: /, action: redirect, \
         redirect_to: \"https://elsewhere.test/\", redirect_status: 302}\n",
    ),
];

/// The repository, and its state directory holding redirect.test's
/// certificate (`https_redirect` needs one).
fn repo(redis_port: u16, origin: u16) -> (Fixture, tempfile::TempDir) {
    let f = Fixture::empty();
    let state = tempfile::tempdir().unwrap();
    let ca = harness::sitecerts::SiteCerts::new();
    ca.sign("redirect", &["redirect.test"], 30);
    let out = edgeform_at(
        f.path(),
        &state.path().join("state"),
        &[
            "certs",
            "import",
            "redirect",
            "--cert",
            ca.file("redirect.chain.pem").to_str().unwrap(),
            "--key",
            ca.file("redirect.key").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "import: {}", stderr(&out));
    f.write(
        "cluster.yaml",
        b"name: test\ntrusted_proxies: [127.0.0.1/32]\n",
    );
    f.write("nodes/edge-1.yaml", edge_1_node(redis_port).as_bytes());
    for (host, extra) in SITES {
        f.write(
            &format!("sites/{host}.yaml"),
            format!(
                "host: {host}\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n{extra}"
            )
            .as_bytes(),
        );
    }
    (f, state)
}

fn apply(f: &Fixture, state: &tempfile::TempDir, node: Option<&str>) {
    let mut args = vec!["apply", "--yes"];
    if let Some(n) = node {
        args.extend(["--node", n]);
    }
    let out = edgeform_at(f.path(), &state.path().join("state"), &args);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
}

fn ask(port: u16, method: &str, host: &str, target: &str) -> Answer {
    // A viewer outside every allow list, from a country not allowed
    // (81.2.69.142: GB in the test database), through the trusted proxy.
    exchange(
        port,
        &format!(
            "{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
             X-Forwarded-For: 81.2.69.142\r\n\r\n"
        ),
        Duration::from_secs(10),
    )
}

fn set(redis_port: u16, key: &str, value: &str) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{redis_port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("EX")
        .arg(600)
        .exec(&mut c)
        .unwrap();
}

fn path(token: &str) -> String {
    format!("/.well-known/acme-challenge/{token}")
}

/// The edge answers a challenge from `acme:<token>` for every site, even
/// one whose rules refuse the viewer, and for a host with no site; an
/// absent or hostile token is a 404 (never a 5xx, no key listing); the
/// same requests through `explain` give the same answers; Redis stopped
/// is a 503 with its reason.
#[test]
fn the_edge_answers_acme_challenges_from_redis_before_any_site_rule() {
    let mut redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let (f, state) = repo(redis.port, origin);
    let o = EdgeOptions::new(redis.port);
    harness::nginx::declare_bundle(&o);
    apply(&f, &state, None);
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    set(redis.port, &edgestate::keys::acme(TOKEN), KEY_AUTH);
    std::thread::sleep(Duration::from_millis(300));

    // The rules apply to any other path (the sites are as hostile as
    // intended).
    assert_eq!(ask(port, "GET", "geo.test", "/").status, 403);
    assert_eq!(ask(port, "GET", "ipdeny.test", "/").status, 403);
    assert_eq!(ask(port, "GET", "redirect.test", "/").status, 301);
    assert_eq!(ask(port, "GET", "waf.test", "/?q=<script>").status, 403);
    assert_eq!(ask(port, "GET", "strict.test", "/").status, 403);
    assert_eq!(ask(port, "GET", "rules.test", "/").status, 302);

    let mut hosts: Vec<&str> = SITES.iter().map(|(h, _)| *h).collect();
    hosts.push("no-site-here.test");
    for host in &hosts {
        let a = ask(port, "GET", host, &path(TOKEN));
        assert_eq!(a.status, 200, "{host}: {a:?}\n{}", edge.error_log());
        assert_eq!(a.body, KEY_AUTH, "{host}");
        assert_eq!(a.header("content-type"), Some("application/octet-stream"));
        assert_eq!(a.header("cache-control"), Some("no-store"));
        assert_eq!(a.header("x-edgeform-reason"), Some("acme-challenge"));
        let h = ask(port, "HEAD", host, &path(TOKEN));
        assert_eq!((h.status, h.body.as_str()), (200, ""), "{host} HEAD");
    }
    // A valid token with no key: 404.
    let a = ask(port, "GET", "geo.test", &path("AbsentTokenAbsentToken"));
    assert_eq!(
        (a.status, a.header("x-edgeform-reason")),
        (404, Some("acme-unknown-token"))
    );
    assert!(!a.body.contains("acme:"), "{}", a.body);

    // Hostile tokens, differentially: the edge and explain agree on each
    // (status and reason), none is a 5xx, none lists a key.
    let hostile = [
        path(TOKEN),
        path(&format!("{TOKEN};x=1")),
        path(&format!("{TOKEN}?q=1")),
        format!("/.well-known;p/acme-challenge/{TOKEN}"),
        path("AbsentTokenAbsentToken").replace("Absent", "Abs"),
        path("short"),
        path(&"a".repeat(129)),
        path(&"a".repeat(2000)),
        path(""),
        path("*"),
        path("acme:*"),
        path(&format!("{TOKEN}=")),
        path(&format!("{TOKEN}/x")),
        path("..%2F..%2Fetc%2Fpasswd"),
        path("abcdefgh%2Fijklmnop"),
        path("../../etc/passwd"),
        path("%2e%2e/%2e%2e/"),
        path("abcdefgh%C3%A9t%C3%A9"),
        path("abcdefgh\u{e9}t\u{e9}"),
        path("abcdefgh%00"),
        path("abcdefgh%0d%0aSet-Cookie:x"),
        "//.well-known/acme-challenge/x".to_owned(),
        "/.well-known/ACME-challenge/abcdefghij".to_owned(),
        "/.well-known/acme-challenge".to_owned(),
    ];
    let mut reqs = Vec::new();
    for (i, target) in hostile.iter().enumerate() {
        for (j, host) in ["ipdeny.test", "waf.test", "no-site-here.test"]
            .iter()
            .enumerate()
        {
            for (k, method) in ["GET", "HEAD", "POST"].iter().enumerate() {
                let mut headers = BTreeMap::new();
                headers.insert("X-Forwarded-For".to_owned(), "81.2.69.142".to_owned());
                reqs.push(Req {
                    id: (i * 9 + j * 3 + k) as u64,
                    host: (*host).to_owned(),
                    url: target.clone(),
                    ip: "127.0.0.1".into(),
                    method: (*method).to_owned(),
                    headers,
                    scheme: None,
                    sni: None,
                    proxy: None,
                });
            }
        }
    }
    let want = explain_batch(f.path(), &reqs);
    let mut disagree = Vec::new();
    let mut challenges = 0;
    for (r, w) in reqs.iter().zip(&want) {
        let a = ask(port, &r.method, &r.host, &r.url);
        assert!(a.status < 500, "{} {} {}: {a:?}", r.method, r.host, r.url);
        assert!(!a.body.contains("acme:"), "{}", a.body);
        let verdict = w["verdict"].as_str().unwrap_or_default();
        let mut status = w["status"].as_u64().unwrap_or(0);
        let mut reason = w["reason"].as_str();
        if verdict == "acme_challenge" {
            challenges += 1;
            assert_eq!(w["answered_by"], "edge", "{w}");
            // explain: answered from acme:<token>; only TOKEN's key is set.
            if !r.url.contains(TOKEN) {
                (status, reason) = (404, Some("acme-unknown-token"));
            }
        }
        // Proxied: the origin's answer; nginx's own 400: no reason header.
        let want_reason = match (verdict, reason) {
            ("proxy", _) | (_, Some("bad-request")) => None,
            _ => reason,
        };
        if u64::from(a.status) != status || a.header("x-edgeform-reason") != want_reason {
            disagree.push(format!(
                "{} {} {}: edge {} {:?}, explain {status} {want_reason:?}",
                r.method,
                r.host,
                r.url,
                a.status,
                a.header("x-edgeform-reason")
            ));
        }
    }
    assert!(challenges >= 12, "only {challenges} challenge answers");
    assert!(disagree.is_empty(), "{}", disagree.join("\n"));

    // explain in words: before the site rules.
    let out = edgeform(
        f.path(),
        &[
            "explain",
            "--host",
            "ipdeny.test",
            "--url",
            &path(TOKEN),
            "--ip",
            "81.2.69.142",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("before any site rule"),
        "{}",
        stdout(&out)
    );

    // The HTTPS listener does not answer challenges (HTTP-01 is port 80
    // only): the site's rules apply (redirect.test proxies to its origin).
    let out = std::process::Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-D", "-", "--resolve"])
        .arg(format!("redirect.test:{}:127.0.0.1", edge.https_port))
        .arg(format!(
            "https://redirect.test:{}{}",
            edge.https_port,
            path(TOKEN)
        ))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(
        head.starts_with("http/1.1 200") || head.starts_with("http/2 200"),
        "{head}"
    );
    assert!(!head.contains("acme-challenge"), "{head}");

    // Redis stopped: 503 with its reason, never a stale or empty 200.
    redis.stop();
    let a = ask(port, "GET", "geo.test", &path(TOKEN));
    assert_eq!(
        (a.status, a.header("x-edgeform-reason")),
        (503, Some("acme-redis-unreachable")),
        "{a:?}"
    );
}

/// `route --geo --acme-host`'s choice for a client GeoIP cannot locate.
fn cli_choice(repo: &std::path::Path, host: &str, health: &std::path::Path) -> Option<String> {
    let db = super::router::geoip_db();
    let out = edgeform(
        repo,
        &[
            "route",
            "--ip",
            "10.1.2.3",
            "--geo",
            "--geoip",
            db.to_str().unwrap(),
            "--health",
            health.to_str().unwrap(),
            "--acme-host",
            host,
            "--format",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["geo"]["decision"]["node"].as_str().map(str::to_owned)
}

fn write_health(file: &std::path::Path, online: &[&str], offline: &[&str]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut nodes = serde_json::Map::new();
    for n in online {
        nodes.insert((*n).into(), serde_json::json!({"online": true}));
    }
    for n in offline {
        nodes.insert((*n).into(), serde_json::json!({"online": false}));
    }
    let text = serde_json::json!({"at": now, "nodes": nodes}).to_string();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// Through the real geo router, a challenge from a client GeoIP has no
/// location for (10.1.2.3) reaches an online edge — the one `route --geo
/// --acme-host` names, for every host — and the real edge answers it from
/// its Redis; any other request from that client is still a 503.
#[test]
fn the_geo_router_sends_an_unlocated_challenge_to_an_online_edge() {
    let edge_redis = harness::redis(&[]);
    let router_redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let (f, state) = repo(edge_redis.port, origin);
    f.write(
        "nodes/router-1.yaml",
        format!(
            "name: router-1\nroles: [router]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [127.0.0.20]\nloopback: true\n\
             redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
            router_redis.port
        )
        .as_bytes(),
    );
    // Two more edges: loopback listeners answering their own name.
    for (name, addr) in [("edge-2", "127.0.0.3"), ("edge-3", "127.0.0.4")] {
        f.write(
            &format!("nodes/{name}.yaml"),
            format!(
                "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 40.0, lon: -3.0}}\n\
                 addresses: [{addr}]\nloopback: true\nredis: {{url: \"redis://127.0.0.1:1\"}}\n"
            )
            .as_bytes(),
        );
    }
    f.write(
        "nodes/edge-1.yaml",
        edge_1_node(edge_redis.port)
            .replace("198.51.100.1", "127.0.0.1")
            .replacen("redis:", "loopback: true\nredis:", 1)
            .as_bytes(),
    );
    f.commit("router and edges");
    let o = EdgeOptions::new(edge_redis.port);
    harness::nginx::declare_bundle(&o);
    apply(&f, &state, Some("edge-1"));
    apply(&f, &state, Some("router-1"));
    let edge = harness::nginx::edge(&o);
    let edge_port = edge.process.port;
    for (name, addr) in [("edge-2", "127.0.0.3"), ("edge-3", "127.0.0.4")] {
        super::router::edge_listener(addr, edge_port, name);
    }
    set(edge_redis.port, &edgestate::keys::acme(TOKEN), KEY_AUTH);
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    write_health(&health, &["edge-1", "edge-2", "edge-3"], &[]);
    let router = harness::nginx::router(&RouterOptions::new(
        router_redis.port,
        health.clone(),
        edge_port,
    ));
    let rport = router.process.port;
    let via_router = |method: &str, host: &str, target: &str| -> Answer {
        exchange(
            rport,
            &format!(
                "{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
                 X-Forwarded-For: 10.1.2.3\r\n\r\n"
            ),
            Duration::from_secs(10),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while via_router("GET", "geo.test", &path(TOKEN)).status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "router never answered: {:?}\n{}",
            via_router("GET", "geo.test", &path(TOKEN)),
            router.error_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Not a challenge: still 503 for a client with no location.
    let a = via_router("GET", "geo.test", "/");
    assert_eq!(a.status, 503, "{a:?}");
    let a = via_router("POST", "geo.test", &path(TOKEN));
    assert_eq!(a.status, 503, "{a:?}");

    // The router's choice is route --geo --acme-host's, for every host,
    // with every edge online and with one offline.
    let hosts: Vec<String> = (0..24).map(|i| format!("site-{i}.test")).collect();
    let mut on_edge_1 = None;
    for phase in 0..2 {
        if phase == 1 {
            write_health(&health, &["edge-1", "edge-3"], &["edge-2"]);
            std::thread::sleep(Duration::from_millis(600));
        }
        let mut disagree = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for host in &hosts {
            let a = via_router("GET", host, &path(TOKEN));
            let routed = a.header("x-edgeform-edge").map(str::to_owned);
            let cli = cli_choice(f.path(), host, &health);
            if routed != cli {
                disagree.push(format!("{host}: router {routed:?}, route --geo {cli:?}"));
            }
            match routed.as_deref() {
                Some("edge-1") => {
                    // The real edge: the key authorization, exactly.
                    assert_eq!((a.status, a.body.as_str()), (200, KEY_AUTH), "{host}");
                    on_edge_1 = Some(host.clone());
                }
                Some(other) => assert_eq!(a.body, other, "{host}"),
                None => panic!("{host}: no edge: {a:?}"),
            }
            seen.insert(routed.unwrap_or_default());
        }
        assert!(disagree.is_empty(), "{}", disagree.join("\n"));
        if phase == 0 {
            assert_eq!(seen.len(), 3, "every edge takes some hosts: {seen:?}");
        } else {
            assert!(!seen.contains("edge-2"), "{seen:?}");
        }
    }
    assert!(on_edge_1.is_some());
}
