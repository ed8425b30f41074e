//! The edge's per-site metrics and JSON access log (docs/edge.md,
//! "Per-site metrics and the access log") on the real reference edge
//! (nginx + Lua, harness::nginx) in front of real origins: exact counts by
//! status class, cache status, refusal reason, bytes and upstream time,
//! with `host` and `node` labels; a site beyond the cap counts under
//! `_other`; the viewers' port never serves the metrics; the access log's
//! line names the viewer behind a trusted proxy; USR1 reopens the log
//! (what the role's logrotate.conf sends).

use std::collections::BTreeMap;
use std::time::Duration;

use harness::nginx::{EdgeOptions, origin};

use harness::promtool_check_metrics;

use crate::util::{Answer, Fixture, edgeform, exchange, stderr, stdout};

fn get(port: u16, host: &str, path: &str, extra: &str) -> Answer {
    exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
        Duration::from_secs(20),
    )
}

/// The exposition's samples: `name{labels}` as rendered → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("a sample line");
            (k.to_owned(), v.parse().expect("a number"))
        })
        .collect()
}

fn scrape(url: &str) -> String {
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    let a = get(port, "127.0.0.1", "/metrics", "");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    a.body
}

fn series(name: &str, host: &str, label: Option<(&str, &str)>) -> String {
    match label {
        Some((k, v)) => format!("{name}{{node=\"edge-7\",host=\"{host}\",{k}=\"{v}\"}}"),
        None => format!("{name}{{node=\"edge-7\",host=\"{host}\"}}"),
    }
}

/// Requests to two sites — a MISS then a HIT, a refusal with its reason,
/// a 5xx from the origin — then `/metrics` on the metrics listener has
/// exactly those counts (promtool accepts the text); a third site past
/// the cap of two counts under `_other`; `/metrics` on the viewers' port
/// is a site's path like any other; the JSON log line names the viewer
/// behind the trusted proxy; after USR1 the edge writes a new log file.
#[test]
fn the_edge_counts_each_site_and_logs_json_lines() {
    let redis = harness::redis(&[]);
    let ok = origin("ok", 200);
    let bad = origin("bad", 500);
    let repo = Fixture::empty();
    repo.write(
        "cluster.yaml",
        b"name: test\ntrusted_proxies: [127.0.0.1/32]\n",
    );
    repo.write(
        "nodes/edge-7.yaml",
        crate::util::edge_1_node(redis.port)
            .replace("edge-1", "edge-7")
            .as_bytes(),
    );
    let sites = [
        (
            "a",
            format!(
                "origin: http://127.0.0.1:{}\n\
                 cache_rules: [{{match_type: ext, match_value: .txt, action: ttl, ttl: 600}}]\n\
                 edge_rules: [{{match_type: prefix, match_value: /admin, action: block}}]\n",
                ok.process.port
            ),
        ),
        (
            "b",
            format!(
                "origin: http://127.0.0.1:{}\ncached: false\n",
                bad.process.port
            ),
        ),
        (
            "c",
            format!("origin: http://127.0.0.1:{}\n", ok.process.port),
        ),
    ];
    for (name, body) in &sites {
        repo.write(
            &format!("sites/{name}.yaml"),
            format!("host: {name}.test\nloopback: true\n{body}").as_bytes(),
        );
    }
    let mut o = EdgeOptions::new(redis.port);
    o.node = "edge-7".into();
    o.metrics_hosts = 2;
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    // Until the edge has read the applied documents: 404, then 403.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while get(port, "a.test", "/admin", "").status != 403 {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never read the applied documents: {}",
            edge.error_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And until it has read the trusted proxies (at its next poll of the
    // generation): the log names the address the proxy appended.
    while !edge
        .access_log()
        .last()
        .is_some_and(|l| l.contains("198.51.100.77"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never trusted 127.0.0.1"
        );
        let _ = get(
            port,
            "nowhere.test",
            "/",
            "X-Forwarded-For: 198.51.100.77\r\n",
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = samples(&scrape(&edge.metrics_url()));

    let a = get(port, "a.test", "/f.txt", "");
    assert_eq!((a.status, a.header("x-cache-status")), (200, Some("MISS")));
    let a = get(port, "a.test", "/f.txt", "X-Forwarded-For: 203.0.113.9\r\n");
    assert_eq!((a.status, a.header("x-cache-status")), (200, Some("HIT")));
    let a = get(port, "a.test", "/admin/x", "");
    assert_eq!(
        (a.status, a.header("x-edgeform-reason")),
        (403, Some("edge-rule"))
    );
    let b = get(port, "b.test", "/y", "");
    assert_eq!(
        (b.status, b.header("x-cache-status")),
        (500, Some("BYPASS"))
    );
    let unknown = get(port, "nowhere.test", "/", "");
    assert_eq!(unknown.status, 404);
    let text = scrape(&edge.metrics_url());
    promtool_check_metrics(&text);
    let m = samples(&text);
    let delta = |k: &str| m.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let req = "edgeform_site_requests_total";
    assert_eq!(
        delta(&series(req, "a.test", Some(("class", "2xx")))),
        2.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(req, "a.test", Some(("class", "4xx")))),
        1.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(req, "b.test", Some(("class", "5xx")))),
        1.0,
        "{text}"
    );
    // Every class of a site is there from its first request, at 0 until
    // it counts one (a rate over a window with its first 5xx counts it).
    assert_eq!(
        m.get(&series(req, "a.test", Some(("class", "5xx")))),
        Some(&0.0),
        "{text}"
    );
    assert_eq!(
        delta(&series(req, "_unknown", Some(("class", "4xx")))),
        1.0,
        "{text}"
    );
    let cache = "edgeform_site_cache_total";
    assert_eq!(
        delta(&series(cache, "a.test", Some(("cache", "MISS")))),
        1.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(cache, "a.test", Some(("cache", "HIT")))),
        1.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(cache, "b.test", Some(("cache", "BYPASS")))),
        1.0,
        "{text}"
    );
    let refused = "edgeform_site_refusals_total";
    assert_eq!(
        delta(&series(refused, "a.test", Some(("reason", "edge-rule")))),
        1.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(
            refused,
            "_unknown",
            Some(("reason", "unknown-host"))
        )),
        1.0,
        "{text}"
    );
    // Bytes: at least the bodies sent (headers too).
    let bytes = delta(&series("edgeform_site_bytes_sent_total", "a.test", None));
    assert!(bytes > 100.0, "{text}");
    // Upstream time: the MISS and the 500 went upstream, the HIT and the
    // refusal did not.
    let up = "edgeform_site_upstream_seconds";
    assert_eq!(
        delta(&series(&format!("{up}_count"), "a.test", None)),
        1.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(&format!("{up}_count"), "b.test", None)),
        1.0,
        "{text}"
    );
    assert_eq!(
        delta(&series(
            &format!("{up}_bucket"),
            "b.test",
            Some(("le", "+Inf"))
        )),
        1.0,
        "{text}"
    );
    assert_eq!(
        m.get("edgeform_site_hosts_tracked{node=\"edge-7\"}"),
        Some(&2.0),
        "{text}"
    );

    // The sites' dashboard is valid JSON and uses only what the edge exports.
    let dashboard = std::fs::read_to_string(
        harness::nginx::repo_root().join("packaging/grafana/edgeform-sites-dashboard.json"),
    )
    .unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("valid JSON");
    let mut used = 0;
    for p in parsed["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("edgeform_site_") {
                let name: String = expr[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    m.keys().any(|k| k.starts_with(&format!("{name}{{"))),
                    "panel {}: {name} is not exported",
                    p["title"]
                );
                used += 1;
            }
        }
    }
    assert!(used >= 8, "{used}");

    // The third site: past the cap of two, under _other.
    let c = get(port, "c.test", "/z", "");
    assert_eq!(c.status, 200);
    let text = scrape(&edge.metrics_url());
    let m = samples(&text);
    assert_eq!(
        m.get(&series(req, "_other", Some(("class", "2xx")))),
        Some(&1.0),
        "{text}"
    );
    assert!(!text.contains("c.test"), "{text}");

    // The viewers' port: /metrics is a path of the site (here its origin's answer).
    let v = get(port, "a.test", "/metrics", "");
    assert!(!v.body.contains("edgeform_site_"), "{}", v.body);
    assert_eq!(v.header("x-origin"), Some("ok"));

    // The JSON log: the HIT's line names the viewer behind the trusted proxy.
    let lines = edge.access_log();
    let hit: serde_json::Value = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .find(|j| j["cache"] == "HIT")
        .unwrap_or_else(|| panic!("no HIT line in {lines:?}"));
    assert_eq!(hit["client"], "203.0.113.9", "{hit}");
    assert_eq!(hit["host"], "a.test");
    assert_eq!(hit["site"], "a.test");
    assert_eq!(hit["status"], 200);
    assert_eq!(hit["reason"], "");
    assert_eq!(hit["upstream_time"], "");
    assert!(hit["bytes"].as_u64().unwrap() > 0, "{hit}");
    let refusal = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|j| j["reason"] == "edge-rule")
        .expect("the refusal's line");
    assert_eq!(refusal["status"], 403);
    assert_eq!(refusal["client"], "127.0.0.1");
    let miss = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|j| j["cache"] == "MISS")
        .expect("the MISS's line");
    assert!(
        miss["upstream_time"]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .is_ok(),
        "{miss}"
    );

    // Rotation: the file moved away, USR1 (logrotate.conf's postrotate),
    // the next line goes to a new access.log.
    let dir = edge.process.dir.path();
    std::fs::rename(dir.join("access.log"), dir.join("access.log.1")).unwrap();
    let st = std::process::Command::new("kill")
        .args(["-USR1", &edge.process.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = get(port, "a.test", "/after-rotation.txt", "");
        if edge
            .access_log()
            .iter()
            .any(|l| l.contains("/after-rotation.txt"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no new access.log after USR1"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// With `metrics: off` the edge counts nothing (its /metrics has no
/// sample but the gauge), and with `access_log: off` it writes no line.
#[test]
fn metrics_and_the_access_log_can_be_turned_off() {
    let redis = harness::redis(&[]);
    let mut o = EdgeOptions::new(redis.port);
    o.metrics = false;
    o.access_log = false;
    let edge = harness::nginx::edge(&o);
    for _ in 0..3 {
        assert_eq!(get(edge.process.port, "x.test", "/", "").status, 404);
    }
    let text = scrape(&edge.metrics_url());
    promtool_check_metrics(&text);
    let m = samples(&text);
    assert_eq!(m.len(), 1, "{text}");
    assert!(edge.access_log().is_empty());
}

/// `edgeform top` end to end: a real edge counting two sites, a real
/// agent reading its /metrics (`health.edge_metrics`) and publishing the
/// figures on a real mosquitto, `top` reading them back: the requests of
/// one interval, exactly (as rates × the interval), hit and 5xx ratios,
/// refusals by reason; `--site` shows the site at each edge.
#[test]
fn edgeform_top_prints_each_sites_figures_from_the_agents() {
    let redis = harness::redis(&[]);
    let broker = harness::mosquitto();
    let ok = origin("ok", 200);
    let bad = origin("bad", 500);
    let repo = Fixture::empty();
    repo.write(
        "cluster.yaml",
        format!(
            "name: test\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n",
            broker.port
        )
        .as_bytes(),
    );
    repo.write(
        "nodes/edge-7.yaml",
        crate::util::edge_1_node(redis.port)
            .replace("edge-1", "edge-7")
            .as_bytes(),
    );
    repo.write(
        "sites/a.yaml",
        format!(
            "host: a.test\nloopback: true\norigin: http://127.0.0.1:{}\n\
             cache_rules: [{{match_type: ext, match_value: .txt, action: ttl, ttl: 600}}]\n\
             edge_rules: [{{match_type: prefix, match_value: /admin, action: block}}]\n",
            ok.process.port
        )
        .as_bytes(),
    );
    repo.write(
        "sites/b.yaml",
        format!(
            "host: b.test\nloopback: true\norigin: http://127.0.0.1:{}\ncached: false\n",
            bad.process.port
        )
        .as_bytes(),
    );
    let mut o = EdgeOptions::new(redis.port);
    o.node = "edge-7".into();
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while get(port, "a.test", "/admin", "").status != 403 {
        assert!(std::time::Instant::now() < deadline, "{}", edge.error_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The cache is warm before the agent's first read.
    assert_eq!(get(port, "a.test", "/f.txt", "").status, 200);

    let cache = tempfile::tempdir().unwrap();
    let _agent = crate::util::Agent::start(&format!(
        "node: edge-7\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
         cache: {{dirs: [{}]}}\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n\
         health: {{interval: 1s, edge_metrics: \"{}\"}}\n",
        redis.port,
        cache.path().display(),
        broker.port,
        edge.metrics_url()
    ));
    let top = |args: &[&str]| {
        let mut all = vec!["top", "--format", "json"];
        all.extend_from_slice(args);
        let out = edgeform(repo.path(), &all);
        let v: serde_json::Value =
            serde_json::from_str(&stdout(&out)).unwrap_or_else(|_| panic!("{}", stderr(&out)));
        (out.status.code(), v)
    };
    // The first figures (published after the agent's second read).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, v) = top(&[]);
        if code == Some(0) {
            assert_eq!(v["nodes"], serde_json::json!(["edge-7"]), "{v}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no figures: {v}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // One interval's requests, sent at once, right after a read.
    for _ in 0..20 {
        assert_eq!(get(port, "a.test", "/f.txt", "").status, 200);
    }
    for _ in 0..5 {
        assert_eq!(get(port, "a.test", "/admin/x", "").status, 403);
    }
    for _ in 0..4 {
        assert_eq!(get(port, "b.test", "/y", "").status, 500);
    }
    let interval = agent::config::SITES_MIN_INTERVAL.as_secs_f64();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let v = loop {
        let (_, v) = top(&[]);
        if v["sites"].as_array().is_some_and(|s| s.len() == 2) {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "no site figures: {v}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let site = |host: &str| {
        v["sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["host"] == host)
            .unwrap_or_else(|| panic!("{host}: {v}"))
            .clone()
    };
    let (a, b) = (site("a.test"), site("b.test"));
    // Rates over an interval of 10 s and a few milliseconds.
    let count = |x: &serde_json::Value| x.as_f64().unwrap() * interval;
    let near = |got: f64, want: f64| (got - want).abs() < want * 0.02;
    assert!(near(count(&a["requests_per_s"]), 25.0), "{v}");
    assert!(near(count(&a["refusals_per_s"]["edge-rule"]), 5.0), "{v}");
    assert!(near(count(&b["requests_per_s"]), 4.0), "{v}");
    assert_eq!(a["hit_ratio"], 1.0, "{v}");
    assert_eq!(a["error_5xx_ratio"], 0.0, "{v}");
    assert_eq!(b["error_5xx_ratio"], 1.0, "{v}");
    assert_eq!(
        (a["nodes"].as_u64(), b["nodes"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(b["p95_upstream_ms"].as_f64().is_some(), "{v}");

    let (code, one) = top(&["--site", "b.test"]);
    assert_eq!(code, Some(0), "{one}");
    assert_eq!(one["by_node"][0][0], "edge-7", "{one}");
    assert_eq!(one["sites"].as_array().map(Vec::len), Some(1), "{one}");
    let out = edgeform(repo.path(), &["top"]);
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.starts_with("a.test ") && l.contains("100.0%")),
        "{text}"
    );
    assert!(text.contains("over 1 edge(s) reporting"), "{text}");
}
