//! `edgeform purge`: jobs on the right queues, patterns checked with the
//! agent's engine, `--wait` reporting per node and timing out by name.

use crate::util::{Fixture, edgeform, edgeform_with_state, stderr, stdout};

fn edge(name: &str, region: &str, port: u16, key: &str) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: {region}\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {{url: \"redis://127.0.0.1:{port}\"}}\ncache: {{key: \"{key}\"}}\n"
    )
}

fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn queued(port: u16, queue: &str) -> Vec<serde_json::Value> {
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(queue)
        .arg(0)
        .arg(-1)
        .query(&mut con(port))
        .unwrap();
    items
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect()
}

fn setup(eu: u16, us: u16) -> Fixture {
    Fixture::with(&[
        (
            "nodes/edge-1.yaml",
            &*edge("edge-1", "eu", eu, "$scheme://$host$request_uri"),
        ),
        (
            "nodes/edge-2.yaml",
            &*edge("edge-2", "us", us, "$host$uri$is_args$args"),
        ),
        (
            "sites/a.yaml",
            "host: a.example.com\naliases: [www.a.example.com]\norigin: http://192.0.2.1\n",
        ),
        (
            "sites/eu.yaml",
            "host: eu.example.com\norigin: http://192.0.2.2\nregions: [eu]\n",
        ),
    ])
}

#[test]
fn jobs_land_on_every_carrier_with_its_own_key_template() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let f = setup(r1.port, r2.port);
    let out = edgeform(
        f.path(),
        &["purge", "--site", "a.example.com", "--url", "/v/a.mp4?x=1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = stdout(&out).trim().to_owned();
    let j1 = &queued(r1.port, "cdn:purge:eu:edge-1")[0];
    let j2 = &queued(r2.port, "cdn:purge:us:edge-2")[0];
    assert_eq!(j1["id"], id.as_str());
    assert_eq!(j2["id"], id.as_str());
    assert_eq!(j1["site"], "a.example.com");
    // Both schemes, host and alias, each node's template.
    let k1: Vec<&str> = j1["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(
        k1,
        [
            "http://a.example.com/v/a.mp4?x=1",
            "http://www.a.example.com/v/a.mp4?x=1",
            "https://a.example.com/v/a.mp4?x=1",
            "https://www.a.example.com/v/a.mp4?x=1"
        ]
    );
    assert!(
        j2["keys"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("a.example.com/v/a.mp4?x=1"))
    );

    // A full URL: that scheme and host only.
    let out = edgeform(
        f.path(),
        &[
            "purge",
            "--site",
            "a.example.com",
            "--url",
            "https://www.a.example.com/b",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let j = &queued(r1.port, "cdn:purge:eu:edge-1")[1];
    assert_eq!(
        j["keys"],
        serde_json::json!(["https://www.a.example.com/b"])
    );

    // A prefix: a grep job over the KEY line, checked by the agent's engine.
    let out = edgeform(
        f.path(),
        &["purge", "--site", "a.example.com", "--prefix", "/img/"],
    );
    assert_eq!(out.status.code(), Some(0));
    let grep = queued(r1.port, "cdn:purge:eu:edge-1")[2]["grep"]
        .as_str()
        .unwrap()
        .to_owned();
    let re = edgestate::purge::matcher(&grep).unwrap();
    assert!(re.is_match(b"KEY: https://www.a.example.com/img/x.png"));
    assert!(!re.is_match(b"KEY: http://a.example.com/css/x.css"));

    // A region-limited site goes to its region's edges only.
    let out = edgeform(f.path(), &["purge", "--site", "eu.example.com", "--all"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(queued(r1.port, "cdn:purge:eu:edge-1").len(), 4);
    assert_eq!(queued(r2.port, "cdn:purge:us:edge-2").len(), 3);
}

#[test]
fn bad_requests_queue_nothing() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let f = setup(r1.port, r2.port);
    // Four keys (two schemes, two hostnames) of a 20 kB URL: more than an
    // agent takes in one job.
    let long = format!("/{}", "a".repeat(20_000));
    for (args, says) in [
        (
            vec!["--site", "a.example.com", "--url", long.as_str()],
            "over the 65536 its agent takes",
        ),
        (
            vec!["--site", "a.example.com", "--regex", "(?=lookahead)"],
            "refuses",
        ),
        (
            vec!["--site", "a.example.com", "--regex", "(a)\\1"],
            "refuses",
        ),
        (
            vec!["--site", "nope.example.com", "--all"],
            "no site has the hostname",
        ),
        (
            vec![
                "--site",
                "a.example.com",
                "--url",
                "https://other.example.com/x",
            ],
            "not a hostname of site",
        ),
        (
            vec!["--site", "a.example.com", "--prefix", "img/"],
            "must start with `/`",
        ),
        (
            vec!["--site", "eu.example.com", "--all", "--node", "edge-2"],
            "not an edge",
        ),
    ] {
        let mut a = vec!["purge"];
        a.extend(args.iter().copied());
        let out = edgeform(f.path(), &a);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    // Two patterns at once is a usage error (exit 2 from clap).
    let out = edgeform(
        f.path(),
        &[
            "purge",
            "--site",
            "a.example.com",
            "--all",
            "--prefix",
            "/x",
        ],
    );
    // A usage error: EX_USAGE (64), not clap's 2.
    assert_eq!(out.status.code(), Some(64));
    assert!(queued(r1.port, "cdn:purge:eu:edge-1").is_empty());
    assert!(queued(r2.port, "cdn:purge:us:edge-2").is_empty());
}

#[test]
fn wait_reports_each_node_and_names_the_pending_on_timeout() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let f = setup(r1.port, r2.port);
    // A stand-in worker on edge-1 only: takes the job, records a count.
    let port = r1.port;
    let worker = std::thread::spawn(move || {
        let mut c = con(port);
        let job: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("cdn:purge:eu:edge-1")
            .arg(10)
            .query(&mut c)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&job.unwrap().1).unwrap();
        let id = v["id"].as_str().unwrap().to_owned();
        redis::cmd("HSET")
            .arg(format!("cdn:purge:done:{id}"))
            .arg("edge-1")
            .arg("3")
            .exec(&mut c)
            .unwrap();
    });
    let out = edgeform(
        f.path(),
        &["purge", "--site", "a.example.com", "--all", "--wait", "2"],
    );
    worker.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("edge-1: 3 file(s) removed"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("still pending: edge-2"),
        "{}",
        stderr(&out)
    );
    // Failed results are shown and exit 1.
    redis::cmd("DEL")
        .arg("cdn:purge:us:edge-2")
        .exec(&mut con(r2.port))
        .unwrap();
    let port = r2.port;
    let worker = std::thread::spawn(move || {
        let mut c = con(port);
        let job: Option<(String, String)> = redis::cmd("BRPOP")
            .arg("cdn:purge:us:edge-2")
            .arg(10)
            .query(&mut c)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&job.unwrap().1).unwrap();
        let id = v["id"].as_str().unwrap().to_owned();
        redis::cmd("HSET")
            .arg(format!("cdn:purge:done:{id}"))
            .arg("edge-2")
            .arg("failed: disk on fire")
            .exec(&mut c)
            .unwrap();
    });
    let out = edgeform(
        f.path(),
        &[
            "purge",
            "--site",
            "a.example.com",
            "--all",
            "--node",
            "edge-2",
            "--wait",
            "5",
        ],
    );
    worker.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("edge-2: failed: disk on fire"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The in-process agent of `name` on its own Redis and cache folder.
fn agent_for(name: &str, redis: u16, cache: &std::path::Path) -> crate::util::Agent {
    crate::util::Agent::start(&format!(
        "node: {name}\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
         cache: {{dirs: [\"{}\"], levels: \"1:2\"}}\n",
        cache.display()
    ))
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// `purge --wait` to many agents: all at once, woken by the agents.
#[test]
fn wait_hears_every_real_agent_and_names_a_node_whose_redis_is_down() {
    let redises: Vec<harness::Process> = (0..3).map(|_| harness::redis(&[])).collect();
    let down = closed_port();
    let caches: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let levels = agent::cache::Levels::parse("1:2").unwrap();
    let key = "$scheme://$host$request_uri";
    let mut files = Vec::new();
    let mut repo: Vec<(String, String)> = vec![(
        "sites/a.yaml".into(),
        "host: a.example.com\norigin: http://192.0.2.1\n".into(),
    )];
    for (i, (r, c)) in redises.iter().zip(&caches).enumerate() {
        let name = format!("edge-{}", i + 1);
        repo.push((format!("nodes/{name}.yaml"), edge(&name, "eu", r.port, key)));
        for k in [
            "http://a.example.com/v/a.mp4",
            "https://a.example.com/v/a.mp4",
        ] {
            files.push(agent::cache::write_cache_file(c.path(), &levels, k, b"body").unwrap());
        }
    }
    repo.push(("nodes/edge-9.yaml".into(), edge("edge-9", "eu", down, key)));
    let docs: Vec<(&str, &str)> = repo.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    let f = crate::util::Fixture::with(&docs);
    let _agents: Vec<_> = redises
        .iter()
        .zip(&caches)
        .enumerate()
        .map(|(i, (r, c))| agent_for(&format!("edge-{}", i + 1), r.port, c.path()))
        .collect();
    // No state store to keep a job in: the down node's job is lost.
    let out = edgeform_with_state(
        f.path(),
        std::path::Path::new("/dev/null/state"),
        &[
            "purge",
            "--site",
            "a.example.com",
            "--url",
            "/v/a.mp4",
            "--wait",
            "20",
        ],
    );
    // One node not queued: exit 1, the others still finish and are shown.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    for name in ["edge-1", "edge-2", "edge-3"] {
        assert!(
            stdout(&out).contains(&format!("{name}: 2 file(s) removed")),
            "{}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    assert!(
        stderr(&out).contains(&format!("edge-9: NOT QUEUED (redis://127.0.0.1:{down})")),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("on 3 node(s): edge-1, edge-2, edge-3"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("still pending"), "{}", stderr(&out));
    assert!(
        files.iter().all(|p| !p.exists()),
        "every cached copy removed"
    );
}

/// A stand-in worker for edge-1: takes the job, waits `delay`, then
/// records `value` (and announces it when `announce`).
fn stand_in(
    port: u16,
    delay: std::time::Duration,
    value: &'static str,
    announce: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = con(port);
        let job: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("cdn:purge:eu:edge-1")
            .arg(10)
            .query(&mut c)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&job.unwrap().1).unwrap();
        let key = format!("cdn:purge:done:{}", v["id"].as_str().unwrap());
        std::thread::sleep(delay);
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("HSET").arg(&key).arg("edge-1").arg(value);
        if announce {
            pipe.cmd("PUBLISH").arg(&key).arg("edge-1");
        }
        pipe.exec(&mut c).unwrap();
    })
}

// The announcement wakes the wait; the slow poll is the fallback.
#[test]
fn wait_is_woken_by_the_announcement_and_polls_slowly_without_one() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let f = setup(r1.port, r2.port);
    let purge = |wait: &str| {
        edgeform(
            f.path(),
            &[
                "purge",
                "--site",
                "a.example.com",
                "--all",
                "--node",
                "edge-1",
                "--wait",
                wait,
            ],
        )
    };
    // Announced 300 ms after the job was taken, with a 1 s deadline: only
    // the announcement can deliver it in time (the fallback poll comes a
    // full second after the first read, past the deadline).
    let worker = stand_in(r1.port, std::time::Duration::from_millis(300), "4", true);
    let out = purge("1");
    worker.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("edge-1: 4 file(s) removed"),
        "{}",
        stdout(&out)
    );
    // The same result without an announcement (an agent older than it):
    // missed within 1 s, found by the poll with a longer wait.
    let worker = stand_in(r1.port, std::time::Duration::from_millis(300), "5", false);
    let out = purge("1");
    worker.join().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("still pending: edge-1"),
        "{}",
        stderr(&out)
    );
    let worker = stand_in(r1.port, std::time::Duration::from_millis(300), "6", false);
    let t = std::time::Instant::now();
    let out = purge("10");
    worker.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("edge-1: 6 file(s) removed"),
        "{}",
        stdout(&out)
    );
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

/// How many times `command` ran on the Redis at `port` (`INFO
/// commandstats`), 0 when never.
fn calls(port: u16, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con(port))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

// `ROLE` and `SUBSCRIBE` go out together: a node whose URL names a
// replica is refused before anything is written there, with and without
// --wait, even when that replica would accept the write
// (`replica-read-only no`).
#[test]
fn a_replica_is_refused_before_anything_is_queued_there() {
    let master = harness::redis(&[]);
    let replica = harness::redis(&[
        &format!("replicaof 127.0.0.1 {}", master.port),
        "replica-read-only no",
    ]);
    let f = setup(replica.port, master.port);
    for wait in [None, Some("1")] {
        let mut args = vec![
            "purge",
            "--site",
            "a.example.com",
            "--url",
            "/a.mp4",
            "--node",
            "edge-1",
        ];
        args.extend(wait.iter().flat_map(|w| ["--wait", w]));
        let out = edgeform_with_state(f.path(), std::path::Path::new("/dev/null/state"), &args);
        assert_eq!(out.status.code(), Some(1), "{wait:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!(
                "edge-1: NOT QUEUED (redis://127.0.0.1:{}): redis://127.0.0.1:{} is not a master",
                replica.port, replica.port
            )),
            "{wait:?}: {err}"
        );
        assert!(err.contains("on no node"), "{wait:?}: {err}");
    }
    // Never written: no RPUSH reached the replica, nothing is queued on
    // either server.
    assert_eq!(calls(replica.port, "rpush"), 0);
    assert_eq!(calls(replica.port, "role"), 2);
    assert!(queued(replica.port, "cdn:purge:eu:edge-1").is_empty());
    assert!(queued(master.port, "cdn:purge:eu:edge-1").is_empty());
}

// Purge reads the config without the git status: a broken repository is
// still refused whole, with the same file:line:col diagnostics as
// `check`, and nothing is queued.
#[test]
fn a_broken_repository_queues_nothing_and_says_where() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let f = setup(r1.port, r2.port);
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.9\nbogus_key: 1\n",
    );
    let out = edgeform(
        f.path(),
        &["purge", "--site", "a.example.com", "--url", "/a.mp4"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("sites/b.yaml:3:1"), "{err}");
    assert!(err.contains("is invalid (1 error"), "{err}");
    assert!(queued(r1.port, "cdn:purge:eu:edge-1").is_empty());
    assert!(queued(r2.port, "cdn:purge:us:edge-2").is_empty());
}

/// `edgeform purge --site a.example.com --url <url>` with its own state.
fn purge_url(repo: &std::path::Path, state: &std::path::Path, url: &str) -> std::process::Output {
    edgeform_with_state(
        repo,
        state,
        &["purge", "--site", "a.example.com", "--url", url],
    )
}

fn ids(port: u16, queue: &str) -> Vec<String> {
    queued(port, queue)
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect()
}

fn kept(state: &std::path::Path, node: &str) -> usize {
    std::fs::read_dir(state.join("outbox").join(node)).map_or(0, |d| d.count())
}

// A node whose Redis is down gets every purge when it returns: kept in
// the outbox (fsync'd), delivered in order before a newer job, queued
// again when its Redis restarts empty, dropped once the agent records it;
// an agent runs a re-delivered id no second time.
#[test]
fn a_purge_for_a_stopped_redis_is_kept_and_delivered_in_order_when_it_returns() {
    let mut r = harness::redis(&[]);
    let port = r.port;
    let cache = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    let key = "$scheme://$host$request_uri";
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &*edge("edge-1", "eu", port, key)),
        (
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n",
        ),
    ]);
    let queue = "cdn:purge:eu:edge-1";
    let purge = |url: &str| purge_url(f.path(), &state, url);
    r.stop();
    let mut spooled = Vec::new();
    for url in ["/v/1.mp4", "/v/2.mp4"] {
        let out = purge(url);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("edge-1: SPOOLED (redis://127.0.0.1:{port})")),
            "{}",
            stderr(&out)
        );
        spooled.push(stdout(&out).trim().to_owned());
    }
    assert_eq!(kept(&state, "edge-1"), 2);
    // Still down: --flush keeps them and says so (exit 3).
    let out = edgeform_with_state(f.path(), &state, &["purge", "--flush"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("edge-1: 2 kept, not delivered"),
        "{}",
        stdout(&out)
    );

    // Back (empty): a newer purge goes behind the kept ones.
    r.restart();
    let out = purge("/v/3.mp4");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let third = stdout(&out).trim().to_owned();
    let mut order = spooled.clone();
    order.push(third.clone());
    assert_eq!(ids(port, queue), order);
    // Delivered, not done: still tracked.
    assert_eq!(kept(&state, "edge-1"), 2);

    // Restarted without persistence: the queue is lost; --flush queues the
    // tracked jobs again, in order (the newer one was never kept).
    r.restart();
    assert!(ids(port, queue).is_empty());
    let out = edgeform_with_state(f.path(), &state, &["purge", "--flush"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("edge-1: 0 queued, 2 queued again, 0 done, 2 tracked"),
        "{}",
        stdout(&out)
    );
    assert_eq!(ids(port, queue), spooled);

    // A real agent runs them; the reconcile daemon's run drops them once
    // recorded.
    let levels = agent::cache::Levels::parse("1:2").unwrap();
    let file =
        agent::cache::write_cache_file(cache.path(), &levels, "http://a.example.com/v/1.mp4", b"x")
            .unwrap();
    let _agent = agent_for("edge-1", port, cache.path());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !ids(port, queue).is_empty() || file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent ran the jobs"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = edgeform_with_state(f.path(), &state, &["reconcile", "--once", "heal"]);
    assert_eq!(kept(&state, "edge-1"), 0, "recorded jobs leave the outbox");

    // The first id queued again by hand: recorded, so not run again (a
    // new copy of the object stays cached).
    let file =
        agent::cache::write_cache_file(cache.path(), &levels, "http://a.example.com/v/1.mp4", b"y")
            .unwrap();
    let first = serde_json::json!({"id": spooled[0], "site": "a.example.com",
        "keys": ["http://a.example.com/v/1.mp4", "https://a.example.com/v/1.mp4"]});
    redis::cmd("RPUSH")
        .arg(queue)
        .arg(first.to_string())
        .exec(&mut con(port))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ids(port, queue).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent took the job"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(file.exists(), "an id already recorded is not run again");
}

// A node whose Redis took the connection and answers nothing (frozen)
// holds nobody up: its job is kept in time while the other node's is
// queued; kept jobs of a node the repository given lacks stay kept; and a
// kept job found on its node though never marked delivered is marked, so
// newer purges go straight to the node again.
#[test]
fn a_frozen_redis_is_given_up_in_time_and_its_job_kept_never_dropped() {
    let r1 = harness::redis(&[]);
    let r2 = harness::redis(&[]);
    let f = setup(r1.port, r2.port);
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    let purge = |url: &str| purge_url(f.path(), &state, url);
    r2.freeze();
    let started = std::time::Instant::now();
    let out = purge("/frozen.mp4");
    let took = started.elapsed();
    r2.thaw();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("edge-2: SPOOLED") && stderr(&out).contains("no answer in 10 s"),
        "{}",
        stderr(&out)
    );
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");
    let id = stdout(&out).trim().to_owned();
    assert_eq!(
        ids(r1.port, "cdn:purge:eu:edge-1"),
        std::slice::from_ref(&id)
    );
    assert_eq!(kept(&state, "edge-2"), 1);

    // The wrong repository for --flush: edge-2's job is left kept.
    let other = Fixture::with(&[
        (
            "nodes/edge-1.yaml",
            &*edge("edge-1", "eu", r1.port, "$scheme://$host$request_uri"),
        ),
        (
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n",
        ),
    ]);
    let out = edgeform_with_state(other.path(), &state, &["purge", "--flush"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("edge-2: 1 kept for a node this repository does not have; left kept"),
        "{}",
        stdout(&out)
    );
    assert_eq!(kept(&state, "edge-2"), 1);

    // The job reached the node by another way (a run stopped before
    // marking it): the flush finds it there, queues no second copy and
    // marks it, and the next purge is queued directly.
    let job: String = std::fs::read_dir(state.join("outbox/edge-2"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .map(|t| {
            serde_json::from_str::<serde_json::Value>(&t).unwrap()["job"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .next()
        .unwrap();
    redis::cmd("RPUSH")
        .arg("cdn:purge:us:edge-2")
        .arg(&job)
        .exec(&mut con(r2.port))
        .unwrap();
    let out = edgeform_with_state(f.path(), &state, &["purge", "--flush"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("edge-2: 0 queued, 0 queued again, 0 done, 1 tracked"),
        "{}",
        stdout(&out)
    );
    let out = purge("/next.mp4");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let next = stdout(&out).trim().to_owned();
    assert_eq!(ids(r2.port, "cdn:purge:us:edge-2"), [id, next]);
}

// No writable state store: the job is not kept, `NOT QUEUED`, exit 1.
#[test]
fn a_purge_that_cannot_be_kept_says_so_and_exits_1() {
    let down = closed_port();
    let f = Fixture::with(&[
        (
            "nodes/edge-1.yaml",
            &*edge("edge-1", "eu", down, "$host$uri"),
        ),
        (
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n",
        ),
    ]);
    let out = edgeform_with_state(
        f.path(),
        std::path::Path::new("/dev/null/state"),
        &["purge", "--site", "a.example.com", "--all"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("edge-1: NOT QUEUED (redis://127.0.0.1:{down})")),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("not kept"), "{}", stderr(&out));
}

/// A replica's `INFO replication` says its link to the master is up.
fn linked(replica: u16) -> bool {
    harness::raw_command(replica, "INFO replication")
        .is_ok_and(|info| info.contains("master_link_status:up"))
}

/// Wait (up to 20 s) for `ok`, naming `what` when it does not come.
fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

// Redis replicates asynchronously: a job the master acknowledged and lost
// in a failover before any replica had it would be reported queued and be
// nowhere. With a replica listed, `purge` waits for one to confirm the
// job; a job none confirms in time is tracked, and the flush queues it on
// the promoted replica that lacks it. The replica replicates through a
// real TCP proxy: freezing the proxy holds the job back from it, and
// killing the proxy with the master loses the job, as a failover would.
// A master without replicas is sent no WAIT.
#[test]
fn a_job_no_replica_confirmed_is_tracked_and_queued_again_after_the_failover_lost_it() {
    let mut master = harness::redis(&[]);
    let master_port = master.port;
    let mut proxy = harness::haproxy::start("replication proxy", |dir, port| {
        let conf = format!(
            "global\n    maxconn 64\n\
             defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n\
             \x20   timeout server 1h\n\
             listen replication\n    bind 127.0.0.1:{port}\n\
             \x20   server master 127.0.0.1:{master_port}\n"
        );
        std::fs::write(dir.join("haproxy.cfg"), conf).expect("write haproxy.cfg");
    });
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", proxy.port)]);
    wait_until("the replica links to the master", || linked(replica.port));
    // Started once the replica is linked: its first INFO of the master
    // lists the replica, so a failover has a candidate.
    let sentinel = harness::sentinel("edge-1", master.port);
    wait_until("the sentinel knows the replica", || {
        harness::raw_command(sentinel.port, "SENTINEL replicas edge-1")
            .is_ok_and(|r| r.contains(&replica.port.to_string()))
    });
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    let alone = harness::redis(&[]);
    let f = Fixture::with(&[
        (
            "nodes/edge-1.yaml",
            &*format!(
                "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
                 redis: {{sentinels: [\"127.0.0.1:{}\"], master: edge-1}}\n",
                sentinel.port
            ),
        ),
        (
            "nodes/edge-2.yaml",
            &*edge("edge-2", "us", alone.port, "$host$uri$is_args$args"),
        ),
        (
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n",
        ),
    ]);
    let queue = "cdn:purge:eu:edge-1";
    let purge = |url: &str| purge_url(f.path(), &state, url);

    // Confirmed by the replica: nothing tracked. The lone master is sent
    // no WAIT.
    let out = purge("/confirmed.mp4");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("tracked"), "{}", stderr(&out));
    let confirmed = stdout(&out).trim().to_owned();
    assert_eq!(kept(&state, "edge-1"), 0);
    assert_eq!(calls(master.port, "wait"), 1);
    assert_eq!(calls(alone.port, "wait"), 0);
    wait_until("the replica has the first job", || {
        ids(replica.port, queue) == [confirmed.clone()]
    });

    // The replication stream held back: queued, tracked, exit 0.
    proxy.freeze();
    let out = purge("/unconfirmed.mp4");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("edge-1: queued on its master")
            && err.contains("0 of its 1 replica(s) confirmed it in 1000 ms; tracked in"),
        "{err}"
    );
    let lost = stdout(&out).trim().to_owned();
    assert_eq!(ids(master.port, queue), [confirmed.clone(), lost.clone()]);
    assert_eq!(kept(&state, "edge-1"), 1);

    // The master dies with the job; the replica never got it and is
    // promoted.
    master.kill();
    proxy.kill();
    harness::wait_for_master(&sentinel, "edge-1", replica.port);
    wait_until("the promoted replica takes writes", || {
        harness::raw_command(replica.port, "ROLE").is_ok_and(|r| r.contains("master"))
    });
    assert_eq!(ids(replica.port, queue), std::slice::from_ref(&confirmed));

    // The flush finds it lost and queues it again on the new master.
    let out = edgeform_with_state(f.path(), &state, &["purge", "--flush"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("edge-1: 0 queued, 1 queued again, 0 done, 1 tracked"),
        "{}",
        stdout(&out)
    );
    assert_eq!(ids(replica.port, queue), [confirmed, lost]);
}
