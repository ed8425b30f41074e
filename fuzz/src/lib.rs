//! Shared helpers for the fuzz targets: one-thread rayon, the span
//! invariant, and the multi-file input scheme of the `repo` target.

use std::sync::{Arc, Once};

use compiler::Diagnostic;
use compiler::load::{Kind, Repo, Source};

/// The loader runs files through rayon; one worker keeps a fuzz job on one
/// core. Call at the top of every target.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new().num_threads(1).build_global();
    });
}

pub const KINDS: [Kind; 4] = [Kind::Cluster, Kind::Site, Kind::Zone, Kind::Node];

/// Bytes → what `load` would make of them.
#[must_use]
pub fn text_of(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|e| format!("not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()))
}

/// Every diagnostic must point into its file: 1-based line and column,
/// `start <= end <= len`, both on char boundaries.
///
/// # Panics
/// When one does not.
pub fn assert_spans(diagnostics: &[Diagnostic], repo: &Repo) {
    for d in diagnostics {
        let text = repo
            .sources
            .iter()
            .find(|s| *s.path == *d.file)
            .and_then(|s| s.text.as_ref().ok())
            .map_or("", String::as_str);
        let s = d.span;
        assert!(s.line >= 1 && s.column >= 1, "0-based position in {d:?}");
        assert!(s.start <= s.end && s.end <= text.len(), "span out of the file ({}) in {d:?}", text.len());
        assert!(
            text.is_char_boundary(s.start) && text.is_char_boundary(s.end),
            "span not on a char boundary in {d:?}"
        );
    }
}

/// The `repo` target's input scheme. The input is split into files at
/// lines that start with `#@`; the character after `#@` picks the kind
/// (`c` cluster, `s` site, `z` zone, `n` node; anything else: site) and the
/// rest of that line is ignored. Bytes before the first header form
/// `cluster.yaml`. Each file's bytes go through the same UTF-8 check as
/// `load` does, so invalid UTF-8 reaches `Source::text` as `Err`. At most
/// 32 files.
#[must_use]
pub fn split_repo(data: &[u8]) -> Repo {
    let mut sources = Vec::new();
    let mut kind = Kind::Cluster;
    let mut start = 0;
    let mut i = 0;
    let mut push = |kind: Kind, bytes: &[u8], sources: &mut Vec<Source>| {
        if sources.len() >= 32 {
            return;
        }
        let n = sources.len();
        let path: Arc<str> = match kind {
            Kind::Cluster if !sources.iter().any(|s: &Source| s.kind == Kind::Cluster) => {
                "cluster.yaml".into()
            }
            Kind::Cluster => format!("cluster-{n}.yaml").into(),
            Kind::Site => format!("sites/f{n:02}.yaml").into(),
            Kind::Zone => format!("zones/f{n:02}.yaml").into(),
            Kind::Node => format!("nodes/f{n:02}.yaml").into(),
        };
        sources.push(Source { kind, path, text: text_of(bytes) });
    };
    while i < data.len() {
        let at_line_start = i == 0 || data[i - 1] == b'\n';
        if at_line_start && data[i..].starts_with(b"#@") {
            if i > start || kind != Kind::Cluster {
                push(kind, &data[start..i], &mut sources);
            }
            kind = match data.get(i + 2) {
                Some(b'c') => Kind::Cluster,
                Some(b'z') => Kind::Zone,
                Some(b'n') => Kind::Node,
                _ => Kind::Site,
            };
            let eol = data[i..].iter().position(|&b| b == b'\n').map_or(data.len(), |p| i + p + 1);
            start = eol;
            i = eol;
            continue;
        }
        i += 1;
    }
    if start < data.len() || kind != Kind::Cluster || sources.is_empty() {
        push(kind, &data[start.min(data.len())..], &mut sources);
    }
    // load sorts by path; so do we (cluster.yaml sorts before the folders).
    sources.sort_by(|a, b| a.path.cmp(&b.path));
    Repo { sources, commit: None }
}
