//! Certificate renewal by the reconcile daemon's certificates job
//! (`reconcile --once certs`) against the real components: pebble issuing
//! short-lived certificates (30 s: due 20 s after issue), the real edge
//! answering its challenges from its real Redis and serving the pushed
//! certificate over HTTPS. Each test waits for its certificate to fall
//! due, so they run side by side.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::util::{Fixture, edge_1_node, edgeform_with_state as run, stderr};

/// The lifetime of pebble's certificates here: a third of it (10 s) is
/// left when one is due.
const VALIDITY_SECS: u64 = 30;
const HOST: &str = "shop.test";

/// A real Redis, the real edge on it, pebble validating on the edge, and
/// a repository with one ACME site whose certificate the certificates job
/// issued and a sync pushed.
struct Setup {
    redis: harness::Process,
    edge: harness::nginx::Edge,
    pebble: harness::pebble::Pebble,
    repo: Fixture,
    _state_root: tempfile::TempDir,
    state: PathBuf,
    /// The commit the edge runs.
    commit: String,
}

impl Setup {
    fn new() -> Setup {
        let redis = harness::redis(&[]);
        let o = harness::nginx::EdgeOptions::new(redis.port);
        harness::nginx::declare_bundle(&o);
        let edge = harness::nginx::edge(&o);
        let pebble = harness::pebble(&harness::PebbleOptions {
            http_port: edge.process.port,
            answer: Ipv4Addr::LOCALHOST,
            validity_secs: Some(VALIDITY_SECS),
        });
        let repo = Fixture::empty();
        repo.write(
            "cluster.yaml",
            crate::util::acme_cluster_yaml(&pebble, "").as_bytes(),
        );
        repo.write("nodes/edge-1.yaml", edge_1_node(redis.port).as_bytes());
        repo.write(
            &format!("sites/{HOST}.yaml"),
            format!("host: {HOST}\naliases: [www.{HOST}]\norigin: https://192.0.2.1\ntls: {{acme: true}}\n")
                .as_bytes(),
        );
        let commit = repo.commit("an ACME site");
        let state_root = tempfile::tempdir().unwrap();
        let state = state_root.path().join("state");
        let s = Setup {
            redis,
            edge,
            pebble,
            repo,
            _state_root: state_root,
            state,
            commit,
        };
        // Missing: issued at once; the edge has no commit yet, so the
        // sync pushes it.
        let o = s.certs(&[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stderr(&o).contains("renewal: issued"), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("left to the next sync"),
            "{}",
            stderr(&o)
        );
        let o = s.reconcile(&["--once", "sync"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        s
    }

    fn reconcile(&self, args: &[&str]) -> Output {
        let mut all = vec!["reconcile"];
        all.extend_from_slice(args);
        run(self.repo.path(), &self.state, &all)
    }

    fn certs(&self, extra: &[&str]) -> Output {
        let mut args = vec!["--once", "certs"];
        args.extend_from_slice(extra);
        self.reconcile(&args)
    }

    fn con(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.redis.port))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// The `tls:<HOST>` document the edge holds.
    fn doc(&self) -> serde_json::Value {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("tls:{HOST}"))
            .query(&mut self.con())
            .unwrap();
        serde_json::from_str(&v.expect("tls doc")).unwrap()
    }

    /// The newest history entry.
    fn newest_entry(&self) -> serde_json::Value {
        let v: Vec<String> = redis::cmd("LRANGE")
            .arg("edgeform:history")
            .arg(0)
            .arg(0)
            .query(&mut self.con())
            .unwrap();
        serde_json::from_str(&v[0]).unwrap()
    }

    /// Wait until the kept certificate is due (a third of its life left).
    fn wait_until_due(&self) {
        let chain =
            std::fs::read_to_string(self.state.join(format!("certs/acme.{HOST}/chain.pem")))
                .unwrap();
        let (nb, na) = validity(&chain);
        let due = control::renew::renew_at(nb, na);
        let now = unix_now();
        if due > now {
            std::thread::sleep(Duration::from_secs(u64::try_from(due - now).unwrap() + 1));
        }
    }

    /// Poll until the edge serves `fingerprint` for `name` (10 s at most).
    fn served_eventually(&self, name: &str, fingerprint: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = served(self.edge.https_port, name);
            if got == fingerprint || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn unix_now() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// `openssl x509` on the first certificate of `pem`.
fn x509(pem: &[u8], args: &[&str]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .arg("x509")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(pem).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// SHA-256 fingerprint (lowercase hex) of the first certificate in `pem`.
fn fingerprint(pem: &[u8]) -> String {
    let text = x509(pem, &["-noout", "-fingerprint", "-sha256"]);
    let hex = text.trim().rsplit('=').next().unwrap_or_default();
    hex.replace(':', "").to_ascii_lowercase()
}

/// Not-before and not-after (Unix seconds) of the first certificate.
fn validity(pem: &str) -> (i64, i64) {
    let text = x509(
        pem.as_bytes(),
        &["-noout", "-dates", "-dateopt", "iso_8601"],
    );
    let at = |key: &str| -> i64 {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} in {text}"));
        // `2026-12-02 13:00:00Z`
        let iso = line.trim().replacen(' ', "T", 1);
        i64::try_from(compiler::clock::parse_rfc3339(&iso).expect("date")).unwrap()
    };
    (at("notBefore="), at("notAfter="))
}

/// The fingerprint of the certificate the edge's HTTPS listener presents
/// for `host`.
fn served(https_port: u16, host: &str) -> String {
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-servername", host, "-connect"])
        .arg(format!("127.0.0.1:{https_port}"))
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    fingerprint(&out.stdout)
}

/// The value of the sample `name{host="HOST"}` in a textfile.
fn sample(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{host=\"{HOST}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// The shipped alert rule `EdgeformCertificateRenewalFailing` fires on the
/// series this outage exported — `edgeform_certificate_renewal_failures_total
/// {host="HOST"}` at `failures` — once the CA has stayed away for 24 h
/// (the reconciler trying at least hourly: one more failure an hour), and
/// not before (`promtool test rules`; its clock starts at 0).
fn renewal_failing_fires_on(failures: f64) {
    let rules = harness::nginx::repo_root().join("packaging/prometheus/edgeform-alerts.yml");
    let text = std::fs::read_to_string(&rules).unwrap();
    // The rule's annotations, as promtool compares them whole.
    let block = text
        .split("- alert: ")
        .find(|b| b.starts_with("EdgeformCertificateRenewalFailing"))
        .expect("the rule");
    let annotation = |key: &str| {
        let line = block
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
            .expect(key);
        line.trim_matches('"')
            .replace("{{ $labels.host }}", HOST)
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
    };
    let test = format!(
        "rule_files: [{rules:?}]\nevaluation_interval: 1m\ntests:\n  - interval: 1h\n    \
         input_series:\n      - series: 'edgeform_certificate_renewal_failures_total{{host=\"{HOST}\"}}'\n        \
         values: '{failures}+1x30'\n    alert_rule_test:\n      - eval_time: 23h\n        \
         alertname: EdgeformCertificateRenewalFailing\n      - eval_time: 25h\n        \
         alertname: EdgeformCertificateRenewalFailing\n        exp_alerts:\n          - exp_labels: \
         {{severity: warning, host: \"{HOST}\"}}\n            exp_annotations:\n              \
         summary: \"{}\"\n              description: \"{}\"\n",
        annotation("summary"),
        annotation("description")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("outage.test.yml");
    std::fs::write(&file, &test).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}\n---\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait (at most 5 s) for the edge's two workers, and return their pids.
fn workers(edge: &harness::nginx::Edge) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while edge.worker_pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    edge.worker_pids()
}

fn chain_of(state: &Path) -> Vec<u8> {
    std::fs::read(state.join(format!("certs/acme.{HOST}/chain.pem"))).unwrap()
}

/// Issued by the certificates job, pushed by a sync, served; once due,
/// the certificates job renews it and pushes it at the edge's own commit:
/// a new fingerprint served by the same worker processes (no reload), the
/// history's newest entry a `renew` at the same commit.
#[test]
fn renewal_with_short_lived_certificates_serves_a_new_fingerprint_without_reload() {
    let started = Instant::now();
    let s = Setup::new();
    let pids = workers(&s.edge);
    assert!(!pids.is_empty());
    let a = fingerprint(&chain_of(&s.state));
    assert_eq!(s.served_eventually(HOST, &a), a, "{}", s.edge.error_log());
    let issued = s.doc();

    // Not due yet: nothing ordered, exit 0.
    let o = s.certs(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("renewal: not due"), "{}", stderr(&o));

    s.wait_until_due();
    let o = s.certs(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("renewal: issued"), "{}", stderr(&o));
    let b = fingerprint(&chain_of(&s.state));
    assert_ne!(a, b);
    for name in [HOST.to_owned(), format!("www.{HOST}")] {
        assert_eq!(
            s.served_eventually(&name, &b),
            b,
            "{name}: {}",
            s.edge.error_log()
        );
    }
    assert_eq!(s.edge.worker_pids(), pids, "the edge reloaded");
    let renewed = s.doc();
    assert!(renewed["not_after"].as_i64() > issued["not_after"].as_i64());
    let e = s.newest_entry();
    assert_eq!(e["action"], "renew", "{e}");
    assert_eq!(e["commit"], s.commit.as_str(), "{e}");
    assert_eq!(e["previous_commit"], s.commit.as_str(), "{e}");
    assert!(e.get("urgent_renewal").is_none(), "{e}");
    // The renewed certificate is the state the next sync keeps.
    let o = s.reconcile(&["--once", "sync"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(s.newest_entry()["action"], "renew");
    eprintln!(
        "issued, pushed, renewed and served: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The CA is gone when the certificate falls due: `--once certs` exits 1,
/// the old certificate is still served, the failure is counted and the
/// expiry exported as the old not-after; the renewal state holds the
/// failure and a next attempt in the future, and an immediate second run
/// waits for it rather than calling the CA again.
#[test]
fn a_ca_outage_during_renewal_keeps_the_old_certificate_counts_the_failure_and_fires_the_alert() {
    let mut s = Setup::new();
    let a = fingerprint(&chain_of(&s.state));
    assert_eq!(s.served_eventually(HOST, &a), a);
    let old_not_after = s.doc()["not_after"].as_i64().unwrap();
    s.pebble.acme.kill();
    s.wait_until_due();

    let dir = tempfile::tempdir().unwrap();
    let tf = dir.path().join("edgeform.prom");
    let tf_arg = tf.to_str().unwrap();
    let o = s.certs(&["--metrics-textfile", tf_arg]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("renewal failed; the old certificate is kept"),
        "{err}"
    );
    assert!(err.contains(&format!("host={HOST}")), "{err}");
    assert!(!err.contains("PRIVATE KEY"), "{err}");
    assert_eq!(fingerprint(&chain_of(&s.state)), a);
    assert_eq!(served(s.edge.https_port, HOST), a);
    assert_eq!(s.doc()["not_after"].as_i64(), Some(old_not_after));

    let text = std::fs::read_to_string(&tf).unwrap();
    let failures = sample(&text, "edgeform_certificate_renewal_failures_total");
    assert!(failures.is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(
        sample(&text, "edgeform_certificate_expiry_timestamp_seconds"),
        Some(old_not_after as f64),
        "{text}"
    );
    renewal_failing_fires_on(failures.unwrap());
    let state_file = s.state.join("acme/renewal.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&state_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    let entry = &kept["certificates"][format!("acme.{HOST}")];
    assert_eq!(entry["failures"], 1, "{kept}");
    let next = entry["next_attempt"].as_i64().unwrap();
    let now = unix_now();
    assert!(
        next > now && next <= now + 60,
        "next attempt {next}, now {now}"
    );
    assert!(
        entry["last_problem"].as_str().unwrap().contains(HOST),
        "{kept}"
    );

    // At once again: the backoff holds, the CA is not called.
    let o = s.certs(&[]);
    let err = stderr(&o);
    assert!(err.contains("waiting until"), "{err}");
    assert!(!err.contains("renewal: ordering"), "{err}");
    assert_eq!(o.status.code(), Some(1), "still failing: {err}");
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    assert_eq!(again, kept);
}

/// A freeze window open (added by a commit the edge does not run yet):
/// a short-lived certificate, due and expiring within 72 hours, is renewed
/// through it and pushed at the edge's own commit; the history entry
/// records the window and why. (A due certificate *not* expiring within
/// 72 hours waits: `control::renew`'s unit tests.)
#[test]
fn an_urgent_renewal_goes_through_a_freeze_window_and_the_history_says_so() {
    let s = Setup::new();
    let a = fingerprint(&chain_of(&s.state));
    let now = unix_now();
    let window = format!(
        "apply:\n  freeze:\n    - name: final\n      start: \"{}\"\n      end: \"{}\"\n",
        compiler::clock::rfc3339(u64::try_from(now - 3600).unwrap()),
        compiler::clock::rfc3339(u64::try_from(now + 86_400).unwrap())
    );
    s.repo.write(
        "cluster.yaml",
        crate::util::acme_cluster_yaml(&s.pebble, &window).as_bytes(),
    );
    let frozen_commit = s.repo.commit("freeze");
    // The sync does not move the edge into the window's commit.
    let o = s.reconcile(&["--once", "sync"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("frozen"), "{}", stderr(&o));

    s.wait_until_due();
    let o = s.certs(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("renewal: issued"), "{err}");
    let b = fingerprint(&chain_of(&s.state));
    assert_ne!(a, b);
    assert_eq!(s.served_eventually(HOST, &b), b);
    let e = s.newest_entry();
    assert_eq!(e["action"], "renew", "{e}");
    assert_eq!(
        e["commit"],
        s.commit.as_str(),
        "not moved to {frozen_commit}: {e}"
    );
    assert_eq!(e["freeze"], "final", "{e}");
    assert_eq!(e["break_glass"], false, "{e}");
    let why = e["urgent_renewal"].as_str().unwrap_or_default();
    assert!(why.starts_with(&format!("{HOST} expires 20")), "{e}");
    // `history` shows it too.
    let o = run(
        s.repo.path(),
        &s.state,
        &["history", "--node", "edge-1", "--format", "json"],
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("urgent_renewal"),
        "{}",
        stderr(&o)
    );
}
