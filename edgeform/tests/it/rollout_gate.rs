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

// ---- end to end: real edges, real traffic, the real daemon ----

fn node_yaml(name: &str, host: u8, redis_port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.{host}]\nredis: {{url: \"redis://127.0.0.1:{redis_port}\"}}\n"
    )
}

fn site_yaml(host: &str, origin_port: u16, extra: &str) -> String {
    format!("host: {host}\norigin: http://127.0.0.1:{origin_port}\nloopback: true\n{extra}")
}

/// A viewer in London (MaxMind's test database: GB) behind the trusted
/// proxy, asking `host` for `path`: the status.
/// 0 when the edge does not answer.
fn get(port: u16, host: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: 81.2.69.142\r\n\
         Connection: close\r\n\r\n"
    );
    let mut answer = Vec::new();
    if s.write_all(request.as_bytes()).is_err() || s.read_to_end(&mut answer).is_err() {
        return 0;
    }
    String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The load generator: one thread per edge asking each site in turn
/// (`a.test` and `c.test` one cached path, `b.test` a new path each
/// time), about 60 requests a second per site and edge, until `stop`.
fn load(
    ports: Vec<u16>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    ports
        .into_iter()
        .map(|port| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for host in ["a.test", "b.test", "c.test"] {
                        let path = if host == "b.test" {
                            format!("/u/{n}")
                        } else {
                            "/fixed".to_owned()
                        };
                        get(port, host, &path);
                        n += 1;
                    }
                    std::thread::sleep(Duration::from_millis(15));
                }
                n
            })
        })
        .collect()
}

fn commit_of(redis_port: u16) -> Option<String> {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis_port.to_string(),
            "HGET",
            edgestate::keys::META,
            "commit",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// Every commit a target's history names (`edgeform:history`).
fn history_commits(redis_port: u16) -> Vec<String> {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis_port.to_string(),
            "LRANGE",
            edgestate::keys::HISTORY,
            "0",
            "-1",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e["commit"].as_str().map(str::to_owned))
        .collect()
}

/// Three sites on three real edges under real traffic, a real Prometheus
/// scraping the edges' metrics listeners, the real reconcile daemon with
/// waves canary (edge-1, bake 5 s) → rest, `auto_rollback: true`:
/// - a good change rolls through both waves and completes;
/// - `b.test`'s origin moved to a dead port: the canary answers 502, the
///   gate halts after the canary naming `b.test` and `5xx_ratio`, the
///   other edges never receive the commit, the canary returns to the old
///   one, and the daemon's `edgeform_rollout_halted` says so;
/// - a geo block of the wrong country (GB, the viewers' own) on `c.test`
///   is caught by `refusal_ratio:geo-blocked`.
#[test]
fn the_gate_lets_a_good_change_through_and_stops_a_bad_one_after_the_canary() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let redis: Vec<harness::Process> = (0..3).map(|_| harness::redis(&[])).collect();
    let rports: Vec<u16> = redis.iter().map(|r| r.port).collect();
    let edges: Vec<harness::nginx::Edge> = (0..3)
        .map(|i| {
            let mut o = harness::nginx::EdgeOptions::new(rports[i]);
            o.node = format!("edge-{}", i + 1);
            harness::nginx::edge(&o)
        })
        .collect();
    let origin = harness::nginx::origin("ok", 200);
    let targets: Vec<String> = edges
        .iter()
        .map(|e| format!("127.0.0.1:{}", e.metrics_port))
        .collect();
    let prom = harness::prometheus::prometheus(&targets, Duration::from_millis(500));

    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cluster = |waves: bool| {
        let mut c = "name: test\ntrusted_proxies: [127.0.0.1/32]\n".to_owned();
        if waves {
            let _ = write!(
                c,
                "apply:\n  waves:\n    - {{name: canary, nodes: [edge-1], bake: 5s}}\n    - {{name: rest}}\n\
                 \x20 prometheus: {}\n  auto_rollback: true\n  gate: {{min_requests: 50}}\n",
                prom.url()
            );
        }
        c
    };
    let nodes: Vec<String> = (0..3)
        .map(|i| node_yaml(&format!("edge-{}", i + 1), 11 + i as u8, rports[i]))
        .collect();
    let op = origin.process.port;
    let f = crate::util::Fixture::with(&[
        ("cluster.yaml", &cluster(false)),
        ("nodes/edge-1.yaml", &nodes[0]),
        ("nodes/edge-2.yaml", &nodes[1]),
        ("nodes/edge-3.yaml", &nodes[2]),
        ("sites/a.yaml", &site_yaml("a.test", op, "")),
        ("sites/b.yaml", &site_yaml("b.test", op, "cached: false\n")),
        ("sites/c.yaml", &site_yaml("c.test", op, "")),
    ]);
    let repo = f.path();
    let run = |args: &[&str]| crate::util::edgeform_with_state(repo, &state, args);
    let c1 = f.commit("c1");
    let o = run(&["apply", "--yes"]);
    assert!(o.status.success(), "{}", crate::util::stderr(&o));
    for e in &edges {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(e.process.port, "a.test", "/fixed") != 200 {
            assert!(Instant::now() < deadline, "{}", e.error_log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let load = load(
        edges.iter().map(|e| e.process.port).collect(),
        Arc::clone(&stop),
    );
    prom.wait_targets_up(Duration::from_secs(20));
    // Traffic before the change.
    std::thread::sleep(Duration::from_secs(6));

    let (metrics, daemon) = crate::util::sync_daemon(repo, &state);
    let status = || {
        let o = run(&["rollout", "status", "--format", "json"]);
        assert!(o.status.success(), "{}", crate::util::stderr(&o));
        serde_json::from_str::<serde_json::Value>(&crate::util::stdout(&o)).unwrap()
    };
    // Until the rollout of `commit` is in `state`; meanwhile `check`.
    let wait_for = |commit: &str, want: &str, check: &dyn Fn()| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            check();
            let s = status();
            if s["rollout"]["commit"] == commit && s["rollout"]["state"] == want {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "rollout of {commit} not {want}: {s}\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };

    // A good change (a cache rule no request matches): both waves.
    f.write_all(&[
        ("cluster.yaml", &cluster(true)),
        (
            "sites/a.yaml",
            &site_yaml(
                "a.test",
                op,
                "cache_rules: [{match_type: prefix, match_value: /static/, action: ttl, ttl: 60}]\n",
            ),
        ),
    ]);
    let c2 = f.commit("c2: a cache rule");
    let s = wait_for(&c2, "complete", &|| {});
    assert_eq!(s["rollout"]["changed_hosts"], serde_json::json!(["a.test"]));
    assert!(rports.iter().all(|p| commit_of(*p).as_deref() == Some(&c2)));
    assert_ne!(c1, c2);

    // b.test's origin moved to a dead port: 502 on the canary.
    let dead = harness::free_port();
    f.write_all(&[(
        "sites/b.yaml",
        &site_yaml("b.test", dead, "cached: false\n"),
    )]);
    let c3 = f.commit("c3: b.test to a dead origin");
    let never_elsewhere = || {
        for p in &rports[1..] {
            assert_eq!(
                commit_of(*p).as_deref(),
                Some(c2.as_str()),
                "edge beyond the canary moved"
            );
        }
    };
    let s = wait_for(&c3, "aborted", &never_elsewhere);
    let by = s["rollout"]["by"].as_str().unwrap_or_default().to_owned();
    assert!(by.contains("b.test") && by.contains("5xx_ratio"), "{s}");
    assert!(
        daemon.log().contains("rollout halted by the gate"),
        "{}",
        daemon.log()
    );
    assert_eq!(
        commit_of(rports[0]).as_deref(),
        Some(c2.as_str()),
        "the canary is back"
    );
    assert!(
        history_commits(rports[0]).contains(&c3),
        "the canary had it"
    );
    for p in &rports[1..] {
        assert!(!history_commits(*p).contains(&c3), "never received it");
    }
    let m = crate::util::exchange(
        metrics,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .body;
    assert!(
        m.lines().any(|l| l.starts_with("edgeform_rollout_halted{")
            && l.contains(&c3)
            && l.ends_with(" 1")),
        "{m}"
    );

    // A geo block of the wrong country: GB, where the viewers are.
    f.write_all(&[
        ("sites/b.yaml", &site_yaml("b.test", op, "cached: false\n")),
        (
            "sites/c.yaml",
            &site_yaml("c.test", op, "geo_mode: block\ngeo_codes: [GB]\n"),
        ),
    ]);
    let c4 = f.commit("c4: c.test blocks GB");
    let s = wait_for(&c4, "aborted", &never_elsewhere);
    let by = s["rollout"]["by"].as_str().unwrap_or_default().to_owned();
    assert!(
        by.contains("c.test") && by.contains("refusal_ratio:geo-blocked"),
        "{s}"
    );
    assert_eq!(commit_of(rports[0]).as_deref(), Some(c2.as_str()));

    stop.store(true, Ordering::Relaxed);
    let sent: u64 = load.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(sent > 1000, "the load generator sent {sent} requests");
}
