//! `edgeform certs issue` against a real ACME CA (pebble, with its DNS
//! resolving every test name to 127.0.0.1), the challenges written to the
//! edge's real Redis as `acme:<token>` and answered by the real edge from
//! it (directly, and through the real geo router); then `apply` pushes
//! the issued certificates as `tls:<host>`.

use std::net::Ipv4Addr;

use crate::util::{Fixture, edge_1_node, edgeform_with_state as run, stderr};

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

#[test]
fn certs_issue_orders_each_acme_site_and_names_the_host_that_failed() {
    let r = harness::redis(&[]);
    // The real edge answers the challenges from its Redis; down.test's
    // validation fails.
    let (_edge, pebble) = harness::pebble::behind_edge(r.port);
    let f = Fixture::empty();
    f.write(
        "cluster.yaml",
        format!(
            "acme:\n  directory: {}\n  contact: [\"mailto:ops@example.com\"]\n  ca_file: {}\n",
            pebble.directory(),
            pebble.tls_ca().display()
        )
        .as_bytes(),
    );
    f.write("nodes/edge-1.yaml", edge_1_node(r.port).as_bytes());
    f.write(
        "sites/shop.test.yaml",
        b"host: shop.test\naliases: [www.shop.test]\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.write(
        "sites/blog.test.yaml",
        b"host: blog.test\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.write(
        "sites/down.test.yaml",
        b"host: down.test\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.commit("acme sites");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");

    // Before the first `certs issue`, apply refuses the sites whose certificate is missing.
    let o = run(f.path(), &state, &["apply", "--yes"]);
    assert!(!o.status.success(), "{}", stderr(&o));

    let o = run(f.path(), &state, &["certs", "issue"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("issued certificate `acme.shop.test`"), "{err}");
    assert!(err.contains("issued certificate `acme.blog.test`"), "{err}");
    assert!(
        err.contains("error: site down.test: host down.test got no certificate: {")
            && err.contains("urn:ietf:params:acme:error:"),
        "{err}"
    );
    let kept = |name: &str| state.join("certs").join(name).join("chain.pem").exists();
    assert!(kept("acme.shop.test") && kept("acme.blog.test") && !kept("acme.down.test"));
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let left: Vec<String> = redis::cmd("KEYS").arg("acme:*").query(&mut con).unwrap();
    assert!(left.is_empty(), "challenge keys left: {left:?}");

    // `--site` orders that site alone; the others keep their certificate.
    let before = std::fs::read_to_string(state.join("certs/acme.shop.test/chain.pem")).unwrap();
    let o = run(f.path(), &state, &["certs", "issue", "--site", "blog.test"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("shop.test"), "{}", stderr(&o));
    let after = std::fs::read_to_string(state.join("certs/acme.shop.test/chain.pem")).unwrap();
    assert_eq!(before, after);

    let o = run(
        f.path(),
        &state,
        &["certs", "issue", "--site", "nosuch.test"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("`nosuch.test`"), "{}", stderr(&o));

    // Without the site nobody answers for, apply pushes the issued
    // certificates like imported ones.
    std::fs::remove_file(f.path().join("sites/down.test.yaml")).unwrap();
    f.commit("drop down.test");
    let o = run(f.path(), &state, &["apply", "--yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for host in ["shop.test", "www.shop.test", "blog.test"] {
        let doc = get(&mut con, &format!("tls:{host}")).unwrap_or_default();
        assert!(doc.contains("BEGIN CERTIFICATE"), "tls:{host}: {doc}");
    }
}

/// SHA-256 fingerprint (lowercase hex) of the first certificate in `pem`.
fn fingerprint(pem: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(pem).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.trim().rsplit('=').next().unwrap_or_default();
    hex.replace(':', "").to_ascii_lowercase()
}

/// The certificate the edge's HTTPS listener presents for `host` when
/// offered h2 by ALPN, and the protocol it chose.
fn served(https_port: u16, host: &str) -> (String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-alpn",
            "h2,http/1.1",
            "-servername",
            host,
            "-connect",
        ])
        .arg(format!("127.0.0.1:{https_port}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(b"");
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let alpn = text
        .lines()
        .find_map(|l| l.strip_prefix("ALPN protocol: "))
        .unwrap_or("none")
        .to_owned();
    (fingerprint(text.as_bytes()), alpn)
}

/// End to end through the real components: pebble validates every
/// HTTP-01 challenge on the real geo router's :80-equivalent port, which
/// sends the unlocated CA (127.0.0.1) to the real edge, which answers from
/// its own Redis; `apply` then pushes the certificates and the same edge
/// workers serve each host over HTTPS with h2 and the issued certificate,
/// verified against pebble's root — no reload.
#[test]
fn certs_issue_through_the_real_router_and_edge_then_served_over_h2() {
    let started = std::time::Instant::now();
    let edge_redis = harness::redis(&[]);
    let router_redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let mut o = harness::nginx::EdgeOptions::new(edge_redis.port);
    o.workers = 2;
    harness::nginx::declare_bundle(&o);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        edge_1_node(edge_redis.port)
            .replace("198.51.100.1", "127.0.0.1")
            .replacen("redis:", "loopback: true\nredis:", 1)
            .as_bytes(),
    );
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
    // A plain-HTTP site the edge serves already.
    f.write(
        "sites/plain.test.yaml",
        format!(
            "host: plain.test\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n"
        )
        .as_bytes(),
    );
    f.commit("nodes and a plain site");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    for node in ["edge-1", "router-1"] {
        let out = run(f.path(), &state, &["apply", "--yes", "--node", node]);
        assert!(out.status.success(), "apply {node}: {}", stderr(&out));
    }
    let edge = harness::nginx::edge(&o);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while edge.worker_pids().len() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let workers = edge.worker_pids();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::write(
        &health,
        serde_json::json!({"at": now, "nodes": {"edge-1": {"online": true}}}).to_string(),
    )
    .unwrap();
    let router = harness::nginx::router(&harness::nginx::RouterOptions::new(
        router_redis.port,
        health,
        edge.process.port,
    ));
    let pebble = harness::pebble(&harness::PebbleOptions {
        http_port: router.process.port,
        answer: Ipv4Addr::LOCALHOST,
        validity_secs: None,
    });

    f.write(
        "cluster.yaml",
        format!(
            "acme:\n  directory: {}\n  contact: [\"mailto:ops@example.com\"]\n  ca_file: {}\n",
            pebble.directory(),
            pebble.tls_ca().display()
        )
        .as_bytes(),
    );
    let hosts: &[(&str, &[&str])] = &[
        ("shop.test", &["www.shop.test", "m.shop.test"]),
        ("blog.test", &[]),
        ("docs.test", &[]),
    ];
    for (host, aliases) in hosts {
        f.write(
            &format!("sites/{host}.yaml"),
            format!(
                "host: {host}\naliases: {aliases:?}\norigin: http://127.0.0.1:{origin}\n\
                 loopback: true\ncached: false\ntls: {{acme: true}}\n"
            )
            .as_bytes(),
        );
    }
    f.commit("acme sites");
    let out = run(f.path(), &state, &["certs", "issue"]);
    assert!(
        out.status.success(),
        "{}\nrouter: {}\nedge: {}",
        stderr(&out),
        router.error_log(),
        edge.error_log()
    );
    let out = run(f.path(), &state, &["apply", "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let root = dir.path().join("root.pem");
    std::fs::write(&root, pebble.root()).unwrap();
    for (host, aliases) in hosts {
        let chain = std::fs::read(state.join(format!("certs/acme.{host}/chain.pem"))).unwrap();
        let issued = fingerprint(&chain);
        assert_eq!(issued.len(), 64, "{host}");
        for name in std::iter::once(host).chain(aliases.iter()) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let (fp, alpn) = loop {
                let got = served(edge.https_port, name);
                if got.0 == issued || std::time::Instant::now() > deadline {
                    break got;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            };
            assert_eq!(fp, issued, "{name}: {}", edge.error_log());
            assert_eq!(alpn, "h2", "{name}");
            // A full h2 request, the chain verified against pebble's root.
            let out = std::process::Command::new("curl")
                .args([
                    "-sS",
                    "--http2",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_version} %{http_code}",
                ])
                .arg("--cacert")
                .arg(&root)
                .arg("--resolve")
                .arg(format!("{name}:{}:127.0.0.1", edge.https_port))
                .arg(format!("https://{name}:{}/", edge.https_port))
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "2 200",
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert_eq!(edge.worker_pids(), workers, "the edge reloaded");
    eprintln!(
        "issued through router and edge, served over h2: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
