//! The project's example repository: valid, warning-free, and compiled
//! exactly as the snapshots say (reviewed by hand; `cargo insta review`).

use std::fmt::Write as _;

use compiler::compile::{Compiled, compile};
use compiler::diff::pretty;

use crate::util::example_repo;

fn compiled() -> Compiled {
    let repo = compiler::load::from_dir(&example_repo()).unwrap();
    let checked = compiler::check(&repo);
    assert!(checked.diagnostics.is_empty(), "{:#?}", checked.diagnostics);
    compile(checked.config.as_ref().unwrap())
}

/// Every target's keys with pretty values, for reading in review.
fn readable(c: &Compiled) -> String {
    let mut out = String::new();
    for (name, target) in &c.targets {
        let _ = writeln!(
            out,
            "=== {name} (region {}, {} keys)",
            target.region,
            target.len()
        );
        for (k, v) in target.entries() {
            if k == edgestate::keys::ROUTING {
                // The routing table is the same on every non-router target;
                // it is snapshotted once below.
                let table: serde_json::Value = serde_json::from_str(v).unwrap();
                let _ = writeln!(
                    out,
                    "{k}: <routing table, router_pool: {}>",
                    table.get("router_pool").map_or("none".into(), |p| p
                        .as_array()
                        .map_or(0, Vec::len)
                        .to_string())
                );
            } else {
                let _ = write!(out, "{k}: {}", pretty(v));
            }
        }
    }
    out
}

#[test]
fn example_targets_snapshot() {
    insta::assert_snapshot!("example_targets", readable(&compiled()));
}

#[test]
fn example_routing_table_snapshot() {
    let c = compiled();
    let edge = c.targets.get("edge-ams-1").unwrap();
    insta::assert_snapshot!("example_routing_edge", pretty(&edge.routing));
    let router = c.targets.get("router-ams").unwrap();
    let table: serde_json::Value = serde_json::from_str(&router.routing).unwrap();
    insta::assert_snapshot!(
        "example_router_pool",
        serde_json::to_string_pretty(&table["router_pool"]).unwrap()
    );
}

#[test]
fn example_nginx_snapshot() {
    let c = compiled();
    let mut all = String::new();
    for (router, text) in &c.nginx {
        let _ = writeln!(all, "### {router}.nginx.conf\n{text}");
    }
    insta::assert_snapshot!("example_nginx", all);
}

#[test]
fn example_site_document_is_the_seed_document() {
    let c = compiled();
    let edge = c.targets.get("edge-ams-1").unwrap();
    let (_, doc) = edge
        .entries()
        .find(|(k, _)| *k == "site:example.com")
        .unwrap();
    assert_eq!(
        doc,
        r#"{"cache_rules":[{"action":"ttl","match_type":"ext","match_value":".mp4","ttl":86400}],"cached":true,"cors_mode":"strict","edge_rules":[{"action":"redirect","match_type":"prefix","match_value":"/old/","redirect_status":301}],"geo_codes":"RU,CN","geo_mode":"block","hotlink_mode":"block","ip_list":"198.51.100.0/24","ip_mode":"allow","origin":"http://203.0.113.10:80","rate_mode":"strict","waf_mode":"strict"}"#
    );
    // Exactly the seed's twelve fields.
    let v: serde_json::Value = serde_json::from_str(doc).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 12);
    // Aliases carry the same document.
    let (_, www) = edge
        .entries()
        .find(|(k, _)| *k == "site:www.example.com")
        .unwrap();
    assert_eq!(www, doc);
}

#[test]
fn example_regions_and_roles_select_keys() {
    let c = compiled();
    let keys =
        |n: &str| -> Vec<String> { c.targets[n].entries().map(|(k, _)| k.to_owned()).collect() };
    // static.example.org is eu-only, api.example.com us-only.
    assert!(keys("edge-ams-1").contains(&"site:static.example.org".into()));
    assert!(!keys("edge-nyc-1").contains(&"site:static.example.org".into()));
    assert!(keys("edge-nyc-1").contains(&"site:api.example.com".into()));
    assert!(!keys("edge-ams-1").contains(&"site:api.example.com".into()));
    // Suspended sites keep their document and gain the flag, per alias.
    assert!(keys("edge-ams-1").contains(&"suspended:www.shop.example.net".into()));
    // Non-edges get only the routing table; nodes without redis are no target.
    assert_eq!(keys("ingest-office-1"), ["edgeform:routing"]);
    assert_eq!(keys("router-ams"), ["edgeform:routing"]);
    assert!(!c.targets.contains_key("origin-1") && !c.targets.contains_key("router-nyc"));
    // ... but every router gets its nginx snippet.
    assert!(c.nginx.contains_key("router-nyc"));
}

#[test]
fn compile_is_deterministic_across_runs_and_thread_counts() {
    let a = compiled();
    let b = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(compiled);
    let c = rayon::ThreadPoolBuilder::new()
        .num_threads(7)
        .build()
        .unwrap()
        .install(compiled);
    for other in [&b, &c] {
        assert_eq!(
            a.targets.keys().collect::<Vec<_>>(),
            other.targets.keys().collect::<Vec<_>>()
        );
        for (name, t) in &a.targets {
            assert_eq!(t.to_json(), other.targets[name].to_json(), "{name}");
        }
        assert_eq!(a.nginx, other.nginx);
    }
}
