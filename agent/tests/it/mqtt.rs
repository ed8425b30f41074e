//! The MQTT channel against a real mosquitto: health reports, the last
//! will, commands (allowed, refused, expired, duplicate, sent while the
//! agent was down, signed), a broker restart, and `/route` with the
//! broker down.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use edgestate::mqtt::{Command, CommandResult, HealthReport, Outcome};

use crate::route::{get, publish, table, wait_for};
use crate::util::{Agent, Mqtt, con, unix_now};

pub fn mqtt_yaml(broker: u16, extra: &str) -> String {
    format!("mqtt:\n  url: mqtt://127.0.0.1:{broker}\nhealth:\n  interval: 500ms\n{extra}")
}

/// Actions the command tests use; `dir` is where they may write.
pub fn actions_yaml() -> String {
    "actions:\n  \
       echo:\n    argv: [/usr/bin/echo, said, \"{word}\"]\n    args: {word: \"[a-z]+\"}\n  \
       touch:\n    argv: [/usr/bin/touch, \"{path}\"]\n    args: {path: \"/[A-Za-z0-9/._-]+\"}\n    timeout: 5s\n  \
       mark:\n    argv: [/usr/bin/mktemp, -p, \"{dir}\"]\n    args: {dir: \"/[A-Za-z0-9/._-]+\"}\n"
        .to_owned()
}

pub fn command(id: &str, action: &str, args: &[(&str, &str)]) -> Command {
    let now = unix_now();
    Command {
        id: id.to_owned(),
        action: action.to_owned(),
        args: args
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        issued_at: now,
        expires_at: now + 60,
        sig: None,
    }
}

/// Send `cmd` to edge-1 and wait for its result.
pub fn run(m: &Mqtt, cmd: &Command, agent: &Agent) -> CommandResult {
    let topic = format!("edgeform/result/edge-1/{}", cmd.id);
    m.subscribe(&topic);
    m.publish(
        "edgeform/cmd/edge-1",
        serde_json::to_vec(cmd).unwrap(),
        false,
    );
    let payload = m
        .wait(&topic, 20, |_| true)
        .unwrap_or_else(|| panic!("no result for {}; agent log:\n{}", cmd.id, agent.log()));
    serde_json::from_slice(&payload).unwrap()
}

pub fn wait_online(m: &Mqtt, agent: &Agent) {
    m.subscribe("edgeform/status/edge-1");
    assert!(
        m.wait("edgeform/status/edge-1", 15, |p| p == b"online")
            .is_some(),
        "agent never online:\n{}",
        agent.log()
    );
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, Iterator::count)
}

#[test]
fn health_report_status_and_last_will() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    std::fs::write(
        &stats,
        r#"{"sessions": 7, "live": {"cam2": {}, "cam1": {}}}"#,
    )
    .unwrap();
    let mut c = con(r.port);
    redis::cmd("HSET")
        .arg("edgeform:meta")
        .arg("commit")
        .arg("abc123")
        .arg("generation")
        .arg(4)
        .exec(&mut c)
        .unwrap();
    let m = Mqtt::connect(broker.port);
    m.subscribe("edgeform/health/edge-1");
    let mut agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &mqtt_yaml(
            broker.port,
            &format!(
                "  play_sessions: {{file: {s}, field: sessions}}\n  streams: {{file: {s}, field: /live}}\n",
                s = stats.display()
            ),
        ),
    );
    let payload = m
        .wait("edgeform/health/edge-1", 15, |_| true)
        .unwrap_or_else(|| panic!("no report:\n{}", agent.log()));
    let report: HealthReport = serde_json::from_slice(&payload).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    for field in [
        "node",
        "ts",
        "play_sessions",
        "out_kbit",
        "streams",
        "config",
        "purge",
        "redis",
        "version",
    ] {
        assert!(v.get(field).is_some(), "{field} missing: {v}");
    }
    assert_eq!(report.node, "edge-1");
    assert!(report.ts.abs_diff(unix_now()) < 30);
    assert_eq!(report.play_sessions, Some(7));
    assert_eq!(
        report.streams.as_deref(),
        Some(&vec!["cam1".into(), "cam2".into()])
    );
    assert_eq!(report.config.commit.as_deref(), Some("abc123"));
    assert_eq!(report.config.generation, Some(4));
    assert_eq!(
        (report.purge.queue, report.purge.processing),
        (Some(0), Some(0))
    );
    assert!(report.redis.ok);
    assert_eq!(report.redis.role.as_deref(), Some("master"));
    assert!(report.out_kbit.is_some(), "/proc/net/dev is readable here");
    assert!(!report.version.is_empty());
    assert!(!report.redis.data_lost);
    assert!(v["redis"].get("data_lost").is_none(), "only when lost: {v}");

    // The Redis loses its data (FLUSHALL): reported until it is written
    // again (a re-push, even of a lower generation).
    redis::cmd("FLUSHALL").exec(&mut c).unwrap();
    let lost = |want: bool| {
        m.wait("edgeform/health/edge-1", 10, |p| {
            serde_json::from_slice::<HealthReport>(p).is_ok_and(|r| r.redis.data_lost == want)
        })
        .is_some()
    };
    assert!(lost(true), "data_lost never reported:\n{}", agent.log());
    redis::cmd("HSET")
        .arg("edgeform:meta")
        .arg("generation")
        .arg(1)
        .exec(&mut c)
        .unwrap();
    assert!(lost(false), "data_lost never cleared:\n{}", agent.log());

    // An unreadable source is null, never a guess; the next report says so.
    std::fs::write(&stats, "{").unwrap();
    let payload = m
        .wait("edgeform/health/edge-1", 10, |p| {
            serde_json::from_slice::<HealthReport>(p).is_ok_and(|r| r.play_sessions.is_none())
        })
        .unwrap_or_else(|| panic!("no report with null sessions:\n{}", agent.log()));
    let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert!(
        v["play_sessions"].is_null() && v["streams"].is_null(),
        "{v}"
    );

    // Retained: a client arriving later still sees the status and report.
    let late = Mqtt::connect(broker.port);
    late.subscribe("edgeform/status/edge-1");
    late.subscribe("edgeform/health/edge-1");
    assert!(
        late.wait("edgeform/status/edge-1", 5, |p| p == b"online")
            .is_some()
    );
    assert!(late.wait("edgeform/health/edge-1", 5, |_| true).is_some());

    // kill -9: the broker publishes the last will.
    agent.kill9();
    assert!(
        late.wait("edgeform/status/edge-1", 30, |p| p == b"offline")
            .is_some(),
        "no last will after kill -9"
    );
}

/// edge-1's agent with [`actions_yaml`], its own Redis, a broker and a
/// client of it, the agent online (fields drop in the order a test's
/// locals would: the client and the agent before their servers).
struct Commanded {
    m: Mqtt,
    agent: Agent,
    dir: tempfile::TempDir,
    broker: harness::Process,
    r: harness::Process,
}

fn commanded() -> Commanded {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!("{}{}", mqtt_yaml(broker.port, ""), actions_yaml()),
    );
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    Commanded {
        m,
        agent,
        dir,
        broker,
        r,
    }
}

#[test]
fn commands_run_only_as_allowed() {
    // Bound whole: a field left out would be dropped (its server stopped) at once.
    let Commanded {
        m,
        agent,
        dir,
        broker: _broker,
        r,
    } = commanded();

    // Allowed, with its argument filling one argv element.
    let res = run(&m, &command("c1", "echo", &[("word", "hello")]), &agent);
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    assert_eq!(
        (res.exit_code, res.stdout.as_str()),
        (Some(0), "said hello\n")
    );
    assert!(res.reason.is_none());
    let target = dir.path().join("ran");
    let res = run(
        &m,
        &command("c2", "touch", &[("path", target.to_str().unwrap())]),
        &agent,
    );
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    assert!(target.exists(), "the action ran");

    // Refused, and nothing runs.
    let pwned = dir.path().join("pwned");
    let cases = [
        command("r1", "rm", &[("path", "/")]),
        command("r2", "echo", &[("word", "HELLO")]),
        command("r3", "echo", &[]),
        command("r4", "echo", &[("word", "a"), ("extra", "b")]),
        command(
            "r5",
            "touch",
            &[("path", &format!("{};touch", pwned.display()))],
        ),
        command(
            "r6",
            "touch",
            &[("path", &format!("$(touch {})", pwned.display()))],
        ),
        command("r7", "echo", &[("word", "a`id`")]),
    ];
    for cmd in &cases {
        let res = run(&m, cmd, &agent);
        assert_eq!(res.status, Outcome::Refused, "{cmd:?} → {res:?}");
        assert!(res.reason.is_some() && res.exit_code.is_none(), "{res:?}");
    }
    assert!(!pwned.exists(), "nothing ran");
    // Malformed JSON with an id: refused, the agent lives on.
    m.subscribe("edgeform/result/edge-1/bad1");
    m.publish(
        "edgeform/cmd/edge-1",
        r#"{"id": "bad1", "action": 3}"#,
        false,
    );
    let res: CommandResult =
        serde_json::from_slice(&m.wait("edgeform/result/edge-1/bad1", 10, |_| true).unwrap())
            .unwrap();
    assert_eq!(res.status, Outcome::Refused);
    assert!(res.reason.unwrap().contains("malformed"));

    // Expired: refused as expired, not run.
    let mut old = command("x1", "touch", &[("path", pwned.to_str().unwrap())]);
    old.issued_at -= 600;
    old.expires_at = unix_now() - 300;
    let res = run(&m, &old, &agent);
    assert_eq!(res.status, Outcome::Expired, "{res:?}");
    assert!(!pwned.exists());

    // A duplicate id runs once; the second answer is the first result.
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let once = command("d1", "mark", &[("dir", marks.to_str().unwrap())]);
    let first = run(&m, &once, &agent);
    assert_eq!(first.status, Outcome::Ok, "{first:?}");
    let second = run(&m, &once, &agent);
    assert_eq!(second.status, Outcome::Ok);
    assert!(second.reason.unwrap().contains("duplicate"));
    assert_eq!(files_in(&marks), 1, "ran once");
    // The id is remembered in local Redis (no key to seal it with here:
    // commands are not authenticated in this setup).
    let stored: Option<String> = redis::cmd("GET")
        .arg("edgeform:cmd:d1")
        .query(&mut con(r.port))
        .unwrap();
    assert!(stored.unwrap().contains("\"status\":\"ok\""));
}

#[test]
fn commands_survive_agent_downtime_and_restarts() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let mut agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!("{}{}", mqtt_yaml(broker.port, ""), actions_yaml()),
    );
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    assert_eq!(agent.terminate().map(|s| s.success()), Some(true));
    assert!(
        m.wait("edgeform/status/edge-1", 10, |p| p == b"offline")
            .is_some(),
        "a clean stop says offline"
    );

    // Sent while the agent is down: the persistent session keeps it.
    let cmd = command("while-down", "mark", &[("dir", marks.to_str().unwrap())]);
    let topic = "edgeform/result/edge-1/while-down";
    m.subscribe(topic);
    m.publish(
        "edgeform/cmd/edge-1",
        serde_json::to_vec(&cmd).unwrap(),
        false,
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(files_in(&marks), 0);
    agent.spawn();
    let res: CommandResult = serde_json::from_slice(
        &m.wait(topic, 20, |_| true)
            .unwrap_or_else(|| panic!("no result after return:\n{}", agent.log())),
    )
    .unwrap();
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    assert_eq!(files_in(&marks), 1);

    // After a restart the same id still does not run again.
    agent.terminate();
    agent.spawn();
    wait_online(&m, &agent);
    let again = run(&m, &cmd, &agent);
    assert!(again.reason.unwrap().contains("duplicate"));
    assert_eq!(files_in(&marks), 1, "not re-run after a restart");
}

/// A session left by an older agent that read something at QoS 1 (its
/// region's claims did): the broker hands the agent more such messages than
/// its 20 in-flight places. Each is acknowledged at once, so a command sent
/// after them still arrives; unacknowledged, they would hold every place
/// and the command would wait behind them for good.
#[test]
fn qos1_messages_of_an_older_session_are_acknowledged_and_commands_still_arrive() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    // The older agent's session: its client id, persistent, one QoS 1
    // subscription the agent of today never makes.
    let mut o = rumqttc::MqttOptions::new("edgeform-agent-edge-1", "127.0.0.1", broker.port);
    o.set_clean_session(false);
    let (older, mut connection) = rumqttc::Client::new(o, 16);
    older
        .subscribe("edgeform/summary-lock/eu", rumqttc::QoS::AtLeastOnce)
        .unwrap();
    let subscribed = connection
        .iter()
        .any(|e| matches!(e, Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)))));
    assert!(subscribed, "the older session never subscribed");
    older.disconnect().unwrap();
    for _ in connection.iter().take_while(Result::is_ok) {}

    // Kept for it while no agent is connected: more than 20.
    let m = Mqtt::connect(broker.port);
    for i in 0..30 {
        m.publish(
            "edgeform/summary-lock/eu",
            format!("{{\"node\":\"old\",\"epoch\":{i},\"ts\":0}}").into_bytes(),
            false,
        );
    }
    std::thread::sleep(Duration::from_millis(300));

    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!("{}{}", mqtt_yaml(broker.port, ""), actions_yaml()),
    );
    wait_online(&m, &agent);
    let res = run(
        &m,
        &command("after-the-old-ones", "echo", &[("word", "through")]),
        &agent,
    );
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
}

#[test]
fn signed_commands_when_a_key_is_configured() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_env(
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
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    let res = run(&m, &command("u1", "echo", &[("word", "hi")]), &agent);
    assert_eq!(res.status, Outcome::Refused);
    assert!(res.reason.unwrap().contains("unsigned"));
    let mut wrong = command("u2", "echo", &[("word", "hi")]);
    wrong.sign("edge-1", b"guess");
    assert!(
        run(&m, &wrong, &agent)
            .reason
            .unwrap()
            .contains("bad signature")
    );
    let mut other_node = command("u3", "echo", &[("word", "hi")]);
    other_node.sign("edge-2", b"s3cret");
    assert_eq!(run(&m, &other_node, &agent).status, Outcome::Refused);
    let mut good = command("u4", "echo", &[("word", "hi")]);
    good.sign("edge-1", b"s3cret");
    let res = run(&m, &good, &agent);
    assert_eq!(
        (res.status, res.stdout.as_str()),
        (Outcome::Ok, "said hi\n")
    );
    // refusals of unauthenticated ones are not.
    assert!(res.verify(&good, "edge-1", b"s3cret"), "{res:?}");
    assert!(!res.verify(&wrong, "edge-1", b"s3cret"));
    // An unsigned command with the id of a refused one may still be
    // signed and run later: refusals for authentication do not claim ids.
    let mut retry = command("u1", "echo", &[("word", "ok")]);
    retry.sign("edge-1", b"s3cret");
    assert_eq!(run(&m, &retry, &agent).status, Outcome::Ok);

    // The result is recorded sealed with the node's key, and a duplicate
    // gets it back, signed.
    let stored: Option<String> = redis::cmd("GET")
        .arg("edgeform:cmd:u4")
        .query(&mut con(r.port))
        .unwrap();
    let sealed: edgestate::mqtt::SealedRecord = serde_json::from_str(&stored.unwrap()).unwrap();
    assert!(sealed.open(b"s3cret", "u4").is_some(), "{sealed:?}");
    let again = run(&m, &good, &agent);
    assert_eq!(again.stdout, "said hi\n");
    assert!(again.verify(&good, "edge-1", b"s3cret"), "{again:?}");
    // A result written into the node's Redis by anyone else (the Redis is
    // not trusted), unsealed or sealed with another key, is never sent as
    // this node's signed word; the command does not run either.
    let forged = |id: &str| {
        serde_json::json!({"id": id, "node": "edge-1", "action": "echo",
            "status": "ok", "exit_code": 0, "stdout": "forged", "stderr": "",
            "duration_ms": 1, "finished_at": 1})
        .to_string()
    };
    for (id, record) in [
        ("f1", forged("f1")),
        (
            "f2",
            serde_json::to_string(&edgestate::mqtt::SealedRecord::seal(
                b"another key",
                "f2",
                forged("f2"),
            ))
            .unwrap(),
        ),
    ] {
        redis::cmd("SET")
            .arg(format!("edgeform:cmd:{id}"))
            .arg(&record)
            .exec(&mut con(r.port))
            .unwrap();
        let mut cmd = command(id, "echo", &[("word", "hi")]);
        cmd.sign("edge-1", b"s3cret");
        let res = run(&m, &cmd, &agent);
        assert_eq!(res.status, Outcome::Refused, "{res:?}");
        assert!(
            res.reason
                .as_deref()
                .unwrap_or_default()
                .contains("not sealed by this node"),
            "{res:?}"
        );
        assert_ne!(res.stdout, "forged");
    }
}

fn report_for(node: &str, sessions: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "node": node, "ts": unix_now(), "interval_ms": 5000,
        "play_sessions": sessions, "out_kbit": 100, "streams": ["cam1"],
        "config": {"commit": null, "generation": null},
        "purge": {"queue": 0, "processing": 0},
        "redis": {"ok": true, "role": "master"}, "version": "sim",
    }))
    .unwrap()
}

#[test]
fn routing_health_from_mqtt_survives_the_broker() {
    let r = harness::redis(&[]);
    let mut broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    publish(r.port, &table("https://a.example.net"), 1);
    let http = harness::free_port();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "{}{}http:\n  listen: 127.0.0.1:{http}\nrouting:\n  refresh: 100ms\n",
            mqtt_yaml(broker.port, ""),
            actions_yaml()
        ),
    );
    let log = || agent.log();
    let m = Mqtt::connect(broker.port);
    // The other nodes' reports, as their agents would publish them.
    m.publish("edgeform/health/edge-a", report_for("edge-a", 3), true);
    m.publish("edgeform/status/edge-a", "online", true);
    m.publish("edgeform/health/edge-b", report_for("edge-b", 1), true);
    m.publish("edgeform/status/edge-b", "online", true);
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/route/cam1", "").0 == 302
        },
        "routing from MQTT health",
        &log,
    );
    assert!(
        get(http, "/route/cam1", "")
            .1
            .contains("location: https://a.example.net/cam1")
    );
    // edge-a's last will: offline → fallback to edge-b (proxied).
    m.publish("edgeform/status/edge-a", "offline", true);
    wait_for(
        || {
            get(http, "/route/cam1", "")
                .1
                .contains("/proxy/edge-b/cam1")
        },
        "edge-a offline",
        &log,
    );
    m.publish("edgeform/status/edge-a", "online", true);
    wait_for(
        || get(http, "/route/cam1", "").1.contains("a.example.net"),
        "edge-a back",
        &log,
    );
    // /metrics speaks Prometheus.
    let (status, _, body) = get(http, "/metrics", "");
    assert_eq!(status, 200);
    assert!(
        body.contains("edgeform_agent_route_requests_total{status=\"302\"}"),
        "{body}"
    );
    assert!(body.contains("edgeform_agent_mqtt_connected 1"), "{body}");
    // edge-a and edge-b; the agent's own edge-1 is not in this routing
    // table, so it is not tracked.
    assert!(
        body.contains("edgeform_agent_cluster_nodes_reporting 2"),
        "{body}"
    );

    // The broker goes away: /route keeps answering from the last known
    // health, marked stale.
    drop(m);
    broker.kill();
    wait_for(
        || {
            let (s, _, body) = get(http, "/route/cam1?format=json", "");
            s == 302 && body.contains("\"stale_health\":true") && body.contains("\"stale\":true")
        },
        "stale health, still routing",
        &log,
    );
    for _ in 0..20 {
        assert_eq!(get(http, "/route/cam1", "").0, 302);
    }
    // The broker comes back (same port, persisted sessions): the agent
    // reconnects, reports again and still takes commands.
    broker.restart();
    let m = Mqtt::connect(broker.port);
    // The other agents report again as they do every interval.
    m.publish("edgeform/health/edge-a", report_for("edge-a", 3), true);
    m.publish("edgeform/health/edge-b", report_for("edge-b", 1), true);
    m.subscribe("edgeform/health/edge-1");
    let since = unix_now();
    assert!(
        m.wait("edgeform/health/edge-1", 30, |p| {
            serde_json::from_slice::<HealthReport>(p).is_ok_and(|r| r.ts >= since)
        })
        .is_some(),
        "no report after the broker restart:\n{}",
        agent.log()
    );
    wait_for(
        || {
            !get(http, "/route/cam1?format=json", "")
                .2
                .contains("\"stale_health\":true")
        },
        "fresh health after the restart",
        &log,
    );
    let res = run(
        &m,
        &command("after-restart", "echo", &[("word", "back")]),
        &agent,
    );
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
}

#[test]
fn tls_and_credentials() {
    let r = harness::redis(&[]);
    let (broker, ca) = harness::mosquitto_tls("edge-1", "right-password");
    let dir = tempfile::tempdir().unwrap();
    let yaml = |password_env: &str| {
        format!(
            "mqtt:\n  url: mqtts://127.0.0.1:{}\n  username: edge-1\n  password_env: {password_env}\n  \
             ca_file: {}\nhealth:\n  interval: 500ms\n",
            broker.port,
            ca.display()
        )
    };
    // The right password over TLS: reports arrive.
    let agent = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        &yaml("TEST_MQTT_PW"),
        &[("TEST_MQTT_PW", "right-password")],
    );
    let watcher = {
        let mut o = rumqttc::MqttOptions::new("tls-watcher", "127.0.0.1", broker.port);
        o.set_credentials("edge-1", "right-password");
        o.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::SimpleNative {
                ca: std::fs::read(&ca).unwrap(),
                client_auth: None,
            },
        ));
        o
    };
    let (client, mut connection) = rumqttc::Client::new(watcher, 16);
    client
        .subscribe("edgeform/health/edge-1", rumqttc::QoS::AtLeastOnce)
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut got = false;
    while std::time::Instant::now() < deadline && !got {
        if let Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)))) =
            connection.recv_timeout(Duration::from_millis(500))
        {
            got = serde_json::from_slice::<HealthReport>(&p.payload).is_ok();
        }
    }
    assert!(
        got,
        "no report over TLS:\n{}\n{}",
        agent.log(),
        broker.log()
    );
    drop(agent);
    // A wrong password: refused by the broker, said in the log, the agent
    // keeps running (and retrying).
    let mut wrong = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        &yaml("TEST_MQTT_PW"),
        &[("TEST_MQTT_PW", "wrong")],
    );
    wait_for(
        || wrong.log().contains("broker refused the connection"),
        "refusal logged",
        &|| wrong.log(),
    );
    assert!(
        wrong.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "still running"
    );
    // The password variable missing: the agent says which, at start.
    let mut unset = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &yaml("TEST_MQTT_PW_UNSET"),
    );
    let status = unset.child.as_mut().unwrap().wait().unwrap();
    assert_eq!(status.code(), Some(1), "{}", unset.log());
    assert!(
        unset.log().contains("TEST_MQTT_PW_UNSET"),
        "{}",
        unset.log()
    );
}

pub fn metric(http: u16, name: &str) -> u64 {
    let (_, _, body) = get(http, "/metrics", "");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// 50,000 health reports, summaries and statuses for invented nodes:
/// ignored (only routing-table nodes are tracked; their health topics are
/// not even read), counted, memory bounded, and `/route` keeps answering
/// from the real nodes' health.
#[test]
fn reports_for_invented_nodes_are_ignored_with_bounded_memory() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    publish(r.port, &table("https://a.example.net"), 1);
    let http = harness::free_port();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "{}http:\n  listen: 127.0.0.1:{http}\nrouting:\n  refresh: 100ms\n",
            mqtt_yaml(broker.port, "")
        ),
    );
    let log = || agent.log();
    let m = Mqtt::connect(broker.port);
    m.publish("edgeform/health/edge-a", report_for("edge-a", 3), true);
    m.publish("edgeform/status/edge-a", "online", true);
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/route/cam1", "").0 == 302
        },
        "routing from MQTT health",
        &log,
    );
    let pid = agent.child.as_ref().unwrap().id();
    let before = crate::util::rss_kib(pid);
    let n = 50_000;
    for i in 0..n {
        let node = format!("invented-{i}");
        // The agent reads no health topic of a node outside its table,
        // so invented reports arrive in summaries (of the table's region
        // or an invented one): refused whole.
        let region = if i % 2 == 0 { "eu" } else { "invented" };
        let summary = serde_json::json!({
            "region": region, "by": "edge-a", "epoch": 1, "ts": 1, "interval_ms": 500,
            "nodes": [{"node": node, "age_ms": 0,
                       "report": serde_json::from_slice::<serde_json::Value>(&report_for(&node, 1)).unwrap()}],
        });
        m.client
            .publish(
                format!("edgeform/summary/{region}"),
                rumqttc::QoS::AtMostOnce,
                false,
                serde_json::to_vec(&summary).unwrap(),
            )
            .unwrap();
        m.client
            .publish(
                format!("edgeform/health/{node}"),
                rumqttc::QoS::AtMostOnce,
                false,
                report_for(&node, 1),
            )
            .unwrap();
        if i % 1000 == 0 {
            // The real node keeps reporting, as a live one does: under a
            // slow machine the flood can outlast the silence rule.
            m.publish("edgeform/health/edge-a", report_for("edge-a", 3), true);
        }
        if i % 10 == 0 {
            // A forged last will for a real node from a made-up one is
            // not a report for a tracked node either way: this one is
            // for an invented node.
            m.client
                .publish(
                    format!("edgeform/status/{node}"),
                    rumqttc::QoS::AtMostOnce,
                    false,
                    "offline",
                )
                .unwrap();
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric(http, "edgeform_agent_health_ignored_total") < n * 9 / 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "ignored only {}",
            metric(http, "edgeform_agent_health_ignored_total")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = crate::util::rss_kib(pid);
    eprintln!(
        "invented reports: agent RSS {before} KiB before, {after} KiB after {n} invented reports"
    );
    assert!(
        after < before + 30 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert_eq!(metric(http, "edgeform_agent_cluster_nodes_reporting"), 1);
    assert_eq!(get(http, "/route/cam1", "").0, 302);
}

/// The shipped `packaging/mosquitto.acl` on a real mosquitto with
/// password logins: the agent works (online, health, commands), and a
/// forged retained `status/edge-1 = offline` sent with another agent's
/// credentials is refused by the broker.
#[test]
fn broker_acl_confines_each_agent_to_its_own_topics() {
    let acl = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/mosquitto.acl"),
    )
    .unwrap();
    let broker = harness::mosquitto_acl(
        &[
            ("edge-1", "pw1"),
            ("edge-2", "pw2"),
            ("edgeform-control", "pwc"),
        ],
        &acl,
    );
    let r = harness::redis(&[]);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "mqtt:\n  url: mqtt://127.0.0.1:{}\n  username: edge-1\n  password_env: EDGE1_PW\n\
             health:\n  interval: 500ms\n{}",
            broker.port,
            actions_yaml()
        ),
        &[("EDGE1_PW", "pw1")],
    );
    let control = Mqtt::connect_as(broker.port, "edgeform-control", "pwc");
    wait_online(&control, &agent);
    control.subscribe("edgeform/health/edge-1");
    assert!(
        control
            .wait("edgeform/health/edge-1", 10, |_| true)
            .is_some(),
        "no health report:\n{}",
        agent.log()
    );
    // The agent runs the control host's commands and answers.
    let res = run(
        &control,
        &command("acl-1", "echo", &[("word", "hi")]),
        &agent,
    );
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    // edge-2's credentials: its own status is accepted, edge-1's refused.
    let edge2 = Mqtt::connect_as(broker.port, "edge-2", "pw2");
    edge2.publish("edgeform/status/edge-2", "online", true);
    edge2.publish("edgeform/status/edge-1", "offline", true);
    edge2.publish("edgeform/cmd/edge-1", b"{}".to_vec(), false);
    std::thread::sleep(Duration::from_millis(500));
    let fresh = Mqtt::connect_as(broker.port, "edgeform-control", "pwc");
    fresh.subscribe("edgeform/status/+");
    let mut seen = BTreeMap::new();
    while let Some(p) = fresh.wait_any(2) {
        seen.insert(p.0, p.1);
    }
    assert_eq!(
        seen.get("edgeform/status/edge-1").map(Vec::as_slice),
        Some(b"online".as_slice()),
        "{seen:?}"
    );
    assert_eq!(
        seen.get("edgeform/status/edge-2").map(Vec::as_slice),
        Some(b"online".as_slice()),
        "{seen:?}"
    );
    assert!(
        !agent.log().contains("command: malformed"),
        "edge-2 reached edge-1's command topic:\n{}",
        agent.log()
    );
}

/// 3,000 valid commands published at once: every one is answered (run),
/// none lost between the broker's queue and the agent; a refused command
/// holds its id only until it expires (plus an hour), not for 7 days.
#[test]
fn a_burst_of_3000_commands_is_fully_answered() {
    let Commanded {
        m,
        agent,
        dir: _dir,
        broker: _broker,
        r,
    } = commanded();
    m.subscribe("edgeform/result/edge-1/+");
    let n = 3000;
    for i in 0..n {
        m.publish(
            "edgeform/cmd/edge-1",
            serde_json::to_vec(&command(&format!("b{i:04}"), "echo", &[("word", "hi")])).unwrap(),
            false,
        );
    }
    let mut answered = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while answered.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{} of {n} answered; agent log tail:\n{}",
            answered.len(),
            agent
                .log()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        if let Some((topic, payload)) = m.wait_any(left.as_secs().max(1))
            && let Some(id) = topic.strip_prefix("edgeform/result/edge-1/")
        {
            let res: CommandResult = serde_json::from_slice(&payload).unwrap();
            assert_eq!(res.status, Outcome::Ok, "{res:?}");
            answered.insert(id.to_owned());
        }
    }
    assert_eq!(answered.len(), n);
    // A policy refusal claims its id briefly; a run command for 7 days.
    let res = run(
        &m,
        &command("refused-1", "echo", &[("word", "a;b")]),
        &agent,
    );
    assert_eq!(res.status, Outcome::Refused);
    let ttl = |id: &str| -> i64 {
        redis::cmd("TTL")
            .arg(edgestate::keys::command(id))
            .query(&mut con(r.port))
            .unwrap()
    };
    let refused = ttl("refused-1");
    assert!(
        refused > 0 && refused <= 60 + 3600,
        "refused id TTL {refused}"
    );
    assert!(ttl("b0000") > 6 * 24 * 3600);
}

/// Its own status forged `offline` (on a broker without the shipped ACL)
/// while it is connected: the agent says `online` again, so the forgery
/// does not stick; a forger repeating it faster than once a second still
/// ends with `online` retained.
#[test]
fn an_agent_hearing_itself_reported_offline_says_online_again() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &mqtt_yaml(broker.port, ""),
    );
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    for _ in 0..5 {
        m.publish("edgeform/status/edge-1", "offline", true);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    // The retained status, read afresh.
    let fresh = Mqtt::connect(broker.port);
    fresh.subscribe("edgeform/status/edge-1");
    assert_eq!(
        fresh.wait("edgeform/status/edge-1", 5, |_| true).as_deref(),
        Some(&b"online"[..]),
        "{}",
        agent.log()
    );
}

/// A flood of commands no control host sends (1 MB each at QoS 0, and
/// over the size limit at QoS 1) is dropped as it arrives: the agent's
/// memory stays where it was, the drops are logged (not once each) and
/// counted, and a real command still runs.
#[test]
fn a_flood_of_oversized_or_qos0_commands_is_dropped_without_holding_memory() {
    let Commanded {
        m,
        agent,
        dir: _dir,
        broker: _broker,
        r: _r,
    } = commanded();
    let pid = agent.child.as_ref().unwrap().id();
    let before = crate::util::rss_kib(pid);
    let big = |i: usize, bytes: usize| {
        serde_json::to_vec(&command(
            &format!("f{i}"),
            "echo",
            &[("word", &"a".repeat(bytes))],
        ))
        .unwrap()
    };
    for i in 0..300 {
        m.client
            .publish(
                "edgeform/cmd/edge-1",
                rumqttc::QoS::AtMostOnce,
                false,
                big(i, 1 << 20),
            )
            .unwrap();
    }
    for i in 300..330 {
        m.publish("edgeform/cmd/edge-1", big(i, 100 << 10), false);
    }
    // Ordered after the flood on the same session: once it has run,
    // the flood has been read.
    let res = run(&m, &command("real-1", "echo", &[("word", "hi")]), &agent);
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    let after = crate::util::rss_kib(pid);
    eprintln!("command flood: agent RSS {before} KiB -> {after} KiB");
    assert!(
        after < before + 40 * 1024,
        "RSS {before} KiB -> {after} KiB after 330 MB of commands"
    );
    let log = agent.log();
    let lines = log.matches("command dropped").count();
    assert!((1..30).contains(&lines), "{lines} drop lines:\n{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("command") && l.contains(" id=f")),
        "a dropped command reached the handler:\n{log}"
    );
}

/// `mqtts://` without `ca_file` uses the system's trust store: a broker
/// whose CA is not in it is refused loudly (logged, retried), never
/// silently off; `--check-config` refuses a `ca_file` that is missing.
#[test]
fn mqtts_without_ca_file_uses_the_system_store_and_says_so() {
    let r = harness::redis(&[]);
    let (broker, _ca) = harness::mosquitto_tls("edge-1", "pw");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "mqtt:\n  url: mqtts://127.0.0.1:{}\n  username: edge-1\n  password_env: TEST_MQTT_PW\n",
            broker.port
        ),
        &[("TEST_MQTT_PW", "pw")],
    );
    wait_for(
        || agent.log().contains("mqtt: broker unreachable"),
        "a TLS failure logged",
        &|| agent.log(),
    );
    let log = agent.log();
    assert!(
        log.to_lowercase().contains("certificate") || log.contains("Tls"),
        "{log}"
    );
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "node: e\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
             mqtt:\n  url: mqtts://127.0.0.1:1\n  ca_file: {}\n",
            r.port,
            dir.path().join("missing-ca.pem").display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
        .args(["--check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(":6:12: cannot read the MQTT CA file"), "{err}");
}
