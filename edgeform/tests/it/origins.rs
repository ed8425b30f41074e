//! A site's several origins through the reference edge: the real nginx
//! with its Lua module, real origins (small nginx servers, stopped by
//! pid), a real DNS server on loopback (dnsmasq) for an origin's name. The
//! next origin answers when one refuses the connection or answers 5xx —
//! a POST already sent is never sent again — on the edge's own path and
//! through the TTL hop; with every origin down, a cached object is served
//! stale (docs/edge.md, "Origin failover", "Stale answers").

use std::time::Duration;

use harness::nginx::{EdgeOptions, origin, origin_requests};

use crate::util::{Answer, Fixture, edgeform, exchange, stderr};

/// `method` `path` for `host` on the edge (a POST with a small body).
fn request(port: u16, method: &str, host: &str, path: &str) -> Answer {
    let body = if method == "POST" { "a=1" } else { "" };
    let length = if method == "POST" {
        "Content-Length: 3\r\n"
    } else {
        ""
    };
    exchange(
        port,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{length}Connection: close\r\n\r\n{body}"
        ),
        Duration::from_secs(20),
    )
}

/// A port nothing listens on (bound, then released).
fn refused_port() -> u16 {
    harness::free_port()
}

/// The failover cases on one edge: a refused primary (by IP) then a
/// secondary by name (resolved through dnsmasq), each getting its own
/// Host; a primary answering 503 then a secondary, for GET (retried) and
/// POST (not sent again); the same through the TTL hop; every origin
/// down and a cached object served STALE; `explain`'s origin order and
/// stale flag for the same sites.
#[test]
fn a_site_with_several_origins_fails_over_and_serves_stale_when_all_fail() {
    let redis = harness::redis(&[]);
    let dns = harness::dnsmasq(&[("origin-b.test", "127.0.0.1")]);
    let unavailable = origin("primary", 503);
    let b = origin("b", 200);
    let c1 = origin("c1", 200);
    let c2 = origin("c2", 200);
    let dead = refused_port();
    let (u, bp) = (unavailable.process.port, b.process.port);
    let repo = Fixture::empty();
    repo.write(
        "nodes/edge-1.yaml",
        crate::util::edge_1_node(redis.port).as_bytes(),
    );
    let sites = [
        // Refused, then a name (its own Host).
        (
            "refused",
            format!(
                "origins: [http://127.0.0.1:{dead}, http://origin-b.test:{bp}]\ncached: false\n"
            ),
        ),
        // 503, then an IP address (the viewer's Host, as for one origin).
        (
            "unavailable",
            format!("origins: [http://127.0.0.1:{u}, http://127.0.0.1:{bp}]\ncached: false\n"),
        ),
        // The TTL hop: a `ttl` rule's fetch.
        (
            "hop",
            format!(
                "origins: [http://127.0.0.1:{u}, http://origin-b.test:{bp}]\n\
                 cache_rules: [{{match_type: ext, match_value: .txt, action: ttl, ttl: 60}}]\n"
            ),
        ),
        // Answers once the edge has read the applied documents.
        (
            "ready",
            format!("origins: [http://127.0.0.1:{bp}]\ncached: false\n"),
        ),
        // Cached, both origins stopped later.
        (
            "stale",
            format!(
                "origins: [http://127.0.0.1:{}, http://127.0.0.1:{}]\n",
                c1.process.port, c2.process.port
            ),
        ),
    ];
    for (name, body) in &sites {
        repo.write(
            &format!("sites/{name}.yaml"),
            format!("host: {name}.test\nloopback: true\n{body}").as_bytes(),
        );
    }
    // The edge first: it declares the fields its code reads, which apply
    // checks (`fallback_origins` is one).
    let mut o = EdgeOptions::new(redis.port);
    o.resolver = format!("127.0.0.1:{}", dns.port);
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    // The edge reads the new generation at its next poll (later on a
    // loaded machine): wait for it rather than for a fixed time.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while request(port, "GET", "ready.test", "/").status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never read the applied documents"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = || edge.error_log();

    // Refused → the secondary, by name, with its own Host; a POST too
    // (never sent to the refused one).
    let a = request(port, "GET", "refused.test", "/x");
    assert_eq!(
        (a.status, a.body.as_str()),
        (200, "b origin-b.test GET /x\n"),
        "{}",
        log()
    );
    let a = request(port, "POST", "refused.test", "/form");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.starts_with("b origin-b.test POST"), "{}", a.body);

    // 503 → the secondary for a GET (the viewer's Host for an IP origin).
    let a = request(port, "GET", "unavailable.test", "/y");
    assert_eq!(
        (a.status, a.body.as_str()),
        (200, "b unavailable.test GET /y\n")
    );
    // A POST the primary answered 503 is that answer: never sent again.
    let a = request(port, "POST", "unavailable.test", "/pay");
    assert_eq!(
        (a.status, a.body.as_str()),
        (503, "primary unavailable.test POST /pay\n")
    );
    assert!(
        !origin_requests(&b).iter().any(|l| l == "b POST /pay"),
        "{:?}",
        origin_requests(&b)
    );
    assert!(
        origin_requests(&unavailable)
            .iter()
            .any(|l| l == "primary POST /pay")
    );

    // Through the TTL hop: 503 → the secondary by name, cached.
    let a = request(port, "GET", "hop.test", "/f.txt");
    assert_eq!(
        (a.status, a.body.as_str(), a.header("x-cache-status")),
        (200, "b origin-b.test GET /f.txt\n", Some("MISS")),
        "{}",
        log()
    );
    let a = request(port, "GET", "hop.test", "/f.txt");
    assert_eq!(a.header("x-cache-status"), Some("HIT"));

    // Cached for 1 s (the origin's max-age), then every origin down: the
    // stale copy, said so.
    let a = request(port, "GET", "stale.test", "/obj");
    assert_eq!(
        (a.status, a.body.as_str(), a.header("x-cache-status")),
        (200, "c1 stale.test GET /obj\n", Some("MISS"))
    );
    drop(c1);
    drop(c2);
    // Past the second it was fresh until (nginx counts whole seconds).
    std::thread::sleep(Duration::from_millis(2_100));
    let a = request(port, "GET", "stale.test", "/obj");
    assert_eq!(
        (a.status, a.body.as_str(), a.header("x-cache-status")),
        (200, "c1 stale.test GET /obj\n", Some("STALE")),
        "{}",
        log()
    );
    // Never cached: no stale copy, the error.
    let a = request(port, "GET", "stale.test", "/never-fetched");
    assert_eq!(a.status, 502);

    // explain: the order tried, and whether a stale answer can be.
    let lines = [
        ("refused.test", "/x", "GET"),
        ("stale.test", "/obj", "GET"),
        ("stale.test", "/obj", "POST"),
    ];
    let text: String = lines
        .iter()
        .enumerate()
        .map(|(i, (host, url, method))| {
            format!(
                "{}\n",
                serde_json::json!({"id": i, "host": host, "url": url, "ip": "198.51.100.7",
                                   "method": method, "headers": {}})
            )
        })
        .collect();
    let file = repo.path().join("requests.jsonl");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["explain", "--batch"])
        .arg(&file)
        .current_dir(repo.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "explain: {}", stderr(&out));
    let got: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        got[0]["origins"],
        serde_json::json!([
            format!("http://127.0.0.1:{dead}"),
            format!("http://origin-b.test:{bp}")
        ])
    );
    assert_eq!(got[0]["stale"], false, "cached: false");
    assert_eq!(got[0]["origin"], format!("http://127.0.0.1:{dead}"));
    assert_eq!(got[1]["stale"], true, "{}", got[1]);
    assert_eq!(got[1]["origins"].as_array().map(Vec::len), Some(2));
    assert_eq!(got[2]["stale"], false, "a POST is never cached");
}

/// `https://` origins by name: the primary refuses, the secondary —
/// whose certificate names only itself — answers, so the second try was
/// made with the secondary's own name as SNI and verified name; on the
/// edge's own path and through the TTL hop (verified, and not verified for
/// a site that opts out).
#[test]
fn https_origins_each_get_their_own_tls_name() {
    let redis = harness::redis(&[]);
    let dns = harness::dnsmasq(&[
        ("origin-a.test", "127.0.0.1"),
        ("origin-b.test", "127.0.0.1"),
    ]);
    let certs = harness::SiteCerts::new();
    certs.sign("b", &["origin-b.test"], 30);
    let b = harness::nginx::tls_origin(&certs.file("b.chain.pem"), &certs.file("b.key"));
    let (dead, bp) = (refused_port(), b.process.port);
    let repo = Fixture::empty();
    repo.write(
        "nodes/edge-1.yaml",
        crate::util::edge_1_node(redis.port).as_bytes(),
    );
    let origins = format!("origins: [https://origin-a.test:{dead}, https://origin-b.test:{bp}]\n");
    repo.write(
        "sites/direct.yaml",
        format!("host: direct.test\n{origins}cached: false\n").as_bytes(),
    );
    repo.write(
        "sites/hop.yaml",
        format!(
            "host: hop.test\n{origins}\
             cache_rules: [{{match_type: ext, match_value: .js, action: ttl, ttl: 60}}]\n"
        )
        .as_bytes(),
    );
    // Not verified: through the hop's second location, the same tries.
    repo.write(
        "sites/optout.yaml",
        format!("host: optout.test\n{origins}origin_tls_verify: false\ncached: false\n").as_bytes(),
    );
    let mut o = EdgeOptions::new(redis.port);
    o.resolver = format!("127.0.0.1:{}", dns.port);
    o.origin_ca = Some(certs.file("ca.pem"));
    let edge = harness::nginx::edge(&o);
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    std::thread::sleep(Duration::from_millis(300));
    for (host, path) in [
        ("direct.test", "/"),
        ("hop.test", "/app.js"),
        ("optout.test", "/"),
    ] {
        let a = request(edge.process.port, "GET", host, path);
        assert_eq!(
            (a.status, a.body.as_str()),
            (200, "tls origin\n"),
            "{host}: {}",
            edge.error_log()
        );
    }
}
