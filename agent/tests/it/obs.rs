//! Issue #15 items 5, 6, 10 on the agent side, against real servers:
//! JSON log lines, ed25519 command keys (real mosquitto), metrics.

use std::time::Duration;

use crate::route::wait_for;
use crate::util::Agent;

/// Every line of `log` parsed as JSON (panics on one that is not).
fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n---\n{log}"))
        })
        .collect()
}

// See: #15 item 10 (--log-format json)
#[test]
fn r15_10_json_log_lines_parse() {
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
