//! The renderings of one diagnostic (human, json, GitHub annotation) and of
//! one diff (human, json, markdown), from repositories built in memory.

use super::*;
use crate::testkit::{EDGE, ZONE, check, repo, valid, with};

const BAD_ORIGIN: (&str, &str) = (
    "sites/s.yaml",
    "host: s.example.com\norigin: http://203.0.113.10/app\n",
);

/// The one diagnostic of a repository with a bad origin, and the repo.
fn one() -> (Vec<Diagnostic>, Repo) {
    let files = with(&[BAD_ORIGIN]);
    let checked = check(&files);
    assert_eq!(checked.diagnostics.len(), 1);
    (checked.diagnostics, repo(&files))
}

#[test]
fn json_names_severity_code_message_file_line_and_column() {
    let (d, _) = one();
    assert_eq!(
        diagnostics_json(&d),
        "{\"diagnostics\":[{\"code\":\"invalid-url\",\"column\":9,\"file\":\"sites/s.yaml\",\"line\":2,\"message\":\"`http://203.0.113.10/app` has a path, query or fragment (`/app`)\",\"severity\":\"error\"}]}\n"
    );
}

#[test]
fn a_github_annotation_lands_on_the_file_under_the_prefix_with_help_escaped() {
    let (mut d, _) = one();
    // A control character in the help is escaped before the annotation's
    // own escapes: one annotation, one line.
    d[0].help = Some("line one\nline: two, 100%".into());
    assert_eq!(
        diagnostics_github(&d, "config/"),
        "::error file=config/sites/s.yaml,line=2,col=9,title=edgeform invalid-url::`http://203.0.113.10/app` has a path, query or fragment (`/app`)%0Ahelp: line one\\nline: two, 100%25\n"
    );
    // Properties escape `:` and `,` too.
    d[0].file = "sites/a,b:c.yaml".into();
    assert!(diagnostics_github(&d, "").starts_with("::error file=sites/a%2Cb%3Ac.yaml,line=2,"));
    // A file name's control characters never reach the log raw.
    d[0].file = "sites/a\u{1b}[31mb\nc.yaml".into();
    assert!(
        diagnostics_github(&d, "").starts_with("::error file=sites/a\\u{1b}[31mb\\nc.yaml,line=2,"),
        "{}",
        diagnostics_github(&d, "")
    );
}

#[test]
fn the_human_rendering_shows_the_location_the_snippet_and_the_help() {
    let (d, repo) = one();
    let text = diagnostics_human(&d, &repo, false);
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    assert!(
        lines[0].contains("× invalid-url: `http://203.0.113.10/app`"),
        "{text}"
    );
    assert!(text.contains("╭─[sites/s.yaml:2:9]"), "{text}");
    assert!(text.contains("1 │ host: s.example.com"), "{text}");
    assert!(
        text.contains("2 │ origin: http://203.0.113.10/app"),
        "{text}"
    );
    assert!(text.contains("here"), "{text}");
    assert!(!text.contains('\u{1b}'), "no colour asked for: {text}");
    // With colour, the same text with ANSI styles.
    assert!(diagnostics_human(&d, &repo, true).contains('\u{1b}'));
}

#[test]
fn a_secret_is_masked_in_every_snippet_of_its_file() {
    let files = with(&[(
        "nodes/n.yaml",
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis: {url: \"redis://:s3cret@10.0.0.5\"}\naddresses: [nope]\n",
    )]);
    let checked = check(&files);
    let codes: Vec<&str> = checked.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["inline-secret", "invalid-address"]);
    let text = diagnostics_human(&checked.diagnostics, &repo(&files), false);
    assert!(!text.contains("s3cret"), "{text}");
    assert_eq!(
        text.matches("redis://*******@10.0.0.5").count(),
        2,
        "{text}"
    );
}

#[test]
fn a_message_is_clipped_and_its_control_characters_escaped() {
    assert_eq!(clip("a\u{1b}[31mb\r\n"), "a\\u{1b}[31mb\\r\\n");
    let long = "x".repeat(MESSAGE_CHARS + 5);
    let clipped = clip(&long);
    assert_eq!(clipped.chars().count(), MESSAGE_CHARS + 1);
    assert!(clipped.ends_with("x…"));
}

#[test]
fn a_long_snippet_line_is_cut_around_the_position() {
    let long = format!(
        "host: s.example.com\norigin: http://203.0.113.10/app\n# {}\n",
        "y".repeat(500)
    );
    let files = with(&[("sites/s.yaml", long.as_str())]);
    let checked = check(&files);
    let text = diagnostics_human(&checked.diagnostics, &repo(&files), false);
    let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest < SNIPPET_LINE_CHARS + 20, "{widest}: {text}");
    assert!(text.contains("y…"), "{text}");
}

#[test]
fn the_summary_counts_errors_warnings_and_files_in_words() {
    let (d, _) = one();
    assert_eq!(summary(&d, 3), "1 error, 0 warnings in 3 files");
    assert_eq!(summary(&[], 1), "0 errors, 0 warnings in 1 file");
}

// ---- diffs ----

/// Base: one site. Head: its origin changed and a second site added.
fn a_diff() -> Diff {
    let base = compile_of(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://203.0.113.10\n",
    )]);
    let head = compile_of(&[
        (
            "sites/a.yaml",
            "host: a.example.com\norigin: http://203.0.113.11\n",
        ),
        (
            "sites/b.yaml",
            "host: b.example.com\norigin: http://203.0.113.12\n",
        ),
    ]);
    crate::diff::diff(&base, &head)
}

fn compile_of(sites: &[(&str, &str)]) -> crate::compile::Compiled {
    let mut files = vec![ZONE, EDGE];
    files.extend_from_slice(sites);
    crate::compile::compile(&valid(&files))
}

#[test]
fn the_human_diff_lists_each_key_and_the_lines_of_a_changed_value() {
    let text = diff_human(&a_diff(), "main", "HEAD");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Changes from main to HEAD:");
    assert_eq!(lines[2], "edge-1 [eu]: 1 added, 1 changed, 0 removed");
    assert!(text.contains("\n  ~ site:a.example.com\n"), "{text}");
    assert!(text.contains("\n  + site:b.example.com\n"), "{text}");
    assert!(
        text.contains("-  \"origin\": \"http://203.0.113.10\","),
        "{text}"
    );
    assert!(
        text.contains("+  \"origin\": \"http://203.0.113.11\","),
        "{text}"
    );
    let same = crate::diff::diff(&compile_of(&[]), &compile_of(&[]));
    assert_eq!(diff_human(&same, "a", "b"), "No changes between a and b.\n");
}

#[test]
fn the_json_diff_names_every_target_with_its_added_and_changed_keys() {
    let v: serde_json::Value = serde_json::from_str(&diff_json(&a_diff(), "main", "HEAD")).unwrap();
    assert_eq!(v["base"], "main");
    assert_eq!(v["head"], "HEAD");
    assert_eq!(v["changes"], true);
    let t = &v["targets"][0];
    assert_eq!(t["node"], "edge-1");
    assert_eq!(t["region"], "eu");
    assert_eq!(t["status"], "kept");
    assert_eq!(t["added"][0]["key"], "site:b.example.com");
    assert!(
        t["added"][0]["value"]
            .as_str()
            .unwrap()
            .contains("\"origin\":\"http://203.0.113.12\"")
    );
    assert_eq!(t["changed"][0]["key"], "site:a.example.com");
    assert!(
        t["changed"][0]["before"]
            .as_str()
            .unwrap()
            .contains("203.0.113.10")
    );
    assert!(
        t["changed"][0]["after"]
            .as_str()
            .unwrap()
            .contains("203.0.113.11")
    );
    assert_eq!(t["removed"], serde_json::json!([]));
    assert_eq!(v["nginx"], serde_json::json!([]));
}

#[test]
fn the_markdown_diff_is_a_pr_comment_with_a_table_and_collapsed_diffs() {
    let text = diff_markdown(&a_diff(), "main", "HEAD");
    assert!(text.starts_with("<!-- edgeform-diff -->\n### edgeform diff `main` → `HEAD`\n"));
    assert!(text.contains(
        "**1 of 1 targets change** · 1 keys added · 1 changed · 0 removed (summed over targets)"
    ));
    assert!(text.contains("| targets | added | changed | removed |\n|---|---:|---:|---:|\n| edge-1 [eu] | 1 | 1 | 0 |\n"));
    assert!(text.contains("<details><summary>edge-1 [eu] — +1 ~1 −0</summary>"));
    assert!(text.contains("+++ site:b.example.com (added)\n"));
    assert!(text.contains("```\n\n</details>\n"));
    let same = crate::diff::diff(&compile_of(&[]), &compile_of(&[]));
    assert!(diff_markdown(&same, "a", "b").ends_with("No edge receives a change.\n"));
}

#[test]
fn a_branch_name_cannot_end_the_headings_code_span() {
    let text = diff_markdown(&a_diff(), "main", "pr`@octo-org/admins<img/src=x>`\nx");
    let heading = text.lines().nth(1).unwrap();
    assert_eq!(
        heading,
        "### edgeform diff `main` → `pr?@octo-org/admins<img/src=x>??x`"
    );
}

#[test]
fn a_comment_stays_under_githubs_limit_with_many_targets_or_groups() {
    let one = a_diff();
    let target = |i: usize, distinct: bool| {
        let mut t = one.targets[0].clone();
        t.node = format!("edge-{i:04}-{}", "x".repeat(50));
        if distinct {
            for c in &mut t.changes {
                c.key = format!("{}-{i}", c.key).into();
            }
        }
        t
    };
    for distinct in [false, true] {
        let mut d = a_diff();
        d.targets = (0..1500).map(|i| target(i, distinct)).collect();
        let text = diff_markdown(&d, "main", "HEAD");
        assert!(
            text.len() < 65_536,
            "{} characters (distinct {distinct})",
            text.len()
        );
        if distinct {
            assert!(
                text.contains("more groups of targets |"),
                "{}",
                &text[..2000]
            );
        } else {
            assert!(text.contains(" and 1480 more [eu]"), "{}", &text[..2000]);
        }
    }
}
