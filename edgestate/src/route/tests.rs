//! Table tests: every rule of the module documentation (route.rs) and the zone table of README, "Routing decisions, explained offline".

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::*;
use crate::routing::{GeoSettings, Zone};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn node(roles: &[&str], zone: Option<&str>) -> Node {
    Node {
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        region: "eu".into(),
        zone: zone.map(str::to_owned),
        public_url: None,
        location: None,
        // An edge has an address (the geo router proxies to its first).
        addresses: if roles.contains(&"edge") {
            vec!["192.0.2.10".to_owned()]
        } else {
            Vec::new()
        },
        playback_session_limit: None,
        playback_bandwidth_kbit: None,
        network_bandwidth_kbit: None,
        drain: false,
    }
}

struct T {
    zones: BTreeMap<String, Zone>,
    nodes: BTreeMap<String, Node>,
    trusted: Vec<String>,
}

impl T {
    fn new() -> T {
        T {
            zones: BTreeMap::new(),
            nodes: BTreeMap::new(),
            trusted: Vec::new(),
        }
    }
    fn zone(mut self, name: &str, routes: &[&str], fallback: Option<&str>) -> T {
        self.zones.insert(
            name.into(),
            Zone {
                routes: routes.iter().map(|r| (*r).to_owned()).collect(),
                fallback: fallback.map(str::to_owned),
            },
        );
        self
    }
    fn node(mut self, name: &str, n: Node) -> T {
        self.nodes.insert(name.into(), n);
        self
    }
    fn router(self) -> Router {
        Router::new(RoutingTable {
            format: 1,
            cluster: "t".into(),
            trusted_proxies: self.trusted,
            geo: GeoSettings {
                tie_km: 100.0,
                buckets: Vec::new(),
                default_weight: 1,
                max_fails: 3,
                fail_timeout_s: 30,
            },
            zones: self.zones,
            nodes: self.nodes,
            router_pool: None,
        })
        .unwrap()
    }
}

/// (node, online, sessions, out_kbit, streams).
type Report<'a> = (&'a str, bool, Option<u64>, Option<u64>, &'a [&'a str]);

fn health(entries: &[Report<'_>]) -> Health {
    Health {
        nodes: entries
            .iter()
            .map(|(n, online, s, o, streams)| {
                (
                    (*n).to_owned(),
                    NodeHealth {
                        online: Some(*online),
                        play_sessions: *s,
                        out_kbit: *o,
                        streams: Some(std::sync::Arc::new(
                            streams.iter().map(|x| (*x).to_owned()).collect(),
                        )),
                        stale: false,
                        vod: None,
                        net_kbit: None,
                        serving: None,
                    },
                )
            })
            .collect(),
    }
}

/// Seed 002's offices: office-1, office-2, origin-pool.
fn offices(office2_fallback: Option<&str>) -> Router {
    T::new()
        .zone("office-1", &["10.1.0.0/16"], None)
        .zone("office-2", &["10.2.0.0/16"], office2_fallback)
        .zone("origin-pool", &[], None)
        .zone("world", &["0.0.0.0/0", "::/0"], None)
        .node("o1-a", node(&["edge"], Some("office-1")))
        .node("o2-a", node(&["edge"], Some("office-2")))
        .node("o2-b", node(&["ingest"], Some("office-2")))
        .node("origin", node(&["origin"], Some("origin-pool")))
        .node("w", node(&["edge"], Some("world")))
        .router()
}

fn all_up_but_office2() -> Health {
    health(&[
        ("o1-a", true, Some(1), None, &[]),
        ("o2-a", false, Some(0), None, &[]),
        ("o2-b", false, Some(0), None, &["cam"]),
        ("origin", true, Some(0), None, &["cam"]),
        ("w", true, Some(0), None, &[]),
    ])
}

#[test]
fn seed_table_office2_none_refuses() {
    let d = offices(None).decide(Some(ip("10.2.0.9")), None, "cam", &all_up_but_office2());
    assert_eq!(d.status, 503, "{:#?}", d.reasons);
    assert_eq!(d.chain, ["office-2"]);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("o2-a excluded: offline"))
    );
}

#[test]
fn seed_table_office2_office1_none() {
    let r = offices(Some("office-1"));
    let d = r.decide(Some(ip("10.2.0.9")), None, "cam", &all_up_but_office2());
    assert_eq!(
        (d.status, d.node.as_deref(), d.zone.as_deref()),
        (302, Some("o1-a"), Some("office-1"))
    );
    assert_eq!(d.chain, ["office-2", "office-1"]);
    // office-1 down too: refusal; origin and world stay excluded.
    let mut h = all_up_but_office2();
    h.nodes.get_mut("o1-a").unwrap().online = Some(false);
    let d = r.decide(Some(ip("10.2.0.9")), None, "cam", &h);
    assert_eq!(d.status, 503);
}

#[test]
fn seed_table_office2_origin_pool() {
    let r = offices(Some("origin-pool"));
    let d = r.decide(Some(ip("10.2.0.9")), None, "cam", &all_up_but_office2());
    assert_eq!((d.status, d.node.as_deref()), (302, Some("origin")));
    let mut h = all_up_but_office2();
    h.nodes.get_mut("origin").unwrap().online = Some(false);
    assert_eq!(r.decide(Some(ip("10.2.0.9")), None, "cam", &h).status, 503);
}

#[test]
fn longest_prefix_across_zones_and_ipv6() {
    let r = T::new()
        .zone("wide", &["10.0.0.0/8", "2001:db8::/32"], None)
        .zone("narrow", &["10.2.77.0/24", "2001:db8:77::/48"], None)
        .node("a", node(&["edge"], Some("wide")))
        .node("b", node(&["edge"], Some("narrow")))
        .router();
    assert_eq!(r.zone_of(ip("10.2.77.5")), Some("narrow"));
    assert_eq!(r.zone_of(ip("10.2.78.5")), Some("wide"));
    assert_eq!(r.zone_of(ip("2001:db8:77::1")), Some("narrow"));
    assert_eq!(r.zone_of(ip("2001:db8:78::1")), Some("wide"));
    assert_eq!(r.zone_of(ip("::ffff:10.2.77.5")), Some("narrow"));
    let h = health(&[
        ("a", true, Some(0), None, &["s"]),
        ("b", true, Some(9), None, &[]),
    ]);
    let d = r.decide(Some(ip("2001:db8:77::1")), None, "s", &h);
    assert_eq!(
        d.node.as_deref(),
        Some("b"),
        "a more specific route of another zone wins"
    );
    // Outside every route while restricted: 403; no client IP: 403.
    assert_eq!(r.decide(Some(ip("192.0.2.1")), None, "s", &h).status, 403);
    assert_eq!(r.decide(None, None, "s", &h).status, 403);
}

#[test]
fn chain_stops_at_none_missing_and_repeated() {
    let r = T::new()
        .zone("a", &["10.0.0.0/8"], Some("b"))
        .zone("b", &[], Some("a"))
        .zone("c", &["11.0.0.0/8"], Some("gone"))
        .router();
    let mut why = Vec::new();
    assert_eq!(r.chain("a", &mut why), ["a", "b"]);
    assert!(why[0].contains("repeats"));
    assert_eq!(r.chain("c", &mut why), ["c"]);
    assert!(why[1].contains("does not exist"));
}

#[test]
fn unzoned_and_unrelated_nodes_never_serve_when_restricted() {
    let r = T::new()
        .zone("a", &["10.0.0.0/8"], None)
        .zone("b", &["11.0.0.0/8"], None)
        .node("in-b", node(&["edge"], Some("b")))
        .node("nowhere", node(&["edge"], None))
        .router();
    let h = health(&[
        ("in-b", true, Some(0), None, &["s"]),
        ("nowhere", true, Some(0), None, &["s"]),
    ]);
    assert_eq!(r.decide(Some(ip("10.1.1.1")), None, "s", &h).status, 503);
}

#[test]
fn unrestricted_edges_first_then_ingest() {
    let r = T::new()
        .zone("empty", &[], None)
        .node("e1", node(&["edge"], None))
        .node("i1", node(&["ingest"], None))
        .router();
    assert!(
        !r.restricted(),
        "empty zones do not enable restricted routing"
    );
    let h = health(&[
        ("e1", true, Some(50), None, &[]),
        ("i1", true, Some(0), None, &["s"]),
    ]);
    assert_eq!(
        r.decide(Some(ip("192.0.2.1")), None, "s", &h)
            .node
            .as_deref(),
        Some("e1")
    );
    let h = health(&[
        ("e1", false, Some(0), None, &[]),
        ("i1", true, Some(0), None, &["s"]),
    ]);
    assert_eq!(
        r.decide(Some(ip("192.0.2.1")), None, "s", &h)
            .node
            .as_deref(),
        Some("i1")
    );
    // An ingest node that does not carry the stream is no fallback.
    let h = health(&[
        ("e1", false, Some(0), None, &[]),
        ("i1", true, Some(0), None, &["t"]),
        ("x", true, None, None, &["s"]),
    ]);
    assert_eq!(r.decide(Some(ip("192.0.2.1")), None, "s", &h).status, 503);
    // No client IP is fine when unrestricted.
    let h = health(&[("e1", true, Some(0), None, &["s"])]);
    assert_eq!(r.decide(None, None, "s", &h).status, 302);
}

fn limited(limit: Option<u64>, bw: Option<u64>) -> Router {
    let mut n = node(&["edge"], None);
    n.playback_session_limit = limit;
    n.playback_bandwidth_kbit = bw;
    n.public_url = Some("https://e.example.net/".into());
    T::new()
        .node("e", n)
        .node("spare", node(&["ingest"], None))
        .router()
}

#[test]
fn limits_zero_at_limit_bandwidth_and_missing_metrics() {
    let h = |s: Option<u64>, o: Option<u64>| health(&[("e", true, s, o, &["s"])]);
    let c = Some(ip("192.0.2.1"));
    // Absent limits: unlimited.
    assert_eq!(
        limited(None, None)
            .decide(c, None, "s", &h(Some(10_000), None))
            .status,
        302
    );
    // 0 = never selected.
    let d = limited(Some(0), None).decide(c, None, "s", &h(Some(0), None));
    assert_eq!(d.status, 503);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("playback_session_limit is 0"))
    );
    assert_eq!(
        limited(None, Some(0))
            .decide(c, None, "s", &h(Some(0), Some(0)))
            .status,
        503
    );
    // At the limit excludes; below admits.
    assert_eq!(
        limited(Some(5), None)
            .decide(c, None, "s", &h(Some(5), None))
            .status,
        503
    );
    assert_eq!(
        limited(Some(5), None)
            .decide(c, None, "s", &h(Some(4), None))
            .status,
        302
    );
    assert_eq!(
        limited(None, Some(1000))
            .decide(c, None, "s", &h(Some(0), Some(1000)))
            .status,
        503
    );
    assert_eq!(
        limited(None, Some(1000))
            .decide(c, None, "s", &h(Some(0), Some(999)))
            .status,
        302
    );
    // Missing metrics exclude: sessions always, out_kbit when limited.
    assert_eq!(
        limited(None, None)
            .decide(c, None, "s", &h(None, None))
            .status,
        503
    );
    let d = limited(None, Some(1000)).decide(c, None, "s", &h(Some(0), None));
    assert_eq!(d.status, 503);
    assert!(d.reasons.iter().any(|r| r.contains("out_kbit missing")));
    assert_eq!(
        limited(None, None)
            .decide(c, None, "s", &h(Some(0), None))
            .status,
        302
    );
    // No report at all, or online missing.
    assert_eq!(
        limited(None, None)
            .decide(
                c,
                None,
                "s",
                &health(&[("spare", true, Some(0), None, &["s"])])
            )
            .node
            .as_deref(),
        Some("spare")
    );
    // Payload URL → redirect to it, trailing slash handled.
    let d = limited(None, None).decide(c, None, "s", &h(Some(0), None));
    assert_eq!(d.location.as_deref(), Some("https://e.example.net/s"));
    assert_eq!(d.mode, Some(Mode::Redirect));
}

#[test]
fn no_payload_url_means_proxy_and_unknown_stream_is_404() {
    let r = T::new().node("e", node(&["edge"], None)).router();
    let h = health(&[("e", true, Some(0), None, &["s"])]);
    let d = r.decide(Some(ip("192.0.2.1")), None, "s", &h);
    assert_eq!(
        (d.status, d.mode, d.location),
        (302, Some(Mode::Proxy), None)
    );
    let d = r.decide(Some(ip("192.0.2.1")), None, "nobody-has-it", &h);
    assert_eq!(d.status, 404);
}

#[test]
fn fewest_sessions_wins_and_ties_spread_evenly() {
    let mut t = T::new();
    for i in 0..4 {
        t = t.node(&format!("e{i}"), node(&["edge"], None));
    }
    let r = t.router();
    let h = health(&[
        ("e0", true, Some(3), None, &["s"]),
        ("e1", true, Some(1), None, &[]),
        ("e2", true, Some(2), None, &[]),
        ("e3", true, Some(1), None, &[]),
    ]);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..4000u32 {
        let client = IpAddr::from(std::net::Ipv4Addr::from(0xc000_0200 + i * 7919));
        let d = r.decide(Some(client), None, "s", &h);
        *counts.entry(d.node.clone().unwrap()).or_default() += 1;
        // Stateless: the same client gets the same answer.
        assert_eq!(r.decide(Some(client), None, "s", &h).node, d.node.clone());
    }
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["e1", "e3"],
        "only the least loaded"
    );
    let (a, b) = (counts["e1"], counts["e3"]);
    assert!(a.abs_diff(b) < 250, "uneven spread: {a} vs {b}");
    // The JSON listing: nodes by increasing load, eligible first.
    let d = r.decide(Some(ip("192.0.2.1")), None, "s", &h);
    let order: Vec<&str> = d.zones[0].nodes.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(order, ["e1", "e3", "e2", "e0"]);
}

#[test]
fn in_a_zone_edge_and_ingest_are_equal_and_origin_has_no_priority() {
    let r = T::new()
        .zone("z", &["0.0.0.0/0"], None)
        .node("edge", node(&["edge"], Some("z")))
        .node("ingest", node(&["ingest"], Some("z")))
        .node("origin", node(&["origin"], Some("z")))
        .router();
    let h = health(&[
        ("edge", true, Some(5), None, &[]),
        ("ingest", true, Some(2), None, &["s"]),
        ("origin", true, Some(3), None, &["s"]),
    ]);
    assert_eq!(
        r.decide(Some(ip("192.0.2.1")), None, "s", &h)
            .node
            .as_deref(),
        Some("ingest")
    );
}

#[test]
fn x_forwarded_for_from_trusted_untrusted_and_malformed() {
    let mut t = T::new().zone("a", &["203.0.113.0/24"], None).zone(
        "p",
        &["192.0.2.0/24", "2001:db8::/32"],
        None,
    );
    t.trusted = vec!["192.0.2.10/32".into(), "2001:db8::10/128".into()];
    t = t
        .node("ea", node(&["edge"], Some("a")))
        .node("ep", node(&["edge"], Some("p")));
    let r = t.router();
    let h = health(&[
        ("ea", true, Some(0), None, &["s"]),
        ("ep", true, Some(0), None, &["s"]),
    ]);
    let go = |peer: &str, xff: Option<&str>| r.decide(Some(ip(peer)), xff, "s", &h);
    // Trusted: the last entry is the client.
    let d = go("192.0.2.10", Some("198.51.100.1, 203.0.113.7"));
    assert_eq!(
        (d.client_ip.as_deref(), d.node.as_deref()),
        (Some("203.0.113.7"), Some("ea"))
    );
    assert_eq!(
        go("2001:db8::10", Some("203.0.113.8")).client_ip.as_deref(),
        Some("203.0.113.8")
    );
    // Untrusted peer: header ignored.
    let d = go("192.0.2.11", Some("203.0.113.7"));
    assert_eq!(
        (d.client_ip.as_deref(), d.node.as_deref()),
        (Some("192.0.2.11"), Some("ep"))
    );
    // A malformed or empty last entry: the peer.
    assert_eq!(
        go("192.0.2.10", Some("203.0.113.7, bogus"))
            .client_ip
            .as_deref(),
        Some("192.0.2.10")
    );
    assert_eq!(
        go("192.0.2.10", Some("")).client_ip.as_deref(),
        Some("192.0.2.10")
    );
    assert_eq!(
        go("192.0.2.10", Some("203.0.113.7, ")).client_ip.as_deref(),
        Some("192.0.2.10")
    );
    // Whatever comes before the last entry does not matter: the proxy
    // appended the last one (`unknown`, empty lines, garbage).
    for xff in [
        "unknown, 203.0.113.7",
        ", 203.0.113.7",
        "garbage, , not an ip,203.0.113.7",
        "\u{fffd}, 203.0.113.7",
        "192.0.2.99 ,\t203.0.113.7 \t",
    ] {
        assert_eq!(
            go("192.0.2.10", Some(xff)).client_ip.as_deref(),
            Some("203.0.113.7"),
            "{xff:?}"
        );
    }
    // Only spaces and tabs are trimmed: Unicode whitespace (U+00A0), a
    // vertical tab or a line break around the last entry make it malformed.
    for xff in [
        "203.0.113.7\u{a0}",
        "\u{a0}203.0.113.7",
        "203.0.113.7\u{2003}",
        "203.0.113.7\u{b}",
        "203.0.113.7\n",
    ] {
        assert_eq!(
            go("192.0.2.10", Some(xff)).client_ip.as_deref(),
            Some("192.0.2.10"),
            "{xff:?}"
        );
    }
    assert_eq!(
        go("192.0.2.10", None).client_ip.as_deref(),
        Some("192.0.2.10")
    );
    // An empty trusted list trusts nobody.
    let r2 = T::new().node("e", node(&["edge"], None)).router();
    let d = r2.decide(
        Some(ip("192.0.2.10")),
        Some("203.0.113.7"),
        "s",
        &health(&[("e", true, Some(0), None, &["s"])]),
    );
    assert_eq!(d.client_ip.as_deref(), Some("192.0.2.10"));
}

#[test]
fn private_addresses_are_left_out_of_the_listing() {
    let mut n = node(&["edge"], None);
    n.addresses = vec![
        "10.0.0.5".into(),
        "198.51.100.5".into(),
        "fd00::5".into(),
        "2001:db8:1::5".into(),
    ];
    let r = T::new().node("e", n).router();
    let d = r.decide(
        Some(ip("192.0.2.1")),
        None,
        "s",
        &health(&[("e", true, Some(0), None, &["s"])]),
    );
    assert_eq!(
        d.zones[0].nodes[0].addresses,
        ["198.51.100.5", "2001:db8:1::5"]
    );
}

#[test]
fn vod_placement_order() {
    let r = offices(Some("origin-pool"));
    let nodes = &r.table().nodes;
    let h = health(&[
        ("o2-a", true, Some(5), None, &[]),
        ("o2-b", true, Some(1), None, &[]),
        ("origin", true, Some(0), None, &[]),
    ]);
    let chain: Vec<String> = vec!["office-2".into(), "origin-pool".into()];
    let p = |n: &str, rev: u64| Placement {
        node: n.into(),
        revision: rev,
    };
    // A newer forbidden replica (office-1) cannot exclude an older permitted one.
    let ps = [p("o1-a", 9), p("o2-a", 3)];
    assert_eq!(
        choose_placement(&ps, &chain, nodes, &h).unwrap().node,
        "o2-a"
    );
    // A newer permitted fallback replica beats an older home replica.
    let ps = [p("o2-a", 3), p("origin", 4)];
    assert_eq!(
        choose_placement(&ps, &chain, nodes, &h).unwrap().node,
        "origin"
    );
    // Same revision: zone order, then load.
    let ps = [p("origin", 4), p("o2-a", 4), p("o2-b", 4)];
    assert_eq!(
        choose_placement(&ps, &chain, nodes, &h).unwrap().node,
        "o2-b"
    );
    assert!(choose_placement(&[p("o1-a", 1)], &chain, nodes, &h).is_none());
}

fn geo_router() -> Router {
    let mut t = T::new();
    for (name, lat, lon) in [
        ("ams", 52.37, 4.90),
        ("ams2", 52.30, 4.76),
        ("fra", 50.11, 8.68),
        ("nyc", 40.71, -74.0),
    ] {
        let mut n = node(&["edge"], None);
        n.location = Some(Location { lat, lon });
        t = t.node(name, n);
    }
    t.router()
}

#[test]
fn geo_strictly_nearest_and_ties_by_rendezvous() {
    let r = geo_router();
    let all = health(&[
        ("ams", true, Some(0), None, &[]),
        ("ams2", true, Some(0), None, &[]),
        ("fra", true, Some(0), None, &[]),
        ("nyc", true, Some(0), None, &[]),
    ]);
    let london = Location {
        lat: 51.5142,
        lon: -0.0931,
    };
    let newyork = Location {
        lat: 40.7,
        lon: -73.9,
    };
    let d = r.nearest(ip("216.160.83.57"), newyork, &all);
    assert_eq!((d.node.as_deref(), d.tied.len()), (Some("nyc"), 1));
    // ams and ams2 are 11 km apart: tied for London, fra is not.
    let mut chosen: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    for i in 0..400u32 {
        let c = IpAddr::from(std::net::Ipv4Addr::from(0x5102_4500 + i * 31));
        let d = r.nearest(c, london, &all);
        assert_eq!(
            d.tied.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(),
            ["ams2", "ams"]
        );
        chosen.entry(d.node.unwrap()).or_default().push(c);
    }
    assert_eq!(chosen.len(), 2, "ties spread over both");
    // Rendezvous stability: when ams2 leaves, its clients move, ams's stay.
    let mut without = all.clone();
    without.nodes.get_mut("ams2").unwrap().online = Some(false);
    for c in &chosen["ams"] {
        assert_eq!(r.nearest(*c, london, &without).node.as_deref(), Some("ams"));
    }
    for c in &chosen["ams2"] {
        assert_eq!(r.nearest(*c, london, &without).node.as_deref(), Some("ams"));
    }
    // With ams and ams2 both gone, London goes to fra, strictly nearest.
    without.nodes.get_mut("ams").unwrap().online = Some(false);
    assert_eq!(
        r.nearest(ip("81.2.69.142"), london, &without)
            .node
            .as_deref(),
        Some("fra")
    );
}

#[test]
fn the_quick_decision_is_the_explained_one() {
    // Every scenario above, every client: same status, node, zone, location.
    let routers = [
        offices(None),
        offices(Some("office-1")),
        offices(Some("origin-pool")),
        geo_router(),
        limited(Some(5), Some(1000)),
    ];
    let healths = [
        all_up_but_office2(),
        health(&[
            ("e", true, Some(4), Some(999), &["s"]),
            ("ams", true, Some(0), None, &["cam"]),
        ]),
    ];
    for r in &routers {
        for h in &healths {
            for i in 0..300u32 {
                let c = IpAddr::from(std::net::Ipv4Addr::from(0x0a02_0000 + i * 977));
                for stream in ["cam", "s", "none"] {
                    let a = r.decide(Some(c), None, stream, h);
                    let b = r.decide_quick(Some(c), None, stream, h);
                    assert_eq!(
                        (a.status, &a.node, &a.zone, &a.location, a.mode),
                        (b.status, &b.node, &b.zone, &b.location, b.mode)
                    );
                    assert!(b.reasons.is_empty() && b.zones.is_empty());
                }
            }
        }
    }
}

/// `drain: true` (ADMIN_DOWN): a drained node is listed with the reason
/// `drained` and never chosen — playback in its zone falls to the next
/// eligible node or down the chain, geo skips it, VOD placement skips it —
/// while healthy and otherwise eligible; quick and explained agree.
#[test]
fn drained_nodes_are_never_chosen() {
    let drained = |roles: &[&str], zone: &str| {
        let mut n = node(roles, Some(zone));
        n.drain = true;
        n
    };
    let r = T::new()
        .zone("office-1", &["10.1.0.0/16"], Some("world"))
        .zone("world", &["0.0.0.0/0", "::/0"], None)
        .node("o1-a", drained(&["edge"], "office-1"))
        .node("o1-b", node(&["edge"], Some("office-1")))
        .node("w", node(&["edge"], Some("world")))
        .router();
    let all_up = health(&[
        ("o1-a", true, Some(0), None, &["cam"]),
        ("o1-b", true, Some(50), None, &["cam"]),
        ("w", true, Some(0), None, &["cam"]),
    ]);
    // Table: (health, expected node, expected zone).
    let only_drained_up = health(&[
        ("o1-a", true, Some(0), None, &[]),
        ("o1-b", false, Some(0), None, &["cam"]),
        ("w", true, Some(9), None, &["cam"]),
    ]);
    for (h, node, zone) in [
        (&all_up, "o1-b", "office-1"),
        (&only_drained_up, "w", "world"),
    ] {
        let d = r.decide(Some(ip("10.1.2.3")), None, "cam", h);
        assert_eq!(d.node.as_deref(), Some(node), "{:#?}", d.reasons);
        assert_eq!(d.zone.as_deref(), Some(zone), "{:#?}", d.reasons);
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("o1-a excluded: drained")),
            "{:#?}",
            d.reasons
        );
        let q = r.decide_quick(Some(ip("10.1.2.3")), None, "cam", h);
        assert_eq!(q.node, d.node);
        let listed = d
            .zones
            .iter()
            .flat_map(|z| &z.nodes)
            .find(|c| c.node == "o1-a")
            .unwrap();
        assert!(!listed.eligible && listed.reason.as_deref() == Some("drained"));
    }

    // Geo: the drained nearest edge is skipped for the next one.
    let mut t = T::new();
    for (name, lat, lon, drain) in [("ams", 52.37, 4.90, true), ("fra", 50.11, 8.68, false)] {
        let mut n = node(&["edge"], None);
        n.location = Some(Location { lat, lon });
        n.drain = drain;
        t = t.node(name, n);
    }
    let g = t.router();
    let up = health(&[
        ("ams", true, Some(0), None, &[]),
        ("fra", true, Some(0), None, &[]),
    ]);
    let london = Location {
        lat: 51.5142,
        lon: -0.0931,
    };
    let d = g.nearest(ip("81.2.69.142"), london, &up);
    assert_eq!(d.node.as_deref(), Some("fra"));
    assert!(d.reasons.iter().any(|r| r == "ams excluded: drained"));

    // VOD: the newest replica sits on a drained node: the next one wins.
    let placements = [
        Placement {
            node: "o1-a".into(),
            revision: 9,
        },
        Placement {
            node: "o1-b".into(),
            revision: 3,
        },
    ];
    let chain = vec!["office-1".to_owned(), "world".to_owned()];
    let p = choose_placement(&placements, &chain, &r.table().nodes, &all_up).unwrap();
    assert_eq!(p.node, "o1-b");
}

// VOD table tests, one per sentence of the CDN-zones VOD rule: "For
// VOD, central first filters available placements by allowed zones, then
// selects the highest available revision, followed by zone and load. A
// newer forbidden replica cannot exclude an older permitted replica; a
// newer permitted fallback replica may take precedence over an older home
// replica."

/// (node, online, sessions, [(asset, revisions)]).
type Held<'a> = (&'a str, bool, u64, &'a [(&'a str, &'a [u64])]);

/// `health` with VOD holdings.
fn vod_health(entries: &[Held<'_>]) -> Health {
    Health {
        nodes: entries
            .iter()
            .map(|(n, online, s, held)| {
                (
                    (*n).to_owned(),
                    NodeHealth {
                        online: Some(*online),
                        play_sessions: Some(*s),
                        out_kbit: Some(0),
                        streams: Some(Vec::new().into()),
                        stale: false,
                        net_kbit: Some(0),
                        serving: None,
                        vod: Some(std::sync::Arc::new(
                            held.iter()
                                .map(|(a, r)| ((*a).to_owned(), r.to_vec()))
                                .collect(),
                        )),
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn vod_first_filters_available_placements_by_allowed_zones() {
    // office-2 → origin-pool: office-1 and world are not allowed, however
    // new their copy; an offline node's copy is not available.
    let r = offices(Some("origin-pool"));
    let h = vod_health(&[
        ("o1-a", true, 0, &[("movie", &[7])]),
        ("w", true, 0, &[("movie", &[9])]),
        ("o2-a", false, 0, &[("movie", &[8])]),
        ("origin", true, 5, &[("movie", &[2])]),
    ]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!(d.status, 302, "{d:#?}");
    assert_eq!(d.node.as_deref(), Some("origin"));
    assert_eq!(d.revision, Some(2));
    assert_eq!(d.chain, ["office-2", "origin-pool"]);
    let why = |n: &str| {
        d.replicas
            .iter()
            .find(|x| x.node == n)
            .and_then(|x| x.reason.clone())
    };
    assert_eq!(
        why("o1-a").as_deref(),
        Some("zone office-1 is not allowed for this client")
    );
    assert_eq!(why("o2-a").as_deref(), Some("offline"));
    assert_eq!(d.replicas[0].node, "origin", "the chosen one first");
    // Nothing allowed is available: 503, never a forbidden replica.
    let h = vod_health(&[("o1-a", true, 0, &[("movie", &[7])])]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!((d.status, d.node), (503, None));
    // No node has it at all: 404; outside every route: 403.
    assert_eq!(r.vod(Some(ip("10.2.0.9")), None, "other", &h).status, 404);
    let restricted_only = T::new()
        .zone("office-1", &["10.1.0.0/16"], None)
        .node("o1-a", node(&["edge"], Some("office-1")))
        .router();
    assert_eq!(
        restricted_only
            .vod(Some(ip("192.0.2.1")), None, "movie", &h)
            .status,
        403
    );
}

#[test]
fn vod_then_highest_available_revision_then_zone_then_load() {
    let r = offices(Some("origin-pool"));
    // Highest revision wins over zone order and load.
    let h = vod_health(&[
        ("o2-a", true, 0, &[("movie", &[1, 2])]),
        ("o2-b", true, 0, &[("movie", &[1])]),
        ("origin", true, 50, &[("movie", &[3])]),
    ]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!((d.node.as_deref(), d.revision), (Some("origin"), Some(3)));
    // Same revision: the home zone before the fallback, whatever the load.
    let h = vod_health(&[
        ("o2-a", true, 40, &[("movie", &[3])]),
        ("origin", true, 0, &[("movie", &[3])]),
    ]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!(d.node.as_deref(), Some("o2-a"));
    // Same revision and zone: the lower load.
    let h = vod_health(&[
        ("o2-a", true, 40, &[("movie", &[3])]),
        ("o2-b", true, 4, &[("movie", &[3])]),
    ]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!(d.node.as_deref(), Some("o2-b"));
}

#[test]
fn vod_newer_forbidden_replica_cannot_exclude_older_permitted() {
    let r = offices(Some("origin-pool"));
    let h = vod_health(&[
        ("o1-a", true, 0, &[("movie", &[9])]),
        ("o2-a", true, 0, &[("movie", &[3])]),
    ]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!((d.node.as_deref(), d.revision), (Some("o2-a"), Some(3)));
}

#[test]
fn vod_newer_permitted_fallback_replica_beats_older_home_replica() {
    let r = offices(Some("origin-pool"));
    let h = vod_health(&[
        ("o2-a", true, 0, &[("movie", &[3])]),
        ("origin", true, 0, &[("movie", &[4])]),
    ]);
    let d = r.vod(Some(ip("10.2.0.9")), None, "movie", &h);
    assert_eq!((d.node.as_deref(), d.revision), (Some("origin"), Some(4)));
    assert_eq!(d.zone.as_deref(), Some("origin-pool"));
}

#[test]
fn vod_unrestricted_allows_every_node_and_never_a_drained_one() {
    let mut drained = node(&["edge"], None);
    drained.drain = true;
    let r = T::new()
        .node("a", node(&["edge"], None))
        .node("b", node(&["ingest"], Some("z")))
        .node("d", drained)
        .router();
    let h = vod_health(&[
        ("a", true, 9, &[("movie", &[5])]),
        ("b", true, 1, &[("movie", &[5])]),
        ("d", true, 0, &[("movie", &[6])]),
    ]);
    let d = r.vod(Some(ip("192.0.2.1")), None, "movie", &h);
    assert!(d.chain.is_empty());
    assert_eq!((d.node.as_deref(), d.revision), (Some("b"), Some(5)));
    assert!(
        d.replicas
            .iter()
            .any(|x| x.node == "d" && x.reason.as_deref() == Some("drained"))
    );
}

/// `network_bandwidth_kbit`, the placement budget (RX+TX): a replica on a
/// node at or over it is not chosen; 0 never; a missing measure excludes
/// a limited node; unlimited nodes need no measure.
#[test]
fn vod_placement_budget_network_bandwidth_kbit() {
    let limited = |limit: Option<u64>| {
        let mut n = node(&["edge"], None);
        n.network_bandwidth_kbit = limit;
        n
    };
    let r = T::new()
        .node("busy", limited(Some(1000)))
        .node("zero", limited(Some(0)))
        .node("blind", limited(Some(1000)))
        .node("spare", limited(Some(1000)))
        .node("free", limited(None))
        .router();
    let mut h = vod_health(&[
        ("busy", true, 0, &[("movie", &[9])]),
        ("zero", true, 0, &[("movie", &[9])]),
        ("blind", true, 0, &[("movie", &[9])]),
        ("spare", true, 0, &[("movie", &[8])]),
        ("free", true, 0, &[("movie", &[7])]),
    ]);
    h.nodes.get_mut("busy").unwrap().net_kbit = Some(1000);
    h.nodes.get_mut("blind").unwrap().net_kbit = None;
    h.nodes.get_mut("spare").unwrap().net_kbit = Some(999);
    h.nodes.get_mut("free").unwrap().net_kbit = None;
    let d = r.vod(Some(ip("192.0.2.1")), None, "movie", &h);
    assert_eq!((d.node.as_deref(), d.revision), (Some("spare"), Some(8)));
    let why = |n: &str| {
        d.replicas
            .iter()
            .find(|x| x.node == n)
            .and_then(|x| x.reason.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        why("busy"),
        "at placement budget (1000 >= 1000 kbit/s RX+TX)"
    );
    assert_eq!(why("zero"), "network_bandwidth_kbit is 0");
    assert_eq!(
        why("blind"),
        "net_kbit missing (needed for network_bandwidth_kbit)"
    );
    // Over budget everywhere limited: the unlimited node, older revision.
    h.nodes.get_mut("spare").unwrap().net_kbit = Some(5000);
    let d = r.vod(Some(ip("192.0.2.1")), None, "movie", &h);
    assert_eq!(d.node.as_deref(), Some("free"));
}

/// A node online but failing its agent's probe (`serving: false`) is
/// excluded like an offline one, with its reason, by the stream decision,
/// the geo router and VOD; `serving` absent (no probe) changes nothing.
#[test]
fn a_node_not_serving_is_treated_like_an_offline_one() {
    let not_serving = |mut h: Health, name: &str| {
        h.nodes.get_mut(name).unwrap().serving = Some(false);
        h
    };
    // Streams.
    let r = T::new()
        .node("a", node(&["edge"], None))
        .node("b", node(&["edge"], None))
        .router();
    let up = health(&[
        ("a", true, Some(0), None, &["cam"]),
        ("b", true, Some(50), None, &["cam"]),
    ]);
    assert_eq!(
        r.decide(Some(ip("192.0.2.1")), None, "cam", &up)
            .node
            .as_deref(),
        Some("a")
    );
    let h = not_serving(up, "a");
    let d = r.decide(Some(ip("192.0.2.1")), None, "cam", &h);
    assert_eq!(d.node.as_deref(), Some("b"), "{:#?}", d.reasons);
    let listed = d
        .zones
        .iter()
        .flat_map(|z| &z.nodes)
        .find(|c| c.node == "a")
        .unwrap();
    assert!(!listed.eligible && listed.reason.as_deref() == Some("not serving"));
    assert_eq!(
        r.decide_quick(Some(ip("192.0.2.1")), None, "cam", &h).node,
        d.node
    );

    // Geo: the nearest edge not serving is skipped for the next one.
    let mut t = T::new();
    for (name, lat, lon) in [("ams", 52.37, 4.90), ("fra", 50.11, 8.68)] {
        let mut n = node(&["edge"], None);
        n.location = Some(Location { lat, lon });
        t = t.node(name, n);
    }
    let g = t.router();
    let h = not_serving(
        health(&[
            ("ams", true, Some(0), None, &[]),
            ("fra", true, Some(0), None, &[]),
        ]),
        "ams",
    );
    let london = Location {
        lat: 51.5142,
        lon: -0.0931,
    };
    let d = g.nearest(ip("81.2.69.142"), london, &h);
    assert_eq!(d.node.as_deref(), Some("fra"));
    assert!(
        d.reasons.iter().any(|r| r == "ams excluded: not serving"),
        "{:#?}",
        d.reasons
    );

    // VOD: the newest replica's node is not serving: the next one wins.
    let h = not_serving(
        vod_health(&[
            ("a", true, 0, &[("movie", &[6])]),
            ("b", true, 9, &[("movie", &[5])]),
        ]),
        "a",
    );
    let d = r.vod(Some(ip("192.0.2.1")), None, "movie", &h);
    assert_eq!((d.node.as_deref(), d.revision), (Some("b"), Some(5)));
    assert!(
        d.replicas
            .iter()
            .any(|x| x.node == "a" && x.reason.as_deref() == Some("not serving"))
    );
}

#[test]
fn an_unlocated_acme_challenge_goes_to_the_host_s_rendezvous_edge() {
    let r = geo_router();
    let all = health(&[
        ("ams", true, Some(0), None, &[]),
        ("ams2", true, Some(0), None, &[]),
        ("fra", true, Some(0), None, &[]),
        ("nyc", true, Some(0), None, &[]),
    ]);
    let mut chosen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..64 {
        let host = format!("site-{i}.test");
        let d = r.acme_unlocated(&host, &all);
        // The Host as sent: case and port do not matter ($host).
        let again = r.acme_unlocated(&format!("SITE-{i}.test:80"), &all);
        assert_eq!(d.node, again.node);
        chosen.entry(d.node.unwrap()).or_default().push(host);
    }
    assert_eq!(chosen.len(), 4, "spread over every edge: {chosen:?}");
    // fra goes offline: only its hosts move.
    let without = health(&[
        ("ams", true, Some(0), None, &[]),
        ("ams2", true, Some(0), None, &[]),
        ("fra", false, Some(0), None, &[]),
        ("nyc", true, Some(0), None, &[]),
    ]);
    for (edge, hosts) in &chosen {
        for h in hosts {
            let d = r.acme_unlocated(h, &without);
            if edge == "fra" {
                assert_ne!(d.node.as_deref(), Some("fra"));
            } else {
                assert_eq!(d.node.as_deref(), Some(edge.as_str()), "{h}");
            }
        }
    }
    let none = health(&[]);
    assert_eq!(r.acme_unlocated("a.test", &none).node, None);
}
