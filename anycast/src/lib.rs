//! The anycast audit: from route-collector dumps, which upstream each collector peer's best
//! path to an announced prefix goes through, how long those paths are,
//! and whether the split is lopsided.
//!
//! This module is pure: [`Table`] takes route [`Event`]s (from
//! [`mrt`], the only reader of dump files) and [`analyse`] turns the table
//! into a [`Report`]. Only the announced prefixes and their more-specifics
//! are kept ([`Watch`]), so memory does not grow with the dump.
//!
//! # Decisions
//! - **Vantage point**: one collector peer (address and AS). With ADD-PATH
//!   a peer can hold several paths; its shortest one counts.
//! - **Upstream of a path**: walking from the origin towards the peer, the
//!   first configured upstream AS. The origin is the last AS of the path
//!   and, with `origin_asns`, every trailing AS of ours (prepends and our
//!   own chains). A path through no configured upstream is "other", keyed
//!   by the AS adjacent to the origin (none: the peer is the origin).
//! - **Length**: as BGP best-path selection compares it (RFC 4271 9.1.2.2):
//!   each AS of an `AS_SEQUENCE` counts, prepends included; an `AS_SET`
//!   counts 1; confederation segments count 0.
//! - **Order**: per (peer, prefix, path id) the newest event wins (MRT
//!   record time, microseconds for `BGP4MP_ET`); ties go to the later
//!   event. A withdrawal or a session leaving Established removes the
//!   route. So a bview and updates files may be given in any order.

pub mod audit;
pub mod mrt;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

/// The audit's settings: what `cluster.yaml`'s `anycast` section says,
/// checked and converted by the compiler.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Empty: the last AS of a path is its origin.
    pub origin_asns: Vec<u32>,
    /// In file order; unique.
    pub prefixes: Vec<Prefix>,
    /// In file order; names and ASNs unique.
    pub upstreams: Vec<Upstream>,
    /// A prefix is flagged `lopsided` when one upstream carries more than
    /// this share of the vantage points (0..1).
    pub lopsided_share: f64,
    /// A prefix is flagged `longer_path` when the median AS-path length
    /// through one upstream exceeds the shortest upstream median by at
    /// least this many hops.
    pub longer_path_hops: f64,
}

/// One announced prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    pub prefix: IpNet,
    /// The configured name, or the prefix as text.
    pub name: String,
    /// Indexes into [`Settings::upstreams`] it is announced through (all
    /// when not configured), ascending.
    pub upstreams: Vec<usize>,
}

/// One transit provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub name: String,
    pub asn: u32,
}

/// A collector peer: one vantage point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Peer {
    pub ip: IpAddr,
    pub asn: u32,
}

/// One segment of an AS path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Sequence(Vec<u32>),
    Set(Vec<u32>),
    ConfedSequence(Vec<u32>),
    ConfedSet(Vec<u32>),
}

/// An AS path as received by the collector peer (its own AS first).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AsPath(pub Vec<Segment>);

impl AsPath {
    /// A plain `AS_SEQUENCE`.
    #[must_use]
    pub fn seq(asns: &[u32]) -> Self {
        AsPath(vec![Segment::Sequence(asns.to_vec())])
    }

    /// The length BGP's best-path selection compares.
    #[must_use]
    pub fn bgp_len(&self) -> u32 {
        self.0
            .iter()
            .map(|s| match s {
                Segment::Sequence(v) => u32::try_from(v.len()).unwrap_or(u32::MAX),
                Segment::Set(v) => u32::from(!v.is_empty()),
                Segment::ConfedSequence(_) | Segment::ConfedSet(_) => 0,
            })
            .fold(0, u32::saturating_add)
    }

    /// The hops from the origin outwards; an `AS_SET` is one hop of
    /// several ASes; confederation segments are skipped.
    fn hops_from_origin(&self) -> impl Iterator<Item = &[u32]> {
        self.0.iter().rev().flat_map(|s| {
            let (items, set): (&[u32], bool) = match s {
                Segment::Sequence(v) => (v, false),
                Segment::Set(v) => (v, true),
                Segment::ConfedSequence(_) | Segment::ConfedSet(_) => (&[], false),
            };
            let (singles, whole) = if set {
                (&[][..], items)
            } else {
                (items, &[][..])
            };
            singles
                .iter()
                .rev()
                .map(std::slice::from_ref)
                .chain((!whole.is_empty()).then_some(whole))
        })
    }
}

/// What happened to a route at a collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The peer's path to the prefix (a RIB entry or an announcement).
    Announce {
        peer: Peer,
        prefix: IpNet,
        path_id: Option<u32>,
        path: AsPath,
        /// Microseconds since the epoch.
        time: u64,
    },
    Withdraw {
        peer: Peer,
        prefix: IpNet,
        path_id: Option<u32>,
        time: u64,
    },
    /// The collector's session with the peer left Established: every
    /// route it had is gone.
    PeerDown { peer: Peer, time: u64 },
}

/// The announced prefixes, to keep only the routes that matter.
#[derive(Debug, Clone)]
pub struct Watch {
    /// Longest first, so the first hit is the most specific announced
    /// prefix covering a route.
    announced: Vec<(IpNet, usize)>,
}

impl Watch {
    #[must_use]
    pub fn new(settings: &Settings) -> Self {
        let mut announced: Vec<(IpNet, usize)> = settings
            .prefixes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.prefix, i))
            .collect();
        announced.sort_by(|a, b| b.0.prefix_len().cmp(&a.0.prefix_len()).then(a.1.cmp(&b.1)));
        Watch { announced }
    }

    /// The index (in the settings) of the most specific announced prefix
    /// equal to or covering `prefix`.
    #[must_use]
    pub fn covering(&self, prefix: &IpNet) -> Option<usize> {
        self.announced
            .iter()
            .find(|(net, _)| net.contains(prefix))
            .map(|&(_, i)| i)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    time: u64,
    /// `None`: withdrawn (kept so an older event cannot bring it back).
    path: Option<AsPath>,
}

/// Per watched prefix, per (peer, path id), the newest route.
#[derive(Debug, Clone)]
pub struct Table {
    watch: Watch,
    routes: BTreeMap<IpNet, BTreeMap<(Peer, Option<u32>), Entry>>,
}

impl Table {
    #[must_use]
    pub fn new(watch: Watch) -> Self {
        Table {
            watch,
            routes: BTreeMap::new(),
        }
    }

    #[must_use]
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// Apply one event; events for prefixes not watched are ignored.
    pub fn apply(&mut self, event: Event) {
        let (peer, prefix, path_id, path, time) = match event {
            Event::Announce {
                peer,
                prefix,
                path_id,
                path,
                time,
            } => (peer, prefix, path_id, Some(path), time),
            Event::Withdraw {
                peer,
                prefix,
                path_id,
                time,
            } => (peer, prefix, path_id, None, time),
            Event::PeerDown { peer, time } => {
                for entries in self.routes.values_mut() {
                    for ((p, _), entry) in entries.iter_mut() {
                        if *p == peer && entry.time <= time {
                            *entry = Entry { time, path: None };
                        }
                    }
                }
                return;
            }
        };
        if self.watch.covering(&prefix).is_none() {
            return;
        }
        let entries = self.routes.entry(prefix).or_default();
        match entries.get_mut(&(peer, path_id)) {
            Some(entry) if entry.time > time => {}
            Some(entry) => *entry = Entry { time, path },
            None => {
                if path.is_some() {
                    entries.insert((peer, path_id), Entry { time, path });
                }
            }
        }
    }

    /// Routes held (withdrawn ones included), for tests and statistics.
    #[must_use]
    pub fn len(&self) -> usize {
        self.routes.values().map(BTreeMap::len).sum()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Per vantage point, its best (shortest, then lowest path id) path.
    fn best_paths(&self, prefix: &IpNet) -> BTreeMap<Peer, &AsPath> {
        let mut best: BTreeMap<Peer, &AsPath> = BTreeMap::new();
        if let Some(entries) = self.routes.get(prefix) {
            for ((peer, _), entry) in entries {
                if let Some(path) = &entry.path {
                    best.entry(*peer)
                        .and_modify(|b| {
                            if path.bgp_len() < b.bgp_len() {
                                *b = path;
                            }
                        })
                        .or_insert(path);
                }
            }
        }
        best
    }
}

/// Which way a path reaches the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// Through this configured upstream (index).
    Upstream(usize),
    /// Through no configured upstream; the AS adjacent to the origin
    /// (`None`: the path holds only the origin).
    Other(Option<u32>),
}

/// The upstream a path goes through (see the module's decisions).
#[must_use]
pub fn classify(settings: &Settings, path: &AsPath) -> Via {
    let upstream_in = |hop: &[u32]| settings.upstreams.iter().position(|u| hop.contains(&u.asn));
    let mut hops = path.hops_from_origin().peekable();
    let mut origin_hops = Vec::new();
    if settings.origin_asns.is_empty() {
        let Some(origin) = hops.next() else {
            return Via::Other(None);
        };
        origin_hops.push(origin);
        while let Some(h) = hops.next_if(|h| *h == origin) {
            origin_hops.push(h);
        }
    } else {
        let ours = |hop: &[u32]| hop.iter().any(|a| settings.origin_asns.contains(a));
        while let Some(h) = hops.next_if(|h| ours(h)) {
            origin_hops.push(h);
        }
    }
    // An aggregate's AS_SET holding our origin may hold the upstream too.
    if let Some(u) = origin_hops
        .iter()
        .filter(|h| h.len() > 1)
        .find_map(|h| upstream_in(h))
    {
        return Via::Upstream(u);
    }
    let mut neighbour = None;
    for (i, hop) in hops.enumerate() {
        if i == 0 {
            neighbour = hop.first().copied();
        }
        if let Some(u) = upstream_in(hop) {
            return Via::Upstream(u);
        }
    }
    Via::Other(neighbour)
}

/// Minimum, median and maximum AS-path length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lengths {
    pub min: u32,
    pub median: f64,
    pub max: u32,
}

impl Lengths {
    /// `None` for no lengths; the median of an even count is the mean of
    /// the middle two.
    #[must_use]
    pub fn of(mut lens: Vec<u32>) -> Option<Self> {
        if lens.is_empty() {
            return None;
        }
        lens.sort_unstable();
        let n = lens.len();
        let median = if n % 2 == 1 {
            f64::from(lens[n / 2])
        } else {
            (f64::from(lens[n / 2 - 1]) + f64::from(lens[n / 2])) / 2.0
        };
        Some(Lengths {
            min: lens[0],
            median,
            max: lens[n - 1],
        })
    }
}

/// One configured upstream's part of a prefix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpstreamStats {
    pub name: String,
    pub asn: u32,
    /// The prefix is configured to be announced through it.
    pub expected: bool,
    pub vantage_points: u32,
    /// Of all vantage points that hold a path to the prefix.
    pub share: f64,
    pub path_len: Option<Lengths>,
}

/// Paths through no configured upstream, by the AS next to the origin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OtherStats {
    /// The AS adjacent to the origin; `null` when the path is only the
    /// origin.
    pub via_asn: Option<u32>,
    pub vantage_points: u32,
    pub share: f64,
    pub path_len: Option<Lengths>,
}

/// What is wrong with a prefix's split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    /// One upstream carries more than `lopsided_share` of the vantage
    /// points.
    Lopsided,
    /// Paths through one upstream are systematically longer.
    LongerPath,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flag {
    pub kind: FlagKind,
    pub upstream: String,
    pub message: String,
}

/// One announced prefix, or a more-specific of one seen at a collector.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixReport {
    pub prefix: IpNet,
    pub name: String,
    /// For a more-specific: the announced prefix covering it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more_specific_of: Option<IpNet>,
    /// Collector peers holding a path to the prefix.
    pub vantage_points: u32,
    pub upstreams: Vec<UpstreamStats>,
    pub other: Vec<OtherStats>,
    pub flags: Vec<Flag>,
}

/// The audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub prefixes: Vec<PrefixReport>,
    /// Prefixes with at least one flag.
    pub flagged: usize,
}

fn share(n: u32, of: u32) -> f64 {
    if of == 0 {
        0.0
    } else {
        f64::from(n) / f64::from(of)
    }
}

fn percent(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

/// The split of one prefix.
fn prefix_report(
    settings: &Settings,
    table: &Table,
    prefix: IpNet,
    announced: usize,
) -> PrefixReport {
    let conf = &settings.prefixes[announced];
    let best = table.best_paths(&prefix);
    let total = u32::try_from(best.len()).unwrap_or(u32::MAX);
    let mut by_upstream: Vec<Vec<u32>> = vec![Vec::new(); settings.upstreams.len()];
    let mut by_other: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    for path in best.values() {
        let len = path.bgp_len();
        match classify(settings, path) {
            Via::Upstream(i) => by_upstream[i].push(len),
            Via::Other(asn) => by_other.entry(asn).or_default().push(len),
        }
    }
    let upstreams: Vec<UpstreamStats> = settings
        .upstreams
        .iter()
        .zip(by_upstream)
        .enumerate()
        .map(|(i, (u, lens))| {
            let n = u32::try_from(lens.len()).unwrap_or(u32::MAX);
            UpstreamStats {
                name: u.name.clone(),
                asn: u.asn,
                expected: conf.upstreams.contains(&i),
                vantage_points: n,
                share: share(n, total),
                path_len: Lengths::of(lens),
            }
        })
        .collect();
    let mut other: Vec<OtherStats> = by_other
        .into_iter()
        .map(|(via_asn, lens)| {
            let n = u32::try_from(lens.len()).unwrap_or(u32::MAX);
            OtherStats {
                via_asn,
                vantage_points: n,
                share: share(n, total),
                path_len: Lengths::of(lens),
            }
        })
        .collect();
    other.sort_by_key(|o| std::cmp::Reverse(o.vantage_points));

    let mut flags = Vec::new();
    let expected: Vec<&UpstreamStats> = upstreams.iter().filter(|u| u.expected).collect();
    // A split is judged only where there is one: two or more upstreams.
    if expected.len() >= 2 && total > 0 {
        for u in &expected {
            if u.share > settings.lopsided_share {
                flags.push(Flag {
                    kind: FlagKind::Lopsided,
                    upstream: u.name.clone(),
                    message: format!(
                        "{} of {total} vantage points reach {prefix} through {} (AS{}): {} > {}",
                        u.vantage_points,
                        u.name,
                        u.asn,
                        percent(u.share),
                        percent(settings.lopsided_share)
                    ),
                });
            }
        }
        let medians: Vec<(&UpstreamStats, f64)> = expected
            .iter()
            .filter_map(|u| u.path_len.map(|l| (*u, l.median)))
            .collect();
        if let Some(&(shortest, best_median)) = medians
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .filter(|_| medians.len() >= 2)
        {
            for &(u, median) in &medians {
                if median - best_median >= settings.longer_path_hops && median > best_median {
                    flags.push(Flag {
                        kind: FlagKind::LongerPath,
                        upstream: u.name.clone(),
                        message: format!(
                            "paths through {} (AS{}) have median length {median}, {} more than through {} ({best_median})",
                            u.name,
                            u.asn,
                            median - best_median,
                            shortest.name
                        ),
                    });
                }
            }
        }
    }
    PrefixReport {
        prefix,
        name: if prefix == conf.prefix {
            conf.name.clone()
        } else {
            format!("{} (more-specific)", conf.name)
        },
        more_specific_of: (prefix != conf.prefix).then_some(conf.prefix),
        vantage_points: total,
        upstreams,
        other,
        flags,
    }
}

/// The audit of every announced prefix (in configuration order, each
/// followed by the more-specifics of it that collectors hold).
#[must_use]
pub fn analyse(settings: &Settings, table: &Table) -> Report {
    let mut more_specifics: BTreeMap<usize, Vec<IpNet>> = BTreeMap::new();
    for prefix in table.routes.keys() {
        if let Some(i) = table.watch.covering(prefix)
            && *prefix != settings.prefixes[i].prefix
        {
            more_specifics.entry(i).or_default().push(*prefix);
        }
    }
    let mut prefixes = Vec::new();
    for (i, conf) in settings.prefixes.iter().enumerate() {
        prefixes.push(prefix_report(settings, table, conf.prefix, i));
        for p in more_specifics.remove(&i).unwrap_or_default() {
            let r = prefix_report(settings, table, p, i);
            // A more-specific every peer has withdrawn is not news.
            if r.vantage_points > 0 {
                prefixes.push(r);
            }
        }
    }
    let flagged = prefixes.iter().filter(|p| !p.flags.is_empty()).count();
    Report { prefixes, flagged }
}

fn lengths_text(l: Option<Lengths>) -> String {
    l.map_or_else(
        || "-".into(),
        |l| format!("{}/{}/{}", l.min, l.median, l.max),
    )
}

/// The report for a terminal.
#[must_use]
pub fn render_human(report: &Report) -> String {
    let mut out = String::new();
    for p in &report.prefixes {
        let _ = writeln!(out, "{} {}", p.prefix, p.name);
        if p.vantage_points == 0 {
            let _ = writeln!(out, "  no collector peer holds a path to it");
            let _ = writeln!(out);
            continue;
        }
        let _ = writeln!(
            out,
            "  {:<22} {:>5}  {:>5}  AS-path length min/median/max",
            format!("{} vantage point(s)", p.vantage_points),
            "share",
            "peers"
        );
        for u in &p.upstreams {
            let _ = writeln!(
                out,
                "  {:<22} {:>5}  {:>5}  {}{}",
                format!("{} AS{}", u.name, u.asn),
                percent(u.share),
                u.vantage_points,
                lengths_text(u.path_len),
                if u.expected {
                    ""
                } else {
                    "  (not announced through it)"
                }
            );
        }
        for o in &p.other {
            let label = o
                .via_asn
                .map_or_else(|| "other: direct".into(), |a| format!("other via AS{a}"));
            let _ = writeln!(
                out,
                "  {label:<22} {:>5}  {:>5}  {}",
                percent(o.share),
                o.vantage_points,
                lengths_text(o.path_len)
            );
        }
        for f in &p.flags {
            let kind = match f.kind {
                FlagKind::Lopsided => "lopsided",
                FlagKind::LongerPath => "longer-path",
            };
            let _ = writeln!(out, "  FLAG {kind}: {}", f.message);
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "{} prefix(es), {} flagged",
        report.prefixes.len(),
        report.flagged
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u32 = 64500;
    const B: u32 = 64501;
    const US: u32 = 64496;

    fn settings() -> Settings {
        Settings {
            origin_asns: vec![US],
            prefixes: vec![
                Prefix {
                    prefix: "192.0.2.0/24".parse().unwrap(),
                    name: "dns".into(),
                    upstreams: vec![0, 1],
                },
                Prefix {
                    prefix: "2001:db8::/32".parse().unwrap(),
                    name: "v6".into(),
                    upstreams: vec![0, 1],
                },
                Prefix {
                    prefix: "198.51.100.0/24".parse().unwrap(),
                    name: "data-a".into(),
                    upstreams: vec![0],
                },
            ],
            upstreams: vec![
                Upstream {
                    name: "alpha".into(),
                    asn: A,
                },
                Upstream {
                    name: "beta".into(),
                    asn: B,
                },
            ],
            lopsided_share: 0.8,
            longer_path_hops: 1.0,
        }
    }

    fn peer(n: u8) -> Peer {
        Peer {
            ip: IpAddr::from([10, 0, 0, n]),
            asn: 65000 + u32::from(n),
        }
    }

    fn announce(n: u8, prefix: &str, path: &[u32], time: u64) -> Event {
        Event::Announce {
            peer: peer(n),
            prefix: prefix.parse().unwrap(),
            path_id: None,
            path: AsPath::seq(path),
            time,
        }
    }

    fn table(events: impl IntoIterator<Item = Event>) -> Table {
        let mut t = Table::new(Watch::new(&settings()));
        for e in events {
            t.apply(e);
        }
        t
    }

    #[test]
    fn length_counts_prepends_sets_once_and_no_confeds() {
        let p = AsPath(vec![
            Segment::ConfedSequence(vec![65001, 65002]),
            Segment::Sequence(vec![1, 2, 2, 2]),
            Segment::Set(vec![7, 8]),
        ]);
        assert_eq!(p.bgp_len(), 5);
        assert_eq!(AsPath::default().bgp_len(), 0);
    }

    #[test]
    fn classify_finds_the_upstream_next_to_the_origin() {
        let s = settings();
        assert_eq!(classify(&s, &AsPath::seq(&[3356, A, US])), Via::Upstream(0));
        // origin prepends
        assert_eq!(
            classify(&s, &AsPath::seq(&[3356, B, US, US, US])),
            Via::Upstream(1)
        );
        // upstream prepends and a reseller between: nearest configured one wins
        assert_eq!(
            classify(&s, &AsPath::seq(&[A, 174, B, B, US])),
            Via::Upstream(1)
        );
        // reseller next to us, the configured upstream further out
        assert_eq!(
            classify(&s, &AsPath::seq(&[3356, A, 64510, US])),
            Via::Upstream(0)
        );
        assert_eq!(
            classify(&s, &AsPath::seq(&[3356, 64510, US])),
            Via::Other(Some(64510))
        );
        assert_eq!(classify(&s, &AsPath::seq(&[US])), Via::Other(None));
        assert_eq!(classify(&s, &AsPath::default()), Via::Other(None));
        // an aggregate's AS_SET holding the upstream
        let set = AsPath(vec![
            Segment::Sequence(vec![3356]),
            Segment::Set(vec![B, US]),
        ]);
        assert_eq!(classify(&s, &set), Via::Upstream(1));
        // no origin_asns: the last AS (and its prepends) is the origin
        let mut s2 = settings();
        s2.origin_asns.clear();
        assert_eq!(
            classify(&s2, &AsPath::seq(&[3356, A, 7, 7])),
            Via::Upstream(0)
        );
        assert_eq!(
            classify(&s2, &AsPath::seq(&[3356, 9, 7])),
            Via::Other(Some(9))
        );
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(Lengths::of(vec![]), None);
        let l = Lengths::of(vec![5, 3, 4]).unwrap();
        assert_eq!((l.min, l.median, l.max), (3, 4.0, 5));
        assert_eq!(Lengths::of(vec![3, 4]).unwrap().median, 3.5);
    }

    #[test]
    fn lopsided_split_is_flagged() {
        // 9 of 10 through alpha, same lengths.
        let mut ev: Vec<Event> = (0..9)
            .map(|n| announce(n, "192.0.2.0/24", &[65000 + u32::from(n), A, US], 1))
            .collect();
        ev.push(announce(9, "192.0.2.0/24", &[65009, B, US], 1));
        let r = analyse(&settings(), &table(ev));
        let p = &r.prefixes[0];
        assert_eq!(p.vantage_points, 10);
        assert_eq!(p.upstreams[0].vantage_points, 9);
        assert!((p.upstreams[0].share - 0.9).abs() < 1e-9);
        assert_eq!(p.flags.len(), 1);
        assert_eq!(p.flags[0].kind, FlagKind::Lopsided);
        assert_eq!(p.flags[0].upstream, "alpha");
        assert_eq!(r.flagged, 1);
    }

    #[test]
    fn balanced_split_is_not_flagged() {
        let ev: Vec<Event> = (0..10)
            .map(|n| {
                let up = if n % 2 == 0 { A } else { B };
                announce(n, "192.0.2.0/24", &[65000 + u32::from(n), up, US], 1)
            })
            .collect();
        let r = analyse(&settings(), &table(ev));
        assert_eq!(r.prefixes[0].upstreams[0].vantage_points, 5);
        assert_eq!(r.prefixes[0].upstreams[1].vantage_points, 5);
        assert!(r.prefixes[0].flags.is_empty());
        assert_eq!(r.flagged, 0);
    }

    #[test]
    fn exactly_the_threshold_is_not_lopsided() {
        let ev: Vec<Event> = (0..5)
            .map(|n| {
                let up = if n == 0 { B } else { A };
                announce(n, "192.0.2.0/24", &[65000 + u32::from(n), up, US], 1)
            })
            .collect();
        let r = analyse(&settings(), &table(ev));
        assert!((r.prefixes[0].upstreams[0].share - 0.8).abs() < 1e-9);
        assert!(r.prefixes[0].flags.is_empty());
    }

    #[test]
    fn longer_paths_through_one_upstream_are_flagged() {
        // 6 vs 4: balanced, but beta's paths are two hops longer (a reseller).
        let ev: Vec<Event> = (0..10)
            .map(|n| {
                let me = 65000 + u32::from(n);
                if n < 6 {
                    announce(n, "2001:db8::/32", &[me, A, US], 1)
                } else {
                    announce(n, "2001:db8::/32", &[me, 3356, 64510, B, US], 1)
                }
            })
            .collect();
        let r = analyse(&settings(), &table(ev));
        let p = &r.prefixes[1];
        assert_eq!(p.prefix.to_string(), "2001:db8::/32");
        assert_eq!(p.flags.len(), 1, "{:?}", p.flags);
        assert_eq!(p.flags[0].kind, FlagKind::LongerPath);
        assert_eq!(p.flags[0].upstream, "beta");
        assert_eq!(p.upstreams[1].path_len.unwrap().median, 5.0);
    }

    #[test]
    fn single_upstream_prefix_is_not_judged() {
        let ev = (0..4).map(|n| announce(n, "198.51.100.0/24", &[65000, A, US], 1));
        let r = analyse(&settings(), &table(ev));
        assert_eq!(r.prefixes[2].upstreams[0].share, 1.0);
        assert!(r.prefixes[2].flags.is_empty());
        assert!(!r.prefixes[2].upstreams[1].expected);
    }

    #[test]
    fn withdrawals_and_order_by_time() {
        let p = "192.0.2.0/24";
        let mut t = table([
            announce(1, p, &[1, A, US], 10),
            announce(2, p, &[2, B, US], 10),
        ]);
        t.apply(Event::Withdraw {
            peer: peer(1),
            prefix: p.parse().unwrap(),
            path_id: None,
            time: 20,
        });
        // an older announcement (e.g. an updates file from before the bview) loses
        t.apply(announce(1, p, &[1, A, US], 15));
        let r = analyse(&settings(), &t);
        assert_eq!(r.prefixes[0].vantage_points, 1);
        assert_eq!(r.prefixes[0].upstreams[1].vantage_points, 1);
        // a newer one brings it back
        t.apply(announce(1, p, &[1, B, US], 30));
        assert_eq!(
            analyse(&settings(), &t).prefixes[0].upstreams[1].vantage_points,
            2
        );
        // session down removes every route of the peer
        t.apply(Event::PeerDown {
            peer: peer(2),
            time: 40,
        });
        let r = analyse(&settings(), &t);
        assert_eq!(r.prefixes[0].vantage_points, 1);
    }

    #[test]
    fn unwatched_prefixes_are_not_kept_and_more_specifics_are_reported() {
        let t = table([
            announce(1, "203.0.113.0/24", &[1, A, US], 1),
            announce(1, "192.0.0.0/16", &[1, A, US], 1),
            announce(1, "192.0.2.128/25", &[1, B, US], 1),
            announce(2, "192.0.2.0/24", &[2, A, US], 1),
        ]);
        assert_eq!(t.len(), 2);
        let r = analyse(&settings(), &t);
        let names: Vec<(String, String)> = r
            .prefixes
            .iter()
            .map(|p| (p.prefix.to_string(), p.name.clone()))
            .collect();
        assert_eq!(names[0], ("192.0.2.0/24".into(), "dns".into()));
        assert_eq!(
            names[1],
            ("192.0.2.128/25".into(), "dns (more-specific)".into())
        );
        assert_eq!(
            r.prefixes[1].more_specific_of,
            Some("192.0.2.0/24".parse().unwrap())
        );
        assert_eq!(r.prefixes.len(), 4);
    }

    #[test]
    fn add_path_counts_a_peer_once_with_its_shortest_path() {
        let p: IpNet = "192.0.2.0/24".parse().unwrap();
        let mut t = Table::new(Watch::new(&settings()));
        for (id, path) in [(1, vec![1, 9, 9, A, US]), (2, vec![1, B, US])] {
            t.apply(Event::Announce {
                peer: peer(1),
                prefix: p,
                path_id: Some(id),
                path: AsPath::seq(&path),
                time: 1,
            });
        }
        let r = analyse(&settings(), &t);
        assert_eq!(r.prefixes[0].vantage_points, 1);
        assert_eq!(r.prefixes[0].upstreams[1].vantage_points, 1);
    }

    #[test]
    fn unseen_prefix_and_other_paths() {
        let r = analyse(
            &settings(),
            &table([announce(1, "192.0.2.0/24", &[1, 64510, US], 1)]),
        );
        assert_eq!(r.prefixes[0].other[0].via_asn, Some(64510));
        assert!(r.prefixes[0].flags.is_empty());
        assert_eq!(r.prefixes[1].vantage_points, 0);
        let text = render_human(&r);
        assert!(text.contains("other via AS64510"), "{text}");
        assert!(
            text.contains("no collector peer holds a path to it"),
            "{text}"
        );
    }
}
