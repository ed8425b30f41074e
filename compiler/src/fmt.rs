//! Canonical formatting of config files (`edgeform fmt`), and the YAML
//! writer `edgeform import` uses.
//!
//! **Canonical form.** Keys in the order of the model's fields
//! ([`order`], the order of `model::raw` and of `docs/configuration.md`;
//! a test checks the lists against the JSON Schemas), keys the model does
//! not know after them, alphabetically. Two-space indentation; block
//! mappings; sequences of scalars in flow style (`[a, b]`) when they fit in
//! 80 columns, else one `- item` per line; a mapping of scalars that is a
//! key's value (`location`, `redis`) in flow style when it fits; mappings
//! inside sequences always in block style. Strings plain when YAML reads
//! them back as the same string, else double-quoted (JSON escapes).
//!
//! **Comments.** The YAML parser does not keep comments, so formatting
//! re-emits the document and moves comments itself, only where their
//! owner is certain: the comment lines before the first key (the file's
//! header, e.g. the `yaml-language-server` modeline) stay on top, and
//! full-line comments in column 1 directly above a top-level key travel
//! with that key. A file with any other comment (at the end of a line,
//! indented, inside a value) is refused, naming the comment's
//! `file:line`, and left untouched.
//!
//! Pure: text in, text out. The result is checked by parsing it again: it
//! must mean exactly what the input meant.

use std::fmt::Write as _;

use serde_json::Value;

use crate::load::Kind;

/// Sequences of scalars and mappings of scalars stay on one line up to
/// this many columns.
const WIDTH: usize = 80;

/// The canonical key order of the mapping at `path` (keys leading to it;
/// sequence indices left out) in a file of `kind`. Empty: no known keys.
#[must_use]
pub fn order(kind: Kind, path: &[&str]) -> &'static [&'static str] {
    match (kind, path) {
        (Kind::Site, []) => &[
            "host",
            "aliases",
            "origin",
            "origins",
            "loopback",
            "origin_tls_verify",
            "tls",
            "https_redirect",
            "max_body_size",
            "cached",
            "suspended",
            "geo_mode",
            "geo_codes",
            "ip_mode",
            "ip_list",
            "rate_mode",
            "waf_mode",
            "cors_mode",
            "hotlink_mode",
            "cache_rules",
            "edge_rules",
            "regions",
            "rollout",
        ],
        (Kind::Site, ["rollout"]) => &[
            "min_requests",
            "max_5xx_ratio_increase",
            "max_refusal_ratio_increase",
            "max_hit_ratio_drop",
        ],
        (Kind::Site, ["tls"]) => &["certificate", "acme"],
        (Kind::Site, ["cache_rules"]) => &["match_type", "match_value", "action", "ttl"],
        (Kind::Site, ["edge_rules"]) => &[
            "match_type",
            "match_value",
            "action",
            "redirect_status",
            "redirect_to",
        ],
        (Kind::Zone, []) => &["name", "routes", "fallback"],
        (Kind::Node, []) => &[
            "name",
            "roles",
            "region",
            "zone",
            "drain",
            "public_url",
            "location",
            "addresses",
            "loopback",
            "redis",
            "playback_session_limit",
            "playback_bandwidth_kbit",
            "network_bandwidth_kbit",
            "cache",
            "https",
            "install",
        ],
        (Kind::Node, ["location"]) => &["lat", "lon"],
        (Kind::Node, ["redis"]) => &[
            "url",
            "sentinels",
            "master",
            "username",
            "password_env",
            "tls",
        ],
        (Kind::Node, ["redis", "tls"]) => &["ca_file", "cert_file", "key_file"],
        (Kind::Node, ["cache"]) => &["dirs", "levels", "key"],
        (Kind::Node, ["https"]) => &["listen", "proxy_listen"],
        (Kind::Node, ["install"]) => &[
            "ssh",
            "user",
            "root",
            "listen",
            "smoke_listen",
            "keep",
            "vars",
            "candidate_vars",
            "restart_on_change",
        ],
        (Kind::Cluster, []) => &[
            "name",
            "trusted_proxies",
            "mqtt",
            "apply",
            "geo",
            "anycast",
            "acme",
        ],
        (Kind::Cluster, ["acme"]) => &["directory", "contact", "ca_file", "order_timeout"],
        (Kind::Cluster, ["mqtt"]) => &["url", "topic_prefix"],
        (Kind::Cluster, ["apply"]) => &[
            "max_delete_percent",
            "max_change_percent",
            "min_keys",
            "freeze",
            "waves",
            "prometheus",
            "auto_rollback",
            "gate",
        ],
        (Kind::Cluster, ["apply", "freeze"]) => &["name", "start", "end", "reason"],
        (Kind::Cluster, ["apply", "waves"]) => &["name", "nodes", "regions", "roles", "bake"],
        (Kind::Cluster, ["apply", "gate"]) => &[
            "min_requests",
            "max_5xx_ratio_increase",
            "max_refusal_ratio_increase",
            "max_hit_ratio_drop",
        ],
        (Kind::Cluster, ["geo"]) => &[
            "tie_km",
            "buckets",
            "default_weight",
            "max_fails",
            "fail_timeout",
        ],
        (Kind::Cluster, ["geo", "buckets"]) => &["below_km", "weight"],
        (Kind::Cluster, ["anycast"]) => &[
            "origin_asns",
            "prefixes",
            "upstreams",
            "lopsided_share",
            "longer_path_hops",
        ],
        (Kind::Cluster, ["anycast", "prefixes"]) => &["prefix", "name", "upstreams"],
        (Kind::Cluster, ["anycast", "upstreams"]) => &["name", "asn"],
        _ => &[],
    }
}

/// Every mapping path [`order`] knows, per kind (for the schema test).
pub const ORDERED_PATHS: &[(Kind, &[&str])] = &[
    (Kind::Site, &[]),
    (Kind::Site, &["tls"]),
    (Kind::Site, &["cache_rules"]),
    (Kind::Site, &["edge_rules"]),
    (Kind::Site, &["rollout"]),
    (Kind::Zone, &[]),
    (Kind::Node, &[]),
    (Kind::Node, &["location"]),
    (Kind::Node, &["redis"]),
    (Kind::Node, &["cache"]),
    (Kind::Node, &["install"]),
    (Kind::Cluster, &[]),
    (Kind::Cluster, &["mqtt"]),
    (Kind::Cluster, &["apply"]),
    (Kind::Cluster, &["apply", "freeze"]),
    (Kind::Cluster, &["apply", "waves"]),
    (Kind::Cluster, &["apply", "gate"]),
    (Kind::Cluster, &["geo"]),
    (Kind::Cluster, &["geo", "buckets"]),
    (Kind::Cluster, &["anycast"]),
    (Kind::Cluster, &["anycast", "prefixes"]),
    (Kind::Cluster, &["anycast", "upstreams"]),
    (Kind::Cluster, &["acme"]),
];

/// A mapping's entries in canonical order.
fn sorted<'a>(
    kind: Kind,
    path: &[&str],
    map: &'a serde_json::Map<String, Value>,
) -> Vec<(&'a str, &'a Value)> {
    let known = order(kind, path);
    let mut out: Vec<(&str, &Value)> = known
        .iter()
        .filter_map(|k| map.get_key_value(*k).map(|(k, v)| (k.as_str(), v)))
        .collect();
    // serde_json's map is sorted: unknown keys come alphabetically.
    out.extend(
        map.iter()
            .filter(|(k, _)| !known.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v)),
    );
    out
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

/// A scalar as YAML text.
#[must_use]
pub fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        // Not a scalar; callers never pass one.
        Value::Array(_) | Value::Object(_) => serde_json::to_string(v).unwrap_or_default(),
    }
}

/// A string, plain when YAML reads it back unchanged (in block and flow
/// context), else double-quoted.
fn string(s: &str) -> String {
    let plain_chars = !s.is_empty()
        && s.chars().all(|c| {
            c.is_alphanumeric() || matches!(c, '.' | '/' | '-' | '_' | '$' | '^' | '+' | ':' | '=')
        })
        && !s.starts_with(['-', ':'])
        && !s.ends_with(':')
        && !s.contains(": ")
        && !looks_sexagesimal(s);
    if plain_chars && reads_back_as(s) {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

/// YAML 1.1 tools read `1:2` as a base-60 number: such strings are quoted
/// for them, although edgeform (YAML 1.2) reads them as strings.
fn looks_sexagesimal(s: &str) -> bool {
    s.contains(':')
        && s.chars()
            .all(|c| c.is_ascii_digit() || c == ':' || c == '_')
}

/// Whether `text`, as a plain scalar in flow context, is the string `text`.
fn reads_back_as(text: &str) -> bool {
    let doc = format!("[{text}]");
    matches!(
        yamlspan::parse(&doc),
        Ok(Some(yamlspan::Node { value: yamlspan::Value::Seq(items), .. }))
            if items.len() == 1 && items[0].value == yamlspan::Value::Str(text.to_owned())
    )
}

fn flow(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) if items.iter().all(is_scalar) => Some(format!(
            "[{}]",
            items.iter().map(scalar).collect::<Vec<_>>().join(", ")
        )),
        _ => None,
    }
}

fn flow_map(kind: Kind, path: &[&str], map: &serde_json::Map<String, Value>) -> Option<String> {
    if map.is_empty() || !map.values().all(is_scalar) {
        return None;
    }
    Some(format!(
        "{{{}}}",
        sorted(kind, path, map)
            .iter()
            .map(|(k, v)| format!("{}: {}", string(k), scalar(v)))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Write the entries of a block mapping at `indent`.
fn block_map(
    out: &mut String,
    kind: Kind,
    path: &[&str],
    map: &serde_json::Map<String, Value>,
    indent: usize,
    first_prefix: Option<&str>,
) {
    for (i, (key, value)) in sorted(kind, path, map).into_iter().enumerate() {
        let pad = match (i, first_prefix) {
            (0, Some(p)) => p.to_owned(),
            _ => " ".repeat(indent),
        };
        entry(out, kind, path, &pad, indent, key, value);
    }
}

fn entry(
    out: &mut String,
    kind: Kind,
    path: &[&str],
    pad: &str,
    indent: usize,
    key: &str,
    value: &Value,
) {
    let head = format!("{pad}{}:", string(key));
    let mut child: Vec<&str> = path.to_vec();
    child.push(key);
    match value {
        Value::Array(items) if items.is_empty() => {
            let _ = writeln!(out, "{head} []");
        }
        Value::Object(map) if map.is_empty() => {
            let _ = writeln!(out, "{head} {{}}");
        }
        Value::Array(items) => {
            if let Some(f) = flow(value).filter(|f| head.chars().count() + 1 + f.len() <= WIDTH) {
                let _ = writeln!(out, "{head} {f}");
                return;
            }
            let _ = writeln!(out, "{head}");
            sequence(out, kind, &child, items, indent + 2);
        }
        Value::Object(map) => {
            if let Some(f) =
                flow_map(kind, &child, map).filter(|f| head.chars().count() + 1 + f.len() <= WIDTH)
            {
                let _ = writeln!(out, "{head} {f}");
                return;
            }
            let _ = writeln!(out, "{head}");
            block_map(out, kind, &child, map, indent + 2, None);
        }
        _ => {
            let _ = writeln!(out, "{head} {}", scalar(value));
        }
    }
}

fn sequence(out: &mut String, kind: Kind, path: &[&str], items: &[Value], indent: usize) {
    let pad = " ".repeat(indent);
    for item in items {
        match item {
            Value::Object(map) if !map.is_empty() => {
                let first = format!("{pad}- ");
                block_map(out, kind, path, map, indent + 2, Some(&first));
            }
            Value::Array(inner) if !inner.is_empty() => {
                let f =
                    flow(item).unwrap_or_else(|| serde_json::to_string(item).unwrap_or_default());
                let _ = writeln!(out, "{pad}- {f}");
                let _ = inner;
            }
            Value::Array(_) => {
                let _ = writeln!(out, "{pad}- []");
            }
            Value::Object(_) => {
                let _ = writeln!(out, "{pad}- {{}}");
            }
            _ => {
                let _ = writeln!(out, "{pad}- {}", scalar(item));
            }
        }
    }
}

/// The canonical YAML text of a document (no comments).
#[must_use]
pub fn emit(kind: Kind, doc: &Value) -> String {
    let mut out = String::new();
    match doc {
        Value::Object(map) => block_map(&mut out, kind, &[], map, 0, None),
        other => {
            let _ = writeln!(out, "{}", scalar(other));
        }
    }
    out
}

/// Why a file cannot be formatted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line.
    pub line: u32,
    pub message: String,
}

/// Format one file's text. `Ok(None)`: nothing to format (empty, or only
/// comments).
///
/// # Errors
/// YAML errors, and comments whose owner is not certain (see the module
/// docs): the file is then left as it is.
pub fn format(kind: Kind, text: &str) -> Result<Option<String>, Refusal> {
    let tree = match yamlspan::parse(text) {
        Ok(Some(tree)) => tree,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(Refusal {
                line: e.span.line,
                message: format!("{}: {}", e.kind.code(), e.message),
            });
        }
    };
    let lines: Vec<&str> = text.lines().collect();
    let comments = comment_lines(text, &tree);
    let yamlspan::Value::Map(entries) = &tree.value else {
        if let Some(&(line, _)) = comments.first() {
            return Err(refuse_comment(line));
        }
        return Ok(Some(emit(kind, &tree.to_json())));
    };
    // Top-level keys by line.
    let key_lines: Vec<(u32, &str)> = entries
        .iter()
        .map(|(k, _)| (k.span.line, k.text.as_str()))
        .collect();
    let first_key_line = key_lines.iter().map(|k| k.0).min().unwrap_or(u32::MAX);
    let mut header: Vec<&str> = Vec::new();
    let mut attached: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    let mut footer: Vec<&str> = Vec::new();
    let last_content = last_content_line(&lines, &comments);
    for &(line, full_line_col1) in &comments {
        let text_of = lines.get(line as usize - 1).copied().unwrap_or_default();
        if !full_line_col1 {
            return Err(refuse_comment(line));
        }
        if line < first_key_line {
            // Comment lines directly above the first key (no blank line
            // between) are its own; the rest, and the editor's modeline,
            // are the file's header.
            let contiguous = (line as usize..first_key_line as usize - 1)
                .all(|i| lines[i].trim_start().starts_with('#'));
            if contiguous
                && !text_of.starts_with("# yaml-language-server:")
                && let Some(&(_, key)) = key_lines.iter().find(|k| k.0 == first_key_line)
            {
                attached.entry(key).or_default().push(text_of);
                continue;
            }
            header.push(text_of);
            continue;
        }
        if line > last_content {
            footer.push(text_of);
            continue;
        }
        // The next line that is neither blank nor a comment must be a
        // top-level key.
        let next = (line as usize..lines.len())
            .find(|&i| {
                let t = lines[i].trim();
                !t.is_empty() && !t.starts_with('#')
            })
            .map(|i| u32::try_from(i + 1).unwrap_or(u32::MAX));
        match next.and_then(|n| key_lines.iter().find(|k| k.0 == n)) {
            Some(&(_, key)) => attached.entry(key).or_default().push(text_of),
            None => return Err(refuse_comment(line)),
        }
    }

    let json = tree.to_json();
    let Value::Object(map) = &json else {
        return Ok(Some(emit(kind, &json)));
    };
    let mut out = String::new();
    for h in &header {
        out.push_str(h);
        out.push('\n');
    }
    for (i, (key, value)) in sorted(kind, &[], map).into_iter().enumerate() {
        if let Some(cs) = attached.get(key) {
            if i > 0 {
                out.push('\n');
            }
            for c in cs {
                out.push_str(c);
                out.push('\n');
            }
        }
        entry(&mut out, kind, &[], "", 0, key, value);
    }
    if !footer.is_empty() {
        out.push('\n');
        for f in &footer {
            out.push_str(f);
            out.push('\n');
        }
    }
    // The result must mean what the input meant.
    let back = yamlspan::parse(&out)
        .ok()
        .flatten()
        .map(|n| n.to_json())
        .unwrap_or(Value::Null);
    if back != json {
        return Err(Refusal {
            line: 1,
            message: "edgeform cannot write this file canonically without changing its meaning \
                      (please report it)"
                .into(),
        });
    }
    Ok(Some(out))
}

fn refuse_comment(line: u32) -> Refusal {
    Refusal {
        line,
        message: "a comment here cannot be kept when formatting: only comment lines at the top \
                  of the file and full-line comments in column 1 directly above a top-level key \
                  are moved with their key; move it there (or remove it)"
            .into(),
    }
}

fn last_content_line(lines: &[&str], comments: &[(u32, bool)]) -> u32 {
    (0..lines.len())
        .rev()
        .find(|&i| {
            let t = lines[i].trim();
            !t.is_empty() && !comments.iter().any(|c| c.0 as usize == i + 1 && c.1)
        })
        .map_or(0, |i| u32::try_from(i + 1).unwrap_or(u32::MAX))
}

/// Every comment: its 1-based line and whether it is a whole line starting
/// in column 1. A `#` starts a comment when it begins a line or follows
/// whitespace and lies in no scalar.
fn comment_lines(text: &str, tree: &yamlspan::Node) -> Vec<(u32, bool)> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    collect_spans(tree, &mut spans);
    spans.sort_unstable();
    let inside = |pos: usize| {
        let i = spans.partition_point(|s| s.0 <= pos);
        spans[..i].iter().rev().take(64).any(|s| pos < s.1)
    };
    let mut out = Vec::new();
    let mut line_start = 0usize;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'#'
                && (i == 0 || matches!(bytes[i - 1], b' ' | b'\t'))
                && !inside(line_start + i)
            {
                let whole = line[..i].trim().is_empty();
                out.push((u32::try_from(n + 1).unwrap_or(u32::MAX), whole && i == 0));
                break;
            }
        }
        line_start += line.len();
    }
    out
}

fn collect_spans(node: &yamlspan::Node, out: &mut Vec<(usize, usize)>) {
    match &node.value {
        yamlspan::Value::Seq(items) => items.iter().for_each(|n| collect_spans(n, out)),
        yamlspan::Value::Map(entries) => {
            for (k, v) in entries {
                out.push((k.span.start, k.span.end));
                collect_spans(v, out);
            }
        }
        _ => out.push((node.span.start, node.span.end)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(kind: Kind, text: &str) -> String {
        format(kind, text).unwrap().unwrap()
    }

    #[test]
    fn orders_keys_and_keeps_header_and_key_comments() {
        let text = "# header\n# more\norigin: http://a\n\n# the host\nhost: a.example.com\naliases:\n- b.example.com\ncache_rules:\n  - {action: ttl, ttl: 5, match_value: .mp4, match_type: ext}\n";
        let out = fmt(Kind::Site, text);
        assert_eq!(
            out,
            "# the host\nhost: a.example.com\naliases: [b.example.com]\n\n# header\n# more\norigin: http://a\ncache_rules:\n  - match_type: ext\n    match_value: .mp4\n    action: ttl\n    ttl: 5\n"
        );
        assert_eq!(fmt(Kind::Site, &out), out, "idempotent");
        // The modeline and a header set apart by a blank line stay on top.
        let text = "# yaml-language-server: $schema=x\n# top\n\n# about origin\norigin: http://a\nhost: a.example.com\n";
        let out = fmt(Kind::Site, text);
        assert_eq!(
            out,
            "# yaml-language-server: $schema=x\n# top\nhost: a.example.com\n\n# about origin\norigin: http://a\n"
        );
        assert_eq!(fmt(Kind::Site, &out), out, "idempotent");
    }

    #[test]
    fn refuses_comments_it_cannot_place() {
        for (text, line) in [
            ("host: a.example.com  # trailing\norigin: http://a\n", 1),
            (
                "host: a.example.com\ncache_rules:\n  # indented\n  - {match_type: ext}\n",
                3,
            ),
            (
                "host: a.example.com\ncache_rules:\n# col 1 but inside a value\n  - {match_type: ext}\n",
                3,
            ),
        ] {
            let err = format(Kind::Site, text).unwrap_err();
            assert_eq!(err.line, line, "{text}");
        }
        // A `#` inside a scalar is not a comment.
        let out = fmt(
            Kind::Site,
            "host: a.example.com\norigin: \"http://a/#x\"\nx: a#b\n",
        );
        assert!(
            out.contains("\"http://a/#x\"") && out.contains("x: \"a#b\""),
            "{out}"
        );
    }

    #[test]
    fn strings_are_quoted_when_yaml_would_read_something_else() {
        for s in [
            "true", "null", "~", "1", "0x1F", "1e3", ".inf", "", " a", "a: b", "*.x.com", "[a]",
            "\\.ts$", "off",
        ] {
            let text = scalar(&Value::String(s.into()));
            let back = yamlspan::parse(&format!("k: {text}\n"))
                .unwrap()
                .unwrap()
                .to_json();
            assert_eq!(back["k"], Value::String(s.into()), "{s} → {text}");
        }
        assert_eq!(scalar(&Value::String("off".into())), "off");
        assert_eq!(scalar(&Value::String("1:2".into())), "\"1:2\"");
        assert_eq!(scalar(&Value::String("http://a:80".into())), "http://a:80");
    }

    #[test]
    fn long_flow_sequences_break_into_blocks() {
        let codes: Vec<String> = (0..40).map(|i| format!("A{i}")).collect();
        let doc = serde_json::json!({"host": "a.example.com", "geo_codes": codes});
        let out = emit(Kind::Site, &doc);
        assert!(out.contains("geo_codes:\n  - A0\n  - A1\n"), "{out}");
        let doc = serde_json::json!({"name": "n", "location": {"lon": 4.5, "lat": 52}});
        assert_eq!(
            emit(Kind::Node, &doc),
            "name: n\nlocation: {lat: 52, lon: 4.5}\n"
        );
    }
}
