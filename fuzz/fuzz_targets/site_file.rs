//! Bytes → one file, parsed as each of the four kinds (site, zone, node,
//! cluster), every diagnostic rendered with miette so span slicing is
//! exercised too.
#![no_main]

use std::sync::Arc;

use compiler::load::{Repo, Source};
use compiler::parse::parse_file;
use compiler::report;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    edgeform_fuzz::init();
    let text = edgeform_fuzz::text_of(data);
    for kind in edgeform_fuzz::KINDS {
        let path: Arc<str> = "sites/fuzz.yaml".into();
        let source = Source {
            kind,
            path,
            text: text.clone(),
        };
        let repo = Repo {
            sources: vec![source],
            commit: None,
        };
        let parsed = parse_file(&repo.sources[0]);
        edgeform_fuzz::assert_spans(&parsed.diagnostics, &repo);
        let _ = report::diagnostics_human(&parsed.diagnostics, &repo, false);
        let _ = report::diagnostics_json(&parsed.diagnostics);
        let _ = report::diagnostics_github(&parsed.diagnostics, "");
        if let Some(tree) = parsed.tree() {
            let _ = tree.to_json();
        }
    }
});
