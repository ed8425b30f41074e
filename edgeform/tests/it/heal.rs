//! The server-side heal against a real `redis-server`: each kind of
//! drift is found by the comparison inside Redis (or, for a tampered
//! manifest, sends heal to the full comparison) and repaired; a healthy
//! target costs a few hundred bytes. Also the migration of format-1 and
//! format-2 targets by the first apply (or heal).

use std::collections::BTreeMap;

use crate::util::{Fixture, edgeform, stderr, stdout};

fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn run(port: u16, args: &[&str]) {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.exec(&mut con(port)).unwrap();
}

fn get(port: u16, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(&mut con(port)).unwrap()
}

/// The manifest bucket of a managed key: `edgeform:manifest:<bb>`.
fn bucket_of(key: &str) -> String {
    edgestate::keys::manifest_bucket(edgestate::keys::bucket(key.as_bytes()))
}

/// A manifest bucket's string (format 3), as bytes.
fn raw(port: u16, key: &str) -> Vec<u8> {
    let v: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(&mut con(port)).unwrap();
    v.unwrap_or_default()
}

fn set_raw(port: u16, key: &str, value: &[u8]) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .exec(&mut con(port))
        .unwrap();
}

/// A manifest bucket's records (format 3): `(key, hash)` in stored order.
type Records = Vec<(String, String)>;

/// A manifest bucket's [`Records`], read.
fn records(port: u16, bucket: &str) -> Records {
    let bytes = raw(port, bucket);
    edgestate::manifest::parse(&bytes)
        .unwrap()
        .into_iter()
        .map(|(k, h)| {
            (
                String::from_utf8(k.to_vec()).unwrap(),
                String::from_utf8(h.to_vec()).unwrap(),
            )
        })
        .collect()
}

/// Write a manifest bucket's string from `records`.
fn write_records(port: u16, bucket: &str, records: &[(String, String)]) {
    let mut out = Vec::new();
    for (k, h) in records {
        edgestate::manifest::push_record(&mut out, k.as_bytes(), h.as_bytes());
    }
    set_raw(port, bucket, &out);
}

/// The 256 manifest bucket keys present (not `edgeform:manifest:buckets`).
fn bucket_keys(port: u16) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS")
        .arg("edgeform:manifest:[0-9a-f][0-9a-f]")
        .query(&mut con(port))
        .unwrap();
    k.sort();
    k
}

/// One edge at `port` and `sites` sites (`s00000.example.com`, …), not
/// committed.
fn repo(port: u16, sites: usize) -> Fixture {
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
        )
        .as_bytes(),
    );
    for i in 0..sites {
        f.write(
            &format!("sites/s{i:05}.yaml"),
            format!("host: s{i:05}.example.com\norigin: http://192.0.2.1\n").as_bytes(),
        );
    }
    f
}

/// Commit the sites and apply them.
fn commit_and_apply(f: &Fixture) {
    f.commit("sites");
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

/// A repo of 300 sites on one edge at `port`, applied.
fn applied(port: u16) -> Fixture {
    let f = repo(port, 300);
    commit_and_apply(&f);
    f
}

/// Run one heal; its log.
fn heal(f: &Fixture) -> String {
    let out = edgeform(f.path(), &["reconcile", "--once", "heal"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stderr(&out)
}

/// The `bytes=` a heal logged.
fn bytes(log: &str) -> usize {
    field(log, "bytes")
}

/// After a repair the target is healthy again, and that costs O(1).
fn healthy(f: &Fixture) {
    let log = heal(f);
    assert!(log.contains("heal: no drift"), "{log}");
    // The meta, then one call per chain over a range of buckets (8) and
    // the document count: ~150 bytes each, whatever the target holds.
    assert!(bytes(&log) < 1500, "{log}");
    assert_eq!(
        edgeform(f.path(), &["plan", "--detailed-exitcode"])
            .status
            .code(),
        Some(0)
    );
}

// Server-side heal: a changed value.
#[test]
fn a_changed_value_is_found_in_redis() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    let log = heal(&f);
    assert!(log.contains("heal: no drift"), "{log}");
    // 301 values compared without reading them: a reply per chain of
    // calls (~150 bytes each, see `healthy`), not the values.
    assert!(bytes(&log) < 1500, "{log}");
    run(r.port, &["SET", "site:s00007.example.com", "{\"evil\":1}"]);
    // A value of another type is a change too.
    run(r.port, &["DEL", "site:s00008.example.com"]);
    run(r.port, &["HSET", "site:s00008.example.com", "a", "b"]);
    let log = heal(&f);
    for key in ["site:s00007.example.com", "site:s00008.example.com"] {
        assert!(
            log.contains(&format!("key={key} kind=\"changed\"")),
            "{log}"
        );
    }
    assert!(!log.contains("kind=\"manifest\""), "{log}");
    assert!(
        get(r.port, "site:s00007.example.com")
            .unwrap()
            .contains("192.0.2.1")
    );
    assert!(
        get(r.port, "site:s00008.example.com")
            .unwrap()
            .contains("192.0.2.1")
    );
    healthy(&f);
}

// Server-side heal: a missing key.
#[test]
fn a_missing_key_is_found_in_redis() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    run(
        r.port,
        &["DEL", "site:s00100.example.com", "edgeform:routing"],
    );
    let log = heal(&f);
    for key in ["site:s00100.example.com", "edgeform:routing"] {
        assert!(
            log.contains(&format!("key={key} kind=\"missing\"")),
            "{log}"
        );
    }
    assert!(!log.contains("kind=\"manifest\""), "{log}");
    assert!(get(r.port, "site:s00100.example.com").is_some());
    healthy(&f);
}

// Server-side heal: unmanaged keys, counted in Redis.
#[test]
fn an_unmanaged_key_is_found_in_redis() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    run(r.port, &["SET", "site:rogue.example.com", "{}"]);
    run(r.port, &["SET", "suspended:s00003.example.com", "1"]);
    // A certificate nobody pushed: the edge would present it for the name.
    run(r.port, &["SET", "tls:s00005.example.com", "{}"]);
    run(r.port, &["SET", "tls:*.example.com", "{}"]);
    // With a missing key at the same time, the count still tells.
    run(r.port, &["DEL", "site:s00004.example.com"]);
    run(r.port, &["SET", "cdn:purge:eu:edge-1", "not a document"]);
    run(r.port, &["SET", "acme:tok", "a challenge answer"]);
    let log = heal(&f);
    for (key, kind) in [
        ("site:rogue.example.com", "unmanaged"),
        ("suspended:s00003.example.com", "unmanaged"),
        ("tls:s00005.example.com", "unmanaged"),
        ("tls:*.example.com", "unmanaged"),
        ("site:s00004.example.com", "missing"),
    ] {
        assert!(log.contains(&format!("key={key} kind=\"{kind}\"")), "{log}");
    }
    assert!(!log.contains("kind=\"manifest\""), "{log}");
    for key in [
        "site:rogue.example.com",
        "suspended:s00003.example.com",
        "tls:s00005.example.com",
        "tls:*.example.com",
    ] {
        assert_eq!(get(r.port, key), None, "{key}");
    }
    assert!(get(r.port, "cdn:purge:eu:edge-1").is_some());
    assert!(get(r.port, "acme:tok").is_some());
    healthy(&f);
}

// Server-side heal: a tampered manifest, its digests, its meta.
#[test]
fn a_tampered_manifest_is_found_in_redis() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    let key = "site:s00001.example.com";
    let bucket = bucket_of(key);
    let tamper: [(&str, &dyn Fn()); 8] = [
        (
            "an entry's hash changed (value and meta untouched)",
            &|| {
                let mut r0 = records(r.port, &bucket);
                r0.iter_mut().find(|(k, _)| k == key).unwrap().1 = "0".repeat(40);
                write_records(r.port, &bucket, &r0);
            },
        ),
        ("an entry removed", &|| {
            let mut r0 = records(r.port, &bucket);
            r0.retain(|(k, _)| k != key);
            write_records(r.port, &bucket, &r0);
        }),
        ("the string cut short", &|| {
            let b = raw(r.port, &bucket);
            set_raw(r.port, &bucket, &b[..b.len() - 7]);
        }),
        ("garbage appended", &|| {
            let mut b = raw(r.port, &bucket);
            b.extend_from_slice(b"\xff\x00garbage");
            set_raw(r.port, &bucket, &b);
        }),
        ("the bucket a hash of its entries", &|| {
            let r0 = records(r.port, &bucket);
            run(r.port, &["DEL", &bucket]);
            for (k, h) in r0 {
                run(r.port, &["HSET", &bucket, &k, &h]);
            }
        }),
        ("a bucket's stored digest changed", &|| {
            run(r.port, &["HSET", "edgeform:manifest:buckets", "00", "0 0"]);
        }),
        ("the digests not a hash", &|| {
            run(r.port, &["DEL", "edgeform:manifest:buckets"]);
            run(r.port, &["SET", "edgeform:manifest:buckets", "x"]);
        }),
        ("the meta's digest changed", &|| {
            run(r.port, &["HSET", "edgeform:meta", "manifest_digest", "00"]);
        }),
    ];
    for (what, t) in tamper {
        t();
        let log = heal(&f);
        assert!(
            log.contains("key=edgeform:manifest kind=\"manifest\""),
            "{what}: {log}"
        );
        healthy(&f);
    }
    // Compared from here (the manifest cannot be trusted), a key of
    // another type is "changed", as the comparison inside Redis calls it;
    // a deleted one is "missing".
    run(r.port, &["HSET", "edgeform:meta", "manifest_digest", "00"]);
    run(
        r.port,
        &["DEL", "site:s00002.example.com", "site:s00003.example.com"],
    );
    run(r.port, &["HSET", "site:s00002.example.com", "a", "b"]);
    let log = heal(&f);
    assert!(log.contains("kind=\"manifest\""), "{log}");
    assert!(
        log.contains("key=site:s00002.example.com kind=\"changed\""),
        "{log}"
    );
    assert!(
        log.contains("key=site:s00003.example.com kind=\"missing\""),
        "{log}"
    );
    healthy(&f);
}

// A format-1 target is read the old way and rewritten.
#[test]
fn a_format_1_target_is_migrated_by_the_first_apply() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    // Turn the target into what format 1 wrote: one manifest hash of
    // SHA-256 content hashes, no digests.
    let mut c = con(r.port);
    let mut keys = bucket_keys(r.port);
    let mut old = BTreeMap::new();
    for k in &keys {
        for (key, _) in records(r.port, k) {
            let value = get(r.port, &key).unwrap();
            old.insert(key, control::state::legacy_hash(&value));
        }
    }
    assert_eq!(old.len(), 301);
    keys.push("edgeform:manifest:buckets".into());
    redis::cmd("DEL").arg(&keys).exec(&mut c).unwrap();
    redis::cmd("HSET")
        .arg("edgeform:manifest")
        .arg(&old)
        .exec(&mut c)
        .unwrap();
    run(
        r.port,
        &["HDEL", "edgeform:meta", "manifest_digest", "managed"],
    );
    run(r.port, &["HSET", "edgeform:meta", "format", "1"]);
    // One site changes: exactly one change (not 301: the old hashes are
    // understood), and the target comes out in format 3.
    f.write(
        "sites/s00009.yaml",
        b"host: s00009.example.com\norigin: http://192.0.2.9\n",
    );
    f.commit("one site changes");
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert!(stdout(&out).contains("(+0 ~1 -0)"), "{}", stdout(&out));
    let meta: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut c)
        .unwrap();
    assert_eq!(meta["format"], "3");
    assert_eq!(meta["managed"], "301");
    let exists: bool = redis::cmd("EXISTS")
        .arg("edgeform:manifest")
        .query(&mut c)
        .unwrap();
    assert!(!exists);
    assert_strings(r.port, 301);
    healthy(&f);
}

/// Every manifest bucket present is a string of whole records, `n` in
/// all, each in its key's bucket and sorted by key.
fn assert_strings(port: u16, n: usize) {
    let mut total = 0;
    for k in bucket_keys(port) {
        let kind: String = redis::cmd("TYPE").arg(&k).query(&mut con(port)).unwrap();
        assert_eq!(kind, "string", "{k}");
        let r0 = records(port, &k);
        assert!(!r0.is_empty(), "{k}: an empty bucket is deleted");
        assert!(r0.windows(2).all(|w| w[0].0 < w[1].0), "{k}: sorted");
        assert!(r0.iter().all(|(key, _)| bucket_of(key) == k), "{k}");
        total += r0.len();
    }
    assert_eq!(total, n);
}

/// Turn an applied target into what format 2 wrote: each bucket a hash
/// of its entries, the meta saying format 2.
fn to_format_2(port: u16) {
    for k in bucket_keys(port) {
        let r0 = records(port, &k);
        run(port, &["DEL", &k]);
        let mut c = redis::cmd("HSET");
        c.arg(&k);
        for (key, h) in &r0 {
            c.arg(key).arg(h);
        }
        c.exec(&mut con(port)).unwrap();
    }
    run(port, &["HSET", "edgeform:meta", "format", "2"]);
}

// A format-2 target (bucket hashes) is read as it is, and the next apply
// rewrites its manifest whole as strings, in the same transaction.
#[test]
fn a_format_2_target_is_migrated_by_the_first_apply() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    to_format_2(r.port);
    // One site changes: the plan reads the differing bucket (a hash) and
    // finds exactly that change.
    f.write(
        "sites/s00009.yaml",
        b"host: s00009.example.com\norigin: http://192.0.2.9\n",
    );
    f.commit("one site changes");
    let out = edgeform(f.path(), &["plan"]);
    assert!(
        stdout(&out).contains("0 to add, 1 to change, 0 to remove"),
        "{}",
        stdout(&out)
    );
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert!(stdout(&out).contains("(+0 ~1 -0)"), "{}", stdout(&out));
    let meta: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut con(r.port))
        .unwrap();
    assert_eq!(meta["format"], "3");
    assert_eq!(meta["managed"], "301");
    assert_strings(r.port, 301);
    healthy(&f);

    // Nothing changes but the format: a sync still rewrites the manifest
    // (not "in sync" from the meta alone), then is a no-op.
    to_format_2(r.port);
    let out = edgeform(f.path(), &["reconcile", "--once", "sync"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("sync: applied"), "{}", stderr(&out));
    assert_strings(r.port, 301);
    let out = edgeform(f.path(), &["reconcile", "--once", "sync"]);
    assert!(stderr(&out).contains("sync: in sync"), "{}", stderr(&out));

    // Heal on a format-2 target: the full comparison, and the manifest
    // rewritten in format 3.
    to_format_2(r.port);
    run(r.port, &["SET", "site:s00007.example.com", "{\"evil\":1}"]);
    let log = heal(&f);
    assert!(log.contains("kind=\"manifest\""), "{log}");
    assert!(
        log.contains("key=site:s00007.example.com kind=\"changed\""),
        "{log}"
    );
    assert_strings(r.port, 301);
    healthy(&f);
}

// A no-op sync is one read of the meta per target: no lock.
#[test]
fn a_no_op_sync_reads_the_meta_without_the_lock() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    // Another host holds the lock (not provably dead, never taken over).
    run(
        r.port,
        &["SET", "edgeform:lock", "other-host:1:1", "PX", "120000"],
    );
    let start = std::time::Instant::now();
    let out = edgeform(
        f.path(),
        &["reconcile", "--once", "sync", "--lock-wait", "60s"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("sync: in sync"), "{}", stderr(&out));
    // It did not wait for the lock.
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    // A change still takes the lock: held, it fails the target.
    f.write(
        "sites/s00009.yaml",
        b"host: s00009.example.com\norigin: http://192.0.2.9\n",
    );
    f.commit("one site changes");
    let out = edgeform(
        f.path(),
        &["reconcile", "--once", "sync", "--lock-wait", "300ms"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("locked by another apply"),
        "{}",
        stderr(&out)
    );
    // Released: the change is applied.
    run(r.port, &["DEL", "edgeform:lock"]);
    let out = edgeform(f.path(), &["reconcile", "--once", "sync"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("sync: applied"), "{}", stderr(&out));
}

/// The daemon's heal log (stderr) and a way to wait for lines in it.
struct Daemon {
    child: std::process::Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// `edgeform reconcile` healing every second, tracked (no periodic full
    /// comparison during the test).
    fn start(f: &Fixture) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("reconcile.log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
            .args([
                "reconcile",
                "--sync-every",
                "1h",
                "--heal-every",
                "1s",
                "--full-heal-every",
                "1000",
            ])
            .current_dir(f.path())
            .env("NO_COLOR", "1")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon {
            child,
            log,
            _dir: dir,
        }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// The heal result lines after the first `skip`.
    fn heals(&self, skip: usize) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains("heal: no drift") || l.contains("heal: drift repaired"))
            .skip(skip)
            .map(str::to_owned)
            .collect()
    }

    /// Wait (up to 20 s) for a heal line after the first `skip` that
    /// satisfies `what`; its index.
    fn wait(&self, skip: usize, what: &dyn Fn(&str) -> bool) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(i) = self.heals(skip).iter().position(|l| what(l)) {
                return skip + i;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no such heal line:\n{}",
                self.text()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Wait for a heal that found nothing written; the index after it.
    fn clean(&self, skip: usize) -> usize {
        self.wait(skip, &|l| l.contains("compared=nothing written")) + 1
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// The daemon's tracked heal: a healthy target costs one PING, and each
// kind of drift written while it runs is still found and repaired.
#[test]
fn the_daemons_tracked_heal_finds_each_kind_of_drift() {
    let r = harness::redis(&[]);
    let f = applied(r.port);
    let d = Daemon::start(&f);
    // The first heal compares everything (a new tracking connection), the
    // next ones nothing: no value read, a PING's bytes.
    let first = d.wait(0, &|l| l.contains("heal: no drift"));
    assert!(
        d.heals(first)[0].contains("compared=everything: a new tracking connection"),
        "{}",
        d.text()
    );
    let mut at = d.clean(first);
    let line = &d.heals(at - 1)[0];
    assert!(bytes(line) < 50, "{line}");
    assert!(line.contains("calls=0"), "{line}");

    // A changed value, a value of another type, a missing key, an unmanaged
    // key: each written by hand, each repaired from only the written keys.
    run(r.port, &["SET", "site:s00007.example.com", "{\"evil\":1}"]);
    run(r.port, &["DEL", "site:s00008.example.com"]);
    run(r.port, &["HSET", "site:s00008.example.com", "a", "b"]);
    run(r.port, &["DEL", "site:s00100.example.com"]);
    run(r.port, &["SET", "site:evil.example.com", "{}"]);
    run(r.port, &["SET", "tls:evil.example.com", "{}"]);
    let repaired = d.wait(at, &|l| l.contains("heal: drift repaired"));
    let line = &d.heals(repaired)[0];
    assert!(line.contains("key(s) written"), "{line}");
    assert!(line.contains("repaired=5"), "{}", d.text());
    let text = d.text();
    for (key, kind) in [
        ("site:s00007.example.com", "changed"),
        ("site:s00008.example.com", "changed"),
        ("site:s00100.example.com", "missing"),
        ("site:evil.example.com", "unmanaged"),
        ("tls:evil.example.com", "unmanaged"),
    ] {
        assert!(
            text.contains(&format!("key={key} kind=\"{kind}\"")),
            "{text}"
        );
    }
    assert!(!text.contains("kind=\"manifest\""), "{text}");
    for key in [
        "site:s00007.example.com",
        "site:s00008.example.com",
        "site:s00100.example.com",
    ] {
        assert!(get(r.port, key).unwrap().contains("192.0.2.1"), "{key}");
    }
    assert_eq!(get(r.port, "site:evil.example.com"), None);
    assert_eq!(get(r.port, "tls:evil.example.com"), None);
    at = d.clean(repaired + 1);

    // A tampered manifest: written under edgeform:, so everything is
    // compared (inside Redis) and the manifest rewritten.
    let bucket = bucket_keys(r.port);
    let mut forged = raw(r.port, &bucket[0]);
    edgestate::manifest::push_record(
        &mut forged,
        b"site:forged.example.com",
        "0".repeat(40).as_bytes(),
    );
    set_raw(r.port, &bucket[0], &forged);
    let repaired = d.wait(at, &|l| l.contains("heal: drift repaired"));
    assert!(d.text().contains("kind=\"manifest\""), "{}", d.text());
    assert!(
        d.heals(repaired)[0]
            .contains("compared=everything: 1 key(s) written, the meta or manifest among them"),
        "{}",
        d.text()
    );
    at = d.clean(repaired + 1);

    // The tracking connection killed, then a value changed while the daemon
    // cannot have been told: the next heal compares everything.
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut con(r.port))
        .unwrap();
    let tracking: Vec<&str> = clients
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('t'))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .collect();
    assert_eq!(tracking.len(), 1, "{clients}");
    run(r.port, &["CLIENT", "KILL", "ID", tracking[0]]);
    run(r.port, &["SET", "site:s00009.example.com", "{\"evil\":2}"]);
    let repaired = d.wait(at, &|l| l.contains("heal: drift repaired"));
    assert!(
        d.heals(repaired)[0].contains("compared=everything"),
        "{}",
        d.text()
    );
    assert!(
        get(r.port, "site:s00009.example.com")
            .unwrap()
            .contains("192.0.2.1")
    );

    // A flush: everything compared, everything put back.
    at = d.clean(repaired + 1);
    run(r.port, &["FLUSHALL"]);
    let repaired = d.wait(at, &|l| l.contains("heal: drift repaired"));
    assert!(
        d.heals(repaired)[0].contains("compared=everything"),
        "{}",
        d.text()
    );
    assert!(get(r.port, "site:s00001.example.com").is_some());
}

/// A number field (`name=123`) of a heal log.
fn field(log: &str, name: &str) -> usize {
    let at = log.find(&format!(" {name}=")).expect(log) + name.len() + 2;
    log[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Run one heal with a comparison budget of `per_call` manifest entries a
/// call; its log.
fn heal_with(f: &Fixture, per_call: usize) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["reconcile", "--once", "heal"])
        .current_dir(f.path())
        .env("NO_COLOR", "1")
        .env("EDGEFORM_TEST_HEAL_PER_CALL", per_call.to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stderr(&out)
}

/// The comparison budget the split-bucket tests force.
const BUDGET: usize = 50;

/// Sites in the big bucket of [`applied_big_bucket`].
const BIG: usize = 400;

/// Manifest entries of [`applied_big_bucket`]'s target: 100 ordinary
/// sites, the big bucket's, the routing table.
const ENTRIES: usize = 100 + BIG + 1;

/// One edge at `port` holding 100 ordinary sites and [`BIG`] sites whose
/// keys all fall in one manifest bucket, applied: a bucket string of
/// ~27 KB, longer than the comparison's 16 KiB `GETRANGE` window, so a
/// window's end cuts a record (at 1M sites a bucket holds ~7,000 entries).
/// Returns the fixture, the big bucket's key and its sites' keys.
fn applied_big_bucket(port: u16) -> (Fixture, String, Vec<String>) {
    let f = repo(port, 100);
    let target = edgestate::keys::bucket(b"site:b00000.example.com");
    let mut big = Vec::new();
    for i in 0.. {
        let host = format!("b{i:05}.example.com");
        let key = format!("site:{host}");
        if edgestate::keys::bucket(key.as_bytes()) != target {
            continue;
        }
        f.write(
            &format!("sites/b{i:05}.yaml"),
            format!("host: {host}\norigin: http://192.0.2.1\n").as_bytes(),
        );
        big.push(key);
        if big.len() == BIG {
            break;
        }
    }
    commit_and_apply(&f);
    let bucket = format!("edgeform:manifest:{target:02x}");
    let len: usize = redis::cmd("STRLEN")
        .arg(&bucket)
        .query(&mut con(port))
        .unwrap();
    assert!(len > 16_384, "{len}");
    assert_eq!(records(port, &bucket).len(), BIG);
    (f, bucket, big)
}

/// A healthy heal with the forced budget: bounded calls, O(1) bytes each.
fn healthy_split(f: &Fixture) -> String {
    let log = heal_with(f, BUDGET);
    assert!(log.contains("heal: no drift"), "{log}");
    // No call over the budget, and the big bucket split across calls of
    // exactly the budget (the resume point is a record's offset).
    assert_eq!(field(&log, "largest_call"), BUDGET, "{log}");
    assert!(field(&log, "calls") > ENTRIES.div_ceil(BUDGET), "{log}");
    log
}

// Server-side heal in bounded chunks: no call covers more than its budget;
// a bucket bigger than the budget is split across calls.
#[test]
fn a_bucket_bigger_than_the_budget_is_split_across_calls() {
    let r = harness::redis(&[]);
    let (f, _, _) = applied_big_bucket(r.port);
    let log = healthy_split(&f);
    // Still a few hundred bytes per call, not the values.
    assert!(bytes(&log) < 300 * field(&log, "calls"), "{log}");
    // With the default budget (512 entries) each chain of calls over a
    // range of buckets is one call, the big bucket whole in its range's:
    // the split comes from the budget.
    let log = heal(&f);
    assert!(log.contains("heal: no drift"), "{log}");
    assert_eq!(field(&log, "rounds"), 1, "{log}");
    assert!(field(&log, "largest_call") >= BIG, "{log}");
    // Smaller budgets still end healthy and keep the bound; a budget of 1
    // resumes at every record.
    for budget in [1, 17, 20, 33, 399] {
        let log = heal_with(&f, budget);
        assert!(log.contains("heal: no drift"), "{budget}: {log}");
        assert!(field(&log, "largest_call") <= budget, "{budget}: {log}");
    }
}

// Each kind of drift inside a bucket split across calls.
#[test]
fn drift_in_a_split_bucket_is_found_in_redis() {
    let r = harness::redis(&[]);
    let (f, _, big) = applied_big_bucket(r.port);
    healthy_split(&f);
    // Changed values and missing keys spread over the big bucket (some
    // fall in each call's chunk).
    let changed: Vec<&String> = big.iter().step_by(40).collect();
    let missing: Vec<&String> = big.iter().skip(20).step_by(40).collect();
    for k in &changed {
        run(r.port, &["SET", k, "{\"evil\":1}"]);
    }
    run(r.port, &["DEL", big[1].as_str()]);
    run(r.port, &["HSET", big[1].as_str(), "a", "b"]);
    for k in &missing {
        run(r.port, &["DEL", k]);
    }
    run(r.port, &["SET", "site:rogue.example.com", "{}"]);
    let log = heal_with(&f, BUDGET);
    for k in changed.iter().copied().chain([&big[1]]) {
        assert!(log.contains(&format!("key={k} kind=\"changed\"")), "{log}");
    }
    for k in &missing {
        assert!(log.contains(&format!("key={k} kind=\"missing\"")), "{log}");
    }
    assert!(
        log.contains("key=site:rogue.example.com kind=\"unmanaged\""),
        "{log}"
    );
    assert!(!log.contains("kind=\"manifest\""), "{log}");
    assert_eq!(
        field(&log, "repaired"),
        changed.len() + 1 + missing.len() + 1,
        "{log}"
    );
    assert!(field(&log, "largest_call") <= BUDGET, "{log}");
    for k in changed.iter().chain(&missing) {
        assert!(get(r.port, k).unwrap().contains("192.0.2.1"));
    }
    assert_eq!(get(r.port, "site:rogue.example.com"), None);
    healthy_split(&f);
}

// A tampered manifest bucket split across calls is found.
#[test]
fn a_tampered_split_bucket_is_found_in_redis() {
    let r = harness::redis(&[]);
    let (f, bucket, big) = applied_big_bucket(r.port);
    let b = &bucket["edgeform:manifest:".len()..];
    let port = r.port;
    let edit = |change: &dyn Fn(&mut Records)| {
        let mut r0 = records(port, &bucket);
        change(&mut r0);
        write_records(port, &bucket, &r0);
    };
    let bytes_edit = |change: &dyn Fn(&mut Vec<u8>)| {
        let mut s0 = raw(port, &bucket);
        change(&mut s0);
        set_raw(port, &bucket, &s0);
    };
    let tamper: [(&str, &dyn Fn()); 12] = [
        (
            "an entry's hash changed (value and meta untouched)",
            &|| {
                edit(&|r0| {
                    let i = r0.iter().position(|(k, _)| *k == big[150]).unwrap();
                    r0[i].1 = "0".repeat(40);
                });
            },
        ),
        ("an entry removed", &|| {
            edit(&|r0| r0.retain(|(k, _)| *k != big[70]));
        }),
        ("an entry added (a key nobody manages)", &|| {
            edit(&|r0| {
                r0.push(("site:extra.example.com".into(), "0".repeat(40)));
                r0.sort();
            });
        }),
        ("an entry named twice", &|| {
            edit(&|r0| {
                let again = r0[200].clone();
                r0.insert(200, again);
            });
        }),
        ("the string cut in the last record", &|| {
            bytes_edit(&|s0| s0.truncate(s0.len() - 3));
        }),
        ("the string cut in the middle of a record", &|| {
            bytes_edit(&|s0| s0.truncate(s0.len() / 2 + 5));
        }),
        ("garbage with no NUL appended", &|| {
            bytes_edit(&|s0| s0.extend(std::iter::repeat_n(b'x', 20_000)));
        }),
        ("a record's NUL overwritten", &|| {
            bytes_edit(&|s0| {
                let nul = s0.iter().rposition(|&c| c == 0).unwrap();
                s0[nul] = b'x';
            });
        }),
        ("the bucket a hash of its entries", &|| {
            let r0 = records(port, &bucket);
            run(port, &["DEL", &bucket]);
            let mut c = redis::cmd("HSET");
            c.arg(&bucket);
            for (k, h) in &r0 {
                c.arg(k).arg(h);
            }
            c.exec(&mut con(port)).unwrap();
        }),
        ("the bucket a list", &|| {
            run(port, &["DEL", &bucket]);
            run(port, &["RPUSH", &bucket, "x"]);
        }),
        ("the bucket's stored digest changed", &|| {
            run(port, &["HSET", "edgeform:manifest:buckets", b, "0 400"]);
        }),
        ("the bucket's stored count changed", &|| {
            run(
                port,
                &[
                    "HSET",
                    "edgeform:manifest:buckets",
                    b,
                    "00000000000000000000000000000000 400",
                ],
            );
        }),
    ];
    for (what, t) in tamper {
        t();
        // Never an error, never "healthy": the full comparison, and the
        // manifest rewritten.
        let log = heal_with(&f, BUDGET);
        assert!(
            log.contains("key=edgeform:manifest kind=\"manifest\""),
            "{what}: {log}"
        );
        assert!(field(&log, "largest_call") <= BUDGET, "{what}: {log}");
        healthy_split(&f);
    }
}

// Heal's calls run in chains over disjoint bucket ranges at once: a target
// far away costs the longest chain's round trips, not the sum of all
// calls.
#[test]
fn the_comparison_walks_bucket_ranges_at_once() {
    let r = harness::redis(&[]);
    let (f, _, _) = applied_big_bucket(r.port);
    // The scripts loaded (a first call's NOSCRIPT is retried).
    healthy_split(&f);
    // What the server runs, in its order.
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &r.port.to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    let mut out = std::io::BufReader::new(monitor.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut seen).unwrap();
    assert_eq!(seen.trim(), "OK");
    let log = healthy_split(&f);
    run(r.port, &["SET", "edgeform:test:end", "1"]);
    let (mut starts, mut counts) = (Vec::new(), 0);
    loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut out, &mut line).unwrap() == 0
            || line.contains("\"edgeform:test:end\"")
        {
            break;
        }
        // "EVALSHA" sha "0" prefix index budget bucket offset carry n stop:
        // a COMPARE call and the bucket it starts at.
        let args: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        // "EVALSHA" sha "0" count, then a cursor and a pattern per
        // document prefix: a COUNT call.
        let count_args = 4 + 2 * edgestate::keys::DOCUMENT_PREFIXES.len();
        match (args.first(), args.len()) {
            (Some(&"EVALSHA"), 11) => starts.push(args[6].parse::<usize>().unwrap()),
            (Some(&"EVALSHA"), n) if n == count_args => counts += 1,
            _ => {}
        }
    }
    monitor.kill().unwrap();
    monitor.wait().unwrap();
    // Each of the 8 ranges' first call went out before any range's second.
    let mut first: Vec<usize> = starts[..8].to_vec();
    first.sort_unstable();
    assert_eq!(first, [0, 32, 64, 96, 128, 160, 192, 224], "{starts:?}");
    assert_eq!(
        starts.len() + counts,
        field(&log, "calls"),
        "{starts:?}\n{log}"
    );
    // The heal waited for the longest chain: the big bucket's range
    // (split in calls of at most the budget), not for every call in turn.
    assert!(field(&log, "rounds") >= BIG / BUDGET, "{log}");
    assert!(field(&log, "rounds") + 7 <= field(&log, "calls"), "{log}");
}
