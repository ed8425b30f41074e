//! The shared test vectors (`testdata/edge/*.jsonl`, `testdata/route/*.jsonl`)
//! on the Rust side: every line's expected answer against this crate's.
//! The Lua side reads the same files (`scripts/lua-vectors` with plain
//! LuaJIT, and `tests/lua_vectors.rs` through nginx for what needs PCRE or
//! nginx's SHA-1). Each file's format is in `testdata/README.md`.
//! Test-only: reading files is no part of this crate.

use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::edge::{self, Clearance, Found, Site};
use crate::route::{Health, NodeHealth, Router};
use crate::routing::{GeoSettings, Location, RoutingTable};

/// `testdata/` of this checkout.
fn testdata() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata")
}

/// The vector lines of a file under `testdata/`: (line number, value),
/// blank lines skipped.
fn read(name: &str) -> Vec<(usize, Value)> {
    let path = testdata().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("testdata/{name}:{}: {e}", i + 1));
            (i + 1, v)
        })
        .collect()
}

/// The decision's fields both sides compare, in order.
const FIELDS: [&str; 10] = [
    "verdict",
    "status",
    "reason",
    "location",
    "cached",
    "ttl",
    "origin",
    "origin_host",
    "fallback_origins",
    "waf",
];

/// A decision (or a vector's `want`) in the compared form: every field of
/// [`FIELDS`], absent ones `null` (`cached`: `false`, `waf`: `[]`).
fn normalized(v: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for f in FIELDS {
        let x = v.get(f).cloned().unwrap_or(Value::Null);
        let x = match (f, x) {
            ("cached", Value::Null) => Value::Bool(false),
            ("waf", Value::Null) => Value::Array(Vec::new()),
            (_, x) => x,
        };
        out.insert(f.to_owned(), x);
    }
    out
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// IPv4-mapped IPv6 addresses are IPv4 clients (as the client-IP choice
/// gives them).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// The document text of an edge vector: `doc_text` as given, or `doc`
/// laid over the file's `base_doc` (a `null` removes a field); `None`: no
/// document for the host.
fn document(vec: &Value, base: &Value) -> Option<String> {
    if let Some(t) = text(vec, "doc_text") {
        return Some(t.to_owned());
    }
    let overlay = vec.get("doc")?.as_object()?;
    let mut doc = base.as_object().cloned().unwrap_or_default();
    for (k, v) in overlay {
        if v.is_null() {
            doc.remove(k);
        } else {
            doc.insert(k.clone(), v.clone());
        }
    }
    Some(Value::Object(doc).to_string())
}

/// This crate's decision for an edge vector, in the compared form.
fn edge_decision(vec: &Value, base: &Value) -> Map<String, Value> {
    let null = Value::Null;
    let r = vec.get("req").unwrap_or(&null);
    let client = text(r, "client")
        .and_then(|c| c.parse::<IpAddr>().ok())
        .map(canonical);
    let req = edge::Request {
        method: text(r, "method").unwrap_or("GET"),
        scheme: text(r, "scheme")
            .map(|s| edge::Scheme::parse(s).expect("scheme: http or https"))
            .unwrap_or_default(),
        sni: text(r, "sni"),
        content_length: text(r, "content_length"),
        host: text(r, "host").unwrap_or("site.test"),
        uri: text(r, "uri").unwrap_or("/"),
        client_ip: client,
        country: text(r, "country"),
        referer: text(r, "referer"),
        origin: text(r, "origin"),
        acr_method: text(r, "acr_method"),
        cookie: text(r, "cookie"),
        authorization: text(r, "authorization"),
    };
    let host = edge::normalize_host(req.host);
    let key = text(vec, "key").map_or(host, str::to_owned);
    let c = vec.get("clearance").unwrap_or(&null);
    let clearance = Clearance {
        secret: text(c, "secret").map(str::as_bytes),
        now: c.get("now").and_then(Value::as_u64).unwrap_or(0),
    };
    let parsed = document(vec, base).map(|d| Site::parse(&d));
    let found = match &parsed {
        None => Found::None,
        Some(Err(error)) => Found::Bad { key: &key, error },
        Some(Ok(site)) => Found::Site {
            key: &key,
            site,
            suspended: vec.get("suspended").and_then(Value::as_bool) == Some(true),
        },
    };
    let d = edge::decide(&req, found, clearance);
    let v = serde_json::json!({
        "verdict": d.verdict,
        "status": d.status,
        "reason": d.reason,
        "location": d.location,
        "cached": d.cache.cached,
        "ttl": d.cache.ttl,
        "origin": d.origin,
        "origin_host": d.origin_host,
        "fallback_origins": (!d.fallback_origins.is_empty()).then_some(&d.fallback_origins),
        "waf": d.waf,
    });
    normalized(&v)
}

/// This crate's choice for a geo vector: the edge's name, or `None`.
fn route_choice(vec: &Value) -> Option<String> {
    let mut nodes = Map::new();
    for (name, n) in vec["nodes"].as_object().expect("nodes") {
        let mut n = n.as_object().expect("a node is an object").clone();
        n.entry("region").or_insert_with(|| "r".into());
        n.entry("addresses")
            .or_insert_with(|| Value::Array(Vec::new()));
        nodes.insert(name.clone(), Value::Object(n));
    }
    let mut geo = GeoSettings::default();
    if let Some(t) = vec.get("tie_km").and_then(Value::as_f64) {
        geo.tie_km = t;
    }
    let table = RoutingTable {
        format: crate::FORMAT_VERSION,
        cluster: "vectors".into(),
        trusted_proxies: Vec::new(),
        geo,
        zones: std::collections::BTreeMap::new(),
        nodes: serde_json::from_value(Value::Object(nodes)).expect("nodes"),
        router_pool: None,
    };
    let router = Router::new(table).expect("a routing table");
    let mut health = Health::default();
    for n in vec["online"].as_array().into_iter().flatten() {
        health.nodes.insert(
            n.as_str().expect("online names").to_owned(),
            NodeHealth {
                online: Some(true),
                ..NodeHealth::default()
            },
        );
    }
    let client: IpAddr = text(vec, "client")
        .expect("client")
        .parse()
        .expect("client");
    let at = Location {
        lat: vec["at"][0].as_f64().expect("at: [lat, lon]"),
        lon: vec["at"][1].as_f64().expect("at: [lat, lon]"),
    };
    router.nearest(canonical(client), at, &health).node
}

/// This crate's client address for a client-IP vector.
fn client_choice(vec: &Value) -> Option<IpAddr> {
    let trusted = vec["trusted"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t.as_str().expect("trusted: strings").to_owned())
        .collect();
    let table = RoutingTable {
        format: crate::FORMAT_VERSION,
        cluster: "vectors".into(),
        trusted_proxies: trusted,
        geo: GeoSettings::default(),
        zones: std::collections::BTreeMap::new(),
        nodes: vec["routers"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, a)| {
                (
                    format!("router-{i}"),
                    crate::routing::Node {
                        roles: vec!["router".into()],
                        region: "vectors".into(),
                        zone: None,
                        public_url: None,
                        location: None,
                        addresses: vec![a.as_str().expect("routers: strings").to_owned()],
                        playback_session_limit: None,
                        playback_bandwidth_kbit: None,
                        network_bandwidth_kbit: None,
                        drain: false,
                    },
                )
            })
            .collect(),
        router_pool: None,
    };
    let router = Router::new(table).expect("trusted networks");
    let peer: IpAddr = text(vec, "peer").expect("peer").parse().expect("peer");
    router.client_ip_proxied(peer, text(vec, "proxy"), text(vec, "xff"), &mut Vec::new())
}

/// This crate's TLS outcome for a certificate vector: (outcome, key).
fn tls_choice(vec: &Value) -> (String, Option<String>) {
    let stored: std::collections::BTreeMap<String, String> = vec["docs"]
        .as_object()
        .expect("docs")
        .iter()
        .map(|(k, v)| {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (k.clone(), text)
        })
        .collect();
    let a = crate::tls::outcome(
        text(vec, "sni"),
        text(vec, "host").expect("host"),
        vec["now"].as_u64().expect("now"),
        |k| stored.get(k).map(String::as_str),
    );
    (a.tls.as_str().to_owned(), a.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_outcomes_match_the_shared_vectors() {
        let mut failures = Vec::new();
        let mut ran = 0;
        for (line, v) in read("edge/tls.jsonl") {
            ran += 1;
            let want = (
                text(&v["want"], "tls").expect("want.tls").to_owned(),
                text(&v["want"], "key").map(str::to_owned),
            );
            let got = tls_choice(&v);
            if got != want {
                failures.push(format!(
                    "{}: got {got:?}, want {want:?}",
                    name("edge/tls.jsonl", line, &v)
                ));
            }
        }
        assert!(ran > 30, "only {ran} vectors");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    fn name(file: &str, line: usize, v: &Value) -> String {
        format!(
            "testdata/{file}:{line} ({})",
            text(v, "name").unwrap_or("?")
        )
    }

    #[test]
    fn edge_decisions_match_the_shared_vectors() {
        let mut base = Value::Null;
        let mut failures = Vec::new();
        let mut ran = 0;
        for (line, v) in read("edge/decide.jsonl") {
            if let Some(b) = v.get("base_doc") {
                base = b.clone();
                continue;
            }
            ran += 1;
            let got = edge_decision(&v, &base);
            let want = normalized(&v["want"]);
            if got != want {
                failures.push(format!(
                    "{}: got {}, want {}",
                    name("edge/decide.jsonl", line, &v),
                    Value::Object(got),
                    Value::Object(want)
                ));
            }
        }
        assert!(ran > 100, "only {ran} vectors");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn geo_choices_match_the_shared_vectors() {
        let mut failures = Vec::new();
        for (line, v) in read("route/nearest.jsonl") {
            let want = text(&v, "want").map(str::to_owned);
            let got = route_choice(&v);
            if got != want {
                failures.push(format!(
                    "{}: chose {got:?}, want {want:?}",
                    name("route/nearest.jsonl", line, &v)
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn client_addresses_match_the_shared_vectors() {
        let mut failures = Vec::new();
        for (line, v) in read("edge/client_ip.jsonl") {
            // `want`: the address, or "refused".
            let want: Option<IpAddr> = match text(&v, "want").expect("want") {
                "refused" => None,
                w => Some(w.parse().expect("want")),
            };
            let got = client_choice(&v);
            if got != want {
                failures.push(format!(
                    "{}: chose {got:?}, want {want:?}",
                    name("edge/client_ip.jsonl", line, &v)
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
