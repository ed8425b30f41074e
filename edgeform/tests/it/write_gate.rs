//! Against real `redis-server`s (and mosquitto with a real agent for
//! `status`): heal and sync pass apply's gate when they move a target to
//! another commit, repair at the target's own commit is free, `--dry-run` writes nothing; status verdicts and exit codes; the
//! audit trail; freeze windows and `--break-glass`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::util::{Agent, Fixture, stderr, stdout};

/// `edgeform` with `args` in `dir`, the clock moved with `--now` when
/// given.
fn ef(dir: &Path, args: &[&str], now: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeform"));
    c.current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("EDGEFORM_NOW");
    if let Some(t) = now {
        c.args(["--now", t]);
    }
    c.args(args).output().unwrap()
}

fn run(dir: &Path, args: &[&str]) -> Output {
    ef(dir, args, None)
}

fn both(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn get(port: u16, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut con(port)).unwrap()
}

fn meta(port: u16) -> BTreeMap<String, String> {
    redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut con(port))
        .unwrap()
}

/// Every key and its `DUMP`: the whole dataset, to show nothing changed.
fn snapshot(port: u16) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut c = con(port);
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    keys.into_iter()
        .map(|k| {
            let v: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut c).unwrap();
            (k, v)
        })
        .collect()
}

fn edge(name: &str, port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

fn site(f: &Fixture, i: usize, origin: &str) {
    f.write(
        &format!("sites/s{i:05}.yaml"),
        format!("host: s{i:05}.example.com\norigin: {origin}\n").as_bytes(),
    );
}

/// A repository of `n` sites on edge-1 (Redis at `port`), committed.
fn repo(port: u16, n: usize, cluster: &str) -> (Fixture, String) {
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", edge("edge-1", port).as_bytes());
    if !cluster.is_empty() {
        f.write("cluster.yaml", cluster.as_bytes());
    }
    for i in 0..n {
        site(&f, i, "http://192.0.2.1");
    }
    let c = f.commit("sites");
    (f, c)
}

fn applied(port: u16, n: usize) -> (Fixture, String) {
    let (f, c) = repo(port, n, "");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    (f, c)
}

/// Commit A (300 sites) applied, then commit B deleting 200 of them.
fn mass_deletion(port: u16) -> (Fixture, String, String) {
    let (f, a) = applied(port, 300);
    for i in 100..300 {
        f.write(&format!("sites/s{i:05}.yaml"), b"");
    }
    let b = f.commit("delete 200 sites");
    (f, a, b)
}

/// Every way to move the target to B is refused the same way, and leaves
/// it untouched.
fn refused_everywhere(f: &Fixture, port: u16, a: &str) {
    let before = snapshot(port);
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(
        stdout(&out).contains("edge-1: REFUSED (deletes): refusing to delete 200 of 301"),
        "{}",
        both(&out)
    );
    for job in ["heal", "sync"] {
        let out = run(f.path(), &["reconcile", "--once", job]);
        assert_eq!(out.status.code(), Some(1), "{job}: {}", both(&out));
        let log = stderr(&out);
        assert!(
            log.contains(&format!("{job} refused: nothing written"))
                && log.contains("reason=\"deletes\"")
                && log.contains("refusing to delete 200 of 301"),
            "{job}: {log}"
        );
    }
    assert_eq!(snapshot(port), before);
    assert_eq!(meta(port)["commit"], a);
}

// A mass deletion: heal refuses exactly as apply; --force.
#[test]
fn heal_refuses_a_mass_deletion_as_apply_does_and_force_is_honoured() {
    let r = harness::redis(&[]);
    let (f, a, b) = mass_deletion(r.port);
    refused_everywhere(&f, r.port, &a);
    let out = run(f.path(), &["reconcile", "--once", "heal", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(get(r.port, "site:s00299.example.com"), None);
    assert!(get(r.port, "site:s00099.example.com").is_some());
    assert_eq!(meta(r.port)["commit"], b);
    assert_eq!(meta(r.port)["forced"], "true");
    // Now at B: in sync, nothing refused.
    let out = run(f.path(), &["reconcile", "--once", "sync"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
}

// Sync refuses the same move; --force.
#[test]
fn sync_refuses_a_mass_deletion_as_apply_does_and_force_is_honoured() {
    let r = harness::redis(&[]);
    let (f, a, b) = mass_deletion(r.port);
    refused_everywhere(&f, r.port, &a);
    let out = run(f.path(), &["reconcile", "--once", "sync", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(get(r.port, "site:s00299.example.com"), None);
    assert_eq!(meta(r.port)["commit"], b);
    let out = run(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert!(stderr(&out).contains("heal: no drift"), "{}", both(&out));
}

/// A commit cannot raise the thresholds it is checked against: one that
/// deletes 200 of 300 sites and sets `max_delete_percent: 100` is held
/// by apply, sync and heal to the live commit's 25 %. Raising the limit
/// in a commit of its own (it changes no key) and then deleting goes.
#[test]
fn a_commit_that_raises_its_own_thresholds_is_held_to_the_live_ones() {
    let r = harness::redis(&[]);
    let (f, a) = applied(r.port, 300);
    let lax = b"name: test\napply: {max_delete_percent: 100, max_change_percent: 100}\n";
    for i in 100..300 {
        f.write(&format!("sites/s{i:05}.yaml"), b"");
    }
    f.write("cluster.yaml", lax);
    f.commit("delete 200 sites, and allow it");
    refused_everywhere(&f, r.port, &a);
    // plan warns of the same refusal.
    let out = run(f.path(), &["plan", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["targets"][0]["apply_refused_kind"], "deletes", "{v}");
    // The limit raised alone first ...
    for i in 100..300 {
        site(&f, i, "http://192.0.2.1");
    }
    let raised = f.commit("allow deleting everything");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r.port)["commit"], raised);
    // ... then the deletion is checked against it.
    for i in 100..300 {
        f.write(&format!("sites/s{i:05}.yaml"), b"");
    }
    let deleted = f.commit("delete 200 sites");
    let out = run(f.path(), &["reconcile", "--once", "sync"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r.port)["commit"], deleted);
    assert_eq!(get(r.port, "site:s00299.example.com"), None);
}

// Repair back to the target's own commit is free.
#[test]
fn repair_at_the_own_commit_passes_no_threshold() {
    let r = harness::redis(&[]);
    let (f, a) = applied(r.port, 300);
    // 200 of 301 documents deleted by hand: far over every threshold,
    // but healing puts back what commit A already holds.
    let mut c = con(r.port);
    for i in 100..300 {
        redis::cmd("DEL")
            .arg(format!("site:s{i:05}.example.com"))
            .exec(&mut c)
            .unwrap();
    }
    let out = run(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert!(stderr(&out).contains("repaired=200"), "{}", stderr(&out));
    assert!(get(r.port, "site:s00299.example.com").is_some());
    assert_eq!(meta(r.port)["commit"], a);
    assert_eq!(meta(r.port)["forced"], "false");
}

// `reconcile --once heal --dry-run` lists, writes nothing.
#[test]
fn heal_dry_run_lists_the_drift_and_changes_nothing() {
    let r = harness::redis(&[]);
    let (f, _) = applied(r.port, 20);
    let mut c = con(r.port);
    for (cmd, args) in [
        ("SET", &["site:s00003.example.com", "{\"evil\":1}"][..]),
        ("DEL", &["site:s00004.example.com"][..]),
        ("SET", &["site:rogue.example.com", "{}"][..]),
    ] {
        redis::cmd(cmd).arg(args).exec(&mut c).unwrap();
    }
    let before = snapshot(r.port);
    let out = run(f.path(), &["reconcile", "--once", "heal", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let listed = stdout(&out);
    for line in [
        "edge-1\tmissing\tsite:s00004.example.com",
        "edge-1\tchanged\tsite:s00003.example.com",
        "edge-1\tunmanaged\tsite:rogue.example.com",
    ] {
        assert!(listed.contains(line), "{line}: {listed}");
    }
    assert_eq!(listed.lines().count(), 3, "{listed}");
    assert_eq!(snapshot(r.port), before, "a dry run wrote");
    // --dry-run goes with --once heal only (usage error).
    let out = run(f.path(), &["reconcile", "--once", "sync", "--dry-run"]);
    assert_eq!(out.status.code(), Some(64), "{}", both(&out));
    let out = run(f.path(), &["reconcile", "--dry-run"]);
    assert_eq!(out.status.code(), Some(64), "{}", both(&out));
    assert_eq!(snapshot(r.port), before);
    // A real heal repairs it; then the dry run finds nothing (exit 0).
    let out = run(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let out = run(f.path(), &["reconcile", "--once", "heal", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(stdout(&out), "");
    // A dry run of a refused move says so (exit 1), still writing nothing.
    for i in 0..20 {
        f.write(&format!("sites/s{i:05}.yaml"), b"");
    }
    site(&f, 99, "http://192.0.2.9");
    f.commit("replace every site");
    let before = snapshot(r.port);
    let out = run(f.path(), &["reconcile", "--once", "heal", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(
        stdout(&out).contains("edge-1\trefused\trefusing to delete 20 of 21"),
        "{}",
        both(&out)
    );
    assert_eq!(snapshot(r.port), before);
}

/// `history --format json` of edge-1.
fn history(f: &Fixture) -> Vec<serde_json::Value> {
    let out = run(
        f.path(),
        &["history", "--node", "edge-1", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

// The audit trail after three applies.
#[test]
fn history_records_each_apply_with_who_what_and_force() {
    let r = harness::redis(&[]);
    let (f, a) = applied(r.port, 20);
    site(&f, 1, "http://192.0.2.2");
    let b = f.commit("one origin");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    for i in 0..15 {
        site(&f, i, "http://192.0.2.3");
    }
    let c = f.commit("most origins");
    // 15 of 21 changed is over 50 %: forced.
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let out = run(f.path(), &["apply", "--yes", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));

    let h = history(&f);
    assert_eq!(h.len(), 3, "{h:?}");
    let user = std::env::var("USER").unwrap_or_default();
    for (e, (commit, previous, written, forced)) in h.iter().zip([
        (&c, Some(&b), 15, true),
        (&b, Some(&a), 1, false),
        (&a, None, 21, false),
    ]) {
        assert_eq!(e["action"], "apply", "{e}");
        assert_eq!(e["commit"], *commit, "{e}");
        assert_eq!(
            e["previous_commit"].as_str(),
            previous.map(String::as_str),
            "{e}"
        );
        assert_eq!(e["written"], written, "{e}");
        assert_eq!(e["forced"], forced, "{e}");
        assert_eq!(e["break_glass"], false, "{e}");
        let by = e["applied_by"].as_str().unwrap();
        assert!(
            by.contains('@') && (user.is_empty() || by.starts_with(&format!("{user}@"))),
            "{e}"
        );
        assert!(
            e["command"]
                .as_str()
                .unwrap()
                .starts_with("edgeform apply --yes"),
            "{e}"
        );
    }
    assert_eq!(h[0]["generation"], 3);
    assert_eq!(h[0]["command"], "edgeform apply --yes --force");
    // The meta says the same about the last write.
    let m = meta(r.port);
    assert_eq!(m["applied_by"], h[0]["applied_by"].as_str().unwrap());
    assert_eq!(m["forced"], "true");
    assert_eq!(m["command"], "edgeform apply --yes --force");
    // Human form: one line per write, newest first.
    let out = run(f.path(), &["history", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.lines().next().unwrap().contains("[forced]"), "{text}");
    assert!(
        text.lines()
            .nth(2)
            .unwrap()
            .contains(&format!("none → {}", &a[..12])),
        "{text}"
    );

    // A heal's repair is recorded too; the list stays capped at 100.
    let mut k = con(r.port);
    let filler: Vec<String> = (0..150).map(|i| format!("old {i}")).collect();
    redis::cmd("RPUSH")
        .arg("edgeform:history")
        .arg(&filler)
        .exec(&mut k)
        .unwrap();
    redis::cmd("DEL")
        .arg("site:s00019.example.com")
        .exec(&mut k)
        .unwrap();
    let out = run(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let h = history(&f);
    assert_eq!(h.len(), 100);
    assert_eq!(h[0]["action"], "heal");
    assert_eq!(h[0]["commit"], c.as_str());
    assert_eq!(h[0]["written"], 1);
    assert_eq!(h[1]["commit"], c.as_str());
    assert_eq!(h[4]["unreadable"], "old 0");
    // Unknown node: exit 1, named.
    let out = run(f.path(), &["history", "--node", "edge-9"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--node edge-9: no such target"),
        "{}",
        both(&out)
    );
}

const FREEZE: &str = "name: test\napply:\n  freeze:\n    - name: final\n      \
                      start: \"2020-12-24T18:00:00Z\"\n      end: \"2020-12-26T06:00:00+00:00\"\n      \
                      reason: the final, live\n";
const INSIDE: Option<&str> = Some("2020-12-25T12:00:00Z");
const OUTSIDE: Option<&str> = Some("2020-12-26T06:00:00Z");

// A freeze honoured by apply and reconcile, broken with --break-glass.
#[test]
fn a_freeze_is_honoured_and_broken_with_break_glass() {
    let r = harness::redis(&[]);
    let (f, a) = repo(r.port, 20, FREEZE);
    // Outside the window (its end is exclusive): applied.
    let out = ef(f.path(), &["apply", "--yes"], OUTSIDE);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    site(&f, 1, "http://192.0.2.2");
    let b = f.commit("one origin");
    let before = snapshot(r.port);
    // Inside: apply, sync and a heal that would move the commit refuse;
    // --force is not --break-glass.
    for args in [&["apply", "--yes"][..], &["apply", "--yes", "--force"][..]] {
        let out = ef(f.path(), args, INSIDE);
        assert_eq!(out.status.code(), Some(1), "{}", both(&out));
        assert!(
            stdout(&out).contains(
                "edge-1: REFUSED (frozen): refusing to move to another commit during the freeze window `final` (until 2020-12-26T06:00:00Z; use --break-glass)"
            ),
            "{}",
            both(&out)
        );
    }
    for job in ["sync", "heal"] {
        let out = ef(f.path(), &["reconcile", "--once", job], INSIDE);
        assert_eq!(out.status.code(), Some(1), "{}", both(&out));
        assert!(stderr(&out).contains("reason=\"frozen\""), "{}", both(&out));
        assert!(
            stderr(&out).contains("a freeze window is open")
                && stderr(&out).contains("reason=the final, live until=2020-12-26T06:00:00Z"),
            "{}",
            both(&out)
        );
    }
    // plan warns what apply would refuse.
    let out = ef(f.path(), &["plan"], INSIDE);
    assert!(
        stdout(&out).contains("apply would refuse edge-1: refusing to move to another commit during the freeze window `final`"),
        "{}",
        both(&out)
    );
    let out = ef(f.path(), &["plan", "--format", "json"], INSIDE);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["targets"][0]["apply_refused_kind"], "frozen", "{v}");
    // A daemon cannot break glass for ever: --break-glass needs --once.
    let out = ef(f.path(), &["reconcile", "--break-glass"], INSIDE);
    assert_eq!(out.status.code(), Some(64), "{}", both(&out));
    assert_eq!(snapshot(r.port), before);
    // Repair at the target's own commit goes on during the freeze.
    redis::cmd("DEL")
        .arg("site:s00005.example.com")
        .exec(&mut con(r.port))
        .unwrap();
    let out = ef(
        f.path(),
        &["--rev", &a, "reconcile", "--once", "heal"],
        INSIDE,
    );
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert!(get(r.port, "site:s00005.example.com").is_some());
    // --break-glass: applied, and the history says so.
    let out = ef(f.path(), &["apply", "--yes", "--break-glass"], INSIDE);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r.port)["commit"], b);
    let h = history(&f);
    assert_eq!(h[0]["break_glass"], true, "{h:?}");
    assert_eq!(h[0]["freeze"], "final", "{h:?}");
    assert_eq!(h[0]["at"], "2020-12-25T12:00:00Z", "{h:?}");
    // The moved clock is recorded as such, with the real time.
    let real = h[0]["clock_moved"].as_str().unwrap_or_default();
    assert!(
        real.starts_with("20") && real != "2020-12-25T12:00:00Z",
        "{h:?}"
    );
    assert_eq!(h[1]["action"], "heal", "{h:?}");
    assert!(h[1].get("freeze").is_none(), "{h:?}");
    let text = stdout(&run(f.path(), &["history", "--node", "edge-1"]));
    assert!(text.contains("break-glass (freeze final)"), "{text}");
    assert!(text.contains("clock moved by --now, real time"), "{text}");
    // A clock that is not a time: a usage error before anything runs.
    let out = ef(f.path(), &["apply", "--yes"], Some("tomorrow"));
    assert_eq!(out.status.code(), Some(64), "{}", both(&out));
    assert!(
        stderr(&out).contains("`tomorrow` is not an RFC 3339 time"),
        "{}",
        both(&out)
    );
    // The environment never moves the clock: EDGEFORM_NOW is refused.
    for args in [
        &["apply", "--yes"][..],
        &["plan"],
        &["reconcile", "--once", "sync"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_edgeform"))
            .args(args)
            .current_dir(f.path())
            .env("NO_COLOR", "1")
            .env("EDGEFORM_NOW", "2020-12-27T00:00:00Z")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", both(&out));
        assert!(
            both(&out).contains("EDGEFORM_NOW is set: the clock is not moved from the environment"),
            "{}",
            both(&out)
        );
    }
}

/// A commit cannot lift the freeze it is applied under: one that changes
/// a site and deletes `apply.freeze` is refused by apply, sync and heal
/// (the live commit's window is in force) and goes through only with
/// `--break-glass`, which the history records with that window.
#[test]
fn a_commit_that_deletes_the_open_freeze_does_not_lift_it() {
    let r = harness::redis(&[]);
    let (f, a) = repo(r.port, 20, FREEZE);
    let out = ef(f.path(), &["apply", "--yes"], OUTSIDE);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r.port)["commit"], a);
    site(&f, 1, "http://192.0.2.2");
    f.write("cluster.yaml", b"name: test\n");
    let b = f.commit("one origin, and no freeze");
    let before = snapshot(r.port);
    for args in [&["apply", "--yes"][..], &["apply", "--yes", "--force"]] {
        let out = ef(f.path(), args, INSIDE);
        assert_eq!(out.status.code(), Some(1), "{}", both(&out));
        assert!(
            stdout(&out).contains("edge-1: REFUSED (frozen): refusing to move to another commit during the freeze window `final`"),
            "{}",
            both(&out)
        );
    }
    for job in ["sync", "heal"] {
        let out = ef(f.path(), &["reconcile", "--once", job], INSIDE);
        assert_eq!(out.status.code(), Some(1), "{}", both(&out));
        assert!(stderr(&out).contains("reason=\"frozen\""), "{}", both(&out));
    }
    let out = ef(f.path(), &["plan", "--format", "json"], INSIDE);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["targets"][0]["apply_refused_kind"], "frozen", "{v}");
    assert_eq!(snapshot(r.port), before, "nothing was written");
    // --break-glass breaks the live commit's window, recorded.
    let out = ef(f.path(), &["apply", "--yes", "--break-glass"], INSIDE);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r.port)["commit"], b);
    let h = history(&f);
    assert_eq!(h[0]["break_glass"], true, "{h:?}");
    assert_eq!(h[0]["freeze"], "final", "{h:?}");
}

/// A target whose Redis lost `edgeform:meta` is held to the freeze the
/// other targets' live commit has open: a commit that deletes the window
/// moves neither target (sync, heal, apply) without `--break-glass`.
#[test]
fn a_target_that_lost_its_meta_is_held_to_the_other_targets_freeze() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let (f, a) = repo(r1.port, 20, FREEZE);
    f.write("nodes/edge-2.yaml", edge("edge-2", r2.port).as_bytes());
    let a2 = f.commit("a second edge");
    let out = ef(f.path(), &["apply", "--yes"], OUTSIDE);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r2.port)["commit"], a2);
    site(&f, 1, "http://192.0.2.2");
    f.write("cluster.yaml", b"name: test\n");
    f.commit("one origin, and no freeze");
    redis::cmd("DEL")
        .arg("edgeform:meta")
        .exec(&mut con(r2.port))
        .unwrap();
    let before = (snapshot(r1.port), snapshot(r2.port));
    for args in [
        &["reconcile", "--once", "sync"][..],
        &["reconcile", "--once", "heal"],
        &["apply", "--yes"],
    ] {
        let out = ef(f.path(), args, INSIDE);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", both(&out));
        assert_eq!(
            (snapshot(r1.port), snapshot(r2.port)),
            before,
            "{args:?}: nothing was written: {}",
            both(&out)
        );
    }
    // Also when the run is limited to that target.
    let out = ef(f.path(), &["apply", "--yes", "--node", "edge-2"], INSIDE);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(
        stdout(&out).contains("edge-2: REFUSED (frozen)"),
        "{}",
        both(&out)
    );
    assert_eq!(snapshot(r2.port), before.1);
    let _ = a;
}

/// Moving the clock never lifts a freeze: under `--now`, a window open at
/// the real time blocks as one open at the moved time does (apply, sync,
/// heal), until `--break-glass`, which the history records with the
/// window, the moved time and the real one.
#[test]
fn a_moved_clock_does_not_open_a_freeze_open_at_the_real_time() {
    let r = harness::redis(&[]);
    let (f, _) = repo(r.port, 20, "name: test\n");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    // A window open now (real time), closed at the moved time.
    f.write(
        "cluster.yaml",
        b"name: test\napply:\n  freeze:\n    - name: now\n      \
          start: \"2000-01-01T00:00:00Z\"\n      end: \"2100-01-01T00:00:00Z\"\n",
    );
    site(&f, 1, "http://192.0.2.2");
    let b = f.commit("one origin, during a freeze");
    let before = snapshot(r.port);
    let after = Some("2100-06-01T00:00:00Z");
    let out = ef(f.path(), &["apply", "--yes"], after);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(
        stdout(&out).contains("edge-1: REFUSED (frozen): refusing to move to another commit during the freeze window `now`"),
        "{}",
        both(&out)
    );
    for job in ["sync", "heal"] {
        let out = ef(f.path(), &["reconcile", "--once", job], after);
        assert_eq!(out.status.code(), Some(1), "{}", both(&out));
        assert!(stderr(&out).contains("reason=\"frozen\""), "{}", both(&out));
    }
    assert_eq!(snapshot(r.port), before, "nothing was written");
    let out = ef(f.path(), &["apply", "--yes", "--break-glass"], after);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert_eq!(meta(r.port)["commit"], b);
    let h = history(&f);
    assert_eq!(h[0]["break_glass"], true, "{h:?}");
    assert_eq!(h[0]["freeze"], "now", "{h:?}");
    assert_eq!(h[0]["at"], "2100-06-01T00:00:00Z", "{h:?}");
    let real = h[0]["clock_moved"].as_str().unwrap_or_default();
    assert!(real.starts_with("20") && real < "2100", "{h:?}");
}

/// `status` (with `extra` args) as JSON: its verdict and exit code agree.
fn verdict(f: &Fixture, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["status", "--format", "json", "--connect-timeout", "3"];
    args.extend_from_slice(extra);
    let out = run(f.path(), &args);
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&out)).unwrap_or_else(|_| panic!("{}", both(&out)));
    (out.status.code().unwrap(), v)
}

// `status --from redis`: 0, 2, 1 without a broker.
#[test]
fn status_from_redis_is_ok_drift_or_offline() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", edge("edge-1", r1.port).as_bytes());
    f.write("nodes/edge-2.yaml", edge("edge-2", r2.port).as_bytes());
    site(&f, 0, "http://192.0.2.1");
    let a = f.commit("a");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let from = ["--from", "redis"];
    let (code, v) = verdict(&f, &from);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("ok")), "{v}");
    assert_eq!(v["nodes"][0]["commit"], a.as_str());
    assert!(v["nodes"][0]["applied_by"].as_str().unwrap().contains('@'));
    // A new commit applied to edge-1 only: edge-2 is behind.
    site(&f, 0, "http://192.0.2.2");
    f.commit("b");
    let out = run(f.path(), &["apply", "--yes", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let (code, v) = verdict(&f, &from);
    assert_eq!((code, v["verdict"].as_str()), (2, Some("drift")), "{v}");
    assert_eq!(v["why"], "not on the desired commit: edge-2");
    let out = run(f.path(), &["status", "--from", "redis"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).contains("verdict: DRIFT"), "{}", both(&out));
    // edge-2's Redis gone: unreachable wins, exit 1.
    drop(r2);
    let (code, v) = verdict(&f, &from);
    assert_eq!((code, v["verdict"].as_str()), (1, Some("offline")), "{v}");
    assert_eq!(v["nodes"][1]["online"], false);
    assert!(
        v["nodes"][1]["error"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{v}"
    );
}

// `status` over MQTT: 0, 2, 1 with a real agent.
#[test]
fn status_over_mqtt_is_ok_drift_or_offline() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", edge("edge-1", r.port).as_bytes());
    f.write(
        "cluster.yaml",
        format!(
            "name: test\nmqtt:\n  url: mqtt://127.0.0.1:{}\n",
            broker.port
        )
        .as_bytes(),
    );
    site(&f, 0, "http://192.0.2.1");
    let a = f.commit("a");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let cache = tempfile::tempdir().unwrap();
    let agent = Agent::start(&format!(
        "node: edge-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
         cache: {{dirs: [{}]}}\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n\
         health: {{interval: 500ms}}\n",
        r.port,
        cache.path().display(),
        broker.port
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, v) = verdict(&f, &[]);
        if v["nodes"][0]["commit"] == a.as_str() {
            assert_eq!((code, v["verdict"].as_str()), (0, Some("ok")), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "edge-1 never reported: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A new commit not applied yet: the edge is behind.
    site(&f, 0, "http://192.0.2.2");
    f.commit("b");
    let (code, v) = verdict(&f, &[]);
    assert_eq!((code, v["verdict"].as_str()), (2, Some("drift")), "{v}");
    // The agent stops: offline.
    drop(agent);
    let (code, v) = verdict(&f, &[]);
    assert_eq!((code, v["verdict"].as_str()), (1, Some("offline")), "{v}");
}
