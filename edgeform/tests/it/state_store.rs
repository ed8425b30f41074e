//! The state store's two backends against real servers: the same
//! contract run on the state directory and on a Redis reached through a
//! Sentinel over TLS with an ACL user confined to `edgeform:state:*`;
//! `state export` from a state directory and `state import` into a Redis
//! (`--state-store`, password from the environment), refused whole with
//! another key or an altered file; `apply` reading its certificate from
//! the shared store pushes `tls:<host>` to the edge.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use control::store::{DirStore, RedisStore, Store, StoreError, StoredCert, export};
use edgestate::target::{RedisTarget, TlsFiles};

use crate::util::{Fixture, stderr, stdout};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One body, every backend: what a `Store` promises.
fn contract(s: &dyn Store) {
    assert_eq!(s.secret("edge-1", "EDGEFORM_API_TOKEN").unwrap(), None);
    assert!(s.secrets("edge-1").unwrap().is_empty());
    assert!(s.secret_names().unwrap().is_empty());
    assert_eq!(s.last_good().unwrap(), None);
    assert_eq!(s.certificate("shop").unwrap(), None);
    assert!(s.certificate_names().unwrap().is_empty());
    assert_eq!(s.acme_account().unwrap(), None);

    s.set_secret("edge-1", "EDGEFORM_API_TOKEN", "t0k'en")
        .unwrap();
    s.set_secret("edge-1", "EDGEFORM_CHALLENGE_SECRET", "s3cret")
        .unwrap();
    s.set_secret("edge-2", "EDGEFORM_API_TOKEN", "other")
        .unwrap();
    s.set_secret("edge-1", "EDGEFORM_API_TOKEN", "t0ken-2")
        .unwrap();
    assert_eq!(
        s.secret("edge-1", "EDGEFORM_API_TOKEN").unwrap().as_deref(),
        Some("t0ken-2")
    );
    assert_eq!(
        s.secrets("edge-1").unwrap(),
        BTreeMap::from([
            ("EDGEFORM_API_TOKEN".to_owned(), "t0ken-2".to_owned()),
            ("EDGEFORM_CHALLENGE_SECRET".to_owned(), "s3cret".to_owned()),
        ])
    );
    assert_eq!(
        s.secret_names().unwrap(),
        BTreeMap::from([
            (
                "edge-1".to_owned(),
                vec![
                    "EDGEFORM_API_TOKEN".to_owned(),
                    "EDGEFORM_CHALLENGE_SECRET".to_owned()
                ]
            ),
            ("edge-2".to_owned(), vec!["EDGEFORM_API_TOKEN".to_owned()]),
        ])
    );
    assert!(s.remove_secret("edge-2", "EDGEFORM_API_TOKEN").unwrap());
    assert!(!s.remove_secret("edge-2", "EDGEFORM_API_TOKEN").unwrap());
    assert!(!s.secret_names().unwrap().contains_key("edge-2"));
    assert_eq!(
        s.set_secret("../x", "A", "v"),
        Err(StoreError::NodeName("../x".into()))
    );
    assert_eq!(
        s.set_secret("edge-1", "a", "v"),
        Err(StoreError::SecretName("a".into()))
    );
    assert_eq!(
        s.set_secret("edge-1", "A", "two\nlines"),
        Err(StoreError::SecretValue)
    );

    s.set_last_good(COMMIT).unwrap();
    assert_eq!(s.last_good().unwrap().as_deref(), Some(COMMIT));
    assert_eq!(
        s.set_last_good("HEAD"),
        Err(StoreError::Commit("HEAD".into()))
    );

    let one = StoredCert {
        chain: "chain one".into(),
        key: "key one".into(),
    };
    let two = StoredCert {
        chain: "chain two".into(),
        key: "key two".into(),
    };
    s.set_certificate("shop", &one).unwrap();
    s.set_certificate("api.v2", &one).unwrap();
    assert_eq!(s.certificate("shop").unwrap(), Some(one));
    s.set_certificate("shop", &two).unwrap();
    assert_eq!(s.certificate("shop").unwrap(), Some(two.clone()));
    assert_eq!(s.certificate_names().unwrap(), ["api.v2", "shop"]);
    assert_eq!(
        s.set_certificate("../x", &two),
        Err(StoreError::CertName("../x".into()))
    );

    s.set_acme_account(r#"{"id":"https://ca/acct/1"}"#).unwrap();
    assert_eq!(
        s.acme_account().unwrap().as_deref(),
        Some(r#"{"id":"https://ca/acct/1"}"#)
    );

    // The purge outbox, through the functions that use it.
    assert!(s.outbox_nodes().unwrap().is_empty());
    for id in ["b-1", "a-2", "c-3"] {
        control::outbox::spool(
            s,
            "edge-1",
            id,
            &format!("{{\"id\":\"{id}\",\"key\":\"k\"}}"),
        )
        .unwrap();
    }
    control::outbox::spool(s, "gone-1", "d-4", r#"{"id":"d-4","key":"k"}"#).unwrap();
    let kept = control::outbox::entries(s, "edge-1").unwrap();
    assert_eq!(
        kept.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["b-1", "a-2", "c-3"]
    );
    assert_eq!(s.outbox_nodes().unwrap(), ["edge-1", "gone-1"]);
    assert_eq!(control::outbox::depths(s).unwrap()["edge-1"].waiting, 3);
    assert!(control::outbox::has_waiting(s, "edge-1").unwrap());
    let dropped = control::outbox::drop_removed(s, &["edge-1"]);
    assert_eq!(dropped, BTreeMap::from([("gone-1".to_owned(), 1)]));
    s.remove_outbox("edge-1", &kept[0].file).unwrap();
    s.remove_outbox("edge-1", &kept[0].file).unwrap();
    assert_eq!(control::outbox::entries(s, "edge-1").unwrap().len(), 2);
    assert!(control::outbox::spool(s, "../x", "a", "{}").is_err());
    assert!(control::outbox::spool(s, "edge-1", "../a", "{}").is_err());
    assert!(s.set_outbox("edge-1", "../a", "{}").is_err());
}

fn plain(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Every key of the server on `port`.
fn keys(port: u16) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut plain(port)).unwrap();
    k.sort();
    k
}

#[test]
fn the_store_contract_holds_for_the_state_directory_and_redis_behind_sentinel_over_tls() {
    let d = tempfile::tempdir().unwrap();
    let dir = DirStore::open(&d.path().join("state")).unwrap();
    contract(&dir);

    let certs = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    // An ACL user that can touch nothing but the store's keys.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("store")
        .arg("on")
        .arg("nopass")
        .arg("~edgeform:state:*")
        .arg("+@all")
        .query(&mut plain(r.port))
        .unwrap();
    let (_sentinel, sentinel_tls) = harness::sentinel_tls("state", tls, &certs);
    let store = RedisStore::new(RedisTarget::Sentinel {
        sentinels: vec![format!("127.0.0.1:{sentinel_tls}")],
        master: "state".into(),
        username: Some("store".into()),
        password_env: None,
        tls: Some(TlsFiles {
            ca_file: Some(certs.file("ca.pem")),
            ..TlsFiles::default()
        }),
    })
    .unwrap();
    contract(&store);

    // The same entries, whichever backend (the outbox's names carry the
    // time each job was kept: compared by job).
    let without_outbox = |s: &dyn Store| {
        let mut snap = export::snapshot(s).unwrap();
        let jobs: Vec<Vec<String>> = snap
            .outbox
            .values()
            .map(|e| {
                e.keys()
                    .map(|n| n.split_once('-').unwrap().1.to_owned())
                    .collect()
            })
            .collect();
        snap.outbox.clear();
        (snap, jobs)
    };
    assert_eq!(without_outbox(&store), without_outbox(&dir));
    // Names in keys, values only in values, every key under the prefix.
    let k = keys(r.port);
    assert_eq!(
        k,
        [
            "edgeform:state:acme:account",
            "edgeform:state:cert:api.v2",
            "edgeform:state:cert:shop",
            "edgeform:state:last-good-commit",
            "edgeform:state:outbox:edge-1",
            "edgeform:state:secrets:edge-1",
        ]
    );
}

fn node(port: u16) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

const TLS_SITE: &str =
    "host: shop.example.com\norigin: https://192.0.2.1\ntls: {certificate: shop}\n";

/// `edgeform` in `repo` with the state directory `state`, `env` added.
/// Two control hosts (state directories `a` and `b`) sharing the Redis
/// store on `port` (`EDGEFORM_STATE_STORE`).
struct TwoHosts {
    _tmp: tempfile::TempDir,
    a: std::path::PathBuf,
    b: std::path::PathBuf,
    url: String,
}

impl TwoHosts {
    fn new(port: u16) -> TwoHosts {
        let tmp = tempfile::tempdir().unwrap();
        TwoHosts {
            a: tmp.path().join("host-a"),
            b: tmp.path().join("host-b"),
            _tmp: tmp,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }

    /// `edgeform ARGS` on the host whose state directory is `state`.
    fn run(&self, repo: &Path, state: &Path, args: &[&str]) -> Output {
        run(
            repo,
            state,
            &[("EDGEFORM_STATE_STORE", self.url.as_str())],
            args,
        )
    }
}

fn run(repo: &Path, state: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeform"));
    c.args(args)
        .current_dir(repo)
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", state)
        .env_remove("EDGEFORM_STATE_STORE")
        .env_remove("EDGEFORM_STATE_KEY");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn a_state_directory_exported_imports_into_redis_whole_or_not_at_all_and_apply_reads_it() {
    let edge = harness::redis(&[]);
    harness::nginx::declare_bundle(&harness::nginx::EdgeOptions::new(edge.port));
    let shared = harness::redis(&[]);
    // The ACL user docs/operations.md suggests: the prefix, nothing more.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("store")
        .arg("on")
        .arg(">store-pass")
        .arg("~edgeform:state:*")
        .arg("+@read")
        .arg("+@write")
        .arg("+@scripting")
        .arg("+scan")
        .arg("+multi")
        .arg("+exec")
        .arg("+role")
        .arg("+ping")
        .query(&mut plain(shared.port))
        .unwrap();
    let site = harness::SiteCerts::new();
    site.sign("shop", &["shop.example.com"], 90);
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", node(edge.port).as_bytes());
    f.write("sites/shop.yaml", TLS_SITE.as_bytes());
    f.commit("tls");
    let tmp = tempfile::tempdir().unwrap();
    let old = tmp.path().join("old-state");
    let new = tmp.path().join("new-state");
    let file = |c: &str| site.file(c).display().to_string();
    let o = run(
        f.path(),
        &old,
        &[],
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
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The store's file: a node's `redis:` block.
    let conf = tmp.path().join("store.yaml");
    std::fs::write(
        &conf,
        format!(
            "redis:\n  url: redis://store@127.0.0.1:{}\n  password_env: TEST_STORE_PASSWORD\n",
            shared.port
        ),
    )
    .unwrap();
    let conf = conf.display().to_string();
    let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
    let other = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
    let with_key = |k: &'static str| {
        [
            ("EDGEFORM_STATE_KEY", k),
            ("TEST_STORE_PASSWORD", "store-pass"),
        ]
    };

    // Export: no key is an error naming the variable; then the file.
    let out = tmp.path().join("state.export");
    let out_s = out.display().to_string();
    let o = run(f.path(), &old, &[], &["state", "export", &out_s]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("EDGEFORM_STATE_KEY is not set"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
    let o = run(f.path(), &old, &with_key(key), &["state", "export", &out_s]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 certificate(s)"), "{}", stderr(&o));
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let sealed = std::fs::read_to_string(&out).unwrap();
    let pem = std::fs::read_to_string(site.file("shop.key")).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    for needle in [
        "PRIVATE KEY",
        &body[body.len() / 2 - 12..body.len() / 2 + 12],
        "shop",
    ] {
        assert!(!sealed.contains(needle), "the export shows `{needle}`");
    }

    // Another key, an altered file: refused, nothing written.
    let store_flag = ["--state-store", conf.as_str()];
    let import = |env: &[(&str, &str)], path: &str| {
        let mut args = vec!["state", "import", path];
        args.extend(store_flag);
        run(f.path(), &new, env, &args)
    };
    let o = import(&with_key(other), &out_s);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("another key"), "{}", stderr(&o));
    let mut env: serde_json::Value = serde_json::from_str(&sealed).unwrap();
    let s = env["sealed"].as_str().unwrap().to_owned();
    let flipped = if s.starts_with('A') { "B" } else { "A" };
    env["sealed"] = format!("{flipped}{}", &s[1..]).into();
    let altered = tmp.path().join("altered.export");
    std::fs::write(&altered, env.to_string()).unwrap();
    let o = import(&with_key(key), &altered.display().to_string());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("altered"), "{}", stderr(&o));
    assert!(keys(shared.port).is_empty(), "nothing imported");

    // The right key: every entry in Redis, under the prefix.
    let o = import(&with_key(key), &out_s);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(keys(shared.port), ["edgeform:state:cert:shop"]);

    // `apply` on a host whose state directory holds nothing reads the
    // certificate from the shared store and pushes it.
    let mut args = vec!["apply", "--yes"];
    args.extend(store_flag);
    let o = run(f.path(), &new, &with_key(key), &args);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let doc: Option<String> = redis::cmd("GET")
        .arg("tls:shop.example.com")
        .query(&mut plain(edge.port))
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&doc.expect("tls:shop.example.com")).unwrap();
    assert_eq!(doc["key"].as_str().map(str::trim), Some(pem.trim()));
    let mut args = vec!["certs", "list"];
    args.extend(store_flag);
    let o = run(f.path(), &new, &with_key(key), &args);
    assert!(
        stdout(&o).contains("shop\tshop.example.com"),
        "{}",
        stdout(&o)
    );

    // A wrong password, a bad file: clear errors naming where.
    let o = run(f.path(), &new, &[], &args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("TEST_STORE_PASSWORD"), "{}", stderr(&o));
    std::fs::write(tmp.path().join("bad.yaml"), "redis:\n  url: http://x\n").unwrap();
    let bad = tmp.path().join("bad.yaml").display().to_string();
    let o = run(
        f.path(),
        &new,
        &[],
        &["certs", "list", "--state-store", &bad],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("bad.yaml:2:"), "{}", stderr(&o));
}

#[test]
fn the_redis_store_follows_a_sentinel_failover_to_the_new_master() {
    use std::time::{Duration, Instant};
    let mut master = harness::redis(&[]);
    let replica = harness::redis(&[&format!("replicaof 127.0.0.1 {}", master.port)]);
    let sentinel = harness::sentinel("state", master.port);
    let store = RedisStore::new(RedisTarget::Sentinel {
        sentinels: vec![format!("127.0.0.1:{}", sentinel.port)],
        master: "state".into(),
        username: None,
        password_env: None,
        tls: None,
    })
    .unwrap();
    let cert = StoredCert {
        chain: "chain".into(),
        key: "key".into(),
    };
    store.set_certificate("shop", &cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !keys(replica.port).contains(&"edgeform:state:cert:shop".to_owned()) {
        assert!(Instant::now() < deadline, "replication did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
    master.kill();
    // Calls fail while no master is known, then land on the new one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.set_last_good(COMMIT) {
            Ok(()) => break,
            Err(e) => {
                assert!(matches!(e, StoreError::Shared { .. }), "{e}");
                assert!(
                    Instant::now() < deadline,
                    "no failover: {e}\n{}",
                    sentinel.log()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(store.certificate("shop").unwrap(), Some(cert));
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut plain(replica.port)).unwrap();
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    assert!(keys(replica.port).contains(&"edgeform:state:last-good-commit".to_owned()));
}

/// Two control hosts (two state directories) on one shared store: what
/// one issues from the real CA (pebble, through the real edge) the other
/// applies, and the other's order uses the same ACME account; neither
/// state directory holds a certificate or the account.
#[test]
fn two_control_hosts_share_issued_certificates_and_the_acme_account() {
    let r = harness::redis(&[]);
    let (_edge, pebble) = harness::pebble::behind_edge(r.port);
    let shared = harness::redis(&[]);
    let f = crate::util::acme_site_repo(&pebble, r.port);
    let hosts = TwoHosts::new(shared.port);
    let (a, b) = (hosts.a.clone(), hosts.b.clone());
    let on = |state: &Path, args: &[&str]| hosts.run(f.path(), state, args);

    let o = on(&a, &["certs", "issue"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let account = |port| -> Option<String> {
        redis::cmd("GET")
            .arg("edgeform:state:acme:account")
            .query(&mut plain(port))
            .unwrap()
    };
    let first = account(shared.port).expect("the account is in the shared store");
    let o = on(&b, &["apply", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let doc: Option<String> = redis::cmd("GET")
        .arg("tls:shop.test")
        .query(&mut plain(r.port))
        .unwrap();
    assert!(doc.unwrap_or_default().contains("BEGIN CERTIFICATE"));
    let o = on(&b, &["certs", "issue"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(account(shared.port), Some(first), "host B used A's account");
    for state in [&a, &b] {
        assert!(!state.join("certs").exists() && !state.join("acme/account.json").exists());
    }
}

/// A purge job host A could not queue (the node's Redis down) is kept in
/// the shared store; host B's `purge --flush` delivers it once the Redis
/// is back, and the outbox empties when the node records it.
#[test]
fn a_purge_kept_by_one_control_host_is_delivered_by_the_other() {
    let mut edge = harness::redis(&[]);
    let shared = harness::redis(&[]);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{}\"}}\ncache: {{key: \"$scheme://$host$request_uri\"}}\n",
            edge.port
        )
        .as_bytes(),
    );
    f.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.1\n",
    );
    f.commit("one site");
    let hosts = TwoHosts::new(shared.port);
    let (a, b) = (hosts.a.clone(), hosts.b.clone());
    let on = |state: &Path, args: &[&str]| hosts.run(f.path(), state, args);
    edge.stop();
    let o = on(
        &a,
        &["purge", "--site", "a.example.com", "--url", "/v/1.mp4"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("SPOOLED") && stderr(&o).contains("edgeform:state:outbox:edge-1"),
        "{}",
        stderr(&o)
    );
    let id = stdout(&o).trim().to_owned();
    assert_eq!(keys(shared.port), ["edgeform:state:outbox:edge-1"]);
    assert!(!a.join("outbox").exists(), "nothing kept on host A itself");

    edge.restart();
    let o = on(&b, &["purge", "--flush"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("edge-1: 1 queued, 0 queued again, 0 done, 1 tracked"),
        "{}",
        stdout(&o)
    );
    let queued: Vec<String> = redis::cmd("LRANGE")
        .arg("cdn:purge:eu:edge-1")
        .arg(0)
        .arg(-1)
        .query(&mut plain(edge.port))
        .unwrap();
    assert_eq!(queued.len(), 1);
    assert!(queued[0].contains(&id), "{queued:?}");
    // The node records it (as its agent does): the next flush, from
    // either host, takes it out of the shared outbox.
    let _: () = redis::cmd("HSET")
        .arg(edgestate::purge::done_key(&id))
        .arg("edge-1")
        .arg("1")
        .query(&mut plain(edge.port))
        .unwrap();
    let o = on(&a, &["purge", "--flush"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(keys(shared.port).is_empty(), "{:?}", keys(shared.port));
}

/// An import into the shared store is whole or nothing: a key under the
/// prefix of another type than the import writes (a hand-made string
/// where the purge outbox is a hash) refuses it before anything is
/// written — the secrets and the certificate before it in the file too.
#[test]
fn an_import_the_shared_store_refuses_part_way_writes_nothing() {
    let r = harness::redis(&[]);
    let store = crate::util::plain_store(r.port);
    let mut snap = export::Snapshot::default();
    snap.secrets.insert(
        "edge-1".into(),
        BTreeMap::from([("EDGEFORM_API_TOKEN".into(), "t0ken".into())]),
    );
    let certs = harness::SiteCerts::new();
    certs.sign("shop", &["shop.example.com"], 90);
    snap.certificates.insert(
        "shop".into(),
        export::Pem {
            chain: std::fs::read_to_string(certs.file("shop.chain.pem")).unwrap(),
            key: std::fs::read_to_string(certs.file("shop.key")).unwrap(),
        },
    );
    snap.last_good = Some(COMMIT.into());
    snap.outbox.insert(
        "edge-1".into(),
        BTreeMap::from([(
            "1-job".into(),
            r#"{"id":"j1","job":"{\"id\":\"j1\",\"key\":\"k\"}","spooled_at":1}"#.into(),
        )]),
    );
    snap.check().expect("a snapshot import takes");
    redis::cmd("SET")
        .arg("edgeform:state:outbox:edge-1")
        .arg("garbage")
        .exec(&mut plain(r.port))
        .unwrap();
    let err = export::restore(&store, &snap).expect_err("a key of another type");
    assert!(err.to_string().contains("nothing imported"), "{err}");
    assert_eq!(keys(r.port), ["edgeform:state:outbox:edge-1"]);

    redis::cmd("DEL")
        .arg("edgeform:state:outbox:edge-1")
        .exec(&mut plain(r.port))
        .unwrap();
    export::restore(&store, &snap).unwrap();
    assert_eq!(export::snapshot(&store).unwrap(), snap);
}

/// Bytes the server on `port` has sent its clients so far.
fn sent_bytes(port: u16) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut plain(port))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Values planted in the shared store past its caps (20 MB each) are
/// refused, or left out, without crossing the wire whole; a secret
/// holding a line break is refused in both stores, never used.
#[test]
fn planted_oversized_values_and_secrets_with_line_breaks_are_refused_unread() {
    let r = harness::redis(&[]);
    let store = crate::util::plain_store(r.port);
    let mut con = plain(r.port);
    let huge = "x".repeat(20 << 20);
    let set = |con: &mut redis::Connection, key: &str, value: &str| {
        let _: () = redis::cmd("SET").arg(key).arg(value).query(con).unwrap();
    };
    let hset = |con: &mut redis::Connection, key: &str, field: &str, value: &str| {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg(field)
            .arg(value)
            .query(con)
            .unwrap();
    };
    set(&mut con, "edgeform:state:acme:account", &huge);
    set(&mut con, "edgeform:state:acme:renewal", &huge);
    set(&mut con, "edgeform:state:last-good-commit", &huge);
    hset(&mut con, "edgeform:state:cert:shop", "chain", &huge);
    hset(&mut con, "edgeform:state:cert:shop", "key", "k");
    hset(&mut con, "edgeform:state:secrets:edge-1", "BIG", &huge);
    control::outbox::spool(&store, "edge-1", "a-1", r#"{"id":"a-1","key":"k"}"#).unwrap();
    hset(&mut con, "edgeform:state:outbox:edge-1", "1-big", &huge);
    // A value cut at the cap inside a character is still "too large".
    let cut = format!("{}é", "a".repeat(control::store::MAX_SECRET_BYTES));
    set(&mut con, "edgeform:state:acme:account", &cut);

    let before = sent_bytes(r.port);
    assert!(matches!(
        store.acme_account(),
        Err(StoreError::TooLarge { .. })
    ));
    assert!(matches!(
        store.renewal_state(),
        Err(StoreError::RenewalTooLarge(_))
    ));
    assert!(store.last_good().is_err());
    assert!(matches!(
        store.certificate("shop"),
        Err(StoreError::CertTooLarge(_))
    ));
    assert!(matches!(
        store.secrets("edge-1"),
        Err(StoreError::TooLarge { .. })
    ));
    // The oversized entry is no job: left out; the real one is kept.
    let kept = control::outbox::entries(&store, "edge-1").unwrap();
    assert_eq!(
        kept.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["a-1"]
    );
    // At most each cap and a byte crossed (the renewal state's is 4 MiB).
    let sent = sent_bytes(r.port) - before;
    assert!(
        sent < control::store::MAX_RENEWAL_STATE_BYTES as u64 + (1 << 20),
        "{sent} bytes sent for 6 reads of 20 MB values"
    );

    // A line break planted in a secret: refused, naming it, in both stores.
    let _: () = redis::cmd("DEL")
        .arg("edgeform:state:secrets:edge-1")
        .query(&mut con)
        .unwrap();
    hset(
        &mut con,
        "edgeform:state:secrets:edge-1",
        "REDIS_PASSWORD",
        "pw\nrequirepass x",
    );
    for got in [
        store.secret("edge-1", "REDIS_PASSWORD"),
        store.secrets("edge-1").map(|_| None),
    ] {
        match got {
            Err(e @ StoreError::StoredSecret { .. }) => {
                assert!(e.to_string().contains("REDIS_PASSWORD"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
    let d = tempfile::tempdir().unwrap();
    let dir = DirStore::open(&d.path().join("state")).unwrap();
    dir.set_secret("edge-1", "REDIS_PASSWORD", "pw").unwrap();
    let file = d.path().join("state/secrets/edge-1/REDIS_PASSWORD");
    std::fs::write(&file, "pw\nrequirepass x").unwrap();
    assert!(matches!(
        dir.secret("edge-1", "REDIS_PASSWORD"),
        Err(StoreError::StoredSecret { .. })
    ));
    assert!(matches!(
        dir.secrets("edge-1"),
        Err(StoreError::StoredSecret { .. })
    ));
    // Still listed by name, in both stores, so it can be removed.
    for s in [&dir as &dyn Store, &store] {
        assert_eq!(
            s.secret_names().unwrap()["edge-1"],
            ["REDIS_PASSWORD".to_owned()]
        );
    }
}
