//! The pusher against real `redis-server` / Sentinel processes (started by
//! the shared harness on free loopback ports): plan, apply, prune, heal,
//! rollback, thresholds, saved plans, failures, failover, locking and
//! atomicity.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::util::{Fixture, edgeform, git, stderr, stdout};

fn edge(name: &str, region: &str, port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: {region}\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

fn site(i: usize, origin: &str) -> String {
    format!("host: s{i:05}.example.com\norigin: {origin}\n")
}

fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn meta(port: u16) -> BTreeMap<String, String> {
    redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut con(port))
        .unwrap()
}

fn get(port: u16, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut con(port)).unwrap()
}

/// Every key, the manifest's buckets (format 3: strings) shown as the
/// one `edgeform:manifest` they make up.
fn keys(port: u16) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con(port)).unwrap();
    for key in &mut k {
        if key.starts_with("edgeform:manifest:") {
            "edgeform:manifest".clone_into(key);
        }
    }
    k.sort();
    k.dedup();
    k
}

/// A repo of `n` sites on one edge at `port`.
fn repo(n: usize, port: u16) -> Fixture {
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", edge("edge-1", "eu", port).as_bytes());
    for i in 0..n {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            site(i, "http://192.0.2.1").as_bytes(),
        );
    }
    f
}

/// `apply --yes`; these tests change files between applies without
/// committing each step, hence `--allow-dirty`.
fn apply(f: &Fixture, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["apply", "--yes", "--allow-dirty"];
    args.extend_from_slice(extra);
    edgeform(f.path(), &args)
}

#[test]
fn first_apply_then_noop_plan_then_prune() {
    let r = harness::redis(&[]);
    let f = repo(3, r.port);
    f.write(
        "sites/s00001.yaml",
        b"host: s00001.example.com\norigin: http://192.0.2.1\nsuspended: true\n",
    );
    let commit = f.commit("three sites");

    let out = edgeform(f.path(), &["plan", "--detailed-exitcode"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stdout(&out).contains("5 to add"), "{}", stdout(&out));
    let out = apply(&f, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("edge-1: applied generation 1 (+5 ~0 -0)"),
        "{}",
        stdout(&out)
    );
    let m = meta(r.port);
    assert_eq!(m["commit"], commit);
    assert_eq!(m["generation"], "1");
    assert_eq!(m["format"], "3");
    assert_eq!(m["managed"], "5");
    assert!(m["applied_at"].ends_with('Z'));
    assert_eq!(
        get(r.port, "suspended:s00001.example.com").as_deref(),
        Some("1")
    );
    // Format 3: the manifest in bucket strings, 5 entries in all.
    let buckets: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("edgeform:manifest:buckets")
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(buckets.len(), 256);
    let n: usize = buckets
        .values()
        .map(|v| v.split_once(' ').unwrap().1.parse::<usize>().unwrap())
        .sum();
    assert_eq!(n, 5);
    let strings: Vec<String> = redis::cmd("KEYS")
        .arg("edgeform:manifest:[0-9a-f][0-9a-f]")
        .query(&mut con(r.port))
        .unwrap();
    let mut records = 0;
    for k in &strings {
        let v: Vec<u8> = redis::cmd("GET").arg(k).query(&mut con(r.port)).unwrap();
        records += edgestate::manifest::parse(&v).unwrap().len();
    }
    assert_eq!(records, 5, "{strings:?}");

    // No-op: exit 0 with and without --detailed-exitcode; apply is a no-op.
    assert_eq!(edgeform(f.path(), &["plan"]).status.code(), Some(0));
    let out = edgeform(
        f.path(),
        &["plan", "--detailed-exitcode", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["changes"], false);
    let out = apply(&f, &[]);
    assert!(
        stdout(&out).contains("edge-1: unchanged (generation 1)"),
        "{}",
        stdout(&out)
    );

    // Prune: a site leaves the repo; its keys (and only managed keys) go.
    redis::cmd("SET")
        .arg("cdn:purge:eu:edge-1")
        .arg("queue stays")
        .exec(&mut con(r.port))
        .unwrap();
    f.write("sites/s00001.yaml", b"");
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("(+0 ~0 -2)"), "{}", stdout(&out));
    assert_eq!(
        keys(r.port),
        [
            "cdn:purge:eu:edge-1",
            // The audit trail.
            "edgeform:history",
            "edgeform:manifest",
            "edgeform:meta",
            "edgeform:routing",
            "site:s00000.example.com",
            "site:s00002.example.com"
        ]
    );
    assert!(meta(r.port)["commit"].ends_with("+dirty"));
}

#[test]
fn heal_repairs_values_unmanaged_keys_and_the_manifest() {
    let r = harness::redis(&[]);
    let f = repo(3, r.port);
    f.commit("three");
    assert_eq!(apply(&f, &[]).status.code(), Some(0));
    let mut c = con(r.port);
    redis::cmd("SET")
        .arg("site:s00000.example.com")
        .arg("{\"origin\":\"http://evil\"}")
        .exec(&mut c)
        .unwrap();
    redis::cmd("DEL")
        .arg("site:s00002.example.com")
        .exec(&mut c)
        .unwrap();
    redis::cmd("SET")
        .arg("site:rogue.example.com")
        .arg("{}")
        .exec(&mut c)
        .unwrap();
    redis::cmd("SET")
        .arg("suspended:s00001.example.com")
        .arg("1")
        .exec(&mut c)
        .unwrap();
    redis::cmd("HSET")
        .arg("edgeform:manifest")
        .arg("site:s00001.example.com")
        .arg("0000")
        .exec(&mut c)
        .unwrap();
    // A plan trusts the manifest: the tampered entry shows as a change.
    let out = edgeform(f.path(), &["plan", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["targets"][0]["changed"][0], "site:s00001.example.com");

    let out = edgeform(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    for (key, kind) in [
        ("site:s00000.example.com", "changed"),
        ("site:s00002.example.com", "missing"),
        ("site:rogue.example.com", "unmanaged"),
        ("suspended:s00001.example.com", "unmanaged"),
        ("edgeform:manifest", "manifest"),
    ] {
        assert!(
            log.contains(&format!("key={key} kind=\"{kind}\"")),
            "{key} {kind}:\n{log}"
        );
    }
    assert_eq!(get(r.port, "site:rogue.example.com"), None);
    assert_eq!(get(r.port, "suspended:s00001.example.com"), None);
    assert!(
        get(r.port, "site:s00000.example.com")
            .unwrap()
            .contains("192.0.2.1")
    );
    assert!(get(r.port, "site:s00002.example.com").is_some());
    // Healthy now: a second heal finds nothing, plan shows nothing.
    let out = edgeform(f.path(), &["reconcile", "--once", "heal"]);
    assert!(stderr(&out).contains("heal: no drift"), "{}", stderr(&out));
    assert_eq!(
        edgeform(f.path(), &["plan", "--detailed-exitcode"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn older_commit_is_refused_unless_allowed() {
    let r = harness::redis(&[]);
    let f = repo(2, r.port);
    let first = f.commit("two");
    f.write("sites/s00000.yaml", site(0, "http://192.0.2.9").as_bytes());
    git(f.path(), &["commit", "-qam", "change"]);
    assert_eq!(apply(&f, &[]).status.code(), Some(0));
    let out = edgeform(f.path(), &["--rev", &first, "apply", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("refusing to roll back"),
        "{}",
        stdout(&out)
    );
    assert!(
        get(r.port, "site:s00000.example.com")
            .unwrap()
            .contains("192.0.2.9")
    );
    let out = edgeform(
        f.path(),
        &["--rev", &first, "apply", "--yes", "--allow-rollback"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        get(r.port, "site:s00000.example.com")
            .unwrap()
            .contains("192.0.2.1")
    );
    assert_eq!(meta(r.port)["commit"], first);
}

#[test]
fn thresholds_refuse_mass_deletes_and_changes() {
    let r = harness::redis(&[]);
    let f = repo(20, r.port);
    f.commit("twenty");
    assert_eq!(apply(&f, &[]).status.code(), Some(0));
    // 21 managed keys. Deleting 6 (28 %) is refused, nothing is written.
    for i in 0..6 {
        f.write(&format!("sites/s{i:05}.yaml"), b"");
    }
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("refusing to delete 6 of 21 managed keys (more than 25 %"),
        "{}",
        stdout(&out)
    );
    // 21 documents, the manifest, the meta and the history.
    assert_eq!(keys(r.port).len(), 24);
    assert_eq!(apply(&f, &["--force"]).status.code(), Some(0));
    assert_eq!(keys(r.port).len(), 18);
    // 15 managed keys; changing 8 (53 %) is refused; a cluster.yaml limit
    // of 60 % lets it pass once a commit carrying it is live (a change
    // cannot raise the limit it is checked against).
    for i in 6..14 {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            site(i, "http://192.0.2.2").as_bytes(),
        );
    }
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("refusing to change 8 of 15 managed keys (more than 50 %"),
        "{}",
        stdout(&out)
    );
    f.write("cluster.yaml", b"apply:\n  max_change_percent: 60\n");
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("refusing to change 8 of 15 managed keys (more than 50 %"),
        "{}",
        stdout(&out)
    );
    for i in 6..14 {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            site(i, "http://192.0.2.1").as_bytes(),
        );
    }
    f.commit("sixty");
    assert_eq!(apply(&f, &[]).status.code(), Some(0));
    for i in 6..14 {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            site(i, "http://192.0.2.2").as_bytes(),
        );
    }
    assert_eq!(apply(&f, &[]).status.code(), Some(0));
    // An empty desired state (every site gone) is refused, even with thresholds met.
    let g = repo(0, r.port);
    g.write("cluster.yaml", b"apply:\n  max_delete_percent: 100\n");
    let out = edgeform(
        g.path(),
        &["apply", "--yes", "--allow-rollback", "--allow-dirty"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("empty desired state"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn saved_plan_applies_only_while_live_state_matches() {
    let r = harness::redis(&[]);
    let f = repo(2, r.port);
    f.commit("two");
    let plan = f.path().join("plan.json");
    let out = edgeform(f.path(), &["plan", "--out", plan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The saved plan applies.
    let out = edgeform(
        f.path(),
        &[
            "apply",
            "--plan",
            plan.to_str().unwrap(),
            "--yes",
            "--allow-dirty",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // Applying it again is stale: the target moved (generation 0 → 1).
    let out = edgeform(
        f.path(),
        &[
            "apply",
            "--plan",
            plan.to_str().unwrap(),
            "--yes",
            "--allow-dirty",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("stale plan"), "{}", stdout(&out));
    // A plan, then someone else changes the target: stale, nothing written.
    f.write("sites/s00000.yaml", site(0, "http://192.0.2.3").as_bytes());
    let out = edgeform(f.path(), &["plan", "--out", plan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    redis::cmd("HSET")
        .arg("edgeform:meta")
        .arg("generation")
        .arg("7")
        .exec(&mut con(r.port))
        .unwrap();
    let out = edgeform(
        f.path(),
        &[
            "apply",
            "--plan",
            plan.to_str().unwrap(),
            "--yes",
            "--allow-dirty",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("stale plan"), "{}", stdout(&out));
    assert!(
        get(r.port, "site:s00000.example.com")
            .unwrap()
            .contains("192.0.2.1")
    );
    // And a repo that changed after the plan is refused too.
    let out = edgeform(f.path(), &["plan", "--out", plan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    f.write("sites/s00001.yaml", site(1, "http://192.0.2.4").as_bytes());
    let out = edgeform(
        f.path(),
        &[
            "apply",
            "--plan",
            plan.to_str().unwrap(),
            "--yes",
            "--allow-dirty",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("differs from the saved plan"),
        "{}",
        stdout(&out)
    );
}

/// A target whose Redis took the connection and answers nothing (frozen,
/// or cut off without a reset) fails alone once the response timeout
/// passes; the other target is applied and the run ends.
#[test]
fn a_frozen_target_fails_alone_after_the_response_timeout() {
    let up = harness::redis(&[]);
    let frozen = harness::redis(&[]);
    let f = repo(2, up.port);
    f.write(
        "nodes/edge-2.yaml",
        edge("edge-2", "eu", frozen.port).as_bytes(),
    );
    f.commit("two edges");
    frozen.freeze();
    let started = Instant::now();
    let out = apply(&f, &[]);
    let took = started.elapsed();
    frozen.thaw();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("edge-1: applied generation 1"), "{text}");
    assert!(
        text.contains(&format!(
            "edge-2: FAILED (redis://127.0.0.1:{})",
            frozen.port
        )),
        "{text}"
    );
    let limit = edgeredis::RESPONSE_TIMEOUT + Duration::from_secs(30);
    assert!(took < limit, "{took:?}");
}

#[test]
fn a_target_down_fails_alone_and_a_later_sync_heals_it() {
    let up = harness::redis(&[]);
    let mut down = harness::redis(&[]);
    let down_port = down.port;
    down.kill();
    let f = repo(2, up.port);
    f.write(
        "nodes/edge-2.yaml",
        edge("edge-2", "eu", down_port).as_bytes(),
    );
    f.commit("two edges");
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("edge-1: applied generation 1"), "{text}");
    assert!(
        text.contains(&format!("edge-2: FAILED (redis://127.0.0.1:{down_port})")),
        "{text}"
    );
    assert!(
        text.contains("Apply: 1 applied, 0 unchanged, 1 failed (push "),
        "{text}"
    );
    // The plan reports the unreachable target, exit 1.
    let out = edgeform(f.path(), &["plan"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("edge-2: ERROR"), "{}", stdout(&out));
    // It comes back; the next sync brings it in line.
    let back = harness::redis_on(down_port, &[]);
    let out = edgeform(f.path(), &["reconcile", "--once", "sync"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("sync: applied"), "{}", stderr(&out));
    assert_eq!(meta(back.port)["generation"], "1");
    assert_eq!(keys(back.port).len(), 6);
}

#[test]
fn sentinel_failover_between_two_applies() {
    let mut master = harness::redis(&[]);
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", master.port)]);
    let sentinel = harness::sentinel("edge-1", master.port);
    let f = repo(2, 0);
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{sentinels: [\"127.0.0.1:{}\"], master: edge-1}}\n",
            sentinel.port
        )
        .as_bytes(),
    );
    f.commit("sentinel");
    let out = apply(&f, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(meta(master.port)["generation"], "1");
    // Wait for the replica to have it, then kill the master.
    let deadline = Instant::now() + Duration::from_secs(10);
    while meta(replica.port).get("generation").map(String::as_str) != Some("1") {
        assert!(Instant::now() < deadline, "replication did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
    master.kill();
    harness::wait_for_master(&sentinel, "edge-1", replica.port);
    // The replica may need a moment to accept writes as the new master.
    f.write("sites/s00000.yaml", site(0, "http://192.0.2.5").as_bytes());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = apply(&f, &[]);
        if out.status.code() == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", stdout(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(meta(replica.port)["generation"], "2");
    assert!(
        get(replica.port, "site:s00000.example.com")
            .unwrap()
            .contains("192.0.2.5")
    );
}

#[test]
fn the_lock_serialises_concurrent_applies() {
    let r = harness::redis(&[]);
    let f = repo(50, r.port);
    f.commit("fifty");
    // Someone holds the lock for 1.5 s: apply waits for it, then proceeds.
    redis::cmd("SET")
        .arg("edgeform:lock")
        .arg("other-host:1:1")
        .arg("PX")
        .arg(1500)
        .exec(&mut con(r.port))
        .unwrap();
    let start = Instant::now();
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        start.elapsed() >= Duration::from_millis(1200),
        "{:?}",
        start.elapsed()
    );
    // A lock held longer than --lock-wait fails the target, naming the holder.
    redis::cmd("SET")
        .arg("edgeform:lock")
        .arg("other-host:1:1")
        .arg("PX")
        .arg(5000)
        .exec(&mut con(r.port))
        .unwrap();
    f.write("sites/s00000.yaml", site(0, "http://192.0.2.6").as_bytes());
    let out = apply(&f, &["--lock-wait", "300ms"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("locked by another apply (other-host:1:1)"),
        "{}",
        stdout(&out)
    );
    redis::cmd("DEL")
        .arg("edgeform:lock")
        .exec(&mut con(r.port))
        .unwrap();
    // Two applies of two different revisions at once: both land, one after
    // the other (generations 2 and 3), none lost.
    let g = repo(50, r.port);
    for i in 0..5 {
        g.write(
            &format!("sites/s{i:05}.yaml"),
            site(i, "http://192.0.2.7").as_bytes(),
        );
    }
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| apply(&f, &["--allow-rollback"]));
        let b = s.spawn(|| {
            edgeform(
                g.path(),
                &["apply", "--yes", "--allow-rollback", "--allow-dirty"],
            )
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a.status.code(), Some(0), "{}", stdout(&a));
    assert_eq!(b.status.code(), Some(0), "{}", stdout(&b));
    assert_eq!(meta(r.port)["generation"], "3");
}

#[test]
fn a_reader_never_sees_half_an_apply() {
    let r = harness::redis(&[]);
    let n = 10_000;
    let f = repo(n, r.port);
    f.commit("ten thousand");
    assert_eq!(apply(&f, &[]).status.code(), Some(0));
    for i in 0..n {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            site(i, "http://192.0.2.8").as_bytes(),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let seen_new = Arc::new(AtomicBool::new(false));
    let port = r.port;
    let reader = {
        let (stop, reads, seen_new) = (stop.clone(), reads.clone(), seen_new.clone());
        std::thread::spawn(move || {
            let mut c = con(port);
            let last = format!("site:s{:05}.example.com", n - 1);
            while !stop.load(Ordering::Relaxed) {
                // One atomic snapshot: the generation and two documents.
                let (generation, first, last): (Option<String>, Option<String>, Option<String>) =
                    redis::pipe()
                        .atomic()
                        .cmd("HGET")
                        .arg("edgeform:meta")
                        .arg("generation")
                        .cmd("GET")
                        .arg("site:s00000.example.com")
                        .cmd("GET")
                        .arg(&last)
                        .query(&mut c)
                        .unwrap();
                let (first, last) = (first.unwrap(), last.unwrap());
                let new = generation.as_deref() == Some("2");
                assert_eq!(
                    first.contains("192.0.2.8"),
                    new,
                    "gen {generation:?}: {first}"
                );
                assert_eq!(
                    last.contains("192.0.2.8"),
                    new,
                    "gen {generation:?}: {last}"
                );
                if new {
                    seen_new.store(true, Ordering::Relaxed);
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let out = apply(&f, &["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the reader saw an inconsistent state");
    assert!(reads.load(Ordering::Relaxed) > 10);
    assert!(seen_new.load(Ordering::Relaxed));
}

#[test]
fn password_comes_from_the_named_environment_variable() {
    let r = harness::redis(&["requirepass s3cret"]);
    let f = repo(1, r.port);
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{}\", password_env: EDGE_PW}}\n",
            r.port
        )
        .as_bytes(),
    );
    let out = apply(&f, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("environment variable EDGE_PW is not set"),
        "{}",
        stdout(&out)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["apply", "--yes"])
        .current_dir(f.path())
        .env("EDGE_PW", "s3cret")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn reconcile_pulls_the_branch_first() {
    let r = harness::redis(&[]);
    let upstream = repo(2, r.port);
    upstream.commit("two");
    let clone = tempfile::tempdir().unwrap();
    let dst = clone.path().join("work");
    git(
        clone.path(),
        &[
            "clone",
            "-q",
            upstream.path().to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
    // Upstream moves on after the clone; the clone's working tree does not.
    upstream.write("sites/s00000.yaml", site(0, "http://192.0.2.11").as_bytes());
    git(upstream.path(), &["commit", "-qam", "new origin"]);
    let out = edgeform(
        &dst,
        &["reconcile", "--once", "sync", "--pull", "origin/main"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        get(r.port, "site:s00000.example.com")
            .unwrap()
            .contains("192.0.2.11")
    );
    let head = String::from_utf8(git(upstream.path(), &["rev-parse", "HEAD"]).stdout).unwrap();
    assert_eq!(meta(r.port)["commit"], head.trim());
    // A bad remote is a logged failure, exit 1, nothing pushed.
    let out = edgeform(
        &dst,
        &["reconcile", "--once", "sync", "--pull", "nope/main"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no remote `nope`"),
        "{}",
        stderr(&out)
    );
}
