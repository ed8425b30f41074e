//! The edge's workers share what they read from Redis (docs/edge.md
//! "Freshness"): a real nginx with four workers and a real Redis. One read
//! of a host serves every worker; a Redis outage leaves the host serving
//! on workers that never read it themselves; a new generation replaces the
//! shared document on every worker within a poll.

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
    let edge = harness::nginx::edge(&o);
    let web = edge.process.port;
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(edge.worker_pids().len(), 4, "{}", edge.error_log());

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
    let old = edge.worker_pids();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &edge.process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t = Instant::now();
    while edge.worker_pids().iter().any(|p| old.contains(p)) || edge.worker_pids().len() < 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "no reload");
        std::thread::sleep(Duration::from_millis(50));
    }
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
