//! Per-site live figures (`edgeform top`, docs/edge.md "Per-site metrics
//! and the access log"), pure: an edge's `/metrics` text read into
//! cumulative counts per site ([`Snapshot::parse`]), two snapshots turned
//! into rates over the interval between them ([`report`]: the busiest
//! [`TOP`] sites, the rest folded into `_other`), the retained message an
//! agent publishes on `<prefix>/sites/<node>` ([`SitesReport`], read back
//! bounded by [`read_sites`]) and the sum over nodes `top` prints
//! ([`combine`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Sites per report; the rest are summed into [`OTHER`].
pub const TOP: usize = 200;
/// The label of the sites folded together (also the edge's overflow label).
pub const OTHER: &str = "_other";
/// Sites read from one exposition at most (an edge tracks 10,000 by default).
pub const MAX_HOSTS: usize = 100_000;
/// A sites message's largest size.
pub const SITES_MAX_BYTES: usize = 1 << 20;

/// `<prefix>/sites/<node>`: the node's retained [`SitesReport`].
#[must_use]
pub fn sites_topic(prefix: &str, node: &str) -> String {
    format!("{prefix}/sites/{node}")
}

/// One site's cumulative counts, as the edge exports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Requests by class, `1xx`..`5xx`.
    pub requests: [f64; 5],
    pub hits: f64,
    /// Requests with any cache status.
    pub cached: f64,
    pub refusals: BTreeMap<String, f64>,
    pub bytes: f64,
    /// Upstream time buckets: upper bound (seconds; `f64::INFINITY` for
    /// `+Inf`) → cumulative count.
    pub upstream: BTreeMap<Bound, f64>,
}

/// A bucket's upper bound, ordered.
#[derive(Debug, Clone, Copy)]
pub struct Bound(pub f64);
impl PartialEq for Bound {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Bound {}
impl PartialOrd for Bound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Every site's counts of one exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub sites: BTreeMap<String, Counts>,
}

/// The labels of a sample line: `name{a="x",b="y"} value` → (name,
/// labels, value); `None` for a line that is not one.
fn sample(line: &str) -> Option<(&str, BTreeMap<&str, String>, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    let (name, rest) = series.split_once('{').unwrap_or((series, "}"));
    let mut labels = BTreeMap::new();
    let mut rest = rest.strip_suffix('}')?;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key, value);
        rest = after[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&after[end + 1..]);
    }
    Some((name, labels, value))
}

impl Snapshot {
    /// The `edgeform_site_*` samples of an exposition (other lines are
    /// ignored; at most [`MAX_HOSTS`] sites, the rest dropped).
    #[must_use]
    pub fn parse(text: &str) -> Snapshot {
        let mut sites: BTreeMap<String, Counts> = BTreeMap::new();
        for line in text.lines() {
            if !line.starts_with("edgeform_site_") {
                continue;
            }
            let Some((name, labels, value)) = sample(line) else {
                continue;
            };
            if !value.is_finite() || value < 0.0 {
                continue;
            }
            let Some(host) = labels.get("host") else {
                continue;
            };
            if !sites.contains_key(host.as_str()) && sites.len() >= MAX_HOSTS {
                continue;
            }
            let c = sites.entry(host.clone()).or_default();
            let label = |k: &str| labels.get(k).map(String::as_str);
            match name {
                "edgeform_site_requests_total" => {
                    let class = label("class").and_then(|c| match c {
                        "1xx" => Some(0),
                        "2xx" => Some(1),
                        "3xx" => Some(2),
                        "4xx" => Some(3),
                        "5xx" => Some(4),
                        _ => None,
                    });
                    if let Some(i) = class {
                        c.requests[i] += value;
                    }
                }
                "edgeform_site_cache_total" => {
                    c.cached += value;
                    if label("cache") == Some("HIT") {
                        c.hits += value;
                    }
                }
                "edgeform_site_refusals_total" => {
                    if let Some(r) = label("reason") {
                        *c.refusals.entry(r.to_owned()).or_default() += value;
                    }
                }
                "edgeform_site_bytes_sent_total" => c.bytes += value,
                "edgeform_site_upstream_seconds_bucket" => {
                    let le = label("le").and_then(|l| match l {
                        "+Inf" => Some(f64::INFINITY),
                        l => l.parse::<f64>().ok(),
                    });
                    if let Some(le) = le {
                        *c.upstream.entry(Bound(le)).or_default() += value;
                    }
                }
                _ => {}
            }
        }
        Snapshot { sites }
    }
}

/// One site's figures over an interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteFigures {
    pub host: String,
    pub requests_per_s: f64,
    /// HITs of the requests with a cache status; `null`: none had one.
    pub hit_ratio: Option<f64>,
    /// 5xx of all requests; `null`: no request.
    pub error_5xx_ratio: Option<f64>,
    /// Refusals per second by reason.
    pub refusals_per_s: BTreeMap<String, f64>,
    /// The 95th percentile of upstream time, interpolated within its
    /// bucket (as Prometheus's `histogram_quantile`); `null`: nothing
    /// went upstream.
    pub p95_upstream_ms: Option<f64>,
    pub bytes_per_s: f64,
}

/// The retained message on `<prefix>/sites/<node>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SitesReport {
    pub node: String,
    /// Unix seconds of the later snapshot.
    pub at: u64,
    pub interval_s: f64,
    /// The busiest sites first, at most [`TOP`] plus [`OTHER`].
    pub sites: Vec<SiteFigures>,
}

/// The part of `cur` since `prev` (a counter that went down — the edge
/// restarted — counts from zero).
fn delta(cur: f64, prev: f64) -> f64 {
    if cur >= prev { cur - prev } else { cur }
}

fn diff(cur: &Counts, prev: Option<&Counts>) -> Counts {
    let zero = Counts::default();
    let p = prev.unwrap_or(&zero);
    let mut d = Counts {
        bytes: delta(cur.bytes, p.bytes),
        hits: delta(cur.hits, p.hits),
        cached: delta(cur.cached, p.cached),
        ..Counts::default()
    };
    for i in 0..5 {
        d.requests[i] = delta(cur.requests[i], p.requests[i]);
    }
    for (r, v) in &cur.refusals {
        d.refusals.insert(
            r.clone(),
            delta(*v, p.refusals.get(r).copied().unwrap_or(0.0)),
        );
    }
    for (b, v) in &cur.upstream {
        d.upstream
            .insert(*b, delta(*v, p.upstream.get(b).copied().unwrap_or(0.0)));
    }
    d
}

fn add(into: &mut Counts, c: &Counts) {
    for i in 0..5 {
        into.requests[i] += c.requests[i];
    }
    into.hits += c.hits;
    into.cached += c.cached;
    into.bytes += c.bytes;
    for (r, v) in &c.refusals {
        *into.refusals.entry(r.clone()).or_default() += v;
    }
    for (b, v) in &c.upstream {
        *into.upstream.entry(*b).or_default() += v;
    }
}

/// The `q` quantile of cumulative buckets, interpolated linearly within
/// the bucket it falls in (the lowest bucket from 0; in `+Inf`, the
/// highest finite bound).
#[must_use]
pub fn quantile(q: f64, buckets: &BTreeMap<Bound, f64>) -> Option<f64> {
    let total = buckets
        .get(&Bound(f64::INFINITY))
        .copied()
        .or_else(|| buckets.values().copied().reduce(f64::max))?;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (b, &count) in buckets {
        if count >= rank {
            if b.0.is_infinite() {
                return Some(lower);
            }
            let within = count - below;
            let frac = if within > 0.0 {
                (rank - below) / within
            } else {
                1.0
            };
            return Some(lower + (b.0 - lower) * frac);
        }
        lower = b.0;
        below = count;
    }
    Some(lower)
}

fn figures(host: String, d: &Counts, secs: f64) -> SiteFigures {
    let total: f64 = d.requests.iter().sum();
    SiteFigures {
        host,
        requests_per_s: total / secs,
        hit_ratio: (d.cached > 0.0).then(|| d.hits / d.cached),
        error_5xx_ratio: (total > 0.0).then(|| d.requests[4] / total),
        refusals_per_s: d
            .refusals
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(r, v)| (r.clone(), v / secs))
            .collect(),
        p95_upstream_ms: quantile(0.95, &d.upstream).map(|s| s * 1000.0),
        bytes_per_s: d.bytes / secs,
    }
}

/// The figures of `node` between two snapshots `secs` apart: sites with a
/// request in the interval, busiest first, at most [`TOP`] of them; the
/// rest summed into [`OTHER`] (with the edge's own `_other`).
#[must_use]
pub fn report(node: &str, at: u64, prev: &Snapshot, cur: &Snapshot, secs: f64) -> SitesReport {
    let secs = if secs > 0.0 { secs } else { 1.0 };
    let mut moved: Vec<(String, Counts)> = cur
        .sites
        .iter()
        .map(|(h, c)| (h.clone(), diff(c, prev.sites.get(h))))
        .filter(|(_, d)| d.requests.iter().sum::<f64>() > 0.0)
        .collect();
    let total = |c: &Counts| c.requests.iter().sum::<f64>();
    moved.sort_by(|a, b| total(&b.1).total_cmp(&total(&a.1)).then(a.0.cmp(&b.0)));
    let mut other = Counts::default();
    let mut any_other = false;
    let mut sites = Vec::new();
    for (h, d) in moved {
        if h == OTHER || sites.len() >= TOP {
            add(&mut other, &d);
            any_other = true;
        } else {
            sites.push(figures(h, &d, secs));
        }
    }
    if any_other {
        sites.push(figures(OTHER.to_owned(), &other, secs));
    }
    SitesReport {
        node: node.to_owned(),
        at,
        interval_s: secs,
        sites,
    }
}

/// Why a sites message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SitesErrorKind {
    /// Larger than [`SITES_MAX_BYTES`].
    TooLarge,
    /// Not JSON of the right shape.
    Malformed,
    /// The message names another node than its topic.
    WrongNode,
    /// More sites than [`TOP`] + 1, a negative or non-finite figure, a
    /// ratio outside 0..1, or a site listed twice.
    BadFigures,
}

/// A refused sites message: its kind and a description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitesError {
    pub kind: SitesErrorKind,
    pub message: String,
}

impl std::fmt::Display for SitesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SitesError {}

/// Read the message on `<prefix>/sites/<node>`: bounded, naming its
/// topic's node, sane figures. `Ok(None)`: a cleared retained message.
///
/// # Errors
/// A [`SitesError`] of the kind above; nothing of a refused message is used.
pub fn read_sites(node: &str, payload: &[u8]) -> Result<Option<SitesReport>, SitesError> {
    let err = |kind, message: String| SitesError { kind, message };
    if payload.is_empty() {
        return Ok(None);
    }
    if payload.len() > SITES_MAX_BYTES {
        return Err(err(
            SitesErrorKind::TooLarge,
            format!(
                "sites of `{node}`: {} bytes, more than {SITES_MAX_BYTES}",
                payload.len()
            ),
        ));
    }
    let r: SitesReport = serde_json::from_slice(payload).map_err(|e| {
        err(
            SitesErrorKind::Malformed,
            format!("sites of `{node}`: not a sites report: {e}"),
        )
    })?;
    if r.node != node {
        return Err(err(
            SitesErrorKind::WrongNode,
            format!("sites on `{node}`'s topic name node `{}`", r.node),
        ));
    }
    let bad = |why: String| {
        err(
            SitesErrorKind::BadFigures,
            format!("sites of `{node}`: {why}"),
        )
    };
    if r.sites.len() > TOP + 1 {
        return Err(bad(format!(
            "{} sites, more than {}",
            r.sites.len(),
            TOP + 1
        )));
    }
    let rate = |v: f64| v.is_finite() && v >= 0.0;
    let ratio = |v: Option<f64>| v.is_none_or(|v| (0.0..=1.0).contains(&v));
    let mut seen = std::collections::BTreeSet::new();
    if !(r.interval_s.is_finite() && r.interval_s > 0.0) {
        return Err(bad("interval is not a positive number".into()));
    }
    for s in &r.sites {
        if !seen.insert(s.host.as_str()) {
            return Err(bad(format!("`{}` listed twice", s.host.escape_debug())));
        }
        let ok = rate(s.requests_per_s)
            && rate(s.bytes_per_s)
            && ratio(s.hit_ratio)
            && ratio(s.error_5xx_ratio)
            && s.p95_upstream_ms.is_none_or(rate)
            && s.refusals_per_s.values().all(|v| rate(*v))
            && s.host.len() <= 260
            && s.refusals_per_s.len() <= 64;
        if !ok {
            return Err(bad(format!("bad figures for `{}`", s.host.escape_debug())));
        }
    }
    Ok(Some(r))
}

/// One site summed over nodes (`edgeform top`): rates added, ratios
/// weighted by requests, p95 the highest node's.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Combined {
    pub host: String,
    pub nodes: usize,
    pub requests_per_s: f64,
    pub hit_ratio: Option<f64>,
    pub error_5xx_ratio: Option<f64>,
    pub refusals_per_s: BTreeMap<String, f64>,
    pub p95_upstream_ms: Option<f64>,
    pub bytes_per_s: f64,
}

/// The sites of every report summed per host, busiest first.
#[must_use]
pub fn combine(reports: &[SitesReport]) -> Vec<Combined> {
    struct Acc {
        c: Combined,
        hit_w: f64,
        hit_n: f64,
        err_w: f64,
        err_n: f64,
    }
    let mut by: BTreeMap<&str, Acc> = BTreeMap::new();
    for r in reports {
        for s in &r.sites {
            let a = by.entry(&s.host).or_insert_with(|| Acc {
                c: Combined {
                    host: s.host.clone(),
                    ..Combined::default()
                },
                hit_w: 0.0,
                hit_n: 0.0,
                err_w: 0.0,
                err_n: 0.0,
            });
            a.c.nodes += 1;
            a.c.requests_per_s += s.requests_per_s;
            a.c.bytes_per_s += s.bytes_per_s;
            if let Some(h) = s.hit_ratio {
                a.hit_w += h * s.requests_per_s;
                a.hit_n += s.requests_per_s;
            }
            if let Some(e) = s.error_5xx_ratio {
                a.err_w += e * s.requests_per_s;
                a.err_n += s.requests_per_s;
            }
            for (k, v) in &s.refusals_per_s {
                *a.c.refusals_per_s.entry(k.clone()).or_default() += v;
            }
            if let Some(p) = s.p95_upstream_ms {
                a.c.p95_upstream_ms = Some(a.c.p95_upstream_ms.map_or(p, |q: f64| q.max(p)));
            }
        }
    }
    let mut out: Vec<Combined> = by
        .into_values()
        .map(|mut a| {
            a.c.hit_ratio = (a.hit_n > 0.0).then(|| a.hit_w / a.hit_n);
            a.c.error_5xx_ratio = (a.err_n > 0.0).then(|| a.err_w / a.err_n);
            a.c
        })
        .collect();
    out.sort_by(|a, b| {
        b.requests_per_s
            .total_cmp(&a.requests_per_s)
            .then(a.host.cmp(&b.host))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x\n\
edgeform_site_requests_total{node=\"e\",host=\"a.test\",class=\"2xx\"} 90\n\
edgeform_site_requests_total{node=\"e\",host=\"a.test\",class=\"5xx\"} 10\n\
edgeform_site_cache_total{node=\"e\",host=\"a.test\",cache=\"HIT\"} 60\n\
edgeform_site_cache_total{node=\"e\",host=\"a.test\",cache=\"MISS\"} 20\n\
edgeform_site_refusals_total{node=\"e\",host=\"a.test\",reason=\"waf-xss\"} 5\n\
edgeform_site_bytes_sent_total{node=\"e\",host=\"a.test\"} 1000\n\
edgeform_site_upstream_seconds_bucket{node=\"e\",host=\"a.test\",le=\"0.1\"} 10\n\
edgeform_site_upstream_seconds_bucket{node=\"e\",host=\"a.test\",le=\"1\"} 20\n\
edgeform_site_upstream_seconds_bucket{node=\"e\",host=\"a.test\",le=\"+Inf\"} 20\n\
edgeform_site_requests_total{node=\"e\",host=\"q\\\"\\\\x\",class=\"2xx\"} 1\n\
other_metric 5\n";

    #[test]
    fn an_exposition_reads_into_counts_per_site() {
        let s = Snapshot::parse(TEXT);
        let a = &s.sites["a.test"];
        assert_eq!(a.requests, [0.0, 90.0, 0.0, 0.0, 10.0]);
        assert_eq!((a.hits, a.cached, a.bytes), (60.0, 80.0, 1000.0));
        assert_eq!(a.refusals["waf-xss"], 5.0);
        assert_eq!(a.upstream[&Bound(f64::INFINITY)], 20.0);
        // Escaped label values read back.
        assert!(s.sites.contains_key("q\"\\x"));
    }

    #[test]
    fn two_snapshots_give_rates_ratios_and_p95() {
        let prev = Snapshot::default();
        let cur = Snapshot::parse(TEXT);
        let r = report("e", 7, &prev, &cur, 10.0);
        let a = r.sites.iter().find(|s| s.host == "a.test").unwrap();
        assert_eq!(r.sites[0].host, "a.test", "busiest first");
        assert!((a.requests_per_s - 10.0).abs() < 1e-9);
        assert_eq!(a.hit_ratio, Some(0.75));
        assert_eq!(a.error_5xx_ratio, Some(0.1));
        assert!((a.refusals_per_s["waf-xss"] - 0.5).abs() < 1e-9);
        assert!((a.bytes_per_s - 100.0).abs() < 1e-9);
        // Rank 19 of 20: in (0.1, 1], 9 of its 10 → 0.1 + 0.9 × 0.9 = 0.91 s.
        assert!((a.p95_upstream_ms.unwrap() - 910.0).abs() < 1e-6);
        // Nothing new: no site in the next report; a restarted edge counts anew.
        assert!(report("e", 8, &cur, &cur, 10.0).sites.is_empty());
        let restarted = Snapshot::parse(
            "edgeform_site_requests_total{node=\"e\",host=\"a.test\",class=\"2xx\"} 3\n",
        );
        let r = report("e", 9, &cur, &restarted, 1.0);
        assert!((r.sites[0].requests_per_s - 3.0).abs() < 1e-9);
    }

    #[test]
    fn past_the_top_sites_are_folded_into_other() {
        let mut text = String::new();
        for i in 0..TOP + 5 {
            text.push_str(&format!(
                "edgeform_site_requests_total{{node=\"e\",host=\"s{i}.test\",class=\"2xx\"}} {}\n",
                i + 1
            ));
        }
        text.push_str("edgeform_site_requests_total{node=\"e\",host=\"_other\",class=\"2xx\"} 7\n");
        let r = report("e", 1, &Snapshot::default(), &Snapshot::parse(&text), 1.0);
        assert_eq!(r.sites.len(), TOP + 1);
        let other = r.sites.last().unwrap();
        assert_eq!(other.host, OTHER);
        // s0..s4 (1..5 requests) and the edge's own _other (7).
        assert!((other.requests_per_s - 22.0).abs() < 1e-9);
        let json = serde_json::to_vec(&r).unwrap();
        assert_eq!(read_sites("e", &json).unwrap(), Some(r));
    }

    #[test]
    fn hostile_sites_messages_are_refused_by_kind() {
        let kind = |node: &str, p: &[u8]| read_sites(node, p).unwrap_err().kind;
        assert_eq!(read_sites("e", b"").unwrap(), None);
        assert_eq!(kind("e", b"{"), SitesErrorKind::Malformed);
        assert_eq!(
            kind("e", &vec![b' '; SITES_MAX_BYTES + 1]),
            SitesErrorKind::TooLarge
        );
        let msg = |node: &str, sites: &str| {
            format!("{{\"node\":\"{node}\",\"at\":1,\"interval_s\":1.0,\"sites\":[{sites}]}}")
        };
        let site = |host: &str, rps: &str, hit: &str| {
            format!(
                "{{\"host\":\"{host}\",\"requests_per_s\":{rps},\"hit_ratio\":{hit},\
                 \"error_5xx_ratio\":null,\"refusals_per_s\":{{}},\"p95_upstream_ms\":null,\
                 \"bytes_per_s\":0}}"
            )
        };
        assert_eq!(
            kind("e", msg("f", "").as_bytes()),
            SitesErrorKind::WrongNode
        );
        for bad in [
            site("a", "-1", "null"),
            site("a", "1", "1.5"),
            format!("{},{}", site("a", "1", "null"), site("a", "1", "null")),
        ] {
            assert_eq!(
                kind("e", msg("e", &bad).as_bytes()),
                SitesErrorKind::BadFigures,
                "{bad}"
            );
        }
        assert!(read_sites("e", msg("e", &site("a", "1", "0.5")).as_bytes()).is_ok());
    }

    #[test]
    fn nodes_combine_per_site() {
        let f = |host: &str, rps: f64, hit: f64, p95: f64| SiteFigures {
            host: host.into(),
            requests_per_s: rps,
            hit_ratio: Some(hit),
            error_5xx_ratio: Some(0.0),
            refusals_per_s: BTreeMap::from([("waf-xss".to_owned(), 1.0)]),
            p95_upstream_ms: Some(p95),
            bytes_per_s: 10.0,
        };
        let r = |node: &str, sites| SitesReport {
            node: node.into(),
            at: 1,
            interval_s: 1.0,
            sites,
        };
        let rows = combine(&[
            r("e1", vec![f("a", 30.0, 1.0, 5.0), f("b", 1.0, 0.0, 1.0)]),
            r("e2", vec![f("a", 10.0, 0.0, 50.0)]),
        ]);
        assert_eq!(rows[0].host, "a");
        assert_eq!(rows[0].nodes, 2);
        assert!((rows[0].requests_per_s - 40.0).abs() < 1e-9);
        assert_eq!(rows[0].hit_ratio, Some(0.75));
        assert_eq!(rows[0].p95_upstream_ms, Some(50.0));
        assert_eq!(rows[0].refusals_per_s["waf-xss"], 2.0);
        assert_eq!(rows[1].host, "b");
    }
}
