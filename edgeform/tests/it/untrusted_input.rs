//! Hostile input, compiler side: special files
//! and links in the repository, secrets in URLs, origins as written,
//! capped snippets.

use std::os::unix::fs::symlink;
use std::process::Command;
use std::time::Duration;

use crate::util::{BASE, Fixture, edgeform, git, stderr, stdout};

/// A value no output may contain: it is in the environment of every
/// `edgeform` these tests run.
const CANARY: &str = "canary-7f3e9c-not-for-output";

fn run(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("EDGEFORM_TEST_CANARY", CANARY)
        .output()
        .unwrap()
}

fn all_output(o: &std::process::Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn codes_for(f: &Fixture, file: &str) -> Vec<&'static str> {
    f.check()
        .diagnostics
        .iter()
        .filter(|d| &*d.file == file)
        .map(|d| d.code)
        .collect()
}

#[test]
fn link_to_proc_environ_is_refused_and_never_printed() {
    let f = Fixture::with(&[]);
    f.commit("base");
    symlink("/proc/self/environ", f.path().join("sites/env.yaml")).unwrap();
    let out = run(f.path(), &["check"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(!text.contains(CANARY), "the environment leaked:\n{text}");
    assert!(
        text.contains("sites/env.yaml") && text.contains("symbolic link"),
        "{text}"
    );
    for format in ["json", "github"] {
        let out = run(f.path(), &["check", "--format", format]);
        assert!(!all_output(&out).contains(CANARY));
        assert!(all_output(&out).contains("not-a-file"));
    }
    // The PR comment of a pull request that adds the link.
    let out = run(
        f.path(),
        &["diff", "--base", "HEAD", "--format", "markdown"],
    );
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(!text.contains(CANARY), "the environment leaked:\n{text}");
    assert!(text.contains("sites/env.yaml"), "{text}");
}

#[test]
fn link_to_an_outside_valid_site_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("b.yaml"),
        "host: b.example.com\norigin: http://192.0.2.2\n",
    )
    .unwrap();
    let f = Fixture::with(&[]);
    symlink(outside.path().join("b.yaml"), f.path().join("sites/b.yaml")).unwrap();
    let checked = f.check();
    assert!(!checked.is_valid());
    assert_eq!(codes_for(&f, "sites/b.yaml"), ["not-a-file"]);
    // A link to a folder inside sites/ is not followed either.
    std::fs::remove_file(f.path().join("sites/b.yaml")).unwrap();
    symlink(outside.path(), f.path().join("sites/more")).unwrap();
    assert_eq!(codes_for(&f, "sites/more"), ["not-a-file"]);
    // A linked cluster.yaml.
    std::fs::remove_file(f.path().join("sites/more")).unwrap();
    std::fs::write(outside.path().join("c.yaml"), "name: x\n").unwrap();
    symlink(outside.path().join("c.yaml"), f.path().join("cluster.yaml")).unwrap();
    assert_eq!(codes_for(&f, "cluster.yaml"), ["not-a-file"]);
}

#[test]
fn symlinked_sites_folder_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("a.yaml"),
        "host: a.example.com\norigin: http://192.0.2.1\n",
    )
    .unwrap();
    let f = Fixture::empty();
    f.write_all(&BASE[1..]);
    symlink(outside.path(), f.path().join("sites")).unwrap();
    let checked = f.check();
    assert!(!checked.is_valid());
    let d = checked
        .diagnostics
        .iter()
        .find(|d| &*d.file == "sites")
        .expect("the linked folder is named");
    assert_eq!(d.code, "not-a-file");
    let out = run(f.path(), &["check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(all_output(&out).contains("sites"));
}

/// `check` of `f` in a thread, failing the test after 20 s (a hang).
fn check_within(f: &Fixture) -> compiler::Checked {
    let root = f.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let repo = compiler::load::from_dir(&root).unwrap();
        let _ = tx.send(compiler::check(&repo));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("check hung on a special file")
}

#[test]
fn fifo_and_dev_zero_are_refused_without_reading() {
    let f = Fixture::with(&[]);
    let fifo = f.path().join("sites/f.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    symlink("/dev/zero", f.path().join("sites/z.yaml")).unwrap();
    let checked = check_within(&f);
    assert!(!checked.is_valid());
    let by_file = |file: &str| {
        checked
            .diagnostics
            .iter()
            .find(|d| &*d.file == file)
            .unwrap_or_else(|| panic!("{file} not reported"))
            .clone()
    };
    let d = by_file("sites/f.yaml");
    assert_eq!(d.code, "not-a-file");
    assert!(d.message.contains("fifo"), "{}", d.message);
    assert_eq!(by_file("sites/z.yaml").code, "not-a-file");
    // Also through the binary, which must exit rather than hang.
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .arg("check")
        .current_dir(f.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(1));
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("edgeform check hung on a fifo");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_file_over_the_size_cap_is_refused_unread() {
    let f = Fixture::with(&[]);
    let big = std::fs::File::create(f.path().join("sites/big.yaml")).unwrap();
    // Sparse: nothing is written, the length is past the cap.
    big.set_len(compiler::load::MAX_FILE_BYTES + 1).unwrap();
    drop(big);
    assert_eq!(codes_for(&f, "sites/big.yaml"), ["file-too-large"]);
}

/// A folder nested deeper than the loader reads is refused as one entry,
/// in the working tree and committed (a committed tree nested 200,000
/// deep overflowed libgit2's recursive walk).
#[test]
fn a_folder_nested_too_deep_is_refused_in_the_tree_and_committed() {
    let f = Fixture::with(&[]);
    let mut dir = f.path().join("sites");
    for _ in 0..40 {
        dir.push("d");
    }
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("x.yaml"),
        "host: x.example.com\norigin: http://192.0.2.2\n",
    )
    .unwrap();
    let deep = format!("sites/{}", vec!["d"; compiler::load::MAX_DEPTH].join("/"));
    let refused = |checked: &compiler::Checked| {
        checked
            .diagnostics
            .iter()
            .filter(|d| d.code == "not-a-file")
            .map(|d| d.file.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(refused(&f.check()), std::slice::from_ref(&deep));
    f.commit("deep");
    let repo = compiler::load::from_rev(f.path(), "HEAD").unwrap();
    assert_eq!(refused(&compiler::check(&repo)), [deep]);
}

/// A committed folder with the same content as another (one tree under two
/// names: a small commit can nest one subtree under millions of paths) is
/// read once; a repeated folder without config files is no problem.
#[test]
fn a_committed_folder_repeating_another_is_read_once() {
    let f = Fixture::with(&[]);
    for dir in ["sites/a", "sites/b", "sites/c", "sites/d"] {
        std::fs::create_dir_all(f.path().join(dir)).unwrap();
    }
    let site = "host: x.example.com\norigin: http://192.0.2.2\n";
    std::fs::write(f.path().join("sites/a/x.yaml"), site).unwrap();
    std::fs::write(f.path().join("sites/b/x.yaml"), site).unwrap();
    std::fs::write(f.path().join("sites/c/README.md"), "notes\n").unwrap();
    std::fs::write(f.path().join("sites/d/README.md"), "notes\n").unwrap();
    f.commit("repeated");
    let repo = compiler::load::from_rev(f.path(), "HEAD").unwrap();
    let refused: Vec<(String, &str)> = compiler::check(&repo)
        .diagnostics
        .iter()
        .filter(|d| d.code == "not-a-file")
        .map(|d| (d.file.to_string(), d.code))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        ["sites/a", "sites/b"].contains(&refused[0].0.as_str()),
        "{refused:?}"
    );
    let read: Vec<&str> = repo
        .sources
        .iter()
        .map(|s| &*s.path)
        .filter(|p| p.ends_with("x.yaml"))
        .collect();
    assert_eq!(read.len(), 1, "{read:?}");
}

/// A file name with control characters (a forged log line, a cleared
/// screen) is shown escaped.
#[test]
fn control_characters_in_a_file_name_never_reach_the_terminal() {
    let f = Fixture::with(&[]);
    let name = "x\u{1b}[2J\u{1b}[31mFORGED\nerror: y.yaml";
    std::fs::write(f.path().join("sites").join(name), "host: [\n").unwrap();
    let out = run(f.path(), &["check"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("x\\u{1b}[2J"), "{text}");
}

/// A file whose name is not UTF-8 is refused, in the working tree and
/// committed, never silently left out of what is checked and pushed.
#[test]
fn a_file_whose_name_is_not_utf8_is_refused_not_skipped() {
    use std::os::unix::ffi::OsStrExt as _;
    let f = Fixture::with(&[]);
    let name = std::ffi::OsStr::from_bytes(b"bad\xff.yaml");
    std::fs::write(f.path().join("sites").join(name), "host: BAD!!\n").unwrap();
    let out = run(f.path(), &["check"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("sites/bad\u{fffd}.yaml") && text.contains("not valid UTF-8"),
        "{text}"
    );
    f.commit("a name git keeps as bytes");
    std::fs::remove_file(f.path().join("sites").join(name)).unwrap();
    let out = run(f.path(), &["--rev", "HEAD", "check"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("encoding"), "{text}");
}

/// One blob committed under many names (a tree object of a few hundred
/// KB can name it 100,000 times) is read once: the other names are each
/// refused as a repeat of the first, never parsed.
#[test]
fn a_blob_committed_under_many_names_is_read_once() {
    let f = Fixture::with(&[]);
    f.commit("base");
    let site = "host: many.example.com\norigin: http://192.0.2.1\n";
    for i in 0..3 {
        std::fs::write(f.path().join(format!("sites/m{i}.yaml")), site).unwrap();
    }
    f.commit("one site three times");
    let out = run(f.path(), &["--rev", "HEAD", "check", "--format", "json"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(text.matches("repeated-file").count(), 2, "{text}");
    assert!(
        text.contains("the same content as `sites/m0.yaml`"),
        "{text}"
    );
}

#[test]
fn committed_links_are_refused_with_rev() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("b.yaml"),
        "host: b.example.com\norigin: http://192.0.2.2\n",
    )
    .unwrap();
    let f = Fixture::with(&[]);
    symlink("/proc/self/environ", f.path().join("sites/env.yaml")).unwrap();
    symlink(outside.path().join("b.yaml"), f.path().join("sites/b.yaml")).unwrap();
    symlink("/dev/zero", f.path().join("nodes/z.yaml")).unwrap();
    f.commit("links");
    let repo = compiler::load::from_rev(f.path(), "HEAD").unwrap();
    let checked = compiler::check(&repo);
    assert!(!checked.is_valid());
    for file in ["sites/env.yaml", "sites/b.yaml", "nodes/z.yaml"] {
        let d = checked
            .diagnostics
            .iter()
            .find(|d| &*d.file == file)
            .unwrap_or_else(|| panic!("{file} not reported"));
        assert_eq!(d.code, "not-a-file");
    }
    let out = run(f.path(), &["check", "--rev", "HEAD"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !text.contains(CANARY) && text.contains("symbolic link"),
        "{text}"
    );

    // A committed link in place of the sites/ folder.
    let g = Fixture::empty();
    g.write_all(&BASE[1..]);
    symlink(outside.path(), g.path().join("sites")).unwrap();
    g.commit("linked folder");
    let repo = compiler::load::from_rev(g.path(), "HEAD").unwrap();
    let checked = compiler::check(&repo);
    assert!(
        checked
            .diagnostics
            .iter()
            .any(|d| &*d.file == "sites" && d.code == "not-a-file"),
        "{:?}",
        checked.diagnostics
    );
    let _ = git;
}

/// A committed git submodule (gitlink) where config is read, and an entry
/// of the wrong kind (a file named `sites`, a folder named
/// `cluster.yaml`), are refused by name: never silently left out, which
/// would drop their sites or fall back to every cluster default.
#[test]
fn submodules_and_entries_of_the_wrong_kind_are_refused_by_name() {
    for gitlink in ["sites/b.yaml", "sites/more", "cluster.yaml"] {
        let f = Fixture::with(BASE);
        let first = f.commit("base");
        git(
            f.path(),
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{first},{gitlink}"),
            ],
        );
        git(f.path(), &["commit", "-q", "-m", "a submodule"]);
        let repo = compiler::load::from_rev(f.path(), "HEAD").unwrap();
        let checked = compiler::check(&repo);
        let d = checked
            .diagnostics
            .iter()
            .find(|d| &*d.file == gitlink)
            .unwrap_or_else(|| panic!("{gitlink}: {:?}", checked.diagnostics));
        assert_eq!(d.code, "not-a-file", "{gitlink}");
        assert!(d.message.contains("git submodule"), "{}", d.message);
        assert!(!checked.is_valid(), "{gitlink}");
    }
    // A committed `sites` submodule in place of the folder.
    let f = Fixture::empty();
    f.write_all(&BASE[1..]);
    let first = f.commit("base");
    git(
        f.path(),
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{first},sites"),
        ],
    );
    git(f.path(), &["commit", "-q", "-m", "sites as a submodule"]);
    let out = run(f.path(), &["check", "--rev", "HEAD"]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(
        all_output(&out).contains("git submodule"),
        "{}",
        all_output(&out)
    );
    // A checked-out submodule in the working tree: a folder with its own
    // `.git`, refused as `--rev` refuses the gitlink.
    let f = Fixture::with(BASE);
    std::fs::create_dir_all(f.path().join("sites/vendor")).unwrap();
    std::fs::write(
        f.path().join("sites/vendor/.git"),
        "gitdir: ../../.git/modules/v\n",
    )
    .unwrap();
    std::fs::write(
        f.path().join("sites/vendor/v.yaml"),
        "host: v.example.com\norigin: http://192.0.2.9\n",
    )
    .unwrap();
    let checked = compiler::check(&compiler::load::from_dir(f.path()).unwrap());
    let d = checked
        .diagnostics
        .iter()
        .find(|d| &*d.file == "sites/vendor")
        .unwrap_or_else(|| panic!("{:?}", checked.diagnostics));
    assert_eq!(d.code, "not-a-file");
    assert!(d.message.contains("git submodule"), "{}", d.message);
    // The wrong kind, in the working tree and committed.
    let f = Fixture::empty();
    f.write_all(&BASE[1..]);
    f.write("sites", b"host: a.example.com\n");
    std::fs::create_dir_all(f.path().join("cluster.yaml")).unwrap();
    std::fs::write(f.path().join("cluster.yaml/x.yaml"), "name: x\n").unwrap();
    f.commit("wrong kinds");
    for (repo, how) in [
        (compiler::load::from_dir(f.path()).unwrap(), "working tree"),
        (compiler::load::from_rev(f.path(), "HEAD").unwrap(), "--rev"),
    ] {
        let checked = compiler::check(&repo);
        for (file, says) in [
            ("sites", "a file where a folder"),
            ("cluster.yaml", "a folder where a config file"),
        ] {
            let d = checked
                .diagnostics
                .iter()
                .find(|d| &*d.file == file)
                .unwrap_or_else(|| panic!("{how}: {file}: {:?}", checked.diagnostics));
            assert_eq!(d.code, "not-a-file", "{how}: {file}");
            assert!(d.message.contains(says), "{how}: {}", d.message);
        }
    }
}

#[test]
fn origins_with_control_characters_are_refused_at_their_position() {
    for (origin, what) in [
        (r#""http://203.0.113.10\r\n""#, "carriage return"),
        (r#""http://203.0.113.10\n""#, "line feed"),
        (r#""http://203.0.113.10\0""#, "NUL"),
        (r#""http://203.0.\t113.10""#, "tab"),
        (r#""http://203.0.113.10\\x""#, "backslash"),
        (r#""http://203.0.113.10 ""#, "space"),
    ] {
        let f = Fixture::with(&[(
            "sites/a.yaml",
            &format!("host: a.example.com\norigin: {origin}\n"),
        )]);
        let checked = f.check();
        assert!(!checked.is_valid(), "{origin} passed");
        let d = &checked.diagnostics[0];
        assert_eq!(
            (d.code, &*d.file, d.span.line, d.span.column),
            ("invalid-url", "sites/a.yaml", 2, 9),
            "{origin}: {d:?}"
        );
        assert!(d.message.contains(what), "{origin}: {}", d.message);
        assert!(!d.message.contains(['\r', '\n', '\0', '\t']));
    }
    for origin in [
        "http://user@203.0.113.10",
        "http://203.0.113.10/",
        "http://203.0.113.10?a=b",
        "http://203.0.113.10#f",
    ] {
        let f = Fixture::with(&[(
            "sites/a.yaml",
            &format!("host: a.example.com\norigin: \"{origin}\"\n"),
        )]);
        assert!(!f.check().is_valid(), "{origin} passed");
    }
}

#[test]
fn redis_url_with_a_non_numeric_database_is_refused() {
    let node = |url: &str| {
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [198.51.100.1]\nredis: {{url: \"{url}\"}}\n"
        )
    };
    for (url, ok) in [
        ("redis://h/abc", false),
        ("redis://h/1x", false),
        ("redis://h/0/1", false),
        ("redis://h/0", true),
        ("redis://h:6379/15", true),
        ("redis://h", true),
        ("redis://h/", true),
    ] {
        let f = Fixture::with(&[("nodes/edge-1.yaml", &node(url))]);
        let checked = f.check();
        assert_eq!(checked.is_valid(), ok, "{url}: {:?}", checked.diagnostics);
        if !ok {
            assert_eq!(checked.diagnostics[0].code, "invalid-url");
        }
    }
}

fn node_with_redis(redis: &str) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.1]\nredis: {redis}\n"
    )
}

#[test]
fn secrets_in_redis_urls_and_sentinels_are_never_shown() {
    let secret = "hunter2-s3cret";
    for redis in [
        format!("{{url: \"redis://10.0.0.5:6379?password={secret}\"}}"),
        format!("{{url: \"redis://10.0.0.5:6379/0?db=1&Password={secret}\"}}"),
        format!("{{url: \"redis://admin:{secret}@10.0.0.5:6379\"}}"),
        format!("{{url: \"rediss://:{secret}@10.0.0.5\"}}"),
        format!("{{url: \"redis://admin:{secret}@[bad\"}}"),
        format!("{{sentinels: [\"admin:{secret}@10.0.0.5:26379\"], master: m}}"),
        format!("{{sentinels: [\"10.0.0.6:26379\", \"{secret}@10.0.0.5:26379\"], master: m}}"),
        format!("{{url: \"redis://10.0.0.5\", password: {secret}}}"),
    ] {
        let f = Fixture::with(&[("nodes/edge-1.yaml", &node_with_redis(&redis))]);
        let checked = f.check();
        assert!(
            checked
                .diagnostics
                .iter()
                .any(|d| d.code == "inline-secret"),
            "{redis}: {:?}",
            checked.diagnostics
        );
        for args in [
            &["check"][..],
            &["check", "--format", "json"],
            &["check", "--format", "github"],
            &["plan"],
            &["apply", "--yes"],
            &["build", "--out", "out"],
        ] {
            let out = edgeform(f.path(), args);
            let text = all_output(&out);
            assert_eq!(out.status.code(), Some(1), "{redis} {args:?}: {text}");
            assert!(
                !text.contains(secret) && !text.contains("hunter2"),
                "{redis} {args:?} shows the secret:\n{text}"
            );
            if args == ["check"] {
                assert!(text.contains("inline-secret"), "{text}");
                assert!(text.contains("nodes/edge-1.yaml:6:"), "{text}");
            }
        }
    }
}

#[test]
fn snippets_of_huge_values_are_capped() {
    let huge = "a".repeat(5 << 20);
    for (file, at) in [
        (
            format!("host: a.example.com\norigin: \"http://192.0.2.1/{huge}\"\n"),
            "sites/a.yaml:2:9",
        ),
        (
            format!("host: a.example.com\norigin: http://192.0.2.1\nbogus: {huge}\n"),
            "sites/a.yaml:3:1",
        ),
    ] {
        let f = Fixture::with(&[("sites/a.yaml", &file)]);
        for format in ["human", "json", "github"] {
            let out = edgeform(f.path(), &["check", "--format", format]);
            assert_eq!(out.status.code(), Some(1));
            let n = out.stdout.len() + out.stderr.len();
            assert!(n < 20_000, "{format}: {n} bytes of output");
        }
        let out = edgeform(f.path(), &["check"]);
        let text = all_output(&out);
        // The real position is still named.
        assert!(text.contains(at), "{text}");
        assert!(text.contains('…'), "{text}");
    }
}

#[test]
fn long_line_snippet_points_at_the_real_column() {
    let pad = "x".repeat(1000);
    let f = Fixture::with(&[(
        "sites/a.yaml",
        &format!("host: a.example.com\norigin: http://192.0.2.1\n# {pad}\ncached: yes\n"),
    )]);
    let out = edgeform(f.path(), &["check"]);
    let text = all_output(&out);
    assert!(text.contains("sites/a.yaml:4:9"), "{text}");
    assert!(text.lines().all(|l| l.chars().count() < 400), "{text}");
}

// Usage errors exit 64.
#[test]
fn huge_numeric_flags_are_usage_errors_without_a_panic() {
    let f = Fixture::with(&[]);
    let huge = "18446744073709551615";
    for args in [
        &["apply", "--yes", "--parallel", huge][..],
        &["plan", "--parallel", huge],
        &["reconcile", "--once", "sync", "--parallel", huge],
        &["apply", "--yes", "--parallel", "0"],
        &["apply", "--yes", "--parallel", "1025"],
        &["purge", "--site", "a.example.com", "--all", "--wait", huge],
        &["purge", "--site", "a.example.com", "--all", "--wait", "0"],
        &["exec", "--node", "edge-1", "--action", "x", "--wait", huge],
        &[
            "exec",
            "--node",
            "edge-1",
            "--action",
            "x",
            "--ttl",
            "100000000h",
        ],
        &["exec", "--node", "edge-1", "--action", "x", "--ttl", "0s"],
        &["apply", "--yes", "--lock-wait", "99999999999999999h"],
        &["reconcile", "--sync-every", "0s"],
        &["reconcile", "--heal-every", "400d"],
        &["check", "--no-such-flag"],
        &["no-such-command"],
        &[],
    ] {
        let out = edgeform(f.path(), args);
        let text = all_output(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {text}");
        assert!(!text.contains("panicked"), "{args:?}: {text}");
        assert!(text.contains("error"), "{args:?}: {text}");
    }
    // Help and version are not errors; the limits are listed.
    let out = edgeform(f.path(), &["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("64 usage error"));
    assert_eq!(edgeform(f.path(), &["--version"]).status.code(), Some(0));
    // In range still works.
    let out = edgeform(f.path(), &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

fn redis_con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn lock_of(port: u16) -> Option<String> {
    redis::cmd("GET")
        .arg("edgeform:lock")
        .query(&mut redis_con(port))
        .unwrap()
}

fn set_lock(port: u16, token: &str) {
    redis::cmd("SET")
        .arg("edgeform:lock")
        .arg(token)
        .arg("PX")
        .arg(300_000)
        .exec(&mut redis_con(port))
        .unwrap();
}

fn redis_repo(port: u16) -> Fixture {
    let f = Fixture::with(&[(
        "nodes/edge-1.yaml",
        &node_with_redis(&format!("{{url: \"redis://127.0.0.1:{port}\"}}")),
    )]);
    f.commit("base");
    f
}

#[test]
fn a_killed_applys_lock_is_taken_over_at_once() {
    let r = harness::redis(&[]);
    let f = redis_repo(r.port);
    // A real apply that stops while holding the lock (test hook), killed
    // with SIGKILL: it cannot release the lock.
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["apply", "--yes"])
        .current_dir(f.path())
        .env("EDGEFORM_TEST_HOLD_LOCK_MS", "600000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let token = loop {
        if let Some(t) = lock_of(r.port) {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the apply never locked"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(token.contains(&format!(":{}:", child.id())), "{token}");
    child.kill().unwrap();
    // Not reaped yet: a zombie, which is dead too.
    let start = std::time::Instant::now();
    let out = edgeform(f.path(), &["apply", "--yes", "--lock-wait", "0s"]);
    let took = start.elapsed();
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("took over the apply lock"), "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let _ = child.wait();
    assert_eq!(lock_of(r.port), None, "released after the apply");
    let generation: String = redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("generation")
        .query(&mut redis_con(r.port))
        .unwrap();
    assert_eq!(generation, "1");

    // The same once the killed process is reaped (no such pid). A change
    // (a no-op apply answers from the meta without taking the lock).
    f.write(
        "sites/s99999.yaml",
        b"host: s99999.example.com\norigin: http://192.0.2.9\n",
    );
    f.commit("one more site");
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["apply", "--yes", "--force"])
        .current_dir(f.path())
        .env("EDGEFORM_TEST_HOLD_LOCK_MS", "600000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    while lock_of(r.port).is_none() {
        assert!(std::time::Instant::now() < deadline + Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let out = edgeform(f.path(), &["apply", "--yes", "--lock-wait", "0s"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

#[test]
fn live_or_remote_holders_are_not_taken_over_and_unlock_needs_force() {
    let r = harness::redis(&[]);
    let f = redis_repo(r.port);
    // Another host: not provable.
    set_lock(r.port, "other-host:1:2:3:4");
    let out = edgeform(f.path(), &["apply", "--yes", "--lock-wait", "200ms"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        all_output(&out).contains("unlock --node"),
        "{}",
        all_output(&out)
    );
    let out = edgeform(f.path(), &["unlock", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(stderr(&out).contains("another host"), "{}", stderr(&out));
    assert_eq!(lock_of(r.port).as_deref(), Some("other-host:1:2:3:4"));
    let out = edgeform(f.path(), &["unlock", "--node", "edge-1", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_eq!(lock_of(r.port), None);
    let out = edgeform(f.path(), &["unlock", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("not locked"));

    // A running process on this host (this test): alive.
    let me = control::lock::Holder::current();
    set_lock(r.port, &me.token(7));
    let out = edgeform(f.path(), &["apply", "--yes", "--lock-wait", "200ms"]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    let out = edgeform(f.path(), &["unlock", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("running"), "{}", stderr(&out));

    // Its pid with another start time: the pid was reused, dead.
    let mut reused = me.clone();
    reused.start = reused.start.map(|s| s + 1);
    set_lock(r.port, &reused.token(7));
    let out = edgeform(f.path(), &["unlock", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(stdout(&out).contains("newer process"), "{}", stdout(&out));
    assert_eq!(lock_of(r.port), None);
}

#[test]
fn heal_repairs_binary_keys_and_values_and_the_rest_of_the_drift() {
    let r = harness::redis(&[]);
    let f = redis_repo(r.port);
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.2\n",
    );
    f.commit("two sites");
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let mut c = redis_con(r.port);
    // A binary key nobody manages, a binary value on a managed key, a
    // binary manifest entry, and ordinary drift beside them.
    redis::cmd("MSET")
        .arg(b"site:\xff\xfe.example.com".as_slice())
        .arg(b"{}".as_slice())
        .arg("site:a.example.com")
        .arg(b"\xc3\x28 not utf-8".as_slice())
        .arg("site:rogue.example.com")
        .arg("{}")
        .exec(&mut c)
        .unwrap();
    redis::cmd("DEL")
        .arg("site:b.example.com")
        .exec(&mut c)
        .unwrap();
    redis::cmd("HSET")
        .arg("edgeform:manifest")
        .arg(b"site:\x80".as_slice())
        .arg(b"\x80".as_slice())
        .exec(&mut c)
        .unwrap();

    let out = edgeform(f.path(), &["reconcile", "--once", "heal"]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    for (key, kind) in [
        (r"site:\xff\xfe.example.com", "unmanaged"),
        ("site:a.example.com", "changed"),
        ("site:b.example.com", "missing"),
        ("site:rogue.example.com", "unmanaged"),
        ("edgeform:manifest", "manifest"),
    ] {
        assert!(
            log.contains(&format!("key={key} kind=\"{kind}\"")),
            "{key} {kind}:\n{log}"
        );
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(b"site:\xff\xfe.example.com".as_slice())
        .query(&mut c)
        .unwrap();
    assert!(!exists, "the binary key was removed");
    let a: String = redis::cmd("GET")
        .arg("site:a.example.com")
        .query(&mut c)
        .unwrap();
    assert!(a.contains("192.0.2.1"), "{a}");
    let out = edgeform(f.path(), &["reconcile", "--once", "heal"]);
    assert!(stderr(&out).contains("heal: no drift"), "{}", stderr(&out));
    assert_eq!(
        edgeform(f.path(), &["plan", "--detailed-exitcode"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn import_reports_binary_entries_by_key_and_goes_on_with_allow_lossy() {
    let r = harness::redis(&[]);
    let f = Fixture::empty();
    f.write_all(&BASE[1..]);
    f.write(
        "nodes/edge-1.yaml",
        node_with_redis(&format!("{{url: \"redis://127.0.0.1:{}\"}}", r.port)).as_bytes(),
    );
    let good = r#"{"origin":"http://192.0.2.7","cached":false,"geo_mode":"off","geo_codes":"","ip_mode":"off","ip_list":"","rate_mode":"off","waf_mode":"off","cors_mode":"off","hotlink_mode":"off","cache_rules":[],"edge_rules":[]}"#;
    redis::cmd("MSET")
        .arg("site:good.example.com")
        .arg(good)
        .arg(b"site:\xff.example.com".as_slice())
        .arg(good)
        .arg("site:bin.example.com")
        .arg(b"{\"origin\":\"\xff\"}".as_slice())
        .exec(&mut redis_con(r.port))
        .unwrap();
    let out = edgeform(f.path(), &["import", "--node", "edge-1", "--out", "."]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(r"error: site:\xff.example.com: the key is not UTF-8"),
        "{err}"
    );
    assert!(
        err.contains("error: site:bin.example.com: the value is not UTF-8"),
        "{err}"
    );
    assert!(!f.path().join("sites").exists(), "nothing written");
    let out = edgeform(
        f.path(),
        &["import", "--node", "edge-1", "--out", ".", "--allow-lossy"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains(r"warning: site:\xff.example.com"), "{err}");
    assert!(f.path().join("sites/good.example.com.yaml").exists());
    assert!(!f.path().join("sites/bin.example.com.yaml").exists());
}

#[test]
fn rule_regexes_pcre_would_run_badly_are_refused() {
    for (regex, ok) in [
        (r"^(a+)+$", false),
        (r"(a|a)*", false),
        (r"(?R)", false),
        (r"(?1)", false),
        (r"(a)\1", false),
        (r"(?<=a)b", false),
        (r"a{1000}{1000}", false),
        (r"^/api/v[0-9]+/", true),
    ] {
        let f = Fixture::with(&[(
            "sites/a.yaml",
            &format!(
                "host: a.example.com\norigin: http://192.0.2.1\ncache_rules:\n\
                 \x20 - match_type: regex\n    match_value: '{regex}'\n    action: bypass\n"
            ),
        )]);
        let checked = f.check();
        assert_eq!(checked.is_valid(), ok, "{regex}: {:?}", checked.diagnostics);
        if !ok {
            let d = &checked.diagnostics[0];
            assert_eq!(
                (d.code, d.span.line, d.span.column),
                ("invalid-regex", 5, 18),
                "{regex}: {d:?}"
            );
        }
    }
}

// Snippets never carry the file's control characters.
#[test]
fn snippets_escape_terminal_control_sequences() {
    let f = Fixture::with(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\n# \u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\ncached: yes\n",
    )]);
    let out = edgeform(f.path(), &["check"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("sites/a.yaml:3:"), "{text}");
    assert!(
        !text.contains(['\u{1b}', '\u{7}', '\u{9b}']),
        "control characters reached the output: {text:?}"
    );
}

// CRLF files keep their snippets clean.
#[test]
fn crlf_files_show_no_stray_marks() {
    let f = Fixture::with(&[(
        "sites/a.yaml",
        "host: a.example.com\r\norigin: http://192.0.2.1\r\ncached: yes\r\n",
    )]);
    let out = edgeform(f.path(), &["check"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("sites/a.yaml:3:9"), "{text}");
    assert!(text.contains("host: a.example.com\n"), "{text}");
    assert!(!text.contains('?'), "{text}");
}

/// `apply` fails (exit 1) and says `what`.
fn apply_fails_saying(f: &Fixture, what: &str) {
    let out = edgeform(f.path(), &["apply", "--yes"]);
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains(what), "{all}");
}

/// An edge's Redis is hostile: a forged `edgeform:meta` or manifest fails
/// that target loudly (exit 1, the key named), never a panic, a target
/// missing from the results, a raw control character on the terminal, or
/// a key apply never manages deleted as "removed".
#[test]
fn a_hostile_edge_meta_or_manifest_fails_that_target_loudly() {
    let r = harness::redis(&[]);
    let f = Fixture::with(&[(
        "nodes/edge-1.yaml",
        &format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
            r.port
        ),
    )]);
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    // The applied commit, put back after the forged one below.
    let commit: Option<Vec<u8>> = redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("commit")
        .query(&mut con)
        .unwrap();
    let mut cmd = |args: &[&[u8]]| {
        let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
        for a in &args[1..] {
            c.arg(*a);
        }
        let _: redis::Value = c.query(&mut con).unwrap();
    };
    // A change to push, so every run below reads the live state.
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.2\n",
    );

    // A generation that cannot be raised: an error naming it, exit 1.
    cmd(&[
        b"HSET",
        b"edgeform:meta",
        b"generation",
        b"18446744073709551615",
    ]);
    apply_fails_saying(&f, "edgeform:meta generation");
    cmd(&[b"HSET", b"edgeform:meta", b"generation", b"7"]);

    // A commit with a multi-byte character and an escape sequence: shown
    // escaped, cut by character.
    cmd(&[
        b"HSET",
        b"edgeform:meta",
        b"commit",
        b"aaaaaaaaaaa\xc3\xa9\x1b[31mRED",
    ]);
    let out = edgeform(f.path(), &["plan"]);
    assert_ne!(out.status.code(), Some(101), "{}", stderr(&out));
    assert!(!all_output(&out).contains('\u{1b}'), "{}", all_output(&out));
    if let Some(c) = &commit {
        cmd(&[b"HSET", b"edgeform:meta", b"commit", c]);
    } else {
        cmd(&[b"HDEL", b"edgeform:meta", b"commit"]);
    }

    // A manifest record for a key apply never manages (the purge queue):
    // refused, naming the bucket; the key is left alone.
    let queue = edgestate::keys::purge_queue("eu", "edge-1");
    cmd(&[b"RPUSH", queue.as_bytes(), b"{\"id\":\"job-1\"}"]);
    let bucket = edgestate::keys::bucket(queue.as_bytes());
    let mut record = Vec::new();
    edgestate::manifest::push_record(
        &mut record,
        queue.as_bytes(),
        b"a9993e364706816aba3e25717850c26c9cd0d89d",
    );
    let name = edgestate::keys::manifest_bucket(bucket);
    cmd(&[b"APPEND", name.as_bytes(), &record]);
    // Its digest differs from the desired one, so apply reads the bucket.
    cmd(&[
        b"HSET",
        b"edgeform:manifest:buckets",
        format!("{bucket:02x}").as_bytes(),
        b"00000000000000000000000000000000 2",
    ]);
    cmd(&[b"HSET", b"edgeform:meta", b"manifest_digest", b"0"]);
    apply_fails_saying(&f, "no document edgeform pushes");
    let len: usize = redis::cmd("LLEN").arg(&queue).query(&mut con).unwrap();
    assert_eq!(len, 1, "the purge queue is untouched");
}
