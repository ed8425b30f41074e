//! Compare two compilations, target by target (the PR view: no live
//! state). Pure.

use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::compile::{Compiled, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChangeKind {
    Added,
    Changed,
    Removed,
}

impl ChangeKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Changed => "changed",
            ChangeKind::Removed => "removed",
        }
    }
}

/// One key that differs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Change {
    pub kind: ChangeKind,
    pub key: Arc<str>,
    pub before: Option<Arc<str>>,
    pub after: Option<Arc<str>>,
}

/// Whether the target itself appears, disappears or stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetStatus {
    New,
    Gone,
    Kept,
}

/// The differences of one target.
#[derive(Debug, Clone)]
pub struct TargetDiff {
    pub node: String,
    pub region: String,
    pub status: TargetStatus,
    pub changes: Vec<Change>,
}

impl TargetDiff {
    #[must_use]
    pub fn count(&self, kind: ChangeKind) -> usize {
        self.changes.iter().filter(|c| c.kind == kind).count()
    }

    /// A hash of the change set, to group targets receiving the same
    /// changes (the edges of one region, typically).
    #[must_use]
    pub fn signature(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for c in &self.changes {
            c.hash(&mut h);
        }
        h.finish()
    }
}

/// An nginx snippet that differs.
#[derive(Debug, Clone)]
pub struct FileChange {
    pub router: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Diff {
    /// Every target of either side, by name; unchanged ones included with
    /// no changes.
    pub targets: Vec<TargetDiff>,
    pub nginx: Vec<FileChange>,
}

impl Diff {
    #[must_use]
    pub fn has_changes(&self) -> bool {
        self.targets
            .iter()
            .any(|t| !t.changes.is_empty() || t.status != TargetStatus::Kept)
            || !self.nginx.is_empty()
    }
}

/// Keys of `before` and `after` compared in one merge walk (both sorted).
#[must_use]
pub fn diff_entries<'a>(
    before: impl Iterator<Item = (&'a str, &'a str)>,
    after: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<Change> {
    let mut out = Vec::new();
    let mut a = before.peekable();
    let mut b = after.peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.cmp(kb),
        };
        match order {
            std::cmp::Ordering::Less => {
                let (k, v) = a.next().expect("peeked");
                out.push(Change {
                    kind: ChangeKind::Removed,
                    key: k.into(),
                    before: Some(v.into()),
                    after: None,
                });
            }
            std::cmp::Ordering::Greater => {
                let (k, v) = b.next().expect("peeked");
                out.push(Change {
                    kind: ChangeKind::Added,
                    key: k.into(),
                    before: None,
                    after: Some(v.into()),
                });
            }
            std::cmp::Ordering::Equal => {
                let (k, va) = a.next().expect("peeked");
                let (_, vb) = b.next().expect("peeked");
                if va != vb {
                    out.push(Change {
                        kind: ChangeKind::Changed,
                        key: k.into(),
                        before: Some(va.into()),
                        after: Some(vb.into()),
                    });
                }
            }
        }
    }
    out
}

fn target_changes(before: Option<&Target>, after: Option<&Target>) -> Vec<Change> {
    match (before, after) {
        (Some(a), Some(b)) if Arc::ptr_eq(&a.sites, &b.sites) && a.routing == b.routing => {
            Vec::new()
        }
        (a, b) => {
            let mut changes = diff_entries(
                a.into_iter().flat_map(Target::entries),
                b.into_iter().flat_map(Target::entries),
            );
            // A diff never holds a key: certificate documents are shown
            // with the fingerprint in its place.
            for c in &mut changes {
                if edgestate::tls::is_cert_key(&c.key) {
                    let shown = |v: &Option<Arc<str>>| {
                        v.as_ref()
                            .map(|v| Arc::from(edgestate::tls::shown(&c.key, v).as_ref()))
                    };
                    (c.before, c.after) = (shown(&c.before), shown(&c.after));
                }
            }
            changes
        }
    }
}

/// Compare two compilations.
#[must_use]
pub fn diff(base: &Compiled, head: &Compiled) -> Diff {
    let names: BTreeSet<&String> = base.targets.keys().chain(head.targets.keys()).collect();
    let targets = names
        .into_iter()
        .map(|name| {
            let (a, b) = (base.targets.get(name), head.targets.get(name));
            let status = match (a, b) {
                (None, Some(_)) => TargetStatus::New,
                (Some(_), None) => TargetStatus::Gone,
                _ => TargetStatus::Kept,
            };
            let region = b.or(a).map(|t| t.region.clone()).unwrap_or_default();
            TargetDiff {
                node: name.clone(),
                region,
                status,
                changes: target_changes(a, b),
            }
        })
        .collect();
    let routers: BTreeSet<&String> = base.nginx.keys().chain(head.nginx.keys()).collect();
    let nginx = routers
        .into_iter()
        .filter_map(|r| {
            let (a, b) = (base.nginx.get(r), head.nginx.get(r));
            (a != b).then(|| FileChange {
                router: r.clone(),
                before: a.cloned(),
                after: b.cloned(),
            })
        })
        .collect();
    Diff { targets, nginx }
}

/// Pretty-print a value for reading: indented JSON when it is JSON.
#[must_use]
pub fn pretty(value: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
            let mut s = serde_json::to_string_pretty(&v).unwrap_or_else(|_| value.to_owned());
            s.push('\n');
            s
        }
        _ => format!("{value}\n"),
    }
}

/// A unified diff (3 lines of context) of two texts.
#[must_use]
pub fn unified(label: &str, before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{label}"), &format!("b/{label}"))
        .to_string()
}

/// The unified diff of a change's pretty-printed values.
#[must_use]
pub fn change_diff(change: &Change) -> String {
    let before = change.before.as_deref().map(pretty).unwrap_or_default();
    let after = change.after.as_deref().map(pretty).unwrap_or_default();
    unified(&change.key, &before, &after)
}

/// A Redis key or value for messages: valid UTF-8 as is (control
/// characters escaped), any other byte as `\xNN`.
#[must_use]
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_walk() {
        let a = [("a", "1"), ("b", "2"), ("d", "4")];
        let b = [("b", "2"), ("c", "3"), ("d", "5")];
        let changes = diff_entries(a.iter().copied(), b.iter().copied());
        let kinds: Vec<(ChangeKind, &str)> = changes.iter().map(|c| (c.kind, &*c.key)).collect();
        assert_eq!(
            kinds,
            [
                (ChangeKind::Removed, "a"),
                (ChangeKind::Added, "c"),
                (ChangeKind::Changed, "d")
            ]
        );
    }

    #[test]
    fn json_values_diff_pretty() {
        let c = Change {
            kind: ChangeKind::Changed,
            key: "site:a".into(),
            before: Some(r#"{"cached":true,"origin":"http://a"}"#.into()),
            after: Some(r#"{"cached":false,"origin":"http://a"}"#.into()),
        };
        let text = change_diff(&c);
        assert!(text.contains("-  \"cached\": true,"), "{text}");
        assert!(text.contains("+  \"cached\": false,"), "{text}");
        assert!(text.starts_with("--- a/site:a\n+++ b/site:a\n"), "{text}");
    }
}
