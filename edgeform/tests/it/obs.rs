//! Command keys, metrics and JSON logs on the control side, against real
//! servers:
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

// keygen, exec signing ed25519, results checked with the node's result
// key; an openssl-made key works the same.
#[test]
fn exec_signs_with_an_ed25519_key_and_checks_the_nodes_result_key() {
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
    assert!(!e.contains("readable by other users"), "{e}");
    // A key others can read still signs, with a warning.
    let open = k("open.key");
    std::fs::copy(&key, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = exec(f.path(), &open, "hey");
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{e}");
    assert!(e.contains("readable by other users (mode 644)"), "{e}");

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

/// The samples of a Prometheus text exposition: `name{labels}` → value.
fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l}"));
            (
                series.to_owned(),
                value.parse::<f64>().unwrap_or_else(|_| panic!("{l}")),
            )
        })
        .collect()
}

/// A repo of `n` sites on edge-1 at `port`, committed.
fn sites_repo(n: usize, port: u16) -> (Fixture, String) {
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", edge("edge-1", port).as_bytes());
    for i in 0..n {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            format!("host: s{i:05}.example.com\norigin: http://192.0.2.1\n").as_bytes(),
        );
    }
    let head = f.commit("sites");
    (f, head)
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

// Metrics scraped over HTTP and the textfile parsed (real Redis;
// promtool), and JSON log lines from edgeform.
#[test]
fn reconcile_metrics_over_http_and_textfile_and_json_logs() {
    let r = harness::redis(&[]);
    let (f, head) = sites_repo(20, r.port);
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let textfile = dir.path().join("edgeform.prom");
    let tf = textfile.to_str().unwrap();

    // Drift, repaired by a --once heal; JSON logs.
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("DEL")
        .arg("site:s00001.example.com")
        .exec(&mut c)
        .unwrap();
    let out = edgeform(
        f.path(),
        &[
            "reconcile",
            "--once",
            "heal",
            "--metrics-textfile",
            tf,
            "--log-format",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "drift repaired" && l["fields"]["kind"] == "missing"),
        "{log}"
    );
    let text = std::fs::read_to_string(&textfile).unwrap();
    harness::promtool_check_metrics(&text);
    let s = samples(&text);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last =
        s[r#"edgeform_reconcile_last_success_timestamp_seconds{target="edge-1",job="heal"}"#];
    assert!((now - last).abs() < 60.0, "{last} vs {now}");
    assert_eq!(
        s[&format!(r#"edgeform_reconcile_applied_commit_info{{target="edge-1",commit="{head}"}}"#)],
        1.0
    );
    assert_eq!(
        s[r#"edgeform_reconcile_drift_repaired_total{target="edge-1",kind="missing"}"#],
        1.0
    );
    assert_eq!(s["edgeform_reconcile_heal_duration_seconds_count"], 1.0);
    assert_eq!(
        s[r#"edgeform_reconcile_runs_total{job="heal",result="ok"}"#],
        1.0
    );
    assert!(
        s.keys()
            .any(|k| k.starts_with("edgeform_reconcile_build_info{"))
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() == 1,
        "no temporary file left"
    );

    // A lock wait: an apply of a new commit holds the target's lock for a
    // while (a no-op apply takes no lock), and the daemon's first sync
    // of that commit waits for it.
    f.write(
        "sites/s99999.yaml",
        b"host: s99999.example.com\norigin: http://192.0.2.1\n",
    );
    f.commit("one more site");
    let holder = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["apply", "--yes"])
        .current_dir(f.path())
        .env("EDGEFORM_TEST_HOLD_LOCK_MS", "1500")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));

    // The daemon with --metrics-listen, scraped over HTTP.
    let port = harness::free_port();
    let daemon_state = tempfile::tempdir().unwrap();
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["reconcile", "--sync-every", "1h", "--heal-every", "1h"])
        .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
        .env("EDGEFORM_STATE_DIR", daemon_state.path().join("state"))
        .current_dir(f.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let body = loop {
        let body = std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| http_get(port, "/metrics"))
            .unwrap_or_default();
        if body.contains(r#"job="sync"} "#) && body.contains(r#"job="heal"} "#) {
            break body;
        }
        if std::time::Instant::now() > deadline {
            let _ = daemon.kill();
            let out = daemon.wait_with_output().unwrap();
            panic!("no metrics: {body}\n{}", stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = daemon.kill();
    let _ = daemon.wait();
    let mut holder = holder;
    let _ = holder.wait();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    // Asked with no Accept: the 0.0.4 text format, which promtool passes
    // (Prometheus asks for OpenMetrics and gets it).
    assert!(body.contains("text/plain; version=0.0.4"), "{body}");
    let exposition = &body[body.find("\r\n\r\n").unwrap() + 4..];
    harness::promtool_check_metrics(exposition);
    let s = samples(exposition);
    assert!(s.contains_key(
        r#"edgeform_reconcile_last_success_timestamp_seconds{target="edge-1",job="sync"}"#
    ));
    assert_eq!(
        s["edgeform_reconcile_lock_waits_total"], 1.0,
        "{exposition}"
    );
    assert!(s["edgeform_reconcile_lock_wait_seconds_total"] > 0.3);
    assert_eq!(s["edgeform_reconcile_apply_duration_seconds_count"], 1.0);

    // A mass deletion refused by sync: counted by reason.
    for i in 0..6 {
        std::fs::remove_file(f.path().join(format!("sites/s{i:05}.yaml"))).unwrap();
    }
    f.commit("delete six");
    let out = edgeform(
        f.path(),
        &["reconcile", "--once", "sync", "--metrics-textfile", tf],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let s = samples(&std::fs::read_to_string(&textfile).unwrap());
    assert_eq!(
        s[r#"edgeform_reconcile_refusals_total{target="edge-1",job="sync",reason="deletes"}"#],
        1.0
    );
    assert_eq!(
        s[r#"edgeform_reconcile_runs_total{job="sync",result="failed"}"#],
        1.0
    );
    // A refused run reports no applied commit for the target.
    assert!(!s.keys().any(|k| k.contains("applied_commit_info")));
}

/// Every sample name (`name` of `name{…} v`) in an exposition.
fn sample_names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// The `edgeform_…` metric names a PromQL expression uses.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("edgeform_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Both binaries' expositions with every family populated, from the same
/// code that serves `/metrics`.
fn expositions() -> String {
    let c = control::metrics::Metrics::default();
    c.succeeded("edge-1", "sync", "abc");
    c.failed(
        "edge-1",
        "heal",
        &anyhow::Error::new(control::plan::Refusal::Empty),
    );
    c.drift("edge-1", "missing", 1);
    c.lock_waited(std::time::Duration::from_millis(5));
    c.apply_seconds.observe(0.1);
    c.heal_seconds.observe(0.1);
    c.run_done("sync", false);
    c.certificate_expiries(&[("a.test".to_owned(), 1)]);
    c.renewal_failed("a.test");
    c.rollout_halted("abc", true);
    c.outbox(&std::collections::BTreeMap::from([(
        "edge-9".to_owned(),
        control::outbox::Depth {
            waiting: 1,
            delivered: 0,
            oldest: Some(1),
        },
    )]));
    let a = agent::metrics::Metrics::default();
    a.set_build("edge-1");
    a.purge_duration.observe(0.01);
    for f in [&a.purge_jobs, &a.route_requests, &a.commands] {
        agent::metrics::Metrics::count(f, "ok");
    }
    format!("{}{}", c.encode(), a.encode())
}

// Alert rules checked by promtool; the dashboard is valid JSON and every
// metric it and the rules use exists.
#[test]
fn alert_rules_pass_promtool_and_the_dashboard_uses_real_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = root.join("packaging/prometheus/edgeform-alerts.yml");
    for args in [
        vec!["check", "rules", rules.to_str().unwrap()],
        vec!["test", "rules", "edgeform-alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(&args)
            .current_dir(root.join("packaging/prometheus"))
            .output()
            .expect("promtool (Debian package prometheus; scripts/test installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    let exposed = sample_names(&expositions());
    let text =
        std::fs::read_to_string(root.join("packaging/grafana/edgeform-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    let mut used = 0;
    for p in panels {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            for name in names_in(expr) {
                assert!(
                    exposed.contains(&name),
                    "panel {}: `{name}` is not exposed (exposed: {exposed:?})",
                    p["title"]
                );
                used += 1;
            }
        }
    }
    assert!(used >= 17);
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    // The certificate alerts are there (their cases are in the test file).
    for alert in [
        "EdgeformCertificateExpiringSoon",
        "EdgeformCertificateRenewalFailing",
    ] {
        assert!(rules_text.contains(&format!("alert: {alert}")), "{alert}");
    }
    for line in rules_text
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:"))
    {
        for name in names_in(line) {
            assert!(
                exposed.contains(&name),
                "rule `{line}`: `{name}` is not exposed"
            );
        }
    }
}

/// A node whose Redis is closed (status reads it and says so at once).
fn closed_edge() -> String {
    edge("edge-1", harness::free_port())
}

// `certs list` shows issuer, not-before, not-after and an ACME
// certificate's next renewal (`due` once past); `status` shows the
// certificate the sites use that expires first. Certificates made by
// openssl, imported into a real state directory.
#[test]
fn certs_list_and_status_show_issuer_expiry_and_renewal() {
    use crate::util::edgeform_with_state as run;
    let certs = harness::SiteCerts::new();
    certs
        .sign("shop", &["shop.example.com", "www.example.com"], 90)
        .sign("acme", &["other.example.com"], 30);
    let f = Fixture::with(&[
        ("nodes/edge-1.yaml", &*closed_edge()),
        (
            "cluster.yaml",
            "name: test\nacme: {directory: \"https://127.0.0.1:9/dir\"}\n",
        ),
        (
            "sites/shop.yaml",
            "host: shop.example.com\naliases: [www.example.com]\norigin: https://192.0.2.1\ntls: {certificate: shop}\n",
        ),
        (
            "sites/other.yaml",
            "host: other.example.com\norigin: https://192.0.2.1\ntls: {acme: true}\n",
        ),
    ]);
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    let file = |c: &str| certs.file(c).display().to_string();

    // Without certificates: no line, no field.
    let o = run(
        f.path(),
        &state,
        &["status", "--from", "redis", "--format", "json"],
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("status json");
    assert!(json.get("soonest_certificate_expiry").is_none(), "{json}");

    // The ACME site's certificate is kept as acme.<host> (as `certs
    // issue` keeps it; imported here: the list reads the name).
    for (name, c) in [("shop", "shop"), ("acme.other.example.com", "acme")] {
        let o = run(
            f.path(),
            &state,
            &[
                "certs",
                "import",
                name,
                "--cert",
                &file(&format!("{c}.chain.pem")),
                "--key",
                &file(&format!("{c}.key")),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }

    let o = run(f.path(), &state, &["certs", "list", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let (acme, shop) = (&json[0], &json[1]);
    assert_eq!(acme["name"], "acme.other.example.com");
    assert_eq!(shop["name"], "shop");
    let (nb, na) = (
        acme["not_before"].as_i64().unwrap(),
        acme["not_after"].as_i64().unwrap(),
    );
    assert_eq!(na - nb, 30 * 86_400, "{acme}");
    let renew = control::renew::renew_at(nb, na);
    assert_eq!(acme["next_renewal"], renew, "{acme}");
    assert_eq!(
        acme["next_renewal_rfc3339"],
        edgestate::time::rfc3339_signed(renew).as_str()
    );
    assert_eq!(acme["renewal_due"], false);
    assert_eq!(
        acme["not_before_rfc3339"],
        edgestate::time::rfc3339_signed(nb).as_str()
    );
    for c in [acme, shop] {
        assert_eq!(c["issuer"], "edgeform test site CA", "{c}");
        assert_eq!(c["problem"], serde_json::Value::Null, "{c}");
        // The existing fields stay.
        for field in ["hosts", "not_after_rfc3339", "fingerprint"] {
            assert!(c.get(field).is_some(), "{field}: {c}");
        }
    }
    // Not an ACME certificate: not renewed here.
    assert_eq!(shop["next_renewal"], serde_json::Value::Null);
    assert_eq!(shop["renewal_due"], serde_json::Value::Null);

    let o = run(f.path(), &state, &["certs", "list"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "HOSTS",
            "ISSUER",
            "NOT BEFORE",
            "NOT AFTER",
            "NEXT RENEWAL",
            "FINGERPRINT",
            "PROBLEM"
        ],
        "{text}"
    );
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[1][0], "acme.other.example.com");
    assert_eq!(lines[1][2], "edgeform test site CA");
    assert_eq!(lines[1][4], acme["not_after_rfc3339"].as_str().unwrap());
    assert_eq!(lines[1][5], edgestate::time::rfc3339_signed(renew));
    assert_eq!(lines[2][0], "shop");
    assert_eq!(lines[2][5], "-");
    assert_eq!(lines[2][7], "-");

    // Past its renewal time (25 days in), before its end: due.
    let later = edgestate::time::rfc3339_signed(nb + 25 * 86_400);
    let o = run(f.path(), &state, &["--now", &later, "certs", "list"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let row = stdout(&o).lines().nth(1).unwrap().to_owned();
    assert_eq!(row.split('\t').nth(5), Some("due"), "{row}");
    let o = run(
        f.path(),
        &state,
        &["--now", &later, "certs", "list", "--format", "json"],
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json[0]["renewal_due"], true);

    // status: the soonest is the ACME site's; at 29.5 days before its
    // end, 29 whole days are left.
    let at = edgestate::time::rfc3339_signed(na - 29 * 86_400 - 43_200);
    let status = |at: &str, format: &str| {
        run(
            f.path(),
            &state,
            &["--now", at, "status", "--from", "redis", "--format", format],
        )
    };
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&status(&at, "json"))).expect("status json");
    let soonest = &json["soonest_certificate_expiry"];
    assert_eq!(soonest["name"], "acme.other.example.com", "{json}");
    assert_eq!(soonest["host"], "other.example.com");
    assert_eq!(soonest["not_after"], na);
    assert_eq!(
        soonest["not_after_rfc3339"],
        edgestate::time::rfc3339_signed(na).as_str()
    );
    assert_eq!(soonest["days_left"], 29);
    assert_eq!(soonest["expired"], false);
    let line = |when: &str| {
        format!(
            "soonest certificate expiry: acme.other.example.com (other.example.com) not after {}, {when}\n",
            edgestate::time::rfc3339_signed(na)
        )
    };
    let text = stdout(&status(&at, "human"));
    assert!(text.contains(&line("in 29 day(s)")), "{text}");
    // Past its end (3 days and an hour): said so.
    let at = edgestate::time::rfc3339_signed(na + 3 * 86_400 + 3_600);
    let o = status(&at, "human");
    let text = stdout(&o);
    assert!(
        text.contains(&line("EXPIRED 3 day(s) ago")),
        "{text}{}",
        stderr(&o)
    );
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}
