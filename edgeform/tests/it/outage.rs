//! The reference edge through a Redis outage under a flood of random
//! `Host`s: the real nginx with its Lua module, a real Redis killed
//! mid-test. Negative answers have their own cache, so the documents the
//! edge has read keep serving whatever the traffic (docs/edge.md,
//! "Freshness").

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use harness::nginx::EdgeOptions;

use crate::util::{Fixture, edgeform, stderr};

/// Send `hosts` as pipelined GETs on one keep-alive connection; the
/// status of each answer, in order.
fn pipelined(port: u16, hosts: &[String]) -> Vec<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut text = String::new();
    for (i, h) in hosts.iter().enumerate() {
        let close = if i + 1 == hosts.len() {
            "Connection: close\r\n"
        } else {
            ""
        };
        text.push_str(&format!("GET / HTTP/1.1\r\nHost: {h}\r\n{close}\r\n"));
    }
    s.write_all(text.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    raw.match_indices("HTTP/1.1 ")
        .filter(|(i, _)| *i == 0 || raw[..*i].ends_with('\n'))
        .filter_map(|(i, _)| raw[i + 9..].get(..3)?.parse().ok())
        .collect()
}

/// One GET: (status, X-Edgeform-Reason).
fn get(port: u16, host: &str) -> (u16, Option<String>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let reason = raw.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("x-edgeform-reason")
            .then(|| v.trim().to_owned())
    });
    (status, reason)
}

/// `n` random hosts (seeded): unknown names, and random subdomains of the
/// wildcard site.
fn random_hosts(n: usize, seed: u64) -> Vec<String> {
    let mut x = seed;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 4 == 0 {
                format!("r{x:x}.wild.test")
            } else {
                format!("r{x:x}.flood.test")
            }
        })
        .collect()
}

/// Flood the edge with `hosts`, 4 connections at a time, 500 pipelined
/// requests each (below nginx's 1,000 per connection); every status.
fn flood(port: u16, hosts: &[String]) -> Vec<u16> {
    let chunks: Vec<Vec<String>> = hosts.chunks(500).map(<[String]>::to_vec).collect();
    let mut out = Vec::new();
    for group in chunks.chunks(4) {
        let handles: Vec<_> = group
            .iter()
            .cloned()
            .map(|c| std::thread::spawn(move || pipelined(port, &c)))
            .collect();
        for h in handles {
            out.extend(h.join().unwrap());
        }
    }
    out
}

/// 20,100 random `Host`s (more than the document cache holds) before and
/// during a Redis outage: during it every unknown one is refused and every
/// one under the wildcard gets the wildcard's site (the warmed shared
/// cache holds every document), and the sites read before the outage — an
/// exact host and a host under a wildcard — still serve.
#[test]
fn a_random_host_flood_during_a_redis_outage_leaves_known_sites_serving() {
    let mut redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let cache = tempfile::tempdir().unwrap().keep();
    let repo = Fixture::empty();
    repo.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
             cache:\n  dirs: [\"{}\"]\n  levels: \"1:2\"\n  key: $scheme://$host$request_uri\n",
            redis.port,
            cache.display()
        )
        .as_bytes(),
    );
    for (file, host) in [
        ("sites/a.yaml", "a.test"),
        ("sites/b.yaml", "b.test"),
        ("sites/wild.yaml", "\"*.wild.test\""),
    ] {
        repo.write(
            file,
            format!(
                "host: {host}\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n"
            )
            .as_bytes(),
        );
    }
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let mut o = EdgeOptions::new(redis.port);
    o.cache_dir = Some(cache);
    o.workers = 1;
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    std::thread::sleep(Duration::from_millis(300));
    for host in ["a.test", "b.test", "shop.wild.test"] {
        assert_eq!(get(port, host).0, 200, "{host} before the flood");
    }
    // Redis up: every random host is unknown (404) or, under the
    // wildcard, the wildcard's site (200).
    let t = Instant::now();
    let before = flood(port, &random_hosts(20_100, 0x5eed));
    let up = t.elapsed();
    assert_eq!(before.len(), 20_100);
    assert!(before.iter().all(|s| *s == 404 || *s == 200), "{before:?}");
    assert_eq!(before.iter().filter(|s| **s == 200).count(), 5_025);
    // Redis down: the flood again, new names.
    redis.kill();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let during = flood(port, &random_hosts(20_100, 0xdead_beef));
    let down = t.elapsed();
    assert_eq!(during.len(), 20_100);
    for (i, s) in during.iter().enumerate() {
        let want = if i % 4 == 0 { 200 } else { 503 };
        assert_eq!(*s, want, "random host {i} during the outage");
    }
    assert_eq!(
        get(port, "r1.flood.test"),
        (503, Some("control-plane-unreachable".into()))
    );
    // The error log says so about once a second, not once a request.
    let lines = edge
        .error_log()
        .lines()
        .filter(|l| l.contains("redis unreachable for"))
        .count();
    let most = usize::try_from(down.as_secs()).unwrap_or(usize::MAX) + 5;
    assert!((1..=most).contains(&lines), "{lines} lines in {down:?}");
    // The sites read before the outage still serve.
    for host in ["a.test", "b.test", "shop.wild.test"] {
        assert_eq!(
            get(port, host),
            (200, None),
            "{host} after 40,200 random hosts, Redis down (flood {up:?} up, {down:?} down)\n{}",
            edge.error_log()
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn redis_run(port: u16, args: &[&str]) {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    c.exec(&mut con).unwrap();
}

/// GET `host` until it answers `want` (the edge polls every 200 ms) or
/// 5 s pass; the last status.
fn settle(port: u16, host: &str, want: u16) -> u16 {
    let t = Instant::now();
    loop {
        let s = get(port, host).0;
        if s == want || t.elapsed() > Duration::from_secs(5) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The edge's Redis loses its data — FLUSHALL, `edgeform:meta` deleted,
/// a restart without persistence, its generation going backwards — and
/// the sites the edge served keep serving from what it last read; a host
/// it never read gets what Redis has; the next write (a re-push) moves it
/// again, even to a lower generation.
#[test]
fn an_edge_whose_redis_loses_its_data_keeps_serving_the_sites_it_knew() {
    let mut redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let repo = Fixture::empty();
    repo.write(
        "nodes/edge-1.yaml",
        crate::util::edge_1_node(redis.port).as_bytes(),
    );
    for (file, host) in [
        ("sites/a.yaml", "a.test"),
        ("sites/b.yaml", "b.test"),
        ("sites/wild.yaml", "\"*.wild.test\""),
    ] {
        repo.write(
            file,
            format!(
                "host: {host}\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n"
            )
            .as_bytes(),
        );
    }
    let apply = || {
        let out = edgeform(repo.path(), &["apply", "--yes"]);
        assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    };
    apply();
    let mut o = EdgeOptions::new(redis.port);
    o.workers = 2;
    // Not warmed at start, so b.test is a host no worker has read.
    o.warm = false;
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    std::thread::sleep(Duration::from_millis(300));
    // Read by the edge: a.test and a host under the wildcard (b.test never).
    for _ in 0..4 {
        for host in ["a.test", "shop.wild.test"] {
            assert_eq!(get(port, host).0, 200, "{host} before");
        }
    }
    let known = |what: &str| {
        for _ in 0..4 {
            for host in ["a.test", "shop.wild.test"] {
                assert_eq!(
                    get(port, host),
                    (200, None),
                    "{host} after {what}\n{}",
                    edge.error_log()
                );
            }
        }
    };
    // FLUSHALL: the known sites serve; b.test, never read, is what Redis
    // has (nothing).
    redis_run(redis.port, &["FLUSHALL"]);
    std::thread::sleep(Duration::from_millis(500));
    known("FLUSHALL");
    assert_eq!(get(port, "b.test").0, 404);
    assert!(edge.error_log().contains("redis lost its data"));
    // The re-push (generation 1 again) moves the edge: b.test serves.
    apply();
    assert_eq!(settle(port, "b.test", 200), 200);
    known("the re-push");
    // edgeform:meta deleted with a site's document.
    redis_run(redis.port, &["DEL", "edgeform:meta", "site:a.test"]);
    std::thread::sleep(Duration::from_millis(500));
    known("DEL edgeform:meta");
    apply();
    // A restart without persistence.
    redis.restart();
    std::thread::sleep(Duration::from_millis(700));
    known("a Redis restart without persistence");
    apply();
    // The generation going backwards (an older snapshot) with a document
    // gone: held, until Redis moves again.
    redis_run(redis.port, &["HSET", "edgeform:meta", "generation", "99"]);
    std::thread::sleep(Duration::from_millis(500));
    known("generation 99");
    redis_run(redis.port, &["HSET", "edgeform:meta", "generation", "98"]);
    redis_run(redis.port, &["DEL", "site:a.test"]);
    std::thread::sleep(Duration::from_millis(500));
    known("the generation going backwards");
    // Then Redis moves (any new value): the edge follows what it has.
    redis_run(redis.port, &["HSET", "edgeform:meta", "generation", "100"]);
    assert_eq!(settle(port, "a.test", 404), 404);
    assert_eq!(get(port, "shop.wild.test").0, 200);
}

/// Wait until `key` exists in the Redis at `port` (10 s at most); how long
/// it took.
fn until_exists(port: u16, key: &str) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection())
            && redis::cmd("EXISTS")
                .arg(key)
                .query::<bool>(&mut c)
                .unwrap_or(false)
        {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The reconcile daemon (ticks an hour apart) re-pushes a target whose
/// Redis lost its data — FLUSHALL, `edgeform:meta` deleted, a restart
/// without persistence — within seconds, and the edge serves its known
/// site all along.
#[test]
fn the_daemon_re_pushes_at_once_a_target_whose_redis_lost_its_data() {
    let mut redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let repo = Fixture::empty();
    repo.write(
        "nodes/edge-1.yaml",
        crate::util::edge_1_node(redis.port).as_bytes(),
    );
    for (file, host) in [("sites/a.yaml", "a.test"), ("sites/b.yaml", "b.test")] {
        repo.write(
            file,
            format!(
                "host: {host}\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n"
            )
            .as_bytes(),
        );
    }
    repo.commit("sites");
    let log = tempfile::NamedTempFile::new().unwrap();
    // Its own state directory: the lease is not the machine's (or another
    // test's daemon's).
    let state = tempfile::tempdir().unwrap();
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["reconcile", "--sync-every", "1h", "--heal-every", "1h"])
        .current_dir(repo.path())
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", state.path().join("state"))
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let daemon_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
    assert!(
        until_exists(redis.port, "site:a.test").is_some(),
        "{}",
        daemon_log()
    );
    let mut o = EdgeOptions::new(redis.port);
    o.workers = 1;
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(port, "a.test").0, 200);
    // Let the first heal's tracking connection open (the first tick).
    std::thread::sleep(Duration::from_millis(1000));
    let mut took = Vec::new();
    for what in ["FLUSHALL", "DEL edgeform:meta", "restart"] {
        match what {
            "FLUSHALL" => redis_run(redis.port, &["FLUSHALL"]),
            "DEL edgeform:meta" => redis_run(redis.port, &["DEL", "edgeform:meta", "site:b.test"]),
            _ => redis.restart(),
        }
        assert_eq!(get(port, "a.test").0, 200, "a.test after {what}");
        let back = until_exists(redis.port, "edgeform:meta")
            .and_then(|t| until_exists(redis.port, "site:b.test").map(|u| t.max(u)));
        let Some(back) = back else {
            let _ = daemon.kill();
            panic!("not re-pushed after {what}:\n{}", daemon_log());
        };
        took.push((what, back));
        assert_eq!(settle(port, "b.test", 200), 200, "b.test after {what}");
        assert_eq!(get(port, "a.test").0, 200, "a.test after {what}");
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    eprintln!("re-pushed after: {took:?}");
    for (what, t) in took {
        assert!(t < Duration::from_secs(5), "{what}: re-pushed after {t:?}");
    }
}

/// The edge role's Redis settings (`roles/edge/redis-persistence.conf`,
/// included last) keep the documents across a crash: written, a second
/// and a half later kill -9, started again: still there.
#[test]
fn the_edge_roles_redis_persistence_keeps_the_documents_across_a_crash() {
    let conf = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../roles/edge/redis-persistence.conf")
        .canonicalize()
        .unwrap();
    let include = format!("include {}", conf.display());
    let mut redis = harness::redis(&[include.as_str()]);
    redis_run(
        redis.port,
        &["HSET", "edgeform:meta", "generation", "7", "commit", "c"],
    );
    redis_run(redis.port, &["SET", "site:a.test", "{}"]);
    std::thread::sleep(Duration::from_millis(1500));
    redis.kill();
    redis.restart();
    assert!(
        until_exists(redis.port, "site:a.test").is_some(),
        "{}",
        redis.log()
    );
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let g: Option<String> = redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("generation")
        .query(&mut c)
        .unwrap();
    assert_eq!(g.as_deref(), Some("7"));
}

/// nginx started while its Redis hangs (accepts, never answers: a frozen
/// host): the first poll finds it down and no request waits on it for the
/// generation again (before, every request of a worker that had not read a
/// generation yet waited the full Redis timeout); once Redis answers, the
/// edge serves from it.
#[test]
fn a_redis_hung_when_nginx_starts_holds_up_no_request_for_the_generation() {
    let redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let repo = Fixture::empty();
    repo.write(
        "nodes/edge-1.yaml",
        crate::util::edge_1_node(redis.port).as_bytes(),
    );
    repo.write(
        "sites/a.yaml",
        format!("host: a.test\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n")
            .as_bytes(),
    );
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let mut edge = harness::nginx::edge(&EdgeOptions::new(redis.port));
    let port = edge.process.port;
    let signal = |sig: &str| {
        let done = std::process::Command::new("kill")
            .args([sig, &redis.pid().to_string()])
            .status()
            .unwrap();
        assert!(done.success(), "kill {sig}");
    };
    signal("-STOP");
    // A full restart: a new master, no worker has read a generation.
    edge.process.restart();
    std::thread::sleep(Duration::from_millis(300));
    let waits: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let _ = get(port, "a.test");
            t.elapsed()
        })
        .collect();
    signal("-CONT");
    // The Redis timeout is 200 ms: a request that waited on Redis took at
    // least that. The document read itself still tries Redis once a
    // second (the unreachable answer's 1 s negative cache).
    let held = waits
        .iter()
        .filter(|w| **w >= Duration::from_millis(200))
        .count();
    assert!(
        held <= 6,
        "{held} of 20 requests waited on the hung Redis: {waits:?}\n{}",
        edge.error_log()
    );
    assert_eq!(settle(port, "a.test", 200), 200, "{}", edge.error_log());
}
