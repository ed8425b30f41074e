//! Rendering: diagnostics (human via miette, json, GitHub annotations) and
//! diffs (human, json, markdown). Pure: every function returns a `String`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan};
use serde_json::json;

use crate::diagnostic::{Diagnostic, Severity};
use crate::diff::{ChangeKind, Diff, TargetDiff, TargetStatus, change_diff, pretty, unified};
use crate::load::Repo;

/// A diagnostic with an excerpt of its file, as miette wants it.
#[derive(Debug)]
struct Report<'a> {
    d: &'a Diagnostic,
    source: Excerpt,
    /// The label's span in the excerpt.
    span: (usize, usize),
}

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.d.code, clip(&self.d.message))
    }
}

/// The longest line of a snippet, in characters; longer lines are cut
/// around the diagnostic's position, marked with `…`.
pub const SNIPPET_LINE_CHARS: usize = 200;
/// The longest message or help, in characters, in any output format.
pub const MESSAGE_CHARS: usize = 1000;
/// Lines of context around a diagnostic, and the most lines of a
/// multi-line span shown.
const CONTEXT_LINES: usize = 2;
const SPAN_LINES: usize = 10;

/// `s` cut to [`MESSAGE_CHARS`] characters (with `…`), control characters
/// escaped: messages quote values from the repository, which must neither
/// flood the output nor drive the terminal.
#[must_use]
pub fn clip(s: &str) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == MESSAGE_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The lines of a file around a diagnostic, each cut to
/// [`SNIPPET_LINE_CHARS`], with every secret of the file masked; miette
/// is told the real line numbers and column.
#[derive(Debug)]
struct Excerpt {
    name: String,
    text: String,
    /// 0-based line number of the excerpt's first line in the file.
    first_line: usize,
    /// The primary line (in the excerpt) and how far its column moved.
    primary: (usize, isize),
}

impl miette::SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let c = self.text.read_span(span, before, after)?;
        let column = if c.line() == self.primary.0 {
            c.column().saturating_add_signed(self.primary.1)
        } else {
            c.column()
        };
        Ok(Box::new(miette::MietteSpanContents::new_named(
            self.name.clone(),
            c.data(),
            *c.span(),
            c.line() + self.first_line,
            column,
            c.line_count(),
        )))
    }
}

/// Floor `i` to a char boundary of `s`.
fn floor(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `text` with every secret flagged in it masked: each occurrence becomes
/// `*`s (same length: spans stay valid); a secret written with escapes (not
/// found as written) has its diagnostic's whole span masked. `flagged` is
/// every diagnostic of the file: a snippet shows its neighbours' lines too.
fn mask_secrets(text: &str, flagged: &[&Diagnostic]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    // Every secret looked for in one pass over the text (one search per
    // secret made a file of thousands of them quadratic).
    let secrets: Vec<&str> = flagged
        .iter()
        .filter_map(|d| d.secret.as_deref().filter(|s| !s.is_empty()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut found = vec![false; secrets.len()];
    if let Ok(ac) = aho_corasick::AhoCorasick::new(&secrets) {
        for m in ac.find_overlapping_iter(text) {
            bytes[m.start()..m.end()].fill(b'*');
            found[m.pattern().as_usize()] = true;
        }
    }
    for d in flagged {
        let Some(secret) = d.secret.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        if !secrets.binary_search(&secret).is_ok_and(|i| found[i]) {
            let start = floor(text, d.span.start);
            let end = floor(text, d.span.end.max(start));
            bytes[start..end].fill(b'*');
        }
    }
    // Only whole characters were replaced by ASCII: still UTF-8.
    String::from_utf8(bytes).unwrap_or_default()
}

/// Where each `\n` of `text` is: a file's line index, made once however
/// many diagnostics it has (finding a line by scanning from the start
/// made 20,000 diagnostics in one file cost minutes).
fn newlines(text: &str) -> Vec<usize> {
    text.bytes()
        .enumerate()
        .filter_map(|(i, b)| (b == b'\n').then_some(i))
        .collect()
}

/// Builds the excerpt of `text` (its secrets already masked; `newlines`
/// its [`newlines`]) for `d` and the label's span in it. Costs the
/// excerpt's lines, not the file's.
fn excerpt(d: &Diagnostic, text: &str, newlines: &[usize]) -> (Excerpt, (usize, usize)) {
    let start = floor(text, d.span.start);
    let end = floor(text, d.span.end.max(start));
    let line_of = |at: usize| newlines.partition_point(|&n| n < at);
    let line_start = |line: usize| if line == 0 { 0 } else { newlines[line - 1] + 1 };
    let (l0, end_line) = (line_of(start), line_of(end));
    let l1 = end_line.min(l0 + SPAN_LINES);
    let first = l0.saturating_sub(CONTEXT_LINES);
    let last = l1 + CONTEXT_LINES;
    let mut out = String::new();
    let mut span = (0usize, 0usize);
    let mut primary = (l0 - first, 0isize);
    // Each line's end from the index too: a 64 MiB one-line file is not
    // scanned to its end for every diagnostic on it.
    let lines = (first..=last).map_while(|number| {
        if number > newlines.len() {
            return None;
        }
        let from = line_start(number);
        let to = newlines.get(number).map_or(text.len(), |&n| n + 1);
        (from < text.len()).then(|| (number, from, &text[from..to]))
    });
    for (number, line_start, line) in lines {
        let (body, newline) = if let Some(b) = line.strip_suffix("\r\n") {
            (b, "\r\n")
        } else {
            line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"))
        };
        let out_start = out.len();
        // At most SNIPPET_LINE_CHARS characters: never count a long line whole.
        let (kept_from, kept_to) = if body.char_indices().nth(SNIPPET_LINE_CHARS).is_none() {
            (0, body.len())
        } else {
            // Around the span's start on its line, else from the start.
            let anchor = if (line_start..=line_start + body.len()).contains(&start) {
                start - line_start
            } else {
                0
            };
            let from = floor(body, anchor.saturating_sub(40));
            let to = body[from..]
                .char_indices()
                .nth(SNIPPET_LINE_CHARS)
                .map_or(body.len(), |(i, _)| from + i);
            (from, to)
        };
        let prefix = if kept_from > 0 { "…" } else { "" };
        out.push_str(prefix);
        // Control characters (ESC sequences, CR, C1 controls) from the file
        // would drive the terminal or a CI log: each byte becomes `?`, so
        // byte offsets stay valid.
        for c in body[kept_from..kept_to].chars() {
            if c.is_control() && c != '\t' {
                out.extend(std::iter::repeat_n('?', c.len_utf8()));
            } else {
                out.push(c);
            }
        }
        if kept_to < body.len() {
            out.push('…');
        }
        out.push_str(newline);
        // Where a byte of this line lands in the excerpt.
        let map = |at: usize| -> usize {
            let rel = at.saturating_sub(line_start).clamp(kept_from, kept_to);
            out_start + prefix.len() + rel - kept_from
        };
        if number == l0 {
            span.0 = map(start);
            #[allow(clippy::cast_possible_wrap)]
            {
                primary.1 = kept_from as isize - prefix.len() as isize;
            }
        }
        if number == l1 {
            span.1 = if end_line == l1 {
                map(end)
            } else {
                map(line_start + body.len())
            };
        }
    }
    let span = (span.0, span.1.max(span.0));
    (
        Excerpt {
            name: edgestate::untrusted::escape(&d.file),
            text: out,
            first_line: first,
            primary,
        },
        span,
    )
}

impl std::error::Error for Report<'_> {}

impl miette::Diagnostic for Report<'_> {
    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.d.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'b>(&'b self) -> Option<Box<dyn std::fmt::Display + 'b>> {
        self.d
            .help
            .as_deref()
            .map(|h| Box::new(clip(h)) as Box<dyn std::fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let (start, end) = self.span;
        Some(Box::new(std::iter::once(
            LabeledSpan::new_primary_with_span(Some("here".into()), (start, end - start)),
        )))
    }
}

/// Human rendering with snippets; `color` adds ANSI styles.
#[must_use]
pub fn diagnostics_human(diagnostics: &[Diagnostic], repo: &Repo, color: bool) -> String {
    let texts: BTreeMap<&str, &str> = repo
        .sources
        .iter()
        .filter_map(|s| s.text.as_ref().ok().map(|t| (&*s.path, t.as_str())))
        .collect();
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_context_lines(2);
    // Each file once, with the secrets of all its diagnostics masked (the
    // diagnostics grouped by file in one pass: 200,000 of them in as many
    // files are not 200,000 scans of the list).
    let mut by_file: BTreeMap<&str, Vec<&Diagnostic>> = BTreeMap::new();
    for d in diagnostics {
        by_file.entry(&*d.file).or_default().push(d);
    }
    let masked: BTreeMap<&str, (String, Vec<usize>)> = by_file
        .into_iter()
        .map(|(file, flagged)| {
            let text = mask_secrets(texts.get(file).copied().unwrap_or_default(), &flagged);
            let lines = newlines(&text);
            (file, (text, lines))
        })
        .collect();
    let mut out = String::new();
    for d in diagnostics {
        let (text, lines) = masked
            .get(&*d.file)
            .map_or(("", &[][..]), |(t, l)| (t.as_str(), l.as_slice()));
        // miette names the file in the snippet header as name:line:col.
        let (source, span) = excerpt(d, text, lines);
        let report = Report { d, source, span };
        if !out.is_empty() {
            out.push('\n');
        }
        if handler.render_report(&mut out, &report).is_err() {
            let _ = writeln!(
                out,
                "{}: {}[{}]: {}",
                d.location(),
                d.severity.as_str(),
                d.code,
                clip(&d.message)
            );
        }
    }
    out
}

/// `N errors, M warnings`.
#[must_use]
pub fn summary(diagnostics: &[Diagnostic], files: usize) -> String {
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diagnostics.len() - errors;
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    format!(
        "{}, {} in {}",
        plural(errors, "error"),
        plural(warnings, "warning"),
        plural(files, "file")
    )
}

/// `{"diagnostics":[{"severity","code","message","file","line","column"}]}`.
#[must_use]
pub fn diagnostics_json(diagnostics: &[Diagnostic]) -> String {
    let list: Vec<serde_json::Value> = diagnostics
        .iter()
        .map(|d| {
            json!({
                "severity": d.severity.as_str(),
                "code": d.code,
                "message": clip(&d.message),
                "file": &*d.file,
                "line": d.span.line,
                "column": d.span.column,
            })
        })
        .collect();
    let mut s = serde_json::to_string(&json!({ "diagnostics": list })).unwrap_or_default();
    s.push('\n');
    s
}

fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// GitHub Actions workflow commands: one annotation per diagnostic.
/// `prefix` is the config repo's path inside the checked-out repository
/// (empty when they are the same), so annotations land on the right file.
#[must_use]
pub fn diagnostics_github(diagnostics: &[Diagnostic], prefix: &str) -> String {
    let mut out = String::new();
    for d in diagnostics {
        let level = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut message = clip(&d.message);
        if let Some(h) = d.help.as_deref().map(clip) {
            message.push_str("\nhelp: ");
            message.push_str(&h);
        }
        let _ = writeln!(
            out,
            "::{level} file={},line={},col={},title={}::{}",
            // A file name is the pull request's too: no control
            // character of it reaches the CI log raw.
            escape_property(&edgestate::untrusted::escape(&format!(
                "{prefix}{}",
                d.file
            ))),
            d.span.line,
            d.span.column,
            escape_property(&format!("edgeform {}", d.code)),
            escape_data(&message)
        );
    }
    out
}

/// Targets with identical change sets, grouped (first appearance order).
fn groups(diff: &Diff) -> Vec<Vec<&TargetDiff>> {
    let mut order: Vec<u64> = Vec::new();
    let mut by: BTreeMap<u64, Vec<&TargetDiff>> = BTreeMap::new();
    for t in &diff.targets {
        if t.changes.is_empty() && t.status == TargetStatus::Kept {
            continue;
        }
        let sig = t.signature() ^ (t.status as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if !by.contains_key(&sig) {
            order.push(sig);
        }
        by.entry(sig).or_default().push(t);
    }
    order.into_iter().filter_map(|s| by.remove(&s)).collect()
}

fn group_title(group: &[&TargetDiff]) -> String {
    let names: Vec<&str> = group.iter().map(|t| t.node.as_str()).collect();
    let mut regions: Vec<&str> = group.iter().map(|t| t.region.as_str()).collect();
    regions.sort_unstable();
    regions.dedup();
    let status = match group[0].status {
        TargetStatus::New => " (new target)",
        TargetStatus::Gone => " (target removed)",
        TargetStatus::Kept => "",
    };
    format!("{} [{}]{status}", names.join(", "), regions.join(", "))
}

fn counts(t: &TargetDiff) -> (usize, usize, usize) {
    (
        t.count(ChangeKind::Added),
        t.count(ChangeKind::Changed),
        t.count(ChangeKind::Removed),
    )
}

/// Human diff: grouped targets, each key with a unified diff of its value.
#[must_use]
pub fn diff_human(diff: &Diff, base: &str, head: &str) -> String {
    let mut out = String::new();
    if !diff.has_changes() {
        let _ = writeln!(out, "No changes between {base} and {head}.");
        return out;
    }
    let _ = writeln!(out, "Changes from {base} to {head}:\n");
    for group in groups(diff) {
        let (a, c, r) = counts(group[0]);
        let _ = writeln!(
            out,
            "{}: {a} added, {c} changed, {r} removed",
            group_title(&group)
        );
        for change in &group[0].changes {
            let sign = match change.kind {
                ChangeKind::Added => '+',
                ChangeKind::Changed => '~',
                ChangeKind::Removed => '-',
            };
            let _ = writeln!(out, "  {sign} {}", change.key);
            if change.kind == ChangeKind::Changed {
                for line in change_diff(change).lines() {
                    let _ = writeln!(out, "      {line}");
                }
            }
        }
        out.push('\n');
    }
    for f in &diff.nginx {
        let _ = writeln!(out, "{}.nginx.conf:", f.router);
        let text = unified(
            &format!("{}.nginx.conf", f.router),
            f.before.as_deref().unwrap_or_default(),
            f.after.as_deref().unwrap_or_default(),
        );
        for line in text.lines() {
            let _ = writeln!(out, "      {line}");
        }
    }
    out
}

/// Machine diff: every target, its status and its changes.
#[must_use]
pub fn diff_json(diff: &Diff, base: &str, head: &str) -> String {
    let targets: Vec<serde_json::Value> = diff
        .targets
        .iter()
        .map(|t| {
            let of = |kind: ChangeKind| -> Vec<serde_json::Value> {
                t.changes
                    .iter()
                    .filter(|c| c.kind == kind)
                    .map(|c| match kind {
                        ChangeKind::Added => json!({"key": &*c.key, "value": c.after.as_deref()}),
                        ChangeKind::Removed => {
                            json!({"key": &*c.key, "value": c.before.as_deref()})
                        }
                        ChangeKind::Changed => json!({
                            "key": &*c.key,
                            "before": c.before.as_deref(),
                            "after": c.after.as_deref(),
                            "diff": change_diff(c),
                        }),
                    })
                    .collect()
            };
            json!({
                "node": t.node,
                "region": t.region,
                "status": match t.status {
                    TargetStatus::New => "new",
                    TargetStatus::Gone => "gone",
                    TargetStatus::Kept => "kept",
                },
                "added": of(ChangeKind::Added),
                "changed": of(ChangeKind::Changed),
                "removed": of(ChangeKind::Removed),
            })
        })
        .collect();
    let nginx: Vec<serde_json::Value> = diff
        .nginx
        .iter()
        .map(|f| {
            json!({
                "router": f.router,
                "diff": unified(
                    &format!("{}.nginx.conf", f.router),
                    f.before.as_deref().unwrap_or_default(),
                    f.after.as_deref().unwrap_or_default(),
                ),
            })
        })
        .collect();
    let mut s = serde_json::to_string(&json!({
        "base": base,
        "head": head,
        "changes": diff.has_changes(),
        "targets": targets,
        "nginx": nginx,
    }))
    .unwrap_or_default();
    s.push('\n');
    s
}

/// A revision's label (a branch name is the pull request author's
/// choice) as the text of a Markdown code span: a backtick would end the
/// span and make the rest live Markdown (HTML, @mentions), a control
/// character would break the line; each is shown as `?`. At most 100
/// characters.
fn code_span_text(label: &str) -> String {
    let mut out: String = label
        .chars()
        .take(100)
        .map(|c| if c == '`' || c.is_control() { '?' } else { c })
        .collect();
    if label.chars().count() > 100 {
        out.push('…');
    }
    out
}

/// GitHub's limit on a comment body is 65,536 characters.
const MARKDOWN_BUDGET: usize = 60_000;

/// The summary table stops past this many characters of the comment (a
/// line says how many groups are left out), so the comment stays under
/// GitHub's limit whatever the number of groups.
const MARKDOWN_TABLE_BUDGET: usize = 30_000;

/// Target names a comment's group title lists before "and N more".
const MARKDOWN_TITLE_NAMES: usize = 20;

/// [`group_title`] naming at most [`MARKDOWN_TITLE_NAMES`] targets.
fn capped_title(group: &[&TargetDiff]) -> String {
    if group.len() <= MARKDOWN_TITLE_NAMES {
        return group_title(group);
    }
    let title = group_title(&group[..MARKDOWN_TITLE_NAMES]);
    let mut regions: Vec<&str> = group.iter().map(|t| t.region.as_str()).collect();
    regions.sort_unstable();
    regions.dedup();
    let names = title.split(" [").next().unwrap_or_default();
    let status = title.rsplit_once(']').map_or("", |(_, s)| s);
    format!(
        "{names} and {} more [{}]{status}",
        group.len() - MARKDOWN_TITLE_NAMES,
        regions.join(", ")
    )
}

/// A PR comment: summary table, then each group's diff in a collapsed
/// block, truncated to fit a comment.
#[must_use]
pub fn diff_markdown(diff: &Diff, base: &str, head: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- edgeform-diff -->\n### edgeform diff `{}` → `{}`\n",
        code_span_text(base),
        code_span_text(head)
    );
    if !diff.has_changes() {
        let _ = writeln!(out, "No edge receives a change.");
        return out;
    }
    let changed: Vec<&TargetDiff> = diff
        .targets
        .iter()
        .filter(|t| !t.changes.is_empty() || t.status != TargetStatus::Kept)
        .collect();
    let total = |k: ChangeKind| changed.iter().map(|t| t.count(k)).sum::<usize>();
    let _ = writeln!(
        out,
        "**{} of {} targets change** · {} keys added · {} changed · {} removed (summed over targets)\n",
        changed.len(),
        diff.targets.len(),
        total(ChangeKind::Added),
        total(ChangeKind::Changed),
        total(ChangeKind::Removed)
    );
    let groups = groups(diff);
    let _ = writeln!(
        out,
        "| targets | added | changed | removed |\n|---|---:|---:|---:|"
    );
    for (i, group) in groups.iter().enumerate() {
        if out.len() > MARKDOWN_TABLE_BUDGET {
            let _ = writeln!(
                out,
                "| … {} more groups of targets | | | |",
                groups.len() - i
            );
            break;
        }
        let (a, c, r) = counts(group[0]);
        let _ = writeln!(
            out,
            "| {} | {a} | {c} | {r} |",
            capped_title(group).replace('|', "\\|")
        );
    }
    out.push('\n');
    let mut omitted = 0usize;
    for group in &groups {
        let mut block = String::new();
        let (a, c, r) = counts(group[0]);
        let _ = writeln!(
            block,
            "<details><summary>{} — +{a} ~{c} −{r}</summary>\n\n```diff",
            capped_title(group)
        );
        for change in &group[0].changes {
            match change.kind {
                ChangeKind::Changed => block.push_str(&change_diff(change)),
                ChangeKind::Added => {
                    let _ = writeln!(block, "+++ {} (added)", change.key);
                    for l in pretty(change.after.as_deref().unwrap_or_default()).lines() {
                        let _ = writeln!(block, "+{l}");
                    }
                }
                ChangeKind::Removed => {
                    let _ = writeln!(block, "--- {} (removed)", change.key);
                }
            }
        }
        let _ = writeln!(block, "```\n\n</details>\n");
        if out.len() + block.len() > MARKDOWN_BUDGET {
            omitted += group.len();
            continue;
        }
        out.push_str(&block);
    }
    for f in &diff.nginx {
        let text = unified(
            &format!("{}.nginx.conf", f.router),
            f.before.as_deref().unwrap_or_default(),
            f.after.as_deref().unwrap_or_default(),
        );
        let block = format!(
            "<details><summary>{}.nginx.conf</summary>\n\n```diff\n{text}```\n\n</details>\n\n",
            f.router
        );
        if out.len() + block.len() > MARKDOWN_BUDGET {
            omitted += 1;
            continue;
        }
        out.push_str(&block);
    }
    if omitted > 0 {
        let _ = writeln!(
            out,
            "_{omitted} more target diffs left out to fit a comment; run `edgeform diff --base {}` locally for all of them._",
            code_span_text(base)
        );
    }
    out
}

#[cfg(test)]
mod tests;
