//! CLI behaviour: `--rev`, `build` determinism and cleanliness, `diff`
//! exit codes and formats.

use crate::util::{Fixture, edgeform, stderr, stdout};

#[test]
fn rev_reads_a_revision_that_differs_from_the_working_tree() {
    let f = Fixture::with(&[]);
    let first = f.commit("one site");
    // The working tree is now broken, but the revision is not.
    f.write("sites/a.yaml", b"host: a.example.com\n");
    assert_eq!(edgeform(f.path(), &["check"]).status.code(), Some(1));
    assert_eq!(
        edgeform(f.path(), &["check", "--rev", "HEAD"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        edgeform(f.path(), &["check", "--rev", &first[..8]])
            .status
            .code(),
        Some(0)
    );
    // And the other way round: a broken revision, a fixed tree.
    crate::util::git(f.path(), &["commit", "-qam", "broken"]);
    f.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.9\n",
    );
    assert_eq!(edgeform(f.path(), &["check"]).status.code(), Some(0));
    let out = edgeform(f.path(), &["check", "--rev", "HEAD", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("missing-key"));
    // Unknown revision: a clear error, exit 1.
    let out = edgeform(f.path(), &["check", "--rev", "no-such-branch"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no-such-branch"), "{}", stderr(&out));
}

#[test]
fn rev_in_a_subfolder_of_the_git_repository() {
    let f = Fixture::empty();
    f.write_all(&[
        (
            "cdn/sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n",
        ),
        (
            "cdn/nodes/e.yaml",
            "name: e\nroles: [ingest]\nregion: eu\nredis: {url: \"redis://127.0.0.1:1\"}\n",
        ),
    ]);
    f.commit("nested");
    let out = edgeform(
        &f.path().join("cdn"),
        &["build", "--rev", "HEAD", "--out", "../out"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(f.path().join("out/e.json").is_file());
}

#[test]
fn build_is_byte_identical_and_removes_stale_outputs() {
    let f = Fixture::with(&[(
        "nodes/r.yaml",
        "name: r\nroles: [router]\nregion: eu\nlocation: {lat: 50, lon: 5}\nredis: {url: \"redis://127.0.0.1:2\"}\n",
    )]);
    let a = f.path().join("out-a");
    let b = f.path().join("out-b");
    for dir in [&a, &b] {
        let out = edgeform(f.path(), &["build", "--out", dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    for name in ["edge-1.json", "r.json", "r.nginx.conf"] {
        let x = std::fs::read(a.join(name)).unwrap();
        let y = std::fs::read(b.join(name)).unwrap();
        assert_eq!(x, y, "{name}");
    }
    // Every file is a sorted JSON object of string → string.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("edge-1.json")).unwrap()).unwrap();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert!(
        v.as_object()
            .unwrap()
            .values()
            .all(serde_json::Value::is_string)
    );
    // Remove the router: its outputs go, a stranger's file stays.
    std::fs::write(a.join("notes.txt"), "mine").unwrap();
    f.write("nodes/r.yaml", b"");
    let out = edgeform(f.path(), &["build", "--out", a.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!a.join("r.json").exists() && !a.join("r.nginx.conf").exists());
    assert!(a.join("notes.txt").exists() && a.join("edge-1.json").exists());
}

#[test]
fn build_of_an_invalid_repo_writes_nothing() {
    let f = Fixture::with(&[("sites/a.yaml", "host: a.example.com\n")]);
    let out_dir = f.path().join("out");
    let out = edgeform(f.path(), &["build", "--out", out_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!out_dir.exists());
    assert!(
        stderr(&out).contains("nothing was compiled"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn diff_exit_codes_and_formats() {
    let f = Fixture::with(&[]);
    f.commit("base");
    // No change: exit 0.
    let out = edgeform(f.path(), &["diff", "--base", "HEAD"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("No changes"));

    // Change one site, add one, suspend it: exit 2 with details.
    f.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.1\ncached: false\n",
    );
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.2\nsuspended: true\n",
    );
    let out = edgeform(f.path(), &["diff", "--base", "HEAD"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("edge-1 [eu]: 2 added, 1 changed, 0 removed"),
        "{text}"
    );
    assert!(
        text.contains("+ site:b.example.com") && text.contains("+ suspended:b.example.com"),
        "{text}"
    );
    assert!(
        text.contains("-  \"cached\": true,") && text.contains("+  \"cached\": false,"),
        "{text}"
    );

    let out = edgeform(f.path(), &["diff", "--base", "HEAD", "--format", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let t = &v["targets"][0];
    assert_eq!(t["node"], "edge-1");
    assert_eq!(t["added"].as_array().unwrap().len(), 2);
    assert_eq!(t["changed"][0]["key"], "site:a.example.com");
    assert_eq!(t["removed"].as_array().unwrap().len(), 0);

    // Between two revisions, --head.
    crate::util::git(f.path(), &["add", "-A"]);
    crate::util::git(f.path(), &["commit", "-qm", "head"]);
    let out = edgeform(
        f.path(),
        &[
            "diff", "--base", "HEAD~1", "--head", "HEAD", "--format", "markdown",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let md = stdout(&out);
    assert!(
        md.contains("<!-- edgeform-diff -->") && md.contains("```diff"),
        "{md}"
    );
    let out = edgeform(f.path(), &["diff", "--base", "HEAD", "--head", "HEAD"]);
    assert_eq!(out.status.code(), Some(0));

    // Removing the site shows removals; an invalid head is exit 1.
    f.write("sites/b.yaml", b"");
    let out = edgeform(f.path(), &["diff", "--base", "HEAD", "--format", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["targets"][0]["removed"].as_array().unwrap().len(), 2);
    f.write("sites/a.yaml", b"host: a.example.com\n");
    assert_eq!(
        edgeform(f.path(), &["diff", "--base", "HEAD"])
            .status
            .code(),
        Some(1)
    );
    // An unknown base is exit 1 too.
    assert_eq!(
        edgeform(f.path(), &["diff", "--base", "nope"])
            .status
            .code(),
        Some(1)
    );
}

#[test]
fn diff_groups_targets_with_identical_changes() {
    let second = "name: edge-2\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.1}\n\
                  addresses: [198.51.100.2]\nredis: {url: \"redis://127.0.0.1:6380\"}\n";
    let f = Fixture::with(&[("nodes/edge-2.yaml", second)]);
    f.commit("two edges");
    f.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.7\n",
    );
    let out = edgeform(f.path(), &["diff", "--base", "HEAD"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout(&out).contains("edge-1, edge-2 [eu]: 0 added, 1 changed, 0 removed"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn version_names_the_commit() {
    let out = edgeform(std::path::Path::new("."), &["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).starts_with("edgeform 0.0.0 ("),
        "{}",
        stdout(&out)
    );
}

#[test]
fn route_explains_the_decision_as_json() {
    let repo = crate::util::example_repo();
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    // office-2's streamer is down: its viewers fall back to office-1, then origin-pool.
    std::fs::write(
        &health,
        r#"{"nodes":{
            "streamer-office-2":{"online":false,"play_sessions":0,"out_kbit":0,"streams":["cam1"]},
            "ingest-office-1":{"online":true,"play_sessions":0,"out_kbit":0,"streams":["cam1"]},
            "origin-1":{"online":true,"play_sessions":3,"out_kbit":100,"streams":["cam1"]}}}"#,
    )
    .unwrap();
    let h = health.to_str().unwrap();
    let run = |args: &[&str]| {
        let mut a = vec![
            "--repo",
            repo.to_str().unwrap(),
            "route",
            "--format",
            "json",
            "--health",
            h,
        ];
        a.extend_from_slice(args);
        let out = edgeform(&repo, &a);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()
    };
    let v = run(&["--ip", "10.2.77.9", "--stream", "cam1"]);
    assert_eq!(v["status"], 302);
    assert_eq!(v["zone"], "origin-pool", "{v}");
    assert_eq!(v["node"], "origin-1");
    assert_eq!(
        v["chain"],
        serde_json::json!(["office-2", "office-1", "origin-pool"])
    );
    assert_eq!(v["location"], "https://origin-1.example.net/cam1");
    assert_eq!(v["client_ip"], "10.2.77.9");
    let reasons = v["reasons"].as_array().unwrap();
    assert!(
        reasons.iter().any(|r| r
            .as_str()
            .unwrap()
            .contains("streamer-office-2 excluded: offline")),
        "{v}"
    );
    assert!(
        reasons.iter().any(|r| r
            .as_str()
            .unwrap()
            .contains("ingest-office-1 excluded: playback_session_limit is 0")),
        "{v}"
    );
    // Through the trusted proxy: the last X-Forwarded-For entry is the client.
    let v = run(&[
        "--peer",
        "192.0.2.10",
        "--xff",
        "10.9.9.9, 10.2.0.1",
        "--stream",
        "cam1",
    ]);
    assert_eq!(v["client_ip"], "10.2.0.1");
    // Several header lines (a proxy appends its own): the last entry,
    // whatever comes before it.
    let v = run(&[
        "--peer",
        "192.0.2.10",
        "--xff",
        "unknown",
        "--xff",
        "10.2.0.1",
        "--stream",
        "cam1",
    ]);
    assert_eq!(v["client_ip"], "10.2.0.1", "{v}");
    // Unknown stream: 404.
    assert_eq!(
        run(&["--ip", "10.2.0.1", "--stream", "nope"])["status"],
        404
    );
    // Geo: London's test address goes to Amsterdam, strictly nearest online edge.
    let db = repo.join("testdata/geoip/GeoLite2-City-Test.mmdb");
    let out = edgeform(
        &repo,
        &[
            "route",
            "--ip",
            "81.2.69.142",
            "--geo",
            "--geoip",
            db.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["geo"]["decision"]["node"], "edge-ams-1", "{v}");
}

/// A subcommand's help names the flags it cannot run without in its usage
/// line, and lists the options every subcommand takes under their own
/// heading, apart from the subcommand's; `router/render` without arguments
/// prints its usage (exit 64), not a shell error.
#[test]
fn help_says_what_is_required_and_sets_global_options_apart() {
    let f = Fixture::with(&[]);
    let help = stdout(&edgeform(f.path(), &["explain", "--help"]));
    assert!(
        help.contains("Usage: edgeform explain --host <HOST> --url <URL> --ip <IP> [OPTIONS]")
            && help.contains("edgeform explain --batch <FILE> [OPTIONS]"),
        "{help}"
    );
    let (own, global) = help.split_once("Global options:").expect(&help);
    assert!(
        own.contains("--host <HOST>") && !own.contains("--repo <DIR>"),
        "{help}"
    );
    assert!(
        global.contains("--repo <DIR>") && global.contains("--state-dir <DIR>"),
        "{help}"
    );
    let purge = stdout(&edgeform(f.path(), &["purge", "--help"]));
    assert!(
        purge.contains("Usage: edgeform purge --site <HOST> [OPTIONS]"),
        "{purge}"
    );
    let exec = stdout(&edgeform(f.path(), &["exec", "--help"]));
    assert!(exec.contains("ed25519"), "{exec}");

    let render = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../router/render");
    let out = std::process::Command::new("bash")
        .arg(render)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.starts_with("usage: router/render OUT.conf NAME=VALUE..."),
        "{text}"
    );
    assert!(!text.contains("unbound variable"), "{text}");
}

/// `explain` never guesses a country: a request whose answer depends on it
/// (a site with a geo policy), explained with neither `--geoip` nor
/// `--country`, exits 1 asking for one; with `--country` the answer is the
/// edge's for that country; a request the policy cannot change is still
/// explained.
#[test]
fn explain_refuses_to_guess_a_country_the_answer_depends_on() {
    let f = Fixture::with(&[(
        "sites/geo.yaml",
        "host: geo.example.com\norigin: http://192.0.2.9\ngeo_mode: block\ngeo_codes: [RU]\n",
    )]);
    let ask = |extra: &[&str]| {
        let mut args = vec!["explain", "--host", "geo.example.com", "--ip", "192.0.2.7"];
        args.extend_from_slice(extra);
        edgeform(f.path(), &args)
    };
    let out = ask(&["--url", "/a"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("depends on the viewer's country")
            && err.contains("--geoip DB or --country XX"),
        "{err}"
    );
    assert!(
        stdout(&out).is_empty(),
        "no verdict is printed: {}",
        stdout(&out)
    );
    let out = ask(&["--url", "/a", "--country", "ru"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("geo-blocked"), "{}", stdout(&out));
    let out = ask(&["--url", "/a", "--country", "GB"]);
    assert!(stdout(&out).contains("country GB"), "{}", stdout(&out));
    assert!(!stdout(&out).contains("geo-blocked"), "{}", stdout(&out));
    let out = ask(&["--url", "/a", "--country", "GBR"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    // The ACME challenge path is answered before any site rule: no country
    // can change it.
    let out = ask(&["--url", "/.well-known/acme-challenge/abc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `apply` without `--yes` where nobody can confirm (stdin not a
/// terminal) is a usage error, before anything is read; a command that
/// could not have pushed never says "nothing was pushed".
#[test]
fn apply_without_yes_off_a_terminal_is_a_usage_error_and_only_a_push_says_nothing_was_pushed() {
    let f = Fixture::with(&[]);
    let out = edgeform(f.path(), &["apply"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("needs --yes"), "{}", stderr(&out));
    // An invalid repository: apply says nothing was pushed, plan does not.
    f.write("sites/bad.yaml", b"host: bad.example.com\n");
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("nothing was pushed"),
        "{}",
        stderr(&out)
    );
    for args in [&["plan"][..], &["history", "--node", "edge-1"]] {
        let out = edgeform(f.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("is invalid (") && !err.contains("nothing was pushed"),
            "{args:?}: {err}"
        );
    }
}
