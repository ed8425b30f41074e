//! Rollouts in waves (`apply.waves`) end to end: three real redis-server
//! targets, the real CLI and the real reconcile daemon. `apply` moves the
//! canary wave only; a second commit waits while a rollout is live;
//! `rollout abort` puts the canary back on its previous commit with the
//! rollback guard's consent in its history and remembers the commit; the
//! daemon rolls the next commit out, moving on after the canary's bake;
//! sync never applies the aborted commit again.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{Fixture, edgeform_with_state, stderr, stdout};

fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn meta(port: u16, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(edgestate::keys::META)
        .arg(field)
        .query(&mut con(port))
        .unwrap()
}

/// The newest history entry of a target.
fn newest(port: u16) -> serde_json::Value {
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(edgestate::keys::HISTORY)
        .arg(0)
        .arg(0)
        .query(&mut con(port))
        .unwrap();
    serde_json::from_str(&raw[0]).unwrap()
}

fn node(name: &str, host: u8, port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.{host}]\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

const WAVES: &str =
    "apply:\n  waves:\n    - {name: canary, nodes: [edge-1], bake: 2s}\n    - {name: rest}\n";

fn site(origin: &str) -> String {
    format!("host: a.example.com\norigin: {origin}\n")
}

fn status_json(repo: &Path, state: &Path) -> serde_json::Value {
    let o = edgeform_with_state(repo, state, &["rollout", "status", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn a_commit_rolls_out_wave_by_wave_waits_its_turn_aborts_back_and_is_never_reapplied() {
    let redis: Vec<harness::Process> = (0..3).map(|_| harness::redis(&[])).collect();
    let ports: Vec<u16> = redis.iter().map(|r| r.port).collect();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let nodes: Vec<String> = (0..3)
        .map(|i| node(&format!("edge-{}", i + 1), 11 + i as u8, ports[i]))
        .collect();
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &nodes[0]),
        ("nodes/edge-2.yaml", &nodes[1]),
        ("nodes/edge-3.yaml", &nodes[2]),
        ("sites/a.yaml", &site("http://192.0.2.1")),
    ]);
    let repo = f.path();
    let run = |args: &[&str]| edgeform_with_state(repo, &state, args);
    // c1, no waves: every target at once, as always.
    let c1 = f.commit("c1");
    let o = run(&["apply", "--yes"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        ports
            .iter()
            .all(|p| meta(*p, "commit").as_deref() == Some(&c1))
    );

    // c2: waves, and a site changed. `apply` moves the canary only.
    f.write_all(&[
        ("cluster.yaml", WAVES),
        ("sites/a.yaml", &site("http://192.0.2.2")),
    ]);
    let c2 = f.commit("c2");
    let o = run(&["plan"]);
    let text = stdout(&o);
    assert!(text.contains("Rollout in 2 wave(s)"), "{text}");
    assert!(text.contains("1. canary: edge-1 — bake 2s"), "{text}");
    assert!(text.contains("2. rest: edge-2, edge-3 — bake 0s"), "{text}");
    let o = run(&["apply", "--yes"]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    assert!(text.contains("wave canary applied; bakes until"), "{text}");
    assert!(
        text.contains("`edgeform rollout promote` or the daemon moves it on"),
        "{text}"
    );
    assert_eq!(meta(ports[0], "commit").as_deref(), Some(c2.as_str()));
    assert_eq!(meta(ports[0], "wave").as_deref(), Some("canary"));
    assert_eq!(newest(ports[0])["wave"], "canary");
    for p in &ports[1..] {
        assert_eq!(meta(*p, "commit").as_deref(), Some(c1.as_str()), "not yet");
    }
    let s = status_json(repo, &state);
    assert_eq!(s["rollout"]["commit"], c2.as_str());
    assert_eq!(s["rollout"]["state"], "baking");
    assert_eq!(
        s["rollout"]["changed_hosts"],
        serde_json::json!(["a.example.com"])
    );
    assert_eq!(
        s["rollout"]["waves"][1]["nodes"],
        serde_json::json!(["edge-2", "edge-3"])
    );
    let o = run(&["rollout", "status"]);
    let text = stdout(&o);
    assert!(text.contains("baking: wave canary until"), "{text}");
    assert!(
        text.contains("wave rest [edge-2, edge-3] bake 0s: pending"),
        "{text}"
    );

    // c3 while c2's rollout is live: it waits (one commit at a time).
    f.write_all(&[("sites/a.yaml", &site("http://192.0.2.3"))]);
    let c3 = f.commit("c3");
    let o = run(&["apply", "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("waits: the rollout of"),
        "{}",
        stdout(&o)
    );
    assert_eq!(meta(ports[0], "commit").as_deref(), Some(c2.as_str()));

    // Abort: the canary back on c1, with the guard's consent recorded.
    let o = run(&["rollout", "abort"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        ports
            .iter()
            .all(|p| meta(*p, "commit").as_deref() == Some(&c1))
    );
    let e = newest(ports[0]);
    assert_eq!(e["consent"], "rollback by rollout abort");
    assert_eq!(
        (e["commit"].as_str(), e["previous_commit"].as_str()),
        (Some(c1.as_str()), Some(c2.as_str()))
    );
    let o = run(&["history", "--node", "edge-1"]);
    assert!(
        stdout(&o).contains("rollback by rollout abort"),
        "{}",
        stdout(&o)
    );
    let s = status_json(repo, &state);
    assert_eq!(s["rollout"]["state"], "aborted");
    assert_eq!(s["aborted"], serde_json::json!([c2]));

    // The daemon rolls c3 out: the canary, then the rest after its bake.
    let (_, mut daemon) = crate::util::sync_daemon(repo, &state);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ports
        .iter()
        .all(|p| meta(*p, "commit").as_deref() == Some(&c3))
    {
        assert!(
            Instant::now() < deadline,
            "not rolled out:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = status_json(repo, &state);
    assert_eq!(s["rollout"]["commit"], c3.as_str());
    assert_eq!(s["rollout"]["state"], "complete");
    let canary_baked = s["rollout"]["waves"][0]["bake_until"].as_u64().unwrap();
    let rest_at = s["rollout"]["waves"][1]["applied_at"].as_u64().unwrap();
    assert!(rest_at >= canary_baked, "the rest waited for the bake: {s}");
    assert_eq!(meta(ports[1], "wave").as_deref(), Some("rest"));
    assert_eq!(newest(ports[2])["action"], "sync");
    daemon.stop();

    // Sync at the aborted commit: nothing moves.
    let o = run(&["reconcile", "--once", "sync", "--rev", &c2]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the commit is not applied"),
        "{}",
        stderr(&o)
    );
    assert!(
        ports
            .iter()
            .all(|p| meta(*p, "commit").as_deref() == Some(&c3))
    );
}

#[test]
fn a_gate_that_cannot_judge_halts_the_rollout_and_auto_rollback_puts_the_canary_back() {
    let redis: Vec<harness::Process> = (0..2).map(|_| harness::redis(&[])).collect();
    let ports: Vec<u16> = redis.iter().map(|r| r.port).collect();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &node("edge-1", 11, ports[0])),
        ("nodes/edge-2.yaml", &node("edge-2", 12, ports[1])),
    ]);
    let repo = f.path();
    let run = |args: &[&str]| edgeform_with_state(repo, &state, args);
    let c1 = f.commit("c1");
    assert!(run(&["apply", "--yes"]).status.success());
    // The gate's source answers nothing: the gate cannot judge.
    let dead = harness::free_port();
    let cluster = format!(
        "apply:\n  waves:\n    - {{name: canary, nodes: [edge-1], bake: 1s}}\n    - {{name: rest}}\n  \
         prometheus: http://127.0.0.1:{dead}\n  auto_rollback: true\n"
    );
    f.write_all(&[
        ("cluster.yaml", &cluster),
        ("sites/a.yaml", &site("http://192.0.2.2")),
    ]);
    let c2 = f.commit("c2");
    let o = run(&["apply", "--yes"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(meta(ports[0], "commit").as_deref(), Some(c2.as_str()));
    std::thread::sleep(Duration::from_millis(2100));
    // The sync job asks the gate after the bake: halted, rolled back.
    let o = run(&["reconcile", "--once", "sync"]);
    assert!(
        stderr(&o).contains("rollout halted by the gate"),
        "{}",
        stderr(&o)
    );
    assert!(
        ports
            .iter()
            .all(|p| meta(*p, "commit").as_deref() == Some(&c1))
    );
    assert_eq!(newest(ports[0])["consent"], "rollback by rollout abort");
    let s = status_json(repo, &state);
    assert_eq!(s["rollout"]["state"], "aborted");
    assert!(
        s["rollout"]["by"]
            .as_str()
            .unwrap()
            .starts_with("gate (auto_rollback)"),
        "{s}"
    );
    assert_eq!(s["aborted"], serde_json::json!([c2]));
    // Never applied again: the next sync leaves every target on c1.
    let o = run(&["reconcile", "--once", "sync"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        ports
            .iter()
            .all(|p| meta(*p, "commit").as_deref() == Some(&c1))
    );
}

#[test]
fn a_halted_rollout_waits_for_the_operator_and_promote_moves_it_on_recording_who() {
    let redis: Vec<harness::Process> = (0..2).map(|_| harness::redis(&[])).collect();
    let ports: Vec<u16> = redis.iter().map(|r| r.port).collect();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &node("edge-1", 11, ports[0])),
        ("nodes/edge-2.yaml", &node("edge-2", 12, ports[1])),
    ]);
    let repo = f.path();
    let run = |args: &[&str]| edgeform_with_state(repo, &state, args);
    let c1 = f.commit("c1");
    assert!(run(&["apply", "--yes"]).status.success());
    let dead = harness::free_port();
    let cluster = format!(
        "apply:\n  waves:\n    - {{name: canary, nodes: [edge-1], bake: 1s}}\n    - {{name: rest}}\n  \
         prometheus: http://127.0.0.1:{dead}\n"
    );
    f.write_all(&[
        ("cluster.yaml", &cluster),
        ("sites/a.yaml", &site("http://192.0.2.2")),
    ]);
    let c2 = f.commit("c2");
    assert!(run(&["apply", "--yes"]).status.success());
    std::thread::sleep(Duration::from_millis(2100));
    // The next apply asks the gate: halted, nothing more applied.
    let o = run(&["apply", "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("halted: the gate could not judge"),
        "{}",
        stdout(&o)
    );
    assert_eq!(meta(ports[0], "commit").as_deref(), Some(c2.as_str()));
    assert_eq!(meta(ports[1], "commit").as_deref(), Some(c1.as_str()));
    assert_eq!(status_json(repo, &state)["rollout"]["state"], "halted");
    // The operator's call: the next wave anyway, recorded on the wave.
    let o = run(&["rollout", "promote"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("(promoted by "), "{}", stdout(&o));
    assert_eq!(meta(ports[1], "commit").as_deref(), Some(c2.as_str()));
    assert_eq!(meta(ports[1], "wave").as_deref(), Some("rest"));
    let s = status_json(repo, &state);
    assert!(
        s["rollout"]["waves"][1]["promoted_by"].as_str().is_some(),
        "{s}"
    );
    assert_eq!(s["rollout"]["state"], "baking");
    // Every wave applied: promoting again accepts the last one (the gate
    // would halt it again), and the cluster is free for the next commit.
    let o = run(&["rollout", "promote"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(status_json(repo, &state)["rollout"]["state"], "complete");
}

/// During a rollout two commits are live, and the stricter freeze wins: a
/// commit that drops the open freeze window of the commit the targets
/// hold does not move a wave (nothing applied, exit 1) until
/// `--break-glass`.
#[test]
fn the_freeze_of_the_commit_being_replaced_holds_the_rollout() {
    let r = harness::redis(&[]);
    let r2 = harness::redis(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let freeze = "apply:\n  freeze:\n    - name: final\n      \
                  start: \"2020-01-01T00:00:00Z\"\n      end: \"2099-01-01T00:00:00Z\"\n";
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &node("edge-1", 11, r.port)),
        ("nodes/edge-2.yaml", &node("edge-2", 12, r2.port)),
        ("cluster.yaml", freeze),
        ("sites/a.yaml", &site("http://192.0.2.1")),
    ]);
    let run = |args: &[&str]| edgeform_with_state(f.path(), &state, args);
    let c1 = f.commit("c1: frozen");
    let o = run(&["apply", "--yes", "--break-glass"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    f.write_all(&[
        ("cluster.yaml", WAVES),
        ("sites/a.yaml", &site("http://192.0.2.2")),
    ]);
    let c2 = f.commit("c2: waves, the freeze dropped");
    let o = run(&["apply", "--yes"]);
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the next wave waits: freeze window final is open until 2099-01-01"),
        "{text}"
    );
    assert_eq!(meta(r.port, "commit").as_deref(), Some(c1.as_str()));
    let o = run(&["apply", "--yes", "--break-glass"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(meta(r.port, "commit").as_deref(), Some(c2.as_str()));
}

/// Three edges on c1, then c2 with `cluster`'s waves applied by `apply`
/// (its first wave out); the state directory of its own.
struct Rolling {
    _redis: Vec<harness::Process>,
    ports: Vec<u16>,
    tmp: tempfile::TempDir,
    f: Fixture,
    c1: String,
    c2: String,
}

impl Rolling {
    fn start(cluster: &str) -> Rolling {
        let redis: Vec<harness::Process> = (0..3).map(|_| harness::redis(&[])).collect();
        let ports: Vec<u16> = redis.iter().map(|r| r.port).collect();
        let f = Fixture::with(&[
            ("nodes/edge-1.yaml", &node("edge-1", 11, ports[0])),
            ("nodes/edge-2.yaml", &node("edge-2", 12, ports[1])),
            ("nodes/edge-3.yaml", &node("edge-3", 13, ports[2])),
        ]);
        let mut r = Rolling {
            _redis: redis,
            ports,
            tmp: tempfile::tempdir().unwrap(),
            f,
            c1: String::new(),
            c2: String::new(),
        };
        r.c1 = r.f.commit("c1");
        assert!(r.run(&["apply", "--yes"]).status.success());
        r.f.write_all(&[
            ("cluster.yaml", cluster),
            ("sites/a.yaml", &site("http://192.0.2.2")),
        ]);
        r.c2 = r.f.commit("c2");
        assert!(r.run(&["apply", "--yes"]).status.success());
        assert_eq!(meta(r.ports[0], "commit").as_deref(), Some(r.c2.as_str()));
        r
    }

    fn state(&self) -> std::path::PathBuf {
        self.tmp.path().join("state")
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        edgeform_with_state(self.f.path(), &self.state(), args)
    }

    /// `args` in the background, each apply it makes held 3 s under the
    /// targets' locks.
    fn held(&self, args: &[&str]) -> std::process::Child {
        std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
            .args(args)
            .current_dir(self.f.path())
            .env("NO_COLOR", "1")
            .env("EDGEFORM_STATE_DIR", self.state())
            .env("EDGEFORM_TEST_HOLD_LOCK_MS", "3000")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Every edge on `commit`.
    fn all_on(&self, commit: &str, said: &str) {
        for port in &self.ports {
            assert_eq!(meta(*port, "commit").as_deref(), Some(commit), "{said}");
        }
    }
}

/// `rollout abort` while a `rollout promote` is applying the next wave
/// (held under the targets' locks): the abort sticks. The promote never
/// writes its book over the aborted one; the wave it applied meanwhile is
/// counted in the aborted rollout and rolled back too, so every target
/// ends on its previous commit and the commit stays aborted.
#[test]
fn an_abort_during_a_promote_sticks_and_the_wave_applied_meanwhile_is_rolled_back() {
    let r = Rolling::start(
        "apply:\n  waves:\n    - {name: canary, nodes: [edge-1], bake: 1s}\n    - {name: rest}\n",
    );
    let promote = r.held(&["rollout", "promote"]);
    std::thread::sleep(Duration::from_millis(1000));
    let o = r.run(&["rollout", "abort"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = promote.wait_with_output().unwrap();
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(said.contains("rolled back too"), "{said}");
    r.all_on(&r.c1, &said);
    let s = status_json(r.f.path(), &r.state());
    assert_eq!(s["rollout"]["state"], "aborted", "{s}");
    // The next sync leaves the aborted commit alone.
    let o = r.run(&["sync", "--yes"]);
    assert!(
        !stdout(&o).contains("applied"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    r.all_on(&r.c1, "after sync");
}

/// `rollout abort` while `apply` is applying the first wave of a new
/// rollout: the rollout is kept before its first wave, so the abort finds
/// it (not the rollout before), and the wave applied meanwhile goes back.
#[test]
fn an_abort_during_the_first_wave_of_a_new_rollout_aborts_that_rollout() {
    let r = Rolling::start(WAVES);
    let o = r.run(&["rollout", "abort"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(meta(r.ports[0], "commit").as_deref(), Some(r.c1.as_str()));
    r.f.write_all(&[("sites/a.yaml", &site("http://192.0.2.3"))]);
    let c3 = r.f.commit("c3");
    let apply = r.held(&["apply", "--yes"]);
    std::thread::sleep(Duration::from_millis(1500));
    let o = r.run(&["rollout", "abort"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains(&c3[..12]), "{}", stdout(&o));
    let o = apply.wait_with_output().unwrap();
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(said.contains("rolled back too"), "{said}");
    let s = status_json(r.f.path(), &r.state());
    assert_eq!(s["rollout"]["commit"], c3.as_str(), "{s}");
    assert_eq!(s["rollout"]["state"], "aborted", "{s}");
    assert_ne!(r.c2, c3);
    r.all_on(&r.c1, &said);
}

/// A second `rollout abort` (finishing an aborted rollout whose target
/// was left at its commit) that loses its compare-and-set to the next
/// commit's rollout, started meanwhile, never aborts that one: it stops
/// and says so.
#[test]
fn an_abort_never_aborts_a_rollout_started_during_it() {
    let r = Rolling::start(WAVES);
    let o = r.run(&["rollout", "abort"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(meta(r.ports[0], "commit").as_deref(), Some(r.c1.as_str()));
    // As if edge-1's rollback had failed: still at c2 (the next abort
    // finishes it, docs/operations.md).
    let _: () = redis::cmd("HSET")
        .arg(edgestate::keys::META)
        .arg("commit")
        .arg(&r.c2)
        .query(&mut con(r.ports[0]))
        .unwrap();
    let again = r.held(&["rollout", "abort"]);
    std::thread::sleep(Duration::from_millis(1000));
    // Meanwhile the fix, c3, canary edge-2, is applied.
    r.f.write_all(&[
        (
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: canary, nodes: [edge-2], bake: 60s}\n    - {name: rest}\n",
        ),
        ("sites/a.yaml", &site("http://192.0.2.3")),
    ]);
    let c3 = r.f.commit("c3");
    let o = r.run(&["apply", "--yes"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(meta(r.ports[1], "commit").as_deref(), Some(c3.as_str()));
    let o = again.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("started during the abort"),
        "{}",
        stderr(&o)
    );
    let s = status_json(r.f.path(), &r.state());
    assert_eq!(s["rollout"]["commit"], c3.as_str(), "{s}");
    assert_ne!(s["rollout"]["state"], "aborted", "{s}");
    assert_eq!(meta(r.ports[1], "commit").as_deref(), Some(c3.as_str()));
    assert_eq!(meta(r.ports[0], "commit").as_deref(), Some(r.c1.as_str()));
}
