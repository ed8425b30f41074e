//! Longest-prefix-match benchmark: `edgestate::lpm::Lpm` against the
//! off-the-shelf `prefix-trie` crate, on the same routes and queries, in
//! the same run.
//!
//! ```text
//! cargo bench -p edgestate --bench lpm
//! ```
//!
//! The table: 1,000,000 distinct random IPv4 prefixes (length uniform in
//! 8..=32, host bits clear) and 100,000 distinct random IPv6 prefixes
//! (16..=64), from a fixed seed. Draws that repeat an earlier prefix are
//! redrawn, which thins the short lengths a little (there are only 256
//! `/8`s). Each route's value is its position, so no two neighbouring
//! intervals merge (zone indices would make our table smaller). Four
//! query sets of 1,000,000 addresses each, generated before any timing:
//! uniform random addresses, and "in-prefix" addresses (a random route,
//! random host bits). Both structures get each query in the form they
//! take and copy the value out. A lookup figure is the median over rounds
//! of the mean time per lookup across one pass over a query set; the two
//! structures alternate round by round so that both see the same machine.
//! Build time is the median of a few builds, memory what the table holds
//! (ours: exact heap bytes; `prefix-trie`: growth of the process's
//! resident set during its first build, an estimate). A last row times
//! our table built from only the first ten routes, the size the example's
//! zones have.
//!
//! Output is a markdown table on stdout. `LPM_BENCH_ROUNDS` overrides the
//! number of rounds (default 11). Run it on a quiet machine: the table is
//! larger than a core's share of cache, so neighbours slow it down.

use std::collections::HashSet;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use edgestate::lpm::{Lpm, Prefix};
use ipnet::{Ipv4Net, Ipv6Net};
use prefix_trie::PrefixMap;

const V4_ROUTES: usize = 1_000_000;
const V6_ROUTES: usize = 100_000;
const QUERIES: usize = 1_000_000;
const BUILDS: usize = 3;
/// Queries per set whose answers are compared between the two structures
/// before timing, so that the figures compare equal work.
const CROSS_CHECK: usize = 200_000;

/// The routes, in generation order; a route's value is its position.
struct Routes {
    v4: Vec<(Ipv4Addr, u8)>,
    v6: Vec<(Ipv6Addr, u8)>,
}

/// One query set in the form each structure takes, so that converting an
/// address is not part of the measured lookup.
struct Queries {
    name: &'static str,
    ours: Vec<IpAddr>,
    trie: Vec<TrieQuery>,
}

/// A host prefix, the lookup key of `prefix-trie`.
#[derive(Clone, Copy)]
enum TrieQuery {
    V4(Ipv4Net),
    V6(Ipv6Net),
}

/// The competitor: `prefix-trie` has one map per family.
struct Trie {
    v4: PrefixMap<Ipv4Net, u32>,
    v6: PrefixMap<Ipv6Net, u32>,
}

impl Trie {
    fn build(routes: &Routes) -> Self {
        let mut v4 = PrefixMap::new();
        for (i, &(addr, len)) in routes.v4.iter().enumerate() {
            v4.insert(Ipv4Net::new(addr, len).unwrap(), value(i));
        }
        let mut v6 = PrefixMap::new();
        for (i, &(addr, len)) in routes.v6.iter().enumerate() {
            v6.insert(Ipv6Net::new(addr, len).unwrap(), value(V4_ROUTES + i));
        }
        Self { v4, v6 }
    }

    /// The value, copied out like ours (so both read it from memory).
    #[inline]
    fn lookup(&self, q: TrieQuery) -> Option<u32> {
        match q {
            TrieQuery::V4(net) => self.v4.get_lpm(&net).map(|(_, v)| *v),
            TrieQuery::V6(net) => self.v6.get_lpm(&net).map(|(_, v)| *v),
        }
    }
}

fn value(position: usize) -> u32 {
    u32::try_from(position).unwrap()
}

fn main() {
    let rounds = std::env::var("LPM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(11usize);
    let load_before = loadavg();
    let mut rng = fastrand::Rng::with_seed(0x0ed6_e0f0);
    let routes = generate_routes(&mut rng);
    let ours_routes: Vec<(Prefix, u32)> = routes
        .v4
        .iter()
        .map(|&(a, l)| Prefix::new(a, l).unwrap())
        .chain(routes.v6.iter().map(|&(a, l)| Prefix::new(a, l).unwrap()))
        .enumerate()
        .map(|(i, p)| (p, value(i)))
        .collect();
    let query_sets = generate_queries(&mut rng, &routes);

    // First builds, one at a time, for the memory figures.
    let rss = rss_bytes();
    let trie = Trie::build(&routes);
    let trie_rss = rss_bytes().saturating_sub(rss);
    let rss = rss_bytes();
    let ours = Lpm::new(ours_routes.iter().copied()).unwrap();
    let ours_rss = rss_bytes().saturating_sub(rss);

    for set in &query_sets {
        for (q, t) in set.ours.iter().zip(&set.trie).take(CROSS_CHECK) {
            assert_eq!(ours.lookup(*q), trie.lookup(*t), "{}: {q}", set.name);
        }
    }

    let ours_build = median((0..BUILDS).map(|_| {
        let start = Instant::now();
        black_box(Lpm::new(black_box(&ours_routes).iter().copied()).unwrap());
        start.elapsed()
    }));
    let trie_build = median((0..BUILDS).map(|_| {
        let start = Instant::now();
        black_box(Trie::build(black_box(&routes)));
        start.elapsed()
    }));

    let mut ours_ns = Vec::new();
    let mut trie_ns = Vec::new();
    for set in &query_sets {
        let mut o = Vec::with_capacity(rounds);
        let mut t = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            o.push(time_pass(&set.ours, |q| ours.lookup(q)));
            t.push(time_pass(&set.trie, |q| trie.lookup(q)));
        }
        ours_ns.push(ns_per_lookup(median(o.into_iter())));
        trie_ns.push(ns_per_lookup(median(t.into_iter())));
    }

    // The seed-sized table: what an agent routing tens of routes holds.
    let small = Lpm::new(ours_routes[..10].iter().copied()).unwrap();
    let small_ns: Vec<f64> = query_sets
        .iter()
        .map(|set| {
            let times = (0..rounds).map(|_| time_pass(&set.ours, |q| small.lookup(q)));
            ns_per_lookup(median(times))
        })
        .collect();
    let load_after = loadavg();

    println!(
        "LPM: {V4_ROUTES} IPv4 /8-/32 + {V6_ROUTES} IPv6 /16-/64 random prefixes; \
         {QUERIES} queries per set; median of {rounds} rounds (lookups), {BUILDS} builds"
    );
    println!("load average before: {load_before}; after: {load_after}");
    println!();
    println!(
        "| structure | build | memory | v4 uniform | v4 in-prefix | v6 uniform | v6 in-prefix |"
    );
    println!("|---|---|---|---|---|---|---|");
    row(
        "edgestate::lpm::Lpm",
        Some(ours_build),
        &mebibytes(ours.heap_bytes()),
        &ours_ns,
    );
    row(
        "prefix-trie 0.10 (2 maps)",
        Some(trie_build),
        &format!("~{} (RSS)", mebibytes(trie_rss)),
        &trie_ns,
    );
    row(
        "Lpm, first 10 routes",
        None,
        &format!("{} B", small.heap_bytes()),
        &small_ns,
    );
    println!();
    println!(
        "ours: the table holds {} heap bytes; the process's RSS grew {} over its first \
         build (build temporaries the allocator keeps)",
        ours.heap_bytes(),
        mebibytes(ours_rss),
    );
    drop(black_box(trie));
}

/// Distinct random prefixes with uniform lengths, host bits clear.
fn generate_routes(rng: &mut fastrand::Rng) -> Routes {
    let mut seen = HashSet::new();
    let mut v4 = Vec::with_capacity(V4_ROUTES);
    while v4.len() < V4_ROUTES {
        let len = rng.u8(8..=32);
        let addr = rng.u32(..) & (u32::MAX << (32 - len));
        if seen.insert((u128::from(addr), len)) {
            v4.push((Ipv4Addr::from(addr), len));
        }
    }
    seen.clear();
    let mut v6 = Vec::with_capacity(V6_ROUTES);
    while v6.len() < V6_ROUTES {
        let len = rng.u8(16..=64);
        let addr = rng.u128(..) & (u128::MAX << (128 - len));
        if seen.insert((addr, len)) {
            v6.push((Ipv6Addr::from(addr), len));
        }
    }
    Routes { v4, v6 }
}

/// The four query sets.
fn generate_queries(rng: &mut fastrand::Rng, routes: &Routes) -> Vec<Queries> {
    let v4 = |name, f: &mut dyn FnMut() -> u32| {
        let addrs: Vec<Ipv4Addr> = (0..QUERIES).map(|_| Ipv4Addr::from(f())).collect();
        Queries {
            name,
            ours: addrs.iter().map(|&a| IpAddr::V4(a)).collect(),
            trie: addrs
                .iter()
                .map(|&a| TrieQuery::V4(Ipv4Net::new(a, 32).unwrap()))
                .collect(),
        }
    };
    let v6 = |name, f: &mut dyn FnMut() -> u128| {
        let addrs: Vec<Ipv6Addr> = (0..QUERIES).map(|_| Ipv6Addr::from(f())).collect();
        Queries {
            name,
            ours: addrs.iter().map(|&a| IpAddr::V6(a)).collect(),
            trie: addrs
                .iter()
                .map(|&a| TrieQuery::V6(Ipv6Net::new(a, 128).unwrap()))
                .collect(),
        }
    };
    let mut r = rng.fork();
    let v4_uniform = v4("v4 uniform", &mut || r.u32(..));
    let v4_inside = v4("v4 in-prefix", &mut || {
        let (net, len) = routes.v4[r.usize(..routes.v4.len())];
        u32::from(net) | (r.u32(..) & (u32::MAX.checked_shr(u32::from(len)).unwrap_or(0)))
    });
    let v6_uniform = v6("v6 uniform", &mut || r.u128(..));
    let v6_inside = v6("v6 in-prefix", &mut || {
        let (net, len) = routes.v6[r.usize(..routes.v6.len())];
        u128::from(net) | (r.u128(..) & (u128::MAX >> len))
    });
    vec![v4_uniform, v4_inside, v6_uniform, v6_inside]
}

/// Time of one pass of `lookup` over `queries`. The answers are folded
/// into a sum that is kept alive, so no lookup can be skipped, but no
/// lookup waits for the previous one: this measures throughput, as a
/// server answering many viewers sees it.
fn time_pass<Q: Copy>(queries: &[Q], lookup: impl Fn(Q) -> Option<u32>) -> Duration {
    let start = Instant::now();
    let mut sum = 0u32;
    for &q in black_box(queries) {
        if let Some(v) = lookup(q) {
            sum = sum.wrapping_add(v);
        }
    }
    black_box(sum);
    start.elapsed()
}

fn median(times: impl Iterator<Item = Duration>) -> Duration {
    let mut times: Vec<Duration> = times.collect();
    times.sort_unstable();
    times[times.len() / 2]
}

fn ns_per_lookup(pass: Duration) -> f64 {
    pass.as_secs_f64() * 1e9 / QUERIES as f64
}

fn row(name: &str, build: Option<Duration>, memory: &str, ns: &[f64]) {
    let build = build.map_or_else(|| "–".to_owned(), |b| format!("{:.3} s", b.as_secs_f64()));
    let ns: Vec<String> = ns.iter().map(|n| format!("{n:.1} ns")).collect();
    println!("| {name} | {build} | {memory} | {} |", ns.join(" | "));
}

fn mebibytes(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Resident set size of this process, from `/proc/self/status` (0 where
/// there is none).
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The 1/5/15-minute load averages, as `uptime` shows them.
fn loadavg() -> String {
    let avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    avg.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
