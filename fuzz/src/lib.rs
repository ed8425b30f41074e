//! Shared helpers for the fuzz targets: one-thread rayon, the span
//! invariant, and the multi-file input scheme of the `repo` target.

use std::sync::{Arc, Once};

use compiler::Diagnostic;
use compiler::load::{Kind, Repo, Source};
use yamlspan::Span;

/// The loader runs files through rayon; one worker keeps a fuzz job on one
/// core. Call at the top of every target.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global();
    });
}

/// `EDGEFORM_FUZZ_VERBOSE` is set: targets print what they saw (for
/// looking at one input, not for fuzzing).
pub fn verbose() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("EDGEFORM_FUZZ_VERBOSE").is_some())
}

pub const KINDS: [Kind; 4] = [Kind::Cluster, Kind::Site, Kind::Zone, Kind::Node];

/// Bytes → what `load` would make of them.
#[must_use]
pub fn text_of(bytes: &[u8]) -> Result<String, compiler::load::Unreadable> {
    compiler::load::utf8(bytes.to_vec())
}

/// A text with its line starts, to check many spans against it.
pub struct Text<'a> {
    text: &'a str,
    /// Byte offset of each line's start; `\n`, `\r\n` and a lone `\r`
    /// break lines, as in YAML.
    line_starts: Vec<usize>,
}

impl<'a> Text<'a> {
    #[must_use]
    pub fn new(text: &'a str) -> Text<'a> {
        let bytes = text.as_bytes();
        let mut line_starts = vec![0];
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')) {
                line_starts.push(i + 1);
            }
        }
        Text { text, line_starts }
    }

    /// What is wrong with a span, if anything: it must have a 1-based line
    /// and column, `start <= end <= len` on char boundaries, and its line
    /// and column must be those of `start`. (The parser counts a byte
    /// order mark as a column in some places and not in others, so either
    /// count is accepted on a line that has one.)
    #[must_use]
    pub fn problem(&self, s: Span) -> Option<String> {
        let text = self.text;
        if s.line == 0 || s.column == 0 {
            return Some("0-based line or column".into());
        }
        if !(s.start <= s.end && s.end <= text.len()) {
            return Some(format!("outside the text ({} bytes)", text.len()));
        }
        if !text.is_char_boundary(s.start) || !text.is_char_boundary(s.end) {
            return Some("not on a char boundary".into());
        }
        let line = self.line_starts.partition_point(|&l| l <= s.start);
        let on_line = &text[self.line_starts[line - 1]..s.start];
        let chars = on_line.chars().count();
        let boms = on_line.matches('\u{feff}').count();
        let columns = (chars - boms + 1)..=(chars + 1);
        if s.line as usize != line || !columns.contains(&(s.column as usize)) {
            return Some(format!("byte {} is at {line}:{columns:?}", s.start));
        }
        None
    }
}

/// Every diagnostic must point into its file ([`Text::problem`]).
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
        if let Some(problem) = Text::new(text).problem(d.span) {
            panic!("bad span ({problem}) in {d:?}");
        }
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
    let push = |kind: Kind, bytes: &[u8], sources: &mut Vec<Source>| {
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
        sources.push(Source {
            kind,
            path,
            text: text_of(bytes),
        });
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
            let eol = data[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(data.len(), |p| i + p + 1);
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
    Repo {
        sources,
        commit: None,
    }
}
