//! `edgeform certs issue` against a real ACME CA (pebble, with its DNS
//! resolving every test name to 127.0.0.1), the challenges written to the
//! edge's real Redis as `acme:<token>` and answered over real HTTP from
//! it; then `apply` pushes the issued certificates as `tls:<host>`.

use std::net::Ipv4Addr;

use crate::util::{Fixture, edge_1_node, edgeform_with_state as run, stderr};

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

#[test]
fn certs_issue_orders_each_acme_site_and_names_the_host_that_failed() {
    let r = harness::redis(&[]);
    // The edge's installed code reads certificates (the version-skew gate).
    harness::nginx::declare_bundle(&harness::nginx::EdgeOptions::new(r.port));
    let http = harness::pebble::challenge_answerer(r.port, "down.test");
    let pebble = harness::pebble(&harness::PebbleOptions {
        http_port: http,
        answer: Ipv4Addr::LOCALHOST,
        validity_secs: None,
    });
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

    // Before any issue, apply refuses the sites whose certificate is missing.
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
