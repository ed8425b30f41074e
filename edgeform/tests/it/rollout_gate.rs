//! The rollout gate on live figures: a real Prometheus scraping the edges'
//! metrics every 500 ms, and `control::rollout::gate::judge` asking it
//! for each changed site's figures on the applied wave, before the
//! change and on the pending waves (docs/operations.md, "The gate").
//!
//! `judge_reads_each_figure_from_a_real_prometheus`: three metrics
//! listeners (real nginx serving the exposition text this test advances
//! every 250 ms, as an edge's counters advance) — so the figures are
//! exactly the ones chosen — scraped by the real Prometheus; the gate's
//! PromQL, its label matching and escaping, its windows and every
//! figure are checked against them, and a stopped Prometheus halts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use control::rollout::gate::{GateConfig, GateErrorKind, GateRequest, SiteGate, Verdict, judge};

/// Per second, per node and host: requests by class, refusals by
/// reason, cache statuses.
#[derive(Clone, Default)]
struct Rates {
    class: Vec<(&'static str, f64)>,
    refusals: Vec<(&'static str, f64)>,
    cache: Vec<(&'static str, f64)>,
}

fn healthy() -> Rates {
    Rates {
        class: vec![("2xx", 200.0)],
        refusals: vec![],
        cache: vec![("HIT", 180.0), ("MISS", 20.0)],
    }
}

/// The counters one node's metrics listener shows, advanced by `rates`
/// for `dt` seconds.
#[derive(Default)]
struct Counters(BTreeMap<(String, &'static str, String, &'static str), f64>);

impl Counters {
    fn advance(&mut self, host: &str, r: &Rates, dt: f64) {
        for (metric, list) in [
            ("edgeform_site_requests_total", &r.class),
            ("edgeform_site_refusals_total", &r.refusals),
            ("edgeform_site_cache_total", &r.cache),
        ] {
            for (label, per_s) in list {
                *self
                    .0
                    .entry((
                        host.to_owned(),
                        metric,
                        metric_label(metric).to_owned(),
                        label,
                    ))
                    .or_default() += per_s * dt;
            }
        }
    }

    fn exposition(&self, node: &str) -> String {
        let mut out = String::new();
        let mut typed = std::collections::BTreeSet::new();
        for ((host, metric, label, value), n) in &self.0 {
            if typed.insert(*metric) {
                let _ = writeln!(out, "# TYPE {metric} counter");
            }
            let host = host.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "{metric}{{node=\"{node}\",host=\"{host}\",{label}=\"{value}\"}} {}",
                n.floor()
            );
        }
        out
    }
}

fn metric_label(metric: &str) -> &'static str {
    match metric {
        "edgeform_site_requests_total" => "class",
        "edgeform_site_refusals_total" => "reason",
        _ => "cache",
    }
}

fn write_atomically(dir: &Path, text: &str) {
    let tmp = dir.join("metrics.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join("metrics")).unwrap();
}

/// Advance every node's counters for `for_` with `rates(node, host)`,
/// writing each node's exposition every 250 ms.
fn run_phase(
    nodes: &[(&str, tempfile::TempDir)],
    counters: &mut [Counters],
    hosts: &[&str],
    rates: impl Fn(&str, &str) -> Rates,
    for_: Duration,
) {
    let end = Instant::now() + for_;
    let mut last = Instant::now();
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(250));
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        for ((node, dir), c) in nodes.iter().zip(counters.iter_mut()) {
            for host in hosts {
                c.advance(host, &rates(node, host), dt);
            }
            write_atomically(dir.path(), &c.exposition(node));
        }
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn judge_reads_each_figure_from_a_real_prometheus() {
    let names = ["edge-1", "edge-2", "edge-3"];
    let nodes: Vec<(&str, tempfile::TempDir)> = names
        .iter()
        .map(|n| (*n, tempfile::tempdir().unwrap()))
        .collect();
    let mut counters: Vec<Counters> = names.iter().map(|_| Counters::default()).collect();
    let hosts = [
        "five.example.com",
        "geo.example.com",
        "cold.example.com",
        "fine.example.com",
        "quiet.example.com",
        "*.wild.example.com",
        "outage.example.com",
    ];
    // Before: every site healthy, "quiet" with 10 requests a second.
    let before_rates = |_: &str, host: &str| {
        if host == "quiet.example.com" {
            Rates {
                class: vec![("2xx", 10.0)],
                ..Rates::default()
            }
        } else {
            healthy()
        }
    };
    for ((node, dir), c) in nodes.iter().zip(counters.iter_mut()) {
        write_atomically(dir.path(), &c.exposition(node));
    }
    let listeners: Vec<harness::nginx::Edge> = nodes
        .iter()
        .map(|(_, d)| harness::nginx::static_origin(d.path()))
        .collect();
    let targets: Vec<String> = listeners
        .iter()
        .map(|l| format!("127.0.0.1:{}", l.process.port))
        .collect();
    let mut prom = harness::prometheus::prometheus(&targets, Duration::from_millis(500));
    prom.wait_targets_up(Duration::from_secs(20));

    run_phase(
        &nodes,
        &mut counters,
        &hosts,
        before_rates,
        Duration::from_secs(1),
    );
    let before_start = SystemTime::now();
    run_phase(
        &nodes,
        &mut counters,
        &hosts,
        before_rates,
        Duration::from_secs(4),
    );
    let before_end = SystemTime::now();
    // The canary wave (edge-1) applied: what each site does there now.
    run_phase(
        &nodes,
        &mut counters,
        &hosts,
        |node, host| match (node, host) {
            ("edge-1", "five.example.com") => Rates {
                class: vec![("2xx", 100.0), ("5xx", 100.0)],
                ..healthy()
            },
            ("edge-1", "geo.example.com") => Rates {
                class: vec![("2xx", 100.0), ("4xx", 100.0)],
                refusals: vec![("geo-blocked", 100.0)],
                cache: vec![("HIT", 90.0), ("MISS", 10.0)],
            },
            ("edge-1", "cold.example.com") => Rates {
                cache: vec![("HIT", 20.0), ("MISS", 180.0)],
                ..healthy()
            },
            // The origin fails for every edge, applied or not.
            (_, "outage.example.com") => Rates {
                class: vec![("2xx", 100.0), ("5xx", 100.0)],
                ..healthy()
            },
            (_, "quiet.example.com") => before_rates(node, host),
            _ => healthy(),
        },
        Duration::from_secs(4),
    );
    let bake = (before_end + Duration::from_millis(500), SystemTime::now());
    // One more scrape, so the bake window's end is in Prometheus.
    std::thread::sleep(Duration::from_millis(1200));

    let cfg = GateConfig {
        prometheus: Some(prom.url()),
        ..GateConfig::default()
    };
    let request = |changed: &[&str]| GateRequest {
        commit: "b".repeat(40),
        previous: "a".repeat(40),
        changed_hosts: changed.iter().map(|h| (*h).to_owned()).collect(),
        applied_nodes: vec!["edge-1".into()],
        pending_nodes: vec!["edge-2".into(), "edge-3".into()],
        before: (before_start, before_end),
        bake,
        site_gates: BTreeMap::new(),
    };
    let verdict = |changed: &[&str]| block_on(judge(&cfg, &request(changed))).unwrap();
    let halted = |changed: &[&str]| match verdict(changed) {
        Verdict::Halt {
            host,
            figure,
            before,
            after,
            threshold,
        } => (host, figure, before, after, threshold),
        v @ Verdict::Pass { .. } => panic!("{changed:?} passed: {v:?}"),
    };

    let (host, figure, before, after, threshold) = halted(&["five.example.com"]);
    assert_eq!(
        (host.as_str(), figure.as_str()),
        ("five.example.com", "5xx_ratio")
    );
    assert!(
        before < 0.01 && (0.35..0.65).contains(&after),
        "{before} → {after}"
    );
    assert!((threshold - 0.02).abs() < 1e-9);

    let (host, figure, _, after, _) = halted(&["geo.example.com"]);
    assert_eq!(
        (host.as_str(), figure.as_str()),
        ("geo.example.com", "refusal_ratio:geo-blocked")
    );
    assert!((0.35..0.65).contains(&after), "{after}");

    let (_, figure, before, after, _) = halted(&["cold.example.com"]);
    assert_eq!(figure, "hit_ratio");
    assert!(before > 0.85 && after < 0.15, "{before} → {after}");

    // Healthy sites, a wildcard host matched literally, and an outage the
    // pending waves share pass without a note; a site under min_requests
    // passes with one.
    assert_eq!(
        verdict(&[
            "fine.example.com",
            "*.wild.example.com",
            "outage.example.com"
        ]),
        Verdict::Pass { notes: vec![] }
    );
    let Verdict::Pass { notes } = verdict(&["quiet.example.com"]) else {
        panic!("a quiet site passes");
    };
    assert!(
        notes.len() == 1
            && notes[0].starts_with("quiet.example.com: ")
            && notes[0].ends_with("passed on bake time alone"),
        "{notes:?}"
    );

    // A site's own threshold: five.example.com tolerates 60 points more.
    let mut loose = request(&["five.example.com"]);
    loose.site_gates.insert(
        "five.example.com".into(),
        SiteGate {
            max_5xx_ratio_increase: Some(0.6),
            ..SiteGate::default()
        },
    );
    assert_eq!(
        block_on(judge(&cfg, &loose)).unwrap(),
        Verdict::Pass { notes: vec![] }
    );

    // An unreachable Prometheus halts with that reason, never a pass.
    prom.process.kill();
    let err = block_on(judge(&cfg, &request(&["fine.example.com"]))).unwrap_err();
    assert_eq!(err.kind, GateErrorKind::Unreachable, "{err}");
}
