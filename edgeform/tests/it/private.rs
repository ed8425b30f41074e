//! `reconcile --pull` from a private repository over
//! SSH (a real `sshd` on a loopback port serving a bare repository; key
//! file, `EDGEFORM_SSH_KEY`, ssh-agent; host keys checked against plain,
//! `[host]:port` and hashed known_hosts files), and `--require-signed-by`
//! (commits signed with `git -c gpg.format=ssh commit -S`, checked against
//! an OpenSSH allowed-signers file), each against a real `redis-server`;
//! and the HTTP token path against `git http-backend` on loopback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use harness::sshd::{Sshd, sshd};

use crate::util::{Fixture, git, stderr};

fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn meta(port: u16) -> BTreeMap<String, String> {
    redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut con(port))
        .unwrap()
}

fn origin_of(port: u16) -> Option<String> {
    redis::cmd("GET")
        .arg("site:s00000.example.com")
        .query(&mut con(port))
        .unwrap()
}

fn dbsize(port: u16) -> usize {
    redis::cmd("DBSIZE").query(&mut con(port)).unwrap()
}

/// A config repository with one edge at `port` and one site.
fn config(port: u16, origin: &str) -> Fixture {
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
        )
        .as_bytes(),
    );
    set_origin(&f, origin);
    f
}

fn set_origin(f: &Fixture, origin: &str) {
    f.write(
        "sites/s00000.yaml",
        format!("host: s00000.example.com\norigin: {origin}\n").as_bytes(),
    );
}

fn head(dir: &Path) -> String {
    String::from_utf8(git(dir, &["rev-parse", "HEAD"]).stdout)
        .unwrap()
        .trim()
        .to_owned()
}

/// The control host's state directory of the repository in `dir` (the
/// last good commit): one per test repository, never the system's.
fn state_dir(dir: &Path) -> PathBuf {
    PathBuf::from(format!("{}.state", dir.display()))
}

/// `edgeform` in `dir` with `args` and extra environment.
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgeform"));
    c.args(args)
        .current_dir(dir)
        .env("EDGEFORM_STATE_DIR", state_dir(dir))
        .env("NO_COLOR", "1")
        .env_remove("EDGEFORM_SSH_KEY")
        .env_remove("EDGEFORM_GIT_TOKEN")
        .env_remove("SSH_AUTH_SOCK");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The lines of the output that are errors.
fn error_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.contains("ERROR"))
        .map(str::to_owned)
        .collect()
}

/// An upstream repository, a bare copy served by sshd, and a clone whose
/// `origin` is that bare repository over `ssh://`.
struct Remote {
    upstream: Fixture,
    bare: PathBuf,
    clone: PathBuf,
    _dir: tempfile::TempDir,
}

impl Remote {
    fn new(s: &Sshd, redis_port: u16) -> Remote {
        let upstream = config(redis_port, "http://192.0.2.1");
        upstream.commit("first");
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join("config.git");
        let clone = dir.path().join("work");
        git(
            dir.path(),
            &[
                "clone",
                "-q",
                "--bare",
                upstream.path().to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
        );
        git(
            dir.path(),
            &[
                "clone",
                "-q",
                bare.to_str().unwrap(),
                clone.to_str().unwrap(),
            ],
        );
        let url = format!(
            "ssh://{}@127.0.0.1:{}{}",
            Sshd::user(),
            s.port(),
            bare.display()
        );
        git(&clone, &["remote", "set-url", "origin", &url]);
        Remote {
            upstream,
            bare,
            clone,
            _dir: dir,
        }
    }

    /// A new commit upstream (origin changed), pushed to the bare
    /// repository; the clone does not have it yet.
    fn advance(&self, origin: &str) -> String {
        set_origin(&self.upstream, origin);
        git(self.upstream.path(), &["commit", "-qam", origin]);
        git(
            self.upstream.path(),
            &["push", "-q", self.bare.to_str().unwrap(), "main"],
        );
        head(self.upstream.path())
    }
}

const PULL: &[&str] = &["reconcile", "--once", "sync", "--pull", "origin/main"];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = PULL.to_vec();
    v.extend_from_slice(extra);
    v
}

#[test]
fn pull_over_ssh_with_a_key_file_and_known_hosts() {
    let s = sshd();
    let r = harness::redis(&[]);
    let remote = Remote::new(&s, r.port);
    let key = s.client_key.to_str().unwrap();
    let known = s.known_hosts.to_str().unwrap();

    // The flag, and a `[127.0.0.1]:port` known_hosts entry.
    let c1 = remote.advance("http://192.0.2.11");
    let out = run(
        &remote.clone,
        &with(&["--ssh-key", key, "--known-hosts", known]),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(origin_of(r.port).unwrap().contains("192.0.2.11"));
    assert_eq!(meta(r.port)["commit"], c1);

    // EDGEFORM_SSH_KEY, and the same known_hosts hashed (`ssh-keygen -H`).
    let hashed = remote._dir.path().join("known_hosts.hashed");
    std::fs::copy(&s.known_hosts, &hashed).unwrap();
    let h = Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(&hashed)
        .output()
        .unwrap();
    assert!(h.status.success(), "{}", String::from_utf8_lossy(&h.stderr));
    let text = std::fs::read_to_string(&hashed).unwrap();
    assert!(
        text.starts_with("|1|") && !text.contains("127.0.0.1"),
        "{text}"
    );
    let c2 = remote.advance("http://192.0.2.12");
    let out = run(
        &remote.clone,
        &with(&["--known-hosts", hashed.to_str().unwrap()]),
        &[("EDGEFORM_SSH_KEY", key)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(origin_of(r.port).unwrap().contains("192.0.2.12"));
    assert_eq!(meta(r.port)["commit"], c2);

    // A tag named like the remote branch, pushed at the live commit, is
    // not fetched and does not pin the reconciler there ...
    let bare = remote.bare.to_str().unwrap();
    git(remote.upstream.path(), &["tag", "origin/main", &c2]);
    git(
        remote.upstream.path(),
        &["push", "-q", bare, "refs/tags/origin/main"],
    );
    let c3 = remote.advance("http://192.0.2.13");
    let pull = with(&["--ssh-key", key, "--known-hosts", known]);
    let out = run(&remote.clone, &pull, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], c3);
    let tags = Command::new("git")
        .args(["tag", "--list"])
        .current_dir(&remote.clone)
        .output()
        .unwrap();
    assert!(
        tags.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&tags.stdout)
    );
    // ... nor does one left in the clone.
    git(&remote.clone, &["tag", "origin/main", &c3]);
    let c4 = remote.advance("http://192.0.2.14");
    let out = run(&remote.clone, &pull, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], c4);
    assert!(origin_of(r.port).unwrap().contains("192.0.2.14"));
}

#[test]
fn pull_over_ssh_with_the_keys_in_ssh_agent() {
    let s = sshd();
    let r = harness::redis(&[]);
    let remote = Remote::new(&s, r.port);
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    // -D: in the foreground, stopped below by its pid.
    let mut agent = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let add = Command::new("ssh-add")
        .arg(&s.client_key)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    let c1 = remote.advance("http://192.0.2.21");
    let out = run(
        &remote.clone,
        &with(&["--known-hosts", s.known_hosts.to_str().unwrap()]),
        &[("SSH_AUTH_SOCK", sock.to_str().unwrap())],
    );
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], c1);
    assert!(origin_of(r.port).unwrap().contains("192.0.2.21"));
}

#[test]
fn an_unknown_or_different_host_key_is_refused_and_nothing_is_applied() {
    let s = sshd();
    let r = harness::redis(&[]);
    let remote = Remote::new(&s, r.port);
    remote.advance("http://192.0.2.31");
    let key = s.client_key.to_str().unwrap();
    let host = format!("[127.0.0.1]:{}", s.port());

    // A known_hosts naming another key for this host: a man in the middle.
    let other = s.other_known_hosts.to_str().unwrap();
    let out = run(
        &remote.clone,
        &with(&["--ssh-key", key, "--known-hosts", other]),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains(&format!(
            "host key of {host} (ssh-ed25519) does not match {other}"
        )),
        "{}",
        errors[0]
    );

    // A known_hosts that does not list the host: unknown, refused (never
    // added, never accepted).
    let empty = remote._dir.path().join("known_hosts.other");
    std::fs::write(
        &empty,
        format!(
            "[127.0.0.1]:{} {}\n",
            u32::from(s.port()) + 1,
            std::fs::read_to_string(&s.known_hosts)
                .unwrap()
                .split_once(' ')
                .unwrap()
                .1
                .trim()
        ),
    )
    .unwrap();
    let before = std::fs::read(&empty).unwrap();
    let out = run(
        &remote.clone,
        &with(&["--ssh-key", key, "--known-hosts", empty.to_str().unwrap()]),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains(&format!(
            "host key of {host} is unknown: not in {}",
            empty.display()
        )),
        "{}",
        errors[0]
    );
    assert_eq!(std::fs::read(&empty).unwrap(), before);
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
    // Nothing fetched either: the clone's origin/main is where it was.
    assert_ne!(
        head(remote.upstream.path()),
        String::from_utf8(git(&remote.clone, &["rev-parse", "origin/main"]).stdout)
            .unwrap()
            .trim()
    );
}

#[test]
fn an_unreadable_key_file_is_one_error_naming_it() {
    let s = sshd();
    let r = harness::redis(&[]);
    let remote = Remote::new(&s, r.port);
    remote.advance("http://192.0.2.41");
    let missing = remote._dir.path().join("no_such_key");
    let out = run(
        &remote.clone,
        &with(&[
            "--ssh-key",
            missing.to_str().unwrap(),
            "--known-hosts",
            s.known_hosts.to_str().unwrap(),
        ]),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains(&format!(
            "ssh key {}: cannot read it: No such file or directory",
            missing.display()
        )),
        "{}",
        errors[0]
    );
    // A directory is not a key either.
    let out = run(
        &remote.clone,
        &with(&[
            "--ssh-key",
            remote._dir.path().to_str().unwrap(),
            "--known-hosts",
            s.known_hosts.to_str().unwrap(),
        ]),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        error_lines(&out)[0].contains(&format!("ssh key {}", remote._dir.path().display())),
        "{}",
        stderr(&out)
    );
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
}

/// Without `--known-hosts`, `$HOME/.ssh/known_hosts` decides (and is
/// named when the host is not in it); an unreadable known_hosts file is
/// one error naming it.
#[test]
fn the_default_known_hosts_is_the_users_and_an_unreadable_one_is_named() {
    let s = sshd();
    let r = harness::redis(&[]);
    let remote = Remote::new(&s, r.port);
    let c1 = remote.advance("http://192.0.2.91");
    let key = s.client_key.to_str().unwrap();
    let home = tempfile::tempdir().unwrap();
    let home_str = home.path().to_str().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    let default = home.path().join(".ssh/known_hosts");

    // Missing: named.
    let out = run(
        &remote.clone,
        &with(&["--ssh-key", key]),
        &[("HOME", home_str)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        error_lines(&out)[0].contains(&format!(
            "known_hosts {}: cannot read it: No such file or directory",
            default.display()
        )),
        "{}",
        stderr(&out)
    );
    // Present but without this host (another host's line): unknown.
    std::fs::write(
        &default,
        std::fs::read_to_string(&s.known_hosts)
            .unwrap()
            .replace("[127.0.0.1]", "[192.0.2.1]"),
    )
    .unwrap();
    let out = run(
        &remote.clone,
        &with(&["--ssh-key", key]),
        &[("HOME", home_str)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        error_lines(&out)[0].contains(&format!("is unknown: not in {}", default.display())),
        "{}",
        stderr(&out)
    );
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
    // With the host's line: fetched and applied.
    std::fs::copy(&s.known_hosts, &default).unwrap();
    let out = run(
        &remote.clone,
        &with(&["--ssh-key", key]),
        &[("HOME", home_str)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], c1);
}

// ------------------------------------------------------- signed commits

/// A key pair made with ssh-keygen; returns (private key path, public line).
fn keypair(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let public = std::fs::read_to_string(dir.join(format!("{name}.pub"))).unwrap();
    (path, public.trim().to_owned())
}

/// Commit everything in `dir`, signed with `key` (`gpg.format=ssh`).
fn signed_commit(dir: &Path, key: &Path, message: &str) -> String {
    git(dir, &["add", "-A"]);
    git(
        dir,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &format!("user.signingkey={}", key.display()),
            "commit",
            "-q",
            "-S",
            "-m",
            message,
        ],
    );
    head(dir)
}

/// The same commit with another message but its original signature: a
/// commit changed after it was signed.
fn tampered_commit(dir: &Path) -> String {
    let raw = String::from_utf8(git(dir, &["cat-file", "commit", "HEAD"]).stdout).unwrap();
    assert!(raw.contains("-----BEGIN SSH SIGNATURE-----"), "{raw}");
    let changed = raw.replacen("\n\nsigned ", "\n\nsigned (changed) ", 1);
    assert_ne!(raw, changed);
    let path = dir.join(".git/tampered");
    std::fs::write(&path, changed).unwrap();
    let out = git(
        dir,
        &["hash-object", "-t", "commit", "-w", path.to_str().unwrap()],
    );
    std::fs::remove_file(&path).unwrap();
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    git(dir, &["reset", "-q", "--hard", &id]);
    id
}

#[test]
fn only_commits_signed_by_an_allowed_signer_are_applied() {
    let r = harness::redis(&[]);
    let keys = tempfile::tempdir().unwrap();
    let (alice, alice_pub) = keypair(keys.path(), "alice");
    let (mallory, _) = keypair(keys.path(), "mallory");
    let (retired, retired_pub) = keypair(keys.path(), "retired");
    let allowed = keys.path().join("allowed_signers");
    std::fs::write(
        &allowed,
        format!(
            "# release managers\nalice@example.net {alice_pub}\n\
             retired@example.net valid-before=\"20200101\" {retired_pub}\n"
        ),
    )
    .unwrap();
    let sync = [
        "reconcile",
        "--once",
        "sync",
        "--require-signed-by",
        allowed.to_str().unwrap(),
    ];

    let f = config(r.port, "http://192.0.2.51");
    git(f.path(), &["init", "-q", "-b", "main"]);
    let good = signed_commit(f.path(), &alice, "signed by alice");
    let out = run(f.path(), &sync, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], good);
    assert!(
        stderr(&out).contains("signer=alice@example.net"),
        "{}",
        stderr(&out)
    );

    let still_good = |out: &Output, reason: &str, commit: &str| {
        assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
        let errors = error_lines(out);
        assert_eq!(errors.len(), 1, "{}", stderr(out));
        assert!(
            errors[0].contains(&format!("refused commit {commit}"))
                && errors[0].contains(&format!("reason=\"{reason}\"")),
            "{}",
            errors[0]
        );
        assert_eq!(meta(r.port)["commit"], good, "the last good commit is kept");
        assert!(origin_of(r.port).unwrap().contains("192.0.2.51"));
    };

    // Unsigned.
    set_origin(&f, "http://192.0.2.52");
    git(f.path(), &["commit", "-qam", "unsigned"]);
    let unsigned = head(f.path());
    still_good(&run(f.path(), &sync, &[]), "unsigned", &unsigned);

    // Signed by a key that is not in the file.
    set_origin(&f, "http://192.0.2.53");
    let wrong = signed_commit(f.path(), &mallory, "signed by mallory");
    still_good(&run(f.path(), &sync, &[]), "unknown_signer", &wrong);

    // Signed by a key of the file whose validity window has ended: no
    // principal's key is valid now, so the signer is unknown.
    set_origin(&f, "http://192.0.2.56");
    let expired = signed_commit(f.path(), &retired, "signed by a retired key");
    still_good(&run(f.path(), &sync, &[]), "unknown_signer", &expired);

    // Signed by alice, then changed.
    set_origin(&f, "http://192.0.2.54");
    signed_commit(f.path(), &alice, "signed by alice");
    let tampered = tampered_commit(f.path());
    still_good(&run(f.path(), &sync, &[]), "bad_signature", &tampered);

    // A working-tree change is never pushed under --require-signed-by:
    // HEAD is what is verified and applied (on top of the last good
    // commit: the refused ones above are not in its history).
    git(f.path(), &["reset", "-q", "--hard", &good]);
    set_origin(&f, "http://192.0.2.55");
    let fixed = signed_commit(f.path(), &alice, "signed by alice again");
    set_origin(&f, "http://192.0.2.99");
    let out = run(f.path(), &sync, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], fixed);
    assert!(origin_of(r.port).unwrap().contains("192.0.2.55"));
}

/// Signed throughout, from the live commit: an allowed signer's commit
/// that does not descend from the live one (main force-moved to a work
/// in progress) is refused by sync and heal (`diverged`), and so is a
/// signed commit whose history from the live one holds an unsigned
/// commit (`unsigned-history`, naming it); nothing is written.
/// `--allow-rollback` still moves to a signed non-descendant, never over
/// unsigned history.
#[test]
fn only_a_history_signed_throughout_from_the_live_commit_is_applied() {
    let r = harness::redis(&[]);
    let keys = tempfile::tempdir().unwrap();
    let (alice, alice_pub) = keypair(keys.path(), "alice");
    let allowed = keys.path().join("allowed_signers");
    std::fs::write(&allowed, format!("alice@example.net {alice_pub}\n")).unwrap();
    let once = |job: &'static str, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["reconcile", "--once", job, "--require-signed-by"]
            .map(String::from)
            .to_vec();
        v.push(allowed.to_str().unwrap().to_owned());
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let f = config(r.port, "http://192.0.2.81");
    git(f.path(), &["init", "-q", "-b", "main"]);
    let base = signed_commit(f.path(), &alice, "base");
    // alice's work in progress on a branch from base.
    git(f.path(), &["checkout", "-q", "-b", "wip"]);
    set_origin(&f, "http://192.0.2.89");
    let wip = signed_commit(f.path(), &alice, "wip: try another origin");
    git(f.path(), &["checkout", "-q", "main"]);
    set_origin(&f, "http://192.0.2.82");
    let live = signed_commit(f.path(), &alice, "merged change");
    let sync = once("sync", &[]);
    let sync: Vec<&str> = sync.iter().map(String::as_str).collect();
    let out = run(f.path(), &sync, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], live);

    let refused = |args: &[&str], kind: &str, naming: &str| {
        let before = meta(r.port);
        // A control host that knows no last good commit (a new state
        // directory): each target's live commit is what the new one is
        // checked from, by the gate.
        std::fs::remove_dir_all(state_dir(f.path())).unwrap();
        let out = run(f.path(), args, &[]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let errors = error_lines(&out);
        assert_eq!(errors.len(), 1, "{}", stderr(&out));
        assert!(
            errors[0].contains(&format!("reason=\"{kind}\"")) && errors[0].contains(naming),
            "{}",
            errors[0]
        );
        assert_eq!(meta(r.port), before, "nothing was written");
        assert!(origin_of(r.port).unwrap().contains("192.0.2.82"));
    };
    // main force-moved to the signed, unmerged work in progress.
    git(f.path(), &["reset", "-q", "--hard", &wip]);
    let heal = once("heal", &[]);
    let heal: Vec<&str> = heal.iter().map(String::as_str).collect();
    for args in [&sync, &heal] {
        refused(
            args,
            "diverged",
            &format!("it does not descend from the live commit {live}"),
        );
    }
    // An unsigned commit in the middle, a signed tip on top.
    git(f.path(), &["reset", "-q", "--hard", &live]);
    set_origin(&f, "http://192.0.2.83");
    git(f.path(), &["commit", "-qam", "unsigned in the middle"]);
    let middle = head(f.path());
    set_origin(&f, "http://192.0.2.84");
    let tip = signed_commit(f.path(), &alice, "signed tip");
    for args in [&sync, &heal] {
        refused(args, "unsigned-history", &format!("commit {middle}"));
    }
    let roll = once("sync", &["--allow-rollback"]);
    let roll: Vec<&str> = roll.iter().map(String::as_str).collect();
    refused(&roll, "unsigned-history", &format!("commit {middle}"));
    // --allow-rollback keeps its meaning: a signed commit that does not
    // descend from the live one (here the work in progress) is applied.
    git(f.path(), &["reset", "-q", "--hard", &wip]);
    let out = run(f.path(), &roll, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], wip);
    assert!(origin_of(r.port).unwrap().contains("192.0.2.89"));
    let _ = (base, tip);
}

fn wipe_meta(port: u16) {
    redis::cmd("DEL")
        .arg("edgeform:meta")
        .exec(&mut con(port))
        .unwrap();
}

/// A target whose Redis lost `edgeform:meta` is no free pass: the new
/// commit is checked from the last good commit the control host keeps in
/// its state directory (across `--once` runs): a force-moved signed work
/// in progress (`not_descendant`), a signed tip on an unsigned commit
/// (`unsigned_history`) and a commit that deletes the freeze the last
/// good commit has open (`frozen`) are refused and the edge keeps the
/// last good commit's state. With no last good commit known at all, only
/// the tip's signature is checked, and the log says the history was not.
#[test]
fn a_target_that_lost_its_live_commit_is_checked_from_the_last_good_commit() {
    let r = harness::redis(&[]);
    let keys = tempfile::tempdir().unwrap();
    let (alice, alice_pub) = keypair(keys.path(), "alice");
    let allowed = keys.path().join("allowed_signers");
    std::fs::write(&allowed, format!("alice@example.net {alice_pub}\n")).unwrap();
    let once = |job: &str, now: &str| -> Vec<String> {
        [
            "--now",
            now,
            "reconcile",
            "--once",
            job,
            "--require-signed-by",
            allowed.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let after = "2020-12-27T00:00:00Z";
    let inside = "2020-12-25T12:00:00Z";
    let f = config(r.port, "http://192.0.2.81");
    let freeze = "name: test\napply:\n  freeze:\n    - name: final\n      \
                  start: \"2020-12-24T18:00:00Z\"\n      end: \"2020-12-26T06:00:00Z\"\n";
    f.write("cluster.yaml", freeze.as_bytes());
    git(f.path(), &["init", "-q", "-b", "main"]);
    signed_commit(f.path(), &alice, "base");
    git(f.path(), &["checkout", "-q", "-b", "wip"]);
    set_origin(&f, "http://192.0.2.89");
    let wip = signed_commit(f.path(), &alice, "wip: try another origin");
    git(f.path(), &["checkout", "-q", "main"]);
    set_origin(&f, "http://192.0.2.82");
    let live = signed_commit(f.path(), &alice, "merged change");
    let args = once("sync", after);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(f.path(), &args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], live);
    assert!(
        stderr(&out).contains("only this commit's signature was verified, not its history"),
        "{}",
        stderr(&out)
    );
    let kept = std::fs::read_to_string(state_dir(f.path()).join("last-good-commit")).unwrap();
    assert_eq!(kept, live);

    let refused = |job: &str, now: &str, reason: &str, naming: &str| {
        wipe_meta(r.port);
        let args = once(job, now);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(f.path(), &args, &[]);
        assert_eq!(out.status.code(), Some(1), "{job}: {}", stderr(&out));
        let errors = error_lines(&out);
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&format!("reason=\"{reason}\"")) && e.contains(naming)),
            "{job}: {}",
            stderr(&out)
        );
        assert!(
            origin_of(r.port).unwrap().contains("192.0.2.82"),
            "{job}: {}",
            stderr(&out)
        );
        assert_ne!(meta(r.port).get("commit"), Some(&head(f.path())), "{job}");
    };
    // main force-moved to alice's signed, unmerged work in progress.
    git(f.path(), &["reset", "-q", "--hard", &wip]);
    for job in ["sync", "heal"] {
        refused(
            job,
            after,
            "not_descendant",
            &format!("refused commit {wip}"),
        );
    }
    // A signed tip on an unsigned commit.
    git(f.path(), &["reset", "-q", "--hard", &live]);
    set_origin(&f, "http://192.0.2.83");
    git(f.path(), &["commit", "-qam", "unsigned in the middle"]);
    let middle = head(f.path());
    set_origin(&f, "http://192.0.2.84");
    signed_commit(f.path(), &alice, "signed tip");
    for job in ["sync", "heal"] {
        refused(job, after, "unsigned_history", &format!("commit {middle}"));
    }
    // A signed commit that deletes the freeze the last good commit has
    // open: the last good commit's window is in force.
    git(f.path(), &["reset", "-q", "--hard", &live]);
    set_origin(&f, "http://192.0.2.85");
    f.write("cluster.yaml", b"name: test\n");
    signed_commit(f.path(), &alice, "no freeze");
    for job in ["sync", "heal"] {
        refused(job, inside, "frozen", "edge-1");
    }
    let kept = std::fs::read_to_string(state_dir(f.path()).join("last-good-commit")).unwrap();
    assert_eq!(
        kept, live,
        "a commit no target took is not the last good one"
    );

    // No last good commit known at all (a new state directory) and no
    // live commit: only the tip is checked, and the log says so.
    git(f.path(), &["reset", "-q", "--hard", &wip]);
    wipe_meta(r.port);
    std::fs::remove_dir_all(state_dir(f.path())).unwrap();
    let args = once("sync", after);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(f.path(), &args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], wip);
    assert!(
        stderr(&out).contains("only this commit's signature was verified, not its history"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_malformed_allowed_signers_file_is_one_error_naming_the_line() {
    let r = harness::redis(&[]);
    let keys = tempfile::tempdir().unwrap();
    let (alice, alice_pub) = keypair(keys.path(), "alice");
    let allowed = keys.path().join("allowed_signers");
    std::fs::write(
        &allowed,
        format!("alice@example.net {alice_pub}\nbob@example.net ssh-ed25519\n"),
    )
    .unwrap();
    let f = config(r.port, "http://192.0.2.61");
    git(f.path(), &["init", "-q", "-b", "main"]);
    signed_commit(f.path(), &alice, "signed by alice");
    let out = run(
        f.path(),
        &[
            "reconcile",
            "--once",
            "heal",
            "--require-signed-by",
            allowed.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains(&format!("{}:2: allowed signers:", allowed.display())),
        "{}",
        errors[0]
    );
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
    // The daemon does not start with it: one line, exit 1.
    let out = run(
        f.path(),
        &[
            "reconcile",
            "--sync-every",
            "1s",
            "--require-signed-by",
            allowed.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "error: {}:2: allowed signers: expected `principals [options] key-type base64-key`",
            allowed.display()
        )
    );
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
    // An unreadable file: named too.
    let missing = keys.path().join("nope");
    let out = run(
        f.path(),
        &[
            "reconcile",
            "--once",
            "sync",
            "--require-signed-by",
            missing.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        error_lines(&out)[0].contains(&format!(
            "allowed signers {}: cannot read it",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
}

/// The daemon over SSH: a signed commit applied, then an unsigned one
/// pushed upstream is refused on every run while the last good commit
/// stays (and is what the runs keep pushing); so is a signed commit that
/// does not descend from it (main force-moved).
#[test]
fn the_daemon_keeps_the_last_good_commit_when_a_pulled_commit_is_unsigned() {
    let s = sshd();
    let r = harness::redis(&[]);
    let remote = Remote::new(&s, r.port);
    let keys = tempfile::tempdir().unwrap();
    let (alice, alice_pub) = keypair(keys.path(), "alice");
    let allowed = keys.path().join("allowed_signers");
    std::fs::write(&allowed, format!("alice@example.net {alice_pub}\n")).unwrap();
    set_origin(&remote.upstream, "http://192.0.2.71");
    let good = signed_commit(remote.upstream.path(), &alice, "signed");
    git(
        remote.upstream.path(),
        &["push", "-q", remote.bare.to_str().unwrap(), "main"],
    );
    let log = keys.path().join("reconcile.log");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args([
            "reconcile",
            "--sync-every",
            "1s",
            "--heal-every",
            "1h",
            "--pull",
            "origin/main",
            "--ssh-key",
            s.client_key.to_str().unwrap(),
            "--known-hosts",
            s.known_hosts.to_str().unwrap(),
            "--require-signed-by",
            allowed.to_str().unwrap(),
        ])
        .current_dir(&remote.clone)
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", keys.path().join("state"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let wait_for = |what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !what() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        what()
    };
    let applied = wait_for(&|| meta(r.port).get("commit") == Some(&good));
    let bad = remote.advance("http://192.0.2.72");
    let refused = wait_for(&|| {
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains(&format!("refused commit {bad}")))
            .count()
            >= 2
    });
    // main force-moved to alice's signed work in progress, which does not
    // descend from the commit the daemon applied: refused as well.
    let up = remote.upstream.path();
    git(up, &["checkout", "-q", "-b", "wip", &format!("{good}~1")]);
    set_origin(&remote.upstream, "http://192.0.2.79");
    let wip = signed_commit(up, &alice, "wip: another origin");
    git(
        up,
        &[
            "push",
            "-q",
            "-f",
            remote.bare.to_str().unwrap(),
            "wip:main",
        ],
    );
    let diverged = wait_for(&|| {
        std::fs::read_to_string(&log).unwrap().lines().any(|l| {
            l.contains(&format!("refused commit {wip}")) && l.contains("reason=\"not_descendant\"")
        })
    });
    let _ = daemon.kill();
    let _ = daemon.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(applied, "{text}");
    assert!(refused, "{text}");
    assert!(diverged, "{text}");
    assert!(
        text.contains(&format!("keeping the last good commit {good}")),
        "{text}"
    );
    assert_eq!(meta(r.port)["commit"], good);
    assert!(origin_of(r.port).unwrap().contains("192.0.2.71"));
}

// ------------------------------------------------------------ HTTP token

/// A loopback smart-HTTP git server: `git http-backend` (CGI) behind a
/// small HTTP/1.1 front that demands Basic authentication with `user` and
/// `token`, answering 401 otherwise. Plain HTTP on loopback: the token
/// path is the same as over HTTPS (libgit2 asks for USER_PASS_PLAINTEXT
/// on a 401 either way). Runs until the test ends (its thread blocks in
/// accept; the listener goes with the process).
fn http_git_server(root: &Path, user: &str, token: &str) -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let root = root.to_owned();
    let expected = format!("Basic {}", base64(format!("{user}:{token}").as_bytes()));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                continue;
            }
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let line = line.trim_end().to_owned();
                if line.is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                }
            }
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let mut body = Vec::new();
            if let Some(len) = header("content-length") {
                body.resize(len.parse().unwrap(), 0);
                reader.read_exact(&mut body).unwrap();
            } else if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
                loop {
                    let mut size = String::new();
                    reader.read_line(&mut size).unwrap();
                    let n = usize::from_str_radix(size.trim(), 16).unwrap();
                    let mut chunk = vec![0; n + 2];
                    reader.read_exact(&mut chunk).unwrap();
                    if n == 0 {
                        break;
                    }
                    body.extend_from_slice(&chunk[..n]);
                }
            }
            if header("authorization").as_deref() != Some(expected.as_str()) {
                let _ = stream.write_all(
                    b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\n\
                      Content-Length: 0\r\nConnection: close\r\n\r\n",
                );
                continue;
            }
            let mut parts = request_line.split_whitespace();
            let method = parts.next().unwrap_or_default().to_owned();
            let target = parts.next().unwrap_or_default().to_owned();
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let mut cgi = Command::new("git")
                .arg("http-backend")
                .env("GIT_PROJECT_ROOT", &root)
                .env("GIT_HTTP_EXPORT_ALL", "1")
                .env("REQUEST_METHOD", &method)
                .env("PATH_INFO", path)
                .env("QUERY_STRING", query)
                .env("CONTENT_TYPE", header("content-type").unwrap_or_default())
                .env("CONTENT_LENGTH", body.len().to_string())
                .env("REMOTE_USER", "x")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            cgi.stdin.take().unwrap().write_all(&body).unwrap();
            let out = cgi.wait_with_output().unwrap().stdout;
            let split = out
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|i| (i, 4))
                .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)))
                .unwrap();
            let cgi_headers = String::from_utf8_lossy(&out[..split.0]).into_owned();
            let payload = &out[split.0 + split.1..];
            let mut status = "200 OK".to_owned();
            let mut response = String::new();
            for line in cgi_headers.lines() {
                match line.split_once(':') {
                    Some(("Status", s)) => s.trim().clone_into(&mut status),
                    Some(_) => {
                        response.push_str(line.trim_end());
                        response.push_str("\r\n");
                    }
                    None => {}
                }
            }
            let head = format!(
                "HTTP/1.1 {status}\r\n{response}Content-Length: {}\r\nConnection: close\r\n\r\n",
                payload.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(payload);
        }
    });
    port
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &x)| acc | (u32::from(x) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[test]
fn pull_over_http_with_the_token_from_the_environment() {
    let r = harness::redis(&[]);
    let upstream = config(r.port, "http://192.0.2.81");
    upstream.commit("first");
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("config.git");
    let clone = dir.path().join("work");
    git(
        dir.path(),
        &[
            "clone",
            "-q",
            "--bare",
            upstream.path().to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    git(
        dir.path(),
        &[
            "clone",
            "-q",
            bare.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    let port = http_git_server(dir.path(), "x-access-token", "s3cret-token");
    let url = format!("http://127.0.0.1:{port}/config.git");
    git(&clone, &["remote", "set-url", "origin", &url]);
    set_origin(&upstream, "http://192.0.2.82");
    git(upstream.path(), &["commit", "-qam", "second"]);
    git(
        upstream.path(),
        &["push", "-q", bare.to_str().unwrap(), "main"],
    );
    let second = head(upstream.path());

    // No token: one line saying which variable to set; nothing applied.
    let out = run(&clone, PULL, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains("the server asks for a token; set EDGEFORM_GIT_TOKEN"),
        "{}",
        errors[0]
    );
    // A wrong token: offered once, refused, no loop.
    let out = run(&clone, PULL, &[("EDGEFORM_GIT_TOKEN", "wrong")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        error_lines(&out)[0].contains("the credentials offered were refused"),
        "{}",
        stderr(&out)
    );
    assert_eq!(dbsize(r.port), 0, "nothing was applied");
    // The right one.
    let out = run(&clone, PULL, &[("EDGEFORM_GIT_TOKEN", "s3cret-token")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(meta(r.port)["commit"], second);
    assert!(origin_of(r.port).unwrap().contains("192.0.2.82"));
}

/// The reconcile daemon in `dir` with `args`, its log in `log`.
fn daemon(dir: &Path, args: &[&str], log: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(args)
        .current_dir(dir)
        .env("EDGEFORM_STATE_DIR", state_dir(dir))
        .env("NO_COLOR", "1")
        .env_remove("EDGEFORM_SSH_KEY")
        .env_remove("EDGEFORM_GIT_TOKEN")
        .env_remove("SSH_AUTH_SOCK")
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Wait up to 30 s for `done`; the log in the panic.
fn wait_until(log: &Path, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A restarted daemon remembers the last good signed commit (the state
/// directory): with an unsigned commit on HEAD, it pushes the last good
/// commit to a target that lost everything, never the unsigned one.
#[test]
fn a_restarted_daemon_pushes_the_last_good_commit_while_head_is_unsigned() {
    let r = harness::redis(&[]);
    let keys = tempfile::tempdir().unwrap();
    let (alice, alice_pub) = keypair(keys.path(), "alice");
    let allowed = keys.path().join("allowed_signers");
    std::fs::write(&allowed, format!("alice@example.net {alice_pub}\n")).unwrap();
    let f = config(r.port, "http://192.0.2.81");
    git(f.path(), &["init", "-q", "-b", "main"]);
    let good = signed_commit(f.path(), &alice, "signed");
    let args = [
        "reconcile",
        "--sync-every",
        "1s",
        "--heal-every",
        "1s",
        "--require-signed-by",
        allowed.to_str().unwrap(),
    ];
    let logs = tempfile::tempdir().unwrap();
    let first = logs.path().join("first.log");
    let mut d = daemon(f.path(), &args, &first);
    // Applied, and kept as the last good commit (written just after the
    // apply's report).
    let kept = state_dir(f.path()).join("last-good-commit");
    wait_until(&first, "the signed commit applied and kept", || {
        meta(r.port).get("commit") == Some(&good)
            && std::fs::read_to_string(&kept).is_ok_and(|t| t.trim() == good)
    });
    let _ = d.kill();
    let _ = d.wait();

    // HEAD moves to an unsigned commit; the target loses everything.
    set_origin(&f, "http://192.0.2.99");
    git(f.path(), &["commit", "-qam", "unsigned"]);
    let unsigned = head(f.path());
    redis::cmd("FLUSHALL").exec(&mut con(r.port)).unwrap();

    let second = logs.path().join("second.log");
    let mut d = daemon(f.path(), &args, &second);
    wait_until(&second, "the last good commit pushed again", || {
        meta(r.port).get("commit") == Some(&good)
    });
    // A few more runs: still the last good commit, never the unsigned one.
    std::thread::sleep(Duration::from_millis(2500));
    let _ = d.kill();
    let _ = d.wait();
    let log = std::fs::read_to_string(&second).unwrap();
    assert_eq!(meta(r.port).get("commit"), Some(&good), "{log}");
    assert!(origin_of(r.port).unwrap().contains("192.0.2.81"), "{log}");
    assert!(
        log.contains(&unsigned),
        "the refusal names the commit: {log}"
    );
    assert!(
        !log.contains("only this commit's signature was verified"),
        "the restarted daemon knew its last good commit: {log}"
    );
}
