//! The harness's edge declares what its code reads, as `edgeform install`
//! does on a real node: a real nginx edge and a real redis-server.

use std::collections::BTreeMap;

use edgestate::bundle::Bundle;

fn hgetall(port: u16, key: &str) -> BTreeMap<String, String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "HGETALL", key])
        .output()
        .expect("redis-cli");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter(|kv| kv.len() == 2)
        .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
        .collect()
}

#[test]
fn the_harness_edge_declares_the_fields_its_tables_check() {
    let redis = harness::redis(&[]);
    let _edge = harness::nginx::edge(&harness::nginx::EdgeOptions::new(redis.port));
    let declared = Bundle::from_hash(&hgetall(redis.port, edgestate::keys::BUNDLE));
    let want = Bundle::current();
    assert_eq!(declared.site_fields, want.site_fields);
    let has_tls = harness::nginx::repo_root()
        .join("roles/edge/lua/edge_tls.lua")
        .exists();
    assert_eq!(declared.tls, has_tls);
}
