//! The JSON Schemas of the config files.
//!
//! The schemas are generated from [`crate::model::raw`] by `schemars` and
//! committed in `schemas/` (for editors: yaml-language-server reads the
//! `$schema` modeline). The committed files are embedded in the binary and
//! enforced; a test regenerates them and fails when they differ, so the
//! schemas and the model cannot drift (`EDGEFORM_BLESS=1 cargo test`
//! rewrites them).

use std::sync::OnceLock;

use jsonschema::{PatternOptions, Validator};
use serde_json::Value;

use crate::load::Kind;
use crate::model::raw;

/// Where the schema of each kind is published, relative to the repo root.
#[must_use]
pub fn file_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Cluster => "cluster.schema.json",
        Kind::Site => "site.schema.json",
        Kind::Zone => "zone.schema.json",
        Kind::Node => "node.schema.json",
    }
}

/// The committed schema text, embedded at build time.
#[must_use]
pub fn embedded(kind: Kind) -> &'static str {
    match kind {
        Kind::Cluster => include_str!("../../schemas/cluster.schema.json"),
        Kind::Site => include_str!("../../schemas/site.schema.json"),
        Kind::Zone => include_str!("../../schemas/zone.schema.json"),
        Kind::Node => include_str!("../../schemas/node.schema.json"),
    }
}

/// Generate the schema of `kind` from the raw model.
#[must_use]
pub fn generate(kind: Kind) -> Value {
    let mut schema = match kind {
        Kind::Cluster => schemars::schema_for!(raw::Cluster),
        Kind::Site => schemars::schema_for!(raw::Site),
        Kind::Zone => schemars::schema_for!(raw::Zone),
        Kind::Node => schemars::schema_for!(raw::Node),
    }
    .to_value();
    simplify(&mut schema);
    if let Value::Object(map) = &mut schema {
        map.insert(
            "$id".into(),
            Value::String(format!("https://edgeform.dev/schemas/{}", file_name(kind))),
        );
    }
    schema
}

/// Make schemars' output friendlier to validators and editors:
/// - a `oneOf` of `const`s (a documented enum) becomes an `enum`, so an
///   error names the allowed values instead of "no alternative matched";
/// - an optional block (`anyOf: [{$ref}, {type: null}]`) becomes the
///   `$ref`, so errors inside it keep their exact path;
/// - schemars' integer `format`s (`uint32`) and `default: null` go.
fn simplify(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(alternatives)) = map.get("oneOf")
                && !alternatives.is_empty()
                && alternatives.iter().all(|a| a.get("const").is_some())
            {
                let consts: Vec<Value> = alternatives
                    .iter()
                    .filter_map(|a| a.get("const").cloned())
                    .collect();
                let docs: Vec<String> = alternatives
                    .iter()
                    .filter_map(|a| {
                        let c = a.get("const")?.as_str()?;
                        let d = a.get("description")?.as_str()?;
                        Some(format!("`{c}`: {d}"))
                    })
                    .collect();
                map.remove("oneOf");
                map.insert("type".into(), Value::String("string".into()));
                map.insert("enum".into(), Value::Array(consts));
                if !docs.is_empty() {
                    let head = map
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let text = format!("{head}\n\n{}", docs.join("\n")).trim().to_owned();
                    map.insert("description".into(), Value::String(text));
                }
            }
            if let Some(Value::Array(alternatives)) = map.get("anyOf")
                && alternatives.len() == 2
                && alternatives[1] == serde_json::json!({"type": "null"})
                && let Value::Object(inner) = alternatives[0].clone()
            {
                map.remove("anyOf");
                for (k, v) in inner {
                    map.entry(k).or_insert(v);
                }
            }
            if map.get("format").and_then(Value::as_str).is_some_and(|f| {
                f.starts_with("uint") || f.starts_with("int") || f == "double" || f == "float"
            }) {
                map.remove("format");
            }
            if map.get("default") == Some(&Value::Null) {
                map.remove("default");
            }
            for v in map.values_mut() {
                simplify(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(simplify),
        _ => {}
    }
}

/// The generated schema as committed: pretty JSON with a final newline.
#[must_use]
pub fn generate_text(kind: Kind) -> String {
    let mut text = serde_json::to_string_pretty(&generate(kind)).unwrap_or_default();
    text.push('\n');
    text
}

/// The compiled validator of `kind` (built once per process).
///
/// # Panics
/// If an embedded schema is invalid: a build defect caught by the
/// schema tests, never by user input.
pub fn validator(kind: Kind) -> &'static Validator {
    static CELLS: [OnceLock<Validator>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let index = match kind {
        Kind::Cluster => 0,
        Kind::Site => 1,
        Kind::Zone => 2,
        Kind::Node => 3,
    };
    CELLS[index].get_or_init(|| {
        let schema: Value =
            serde_json::from_str(embedded(kind)).expect("embedded schema is valid JSON");
        jsonschema::draft202012::options()
            .should_validate_formats(true)
            .with_pattern_options(PatternOptions::regex())
            .build(&schema)
            .expect("embedded schema compiles")
    })
}

/// The configuration reference (`docs/configuration.md`), generated from
/// the schemas so the two cannot drift (checked by a test like the
/// schemas themselves).
#[must_use]
pub fn reference_markdown() -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from `schemas/*.schema.json` (themselves generated from the compiler's \
         raw model); do not edit by hand. `EDGEFORM_BLESS=1 cargo test` regenerates it.\n\n\
         Editors: put a yaml-language-server modeline on the first line of each file, e.g. \
         `# yaml-language-server: $schema=../schemas/site.schema.json` in `sites/*.yaml` \
         (`schemas/cluster.schema.json` for `cluster.yaml`).\n",
    );
    for (kind, title, place) in [
        (
            Kind::Site,
            "Site",
            "`sites/<anything>.yaml`, one site per file",
        ),
        (
            Kind::Zone,
            "Zone",
            "`zones/<anything>.yaml`, one zone per file",
        ),
        (
            Kind::Node,
            "Node",
            "`nodes/<anything>.yaml`, one node per file",
        ),
        (Kind::Cluster, "Cluster", "`cluster.yaml` (optional)"),
    ] {
        let schema = generate(kind);
        let _ = writeln!(out, "\n## {title}: {place}\n");
        if let Some(d) = schema.get("description").and_then(Value::as_str) {
            let _ = writeln!(out, "{}\n", d.replace('\n', " "));
        }
        table(&mut out, kind, &schema, &schema, "");
    }
    out.push_str(RULE_REGEXES);
    out
}

/// The accepted regex subset of rules (see `rule_regex.rs`).
const RULE_REGEXES: &str = r#"
## Rule regexes (`match_type: regex`)

A rule's regex runs on the edge in nginx + Lua (`ngx.re`: the Lua module
links PCRE1, `libpcre.so.3`, used without its UTF mode — a backtracking
engine over the path's bytes), and in `edgeform explain` with Rust's
`regex::bytes`, Unicode off. `edgeform check` accepts one dialect: what
both read identically, and what cannot make PCRE backtrack badly.

- **ASCII only.** The pattern is ASCII text; a byte above 0x7f is written
  `\xHH` (two hex digits). No Unicode classes (`\p{Letter}`, `\pL`), no
  `\x{…}`, `\u`, `\U` escapes. `\d`, `\w`, `\s`, `\b`, POSIX classes
  (`[[:alpha:]]`) and `(?i)` are ASCII-only in both engines; `.` is one
  byte (a UTF-8 `é` in the path is two).
- valid Rust `regex` syntax: no look-around, back-references, recursion
  (`(?1)`), possessive quantifiers or atomic groups;
- none of the syntax PCRE reads differently or not at all: the `R` flag
  (`(?R)` is recursion in PCRE), the `u` flag, the `x` flag (PCRE keeps
  spaces inside classes), class set operations (`[a-z&&[^aeiou]]`, `--`,
  `~~`), a class nested in a class (`[a[bc]]`), `\b{start}`/`\<`/`\>` word
  boundaries, `\v` (vertical whitespace in PCRE, a tab in Rust: write
  `\x0B`), a repetition of a repetition (`a{2}{3}`: write `(?:a{2}){3}`),
  a group name PCRE refuses (it takes a letter or `_`, then letters,
  digits or `_`, at most 32);
- **no nested repetition** (the `nested repetition` rule): no unbounded
  repetition (`*`, `+`, `{n,}`) inside another (`^(a+)+$`, `(a*)*`, also
  `(?:/[^/]+)*`: write `(?:/[^/]+){0,8}` or `(?:/.*)?`), and no counted
  repetition (`{12}`, `{1,3}`) of something ending in an unbounded
  repetition that can take the next round's first character
  (`^/(?:a+){12}$` is `a+a+…a+`; `(?:/[^/]+){0,8}` is fine);
- **no ambiguous alternation** (the `ambiguous alternation` rule): under
  an unbounded repetition, no alternation whose branches can start with
  the same character or match empty (`(a|a)*`, `(a|ab)+`, `(a|)*`);
- **no adjacent repetition** (the `adjacent repetition` rule): no two
  unbounded repetitions in a row (past parts that can match empty) that
  can match the same character (`a*a*`, `\d+[0-9]*`, `x.*(b)?.*y`), also
  where a group or an alternative ends with one and the next begins with
  one (`(a+)(a+)`, `(?:x|a+)(?:x|a+)`, `(?:a+c?)a+`);
- nested repetition counts multiplying to at most 1000 (`(?:a{1000}){1000}`
  is refused), at most 4096 bytes, and at most 32 KiB once compiled, as
  `check` estimates it from above. PCRE compiles a pattern into at most 64
  KiB and writes a repeated group out once per count:
  `^/(?:abcdefghijklmnopqrstuvwxyz0123456789){999}$` is past it, so the
  edge could not use it. A repeated single item is stored once with its
  counts: `[a-z]{36}` costs one copy, `(?:[a-z]){36}` 36. A test
  compiles thousands of generated patterns with the edge's own PCRE and
  checks the estimate is never below the size of its code.

The edge also bounds every match at run time: the edge's nginx template sets
`lua_regex_match_limit 100000` (PCRE's limit is 10,000,000 by default:
25–50 ms of a worker's CPU for `^/(?:a+){12}$` on 30 `a`s). A match past
the limit, or a document whose regex PCRE cannot compile (written into
Redis past `check`), answers 502 `bad-document` (docs/edge.md) — never "no
match". `explain` cannot reproduce a match limit; `check` refuses the
patterns that reach it. PCRE's `$` also matches before a final newline,
Rust's does not: the path the edge matches (the request line's) never
holds a raw newline.
"#;

/// One table per mapping, its rows in the order `edgeform fmt` writes the
/// keys (keys `fmt` does not order last, alphabetically), nested mappings
/// after it.
fn table(out: &mut String, kind: Kind, root: &Value, object: &Value, prefix: &str) {
    use std::fmt::Write as _;
    let required: Vec<&str> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = object.get("properties").and_then(Value::as_object) else {
        return;
    };
    if prefix.is_empty() {
        let _ = writeln!(
            out,
            "| key | type | required | description |\n|---|---|---|---|"
        );
    }
    let path: Vec<&str> = prefix
        .split('.')
        .filter(|p| !p.is_empty())
        .map(|p| p.trim_end_matches("[]"))
        .collect();
    let order = crate::fmt::order(kind, &path);
    let mut rows: Vec<(&String, &Value)> = props.iter().collect();
    rows.sort_by_key(|(name, _)| {
        (
            order
                .iter()
                .position(|k| *k == name.as_str())
                .unwrap_or(usize::MAX),
            name.as_str(),
        )
    });
    let mut nested = Vec::new();
    for (name, prop) in rows {
        let resolved = deref(root, prop);
        let ty = type_text(root, prop);
        let desc = prop
            .get("description")
            .or_else(|| resolved.get("description"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .replace('\n', " ")
            .replace('|', "\\|");
        let _ = writeln!(
            out,
            "| `{prefix}{name}` | {ty} | {} | {desc} |",
            if required.contains(&name.as_str()) {
                "yes"
            } else {
                ""
            }
        );
        if resolved.get("properties").is_some() {
            nested.push((format!("{prefix}{name}."), resolved));
        }
        if let Some(items) = resolved.get("items") {
            let items = deref(root, items);
            if items.get("properties").is_some() {
                nested.push((format!("{prefix}{name}[]."), items));
            }
        }
    }
    for (p, o) in nested {
        table(out, kind, root, o, &p);
    }
}

fn deref<'a>(root: &'a Value, v: &'a Value) -> &'a Value {
    v.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|p| root.pointer(p))
        .unwrap_or(v)
}

fn type_text(root: &Value, prop: &Value) -> String {
    let v = deref(root, prop);
    if let Some(e) = v.get("enum").and_then(Value::as_array) {
        let names: Vec<String> = e
            .iter()
            .filter(|x| !x.is_null())
            .map(|x| format!("`{}`", x.to_string().trim_matches('"')))
            .collect();
        return names.join(" \\| ");
    }
    let base = match v.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "value".into(),
    };
    if base == "array"
        && let Some(items) = v.get("items")
    {
        return format!("list of {}", type_text(root, items));
    }
    match base.as_str() {
        "object" => "mapping".into(),
        "boolean" => "bool".into(),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of every mapping in a schema, with the path leading to it.
    fn keys<'a>(
        root: &'a Value,
        object: &'a Value,
        path: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, String)>,
    ) {
        let Some(props) = object.get("properties").and_then(Value::as_object) else {
            return;
        };
        for (name, prop) in props {
            out.push((path.clone(), name.clone()));
            let resolved = deref(root, prop);
            let inner = resolved
                .get("items")
                .map_or(resolved, |items| deref(root, items));
            path.push(name.clone());
            keys(root, inner, path, out);
            path.pop();
        }
    }

    /// `fmt` orders every key the schemas know, so the reference's tables
    /// list each mapping's keys as `fmt` writes them.
    #[test]
    fn fmt_orders_every_key_the_schemas_know() {
        for kind in [Kind::Site, Kind::Zone, Kind::Node, Kind::Cluster] {
            let schema = generate(kind);
            let mut found = Vec::new();
            keys(&schema, &schema, &mut Vec::new(), &mut found);
            assert!(!found.is_empty());
            for (path, name) in found {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                assert!(
                    crate::fmt::order(kind, &path).contains(&name.as_str()),
                    "{kind:?} {path:?}: `{name}` has no place in fmt's order"
                );
            }
        }
    }
}
