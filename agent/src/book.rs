//! The health `Book`: every routing-table node's last health report and
//! status as heard on the broker, and the snapshot routing reads from it
//! (online, load, streams; stale while the broker is away; silent nodes
//! offline).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use edgestate::mqtt::{
    self as wire, HealthReport, Message, Summary, SummaryEntry, SummaryError, Topic,
};
use edgestate::route::{Health, NodeHealth};

/// A node silent for this many of its report intervals is offline.
pub const SILENT_AFTER_INTERVALS: u32 = 3;
/// … and never sooner than this.
pub const MIN_SILENCE: Duration = Duration::from_secs(15);
/// A region whose last summary is older than this many of its
/// summarizer's intervals (plus [`FRESH_SLACK`]) is read directly.
pub const FRESH_INTERVALS: u32 = 2;
/// … plus this (the summarizer's tick and the broker's delivery).
pub const FRESH_SLACK: Duration = Duration::from_secs(1);

/// The longest summarizer interval a summary is believed for: its
/// `interval_ms` is the sender's word (any agent may publish a region's
/// summary), and a forged hour must not keep a region counted fresh. A
/// region whose summarizer reports less often is read directly between
/// its summaries.
pub const SUMMARY_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// The longest health interval a node's report is believed for: its
/// `interval_ms` is the sender's word too (any agent may carry a node's
/// report in a summary), and a forged week must not keep a dead node
/// routable. A node silent for [`SILENT_AFTER_INTERVALS`] of this is
/// silent, whatever its reports said (agents refuse a longer
/// `health.interval`).
pub const REPORT_INTERVAL_MAX: Duration = agentconf::HEALTH_INTERVAL_MAX;

/// How far ahead of this host's clock a summary's `ts` is believed
/// (seconds). A summarizer's summaries are ordered by `ts`, then `epoch`
/// and `seq`, all the sender's word: a forged `ts` in the future counts as
/// this far ahead at most, so it holds that summarizer's genuine
/// summaries off (as late) for at most this long plus the clocks' skew,
/// never for good; counters alone (`u64::MAX`) hold nothing off past the
/// next second. An older summary delivered again (a retained echo after a
/// bridge reconnect) stays late.
pub const SUMMARY_TS_AHEAD_S: u64 = 30;

/// Every node's last health and status as heard on the broker.
///
/// Only nodes of the routing table are tracked ([`Book::for_nodes`]): the
/// health and status topics are writable by every agent (and, without
/// broker ACLs, by anyone), so reports for invented nodes must not grow
/// memory or take routing's time.
#[derive(Debug, Default)]
pub struct Book {
    nodes: BTreeMap<String, Entry>,
    /// The nodes to track; `None` tracks every node (tests).
    known: Option<BTreeSet<String>>,
    /// Each tracked node's region (the routing table's): a summary of a
    /// region may carry only its nodes.
    regions: BTreeMap<String, String>,
    /// Per region, the last summary heard.
    summaries: BTreeMap<String, Heard>,
    /// Per summarizer (a node of the table), the newest (ts, epoch, seq)
    /// taken (`ts` at most [`SUMMARY_TS_AHEAD_S`] past this host's clock).
    newest: BTreeMap<String, (u64, u64, u64)>,
}

/// A summary as heard: when, and its summarizer's interval.
#[derive(Debug, Clone)]
struct Heard {
    at: Instant,
    interval: Duration,
}

/// Who made a summary that was taken (the election follows the holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryHeard {
    pub by: String,
    pub epoch: u64,
    /// Entries newer than what the book held.
    pub applied: usize,
}

#[derive(Debug, Default)]
struct Entry {
    report: Option<HealthReport>,
    /// When the last report arrived (this host's clock: immune to skew).
    received: Option<Instant>,
    /// From `<prefix>/status/<node>`.
    online: Option<bool>,
    stale: bool,
    /// When the last health message (a report or its clearing) was heard,
    /// directly or dated by a summary: of two copies, the newer wins.
    heard: Option<Instant>,
}

impl Entry {
    /// When this node counts as silent: its last report's arrival plus
    /// [`SILENT_AFTER_INTERVALS`] of its interval (at least
    /// [`MIN_SILENCE`]); `None` without a report.
    fn silent_after(&self) -> Option<Instant> {
        let (Some(r), Some(at)) = (&self.report, self.received) else {
            return None;
        };
        let interval =
            Duration::from_millis(r.interval_ms.unwrap_or(5000)).min(REPORT_INTERVAL_MAX);
        let limit = (interval * SILENT_AFTER_INTERVALS).max(MIN_SILENCE);
        at.checked_add(limit)
    }
}

impl Book {
    /// A book that tracks only `nodes` (the routing table's).
    #[must_use]
    pub fn for_nodes(nodes: BTreeSet<String>) -> Book {
        Book {
            nodes: BTreeMap::new(),
            known: Some(nodes),
            regions: BTreeMap::new(),
            summaries: BTreeMap::new(),
            newest: BTreeMap::new(),
        }
    }

    /// A book that tracks the routing table's nodes, node → region.
    #[must_use]
    pub fn for_table(regions: BTreeMap<String, String>) -> Book {
        let mut b = Book::for_nodes(regions.keys().cloned().collect());
        b.regions = regions;
        b
    }

    /// [`Book::set_nodes`] with each node's region. Whether the set of
    /// nodes or a region changed.
    pub fn set_table(&mut self, regions: BTreeMap<String, String>) -> bool {
        let changed = self.set_nodes(regions.keys().cloned().collect()) || self.regions != regions;
        let names: BTreeSet<&String> = regions.values().collect();
        self.summaries.retain(|r, _| names.contains(r));
        self.newest.retain(|n, _| regions.contains_key(n));
        self.regions = regions;
        changed
    }

    /// A tracked node's region.
    #[must_use]
    pub fn region_of(&self, node: &str) -> Option<&str> {
        self.regions.get(node).map(String::as_str)
    }

    /// The regions of the table, each with its nodes.
    #[must_use]
    pub fn regions(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (node, region) in &self.regions {
            out.entry(region.as_str()).or_default().push(node.as_str());
        }
        out
    }

    /// Whether a node has a report and what its serving probe says: a
    /// change is worth a summary at once.
    #[must_use]
    pub fn availability(&self, node: &str) -> (bool, Option<bool>) {
        self.nodes
            .get(node)
            .and_then(|e| e.report.as_ref())
            .map_or((false, None), |r| (true, r.serving))
    }

    /// A node's status (`offline`: its last will or a clean stop).
    #[must_use]
    pub fn online(&self, node: &str) -> Option<bool> {
        self.nodes.get(node).and_then(|e| e.online)
    }

    /// Take the summary on `<prefix>/summary/<region>` heard at `now`:
    /// each node's report replaces the book's only when newer (dated
    /// `age_ms` before `now`), so duplicate or late summaries change
    /// nothing. `Ok(None)`: a cleared summary, or one not newer than the
    /// last taken from its summarizer (delivered late): nothing taken.
    ///
    /// # Errors
    /// The summary is refused whole ([`wire::read_summary`]).
    pub fn take_summary_at(
        &mut self,
        region: &str,
        payload: &[u8],
        now: Instant,
    ) -> Result<Option<SummaryHeard>, SummaryError> {
        self.take_summary_at_clock(region, payload, now, crate::unix_now())
    }

    /// [`Book::take_summary_at`] with this host's clock `wall` (Unix
    /// seconds).
    ///
    /// # Errors
    /// The summary is refused whole ([`wire::read_summary`]).
    pub fn take_summary_at_clock(
        &mut self,
        region: &str,
        payload: &[u8],
        now: Instant,
        wall: u64,
    ) -> Result<Option<SummaryHeard>, SummaryError> {
        let regions = &self.regions;
        // A region with no node in the table: refused before its payload
        // (up to 8 MiB, any agent may publish one) is parsed.
        if !payload.is_empty() && !regions.values().any(|r| r == region) {
            return Err(SummaryError {
                kind: wire::SummaryErrorKind::ForeignNode,
                message: format!(
                    "summary of region `{}`: no node of the routing table is in it",
                    edgestate::untrusted::escape(region)
                ),
            });
        }
        let Some(summary) = wire::read_summary(region, payload, |n| regions.get(n).cloned())?
        else {
            return Ok(None);
        };
        let interval = Duration::from_millis(summary.interval_ms)
            .clamp(Duration::from_millis(100), SUMMARY_INTERVAL_MAX);
        // Late: not newer than one taken from this summarizer.
        let ts = summary.ts.min(wall.saturating_add(SUMMARY_TS_AHEAD_S));
        let order = (ts, summary.epoch, summary.seq);
        if self.newest.get(&summary.by).is_some_and(|n| *n >= order) {
            return Ok(None);
        }
        self.newest.insert(summary.by.clone(), order);
        let mut applied = 0;
        for e in summary.nodes {
            // Older than this host's clock can tell: nothing to compare.
            let Some(at) = now.checked_sub(Duration::from_millis(e.age_ms)) else {
                continue;
            };
            let entry = self.nodes.entry(e.node).or_default();
            if entry.heard.is_some_and(|h| h >= at) {
                continue;
            }
            entry.heard = Some(at);
            match e.report {
                Some(r) => {
                    entry.report = Some(r);
                    entry.received = Some(at);
                    entry.stale = false;
                }
                None => entry.report = None,
            }
            applied += 1;
        }
        // A region with no node in the table has no summary to wait for.
        self.summaries
            .insert(region.to_owned(), Heard { at: now, interval });
        Ok(Some(SummaryHeard {
            by: summary.by,
            epoch: summary.epoch,
            applied,
        }))
    }

    /// Whether a summary of `region` was heard recently enough at `now`
    /// (within [`FRESH_INTERVALS`] of its summarizer's interval plus
    /// [`FRESH_SLACK`]); a region without one is read directly.
    #[must_use]
    pub fn summary_fresh(&self, region: &str, now: Instant) -> bool {
        self.summaries.get(region).is_some_and(|h| {
            now.saturating_duration_since(h.at) <= h.interval * FRESH_INTERVALS + FRESH_SLACK
        })
    }

    /// The summary of `region` this book can make at `now` (the
    /// summarizer's): every node of the region heard from, with its exact
    /// last report and how long ago it was heard.
    #[must_use]
    #[allow(clippy::too_many_arguments)]
    pub fn summary_at(
        &self,
        region: &str,
        by: &str,
        (epoch, seq): (u64, u64),
        interval: Duration,
        ts: u64,
        now: Instant,
    ) -> Summary {
        let nodes = self
            .nodes
            .iter()
            .filter(|(n, _)| self.region_of(n) == Some(region))
            .filter_map(|(n, e)| {
                let heard = e.heard?;
                Some(SummaryEntry {
                    node: n.clone(),
                    age_ms: u64::try_from(now.saturating_duration_since(heard).as_millis())
                        .unwrap_or(u64::MAX),
                    report: e.report.clone(),
                })
            })
            .collect();
        Summary {
            region: region.to_owned(),
            by: by.to_owned(),
            epoch,
            ts,
            seq,
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            nodes,
        }
    }

    /// Track `nodes` from now on (a new routing table): the others are
    /// forgotten. Whether the set changed (retained messages of the new
    /// nodes are then worth asking for again).
    pub fn set_nodes(&mut self, nodes: BTreeSet<String>) -> bool {
        if self.known.as_ref() == Some(&nodes) {
            return false;
        }
        self.nodes.retain(|name, _| nodes.contains(name));
        self.known = Some(nodes);
        true
    }

    /// Take a retained/new message; `false` when it was not ours to read.
    pub fn take(&mut self, prefix: &str, topic: &str, payload: &[u8]) -> Result<bool, String> {
        self.take_at(prefix, topic, payload, Instant::now())
    }

    /// [`Book::take`] at `now`.
    pub fn take_at(
        &mut self,
        prefix: &str,
        topic: &str,
        payload: &[u8],
        now: Instant,
    ) -> Result<bool, String> {
        self.take_delivered_at(prefix, topic, payload, now, false)
    }

    /// [`Book::take_at`] of a message the broker sent because of a new
    /// subscription (`retained`): a report equal to the one held (dated
    /// by a summary) keeps its date — it is not news.
    pub fn take_delivered_at(
        &mut self,
        prefix: &str,
        topic: &str,
        payload: &[u8],
        now: Instant,
        retained: bool,
    ) -> Result<bool, String> {
        // The topic names the node: decide before reading the payload.
        if let Some(known) = &self.known
            && let Some(Topic::Health(node) | Topic::Status(node)) =
                wire::parse_topic(prefix, topic)
            && !known.contains(node)
        {
            return Err(format!(
                "{topic}: node `{node}` is not in the routing table; ignored"
            ));
        }
        match wire::read_message(prefix, topic, payload)? {
            Some(Message::Report(node, None)) => {
                // A cleared retained report: the node is gone.
                if let Some(e) = self.nodes.get_mut(node) {
                    e.report = None;
                    e.heard = Some(now);
                }
                Ok(true)
            }
            Some(Message::Report(node, Some(report))) => {
                let e = self.nodes.entry(node.to_owned()).or_default();
                if retained && e.report.as_ref() == Some(&*report) {
                    return Ok(true);
                }
                e.report = Some(*report);
                e.received = Some(now);
                e.heard = Some(now);
                e.stale = false;
                Ok(true)
            }
            Some(Message::Status(node, online)) => {
                let e = self.nodes.entry(node.to_owned()).or_default();
                e.online = online;
                e.stale = false;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The broker went away: keep everything, marked stale.
    pub fn mark_stale(&mut self) {
        for e in self.nodes.values_mut() {
            e.stale = true;
        }
    }

    /// Whether any node is known (nothing to re-check otherwise).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The snapshot routing reads, at `now`. A node is online when its
    /// status says so, or — with no status heard — when it has a report;
    /// `offline` (the last will) always wins. While the broker is
    /// reachable (`connected`), a node whose reports stopped for
    /// [`SILENT_AFTER_INTERVALS`] of its own interval (at least
    /// [`MIN_SILENCE`]) counts as offline even if no will came (a hung
    /// agent keeps its connection); with the broker away nothing ages —
    /// the last known values stay in use, marked stale.
    #[must_use]
    pub fn health_at(&self, now: Instant, connected: bool) -> Health {
        let silent = |e: &Entry| connected && e.silent_after().is_some_and(|t| now > t);
        let mut h = self.health();
        for (name, n) in &mut h.nodes {
            if self.nodes.get(name).is_some_and(silent) {
                n.online = Some(false);
            }
        }
        h
    }

    /// Whether a node fell silent after `since` and by `now` (its report
    /// is older than the silence limit): a snapshot taken at `since` no
    /// longer says so. Allocates nothing; the once-a-second recheck asks.
    #[must_use]
    pub fn silence_due(&self, since: Instant, now: Instant) -> bool {
        self.nodes
            .values()
            .filter_map(Entry::silent_after)
            .any(|t| t >= since && t < now)
    }

    /// [`Book::health_at`] without the silence rule (as if nothing aged).
    #[must_use]
    pub fn health(&self) -> Health {
        Health {
            nodes: self
                .nodes
                .iter()
                .filter(|(_, e)| e.report.is_some() || e.online.is_some())
                .map(|(name, e)| {
                    let r = e.report.as_ref();
                    (
                        name.clone(),
                        NodeHealth {
                            online: Some(e.online.unwrap_or(r.is_some())),
                            play_sessions: r.and_then(|r| r.play_sessions),
                            out_kbit: r.and_then(|r| r.out_kbit),
                            streams: r.and_then(|r| r.streams.clone()),
                            stale: e.stale,
                            vod: r.and_then(|r| r.vod.clone()),
                            net_kbit: r.and_then(|r| r.net_kbit),
                            serving: r.and_then(|r| r.serving),
                        },
                    )
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgestate::mqtt::{ConfigState, PurgeState, RedisState};

    fn report(node: &str, sessions: u64) -> Vec<u8> {
        serde_json::to_vec(&HealthReport {
            node: node.into(),
            ts: 1,
            interval_ms: Some(5000),
            play_sessions: Some(sessions),
            out_kbit: Some(100),
            streams: Some(vec!["s".into()].into()),
            vod: None,
            net_kbit: None,
            config: ConfigState::default(),
            purge: PurgeState::default(),
            redis: RedisState::default(),
            version: "0".into(),
            bundle: None,
            serving: None,
        })
        .unwrap()
    }

    #[test]
    fn book_follows_reports_status_and_outages() {
        let mut b = Book::default();
        assert_eq!(b.take("p", "p/health/a", &report("a", 3)), Ok(true));
        assert_eq!(b.take("p", "p/status/b", b"online"), Ok(true));
        assert_eq!(b.take("p", "other/health/a", &report("a", 3)), Ok(false));
        assert!(
            b.take("p", "p/health/c", &report("x", 1)).is_err(),
            "node mismatch"
        );
        assert!(b.take("p", "p/health/c", b"{").is_err());
        assert!(b.take("p", "p/status/c", b"maybe").is_err());
        let h = b.health();
        assert_eq!(h.nodes.len(), 2);
        assert_eq!(
            h.nodes["a"].online,
            Some(true),
            "a report without status: online"
        );
        assert_eq!(h.nodes["a"].play_sessions, Some(3));
        assert_eq!(h.nodes["b"].play_sessions, None);
        // The last will.
        b.take("p", "p/status/a", b"offline").unwrap();
        assert_eq!(b.health().nodes["a"].online, Some(false));
        assert_eq!(b.health().nodes["a"].play_sessions, Some(3), "kept");
        b.mark_stale();
        assert!(b.health().nodes.values().all(|n| n.stale));
        b.take("p", "p/health/a", &report("a", 5)).unwrap();
        assert!(!b.health().nodes["a"].stale && b.health().nodes["b"].stale);
        // Cleared retained messages forget the node.
        b.take("p", "p/health/a", b"").unwrap();
        b.take("p", "p/status/a", b"").unwrap();
        assert!(!b.health().nodes.contains_key("a"));
    }

    #[test]
    fn only_routing_table_nodes_are_tracked() {
        let mut b = Book::for_nodes(BTreeSet::from(["a".to_owned()]));
        assert_eq!(b.take("p", "p/health/a", &report("a", 3)), Ok(true));
        for i in 0..1000 {
            let n = format!("invented-{i}");
            assert!(
                b.take("p", &format!("p/health/{n}"), &report(&n, 1))
                    .is_err()
            );
            assert!(b.take("p", &format!("p/status/{n}"), b"offline").is_err());
        }
        assert_eq!(b.nodes.len(), 1);
        assert_eq!(b.health().nodes["a"].online, Some(true));
        // A new table: b is tracked, a forgotten.
        assert!(b.set_nodes(BTreeSet::from(["b".to_owned()])));
        assert!(!b.set_nodes(BTreeSet::from(["b".to_owned()])), "unchanged");
        assert!(b.is_empty());
        assert_eq!(b.take("p", "p/status/b", b"online"), Ok(true));
    }

    #[test]
    fn silent_nodes_go_offline_only_while_connected() {
        let mut b = Book::default();
        let t0 = Instant::now();
        b.take_at("p", "p/health/a", &report("a", 3), t0).unwrap();
        b.take_at("p", "p/status/a", b"online", t0).unwrap();
        b.take_at("p", "p/status/b", b"online", t0).unwrap();
        // interval_ms 5000 → silent after 15 s.
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(b.health_at(at(14), true).nodes["a"].online, Some(true));
        assert_eq!(b.health_at(at(16), true).nodes["a"].online, Some(false));
        assert_eq!(
            b.health_at(at(16), true).nodes["b"].online,
            Some(true),
            "no report: status rules"
        );
        assert_eq!(
            b.health_at(at(600), false).nodes["a"].online,
            Some(true),
            "with the broker away nothing ages"
        );
        b.take_at("p", "p/health/a", &report("a", 4), at(20))
            .unwrap();
        assert_eq!(
            b.health_at(at(21), true).nodes["a"].online,
            Some(true),
            "reporting again"
        );
    }

    #[test]
    fn a_forged_report_interval_keeps_a_node_online_for_a_bounded_time_only() {
        let mut b = Book::default();
        let t0 = Instant::now();
        for interval_ms in [u64::MAX, 1 << 62, 3_600_000] {
            let mut r: HealthReport = serde_json::from_slice(&report("a", 3)).unwrap();
            r.interval_ms = Some(interval_ms);
            b.take_at("p", "p/health/a", &serde_json::to_vec(&r).unwrap(), t0)
                .unwrap();
            let at = |s| t0 + Duration::from_secs(s);
            assert_eq!(b.health_at(at(179), true).nodes["a"].online, Some(true));
            assert_eq!(
                b.health_at(at(181), true).nodes["a"].online,
                Some(false),
                "{interval_ms} ms counts as {REPORT_INTERVAL_MAX:?}"
            );
        }
    }

    #[test]
    fn forged_summary_clock_counters_and_interval_hold_a_region_off_for_a_bounded_time_only() {
        let regions = BTreeMap::from([
            ("b1".to_owned(), "rb".to_owned()),
            ("b2".to_owned(), "rb".to_owned()),
        ]);
        let mut b = Book::for_table(regions);
        let summary = |ts, epoch, seq, interval_ms, sessions| {
            let r: wire::HealthReport = serde_json::from_slice(&report("b2", sessions)).unwrap();
            serde_json::to_vec(&wire::Summary {
                region: "rb".into(),
                by: "b1".into(),
                epoch,
                ts,
                seq,
                interval_ms,
                nodes: vec![wire::SummaryEntry {
                    node: "b2".into(),
                    age_ms: 0,
                    report: Some(r),
                }],
            })
            .unwrap()
        };
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let wall = 1_000_000;
        let take = |b: &mut Book, payload: &[u8], s: u64| {
            b.take_summary_at_clock("rb", payload, at(s), wall + s)
                .unwrap()
        };
        // What any agent may publish: the latest clock, the highest
        // counters, an hour's interval.
        let forged = summary(u64::MAX, u64::MAX, u64::MAX, 3_600_000, 1);
        assert!(take(&mut b, &forged, 0).is_some());
        // The interval counts as at most SUMMARY_INTERVAL_MAX.
        let window = SUMMARY_INTERVAL_MAX * FRESH_INTERVALS + FRESH_SLACK;
        assert!(b.summary_fresh("rb", t0 + window));
        assert!(!b.summary_fresh("rb", t0 + window + Duration::from_millis(1)));
        // The forged clock counts as SUMMARY_TS_AHEAD_S ahead at most: the
        // genuine summarizer's summaries are late until its clock passes
        // that, taken after.
        let ahead = SUMMARY_TS_AHEAD_S;
        assert_eq!(take(&mut b, &summary(wall + 1, 3, 7, 500, 2), 1), None);
        assert_eq!(
            take(&mut b, &summary(wall + ahead, 3, 8, 500, 2), ahead),
            None
        );
        let genuine = summary(wall + ahead + 1, 3, 9, 500, 2);
        assert_eq!(take(&mut b, &genuine, ahead + 1).unwrap().applied, 1);
        assert_eq!(b.health().nodes["b2"].play_sessions, Some(2));
        // A summary delivered again later (a retained echo after a bridge
        // reconnect), or an older one, stays late however long after.
        assert_eq!(take(&mut b, &genuine, 600), None);
        assert_eq!(
            take(&mut b, &summary(wall + ahead, 3, 10, 500, 3), 600),
            None
        );
        // A region nobody in the table is in: refused before parsing.
        assert_eq!(
            b.take_summary_at("zz", b"{ not even json", at(0))
                .unwrap_err()
                .kind,
            wire::SummaryErrorKind::ForeignNode
        );
    }

    #[test]
    fn time_changes_the_snapshot_only_when_a_node_falls_silent() {
        let mut b = Book::default();
        let t0 = Instant::now();
        b.take_at("p", "p/health/a", &report("a", 3), t0).unwrap();
        b.take_at("p", "p/status/b", b"online", t0).unwrap();
        let at = |ms| t0 + Duration::from_millis(ms);
        // a falls silent 15 s after its report; b has no report to age.
        assert!(!b.silence_due(at(0), at(14_000)));
        assert!(!b.silence_due(at(14_000), at(15_000)));
        assert!(b.silence_due(at(14_000), at(15_001)));
        assert!(b.silence_due(at(15_000), at(16_000)));
        // Once a snapshot says so, nothing more is due.
        assert!(!b.silence_due(at(16_000), at(600_000)));
        // Every answer agrees with the snapshots it compares.
        for (since, now) in [(0, 14_000), (14_000, 15_001), (16_000, 600_000)] {
            let changed = b.health_at(at(since), true) != b.health_at(at(now), true);
            assert_eq!(b.silence_due(at(since), at(now)), changed, "{since}..{now}");
        }
    }
}
