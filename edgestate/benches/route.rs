//! The full playback decision in-process, on a large table: 1,000 zones of
//! 100 routes each (100,000 prefixes), 300 nodes, a health snapshot of all
//! of them. Goal: a decision in ≤ 1 µs (median).
//!
//! `cargo bench -p edgestate --bench route`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use edgestate::route::{Health, NodeHealth, Router};
use edgestate::routing::{GeoSettings, Location, Node, RoutingTable, Zone};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn main() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut zones = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let mut health = Health::default();
    // Zone z owns 100 disjoint /24s under 11.0.0.0/8; zone 0 also 0.0.0.0/0.
    for z in 0..1000u32 {
        let name = format!("zone-{z:04}");
        let routes = (0..100u32)
            .map(|r| {
                let base = (u32::from(Ipv4Addr::new(11, 0, 0, 0)) + (z * 100 + r) * 256) & !0xff;
                format!("{}/24", Ipv4Addr::from(base))
            })
            .collect();
        // Each zone falls back to its group's head (100 zones a group),
        // whose own fallback ends the chain: chains of one to two zones.
        let fallback = (z % 100 != 0).then(|| format!("zone-{:04}", z / 100 * 100));
        zones.insert(name, Zone { routes, fallback });
    }
    zones
        .get_mut("zone-0000")
        .unwrap()
        .routes
        .push("0.0.0.0/0".into());
    for n in 0..300u32 {
        let name = format!("edge-{n:03}");
        let zone = format!("zone-{:04}", n * 3);
        nodes.insert(
            name.clone(),
            Node {
                roles: vec![if n % 2 == 0 {
                    "edge".into()
                } else {
                    "ingest".into()
                }],
                region: "eu".into(),
                zone: Some(zone),
                public_url: Some(format!("https://{name}.example.net")),
                location: Some(Location {
                    lat: 50.0,
                    lon: 5.0,
                }),
                addresses: vec![format!("198.51.{}.{}", n / 200, n % 200)],
                playback_session_limit: Some(1000),
                playback_bandwidth_kbit: Some(10_000_000),
                network_bandwidth_kbit: None,
                drain: false,
            },
        );
        health.nodes.insert(
            name,
            NodeHealth {
                online: Some(n % 7 != 0),
                play_sessions: Some(rng.next() % 900),
                out_kbit: Some(rng.next() % 9_000_000),
                streams: Some(vec!["cam1".into()].into()),
                stale: false,
                vod: None,
                net_kbit: None,
                serving: None,
            },
        );
    }
    let table = RoutingTable {
        format: 1,
        cluster: "bench".into(),
        trusted_proxies: vec!["192.0.2.10/32".into()],
        geo: GeoSettings {
            tie_km: 100.0,
            buckets: vec![],
            default_weight: 1,
            max_fails: 3,
            fail_timeout_s: 30,
        },
        zones,
        nodes,
        router_pool: None,
    };
    let t = Instant::now();
    let router = Router::new(table).unwrap();
    let build = t.elapsed();
    // Clients inside the zones' routes (so chains are walked), pre-generated.
    let clients: Vec<IpAddr> = (0..100_000)
        .map(|_| {
            let z = (rng.next() % 1000) as u32;
            let r = (rng.next() % 100) as u32;
            let host = (rng.next() % 256) as u32;
            IpAddr::V4(Ipv4Addr::from(
                u32::from(Ipv4Addr::new(11, 0, 0, 0)) + (z * 100 + r) * 256 + host,
            ))
        })
        .collect();
    let mut statuses = BTreeMap::new();
    for c in &clients {
        *statuses
            .entry(router.decide(Some(*c), None, "cam1", &health).status)
            .or_insert(0) += 1;
    }
    let measure = |explain: bool| {
        let mut rounds = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            for c in &clients {
                if explain {
                    black_box(router.decide(Some(*c), None, black_box("cam1"), &health));
                } else {
                    black_box(router.decide_quick(Some(*c), None, black_box("cam1"), &health));
                }
            }
            rounds.push(t.elapsed().as_nanos() as f64 / clients.len() as f64);
        }
        rounds.sort_by(f64::total_cmp);
        (
            rounds[rounds.len() / 2],
            rounds[0],
            rounds[rounds.len() - 1],
        )
    };
    let quick = measure(false);
    let explained = measure(true);
    println!(
        "table: 1,000 zones x 100 routes (+0.0.0.0/0), 300 nodes; built in {build:?}; statuses {statuses:?}"
    );
    println!("| what | median ns/decision | min | max |\n|---|---:|---:|---:|");
    println!(
        "| playback decision (agent redirect path) | {:.0} | {:.0} | {:.0} |",
        quick.0, quick.1, quick.2
    );
    println!(
        "| playback decision explained (reasons, chain listing; JSON and `edgeform route`) | {:.0} | {:.0} | {:.0} |",
        explained.0, explained.1, explained.2
    );
}
