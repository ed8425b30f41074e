//! The purge worker end to end: real agent, real Redis, nginx-format files.

use std::time::{Duration, Instant};

use crate::util::{Agent, Cache, QUEUE, con, exists, push_job, wait_done};

#[test]
fn each_job_shape_removes_exactly_what_it_names() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let a_mp4 = cache.put("static", "httpexample.com/a.mp4");
    let a_mp4_s = cache.put("dynamic", "httpsexample.com/a.mp4");
    let img1 = cache.put("static", "httpexample.com/img/1.png");
    let img2 = cache.put("dynamic", "httpswww.example.com/img/2.png");
    let css = cache.put("static", "httpexample.com/css/site.css?v=3");
    let js = cache.put("static", "httpexample.com/js/app.js");
    let other = cache.put("static", "httpother.org/img/1.png");
    let lookalike = cache.put("static", "httpnotexample.com/a.mp4");
    let agent = Agent::start(r.port, &cache.dirs());

    // The seed's job, exactly as it is: no id, grep over the KEY line.
    push_job(r.port, r#"{"grep": "KEY:.*other\\.org"}"#);
    // Exact key: O(1), no scan.
    push_job(
        r.port,
        r#"{"id":"exact","site":"example.com","key":"httpexample.com/a.mp4"}"#,
    );
    assert_eq!(wait_done(r.port, "exact", &agent), "1");
    assert!(!exists(&other), "the seed-shaped job ran first");
    assert!(!exists(&a_mp4) && exists(&a_mp4_s));
    // Prefix (what `edgeform purge --prefix /img/` builds).
    push_job(
        r.port,
        r#"{"id":"prefix","site":"example.com","grep":"^KEY: (?:http|https)(?:example\\.com|www\\.example\\.com)(?:/img/)"}"#,
    );
    assert_eq!(wait_done(r.port, "prefix", &agent), "2");
    assert!(!exists(&img1) && !exists(&img2));
    // Regex on the path.
    push_job(
        r.port,
        r#"{"id":"regex","site":"example.com","grep":"^KEY: (?:http|https)(?:example\\.com)(?:/.*?(?:\\.css))"}"#,
    );
    assert_eq!(wait_done(r.port, "regex", &agent), "1");
    assert!(!exists(&css) && exists(&js));
    // The whole site.
    push_job(
        r.port,
        r#"{"id":"all","site":"example.com","grep":"^KEY: (?:http|https)(?:example\\.com|www\\.example\\.com)(?:/)"}"#,
    );
    assert_eq!(wait_done(r.port, "all", &agent), "2");
    assert!(!exists(&js) && !exists(&a_mp4_s));
    // Untouched: another host, and a host that merely ends the same way.
    assert!(exists(&lookalike));
}

#[test]
fn nothing_outside_the_cache_dirs_is_touched() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let outside = tempfile::tempdir().unwrap();
    // A valid cache file outside the dirs, reachable through symlinks inside.
    let levels = agent::cache::Levels::parse("1:2").unwrap();
    let foreign =
        agent::cache::write_cache_file(outside.path(), &levels, "httpexample.com/secret", b"x")
            .unwrap();
    let link_dir = cache.dir("static").join("0");
    std::fs::create_dir_all(&link_dir).unwrap();
    std::os::unix::fs::symlink(&foreign, link_dir.join("link-to-file")).unwrap();
    std::os::unix::fs::symlink(outside.path(), cache.dir("static").join("link-to-dir")).unwrap();
    // The exact path of the key, replaced by a symlink to the outside file.
    let exact = levels.path_for(&cache.dir("dynamic"), "httpexample.com/secret");
    std::fs::create_dir_all(exact.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&foreign, &exact).unwrap();
    let inside = cache.put("static", "httpexample.com/inside");
    let agent = Agent::start(r.port, &cache.dirs());
    push_job(r.port, r#"{"id":"all","grep":"KEY: .*example\\.com"}"#);
    assert_eq!(wait_done(r.port, "all", &agent), "1");
    push_job(r.port, r#"{"id":"exact","key":"httpexample.com/secret"}"#);
    assert_eq!(wait_done(r.port, "exact", &agent), "0");
    assert!(!exists(&inside));
    assert!(
        exists(&foreign),
        "a file outside the cache dirs was removed"
    );
    assert!(
        exists(&link_dir.join("link-to-file")) && exists(&exact),
        "symlinks are left alone"
    );
}

#[test]
fn malformed_jobs_are_recorded_as_failed_and_the_next_job_runs() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let f = cache.put("static", "httpexample.com/a");
    let agent = Agent::start(r.port, &cache.dirs());
    push_job(r.port, "this is not json");
    push_job(r.port, r#"{"id":"shape","purge":"everything"}"#);
    push_job(r.port, r#"{"id":"lookaround","grep":"KEY: (?=x)"}"#);
    push_job(r.port, r#"{"id":"backref","grep":"(a)\\1"}"#);
    push_job(r.port, r#"{"id":"ok","key":"httpexample.com/a"}"#);
    assert_eq!(wait_done(r.port, "ok", &agent), "1");
    assert!(!exists(&f));
    for id in ["shape", "lookaround", "backref"] {
        let v = wait_done(r.port, id, &agent);
        assert!(v.starts_with("failed: "), "{id}: {v}");
    }
    let failed: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{QUEUE}:failed"))
        .arg(0)
        .arg(-1)
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(failed.len(), 4, "{failed:?}");
    assert!(failed[0].contains("this is not json"));
    let processing: i64 = redis::cmd("LLEN")
        .arg(format!("{QUEUE}:processing"))
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(processing, 0);
}

/// 10,000 jobs queued while the agent is down drain in order, none dropped;
/// a kill -9 in the middle of the backlog loses nothing either.
#[test]
fn backlog_drains_in_order_through_a_kill_9() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let n = 10_000;
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("RPUSH")
            .arg(QUEUE)
            .arg(format!(r#"{{"id":"j{i:05}","key":"httpexample.com/{i}"}}"#))
            .ignore();
    }
    pipe.exec(&mut con(r.port)).unwrap();
    let mut files = Vec::new();
    for i in (0..n).step_by(100) {
        files.push(cache.put("static", &format!("httpexample.com/{i}")));
    }
    let mut agent = Agent::start(r.port, &cache.dirs());
    let mut c = con(r.port);
    let done = |c: &mut redis::Connection, i: usize| -> bool {
        redis::cmd("EXISTS")
            .arg(format!("cdn:purge:done:j{i:05}"))
            .query::<i64>(c)
            .unwrap()
            == 1
    };
    // While it drains, completion is always a prefix of the queue order:
    // one atomic server-side snapshot of the queue length and two results.
    let snapshot = redis::Script::new(
        r"local left = redis.call('LLEN', KEYS[1])
          local taken = tonumber(ARGV[1]) - left
          local before, after = 1, 0
          if taken >= 2 then before = redis.call('EXISTS', string.format('cdn:purge:done:j%05d', taken - 2)) end
          if taken < tonumber(ARGV[1]) then after = redis.call('EXISTS', string.format('cdn:purge:done:j%05d', taken)) end
          return {left, before, after}",
    );
    let mut killed = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (left, before, after): (usize, i64, i64) =
            snapshot.key(QUEUE).arg(n).invoke(&mut c).unwrap();
        let taken = n - left;
        assert_eq!(
            before,
            1,
            "job {} not done while {taken} were taken",
            taken.saturating_sub(2)
        );
        assert_eq!(after, 0, "job {taken} done before it was taken");
        if !killed && taken > n / 3 {
            agent.kill9();
            killed = true;
            std::thread::sleep(Duration::from_millis(200));
            agent.spawn();
        }
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "backlog did not drain:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The last one finishes, and every job has its result.
    crate::util::wait_done(r.port, &format!("j{:05}", n - 1), &agent);
    let mut missing = Vec::new();
    for i in 0..n {
        if !done(&mut c, i) {
            missing.push(i);
        }
    }
    assert!(
        missing.is_empty(),
        "{} jobs lost, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(files.iter().all(|f| !exists(f)));
    assert!(agent.log().contains("re-running jobs left in processing") || killed);
    // Clean shutdown on SIGTERM.
    let status = agent.terminate().unwrap();
    assert!(status.success(), "{status:?}\n{}", agent.log());
}

#[test]
fn redis_restarted_under_a_waiting_agent() {
    let mut r = harness::redis(&[]);
    let port = r.port;
    let cache = Cache::new();
    let f = cache.put("static", "httpexample.com/after-restart");
    let agent = Agent::start(port, &cache.dirs());
    push_job(port, r#"{"id":"before","key":"httpexample.com/nothing"}"#);
    assert_eq!(wait_done(port, "before", &agent), "0");
    r.kill();
    std::thread::sleep(Duration::from_millis(700));
    let _r2 = harness::redis_on(port, &[]);
    push_job(
        port,
        r#"{"id":"after","key":"httpexample.com/after-restart"}"#,
    );
    assert_eq!(wait_done(port, "after", &agent), "1");
    assert!(!exists(&f));
    assert!(
        agent.log().contains("reconnecting") || agent.log().contains("unreachable"),
        "{}",
        agent.log()
    );
}

/// The agent keeps an index of cache keys; a file cached after the index
/// was built, in a level directory that did not exist yet, is still purged.
#[test]
fn files_cached_after_start_are_purged_too() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let before = cache.put("static", "httpexample.com/before");
    let agent = Agent::start(r.port, &cache.dirs());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent.log().contains("cache key index built") {
        assert!(Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let after: Vec<_> = (0..50)
        .map(|i| cache.put("dynamic", &format!("httpexample.com/after/{i}")))
        .collect();
    let other = cache.put("dynamic", "httpother.org/after");
    push_job(r.port, r#"{"id":"p","grep":"^KEY: httpexample\\.com/"}"#);
    assert_eq!(wait_done(r.port, "p", &agent), "51");
    assert!(!exists(&before) && after.iter().all(|f| !exists(f)) && exists(&other));
}

fn failed_entries(port: u16) -> Vec<serde_json::Value> {
    let failed: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{QUEUE}:failed"))
        .arg(0)
        .arg(-1)
        .query(&mut con(port))
        .unwrap();
    failed
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect()
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A 20 MB regex job and a non-UTF-8 job on a real Redis are failed
/// without echoing them, the agent stays small and connected, and the
/// normal job queued after them runs.
#[test]
fn huge_and_non_utf8_jobs_fail_and_the_next_job_runs() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let f = cache.put("static", "httpexample.com/after");
    let agent = Agent::start(r.port, &cache.dirs());
    let huge = format!(
        r#"{{"id":"huge","grep":"{}"}}"#,
        "(a|b)*c".repeat(20_000_000 / 7)
    );
    push_job(r.port, &huge);
    redis::cmd("RPUSH")
        .arg(QUEUE)
        .arg(b"{\"id\":\"bin\",\"grep\":\"\xff\xfe\"}".as_slice())
        .arg(b"\xff\x1b[2J".as_slice())
        .exec(&mut con(r.port))
        .unwrap();
    push_job(r.port, r#"{"id":"ok","key":"httpexample.com/after"}"#);
    assert_eq!(wait_done(r.port, "ok", &agent), "1");
    assert!(!exists(&f));
    // The huge one is too big to parse: no id, so no done record.
    let bin = wait_done(r.port, "bin", &agent);
    assert!(bin.starts_with("failed: the job is not UTF-8"), "{bin}");
    let failed = failed_entries(r.port);
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert_eq!(failed[0]["bytes"], huge.len());
    assert!(
        failed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("over the 65536-byte limit")
    );
    assert!(failed[0]["job"].as_str().unwrap().len() < 300);
    assert!(
        failed[1]["job"]
            .as_str()
            .unwrap()
            .contains(r#""grep":"\xff\xfe""#)
    );
    assert_eq!(failed[2]["job"], r"\xff\u{1b}[2J");
    let log = agent.log();
    assert!(log.len() < 20_000, "the job was echoed into the log");
    assert!(!log.contains('\u{1b}'), "a raw escape reached the log");
    assert_eq!(
        log.matches("purge worker connected").count(),
        1,
        "reconnected:\n{log}"
    );
    let rss = peak_rss_kib(agent.child.as_ref().unwrap().id());
    eprintln!(
        "huge job: agent peak RSS {rss} KiB after a {}-byte job",
        huge.len()
    );
    assert!(rss < 200 * 1024, "peak RSS {rss} KiB");
    let processing: i64 = redis::cmd("LLEN")
        .arg(format!("{QUEUE}:processing"))
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(processing, 0);
}

/// A job found in processing that was already started three times without
/// finishing (it killed the agent each time) is failed unrun.
#[test]
fn a_poison_job_is_failed_after_three_unfinished_starts() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let f = cache.put("static", "httpexample.com/poison");
    let job = r#"{"id":"poison","key":"httpexample.com/poison"}"#;
    let mut c = con(r.port);
    redis::cmd("RPUSH")
        .arg(format!("{QUEUE}:processing"))
        .arg(job)
        .exec(&mut c)
        .unwrap();
    let digest = md5_hex(job.as_bytes());
    // Three starts recorded by agents that died mid-job.
    redis::cmd("HSET")
        .arg(format!("{QUEUE}:attempts"))
        .arg(&digest)
        .arg(3)
        .exec(&mut c)
        .unwrap();
    let agent = Agent::start(r.port, &cache.dirs());
    let v = wait_done(r.port, "poison", &agent);
    assert!(v.starts_with("failed: started 3 times"), "{v}");
    assert!(exists(&f), "the poison job ran");
    // The next job runs, and a finished job leaves no counter behind.
    push_job(r.port, r#"{"id":"next","key":"httpexample.com/poison"}"#);
    assert_eq!(wait_done(r.port, "next", &agent), "1");
    let left: i64 = redis::cmd("HLEN")
        .arg(format!("{QUEUE}:attempts"))
        .query(&mut c)
        .unwrap();
    assert_eq!(left, 0);
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn connections_received(port: u16) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut con(port))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// A hostile Redis's keys of the wrong type (the failed list, a job's
/// record, a start counter that is not a number) cost that one job's
/// bookkeeping, never the queue: the jobs behind still run, and the worker
/// does not loop on the server.
#[test]
fn keys_of_the_wrong_type_cost_one_jobs_bookkeeping_not_the_queue() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let after = cache.put("static", "httpexample.com/after");
    let counted = cache.put("static", "httpexample.com/counted");
    let mut c = con(r.port);
    let set = |c: &mut redis::Connection, args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.exec(c).unwrap();
    };
    set(&mut c, &["SET", &format!("{QUEUE}:failed"), "not a list"]);
    set(&mut c, &["SET", "cdn:purge:done:recorded", "not a hash"]);
    let job = r#"{"id":"counted","key":"httpexample.com/counted"}"#;
    set(
        &mut c,
        &[
            "HSET",
            &format!("{QUEUE}:attempts"),
            &md5_hex(job.as_bytes()),
            "x",
        ],
    );
    // A record that is not UTF-8: the job is run as never recorded.
    redis::cmd("HSET")
        .arg("cdn:purge:done:binary")
        .arg("edge-1")
        .arg(b"\xff\xfe".as_slice())
        .exec(&mut c)
        .unwrap();
    push_job(r.port, "this is not json");
    push_job(r.port, r#"{"id":"binary","key":"httpexample.com/x"}"#);
    push_job(r.port, r#"{"id":"recorded","key":"httpexample.com/x"}"#);
    push_job(r.port, job);
    push_job(r.port, r#"{"id":"after","key":"httpexample.com/after"}"#);
    let before = connections_received(r.port);
    let agent = Agent::start(r.port, &cache.dirs());
    assert_eq!(wait_done(r.port, "after", &agent), "1");
    assert_eq!(wait_done(r.port, "counted", &agent), "1");
    assert_eq!(wait_done(r.port, "binary", &agent), "0");
    assert!(!exists(&after) && !exists(&counted));
    let processing: i64 = redis::cmd("LLEN")
        .arg(format!("{QUEUE}:processing"))
        .query(&mut c)
        .unwrap();
    assert_eq!(processing, 0, "{}", agent.log());
    std::thread::sleep(Duration::from_secs(1));
    // The agent's connections (the worker, commands, health), plus this
    // test's: not one per failed round.
    let made = connections_received(r.port) - before;
    assert!(made < 15, "{made} connections\n{}", agent.log());
    let log = agent.log();
    assert!(log.contains("could not be recorded"), "{log}");
}

/// A master that stops answering (frozen, not closed) is left for the one
/// the Sentinels promote: an idle worker's BLMOVE gets no answer, and the
/// worker connects again through the Sentinels within its deadline.
#[test]
fn an_idle_worker_leaves_a_frozen_master_for_the_promoted_replica() {
    let master = harness::redis(&[]);
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", master.port)]);
    let sentinel = harness::sentinel("edge-1", master.port);
    let cache = Cache::new();
    let f = cache.put("static", "httpexample.com/frozen");
    let agent = Agent::start_redis(
        &format!(
            "{{sentinels: [\"127.0.0.1:{}\"], master: edge-1}}",
            sentinel.port
        ),
        &cache.dirs(),
    );
    push_job(
        master.port,
        r#"{"id":"first","key":"httpexample.com/none"}"#,
    );
    assert_eq!(wait_done(master.port, "first", &agent), "0");
    master.freeze();
    harness::wait_for_master(&sentinel, "edge-1", replica.port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pushed = redis::cmd("RPUSH")
            .arg(QUEUE)
            .arg(r#"{"id":"after","key":"httpexample.com/frozen"}"#)
            .exec(&mut con(replica.port));
        if pushed.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the replica takes no writes");
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = wait_done(replica.port, "after", &agent);
    master.thaw();
    assert_eq!(v, "1");
    assert!(!exists(&f));
}

/// A raw pattern that matches every key is failed unless the job says
/// `"all": true`; the seed's and `edgeform purge`'s scoped jobs run.
#[test]
fn unscoped_patterns_need_the_all_flag() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let a = cache.put("static", "httpexample.com/a");
    let b = cache.put("dynamic", "httpother.org/b");
    let agent = Agent::start(r.port, &cache.dirs());
    for (id, grep) in [("empty", ""), ("dotstar", ".*"), ("key", "KEY:")] {
        push_job(r.port, &format!(r#"{{"id":"{id}","grep":"{grep}"}}"#));
        let v = wait_done(r.port, id, &agent);
        assert!(v.contains(r#"sets "all": true"#), "{id}: {v}");
    }
    assert!(exists(&a) && exists(&b));
    push_job(r.port, r#"{"id":"site","grep":"KEY:.*example\\.com"}"#);
    assert_eq!(wait_done(r.port, "site", &agent), "1");
    push_job(r.port, r#"{"id":"all","grep":".*","all":true}"#);
    assert_eq!(wait_done(r.port, "all", &agent), "1");
    assert!(!exists(&a) && !exists(&b));
}

/// Redis unreachable: the log names the URL once and the cause once.
#[test]
fn redis_errors_name_the_url_once() {
    let port = harness::free_port();
    let cache = Cache::new();
    let agent = Agent::start(port, &cache.dirs());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent.log().contains("redis unreachable") {
        assert!(Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("purge worker: redis unreachable"))
        .unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    assert_eq!(line.matches(&url).count(), 1, "{line}");
    assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
}

/// The agent's `redis:` for a TLS server on `port`, trusting `ca`.
fn tls_redis(port: u16, ca: &std::path::Path) -> String {
    format!(
        "{{url: \"rediss://127.0.0.1:{port}\", tls: {{ca_file: \"{}\"}}}}",
        ca.display()
    )
}

#[test]
fn purge_over_tls_redis() {
    let certs = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    let cache = Cache::new();
    let file = cache.put("static", "httpexample.com/a.mp4");
    let agent = Agent::start_redis(&tls_redis(tls, &certs.file("ca.pem")), &cache.dirs());
    // Jobs go in through the server's plain port; the agent reads over TLS.
    push_job(
        r.port,
        r#"{"id":"tls","site":"example.com","key":"httpexample.com/a.mp4"}"#,
    );
    assert_eq!(wait_done(r.port, "tls", &agent), "1");
    assert!(!exists(&file));
}

#[test]
fn agent_refuses_a_redis_with_a_wrong_ca() {
    let certs = harness::Certs::new();
    let other = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    let cache = Cache::new();
    let file = cache.put("static", "httpexample.com/a.mp4");
    push_job(
        r.port,
        r#"{"id":"tls","site":"example.com","key":"httpexample.com/a.mp4"}"#,
    );
    let agent = Agent::start_redis(&tls_redis(tls, &other.file("ca.pem")), &cache.dirs());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent.log().contains("redis unreachable") {
        assert!(Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("purge worker: redis unreachable"))
        .unwrap();
    assert!(
        line.contains(&format!("rediss://127.0.0.1:{tls}")),
        "{line}"
    );
    assert!(line.contains("certificate verify failed"), "{line}");
    // Nothing taken off the queue, nothing purged.
    let len: u64 = redis::cmd("LLEN")
        .arg(QUEUE)
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(len, 1);
    assert!(exists(&file));
}

#[test]
fn each_result_is_announced_on_the_done_channel_after_it_is_recorded() {
    let r = harness::redis(&[]);
    let cache = Cache::new();
    let f = cache.put("static", "httpexample.com/announced");
    let agent = Agent::start(r.port, &cache.dirs());
    // A waiter subscribes first, as `edgeform purge --wait` does.
    let mut sub = con(r.port);
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("cdn:purge:done:ann").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    push_job(r.port, r#"{"id":"ann","key":"httpexample.com/announced"}"#);
    let msg = pubsub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), "cdn:purge:done:ann");
    // The node and its value (the waiter need not read the hash back).
    assert_eq!(msg.get_payload::<String>().unwrap(), "edge-1\n1");
    // The hash (the record) is already written when the announcement comes.
    let v: Option<String> = redis::cmd("HGET")
        .arg("cdn:purge:done:ann")
        .arg("edge-1")
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(v.as_deref(), Some("1"), "{}", agent.log());
    assert!(!exists(&f));
    // A failed job is announced too.
    push_job(r.port, r#"{"id":"ann","purge":"everything"}"#);
    let msg = pubsub.get_message().unwrap();
    let payload = msg.get_payload::<String>().unwrap();
    let v: String = redis::cmd("HGET")
        .arg("cdn:purge:done:ann")
        .arg("edge-1")
        .query(&mut con(r.port))
        .unwrap();
    assert!(v.starts_with("failed: "), "{v}");
    assert_eq!(payload, format!("edge-1\n{v}"));
}
