//! Operator workflow: the PR comment (markdown diff snapshot), the
//! plain-shell CI script.

use std::sync::Arc;

use compiler::compile::{Compiled, compile};
use compiler::load::{Kind, Repo, Source};

use crate::util::{Fixture, example_repo, git};

fn compiled(repo: &Repo) -> Compiled {
    let checked = compiler::check(repo);
    compile(checked.config.as_ref().expect("valid"))
}

/// The example repository with one site changed, one added, one removed.
fn changed_example() -> (Repo, Repo) {
    let base = compiler::load::from_dir(&example_repo()).unwrap();
    let mut head = base.clone();
    head.sources
        .retain(|s| &*s.path != "sites/static.example.org.yaml");
    for s in &mut head.sources {
        if &*s.path == "sites/example.com.yaml" {
            let text = s.text.clone().unwrap();
            s.text = Ok(text.replace("ttl: 86400", "ttl: 3600"));
        }
    }
    head.sources.push(Source {
        kind: Kind::Site,
        path: Arc::from("sites/new.example.com.yaml"),
        text: Ok("host: new.example.com\norigin: https://198.51.100.9\nregions: [us]\n".into()),
    });
    (base, head)
}

#[test]
fn markdown_diff_snapshot() {
    let (base, head) = changed_example();
    let d = compiler::diff::diff(&compiled(&base), &compiled(&head));
    let md = compiler::report::diff_markdown(&d, "origin/main (1111111)", "working tree");
    assert!(md.starts_with("<!-- edgeform-diff -->\n"), "{md}");
    insta::assert_snapshot!("markdown_diff", md);

    let none = compiler::diff::diff(&compiled(&base), &compiled(&base));
    insta::assert_snapshot!(
        "markdown_diff_none",
        compiler::report::diff_markdown(&none, "a", "b")
    );
}

/// `examples/ci/pr-check.sh` on a two-commit repository: check passes, the
/// comment lands in the file, exit 0; an invalid change exits 1.
#[test]
fn plain_shell_pr_check() {
    let f = Fixture::with(&[]);
    f.commit("base");
    git(f.path(), &["branch", "base"]);
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.2\n",
    );
    let script = example_repo().join("examples/ci/pr-check.sh");
    let run = || {
        std::process::Command::new("sh")
            .arg(&script)
            .current_dir(f.path())
            .env("EDGEFORM", env!("CARGO_BIN_EXE_edgeform"))
            .env("EDGEFORM_BASE", "base")
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let out = run();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(f.path().join("edgeform-diff.md")).unwrap();
    assert!(
        md.starts_with("<!-- edgeform-diff -->") && md.contains("site:b.example.com"),
        "{md}"
    );
    f.write("sites/b.yaml", b"host: b.example.com\n");
    assert_eq!(run().status.code(), Some(1));
}
