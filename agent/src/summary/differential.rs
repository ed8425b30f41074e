//! The summary path against the full-knowledge book: generated and hostile
//! health histories replayed through both; at every summary instant every
//! playback, geo and VOD decision must be the same.
//!
//! The full book hears every node's `health/<node>` (as agents did before
//! summaries); the summary path is one summarizer book per region (its
//! region's health topics, every status, like the agent that summarizes)
//! whose [`Book::summary_at`] feeds a receiver book
//! ([`Book::take_summary_at`]), with duplicate summarizers, summaries
//! delivered late and hostile summaries mixed in.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use edgestate::mqtt::{
    ConfigState, HealthReport, PurgeState, RedisState, Summary, SummaryEntry, SummaryErrorKind,
};
use edgestate::route::Router;
use edgestate::routing::{GeoSettings, Location, Node, RoutingTable, Zone};

use crate::book::Book;

/// splitmix64: a seeded generator, no crate needed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[usize::try_from(self.below(items.len() as u64)).unwrap_or(0)]
    }
}

const PREFIX: &str = "p";
const STREAMS: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];
const ASSETS: [&str; 3] = ["a0", "a1", "a2"];
/// The summarizers' interval.
const SUMMARY_EVERY: u64 = 1000;

/// A routing table of `regions` regions, random zones (with routes or
/// not), nodes (edges and ingests, limits, drained, locations).
fn table(rng: &mut Rng) -> RoutingTable {
    let regions = 2 + rng.below(3);
    let zone_count = 1 + rng.below(4);
    let restricted = rng.chance(70);
    let mut zones = BTreeMap::new();
    for z in 0..zone_count {
        zones.insert(
            format!("z{z}"),
            Zone {
                routes: if restricted {
                    vec![format!("10.{z}.0.0/16")]
                } else {
                    Vec::new()
                },
                fallback: (rng.chance(60) && z + 1 < zone_count).then(|| format!("z{}", z + 1)),
            },
        );
    }
    let mut nodes = BTreeMap::new();
    for i in 0..(6 + rng.below(14)) {
        let roles = if rng.chance(20) {
            vec!["ingest".to_owned()]
        } else {
            vec!["edge".to_owned()]
        };
        #[allow(clippy::cast_precision_loss)]
        let location = rng.chance(90).then(|| Location {
            lat: (rng.below(120) as f64) - 60.0,
            lon: (rng.below(340) as f64) - 170.0,
        });
        nodes.insert(
            format!("n{i}"),
            Node {
                roles,
                region: format!("r{}", rng.below(regions)),
                zone: Some(format!("z{}", rng.below(zone_count))),
                public_url: rng.chance(80).then(|| format!("https://n{i}.example.net/")),
                location,
                addresses: vec![format!("192.0.2.{i}")],
                playback_session_limit: rng.chance(40).then(|| rng.below(50)),
                playback_bandwidth_kbit: rng.chance(30).then(|| rng.below(100_000)),
                network_bandwidth_kbit: None,
                drain: rng.chance(10),
            },
        );
    }
    RoutingTable {
        format: 1,
        cluster: "t".into(),
        trusted_proxies: Vec::new(),
        geo: GeoSettings::default(),
        zones,
        nodes,
        router_pool: None,
    }
}

fn report(rng: &mut Rng, node: &str, ts: u64, interval_ms: u64) -> HealthReport {
    let streams: Vec<String> = STREAMS
        .iter()
        .filter(|_| rng.chance(50))
        .map(|s| (*s).to_owned())
        .collect();
    let vod = rng.chance(60).then(|| {
        let mut held = BTreeMap::new();
        for a in ASSETS {
            if rng.chance(50) {
                held.insert(a.to_owned(), vec![1 + rng.below(3)]);
            }
        }
        held
    });
    HealthReport {
        node: node.into(),
        ts,
        interval_ms: rng.chance(95).then_some(interval_ms),
        play_sessions: rng.chance(90).then(|| rng.below(60)),
        out_kbit: rng.chance(90).then(|| rng.below(200_000)),
        streams: rng.chance(90).then(|| streams.into()),
        vod: vod.map(Into::into),
        net_kbit: rng.chance(50).then(|| rng.below(300_000)),
        config: ConfigState::default(),
        purge: PurgeState::default(),
        redis: RedisState::default(),
        version: "0".into(),
        bundle: None,
        serving: if rng.chance(20) {
            Some(rng.chance(50))
        } else {
            None
        },
    }
}

/// One broker message, as every book of the path hears it.
enum Event {
    /// A report (`None`: a cleared retained report), possibly of an
    /// invented node or naming another node.
    Health(String, Vec<u8>),
    Status(String, &'static [u8]),
}

/// Every book of the summary path.
struct SummaryPath {
    /// Per region, its summarizers (a second one at times).
    summarizers: BTreeMap<String, Vec<Book>>,
    receiver: Book,
    /// Summaries held back, delivered later (out of order).
    late: Vec<(String, Vec<u8>)>,
}

fn regions_of(t: &RoutingTable) -> BTreeMap<String, String> {
    t.nodes
        .iter()
        .map(|(n, node)| (n.clone(), node.region.clone()))
        .collect()
}

/// A summary of `region` that must be refused, of what kind.
fn hostile(rng: &mut Rng, t: &RoutingTable, region: &str) -> (Vec<u8>, SummaryErrorKind) {
    let of_region: Vec<&String> = t
        .nodes
        .iter()
        .filter(|(_, n)| n.region == region)
        .map(|(name, _)| name)
        .collect();
    let other: Option<&String> = t
        .nodes
        .iter()
        .find(|(_, n)| n.region != region)
        .map(|(name, _)| name);
    let by = (*of_region.first().expect("a region has a node")).clone();
    let entry = |node: &str, named: &str| SummaryEntry {
        node: node.into(),
        age_ms: 0,
        report: Some(HealthReport {
            node: named.into(),
            ..report(&mut Rng(7), named, 1, 1000)
        }),
    };
    let summary = |nodes: Vec<SummaryEntry>| Summary {
        region: region.into(),
        by: by.clone(),
        epoch: 1,
        ts: 1,
        seq: 0,
        interval_ms: SUMMARY_EVERY,
        nodes,
    };
    let to_vec = |s: &Summary| serde_json::to_vec(s).unwrap();
    match rng.below(6) {
        0 => (b"{not json".to_vec(), SummaryErrorKind::Malformed),
        1 => (
            to_vec(&summary(vec![entry("invented", "invented")])),
            SummaryErrorKind::ForeignNode,
        ),
        2 => match other {
            Some(o) => (
                to_vec(&summary(vec![entry(o, o)])),
                SummaryErrorKind::ForeignNode,
            ),
            None => (b"[]".to_vec(), SummaryErrorKind::Malformed),
        },
        3 => (
            to_vec(&summary(vec![entry(&by, "someone-else")])),
            SummaryErrorKind::ForeignNode,
        ),
        4 => (
            to_vec(&summary(vec![entry(&by, &by), entry(&by, &by)])),
            SummaryErrorKind::ForeignNode,
        ),
        _ => (
            vec![b' '; edgestate::mqtt::SUMMARY_MAX_BYTES + 1],
            SummaryErrorKind::TooLarge,
        ),
    }
}

/// Replay one seeded history; the number of decisions compared.
fn replay(seed: u64) -> usize {
    let mut rng = Rng(seed);
    let t = table(&mut rng);
    let router = Router::new(t.clone()).expect("a valid table");
    let regions = regions_of(&t);
    let region_names: BTreeSet<String> = regions.values().cloned().collect();
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);

    let mut full = Book::for_table(regions.clone());
    let mut path = SummaryPath {
        summarizers: region_names
            .iter()
            .map(|r| (r.clone(), vec![Book::for_table(regions.clone())]))
            .collect(),
        receiver: Book::for_table(regions.clone()),
        late: Vec::new(),
    };
    // Per node: its interval and when it stops reporting (goes silent).
    let names: Vec<String> = t.nodes.keys().cloned().collect();
    let plan: BTreeMap<String, (u64, u64, u64)> = names
        .iter()
        .map(|n| {
            let every: u64 = *rng.pick(&[500, 1000, 2000, 5000]);
            let silent_from = if rng.chance(30) {
                rng.below(40_000)
            } else {
                u64::MAX
            };
            (n.clone(), (every, silent_from, rng.below(every / 50) * 50))
        })
        .collect();
    // The broker's retained health messages, by node.
    let mut retained: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let end = 45_000;
    let mut compared = 0;
    let mut ms = 0;
    while ms <= end {
        // The broker's messages of this millisecond, in one order for all.
        let mut events = Vec::new();
        for (n, (every, silent_from, phase)) in &plan {
            if ms % every == *phase && ms < *silent_from {
                let r = report(&mut rng, n, ms / 1000, *every);
                // Out of order: an older timestamp now and then.
                let r = if rng.chance(5) {
                    HealthReport { ts: 0, ..r }
                } else {
                    r
                };
                events.push(Event::Health(n.clone(), serde_json::to_vec(&r).unwrap()));
            }
        }
        if ms % 250 == 0 {
            if rng.chance(15) {
                let n = rng.pick(&names).clone();
                let s: &'static [u8] = if rng.chance(50) {
                    b"online"
                } else {
                    b"offline"
                };
                events.push(Event::Status(n, s));
            }
            if rng.chance(3) {
                events.push(Event::Health(rng.pick(&names).clone(), Vec::new()));
            }
            if rng.chance(10) {
                // An invented node, and a report naming another node.
                let n = format!("invented-{}", rng.below(1000));
                let r = serde_json::to_vec(&report(&mut rng, &n, 1, 1000)).unwrap();
                events.push(Event::Health(n, r));
                let r = serde_json::to_vec(&report(&mut rng, "n0", 1, 1000)).unwrap();
                events.push(Event::Health(rng.pick(&names).clone(), r));
            }
        }
        for e in &events {
            match e {
                Event::Health(node, payload) => {
                    if payload.is_empty() {
                        retained.remove(node);
                    } else {
                        retained.insert(node.clone(), payload.clone());
                    }
                    let topic = format!("{PREFIX}/health/{node}");
                    let a = full.take_at(PREFIX, &topic, payload, at(ms));
                    for (region, books) in &mut path.summarizers {
                        if regions.get(node) == Some(region) {
                            for b in books.iter_mut() {
                                let got = b.take_at(PREFIX, &topic, payload, at(ms));
                                assert_eq!(got.is_ok(), a.is_ok(), "seed {seed}: {topic}");
                            }
                        }
                    }
                }
                Event::Status(node, payload) => {
                    let topic = format!("{PREFIX}/status/{node}");
                    full.take_at(PREFIX, &topic, payload, at(ms)).unwrap();
                    path.receiver
                        .take_at(PREFIX, &topic, payload, at(ms))
                        .unwrap();
                    for books in path.summarizers.values_mut() {
                        for b in books.iter_mut() {
                            b.take_at(PREFIX, &topic, payload, at(ms)).unwrap();
                        }
                    }
                }
            }
        }
        // A late summary from long ago arrives now and then: never newer.
        if ms % 700 == 0 && !path.late.is_empty() && rng.chance(30) {
            let (region, payload) = path.late.remove(0);
            let got = path
                .receiver
                .take_summary_at(&region, &payload, at(ms))
                .expect("a late summary is valid");
            assert!(
                got.is_none(),
                "seed {seed}: a summary delivered late was taken"
            );
        }
        if ms % SUMMARY_EVERY == 0 {
            for (region, books) in &mut path.summarizers {
                let by = t
                    .nodes
                    .iter()
                    .find(|(_, n)| &n.region == region)
                    .map(|(name, _)| name.clone())
                    .unwrap();
                // A second summarizer starts (after a takeover that was
                // not needed), or the extra one stops.
                let second = t
                    .nodes
                    .iter()
                    .filter(|(_, n)| &n.region == region)
                    .map(|(name, _)| name.clone())
                    .nth(1);
                if books.len() == 1 && second.is_some() && rng.chance(10) {
                    // It was a receiver: it holds the region as the last
                    // summary said, then reads the retained reports.
                    let mut extra = Book::for_table(regions.clone());
                    let s = books[0].summary_at(
                        region,
                        &by,
                        (1, ms),
                        Duration::from_secs(1),
                        0,
                        at(ms),
                    );
                    let payload = serde_json::to_vec(&s).unwrap();
                    extra.take_summary_at(region, &payload, at(ms)).unwrap();
                    for (node, payload) in &retained {
                        if regions.get(node) == Some(region) {
                            let topic = format!("{PREFIX}/health/{node}");
                            let _ = extra.take_delivered_at(PREFIX, &topic, payload, at(ms), true);
                        }
                    }
                    books.push(extra);
                } else if books.len() == 2 && rng.chance(20) {
                    books.pop();
                }
                for (i, b) in books.iter().enumerate() {
                    let who = if i == 0 {
                        by.clone()
                    } else {
                        second.clone().unwrap_or_default()
                    };
                    let s = b.summary_at(
                        region,
                        &who,
                        (1 + i as u64, ms),
                        Duration::from_millis(SUMMARY_EVERY),
                        ms / 1000,
                        at(ms),
                    );
                    let payload = serde_json::to_vec(&s).unwrap();
                    if i == 0 && rng.chance(5) {
                        path.late.push((region.clone(), payload.clone()));
                    }
                    path.receiver
                        .take_summary_at(region, &payload, at(ms))
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                }
                if rng.chance(10) {
                    let (payload, kind) = hostile(&mut rng, &t, region);
                    let got = path.receiver.take_summary_at(region, &payload, at(ms));
                    assert_eq!(got.map_err(|e| e.kind).err(), Some(kind), "seed {seed}");
                }
                // A summary on another region's topic is refused whole.
                if region_names.len() > 1 && rng.chance(5) {
                    let other = region_names.iter().find(|r| *r != region).unwrap();
                    let s = books[0].summary_at(
                        region,
                        &by,
                        (1, ms),
                        Duration::from_secs(1),
                        0,
                        at(ms),
                    );
                    let got = path.receiver.take_summary_at(
                        other,
                        &serde_json::to_vec(&s).unwrap(),
                        at(ms),
                    );
                    assert_eq!(
                        got.map_err(|e| e.kind).err(),
                        Some(SummaryErrorKind::WrongRegion)
                    );
                }
            }
            // Every region summarized now: the same snapshot.
            compared += compare(seed, &mut rng, &router, &full, &path.receiver, at(ms));
        }
        ms += 50;
    }
    compared
}

static OFFLINE_SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Every decision on both books' snapshots at `now`; the number compared.
fn compare(
    seed: u64,
    rng: &mut Rng,
    router: &Router,
    full: &Book,
    summarized: &Book,
    now: Instant,
) -> usize {
    let a = full.health_at(now, true);
    let b = summarized.health_at(now, true);
    assert_eq!(a, b, "seed {seed}: the snapshots differ");
    // The history covers nodes offline (last will or silence) and not
    // serving, besides online ones.
    OFFLINE_SEEN.fetch_add(
        a.nodes.values().filter(|h| h.online == Some(false)).count(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let mut n = 0;
    for _ in 0..12 {
        let ip = IpAddr::V4(Ipv4Addr::new(
            10,
            u8::try_from(rng.below(5)).unwrap_or(0),
            u8::try_from(rng.below(256)).unwrap_or(0),
            u8::try_from(rng.below(256)).unwrap_or(0),
        ));
        let stream = *rng.pick(&STREAMS);
        assert_eq!(
            router.decide_quick(Some(ip), None, stream, &a),
            router.decide_quick(Some(ip), None, stream, &b),
            "seed {seed}: /route {stream} from {ip}"
        );
        assert_eq!(
            router.decide(Some(ip), None, stream, &a),
            router.decide(Some(ip), None, stream, &b),
        );
        let asset = *rng.pick(&ASSETS);
        assert_eq!(
            router.vod(Some(ip), None, asset, &a),
            router.vod(Some(ip), None, asset, &b),
            "seed {seed}: VOD {asset} from {ip}"
        );
        #[allow(clippy::cast_precision_loss)]
        let loc = Location {
            lat: (rng.below(180) as f64) - 90.0,
            lon: (rng.below(360) as f64) - 180.0,
        };
        assert_eq!(
            router.nearest(ip, loc, &a),
            router.nearest(ip, loc, &b),
            "seed {seed}: geo from {loc:?}"
        );
        let host = format!("h{}.example.org", rng.below(100));
        assert_eq!(
            router.acme_unlocated(&host, &a),
            router.acme_unlocated(&host, &b)
        );
        n += 5;
    }
    n
}

#[test]
fn summaries_route_exactly_as_the_full_book() {
    let mut compared = 0;
    for seed in 1..=24 {
        compared += replay(seed);
    }
    assert!(compared > 50_000, "{compared}");
    assert!(OFFLINE_SEEN.load(std::sync::atomic::Ordering::Relaxed) > 1000);
}
