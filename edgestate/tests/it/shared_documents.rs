//! The edge's workers share what they read from Redis (docs/edge.md
//! "Freshness"): a real nginx with four workers and a real Redis. One read
//! of a host serves every worker; a Redis outage leaves the host serving
//! on workers that never read it themselves; a new generation replaces the
//! shared document on every worker within a poll, and once one worker has
//! seen it every worker answers with it; a started edge warms the shared
//! cache with every document before a viewer asks.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One Redis command (RESP, binary-safe); the raw reply.
fn redis(port: u16, args: &[&str]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("redis");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(cmd.as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// How many MGETs Redis has answered (its command statistics): each is a
/// document lookup that missed every cache of the edge.
fn mgets(port: u16) -> u64 {
    let info = redis(port, &["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_mget:calls="))
        .map_or(0, |rest| {
            rest.split(',').next().unwrap().trim().parse().unwrap()
        })
}

/// A site whose every request the edge answers itself: a 301 to `to`.
fn document(to: &str) -> String {
    format!(
        "{{\"cache_rules\":[],\"cached\":false,\"cors_mode\":\"off\",\"edge_rules\":\
         [{{\"action\":\"redirect\",\"match_type\":\"prefix\",\"match_value\":\"/\",\
         \"redirect_status\":301,\"redirect_to\":\"{to}\"}}],\"geo_codes\":\"\",\
         \"geo_mode\":\"off\",\"hotlink_mode\":\"off\",\"ip_list\":\"\",\"ip_mode\":\"off\",\
         \"origin\":\"http://127.0.0.1:9\",\"rate_mode\":\"off\",\"waf_mode\":\"off\"}}"
    )
}

/// GET / for `host` on a new connection: status and Location.
fn get(port: u16, host: &str) -> (u16, Option<String>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let location = out.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("location")
            .then(|| v.trim().to_owned())
    });
    (status, location)
}

#[test]
fn one_redis_read_serves_every_worker_through_an_outage_until_the_next_generation() {
    let mut r = harness::redis(&[]);
    let port = r.port;
    redis(port, &["SET", "site:shared.test", &document("/one")]);
    redis(port, &["SET", "site:*.wild.test", &document("/wild-one")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "g1"]);
    let mut o = harness::nginx::EdgeOptions::new(port);
    o.workers = 4;
    // Not warmed at start: what a request reads is what is shared here.
    o.warm = false;
    let edge = harness::nginx::edge(&o);
    let web = edge.process.port;
    let t = Instant::now();
    while edge.worker_pids().len() < 4 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{}",
            edge.error_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(400));

    // The first request reads Redis once (one MGET: host and wildcard);
    // the next 60, on new connections spread over the workers, read nothing.
    for host in ["shared.test", "shop.wild.test"] {
        let before = mgets(port);
        let want = if host == "shared.test" {
            "/one"
        } else {
            "/wild-one"
        };
        for i in 0..61 {
            assert_eq!(get(web, host), (301, Some(want.into())), "{host} #{i}");
        }
        assert_eq!(
            mgets(port) - before,
            1,
            "{host}: Redis reads for 61 requests"
        );
    }

    // Redis down: every worker serves what any worker read (not 503 on a
    // worker that never read the host itself).
    r.kill();
    std::thread::sleep(Duration::from_millis(400));
    for i in 0..40 {
        assert_eq!(
            get(web, "shared.test"),
            (301, Some("/one".into())),
            "#{i} during the outage\n{}",
            edge.error_log()
        );
        assert_eq!(get(web, "shop.wild.test"), (301, Some("/wild-one".into())));
    }
    assert_eq!(get(web, "never-read.test").0, 503);

    // Redis back with a new generation: every worker serves the new
    // document within a poll (200 ms) and a little, none the shared old one.
    r.restart();
    redis(port, &["SET", "site:shared.test", &document("/two")]);
    redis(port, &["SET", "site:*.wild.test", &document("/wild-two")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "g2"]);
    let t = Instant::now();
    loop {
        let answers: Vec<_> = (0..40)
            .flat_map(|_| [get(web, "shared.test"), get(web, "shop.wild.test")])
            .collect();
        let new = [
            (301, Some("/two".to_owned())),
            (301, Some("/wild-two".to_owned())),
        ];
        if answers.iter().all(|a| new.contains(a)) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "still old after {:?}: {answers:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each worker polls the generation on its own timer; once any worker's
/// poll has seen an apply, the others follow on their next request (they
/// find the node's generation in the shared dict ahead of theirs and poll
/// then), not at their own next poll. Polls here are 4 s apart, and one
/// worker is restarted halfway through an interval, so the two timers
/// are ~2 s apart: without the catch-up the second worker would answer
/// with the old document for about 2 s after the first had the new one.
#[test]
fn once_any_worker_has_seen_an_apply_every_worker_answers_with_it() {
    let r = harness::redis(&[]);
    let port = r.port;
    redis(port, &["SET", "site:shared.test", &document("/one")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "1"]);
    let mut o = harness::nginx::EdgeOptions::new(port);
    o.workers = 2;
    o.warm = false;
    o.poll = Some(4.0);
    let edge = harness::nginx::edge(&o);
    let web = edge.process.port;
    let t = Instant::now();
    while edge.worker_pids().len() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{}",
            edge.error_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(2000));
    let old = edge.worker_pids();
    let status = std::process::Command::new("kill")
        .args(["-9", &old[0].to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t = Instant::now();
    while {
        let now = edge.worker_pids();
        now.len() < 2 || now.contains(&old[0])
    } {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{}",
            edge.error_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..20 {
        assert_eq!(get(web, "shared.test"), (301, Some("/one".into())), "#{i}");
    }

    redis(port, &["SET", "site:shared.test", &document("/two")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "2"]);
    // The first worker to poll (within 4 s) answers with the new document…
    let t = Instant::now();
    while get(web, "shared.test") != (301, Some("/two".into())) {
        assert!(t.elapsed() < Duration::from_secs(6), "{}", edge.error_log());
        std::thread::sleep(Duration::from_millis(10));
    }
    // …and from then on every worker does.
    let seen = Instant::now();
    let answers: Vec<_> = (0..40).map(|_| get(web, "shared.test")).collect();
    assert!(
        answers.iter().all(|a| *a == (301, Some("/two".into()))),
        "{:?} after the first new answer: {answers:?}",
        seen.elapsed()
    );
}

/// Redis emptied (FLUSHALL), then nginx reloaded: the new workers start
/// from the generation the node served (kept in the shared dict), so they
/// see the loss as a loss and serve the last known document, not 404 as a
/// node of generation "none" would; the next write (a heal) moves them.
#[test]
fn workers_started_after_redis_lost_its_data_keep_the_nodes_generation() {
    let r = harness::redis(&[]);
    let port = r.port;
    redis(port, &["SET", "site:shared.test", &document("/one")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "7"]);
    let mut o = harness::nginx::EdgeOptions::new(port);
    o.workers = 2;
    let edge = harness::nginx::edge(&o);
    let web = edge.process.port;
    assert_eq!(get(web, "shared.test"), (301, Some("/one".into())));

    redis(port, &["FLUSHALL"]);
    edge.reload();
    for i in 0..20 {
        assert_eq!(
            get(web, "shared.test"),
            (301, Some("/one".into())),
            "#{i} after the reload\n{}",
            edge.error_log()
        );
    }
    assert!(
        edge.error_log()
            .contains("redis lost its data (generation none, serving 7)"),
        "{}",
        edge.error_log()
    );

    // The heal's write (any generation but the lost one's "none").
    redis(port, &["SET", "site:shared.test", &document("/two")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "1"]);
    let t = Instant::now();
    while (0..10).any(|_| get(web, "shared.test") != (301, Some("/two".into()))) {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", edge.error_log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The error log's line that says the warm ended, once it is there.
fn warmed(edge: &harness::nginx::Edge) -> String {
    let t = Instant::now();
    loop {
        let log = edge.error_log();
        if let Some(line) = log.lines().find(|l| l.contains("warmed the shared cache")) {
            return line.to_owned();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no warm\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// nginx (re)started: one worker reads every document of its Redis into
/// the shared cache before any viewer asks, so a Redis lost right after
/// the start refuses none of them (suspended stays suspended), and a host
/// under a wildcard that no viewer asked for gets the wildcard's document
/// (the cache holds every document: the host has none of its own); a
/// reload does not warm again.
#[test]
fn a_started_edge_warms_the_shared_cache_and_serves_every_site_through_an_outage() {
    let mut r = harness::redis(&[]);
    let port = r.port;
    for i in 0..300 {
        redis(
            port,
            &[
                "SET",
                &format!("site:w{i}.test"),
                &document(&format!("/w{i}")),
            ],
        );
    }
    redis(port, &["SET", "suspended:w7.test", "1"]);
    redis(port, &["SET", "site:*.wild.test", &document("/wild")]);
    redis(port, &["SET", "site:own.wild.test", &document("/own")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "5"]);
    let mut o = harness::nginx::EdgeOptions::new(port);
    o.workers = 2;
    let edge = harness::nginx::edge(&o);
    let web = edge.process.port;
    let line = warmed(&edge);
    assert!(
        line.contains(
            "302 documents added of 302 read, 0 certificates added of 0 read (generation 5)"
        ),
        "{line}"
    );
    // One worker warmed; the other found it done. A reload's new workers
    // find it done too (the shared caches outlive a reload).
    edge.reload();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        edge.error_log().matches("warmed the shared cache").count(),
        1,
        "{}",
        edge.error_log()
    );

    r.kill();
    std::thread::sleep(Duration::from_millis(400));
    for i in 0..300 {
        let want = if i == 7 {
            (503, None)
        } else {
            (301, Some(format!("/w{i}")))
        };
        assert_eq!(
            get(web, &format!("w{i}.test")),
            want,
            "w{i}.test during the outage\n{}",
            edge.error_log()
        );
    }
    assert_eq!(get(web, "never-read.test").0, 503);
    for (host, want) in [
        ("never-asked.wild.test", "/wild"),
        ("own.wild.test", "/own"),
    ] {
        assert_eq!(
            get(web, host),
            (301, Some(want.to_owned())),
            "{host} during the outage\n{}",
            edge.error_log()
        );
    }
    // Not under the wildcard (its name, or two labels down: a wildcard
    // serves one label), never read: refused.
    for host in ["wild.test", "a.b.wild.test"] {
        assert_eq!(get(web, host).0, 503, "{host}");
    }
}

/// An edge on Redis `port` (its generation set to 1, unless one is set)
/// with a 1 MiB shared document cache, started and warmed: the edge and
/// its warm line.
fn small_edge(port: u16) -> (harness::nginx::Edge, String) {
    redis(port, &["HSETNX", "edgeform:meta", "generation", "1"]);
    let mut o = harness::nginx::EdgeOptions::new(port);
    o.docs_dict = Some("1m".into());
    let edge = harness::nginx::edge(&o);
    let line = warmed(&edge);
    (edge, line)
}

/// A shared cache too small for every document: the warm stops when it is
/// full (never evicting), says so, and every site still serves while
/// Redis answers.
#[test]
fn warming_a_shared_cache_too_small_for_every_document_stops_when_it_is_full() {
    let r = harness::redis(&[]);
    let port = r.port;
    let padding = "x".repeat(1500);
    for i in 0..2000 {
        redis(
            port,
            &[
                "SET",
                &format!("site:f{i}.test"),
                &document(&format!("/f{i}?{padding}")),
            ],
        );
    }
    let (edge, line) = small_edge(port);
    let web = edge.process.port;
    assert!(
        line.contains("edge_docs full, the rest are read on first use"),
        "{line}"
    );
    let added: u32 = line
        .split("cache: ")
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((50..2000).contains(&added), "{line}");
    for i in (0..2000).step_by(97) {
        assert_eq!(
            get(web, &format!("f{i}.test")),
            (301, Some(format!("/f{i}?{padding}"))),
            "f{i}.test\n{}",
            edge.error_log()
        );
    }
}

/// Send `sig` (`-STOP`, `-CONT`) to `pid`: a Redis frozen by SIGSTOP
/// accepts connections and never answers, so every read times out.
fn signal(pid: u32, sig: &str) {
    let done = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(done.success(), "kill {sig} {pid}");
}

/// A wildcard stands in for hosts nobody asked for during an outage only
/// while the shared cache holds every document: after a warm that stored
/// them all, and until one is evicted (a host of its own might then be
/// the one missing). A cache too small for them all never counts as
/// complete.
#[test]
fn a_wildcard_serves_unread_hosts_in_an_outage_only_while_the_cache_holds_every_document() {
    let r = harness::redis(&[]);
    let port = r.port;
    let padding = "x".repeat(1500);
    let set = |from: usize, to: usize| {
        for i in from..to {
            redis(
                port,
                &[
                    "SET",
                    &format!("site:e{i}.test"),
                    &document(&format!("/e{i}?{padding}")),
                ],
            );
        }
    };
    set(0, 150);
    redis(port, &["SET", "site:*.wild.test", &document("/wild")]);
    let (edge, line) = small_edge(port);
    let web = edge.process.port;
    assert!(line.contains("151 documents added of 151 read"), "{line}");
    let outage = |host: &str| {
        signal(r.pid(), "-STOP");
        let got = get(web, host);
        signal(r.pid(), "-CONT");
        got
    };
    assert_eq!(
        outage("first.wild.test"),
        (301, Some("/wild".to_owned())),
        "{}",
        edge.error_log()
    );
    // A site of its own under the wildcard, added after the warm and never
    // read: during an outage the wildcard stands in (the last known
    // state), and once Redis answers its own document serves it, the
    // stand-in not kept (the wildcard's document re-read in this
    // generation first, so a kept stand-in would be current).
    redis(port, &["SET", "site:late.wild.test", &document("/late")]);
    redis(port, &["HSET", "edgeform:meta", "generation", "2"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(web, "third.wild.test"), (301, Some("/wild".to_owned())));
    assert_eq!(outage("late.wild.test"), (301, Some("/wild".to_owned())));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        get(web, "late.wild.test"),
        (301, Some("/late".to_owned())),
        "{}",
        edge.error_log()
    );
    // More documents than the cache holds, each read once: the oldest are
    // evicted.
    set(150, 1000);
    redis(port, &["HSET", "edgeform:meta", "generation", "3"]);
    std::thread::sleep(Duration::from_millis(500));
    for i in 150..1000 {
        assert_eq!(get(web, &format!("e{i}.test")).0, 301, "e{i}.test");
    }
    // A host read under the wildcard (so the wildcard's document is in the
    // cache, just read) still is served by it; one never read is not.
    assert_eq!(get(web, "third.wild.test").0, 301);
    assert_eq!(
        outage("second.wild.test").0,
        503,
        "a wildcard standing in after an eviction\n{}",
        edge.error_log()
    );
    assert_eq!(outage("third.wild.test"), (301, Some("/wild".to_owned())));

    // Started again with more documents than fit: the warm stops when
    // full, and the cache never counts as complete.
    drop(edge);
    let (edge, line) = small_edge(port);
    let web = edge.process.port;
    assert!(line.contains("edge_docs full"), "{line}");
    signal(r.pid(), "-STOP");
    let got = get(web, "fourth.wild.test");
    signal(r.pid(), "-CONT");
    assert_eq!(got.0, 503, "{}", edge.error_log());
}
