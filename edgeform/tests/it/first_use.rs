//! What a new operator trips on: errors that name the fix, help texts,
//! warnings before refusals.

use crate::util::{Fixture, edgeform, git, stderr, stdout};

fn edge(port: u16) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         redis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
    )
}

fn live_commit(port: u16) -> String {
    redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("commit")
        .query(
            &mut redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap()
}

#[test]
fn a_folder_without_config_is_an_error_naming_repo() {
    let empty = Fixture::empty();
    let sites = Fixture::with(&[]);
    for (dir, repo) in [(empty.path(), "."), (sites.path(), "sites")] {
        for args in [
            &["check"][..],
            &["build", "--out", "out"],
            &["plan"],
            &["status"],
            &["apply", "--yes"],
            &["route", "--stream", "x"],
        ] {
            let mut all = vec!["--repo", repo];
            all.extend_from_slice(args);
            let out = edgeform(dir, &all);
            let text = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{all:?}: {text}");
            assert!(
                text.contains("is --repo right?") && text.contains("no cluster.yaml"),
                "{all:?}: {text}"
            );
            assert!(!text.contains("valid ("), "{all:?}: {text}");
        }
    }
    // A real repository still passes.
    assert_eq!(edgeform(sites.path(), &["check"]).status.code(), Some(0));
    // So does a revision of one; an empty revision does not.
    let f = Fixture::empty();
    f.write("README", b"x");
    f.commit("nothing");
    let out = edgeform(f.path(), &["--rev", "HEAD", "check"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("at revision `HEAD`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn apply_of_a_dirty_tree_is_refused_without_allow_dirty() {
    let r = harness::redis(&[]);
    let f = Fixture::with(&[]);
    f.write("nodes/edge-1.yaml", edge(r.port).as_bytes());
    let first = f.commit("base");
    // Clean: applies.
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Dirty: refused, nothing written.
    f.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.9\n",
    );
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("uncommitted config changes")
            && stderr(&out).contains("--allow-dirty"),
        "{}",
        stderr(&out)
    );
    let live = live_commit(r.port);
    assert_eq!(live, first);
    // --rev is never dirty, even while the tree is.
    let out = edgeform(f.path(), &["--rev", "HEAD", "apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // --allow-dirty applies it, recorded as such.
    let out = edgeform(f.path(), &["apply", "--yes", "--allow-dirty"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let live = live_commit(r.port);
    assert_eq!(live, format!("{first}+dirty"));
    // Committing makes it clean again.
    git(f.path(), &["commit", "-qam", "change"]);
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Every argument of `cmd` and its subcommands, as `path --flag`, that has
/// no help text.
fn without_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            out.push(format!("{path} --{id}"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let path = format!("{path} {}", sub.get_name());
        if sub.get_about().is_none() {
            out.push(format!("{path} (no about)"));
        }
        without_help(sub, &path, out);
    }
}

#[test]
fn every_flag_of_every_subcommand_has_a_help_text() {
    use clap::CommandFactory as _;
    let mut cmd = edgeform::cli::Cli::command();
    cmd.build();
    let mut missing = Vec::new();
    without_help(&cmd, "edgeform", &mut missing);
    assert!(missing.is_empty(), "no help text: {missing:#?}");
}

#[test]
fn help_lists_exit_codes_and_repo_flags_are_global() {
    let f = Fixture::empty();
    let help = stdout(&edgeform(f.path(), &["--help"]));
    for needle in ["(anycast)", "64 usage error", "2 changes pending"] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    // --repo/--rev are global: accepted (and ignored) by `completions`,
    // which reads no repository.
    let out = edgeform(
        f.path(),
        &[
            "completions",
            "bash",
            "--repo",
            "/nonexistent",
            "--rev",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn fmt_says_nothing_to_change_and_names_a_wrong_file() {
    let f = Fixture::with(&[]);
    assert_eq!(edgeform(f.path(), &["fmt"]).status.code(), Some(0));
    // The outcome is the result: on stdout (`edgeform fmt > log` keeps it).
    let out = edgeform(f.path(), &["fmt"]);
    assert!(
        stdout(&out).contains("canonical formatting: nothing to change (2 files)"),
        "{}",
        stdout(&out)
    );
    let out = edgeform(f.path(), &["fmt", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("canonical formatting: nothing to change (2 files)"),
        "{}",
        stdout(&out)
    );
    let out = edgeform(f.path(), &["fmt", "sites/nope.yaml", "sites/a.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("sites/nope.yaml (no such file)")
            && !stderr(&out).contains("a.yaml,"),
        "{}",
        stderr(&out)
    );
    f.write("README.md", b"x");
    let out = edgeform(f.path(), &["fmt", "--check", "README.md"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(": README.md;"), "{}", stderr(&out));
}

fn two_edges(up: u16, down: u16) -> Fixture {
    let f = Fixture::with(&[]);
    f.write("nodes/edge-1.yaml", edge(up).as_bytes());
    f.write(
        "nodes/edge-2.yaml",
        edge(down).replace("edge-1", "edge-2").as_bytes(),
    );
    f
}

#[test]
fn reconcile_node_works_on_only_those_targets() {
    let r = harness::redis(&[]);
    let down = harness::free_port();
    let f = two_edges(r.port, down);
    f.commit("two edges");
    let out = edgeform(f.path(), &["reconcile", "--once", "sync"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("edge-2"), "{}", stderr(&out));
    let out = edgeform(
        f.path(),
        &["reconcile", "--once", "sync", "--node", "edge-1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("edge-2"), "{}", stderr(&out));
    let out = edgeform(f.path(), &["reconcile", "--once", "heal", "--node", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--node nope: no such target"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn plan_warns_what_apply_would_refuse() {
    let r = harness::redis(&[]);
    let f = Fixture::empty();
    f.write("nodes/edge-1.yaml", edge(r.port).as_bytes());
    for i in 0..20 {
        f.write(
            &format!("sites/s{i:02}.yaml"),
            format!("host: s{i:02}.example.com\norigin: http://192.0.2.1\n").as_bytes(),
        );
    }
    let first = f.commit("twenty");
    assert_eq!(
        edgeform(f.path(), &["apply", "--yes"]).status.code(),
        Some(0)
    );
    for i in 0..6 {
        f.write(&format!("sites/s{i:02}.yaml"), b"");
    }
    git(f.path(), &["commit", "-qam", "six fewer"]);
    let out = edgeform(f.path(), &["plan"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(
            "warning: apply would refuse edge-1: refusing to delete 6 of 21 managed keys"
        ),
        "{}",
        stdout(&out)
    );
    // The rollback guard: planning an older commit than the live one.
    assert_eq!(
        edgeform(f.path(), &["apply", "--yes", "--force"])
            .status
            .code(),
        Some(0)
    );
    let out = edgeform(f.path(), &["--rev", &first, "plan"]);
    assert!(
        stdout(&out).contains("warning: apply would refuse edge-1: refusing to roll back"),
        "{}",
        stdout(&out)
    );
    let out = edgeform(f.path(), &["--rev", &first, "plan", "--format", "json"]);
    assert!(
        stdout(&out).contains("\"apply_refused\":\"refusing to roll back"),
        "{}",
        stdout(&out)
    );
    // Nothing to refuse: no warning.
    let out = edgeform(f.path(), &["plan"]);
    assert!(!stdout(&out).contains("warning"), "{}", stdout(&out));
}

#[test]
fn the_rollback_message_in_the_docs_is_the_real_one() {
    let message = control::plan::Refusal::Rollback {
        live: "…".into(),
        desired: "…".into(),
    }
    .to_string();
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        doc.contains(&message),
        "docs/operations.md does not quote `{message}`"
    );
}

#[test]
fn plan_adopts_identical_content_on_an_edge_without_manifest() {
    let r = harness::redis(&[]);
    let f = Fixture::with(&[(
        "sites/b.yaml",
        "host: b.example.com\norigin: http://192.0.2.2\n",
    )]);
    f.write(
        "sites/c.yaml",
        b"host: c.example.com\norigin: http://192.0.2.3\n",
    );
    f.write("nodes/edge-1.yaml", edge(r.port).as_bytes());
    f.commit("three sites");
    // The edge holds what edgeform would write, written by hand: no manifest.
    let out = edgeform(f.path(), &["build", "--out", "out"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let built: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(f.path().join("out/edge-1.json")).unwrap()).unwrap();
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    for (k, v) in &built {
        let _: () = redis::cmd("SET").arg(k).arg(v).query(&mut con).unwrap();
    }
    let n = built.len();
    let out = edgeform(f.path(), &["plan", "--detailed-exitcode"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!("{n} keys adopted, content identical"))
            && stdout(&out).contains("no changes"),
        "{}",
        stdout(&out)
    );
    // Only truly different keys are changes: one differs, one is missing.
    let _: () = redis::cmd("SET")
        .arg("site:b.example.com")
        .arg("{}")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg("site:c.example.com")
        .query(&mut con)
        .unwrap();
    let out = edgeform(f.path(), &["plan", "--detailed-exitcode"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("{} keys adopted, content identical", n - 2))
            && text.contains("1 to add, 1 to change, 0 to remove")
            && text.contains("  + site:c.example.com")
            && text.contains("  ~ site:b.example.com"),
        "{text}"
    );
    // Apply records the manifest; then nothing is left to do.
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = edgeform(f.path(), &["plan"]);
    assert!(
        stdout(&out).contains("no changes") && !stdout(&out).contains("adopted"),
        "{}",
        stdout(&out)
    );
    // Format 2: the manifest's entries are counted in the meta (`managed`).
    let managed: usize = redis::cmd("HGET")
        .arg("edgeform:meta")
        .arg("managed")
        .query(&mut con)
        .unwrap();
    assert_eq!(managed, n);
}

#[test]
fn route_names_the_decision_before_explaining_it() {
    let repo = crate::util::example_repo();
    let out = edgeform(&repo, &["route", "--ip", "10.2.77.9", "--stream", "cam1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("note:")).collect();
    assert!(
        lines[0].starts_with("client 10.2.77.9: decision: 302 → "),
        "{text}"
    );
    assert_eq!(lines[1], "why:", "{text}");
    let office1 = text.find("office-1").unwrap();
    assert!(text.find("decision:").unwrap() < office1, "{text}");
}

/// `edgeform init DIR` makes a repository that passes `check` (the role
/// gates included) and `fmt --check` as it is, committed once, with a
/// schema modeline in every YAML file; a folder that holds anything is
/// refused and left alone.
#[test]
fn init_makes_a_repository_that_passes_check_as_it_is() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("cdn");
    let out = edgeform(parent.path(), &["init", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("first commit"), "{}", stdout(&out));
    let out = edgeform(&dir, &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(": valid (0 errors, 0 warnings"),
        "{}",
        stdout(&out)
    );
    assert!(stderr(&out).contains("gates ran: lua"), "{}", stderr(&out));
    assert_eq!(edgeform(&dir, &["fmt", "--check"]).status.code(), Some(0));
    let log = git(&dir, &["log", "--format=%s"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout).lines().count(), 1);
    assert!(
        git(&dir, &["status", "--porcelain"]).stdout.is_empty(),
        "everything committed"
    );
    for file in [
        "cluster.yaml",
        "sites/www.example.com.yaml",
        "zones/world.yaml",
        "nodes/edge-1.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(
            text.starts_with("# yaml-language-server: $schema="),
            "{file}"
        );
    }
    assert!(dir.join("roles/edge/nginx.conf.tmpl").is_file());
    assert!(dir.join("schemas/site.schema.json").is_file());
    // Again into the same folder: refused, nothing changed.
    let out = edgeform(parent.path(), &["init", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&git(&dir, &["log", "--format=%s"]).stdout)
            .lines()
            .count(),
        1
    );
}
