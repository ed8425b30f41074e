//! A signed command replayed after the node's Redis lost its claim
//! (`edgeform:cmd:<id>` deleted, `FLUSHALL`, the agent restarted, even
//! the agent's own record wiped) never runs twice: the agent's durable
//! record in `state_dir` bounds replay. Real mosquitto, redis-server and
//! the real `edgeform-agent`.

use std::path::Path;

use edgestate::mqtt::{CommandResult, Outcome};

use crate::mqtt::{actions_yaml, command, mqtt_yaml, wait_online};
use crate::util::{Agent, Mqtt, con};

fn marks_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, Iterator::count)
}

/// Publish the very bytes again (what a replaying attacker holds) and
/// wait for the answer.
fn replay(m: &Mqtt, id: &str, bytes: &[u8], agent: &Agent) -> CommandResult {
    let topic = format!("edgeform/result/edge-1/{id}");
    // The retained-less result topic: wait for the next answer only.
    m.subscribe(&topic);
    m.publish("edgeform/cmd/edge-1", bytes.to_vec(), false);
    let payload = m
        .wait(&topic, 20, |_| true)
        .unwrap_or_else(|| panic!("no answer to the replay of {id}:\n{}", agent.log()));
    serde_json::from_slice(&payload).unwrap()
}

fn flushall(port: u16) {
    redis::cmd("FLUSHALL").exec(&mut con(port)).unwrap();
}

#[test]
fn a_replayed_command_does_not_run_again_after_redis_loses_its_claim() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let mut agent = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "{}{}",
            mqtt_yaml(broker.port, "")
                .replace("mqtt:\n", "mqtt:\n  command_key_env: TEST_COMMAND_KEY\n"),
            actions_yaml()
        ),
        &[("TEST_COMMAND_KEY", "s3cret")],
    );
    let state = agent.config.parent().unwrap().join("state");
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);

    let mut cmd = command("once", "mark", &[("dir", marks.to_str().unwrap())]);
    cmd.sign("edge-1", b"s3cret");
    let bytes = serde_json::to_vec(&cmd).unwrap();
    let first = replay(&m, "once", &bytes, &agent);
    assert_eq!(first.status, Outcome::Ok, "{first:?}");
    assert_eq!(marks_in(&marks), 1);
    assert!(state.join("commands").exists(), "the record is on disk");

    // Redis loses the claim: the key deleted, then everything flushed.
    redis::cmd("DEL")
        .arg(edgestate::keys::command("once"))
        .exec(&mut con(r.port))
        .unwrap();
    let again = replay(&m, "once", &bytes, &agent);
    assert_eq!(again.status, Outcome::Refused, "{again:?}");
    assert!(
        again.reason.as_deref().unwrap().contains("own record"),
        "{again:?}"
    );
    assert!(again.verify(&cmd, "edge-1", b"s3cret"), "still signed");
    flushall(r.port);
    assert_eq!(replay(&m, "once", &bytes, &agent).status, Outcome::Refused);
    assert_eq!(marks_in(&marks), 1, "not run again");

    // A restart with an empty Redis: the record is read back.
    agent.terminate();
    flushall(r.port);
    agent.spawn();
    wait_online(&m, &agent);
    let after_restart = replay(&m, "once", &bytes, &agent);
    assert_eq!(after_restart.status, Outcome::Refused, "{after_restart:?}");
    assert!(
        after_restart
            .reason
            .as_deref()
            .unwrap()
            .contains("own record"),
        "{after_restart:?}"
    );
    assert_eq!(marks_in(&marks), 1, "not run after a restart");

    // The record itself wiped too (a reinstalled node): a new record
    // begins and refuses what was issued before it.
    agent.terminate();
    flushall(r.port);
    std::fs::remove_dir_all(&state).unwrap();
    // The new record begins after the command was issued.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    agent.spawn();
    wait_online(&m, &agent);
    let wiped = replay(&m, "once", &bytes, &agent);
    assert_eq!(wiped.status, Outcome::Refused, "{wiped:?}");
    assert!(
        wiped
            .reason
            .as_deref()
            .unwrap()
            .contains("before this agent's command record began"),
        "{wiped:?}"
    );
    assert_eq!(marks_in(&marks), 1, "not run with the record wiped");

    // Commands issued now still run, once.
    let mut fresh = command("fresh", "mark", &[("dir", marks.to_str().unwrap())]);
    fresh.sign("edge-1", b"s3cret");
    let fresh_bytes = serde_json::to_vec(&fresh).unwrap();
    assert_eq!(
        replay(&m, "fresh", &fresh_bytes, &agent).status,
        Outcome::Ok
    );
    flushall(r.port);
    assert_eq!(
        replay(&m, "fresh", &fresh_bytes, &agent).status,
        Outcome::Refused
    );
    assert_eq!(marks_in(&marks), 2);
}

/// The record cannot be written (the state dir is a file): commands are
/// refused, never run unrecorded; purges and the agent go on.
#[test]
fn commands_are_refused_when_the_record_cannot_be_written() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!("{}{}", mqtt_yaml(broker.port, ""), actions_yaml()).replacen(
            "mqtt:",
            &format!("state_dir: {}/state\nmqtt:", blocker.display()),
            1,
        ),
    );
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    let cmd = command("unrecorded", "mark", &[("dir", marks.to_str().unwrap())]);
    let res = replay(&m, "unrecorded", &serde_json::to_vec(&cmd).unwrap(), &agent);
    assert_eq!(res.status, Outcome::Refused, "{res:?}");
    assert!(
        res.reason.as_deref().unwrap().contains("command record in"),
        "{res:?}"
    );
    assert_eq!(marks_in(&marks), 0);
    assert!(agent.log().contains("commands are refused until it can"));
}
