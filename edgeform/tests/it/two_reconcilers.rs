//! Two `edgeform reconcile` daemons (two state directories, two clones of
//! one bare repository) sharing one state store — a real Redis reached
//! through a real Sentinel over TLS with an ACL user — and real edge
//! Redis targets: one holds the store's lease and does the work, the
//! other stands by; a new commit is applied once per target, a spooled
//! purge is delivered once, a kill -9 of the holder is taken over within
//! one interval, and a lock left on a target by a daemon killed on
//! another host does not block the survivor.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use control::store::{DirStore, Store};

use crate::util::{Fixture, git, stderr};

/// The daemons' `--sync-every` (and so the lease: half of it).
const SYNC_EVERY: Duration = Duration::from_secs(2);

fn plain(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// One body for both backends: a lease excludes, renews, runs out and is
/// released only by its holder.
fn lease_contract(s: &dyn Store) {
    let ttl = Duration::from_secs(1);
    assert_eq!(s.lease_holder("reconcile").unwrap(), None);
    let taken = Instant::now();
    assert!(s.take_lease("reconcile", "a/1/1", ttl).unwrap());
    assert!(!s.take_lease("reconcile", "b/2/2", ttl).unwrap());
    // Renewed by its holder: still held past the first ttl.
    std::thread::sleep(ttl / 2);
    assert!(s.take_lease("reconcile", "a/1/1", ttl).unwrap());
    std::thread::sleep((taken + ttl + ttl / 10).saturating_duration_since(Instant::now()));
    assert!(!s.take_lease("reconcile", "b/2/2", ttl).unwrap());
    assert_eq!(
        s.lease_holder("reconcile").unwrap().as_deref(),
        Some("a/1/1")
    );
    // Another lease is another lease.
    assert!(s.take_lease("reconcile-0011", "b/2/2", ttl).unwrap());
    // Only the holder releases it.
    s.release_lease("reconcile", "b/2/2").unwrap();
    assert!(!s.take_lease("reconcile", "b/2/2", ttl).unwrap());
    s.release_lease("reconcile", "a/1/1").unwrap();
    assert!(s.take_lease("reconcile", "b/2/2", ttl).unwrap());
    // Runs out without renewal.
    std::thread::sleep(ttl + Duration::from_millis(100));
    assert_eq!(s.lease_holder("reconcile").unwrap(), None);
    assert!(s.take_lease("reconcile", "a/1/1", ttl).unwrap());
    assert!(s.take_lease("Bad name", "a", ttl).is_err());
    assert!(s.take_lease("reconcile", "a:b", ttl).is_err());
    // The renewal state rides along.
    assert_eq!(s.renewal_state().unwrap(), None);
    s.set_renewal_state("{\"certificates\":{}}").unwrap();
    assert_eq!(
        s.renewal_state().unwrap().as_deref(),
        Some("{\"certificates\":{}}")
    );
    // So does the rollouts' book, and an oversized one is refused.
    assert_eq!(s.rollout_state().unwrap(), None);
    assert!(
        s.replace_rollout_state(None, "{}").unwrap(),
        "none read, none there"
    );
    s.set_rollout_state("{\"aborted\":[\"abc\"]}").unwrap();
    assert_eq!(
        s.rollout_state().unwrap().as_deref(),
        Some("{\"aborted\":[\"abc\"]}")
    );
    // Replaced only over what the writer read: one that read an older
    // book (or none) writes nothing; the book already written (a retried
    // request) counts as kept.
    let abc = "{\"aborted\":[\"abc\"]}";
    let both = "{\"aborted\":[\"abc\",\"def\"]}";
    assert!(!s.replace_rollout_state(None, both).unwrap());
    assert!(!s.replace_rollout_state(Some("{}"), both).unwrap());
    assert_eq!(s.rollout_state().unwrap().as_deref(), Some(abc));
    assert!(s.replace_rollout_state(Some(abc), both).unwrap());
    assert!(s.replace_rollout_state(Some(abc), both).unwrap());
    assert_eq!(s.rollout_state().unwrap().as_deref(), Some(both));
    s.set_rollout_state(abc).unwrap();
    let huge = "x".repeat(control::store::MAX_ROLLOUT_STATE_BYTES + 1);
    assert!(matches!(
        s.set_rollout_state(&huge),
        Err(control::store::StoreError::RolloutTooLarge(_))
    ));
}

#[test]
fn leases_exclude_renew_and_run_out_in_the_state_directory_and_in_redis() {
    let d = tempfile::tempdir().unwrap();
    lease_contract(&DirStore::open(&d.path().join("state")).unwrap());
    let r = harness::redis(&[]);
    let store = crate::util::plain_store(r.port);
    lease_contract(&store);
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut plain(r.port))
        .unwrap();
    keys.sort();
    // Every key under the store's prefix (the other lease ran out).
    assert_eq!(
        keys,
        [
            "edgeform:state:acme:renewal",
            "edgeform:state:lease:reconcile",
            "edgeform:state:rollout"
        ]
    );
}

fn node(name: &str, host: u8, port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.{host}]\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n\
         cache: {{key: \"$scheme://$host$request_uri\"}}\n"
    )
}

/// The commit a target's `edgeform:meta` names.
fn live(port: u16) -> Option<String> {
    redis::cmd("HGET")
        .arg(edgestate::keys::META)
        .arg("commit")
        .query(&mut plain(port))
        .ok()
        .flatten()
}

/// The commits of a target's history, newest first.
fn history(port: u16) -> Vec<String> {
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(edgestate::keys::HISTORY)
        .arg(0)
        .arg(-1)
        .query(&mut plain(port))
        .unwrap();
    raw.iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            v["commit"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool, logs: &dyn Fn() -> String) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("\"level\":\"ERROR\""))
        .collect()
}

/// The daemon (of `daemons`) whose pid the store's lease names.
fn holder(store_port: u16, daemons: &[&harness::Process]) -> Option<usize> {
    let token: Option<String> = redis::cmd("GET")
        .arg("edgeform:state:lease:reconcile")
        .query(&mut plain(store_port))
        .ok()
        .flatten();
    let pid: u32 = token?.split('/').nth(1)?.parse().ok()?;
    daemons.iter().position(|d| d.pid() == pid)
}

#[test]
fn two_reconcilers_apply_once_deliver_once_and_take_over_within_one_interval() {
    // The shared store: Redis behind Sentinel, TLS, an ACL user confined
    // to the store's keys with the commands docs/operations.md lists.
    let certs = harness::Certs::new();
    let (store_redis, tls) = harness::redis_tls(&certs, false);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("store")
        .arg("on")
        .arg("nopass")
        .arg("~edgeform:state:*")
        .arg(&[
            "+@read",
            "+@write",
            "+@scripting",
            "+scan",
            "+multi",
            "+exec",
            "+role",
            "+ping",
        ])
        .query(&mut plain(store_redis.port))
        .unwrap();
    let (_sentinel, sentinel_tls) = harness::sentinel_tls("state", tls, &certs);
    let tmp = tempfile::tempdir().unwrap();
    let store_conf = tmp.path().join("store.yaml");
    std::fs::write(
        &store_conf,
        format!(
            "redis:\n  sentinels: [\"127.0.0.1:{sentinel_tls}\"]\n  master: state\n  \
             username: store\n  tls: {{ca_file: {}}}\n",
            certs.file("ca.pem").display()
        ),
    )
    .unwrap();

    // Two edges, a repository, its bare remote and one clone per host.
    let mut edges = [harness::redis(&[]), harness::redis(&[])];
    for e in &edges {
        harness::nginx::declare_bundle(&harness::nginx::EdgeOptions::new(e.port));
    }
    let ports = [edges[0].port, edges[1].port];
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", node("edge-1", 1, ports[0]).as_bytes());
    f.write("nodes/edge-2.yaml", node("edge-2", 2, ports[1]).as_bytes());
    f.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.1\n",
    );
    let c0 = f.commit("one site");
    let bare = tmp.path().join("config.git");
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            "--bare",
            f.path().to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    git(
        f.path(),
        &["remote", "add", "origin", bare.to_str().unwrap()],
    );
    let push = |file: &str, text: &str, message: &str| -> String {
        f.write(file, text.as_bytes());
        let c = f.commit(message);
        git(f.path(), &["push", "-q", "origin", "main"]);
        c
    };

    let start = |host: &str| -> (harness::Process, PathBuf) {
        let clone = tmp.path().join(format!("clone-{host}"));
        git(
            tmp.path(),
            &[
                "clone",
                "-q",
                bare.to_str().unwrap(),
                clone.to_str().unwrap(),
            ],
        );
        let state = tmp.path().join(format!("state-{host}"));
        let metrics = harness::free_port();
        let every = format!("{}s", SYNC_EVERY.as_secs());
        let p = harness::program(
            Path::new(env!("CARGO_BIN_EXE_edgeform")),
            [
                "--repo",
                clone.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
                "--state-store",
                store_conf.to_str().unwrap(),
                "--log-format",
                "json",
                "reconcile",
                "--pull",
                "origin/main",
                "--sync-every",
                &every,
                "--heal-every",
                "1h",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
            ]
            .map(str::to_owned)
            .to_vec(),
            std::net::Ipv4Addr::LOCALHOST,
            metrics,
        );
        (p, state)
    };
    let (mut a, state_a) = start("a");
    let (mut b, state_b) = start("b");
    let both = |a: &harness::Process, b: &harness::Process| {
        format!("--- daemon a\n{}\n--- daemon b\n{}", a.log(), b.log())
    };

    // The first commit, then a new one: each applied once per target.
    wait_for(
        "the first commit on both edges",
        Duration::from_secs(20),
        || {
            ports
                .iter()
                .all(|p| live(*p).as_deref() == Some(c0.as_str()))
        },
        &|| both(&a, &b),
    );
    let c1 = push(
        "sites/b.yaml",
        "host: b.example.com\norigin: http://192.0.2.2\n",
        "another site",
    );
    wait_for(
        "the new commit on both edges",
        SYNC_EVERY * 5,
        || {
            ports
                .iter()
                .all(|p| live(*p).as_deref() == Some(c1.as_str()))
        },
        &|| both(&a, &b),
    );
    // Two more intervals: the standby never applies it a second time.
    std::thread::sleep(SYNC_EVERY * 2);
    for port in ports {
        assert_eq!(
            history(port),
            [c1.clone(), c0.clone()],
            "one apply per commit\n{}",
            both(&a, &b)
        );
    }
    for log in [a.log(), b.log()] {
        assert!(errors(&log).is_empty(), "no errors\n{}", both(&a, &b));
    }
    let leader = holder(store_redis.port, &[&a, &b]).expect("a daemon holds the lease");
    let standby_log = if leader == 0 { b.log() } else { a.log() };
    assert!(
        standby_log.contains("standing by"),
        "the other stands by\n{}",
        both(&a, &b)
    );
    assert!(
        !standby_log.contains("reconcile: run done"),
        "{standby_log}"
    );
    let held: Vec<String> = [&a, &b]
        .iter()
        .map(|d| {
            let m = crate::util::exchange(
                d.port,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                Duration::from_secs(5),
            );
            m.body
                .lines()
                .find(|l| l.starts_with("edgeform_reconcile_lease_held "))
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let mut want = [
        "edgeform_reconcile_lease_held 0",
        "edgeform_reconcile_lease_held 0",
    ];
    want[leader] = "edgeform_reconcile_lease_held 1";
    assert_eq!(held, want);

    // A purge spooled while edge-1's Redis is down (kept in the shared
    // store) is delivered once by the daemon holding the lease.
    edges[0].stop();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["purge", "--site", "a.example.com", "--url", "/v/1.mp4"])
        .arg("--state-store")
        .arg(&store_conf)
        .current_dir(f.path())
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", tmp.path().join("state-cli"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let id = crate::util::stdout(&o).trim().to_owned();
    edges[0].restart();
    let queued = |port: u16| -> Vec<String> {
        redis::cmd("LRANGE")
            .arg("cdn:purge:eu:edge-1")
            .arg(0)
            .arg(-1)
            .query(&mut plain(port))
            .unwrap_or_default()
    };
    wait_for(
        "the spooled purge delivered",
        SYNC_EVERY * 5,
        || !queued(ports[0]).is_empty(),
        &|| both(&a, &b),
    );
    std::thread::sleep(SYNC_EVERY * 2);
    let q = queued(ports[0]);
    assert_eq!(q.len(), 1, "delivered once: {q:?}");
    assert!(q[0].contains(&id), "{q:?}");

    // kill -9 the daemon holding the lease: the other converges the next
    // commit within one interval.
    let leader = holder(store_redis.port, &[&a, &b]).expect("a daemon holds the lease");
    let killed = Instant::now();
    let (dead, survivor) = if leader == 0 {
        a.kill();
        (&a, &b)
    } else {
        b.kill();
        (&b, &a)
    };
    let c2 = push(
        "sites/c.yaml",
        "host: c.example.com\norigin: http://192.0.2.3\n",
        "a third site",
    );
    let mut taken = None;
    let deadline = killed + SYNC_EVERY * 5;
    while !ports
        .iter()
        .all(|p| live(*p).as_deref() == Some(c2.as_str()))
    {
        if taken.is_none() && holder(store_redis.port, &[survivor]).is_some() {
            taken = Some(killed.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "no takeover\n{}",
            both(dead, survivor)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let converged = killed.elapsed();
    let taken = taken.unwrap_or(converged);
    println!(
        "takeover after kill -9: lease taken in {} ms, next commit on both edges in {} ms \
         (sync every {} ms, lease {} ms)",
        taken.as_millis(),
        converged.as_millis(),
        SYNC_EVERY.as_millis(),
        (SYNC_EVERY / 2).as_millis()
    );
    assert!(
        converged <= SYNC_EVERY,
        "took over in {converged:?}, more than one interval\n{}",
        both(dead, survivor)
    );
    for port in ports {
        let h = history(port);
        assert_eq!(
            h.iter().filter(|c| **c == c2).count(),
            1,
            "{h:?}\n{}",
            both(dead, survivor)
        );
    }

    // A lock left on edge-2 by a daemon killed mid-apply on another host
    // (its token names its lease, which no longer holds): taken over at
    // once, not after the lock's five minutes.
    let _: () = redis::cmd("SET")
        .arg(edgestate::keys::LOCK)
        .arg("control-b.example:4242:1:2:3:control-b.example/4242/dead/reconcile")
        .arg("PX")
        .arg(300_000)
        .query(&mut plain(ports[1]))
        .unwrap();
    let c3 = push(
        "sites/d.yaml",
        "host: d.example.com\norigin: http://192.0.2.4\n",
        "a fourth site",
    );
    wait_for(
        "the commit past a dead host's lock",
        SYNC_EVERY * 3,
        || {
            ports
                .iter()
                .all(|p| live(*p).as_deref() == Some(c3.as_str()))
        },
        &|| both(dead, survivor),
    );
    let log = survivor.log();
    assert!(
        log.contains("took over the apply lock of a dead holder")
            && log.contains("lease in the state store ran out"),
        "{log}"
    );

    // `edgeform unlock` reads such a token: without the store, a holder on
    // another host (refused; --force would remove it); with it, a lock
    // whose daemon's lease is gone (removed).
    let token = "control-b.example:4242:1:2:3:control-b.example/4242/other/reconcile";
    let _: () = redis::cmd("SET")
        .arg(edgestate::keys::LOCK)
        .arg(token)
        .query(&mut plain(ports[0]))
        .unwrap();
    let o = crate::util::edgeform(f.path(), &["unlock", "--node", "edge-1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("another host"), "{}", stderr(&o));
    let o = crate::util::edgeform(
        f.path(),
        &[
            "unlock",
            "--node",
            "edge-1",
            "--state-store",
            store_conf.to_str().unwrap(),
        ],
    );
    let out = crate::util::stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains(token) && out.contains("lease in the state store ran out"),
        "{out}"
    );
    drop(state_a);
    drop(state_b);
}

/// Two daemons and the real CA (pebble, validating through the real
/// edge): the certificate is ordered once, by the daemon holding the
/// lease; after a kill -9 the survivor runs the certificates job on the
/// shared certificate and renewal state and orders nothing.
#[test]
fn two_reconcilers_order_a_certificate_once_and_the_survivor_orders_none() {
    let r = harness::redis(&[]);
    let (_edge, pebble) = harness::pebble::behind_edge(r.port);
    let shared = harness::redis(&[]);
    let f = crate::util::acme_site_repo(&pebble, r.port);
    let tmp = tempfile::tempdir().unwrap();
    let store = format!("redis://127.0.0.1:{}", shared.port);
    let start = |host: &str| {
        let metrics = harness::free_port();
        harness::program(
            Path::new(env!("CARGO_BIN_EXE_edgeform")),
            [
                "--repo",
                f.path().to_str().unwrap(),
                "--state-dir",
                tmp.path().join(host).to_str().unwrap(),
                "--state-store",
                &store,
                "--log-format",
                "json",
                "reconcile",
                "--sync-every",
                "2s",
                "--heal-every",
                "1h",
                "--certs-every",
                "1s",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
            ]
            .map(str::to_owned)
            .to_vec(),
            std::net::Ipv4Addr::LOCALHOST,
            metrics,
        )
    };
    let mut daemons = [start("a"), start("b")];
    let logs = |d: &[harness::Process]| {
        d.iter()
            .map(harness::Process::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let ordered = |d: &[harness::Process]| {
        d.iter()
            .map(|p| p.log().matches("renewal: ordering").count())
            .sum::<usize>()
    };
    wait_for(
        "the certificate on the edge",
        Duration::from_secs(30),
        || {
            redis::cmd("GET")
                .arg("tls:shop.test")
                .query::<Option<String>>(&mut plain(r.port))
                .ok()
                .flatten()
                .is_some_and(|d| d.contains("BEGIN CERTIFICATE"))
        },
        &|| logs(&daemons),
    );
    // Three more runs of the job's interval: ordered once, by the holder.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ordered(&daemons), 1, "{}", logs(&daemons));
    let leader = {
        let refs: Vec<&harness::Process> = daemons.iter().collect();
        holder(shared.port, &refs).expect("a daemon holds the lease")
    };
    assert!(
        !daemons[1 - leader].log().contains("renewal:"),
        "the standby ran no certificates job\n{}",
        logs(&daemons)
    );
    daemons[leader].kill();
    let survivor = 1 - leader;
    wait_for(
        "the survivor's certificates job",
        Duration::from_secs(5),
        || daemons[survivor].log().contains("renewal: not due"),
        &|| logs(&daemons),
    );
    assert_eq!(ordered(&daemons), 1, "{}", logs(&daemons));
    assert!(
        daemons[survivor]
            .log()
            .contains("took the lease over; syncing now"),
        "{}",
        logs(&daemons)
    );
}
