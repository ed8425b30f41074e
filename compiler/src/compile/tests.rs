//! Compilation of a tiny repository built in memory: every target, key and
//! value, and the routers' nginx blocks.

use serde_json::{Value, json};

use super::*;
use crate::testkit::valid;

const CLUSTER: (&str, &str) = (
    "cluster.yaml",
    "name: demo\ntrusted_proxies: [192.0.2.10/32]\n",
);
const ZONE: (&str, &str) = ("zones/eu.yaml", "name: eu\nroutes: [0.0.0.0/0, \"::/0\"]\n");
const EDGE_AMS: (&str, &str) = (
    "nodes/edge-ams.yaml",
    "name: edge-ams\nroles: [edge]\nregion: eu\nzone: eu\nlocation: {lat: 52.37, lon: 4.9}\naddresses: [198.51.100.11]\nredis: {url: redis://10.0.0.11:6379}\n",
);
const EDGE_NYC: (&str, &str) = (
    "nodes/edge-nyc.yaml",
    "name: edge-nyc\nroles: [edge]\nregion: us\nzone: eu\nlocation: {lat: 40.71, lon: -74.0}\naddresses: [198.51.100.12]\nredis: {url: redis://10.0.0.12:6379}\ndrain: true\nhttps: {listen: \"0.0.0.0:443\", proxy_listen: \"0.0.0.0:11443\"}\n",
);
const ROUTER: (&str, &str) = (
    "nodes/router-ams.yaml",
    "name: router-ams\nroles: [router]\nregion: eu\nlocation: {lat: 52.31, lon: 4.76}\naddresses: [198.51.100.2]\nredis: {url: redis://10.0.0.2:6379}\n",
);
/// No `redis`: not a target, but in every routing table.
const INGEST: (&str, &str) = (
    "nodes/ingest-1.yaml",
    "name: ingest-1\nroles: [ingest]\nregion: eu\nzone: eu\n",
);
/// Everywhere, with an alias.
const SITE_A: (&str, &str) = (
    "sites/a.yaml",
    "host: a.example.com\naliases: [www.a.example.com]\norigin: http://203.0.113.10\ngeo_mode: block\ngeo_codes: [RU]\nip_mode: allow\nip_list: [198.51.100.0/24]\ncache_rules:\n  - {match_type: ext, match_value: .mp4, action: ttl, ttl: 86400}\nedge_rules:\n  - {match_type: prefix, match_value: /old/, action: redirect, redirect_status: 301, redirect_to: /new/}\n",
);
/// Only in region `us`, suspended; every setting left to its default.
const SITE_B: (&str, &str) = (
    "sites/b.yaml",
    "host: b.example.com\norigin: https://203.0.113.20:8443\nregions: [us]\nsuspended: true\n",
);

fn compiled() -> Compiled {
    compile(&valid(&[
        CLUSTER, ZONE, EDGE_AMS, EDGE_NYC, ROUTER, INGEST, SITE_A, SITE_B,
    ]))
}

fn keys_of(t: &Target) -> Vec<&str> {
    t.entries().map(|(k, _)| k).collect()
}

fn value<'a>(t: &'a Target, key: &str) -> &'a str {
    t.entries()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("{} holds no `{key}`", t.node))
}

const DOC_A: &str = r#"{"cache_rules":[{"action":"ttl","match_type":"ext","match_value":".mp4","ttl":86400}],"cached":true,"cors_mode":"off","edge_rules":[{"action":"redirect","match_type":"prefix","match_value":"/old/","redirect_status":301,"redirect_to":"/new/"}],"geo_codes":"RU","geo_mode":"block","hotlink_mode":"off","ip_list":"198.51.100.0/24","ip_mode":"allow","origin":"http://203.0.113.10","rate_mode":"off","waf_mode":"off"}"#;
const DOC_B: &str = r#"{"cache_rules":[],"cached":true,"cors_mode":"off","edge_rules":[],"geo_codes":"","geo_mode":"off","hotlink_mode":"off","ip_list":"","ip_mode":"off","origin":"https://203.0.113.20:8443","rate_mode":"off","waf_mode":"off"}"#;

#[test]
fn only_nodes_with_redis_are_targets() {
    let c = compiled();
    let names: Vec<&str> = c.targets.keys().map(String::as_str).collect();
    assert_eq!(names, ["edge-ams", "edge-nyc", "router-ams"]);
    assert_eq!(c.targets["edge-nyc"].region, "us");
}

#[test]
fn an_edge_holds_the_sites_of_its_region_host_and_aliases_sharing_one_document() {
    let c = compiled();
    let ams = &c.targets["edge-ams"];
    assert_eq!(
        keys_of(ams),
        [
            "edgeform:routing",
            "site:a.example.com",
            "site:www.a.example.com"
        ]
    );
    assert_eq!(value(ams, "site:a.example.com"), DOC_A);
    assert_eq!(value(ams, "site:www.a.example.com"), DOC_A);
    assert_eq!(ams.len(), 3);
}

#[test]
fn a_suspended_site_limited_to_a_region_reaches_that_region_with_its_flag() {
    let c = compiled();
    let nyc = &c.targets["edge-nyc"];
    assert_eq!(
        keys_of(nyc),
        [
            "edgeform:routing",
            "site:a.example.com",
            "site:b.example.com",
            "site:www.a.example.com",
            "suspended:b.example.com",
        ]
    );
    assert_eq!(value(nyc, "site:b.example.com"), DOC_B);
    assert_eq!(value(nyc, "suspended:b.example.com"), "1");
}

#[test]
fn a_router_holds_only_its_routing_table_with_its_weighted_pool() {
    let c = compiled();
    let router = &c.targets["router-ams"];
    assert_eq!(keys_of(router), ["edgeform:routing"]);
    let table: Value = serde_json::from_str(&router.routing).unwrap();
    // Nearest first; the drained edge is `down`, beyond 5,000 km weight 1.
    assert_eq!(
        table["router_pool"],
        json!([
            {"node": "edge-ams", "address": "198.51.100.11", "distance_km": 11.6, "weight": 10},
            {"node": "edge-nyc", "address": "198.51.100.12", "distance_km": 5856.2, "weight": 1, "down": true},
        ])
    );
    // Everything else is the table every target has.
    let mut without = table.clone();
    without.as_object_mut().unwrap().remove("router_pool");
    let edge: Value = serde_json::from_str(&c.targets["edge-ams"].routing).unwrap();
    assert_eq!(without, edge);
    assert!(edge.get("router_pool").is_none());
}

#[test]
fn the_routing_table_names_every_node_zone_and_cluster_setting() {
    let c = compiled();
    let table: Value = serde_json::from_str(&c.targets["edge-ams"].routing).unwrap();
    assert_eq!(table["format"], json!(edgestate::FORMAT_VERSION));
    assert_eq!(table["cluster"], json!("demo"));
    assert_eq!(table["trusted_proxies"], json!(["192.0.2.10/32"]));
    assert_eq!(
        table["zones"],
        json!({"eu": {"routes": ["0.0.0.0/0", "::/0"], "fallback": null}})
    );
    assert_eq!(
        table["nodes"]["ingest-1"],
        json!({
            "roles": ["ingest"], "region": "eu", "zone": "eu", "public_url": null,
            "location": null, "addresses": [], "playback_session_limit": null,
            "playback_bandwidth_kbit": null, "network_bandwidth_kbit": null,
        })
    );
    assert_eq!(table["nodes"]["edge-nyc"]["drain"], json!(true));
    assert!(table["nodes"]["edge-ams"].get("drain").is_none());
    let names: Vec<&String> = table["nodes"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["edge-ams", "edge-nyc", "ingest-1", "router-ams"]);
    assert_eq!(
        table["geo"],
        json!({
            "tie_km": 100.0,
            "buckets": [
                {"below_km": 500.0, "weight": 10},
                {"below_km": 2000.0, "weight": 7},
                {"below_km": 5000.0, "weight": 4},
            ],
            "default_weight": 1, "max_fails": 3, "fail_timeout_s": 30,
        })
    );
}

#[test]
fn a_routers_nginx_stream_block_lists_its_pool_with_weights_and_down_edges() {
    let c = compiled();
    assert_eq!(c.nginx.keys().collect::<Vec<_>>(), ["router-ams"]);
    let text = &c.nginx["router-ams"];
    assert!(
        text.starts_with("# edgeform: TLS passthrough of router `router-ams` (cluster `demo`).\n")
    );
    let servers: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("server 1"))
        .collect();
    assert_eq!(
        servers,
        [
            "        server 198.51.100.11:10443 weight=10 max_fails=3 fail_timeout=30s;  # edge-ams 11.6 km",
            "        server 198.51.100.12:11443 weight=1 max_fails=3 fail_timeout=30s down;  # edge-nyc 5856.2 km, drained",
        ]
    );
    assert!(text.contains("    upstream edgeform_edges_443 {\n        least_conn;\n"));
    assert!(text.contains("        listen 443;\n        proxy_pass edgeform_edges_443;\n"));
    // The viewer's address to each edge's PROXY-protocol listener.
    assert!(text.contains("        proxy_protocol on;\n"), "{text}");
}

#[test]
fn a_router_without_a_public_edge_gets_comments_and_listens_on_nothing() {
    let private_edge = (
        "nodes/edge-ams.yaml",
        "name: edge-ams\nroles: [edge]\nregion: eu\nzone: eu\nlocation: {lat: 52.37, lon: 4.9}\naddresses: [10.0.0.11]\nredis: {url: redis://10.0.0.11:6379}\n",
    );
    let c = compile(&valid(&[CLUSTER, ZONE, private_edge, ROUTER]));
    let text = &c.nginx["router-ams"];
    assert!(!text.contains("stream {"), "{text}");
    assert!(
        text.ends_with("# No edge with a public address and a location: nothing listens on 443.\n")
    );
    let table: Value = serde_json::from_str(&c.targets["router-ams"].routing).unwrap();
    assert_eq!(table["router_pool"], json!([]));
}

#[test]
fn a_targets_file_is_sorted_json_one_key_a_line() {
    let c = compiled();
    let ams = &c.targets["edge-ams"];
    let text = ams.to_json();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(lines[0], "{");
    assert!(lines[1].starts_with("  \"edgeform:routing\": \"{"));
    assert_eq!(
        lines[2],
        format!(
            "  \"site:a.example.com\": {},",
            serde_json::to_string(DOC_A).unwrap()
        )
    );
    assert_eq!(lines[4], "}");
    assert!(text.ends_with("}\n"));
    let back: std::collections::BTreeMap<String, String> = serde_json::from_str(&text).unwrap();
    assert_eq!(back["site:www.a.example.com"], DOC_A);
}

#[test]
fn compiling_twice_gives_byte_identical_targets() {
    let (a, b) = (compiled(), compiled());
    for (name, t) in &a.targets {
        assert_eq!(t.to_json(), b.targets[name].to_json(), "{name}");
    }
    assert_eq!(a.nginx, b.nginx);
}
