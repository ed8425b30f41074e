//! Observability and command keys on the agent side, against real
//! servers: JSON log lines, ed25519 command keys (real mosquitto), metrics.

use std::time::Duration;

use edgestate::cmdkey::{self, SigningKey};
use edgestate::mqtt::{CommandResult, Outcome};

use crate::mqtt::{actions_yaml, command, mqtt_yaml, run, wait_online};
use crate::route::wait_for;
use crate::util::{Agent, Mqtt};

/// Every line of `log` parsed as JSON (panics on one that is not).
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n---\n{log}"))
        })
        .collect()
}

#[test]
fn json_log_lines_parse() {
    let r = harness::redis(&[]);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        "",
        &[("EDGEFORM_LOG_FORMAT", "json")],
    );
    wait_for(
        || agent.log().contains("purge worker connected"),
        "the worker connects",
        &|| agent.log(),
    );
    std::thread::sleep(Duration::from_millis(100));
    agent.terminate();
    let lines = json_lines(&agent.log());
    assert!(lines.len() >= 3, "{lines:?}");
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["level"].is_string(), "{l}");
    }
    let connected = lines
        .iter()
        .find(|l| l["fields"]["message"] == "purge worker connected")
        .expect("the connect line");
    assert_eq!(connected["fields"]["queue"], "cdn:purge:eu:edge-1");
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "shutting down")
    );
}

/// Write the control key's public half and `node`'s result key; the
/// agent.yaml lines that name them.
fn key_files(dir: &std::path::Path, control: &SigningKey, node: &str) -> String {
    let public = dir.join("command.pub");
    let result = dir.join("result.key");
    std::fs::write(&public, cmdkey::verifying_key_pem(&control.verifying_key())).unwrap();
    let hex: String = cmdkey::result_key(control, node)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(&result, hex).unwrap();
    format!(
        "  command_public_key_file: {}\n  result_key_file: {}\n",
        public.display(),
        result.display()
    )
}

/// A command signed with another node's material is refused (real
/// mosquitto, real agent).
#[test]
fn ed25519_commands_and_other_nodes_material_refused() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let control = SigningKey::from_bytes(&[7; 32]);
    let keys = key_files(dir.path(), &control, "edge-1");
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "{}{}",
            mqtt_yaml(broker.port, "").replace("mqtt:\n", &format!("mqtt:\n{keys}")),
            actions_yaml()
        ),
    );
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    let refused = |res: &CommandResult, what: &str| {
        assert_eq!(res.status, Outcome::Refused, "{what}: {res:?}");
        assert!(
            res.reason.as_deref().unwrap().contains("bad signature"),
            "{what}: {res:?}"
        );
        assert!(res.stdout.is_empty(), "{what}: it ran");
    };
    // Everything a compromised edge-2 holds: its own result key, the
    // control host's public key, the old shared HMAC key — and any key
    // pair it makes itself.
    let edge2_result_key = cmdkey::result_key(&control, "edge-2");
    let mut c = command("f1", "echo", &[("word", "forged")]);
    c.sign("edge-1", &edge2_result_key);
    refused(&run(&m, &c, &agent), "edge-2's result key as HMAC");
    let mut c = command("f2", "echo", &[("word", "forged")]);
    c.sign("edge-1", b"the-old-shared-key");
    refused(&run(&m, &c, &agent), "the retired shared key");
    let mut c = command("f3", "echo", &[("word", "forged")]);
    c.sign_ed25519("edge-1", &SigningKey::from_bytes(&[8; 32]));
    refused(&run(&m, &c, &agent), "another ed25519 key");
    // A real command for edge-2, replayed to edge-1.
    let mut c = command("f4", "echo", &[("word", "forged")]);
    c.sign_ed25519("edge-2", &control);
    refused(&run(&m, &c, &agent), "edge-2's command replayed");
    let res = run(&m, &command("f5", "echo", &[("word", "hi")]), &agent);
    assert_eq!(res.status, Outcome::Refused);
    assert!(res.reason.unwrap().contains("unsigned"));
    // The control host's command runs; the result carries edge-1's own
    // result key, which edge-2's cannot produce.
    let mut good = command("g1", "echo", &[("word", "hi")]);
    good.sign_ed25519("edge-1", &control);
    let res = run(&m, &good, &agent);
    assert_eq!(
        (res.status, res.stdout.as_str()),
        (Outcome::Ok, "said hi\n")
    );
    assert!(res.verify_for_control(&good, "edge-1", &control), "{res:?}");
    let mut forged = res.clone();
    forged.sign(&good, &edge2_result_key);
    assert!(!forged.verify_for_control(&good, "edge-1", &control));
    assert!(
        agent.log().contains("command refused"),
        "refusals are logged:\n{}",
        agent.log()
    );
}

#[test]
fn migration_accepts_both_until_the_shared_key_goes() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    let control = SigningKey::from_bytes(&[7; 32]);
    let keys = key_files(dir.path(), &control, "edge-1");
    let mut agent = Agent::start_env(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "{}{}",
            mqtt_yaml(broker.port, "").replace(
                "mqtt:\n",
                &format!("mqtt:\n{keys}  command_key_env: TEST_COMMAND_KEY\n")
            ),
            actions_yaml()
        ),
        &[("TEST_COMMAND_KEY", "shared")],
    );
    let m = Mqtt::connect(broker.port);
    wait_online(&m, &agent);
    let mut old = command("m1", "echo", &[("word", "old")]);
    old.sign("edge-1", b"shared");
    let res = run(&m, &old, &agent);
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    // An old exec checks the result with the shared key.
    assert!(res.verify(&old, "edge-1", b"shared"));
    let mut new = command("m2", "echo", &[("word", "new")]);
    new.sign_ed25519("edge-1", &control);
    let res = run(&m, &new, &agent);
    assert_eq!(res.status, Outcome::Ok, "{res:?}");
    assert!(res.verify_for_control(&new, "edge-1", &control));
    // The shared key removed from agent.yaml: HMAC refused from then on.
    agent.terminate();
    let text = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(
        &agent.config,
        text.replace("  command_key_env: TEST_COMMAND_KEY\n", ""),
    )
    .unwrap();
    agent.spawn();
    wait_online(&m, &agent);
    let mut old = command("m3", "echo", &[("word", "old")]);
    old.sign("edge-1", b"shared");
    let res = run(&m, &old, &agent);
    assert_eq!(res.status, Outcome::Refused, "{res:?}");
    assert!(res.reason.unwrap().contains("HMAC key is retired"));
}

#[test]
fn unreadable_or_wrong_key_files_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    let missing = dir.path().join("nope.pub");
    let result = dir.path().join("result.key");
    std::fs::write(&result, "00".repeat(32)).unwrap();
    let write = |public: &std::path::Path| {
        std::fs::write(
            &config,
            format!(
                "node: edge-1\nregion: eu\nredis: {{url: redis://127.0.0.1:1}}\ncache:\n  dirs: [{}]\nmqtt:\n  url: mqtt://127.0.0.1:1\n  command_public_key_file: {}\n  result_key_file: {}\n",
                dir.path().display(),
                public.display(),
                result.display()
            ),
        )
        .unwrap();
    };
    let check = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
            .arg("--config")
            .arg(&config)
            .arg("--check-config")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    write(&missing);
    let (code, err) = check();
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "cannot read the command public key `{}`",
            missing.display()
        )) && err.contains("agent.yaml:8:"),
        "{err}"
    );
    // A private key where the public one belongs.
    let private = dir.path().join("command.key");
    std::fs::write(
        &private,
        cmdkey::signing_key_pem(&SigningKey::from_bytes(&[1; 32])),
    )
    .unwrap();
    write(&private);
    let (code, err) = check();
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&private.display().to_string()) && err.contains("not an ed25519 public key"),
        "{err}"
    );
}

/// `GET /metrics` on `port`: the samples, `name{labels}` → value. Asked
/// as Prometheus asks, the answer is OpenMetrics; asked with no `Accept`
/// (curl), the 0.0.4 text format, which `promtool check metrics` passes.
fn scrape(port: u16) -> std::collections::BTreeMap<String, f64> {
    let (status, head, body) = crate::route::get(
        port,
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    );
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    let (status, head, text) = crate::route::get(port, "/metrics", "");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    harness::promtool_check_metrics(&text);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// build_info, the purge duration histogram, queue depth and redis_up,
/// on a separate metrics listener (real Redis).
#[test]
fn agent_metrics_on_a_separate_listener() {
    let mut r = harness::redis(&[]);
    let cache = crate::util::Cache::new();
    let file = cache.put("static", "httpexample.com/a.mp4");
    let port = harness::free_port();
    let agent = Agent::start_with(
        r.port,
        &cache.dirs(),
        &format!("metrics:\n  listen: 127.0.0.1:{port}\n"),
    );
    let log = || agent.log();
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the metrics listener",
        &log,
    );
    crate::util::push_job(
        r.port,
        r#"{"id":"m1","site":"example.com","key":"httpexample.com/a.mp4"}"#,
    );
    assert_eq!(crate::util::wait_done(r.port, "m1", &agent), "1");
    assert!(!crate::util::exists(&file));
    // Only /metrics on this listener.
    assert_eq!(crate::route::get(port, "/route/cam1", "").0, 404);
    let mut s = scrape(port);
    wait_for(
        || {
            s = scrape(port);
            s.get("edgeform_agent_purge_queue_depth") == Some(&0.0)
        },
        "queue depth",
        &log,
    );
    assert_eq!(
        s["edgeform_agent_purge_duration_seconds_count"], 1.0,
        "{s:?}"
    );
    assert!(s["edgeform_agent_purge_duration_seconds_sum"] > 0.0);
    assert_eq!(s["edgeform_agent_redis_up"], 1.0);
    assert_eq!(s[r#"edgeform_agent_purge_jobs_total{status="done"}"#], 1.0);
    let build: Vec<&String> = s
        .keys()
        .filter(|k| k.starts_with("edgeform_agent_build_info{"))
        .collect();
    assert_eq!(build.len(), 1, "{s:?}");
    assert!(build[0].contains(r#"node="edge-1""#), "{build:?}");
    // Redis goes away: redis_up drops to 0.
    r.stop();
    wait_for(
        || scrape(port).get("edgeform_agent_redis_up") == Some(&0.0),
        "redis_up 0 with Redis stopped",
        &log,
    );
}

/// `/metrics` is not for viewers: an `http.listen` on every address
/// (`0.0.0.0`, viewer-facing) answers it 404 while `/healthz` works and
/// `metrics.listen` serves it; `http.metrics: true` serves it there
/// anyway. A loopback `http.listen` keeps it (see the other tests).
#[test]
fn metrics_are_not_served_on_a_viewer_facing_listener_unless_configured() {
    let r = harness::redis(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (http, metrics) = (harness::free_port(), harness::free_port());
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!("http:\n  listen: 0.0.0.0:{http}\nmetrics:\n  listen: 127.0.0.1:{metrics}\n"),
    );
    let log = || agent.log();
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", http)).is_ok(),
        "the http listener",
        &log,
    );
    // Served (503 here: no routing table yet), unlike /metrics.
    assert_eq!(crate::route::get(http, "/healthz", "").0, 503);
    let (status, _, body) = crate::route::get(http, "/metrics", "");
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("edgeform_agent"), "{body}");
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", metrics)).is_ok(),
        "the metrics listener",
        &log,
    );
    assert!(scrape(metrics).contains_key("edgeform_agent_redis_up"));
    assert!(agent.log().contains("/metrics not served here"));
    drop(agent);

    let http = harness::free_port();
    let agent = Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!("http:\n  listen: 0.0.0.0:{http}\n  metrics: true\n"),
    );
    let log = || agent.log();
    wait_for(
        || std::net::TcpStream::connect(("127.0.0.1", http)).is_ok(),
        "the http listener",
        &log,
    );
    assert!(scrape(http).contains_key("edgeform_agent_redis_up"));
}
