//! Redis ACL users with least privilege: a real `redis-server` whose
//! `default` user is off and whose role users are exactly the
//! `ACL SETUSER` lines of docs/operations.md ("Redis ACL users"). The
//! control host's user runs check, plan, apply, heal (once and the
//! daemon's tracked heal) and purge; the agent's user runs the purge
//! job. The documented rules are what is tested, so they stay current.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::util::{Fixture, stderr, stdout};

const CONTROL_PASSWORD: &str = "control-host-test-password";
const ADMIN_PASSWORD: &str = "admin-test-password";
/// The node's `redis` block as the control host's user (for [`node`]).
const AS_CONTROL_USER: &str =
    "{url: \"redis://edgeform@127.0.0.1:PORT\", password_env: EDGEFORM_TEST_REDIS_PASSWORD}";

/// The documented `ACL SETUSER` lines, by user name.
fn documented_users() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let section = doc
        .split("## Redis ACL users: least privilege per role")
        .nth(1)
        .expect("the ACL section of docs/operations.md");
    let section = section.split("\n## ").next().unwrap();
    section
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER "))
        .map(|l| {
            let user = l.split_whitespace().nth(2).unwrap().to_owned();
            (user, l.to_owned())
        })
        .collect()
}

/// A connection as `user` (the `default` user is off).
fn con_as(port: u16, user: &str, password: &str) -> redis::Connection {
    use redis::IntoConnectionInfo;
    let info = format!("redis://127.0.0.1:{port}")
        .into_connection_info()
        .unwrap();
    let settings = info
        .redis_settings()
        .clone()
        .set_username(user)
        .set_password(password);
    redis::Client::open(info.set_redis_settings(settings))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn admin(port: u16) -> redis::Connection {
    con_as(port, "admin", ADMIN_PASSWORD)
}

/// The server with the documented users (each with `password`), an
/// admin, and `default` off.
fn server(agent_password: &str) -> harness::Process {
    let r = harness::redis(&[]);
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let users = documented_users();
    let names: Vec<&str> = users.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(
        names,
        ["edgeform", "edge-agent", "edge-lua", "router-lua"],
        "{users:?}"
    );
    for (user, line) in &users {
        let password = match user.as_str() {
            "edge-agent" => agent_password,
            _ => CONTROL_PASSWORD,
        };
        let line = line.replace("<password>", password);
        let mut cmd = redis::cmd("ACL");
        for word in line.split_whitespace().skip(1) {
            cmd.arg(word);
        }
        cmd.exec(&mut c).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "admin",
                "on",
                &format!(">{ADMIN_PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ][..],
        )
        .exec(&mut c)
        .unwrap();
    redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"][..])
        .exec(&mut c)
        .unwrap();
    r
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("EDGEFORM_TEST_REDIS_PASSWORD", CONTROL_PASSWORD)
        .output()
        .unwrap()
}

fn both(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn node(port: u16, redis: &str) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {redis}\ncache: {{key: \"$scheme://$host$request_uri\"}}\n"
    )
    .replace("PORT", &port.to_string())
}

#[test]
fn acl_users_with_the_documented_least_privilege_run_every_role() {
    // The in-process agent reads this process's environment, which a
    // test cannot set safely: PATH's value stands in for its password.
    let agent_password = std::env::var("PATH").unwrap();
    let r = server(&agent_password);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        node(r.port, AS_CONTROL_USER).as_bytes(),
    );
    for i in 0..3 {
        f.write(
            &format!("sites/s{i}.yaml"),
            format!("host: s{i}.example.com\norigin: http://192.0.2.1\n").as_bytes(),
        );
    }
    f.commit("three sites");
    let out = run(f.path(), &["check"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a user part is no secret: {}",
        both(&out)
    );
    let out = run(f.path(), &["plan"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert!(
        stdout(&out).contains("+ site:s0.example.com"),
        "{}",
        both(&out)
    );
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let mut a = admin(r.port);
    let meta: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut a)
        .unwrap();
    assert!(meta.contains_key("commit"), "{meta:?}");
    // `username` in the block: the same user.
    f.write(
        "nodes/edge-1.yaml",
        node(
            r.port,
            "{url: \"redis://127.0.0.1:PORT\", username: edgeform, password_env: EDGEFORM_TEST_REDIS_PASSWORD}",
        )
        .as_bytes(),
    );
    f.commit("username in the block");
    let out = run(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    // Heal repairs drift (SCAN, scripts) as the control host's user.
    redis::cmd("DEL")
        .arg("site:s1.example.com")
        .exec(&mut a)
        .unwrap();
    redis::cmd("SET")
        .arg("site:stray.example.com")
        .arg("{}")
        .exec(&mut a)
        .unwrap();
    let out = run(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let exists: (bool, bool) = redis::pipe()
        .cmd("EXISTS")
        .arg("site:s1.example.com")
        .cmd("EXISTS")
        .arg("site:stray.example.com")
        .query(&mut a)
        .unwrap();
    assert_eq!(exists, (true, false), "{}", both(&out));
    // The daemon's tracked heal (CLIENT TRACKING on the prefixes).
    let log = tempfile::NamedTempFile::new().unwrap();
    // Its own state directory: the lease is not the machine's (or another
    // test's daemon's).
    let state = tempfile::tempdir().unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["reconcile", "--sync-every", "1h", "--heal-every", "1s"])
        .current_dir(f.path())
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", state.path().join("state"))
        .env("EDGEFORM_TEST_REDIS_PASSWORD", CONTROL_PASSWORD)
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    redis::cmd("DEL")
        .arg("site:s2.example.com")
        .exec(&mut a)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut back = false;
    while Instant::now() < deadline && !back {
        std::thread::sleep(Duration::from_millis(200));
        back = redis::cmd("EXISTS")
            .arg("site:s2.example.com")
            .query(&mut a)
            .unwrap();
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(back, "{text}");
    assert!(
        !text.contains("NOPERM") && !text.contains("ERROR"),
        "{text}"
    );

    // The agent's user takes a purge the control host's user queued.
    let cache = tempfile::tempdir().unwrap();
    let levels = agent::cache::Levels::parse("1:2").unwrap();
    let file = agent::cache::write_cache_file(
        cache.path(),
        &levels,
        "https://s0.example.com/v/a.mp4",
        b"body",
    )
    .unwrap();
    let _agent = crate::util::Agent::start(&format!(
        "node: edge-1\nregion: eu\n\
         redis: {{url: \"redis://127.0.0.1:{}\", username: edge-agent, password_env: PATH}}\n\
         cache: {{dirs: [\"{}\"], levels: \"1:2\"}}\n",
        r.port,
        cache.path().display()
    ));
    let out = run(
        f.path(),
        &[
            "purge",
            "--site",
            "s0.example.com",
            "--url",
            "/v/a.mp4",
            "--wait",
            "20",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert!(
        stdout(&out).contains("edge-1: 1 file(s) removed"),
        "{}",
        both(&out)
    );
    assert!(!file.exists());

    // Least privilege, as documented: what a role does not need fails.
    let as_user = |user: &str, password: &str| con_as(r.port, user, password);
    let mut control = as_user("edgeform", CONTROL_PASSWORD);
    for cmd in [
        &["FLUSHALL"][..],
        &["GET", "other:key"],
        &["CONFIG", "GET", "*"],
    ] {
        let e = redis::cmd(cmd[0])
            .arg(&cmd[1..])
            .exec(&mut control)
            .unwrap_err();
        assert_eq!(e.code(), Some("NOPERM"), "{cmd:?}: {e}");
    }
    let mut agent_con = as_user("edge-agent", &agent_password);
    for cmd in [
        &["SET", "site:s0.example.com", "{}"][..],
        &["SET", "edgeform:meta", "x"],
        &["GET", "site:s0.example.com"],
    ] {
        let e = redis::cmd(cmd[0])
            .arg(&cmd[1..])
            .exec(&mut agent_con)
            .unwrap_err();
        assert_eq!(e.code(), Some("NOPERM"), "{cmd:?}: {e}");
    }
    // What the edge's and router's Lua read (edgestate's redis_client tests run the real edge as this user).
    let mut lua = as_user("edge-lua", CONTROL_PASSWORD);
    let docs: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&["site:s0.example.com", "suspended:s0.example.com"][..])
        .query(&mut lua)
        .unwrap();
    assert!(docs[0].is_some(), "{docs:?}");
    let routing: Option<String> = redis::cmd("GET")
        .arg("edgeform:routing")
        .query(&mut lua)
        .unwrap();
    assert!(routing.is_some());
    let generation: Option<String> = redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("generation")
        .query(&mut lua)
        .unwrap();
    assert!(generation.is_some());
    let e = redis::cmd("SET")
        .arg("site:s0.example.com")
        .arg("x")
        .exec(&mut lua)
        .unwrap_err();
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
    // The geo router's user (its redis_client tests run the real router
    // as it): the table and the generation, no document, no key listing.
    let mut router = as_user("router-lua", CONTROL_PASSWORD);
    let routing: Option<String> = redis::cmd("GET")
        .arg("edgeform:routing")
        .query(&mut router)
        .unwrap();
    assert!(routing.is_some());
    let generation: Option<String> = redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("generation")
        .query(&mut router)
        .unwrap();
    assert!(generation.is_some());
    for cmd in [
        &["GET", "site:s0.example.com"][..],
        &["MGET", "tls:s0.example.com"],
        &["SCAN", "0", "MATCH", "site:*"],
        &["SET", "edgeform:routing", "{}"],
    ] {
        let e = redis::cmd(cmd[0])
            .arg(&cmd[1..])
            .exec(&mut router)
            .unwrap_err();
        assert_eq!(e.code(), Some("NOPERM"), "{cmd:?}: {e}");
    }
}

/// A site served over HTTPS under the documented users: the control
/// host's user writes its certificate (`tls:<host>`) with the documents,
/// and the edge's Lua user reads it, and may SCAN the documents for the
/// warm at start.
#[test]
fn a_certificate_is_written_and_read_by_the_documented_users() {
    let agent_password = std::env::var("PATH").unwrap();
    let r = server(&agent_password);
    let mut a = admin(r.port);
    // The edge's installed code reads certificates (the version-skew gate),
    // as its reads.json says.
    let reads: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(harness::nginx::repo_root().join("roles/edge/reads.json"))
            .unwrap(),
    )
    .unwrap();
    let fields: Vec<&str> = reads["site_fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    redis::cmd("HSET")
        .arg("edgeform:bundle")
        .arg("site_fields")
        .arg(fields.join(","))
        .arg("tls")
        .arg("1")
        .exec(&mut a)
        .unwrap();
    let certs = harness::SiteCerts::new();
    certs.sign("shop", &["shop.example.com"], 90);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        node(r.port, AS_CONTROL_USER).as_bytes(),
    );
    f.write(
        "sites/shop.yaml",
        b"host: shop.example.com\norigin: https://192.0.2.1\ntls: {certificate: shop}\n",
    );
    f.commit("a site over HTTPS");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    let with_state = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_edgeform"))
            .args(args)
            .current_dir(f.path())
            .env("NO_COLOR", "1")
            .env("EDGEFORM_STATE_DIR", &state)
            .env("EDGEFORM_TEST_REDIS_PASSWORD", CONTROL_PASSWORD)
            .output()
            .unwrap()
    };
    let cert = certs.file("shop.chain.pem").display().to_string();
    let key = certs.file("shop.key").display().to_string();
    let out = with_state(&["certs", "import", "shop", "--cert", &cert, "--key", &key]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let out = with_state(&["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let mut lua = con_as(r.port, "edge-lua", CONTROL_PASSWORD);
    let cert: Option<String> = redis::cmd("GET")
        .arg("tls:shop.example.com")
        .query(&mut lua)
        .unwrap();
    assert!(
        cert.is_some_and(|c| c.contains("BEGIN CERTIFICATE")),
        "the edge reads the certificate"
    );
    let (_, keys): (String, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg("site:*")
        .arg("COUNT")
        .arg(100)
        .query(&mut lua)
        .unwrap();
    assert_eq!(keys, ["site:shop.example.com"]);
    let (_, keys): (String, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg("tls:*")
        .arg("COUNT")
        .arg(100)
        .query(&mut lua)
        .unwrap();
    assert_eq!(keys, ["tls:shop.example.com"]);
}

/// `check` on the user forms: a user part or `username` passes, a
/// password in the URL is an inline secret, `?username=` and two
/// different users are refused, each located.
#[test]
fn redis_user_forms_in_check() {
    let check = |redis: &str| {
        let f = Fixture::empty();
        f.write("nodes/edge-1.yaml", node(6379, redis).as_bytes());
        let out = run(f.path(), &["check", "--format", "json"]);
        (out.status.code(), stdout(&out))
    };
    for ok in [
        "{url: \"redis://edgeform@127.0.0.1:PORT\", password_env: P}",
        "{url: \"redis://127.0.0.1:PORT\", username: edgeform, password_env: P}",
        "{sentinels: [\"127.0.0.1:26379\"], master: m, username: edgeform, password_env: P}",
    ] {
        let (code, out) = check(ok);
        assert_eq!(code, Some(0), "{ok}: {out}");
    }
    for (bad, code, pointer_line) in [
        (
            "{url: \"redis://edgeform:pw@127.0.0.1:PORT\"}",
            "inline-secret",
            5,
        ),
        (
            "{url: \"redis://127.0.0.1:PORT?username=edgeform\"}",
            "invalid-redis",
            5,
        ),
        (
            "{url: \"redis://a@127.0.0.1:PORT\", username: b}",
            "invalid-redis",
            5,
        ),
        (
            "{url: \"redis://127.0.0.1:PORT\", username: \"a b\"}",
            "invalid-redis",
            5,
        ),
    ] {
        let (exit, out) = check(bad);
        assert_eq!(exit, Some(1), "{bad}: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let found = v["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["code"] == code && d["line"] == pointer_line);
        assert!(found, "{bad}: {out}");
        assert!(!out.contains("\"pw\""), "the secret is not shown: {out}");
    }
}
