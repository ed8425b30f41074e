//! Issue #15 items 5, 6, 10 on the control side, against real servers:
//! `edgeform keygen` and `exec --signing-key` (real mosquitto, the agent
//! library in-process), reconcile metrics (real Redis), JSON logs.

use std::path::Path;

use crate::util::{Agent, Fixture, edgeform, stderr, stdout};

fn edge(name: &str, port: u16) -> String {
    format!(
        "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

fn agent_with_keys(redis: u16, broker: u16, cache: &Path, public: &Path, result: &Path) -> Agent {
    Agent::start(&format!(
        "node: edge-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
         cache: {{dirs: [{}]}}\n\
         mqtt: {{url: \"mqtt://127.0.0.1:{broker}\", command_public_key_file: {}, result_key_file: {}}}\n\
         health: {{interval: 500ms}}\n\
         actions:\n  echo:\n    argv: [/usr/bin/echo, said, \"{{word}}\"]\n    args: {{word: \"[a-z]+\"}}\n",
        cache.display(),
        public.display(),
        result.display()
    ))
}

fn exec(dir: &Path, key: &Path, word: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args([
            "exec", "--node", "edge-1", "--action", "echo", "--wait", "5",
        ])
        .args(["--arg", &format!("word={word}")])
        .arg("--signing-key")
        .arg(key)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("EDGEFORM_COMMAND_KEY")
        .output()
        .unwrap()
}

// See: #15 item 5 (keygen, exec signing ed25519, results checked with the
// node's result key; an openssl-made key works the same)
#[test]
fn r15_5_keygen_and_exec_with_an_ed25519_key() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
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
    let keys = tempfile::tempdir().unwrap();
    let k = |n: &str| keys.path().join(n);
    let key = k("command.key");
    let out = edgeform(f.path(), &["keygen", "--out", key.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Never overwritten.
    let again = edgeform(f.path(), &["keygen", "--out", key.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("exists; not overwritten"));
    let out = edgeform(
        f.path(),
        &[
            "keygen",
            "--result-key",
            "edge-1",
            "--signing-key",
            key.to_str().unwrap(),
            "--out",
            k("edge-1.result").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cache = tempfile::tempdir().unwrap();
    let _agent = agent_with_keys(
        r.port,
        broker.port,
        cache.path(),
        &k("command.key.pub"),
        &k("edge-1.result"),
    );
    std::thread::sleep(std::time::Duration::from_millis(800));
    let out = exec(f.path(), &key, "hi");
    let (o, e) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{o}{e}");
    assert!(
        o.contains("edge-1: echo ok") && o.contains("said hi"),
        "{o}"
    );
    assert!(e.contains("signed"), "{e}");

    // Another key pair (made with openssl, which keygen's format matches):
    // the agent refuses, unsigned; exec accepts no unsigned answer.
    let other = k("other.key");
    let st = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(st.success());
    let out = exec(f.path(), &other, "forged");
    let (o, e) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{o}{e}");
    assert!(!o.contains("said"), "{o}");
    assert!(e.contains("it is unsigned") && e.contains("refused"), "{e}");

    // An unreadable key file: one line naming it, nothing sent.
    let missing = k("missing.key");
    let out = exec(f.path(), &missing, "hi");
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(
        e.contains(&format!(
            "cannot read the command signing key `{}`",
            missing.display()
        )),
        "{e}"
    );
    // A public key given as the private one.
    let out = exec(f.path(), &k("command.key.pub"), "hi");
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("not an ed25519 private key"), "{e}");
}
