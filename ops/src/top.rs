//! `edgeform top [--site S]`: each site's live figures summed over the
//! edges — requests/s, hit ratio, 5xx ratio, p95 upstream time, refusals
//! by reason — from the retained `<prefix>/sites/<node>` messages the
//! agents publish (agent `sites`, read from the edge's per-site metrics).
//! With `--site`, that site at each edge. What the broker hands over is
//! untrusted: each message is read bounded and checked
//! ([`edgestate::sites::read_sites`]), a node outside the repository is
//! left out, and figures older than [`STALE_AFTER`] intervals are shown
//! as stale, not summed.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;
use rumqttc::{Event, Packet, QoS};
use serde::Serialize;

use edgestate::sites::{self, Combined, SiteFigures, SitesReport};
use edgestate::untrusted;

use crate::mqtt::{BrokerOptions, Format, align, connect_to, unix_now};

/// A node's figures older than this many of its intervals (plus
/// [`STALE_GRACE_S`]) are stale: the agent stopped publishing them.
pub const STALE_AFTER: f64 = 3.0;
/// Seconds of clock skew and broker delay allowed on top.
pub const STALE_GRACE_S: f64 = 10.0;
/// Sites listed by default (`--limit`).
pub const DEFAULT_LIMIT: usize = 20;

/// What was heard on `<prefix>/sites/+`.
#[derive(Debug, Default)]
pub struct Heard {
    pub reports: BTreeMap<String, SitesReport>,
    /// Messages refused, by node: why.
    pub refused: BTreeMap<String, String>,
    /// Nodes outside the repository that published figures.
    pub unknown: Vec<String>,
}

impl Heard {
    /// Take one message (`known`: is the node in the repository).
    pub fn take(
        &mut self,
        prefix: &str,
        topic: &str,
        payload: &[u8],
        known: impl Fn(&str) -> bool,
    ) {
        let Some(node) = topic
            .strip_prefix(prefix)
            .and_then(|t| t.strip_prefix("/sites/"))
            .filter(|n| !n.is_empty() && !n.contains('/'))
        else {
            return;
        };
        if !known(node) {
            if !self.unknown.iter().any(|n| n == node) {
                self.unknown.push(node.to_owned());
            }
            return;
        }
        match sites::read_sites(node, payload) {
            Ok(Some(r)) => {
                self.refused.remove(node);
                self.reports.insert(node.to_owned(), r);
            }
            Ok(None) => {
                self.reports.remove(node);
            }
            Err(e) => {
                self.reports.remove(node);
                self.refused.insert(node.to_owned(), e.to_string());
            }
        }
    }
}

/// What `top` prints, as JSON with `--format json`.
#[derive(Debug, Clone, Serialize)]
pub struct Top {
    /// Unix seconds when it was read.
    pub at: u64,
    /// Nodes whose figures are summed.
    pub nodes: Vec<String>,
    /// Nodes whose last figures are stale (seconds old).
    pub stale: BTreeMap<String, u64>,
    /// Nodes whose message was refused: why.
    pub refused: BTreeMap<String, String>,
    /// Nodes of the repository with no figures at all.
    pub silent: Vec<String>,
    /// Each site summed over the nodes, busiest first (`--site`: that
    /// site only).
    pub sites: Vec<Combined>,
    /// `--site`: the site at each node, busiest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_node: Option<Vec<(String, SiteFigures)>>,
}

fn is_stale(r: &SitesReport, now: u64) -> Option<u64> {
    let age = now.saturating_sub(r.at);
    #[allow(clippy::cast_precision_loss)]
    let too_old = age as f64 > r.interval_s * STALE_AFTER + STALE_GRACE_S;
    too_old.then_some(age)
}

/// The figures of `heard` at `now`, for every site or one. Pure.
#[must_use]
pub fn summarize(heard: &Heard, nodes: &[String], now: u64, site: Option<&str>) -> Top {
    let mut fresh = Vec::new();
    let mut stale = BTreeMap::new();
    for (n, r) in &heard.reports {
        match is_stale(r, now) {
            Some(age) => {
                stale.insert(n.clone(), age);
            }
            None => fresh.push(r.clone()),
        }
    }
    let mut all = sites::combine(&fresh);
    let by_node = site.map(|s| {
        all.retain(|c| c.host == s);
        let mut rows: Vec<(String, SiteFigures)> = fresh
            .iter()
            .filter_map(|r| {
                let f = r.sites.iter().find(|f| f.host == s)?;
                Some((r.node.clone(), f.clone()))
            })
            .collect();
        rows.sort_by(|a, b| {
            b.1.requests_per_s
                .total_cmp(&a.1.requests_per_s)
                .then(a.0.cmp(&b.0))
        });
        rows
    });
    Top {
        at: now,
        nodes: fresh.iter().map(|r| r.node.clone()).collect(),
        stale,
        refused: heard.refused.clone(),
        silent: nodes
            .iter()
            .filter(|n| !heard.reports.contains_key(*n) && !heard.refused.contains_key(*n))
            .cloned()
            .collect(),
        sites: all,
        by_node,
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0} ms"))
}

fn refusals(r: &BTreeMap<String, f64>) -> String {
    if r.is_empty() {
        return "-".into();
    }
    r.iter()
        .map(|(k, v)| format!("{} {v:.1}", untrusted::escape(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human table of [`Top`] (at most `limit` sites without `--site`).
#[must_use]
pub fn render(top: &Top, limit: usize) -> String {
    let mut out = String::new();
    let total: f64 = top.sites.iter().map(|c| c.requests_per_s).sum();
    if let Some(rows) = &top.by_node {
        let mut lines = vec![[
            "NODE".to_owned(),
            "REQ/S".into(),
            "HIT".into(),
            "5XX".into(),
            "P95 UPSTREAM".into(),
            "REFUSALS/S".into(),
        ]];
        for (n, f) in rows {
            lines.push([
                untrusted::escape(n),
                format!("{:.1}", f.requests_per_s),
                pct(f.hit_ratio),
                pct(f.error_5xx_ratio),
                ms(f.p95_upstream_ms),
                refusals(&f.refusals_per_s),
            ]);
        }
        if let Some(c) = top.sites.first() {
            lines.push([
                "all".into(),
                format!("{:.1}", c.requests_per_s),
                pct(c.hit_ratio),
                pct(c.error_5xx_ratio),
                ms(c.p95_upstream_ms),
                refusals(&c.refusals_per_s),
            ]);
            out.push_str(&align(&lines));
        } else {
            out.push_str("no requests for this site at any edge in the last interval\n");
        }
    } else {
        let mut lines = vec![[
            "SITE".to_owned(),
            "REQ/S".into(),
            "HIT".into(),
            "5XX".into(),
            "P95 UPSTREAM".into(),
            "REFUSALS/S".into(),
            "EDGES".into(),
        ]];
        for c in top.sites.iter().take(limit) {
            lines.push([
                untrusted::escape(&c.host),
                format!("{:.1}", c.requests_per_s),
                pct(c.hit_ratio),
                pct(c.error_5xx_ratio),
                ms(c.p95_upstream_ms),
                refusals(&c.refusals_per_s),
                c.nodes.to_string(),
            ]);
        }
        if top.sites.is_empty() {
            out.push_str("no requests at any edge in the last interval\n");
        } else {
            out.push_str(&align(&lines));
            if top.sites.len() > limit {
                out.push_str(&format!(
                    "… {} more sites (--limit)\n",
                    top.sites.len() - limit
                ));
            }
        }
    }
    out.push_str(&format!(
        "{:.1} requests/s over {} edge(s) reporting",
        total,
        top.nodes.len()
    ));
    out.push('\n');
    for (n, age) in &top.stale {
        out.push_str(&format!(
            "stale: {} (figures {age}s old, left out)\n",
            untrusted::escape(n)
        ));
    }
    for (n, why) in &top.refused {
        out.push_str(&format!(
            "refused: {}: {}\n",
            untrusted::escape(n),
            untrusted::escape(why)
        ));
    }
    if !top.silent.is_empty() {
        let names: Vec<String> = top.silent.iter().map(|n| untrusted::escape(n)).collect();
        out.push_str(&format!(
            "no figures from: {} (agent without health.edge_metrics, or not running)\n",
            names.join(", ")
        ));
    }
    out
}

/// The options of `top`.
#[derive(Debug, Clone)]
pub struct TopOptions<'a> {
    pub site: Option<&'a str>,
    pub limit: usize,
    pub format: Format,
}

/// Read every node's retained figures and print them. Exit 0 printed, 1
/// no node has figures (or the broker is unreachable: `Err`).
///
/// # Errors
/// No `mqtt` in cluster.yaml, the broker unreachable or lost.
pub async fn top(
    config: &compiler::Config,
    flags: &BrokerOptions,
    options: &TopOptions<'_>,
) -> Result<u8> {
    let nodes: Vec<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
    let mut s = connect_to(config, flags).await?;
    let prefix = s.prefix.clone();
    s.client
        .subscribe(sites::sites_topic(&prefix, "+"), QoS::AtMostOnce)
        .await?;
    // The retained messages follow the SUBACK; stop once they have been
    // quiet for a moment.
    let mut heard = Heard::default();
    let mut subacked = false;
    let started = Instant::now();
    let limit = Duration::from_secs(flags.connect_timeout.max(1));
    while started.elapsed() < limit {
        let mut got = false;
        let quiet = if subacked { 300 } else { 1000 };
        s.pump(Duration::from_millis(quiet), |e| {
            if let Event::Incoming(p) = e {
                match p {
                    Packet::SubAck(_) => subacked = true,
                    Packet::Publish(p) => {
                        heard.take(&prefix, &p.topic, &p.payload, |n| {
                            nodes.iter().any(|m| m == n)
                        });
                    }
                    _ => return false,
                }
                got = true;
                return true;
            }
            false
        })
        .await?;
        if !got && subacked {
            break;
        }
    }
    s.close().await;
    for n in &heard.unknown {
        tracing::warn!(node = %untrusted::escape(n), "top: figures from a node not in the repository, left out");
    }
    let top = summarize(&heard, &nodes, unix_now(), options.site);
    let mut out = std::io::stdout().lock();
    match options.format {
        Format::Json => writeln!(
            out,
            "{}",
            untrusted::json_text(&serde_json::to_string_pretty(&top)?)
        )?,
        Format::Human => out.write_all(render(&top, options.limit).as_bytes())?,
    }
    Ok(u8::from(top.nodes.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(host: &str, rps: f64, hit: f64, err: f64) -> SiteFigures {
        SiteFigures {
            host: host.into(),
            requests_per_s: rps,
            hit_ratio: Some(hit),
            error_5xx_ratio: Some(err),
            refusals_per_s: BTreeMap::new(),
            p95_upstream_ms: Some(12.0),
            bytes_per_s: 1000.0,
        }
    }

    fn message(node: &str, at: u64, sites: Vec<SiteFigures>) -> Vec<u8> {
        serde_json::to_vec(&SitesReport {
            node: node.into(),
            at,
            interval_s: 10.0,
            sites,
        })
        .unwrap()
    }

    #[test]
    fn fresh_nodes_are_summed_stale_refused_and_unknown_ones_named() {
        let now = 1_000_000;
        let nodes: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        let known = |n: &str| nodes.iter().any(|m| m == n);
        let mut h = Heard::default();
        h.take(
            "p",
            "p/sites/a",
            &message("a", now - 5, vec![figures("x.test", 30.0, 1.0, 0.0)]),
            known,
        );
        h.take(
            "p",
            "p/sites/b",
            &message(
                "b",
                now - 2,
                vec![
                    figures("x.test", 10.0, 0.0, 1.0),
                    figures("y.test", 1.0, 1.0, 0.0),
                ],
            ),
            known,
        );
        // 41 s old at a 10 s interval: stale.
        h.take(
            "p",
            "p/sites/c",
            &message("c", now - 41, vec![figures("x.test", 500.0, 1.0, 0.0)]),
            known,
        );
        // Names another node than its topic.
        h.take(
            "p",
            "p/sites/d",
            &message("a", now, vec![figures("x.test", 500.0, 1.0, 0.0)]),
            known,
        );
        h.take("p", "p/sites/zz", &message("zz", now, vec![]), known);
        h.take("p", "p/sites/a/b", b"{}", known);
        let top = summarize(&h, &nodes, now, None);
        assert_eq!(top.nodes, ["a", "b"]);
        assert_eq!(top.stale, BTreeMap::from([("c".to_owned(), 41)]));
        assert_eq!(top.refused.keys().collect::<Vec<_>>(), ["d"]);
        assert_eq!(top.silent, ["e"]);
        assert_eq!(h.unknown, ["zz"]);
        let x = &top.sites[0];
        assert_eq!((x.host.as_str(), x.nodes), ("x.test", 2));
        assert!((x.requests_per_s - 40.0).abs() < 1e-9);
        assert!((x.hit_ratio.unwrap() - 0.75).abs() < 1e-9);
        assert!((x.error_5xx_ratio.unwrap() - 0.25).abs() < 1e-9);
        let text = render(&top, 20);
        assert!(
            text.contains("x.test") && text.contains("75.0%") && text.contains("25.0%"),
            "{text}"
        );
        assert!(text.contains("stale: c (figures 41s old"), "{text}");
        assert!(text.contains("refused: d:"), "{text}");
        assert!(text.contains("no figures from: e"), "{text}");

        let one = summarize(&h, &nodes, now, Some("x.test"));
        let rows = one.by_node.as_ref().unwrap();
        assert_eq!(
            rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let text = render(&one, 20);
        assert!(
            text.lines()
                .any(|l| l.starts_with("all ") && l.contains("40.0")),
            "{text}"
        );
        // A cleared retained message forgets the node's figures.
        h.take("p", "p/sites/a", b"", known);
        assert_eq!(summarize(&h, &nodes, now, None).nodes, ["b"]);
    }

    #[test]
    fn a_hostile_host_name_is_printed_escaped() {
        let mut h = Heard::default();
        let nodes = vec!["a".to_owned()];
        h.take(
            "p",
            "p/sites/a",
            &message("a", 100, vec![figures("evil\u{1b}[2J.test", 1.0, 1.0, 0.0)]),
            |_| true,
        );
        let text = render(&summarize(&h, &nodes, 100, None), 20);
        assert!(!text.contains('\u{1b}'), "{text:?}");
    }
}
