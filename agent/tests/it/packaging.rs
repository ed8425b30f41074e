//! `packaging/agent.yaml`, the documented sample, is a valid configuration
//! and names every key the agent knows.

use std::path::Path;
use std::process::Command;

fn sample() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/agent.yaml")
}

#[test]
fn sample_agent_yaml_passes_check_config() {
    let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
        .arg("--config")
        .arg(sample())
        .arg("--check-config")
        .env("EDGEFORM_COMMAND_KEY", "test-key")
        .env("EDGEFORM_MQTT_PASSWORD", "test-password")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("valid (node edge-ams-1, queue cdn:purge:eu:edge-ams-1)"),
        "{err}"
    );
}

/// Every key of the sample is set (not only in comments), so a key the
/// agent stops accepting fails the check above; and the sentinel form is
/// documented in comments.
#[test]
fn sample_agent_yaml_sets_every_key() {
    let text = std::fs::read_to_string(sample()).unwrap();
    // The sample names a command signing key variable: without it in the
    // environment the check fails, naming it.
    if std::env::var_os("EDGEFORM_COMMAND_KEY").is_none() {
        let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
            .arg("--config")
            .arg(sample())
            .arg("--check-config")
            .env_remove("EDGEFORM_COMMAND_KEY")
            .env("EDGEFORM_MQTT_PASSWORD", "test-password")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("EDGEFORM_COMMAND_KEY"),
            "a missing signing key is an error naming the variable: {err}"
        );
    }
    for key in [
        "\nnode:",
        "\nregion:",
        "\nredis:",
        "\n  url:",
        "\n  # sentinels:",
        "\n  # master:",
        "\n  password_env:",
        "\ncache:",
        "\n  dirs:",
        "\n  levels:",
        "\n  key:",
        "\nhttp:",
        "\n  listen:",
        "\n  proxy_url:",
        "\nrouting:",
        "\n  # health_file:",
        "\n  refresh:",
        "\nmqtt:",
        "\n  topic_prefix:",
        "\n  username:",
        "\n  ca_file:",
        "\n  command_key_env:",
        "\nhealth:",
        "\n  interval:",
        "\n  play_sessions:",
        "\n  streams:",
        "\nactions:",
        "\n    argv:",
        "\n    args:",
        "\n    timeout:",
    ] {
        assert!(text.contains(key), "{key:?} is not in packaging/agent.yaml");
    }
}
