//! `packaging/agent.yaml`, the documented sample, is a valid configuration
//! and names every key the agent knows; the shipped unit's environment is
//! one the agent takes.

use std::path::Path;
use std::process::Command;

fn sample() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/agent.yaml")
}

/// The sample as deployed: its CA file exists (here a temp copy of the
/// sample points at a temp one).
fn deployed_sample(dir: &Path) -> std::path::PathBuf {
    let ca = dir.join("mqtt-ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(sample())
        .unwrap()
        .replace("/etc/edgeform/mqtt-ca.pem", &ca.display().to_string());
    let copy = dir.join("agent.yaml");
    std::fs::write(&copy, text).unwrap();
    copy
}

#[test]
fn sample_agent_yaml_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
        .arg("--config")
        .arg(deployed_sample(dir.path()))
        .arg("--check-config")
        .env("EDGEFORM_COMMAND_KEY", "test-key")
        .env("EDGEFORM_MQTT_PASSWORD", "test-password")
        .env("EDGEFORM_REDIS_PASSWORD", "test-password")
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
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
            .arg("--config")
            .arg(deployed_sample(dir.path()))
            .arg("--check-config")
            .env_remove("EDGEFORM_COMMAND_KEY")
            .env("EDGEFORM_MQTT_PASSWORD", "test-password")
            .env("EDGEFORM_REDIS_PASSWORD", "test-password")
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
        "\n  metrics:",
        "\nstate_dir:",
        "\nrouting:",
        "\n  # health_file:",
        "\n  refresh:",
        "\nmqtt:",
        "\n  topic_prefix:",
        "\n  username:",
        "\n  ca_file:",
        "\n  command_key_env:",
        "\n  # command_public_key_file:",
        "\n  # result_key_file:",
        "\n# metrics:",
        "\n#   listen:",
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

/// `--check-config` on the sample with nothing deployed reports every
/// missing variable and the missing CA file in one run, each at its line.
#[test]
fn check_config_reports_every_missing_variable_and_the_ca_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
        .arg("--config")
        .arg(sample())
        .arg("--check-config")
        .env_remove("EDGEFORM_COMMAND_KEY")
        .env_remove("EDGEFORM_MQTT_PASSWORD")
        .env_remove("EDGEFORM_REDIS_PASSWORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        "EDGEFORM_REDIS_PASSWORD",
        "EDGEFORM_MQTT_PASSWORD",
        "EDGEFORM_COMMAND_KEY",
        "cannot read the MQTT CA file `/etc/edgeform/mqtt-ca.pem`",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let located = err
        .lines()
        .filter(|l| l.starts_with("error: ") && l.contains("agent.yaml:"))
        .count();
    assert_eq!(located, 4, "{err}");
    assert!(err.contains("4 errors in"), "{err}");
}

/// Without `--config` and no /etc/edgeform/agent.yaml: a hint, not
/// `agent.yaml:0:0: cannot read`.
#[test]
fn no_config_gives_a_hint() {
    if Path::new("/etc/edgeform/agent.yaml").exists() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
        .arg("--check-config")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--config FILE") && !err.contains(":0:0:"),
        "{err}"
    );
}

/// The allocator settings of the shipped unit
/// (packaging/systemd/edgeform-agent.service) are all ones jemalloc knows:
/// it names any other on stderr (`<jemalloc>: Invalid conf pair`) and
/// goes on without it.
#[test]
fn the_units_allocator_settings_are_taken_without_complaint() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/edgeform-agent.service"),
    )
    .unwrap();
    let conf = unit
        .lines()
        .find_map(|l| l.strip_prefix("Environment=_RJEM_MALLOC_CONF="))
        .expect("the unit sets the allocator");
    for (conf, clean) in [(conf, true), ("narenas:1,no_such_option:1", false)] {
        let out = Command::new(env!("CARGO_BIN_EXE_edgeform-agent"))
            .arg("--version")
            .env("_RJEM_MALLOC_CONF", conf)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(!err.contains("<jemalloc>"), clean, "{conf}: {err}");
    }
}
