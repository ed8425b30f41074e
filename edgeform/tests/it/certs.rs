//! Certificates as managed data, end to end against a real
//! `redis-server`, with certificates made by `openssl` in the test
//! (`harness::SiteCerts`): `certs import` refuses bad input, `check`
//! refuses a certificate that does not cover the site, `apply` pushes
//! `tls:<host>` for the host and every alias in the same transaction as
//! the documents, heal repairs it, a site that stops using it gets it
//! pruned, an expired one fails `apply` — and no output, file, log or
//! `serve` answer of the whole workflow holds key material.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::{Fixture, edgeform_with_state as run, stderr, stdout};

fn node(port: u16) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

const PLAIN_SITE: &str =
    "host: shop.example.com\naliases: [www.example.com]\norigin: https://192.0.2.1\n";
const TLS_SITE: &str = "host: shop.example.com\naliases: [www.example.com]\norigin: https://192.0.2.1\ntls: {certificate: shop}\n";
const OTHER_SITE: &str = "host: other.example.com\norigin: http://192.0.2.1\n";

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

/// Every way the test key could show: its PEM armour, a base64 fragment
/// of its body, its DER in hex (lower and upper case).
struct Needles(Vec<String>);

impl Needles {
    fn of(key_file: &Path) -> Needles {
        let pem = std::fs::read_to_string(key_file).unwrap();
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = Command::new("openssl")
            .args(["pkey", "-outform", "DER", "-in"])
            .arg(key_file)
            .output()
            .unwrap();
        assert!(der.status.success());
        let hex: String = der.stdout.iter().map(|b| format!("{b:02x}")).collect();
        // The private scalar sits past the DER header: a stretch from
        // the middle is the key itself.
        let mid = hex.len() / 2;
        Needles(vec![
            "PRIVATE KEY".into(),
            body[body.len() / 2 - 12..body.len() / 2 + 12].to_owned(),
            hex[mid - 20..mid + 20].to_owned(),
            hex[mid - 20..mid + 20].to_ascii_uppercase(),
        ])
    }

    fn assert_absent(&self, what: &str, text: &str) {
        for n in &self.0 {
            assert!(
                !text.contains(n.as_str()),
                "{what} holds key material `{n}`:\n{text}"
            );
        }
    }
}

/// `edgeform serve` on a free port; killed on drop.
struct Serve(std::process::Child, u16);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(repo: &Path, state: &Path, log: &Path) -> Serve {
    let port = harness::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .current_dir(repo)
        .env("EDGEFORM_SERVE_TOKEN", "t0ken")
        .env("EDGEFORM_STATE_DIR", state)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Serve(child, port)
}

fn serve_get(port: u16, key: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /v1/nodes/edge-1/keys/{key} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer t0ken\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, raw)
}

/// Keep `o`'s output to search at the end.
fn record(shown: &mut Vec<(String, String)>, what: &str, o: &Output) {
    shown.push((format!("{what} stdout"), stdout(o)));
    shown.push((format!("{what} stderr"), stderr(o)));
}

fn all_files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(all_files(&p));
        } else {
            out.push((
                p.display().to_string(),
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned(),
            ));
        }
    }
    out
}

#[test]
fn certificates_flow_from_import_to_every_edge_and_key_material_is_never_shown() {
    let r = harness::redis(&[]);
    // The edge's installed code reads certificates (the version-skew gate).
    harness::nginx::declare_bundle(&harness::nginx::EdgeOptions::new(r.port));
    let certs = harness::SiteCerts::new();
    certs
        .sign("shop", &["shop.example.com", "www.example.com"], 90)
        .sign("wild", &["*.example.com"], 90)
        .sign("old", &["shop.example.com"], -1)
        .sign("wrong", &["elsewhere.example.net"], 90);
    let needles = Needles::of(&certs.file("shop.key"));
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", node(r.port).as_bytes());
    f.write("sites/shop.yaml", PLAIN_SITE.as_bytes());
    f.write("sites/other.yaml", OTHER_SITE.as_bytes());
    f.commit("plain");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    let mut shown: Vec<(String, String)> = Vec::new();
    let file = |c: &str| certs.file(c).display().to_string();

    // Import: the good one, and each kind of bad input refused.
    let o = run(
        f.path(),
        &state,
        &[
            "certs",
            "import",
            "shop",
            "--cert",
            &file("shop.chain.pem"),
            "--key",
            &file("shop.key"),
        ],
    );
    record(&mut shown, "import", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for (args, why) in [
        (["old", &file("old.chain.pem"), &file("old.key")], "expired"),
        (
            ["bad", &file("shop.key"), &file("shop.key")],
            "no PEM certificate",
        ),
        (
            ["bad", &file("shop.chain.pem"), &file("wrong.key")],
            "is not the leaf",
        ),
    ] {
        let o = run(
            f.path(),
            &state,
            &[
                "certs", "import", args[0], "--cert", args[1], "--key", args[2],
            ],
        );
        record(&mut shown, "refused import", &o);
        assert_eq!(o.status.code(), Some(1), "{why}: {}", stderr(&o));
        assert!(stderr(&o).contains(why), "{why}: {}", stderr(&o));
    }
    let o = run(f.path(), &state, &["certs", "list"]);
    record(&mut shown, "list", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed = stdout(&o);
    // A header line, then the certificate.
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(
        listed
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("shop\tshop.example.com,www.example.com\t"),
        "{listed}"
    );
    let o = run(f.path(), &state, &["certs", "list", "--format", "json"]);
    record(&mut shown, "list json", &o);
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let fingerprint = json[0]["fingerprint"].as_str().unwrap().to_owned();
    assert_eq!(fingerprint.len(), 64);

    // The site takes the certificate.
    f.write("sites/shop.yaml", TLS_SITE.as_bytes());
    f.commit("tls");
    let o = run(f.path(), &state, &["check"]);
    record(&mut shown, "check", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // No state directory (a pull request's CI): noted, not checked.
    let o = run(
        f.path(),
        &state_root.path().join("none"),
        &["check", "--format", "json"],
    );
    record(&mut shown, "check without state", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("certificate `shop` not checked (no state directory)"),
        "{}",
        stdout(&o)
    );
    assert!(
        !state_root.path().join("none").exists(),
        "check made no state directory"
    );
    // diff compiles two revisions: each note is said once.
    let o = run(
        f.path(),
        &state_root.path().join("none"),
        &["diff", "--base", "HEAD", "--head", "HEAD"],
    );
    record(&mut shown, "diff without state", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("note: certificates not read").count(),
        1,
        "{}",
        stderr(&o)
    );

    // Build: the fingerprint in place of the key.
    let out_dir = state_root.path().join("out");
    let o = run(
        f.path(),
        &state,
        &["build", "--out", out_dir.to_str().unwrap()],
    );
    record(&mut shown, "build", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let built: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("edge-1.json")).unwrap())
            .unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(built["tls:www.example.com"].as_str().unwrap()).unwrap();
    assert_eq!(
        doc["key"],
        format!("redacted (certificate sha256:{fingerprint})").as_str()
    );
    assert_eq!(doc["fingerprint"], fingerprint.as_str());

    // Diff, plan, apply.
    let o = run(
        f.path(),
        &state,
        &["diff", "--base", "HEAD~1", "--head", "HEAD"],
    );
    record(&mut shown, "diff", &o);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("tls:shop.example.com"),
        "{}",
        stdout(&o)
    );
    let o = run(
        f.path(),
        &state,
        &["diff", "--base", "HEAD~1", "--format", "json"],
    );
    record(&mut shown, "diff json", &o);
    let o = run(f.path(), &state, &["plan"]);
    record(&mut shown, "plan", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(f.path(), &state, &["apply", "--yes"]);
    record(&mut shown, "apply", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    for host in ["shop.example.com", "www.example.com"] {
        let v = get(&mut con, &format!("tls:{host}")).expect("pushed");
        let d: edgestate::tls::TlsDoc = serde_json::from_str(&v).unwrap();
        assert_eq!(d.fingerprint, fingerprint);
        assert!(d.key.contains("PRIVATE KEY"), "the edge gets the key");
        // The base64 needle is the key as pushed: a leak would be seen.
        assert!(
            v.contains(&needles.0[1]),
            "{} not in the pushed key",
            needles.0[1]
        );
        assert!(d.chain.matches("BEGIN CERTIFICATE").count() == 2);
        assert_eq!(edgestate::tls::TlsDoc::to_canonical_json(&d), v);
    }
    assert_eq!(get(&mut con, "tls:other.example.com"), None);
    // A changed value shows in plan by fingerprint: corrupt one, plan, heal.
    let _: () = redis::cmd("SET")
        .arg("tls:www.example.com")
        .arg("{\"chain\":\"x\",\"fingerprint\":\"00\",\"key\":\"-----BEGIN PRIVATE KEY-----\\nAAAA\",\"not_after\":1}")
        .query(&mut con)
        .unwrap();
    let o = run(f.path(), &state, &["plan", "--format", "json"]);
    record(&mut shown, "plan json", &o);
    let o = run(
        f.path(),
        &state,
        &["reconcile", "--once", "heal", "--dry-run"],
    );
    record(&mut shown, "heal dry run", &o);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A certificate written by hand for a name no site has: removed by
    // the same heal; the managed ones stay.
    let _: () = redis::cmd("SET")
        .arg("tls:other.example.com")
        .arg(get(&mut con, "tls:shop.example.com").unwrap())
        .query(&mut con)
        .unwrap();
    let o = run(f.path(), &state, &["reconcile", "--once", "heal"]);
    record(&mut shown, "heal", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("tls:www.example.com"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("key=tls:other.example.com kind=\"unmanaged\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(get(&mut con, "tls:other.example.com"), None);
    assert!(get(&mut con, "tls:shop.example.com").is_some());
    let healed: edgestate::tls::TlsDoc =
        serde_json::from_str(&get(&mut con, "tls:www.example.com").unwrap()).unwrap();
    assert_eq!(healed.fingerprint, fingerprint);
    for args in [
        &["history", "--node", "edge-1"][..],
        &["history", "--node", "edge-1", "--format", "json"],
        &["--log-format", "json", "reconcile", "--once", "sync"],
        &["status", "--from", "redis", "--format", "json"],
    ] {
        let o = run(f.path(), &state, args);
        record(&mut shown, &args.join(" "), &o);
    }

    // serve never hands out a certificate document.
    let log = state_root.path().join("serve.log");
    let s = serve(f.path(), &state, &log);
    let (code, body) = serve_get(s.1, "site:shop.example.com");
    assert_eq!(code, 200, "{body}");
    shown.push(("serve site".into(), body));
    for host in ["shop.example.com", "www.example.com", "other.example.com"] {
        let (code, body) = serve_get(s.1, &format!("tls:{host}"));
        assert_eq!(code, 404, "{body}");
        shown.push(("serve tls".into(), body));
    }
    drop(s);
    shown.push(("serve log".into(), std::fs::read_to_string(&log).unwrap()));

    // Expiry fails apply (typed, nothing pushed) and `check`, but only
    // warns on `check --rev` of an old commit.
    let later = "2099-01-01T00:00:00Z";
    let o = run(f.path(), &state, &["--now", later, "apply", "--yes"]);
    record(&mut shown, "apply expired", &o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("expired at"), "{}", stderr(&o));
    let o = run(f.path(), &state, &["--now", later, "check"]);
    record(&mut shown, "check expired", &o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("certificate-expired"), "{}", stderr(&o));
    let o = run(
        f.path(),
        &state,
        &["--now", later, "--rev", "HEAD", "check"],
    );
    record(&mut shown, "check --rev expired", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("certificate-expired"), "{}", stderr(&o));

    // A certificate that does not cover the site: check names the host.
    let o = run(
        f.path(),
        &state,
        &[
            "certs",
            "import",
            "wrong",
            "--cert",
            &file("wrong.chain.pem"),
            "--key",
            &file("wrong.key"),
        ],
    );
    record(&mut shown, "import wrong", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    f.write(
        "sites/shop.yaml",
        TLS_SITE.replace("shop}", "wrong}").as_bytes(),
    );
    let o = run(f.path(), &state, &["check"]);
    record(&mut shown, "check wrong name", &o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("certificate `wrong` does not cover `shop.example.com`"),
        "{}",
        stderr(&o)
    );

    // A site that stops using it: the keys are pruned in the next apply.
    f.write("sites/shop.yaml", PLAIN_SITE.as_bytes());
    f.commit("no tls");
    let o = run(f.path(), &state, &["apply", "--yes"]);
    record(&mut shown, "apply pruned", &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(get(&mut con, "tls:shop.example.com"), None);
    assert_eq!(get(&mut con, "tls:www.example.com"), None);
    let o = run(f.path(), &state, &["diff", "--base", "HEAD~1"]);
    record(&mut shown, "diff pruned", &o);

    for (what, text) in shown.iter().chain(all_files(&out_dir).iter()) {
        needles.assert_absent(what, text);
    }
}
