//! `edgeform status` and `edgeform exec` against a real mosquitto and a
//! real agent (the `agent` library, in this process), with real Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::{Agent, Fixture, edgeform, stderr, stdout};

fn edge(name: &str, port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

/// An agent for edge-1 with a broker and one allowed action.
fn start_agent(redis: u16, broker: u16, cache: &std::path::Path) -> Agent {
    Agent::start(&format!(
        "node: edge-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
         cache: {{dirs: [{}]}}\nmqtt: {{url: \"mqtt://127.0.0.1:{broker}\"}}\n\
         health: {{interval: 500ms}}\n\
         actions:\n  echo:\n    argv: [/usr/bin/echo, said, \"{{word}}\"]\n    args: {{word: \"[a-z]+\"}}\n",
        cache.display()
    ))
}

/// `status --format json`; its exit code must be its verdict's.
fn status_json(f: &Fixture) -> serde_json::Value {
    let out = edgeform(f.path(), &["status", "--format", "json"]);
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&out)).unwrap_or_else(|_| panic!("{}", stderr(&out)));
    let code = match v["verdict"].as_str() {
        Some("ok") => 0,
        Some("drift") => 2,
        Some("offline") => 1,
        other => panic!("verdict {other:?}: {v}"),
    };
    assert_eq!(out.status.code(), Some(code), "{v}");
    v
}

#[test]
fn status_and_exec_through_the_broker() {
    let (r1, r2) = (harness::redis(&[]), harness::redis(&[]));
    let broker = harness::mosquitto();
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &*edge("edge-1", r1.port)),
        ("nodes/edge-2.yaml", &*edge("edge-2", r2.port)),
        (
            "cluster.yaml",
            &format!(
                "name: test\nmqtt:\n  url: mqtt://127.0.0.1:{}\n",
                broker.port
            ),
        ),
    ]);
    let out = edgeform(f.path(), &["apply", "--yes", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cache = tempfile::tempdir().unwrap();
    let agent = start_agent(r1.port, broker.port, cache.path());

    // status: edge-1 reports, applied = desired; edge-2 never reported.
    let deadline = Instant::now() + Duration::from_secs(20);
    let v = loop {
        let v = status_json(&f);
        if v["nodes"][0]["online"] == true && v["nodes"][0]["commit"].is_string() {
            break v;
        }
        assert!(Instant::now() < deadline, "edge-1 never reported: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{v}");
    let e1 = &nodes[0];
    assert_eq!(e1["node"], "edge-1");
    assert_eq!(e1["commit"], e1["desired_commit"], "{v}");
    assert!(e1["age_s"].as_u64().unwrap() < 30);
    assert_eq!(e1["purge_queue"], 0);
    for field in [
        "node",
        "online",
        "age_s",
        "commit",
        "desired_commit",
        "purge_queue",
        "play_sessions",
        "out_kbit",
    ] {
        assert!(e1.get(field).is_some(), "{field}: {v}");
    }
    assert_eq!(nodes[1]["node"], "edge-2");
    assert_eq!(nodes[1]["online"], false);
    assert!(nodes[1]["age_s"].is_null() && nodes[1]["commit"].is_null());
    // edge-2 (a target) never reported: offline, exit 1.
    assert_eq!(v["verdict"], "offline", "{v}");
    let out = edgeform(f.path(), &["status"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("(desired)") && text.contains("1/2 online"),
        "{text}"
    );
    assert!(
        text.contains("verdict: OFFLINE: offline or unreachable: edge-2"),
        "{text}"
    );

    // exec: an allowed action with --wait prints its output, exit 0.
    let out = edgeform(
        f.path(),
        &[
            "exec", "--node", "edge-1", "--action", "echo", "--arg", "word=hi", "--wait", "15",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("echo ok, exit 0"), "{}", stdout(&out));
    assert!(stdout(&out).contains("said hi"), "{}", stdout(&out));
    // Refused by the agent: exit 1 with the reason; JSON carries the result.
    let out = edgeform(
        f.path(),
        &[
            "exec", "--node", "edge-1", "--action", "echo", "--arg", "word=a;b", "--wait", "15",
            "--format", "json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(r["status"], "refused", "{r}\n{}", stderr(&out));
    assert!(r["reason"].as_str().unwrap().contains("never accepted"));
    // No --wait: sent, exit 0.
    let out = edgeform(
        f.path(),
        &[
            "exec", "--node", "edge-1", "--action", "echo", "--arg", "word=x",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sent echo to edge-1"),
        "{}",
        stderr(&out)
    );
    // Waiting on a node whose agent is not running: exit 1, named.
    let out = edgeform(
        f.path(),
        &[
            "exec", "--node", "edge-2", "--action", "echo", "--wait", "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no result from edge-2 within 1s: its agent is offline"),
        "{}",
        stderr(&out)
    );
    // Local mistakes never reach the broker.
    let out = edgeform(f.path(), &["exec", "--node", "edge-9", "--action", "echo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no such node"), "{}", stderr(&out));
    let out = edgeform(
        f.path(),
        &[
            "exec", "--node", "edge-1", "--action", "echo", "--arg", "word",
        ],
    );
    assert!(stderr(&out).contains("NAME=VALUE"), "{}", stderr(&out));

    // The agent stops cleanly: offline.
    drop(agent);
    let v = status_json(&f);
    assert_eq!(v["nodes"][0]["online"], false, "{v}");
    // The broker down: a clear one-line error, exit 1.
    drop(broker);
    let out = edgeform(f.path(), &["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot reach the MQTT broker mqtt://127.0.0.1:"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn status_needs_a_broker_in_cluster_yaml() {
    let f = Fixture::with(&[]);
    let out = edgeform(f.path(), &["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no `mqtt` block"), "{}", stderr(&out));
}

/// A broker client that answers every command for `node` with a forged
/// "ok" result (escape sequences in its output), signed with `key` when
/// given. Runs until the returned flag is set.
fn forger(
    broker: u16,
    node: &'static str,
    key: Option<&'static [u8]>,
) -> Arc<std::sync::atomic::AtomicBool> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let mut o = rumqttc::MqttOptions::new(format!("forger-{node}"), "127.0.0.1", broker);
    o.set_keep_alive(Duration::from_secs(5));
    let (client, mut connection) = rumqttc::Client::new(o, 16);
    client
        .subscribe(format!("edgeform/cmd/{node}"), rumqttc::QoS::AtLeastOnce)
        .unwrap();
    std::thread::spawn(move || {
        for event in connection.iter() {
            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) = event else {
                continue;
            };
            let Ok(cmd) = serde_json::from_slice::<edgestate::mqtt::Command>(&p.payload) else {
                continue;
            };
            let mut r = edgestate::mqtt::CommandResult {
                id: cmd.id.clone(),
                node: node.into(),
                action: cmd.action.clone(),
                status: edgestate::mqtt::Outcome::Ok,
                exit_code: Some(0),
                stdout: "\u{1b}]0;pwned\u{7}\u{1b}[2Jall good\n".into(),
                stderr: String::new(),
                duration_ms: 1,
                reason: None,
                finished_at: 0,
                sig: None,
            };
            if let Some(k) = key {
                r.sign(&cmd, k);
            }
            let _ = client.try_publish(
                format!("edgeform/result/{node}/{}", cmd.id),
                rumqttc::QoS::AtLeastOnce,
                false,
                serde_json::to_vec(&r).unwrap(),
            );
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    stop
}

/// A node with no agent; another broker client answers its commands with
/// a forged "ok". With a command key, `exec --wait` ignores the unsigned
/// and the wrongly signed forgery (warning, escaped) and exits 1; without
/// a key (unauthenticated, as documented) the output is printed escaped.
#[test]
fn forged_results_are_not_accepted() {
    let broker = harness::mosquitto();
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &*edge("edge-1", 1)),
        ("nodes/edge-2.yaml", &*edge("edge-2", 2)),
        (
            "cluster.yaml",
            &format!(
                "name: test\nmqtt:\n  url: mqtt://127.0.0.1:{}\n",
                broker.port
            ),
        ),
    ]);
    let exec = |node: &str, key: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"));
        c.args(["exec", "--node", node, "--action", "echo", "--wait", "3"])
            .current_dir(f.path())
            .env("NO_COLOR", "1")
            .env_remove("EDGEFORM_COMMAND_KEY");
        if let Some(k) = key {
            c.env("EDGEFORM_COMMAND_KEY", k);
        }
        c.output().unwrap()
    };
    let unsigned = forger(broker.port, "edge-1", None);
    let out = exec("edge-1", Some("s3cret"));
    let (o, e) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{o}{e}");
    assert!(!o.contains("ok"), "{o}");
    assert!(
        e.contains("it is unsigned") && e.contains("no result from edge-1"),
        "{e}"
    );
    assert!(
        !e.contains('\u{1b}') && !o.contains('\u{1b}'),
        "raw escape: {e}"
    );
    unsigned.store(true, std::sync::atomic::Ordering::Relaxed);
    // Signed, but with a key that is not the cluster's.
    let _wrong = forger(broker.port, "edge-2", Some(b"guessed"));
    let out = exec("edge-2", Some("s3cret"));
    let (o, e) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{o}{e}");
    assert!(!o.contains("ok"), "{o}");
    assert!(e.contains("does not verify"), "{e}");
    // No key anywhere: results are unauthenticated (documented); what is
    // shown is escaped.
    let out = exec("edge-2", None);
    let o = stdout(&out);
    assert!(o.contains("edge-2: echo ok"), "{o}{}", stderr(&out));
    assert!(
        !o.contains('\u{1b}') && o.contains("\\u{1b}[2Jall good"),
        "{o}"
    );
}

/// A command the broker drops on the way (its queue for the agent full)
/// is reported by `exec --wait` as dropped, naming mosquitto's
/// `max_queued_messages` — never a silent "no result". Real mosquitto
/// holding 1 message in flight and 2 queued per client.
#[test]
fn exec_reports_a_command_the_broker_dropped() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto_limits(1, 2);
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &*edge("edge-1", r.port)),
        (
            "cluster.yaml",
            &format!(
                "name: test\nmqtt:\n  url: mqtt://127.0.0.1:{}\n",
                broker.port
            ),
        ),
    ]);
    let cache = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    let _agent = Agent::start(&format!(
        "node: edge-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
         cache: {{dirs: [{}]}}\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n\
         health: {{interval: 500ms}}\n\
         actions:\n  slow:\n    argv: [/usr/bin/sleep, \"{{s}}\"]\n    args: {{s: \"[0-9]\"}}\n  \
         mark:\n    argv: [/usr/bin/mktemp, -p, \"{{dir}}\"]\n    args: {{dir: \"/[A-Za-z0-9/._-]+\"}}\n",
        r.port,
        cache.path().display(),
        broker.port
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_json(&f)["nodes"][0]["online"] != true {
        assert!(Instant::now() < deadline, "edge-1 never came online");
        std::thread::sleep(Duration::from_millis(200));
    }
    let dir = format!("dir={}", marks.path().display());
    let send = |args: &[&str]| {
        let mut all = vec!["exec", "--node", "edge-1"];
        all.extend_from_slice(args);
        edgeform(f.path(), &all)
    };
    // One command runs for 5 s (in flight), two wait in the queue: full.
    // Published at once from here (no process start between them).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let filler = |id: &str, action: &str, arg: (&str, String)| edgestate::mqtt::Command {
        id: id.into(),
        action: action.into(),
        args: [(arg.0.to_owned(), arg.1)].into_iter().collect(),
        issued_at: now,
        expires_at: now + 60,
        sig: None,
    };
    let mark_dir = marks.path().display().to_string();
    let mut o = rumqttc::MqttOptions::new("filler", "127.0.0.1", broker.port);
    o.set_keep_alive(Duration::from_secs(5));
    let (client, mut connection) = rumqttc::Client::new(o, 16);
    for cmd in [
        filler("slow", "slow", ("s", "5".into())),
        filler("queued-1", "mark", ("dir", mark_dir.clone())),
        filler("queued-2", "mark", ("dir", mark_dir.clone())),
    ] {
        client
            .publish(
                "edgeform/cmd/edge-1",
                rumqttc::QoS::AtLeastOnce,
                false,
                serde_json::to_vec(&cmd).unwrap(),
            )
            .unwrap();
    }
    let mut acked = 0;
    for event in connection.iter() {
        if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) = event {
            acked += 1;
            if acked == 3 {
                break;
            }
        }
    }
    let out = send(&[
        "--action", "mark", "--arg", &dir, "--wait", "7", "--format", "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("no result from edge-1 within 7s: DROPPED")
            && err.contains("max_queued_messages"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["missing"], "dropped", "{v}");
    assert!(v["result"].is_null(), "{v}");
    // The queued ones ran; the dropped one never did, and the broker
    // says it dropped it.
    assert_eq!(std::fs::read_dir(marks.path()).unwrap().count(), 2);
    assert!(
        broker
            .log()
            .contains("Outgoing messages are being dropped for client edgeform-agent-edge-1"),
        "{}",
        broker.log()
    );
    // An answered command is not reported missing.
    let out = send(&["--action", "mark", "--arg", &dir, "--wait", "10"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(marks.path()).unwrap().count(), 3);
}
