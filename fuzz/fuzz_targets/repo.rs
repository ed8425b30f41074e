//! Bytes → several files of different kinds (see
//! `edgeform_fuzz::split_repo` for the scheme) → `check`; diagnostics
//! rendered; a valid repository compiled twice, and the two compilations
//! diffed (they must be identical: compile is deterministic).
#![no_main]

use compiler::{check, compile, diff, report};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    edgeform_fuzz::init();
    let repo = edgeform_fuzz::split_repo(data);
    let checked = check(&repo);
    edgeform_fuzz::assert_spans(&checked.diagnostics, &repo);
    let human = report::diagnostics_human(&checked.diagnostics, &repo, false);
    if edgeform_fuzz::verbose() {
        // EDGEFORM_FUZZ_VERBOSE=1 with a single input: see what check made of it.
        eprintln!(
            "{} files, valid: {}\n{human}",
            repo.sources.len(),
            checked.is_valid()
        );
    }
    let _ = report::summary(&checked.diagnostics, repo.sources.len());
    if let Some(config) = &checked.config {
        let a = compile::compile(config);
        let b = compile::compile(config);
        let d = diff::diff(&a, &b);
        assert!(!d.has_changes(), "compile is not deterministic: {d:?}");
        let _ = report::diff_human(&d, "a", "b");
        let _ = report::diff_json(&d, "a", "b");
        let _ = report::diff_markdown(&d, "a", "b");
        // And against nothing: every key added, then removed.
        let empty = compile::Compiled::default();
        let _ = report::diff_human(&diff::diff(&empty, &a), "empty", "a");
        let _ = report::diff_markdown(&diff::diff(&a, &empty), "a", "empty");
    }
});
