//! Per-file stage: YAML → spanned tree → JSON Schema → typed raw model.
//!
//! Pure: takes a [`Source`]'s text, returns the raw value (when the file is
//! well-formed) and every diagnostic found in it, each pointing at the
//! offending key or value. Files are independent, so callers run this in
//! parallel.

use std::sync::{Arc, OnceLock};

use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::Value as Json;

use crate::diagnostic::Diagnostic;
use crate::load::{Kind, Source};
use crate::model::raw;
use crate::schema;
use yamlspan::{self as yaml, Node};

/// A file's typed content.
#[derive(Debug, Clone)]
pub enum Raw {
    Cluster(raw::Cluster),
    Site(raw::Site),
    Zone(raw::Zone),
    Node(raw::Node),
}

/// The outcome for one file.
///
/// The spanned tree is not kept: on a large repository the trees of every
/// file would take ~16× the YAML's size, and only the files with a
/// problem need one. [`ParsedFile::locate`] parses the file's text again,
/// once, the first time a position is asked for (a file that already had a
/// diagnostic while parsing keeps the tree it was parsed into). The text is
/// the same, so the tree and every span are the same as the first parse's.
#[derive(Debug)]
pub struct ParsedFile<'a> {
    pub kind: Kind,
    pub path: Arc<str>,
    /// The file's text (`None`: unreadable), for the lazy tree.
    text: Option<&'a str>,
    /// The spanned tree, built on demand (`None` inside: no tree, i.e. the
    /// file is unreadable, empty, or not YAML).
    tree: OnceLock<Option<Box<Node>>>,
    pub diagnostics: Vec<Diagnostic>,
}

impl ParsedFile<'_> {
    /// The spanned tree of the file, parsed again on the first call.
    #[must_use]
    pub fn tree(&self) -> Option<&Node> {
        self.tree
            .get_or_init(|| {
                self.text
                    .and_then(|t| yaml::parse(t).ok().flatten())
                    .map(Box::new)
            })
            .as_deref()
    }

    /// The span of the value at a JSON pointer (the file's start when the
    /// tree is missing).
    #[must_use]
    pub fn locate(&self, pointer: &str) -> yaml::Span {
        self.tree()
            .map_or_else(yaml::Span::default, |t| t.locate(pointer))
    }
}

fn kind_noun(kind: Kind) -> &'static str {
    match kind {
        Kind::Cluster => "cluster settings",
        Kind::Site => "site",
        Kind::Zone => "zone",
        Kind::Node => "node",
    }
}

fn file_start() -> yaml::Span {
    yaml::Span {
        start: 0,
        end: 0,
        line: 1,
        column: 1,
    }
}

/// Parse and schema-check one file: its diagnostics (see [`parse_typed`]
/// for its typed content too).
#[must_use]
pub fn parse_file(source: &Source) -> ParsedFile<'_> {
    parse_typed(source).0
}

/// Parse and schema-check one file: the file (diagnostics, lazy tree) and
/// its typed content when its shape allows. The tree is dropped before
/// returning unless the file already has a diagnostic (see
/// [`ParsedFile`]).
#[must_use]
pub fn parse_typed(source: &Source) -> (ParsedFile<'_>, Option<Raw>) {
    let mut out = ParsedFile {
        kind: source.kind,
        path: source.path.clone(),
        text: source.text.as_deref().ok(),
        tree: OnceLock::new(),
        diagnostics: Vec::new(),
    };
    let raw = parse_into(source, &mut out);
    (out, raw)
}

fn parse_into(source: &Source, out: &mut ParsedFile<'_>) -> Option<Raw> {
    let text = match &source.text {
        Ok(text) => text,
        Err(why) => {
            let _ = out.tree.set(None);
            out.diagnostics.push(Diagnostic::error(
                why.code(),
                &out.path,
                file_start(),
                format!("cannot read this file: {why}"),
            ));
            return None;
        }
    };
    let tree = match yaml::parse(text) {
        Ok(Some(tree)) => tree,
        Ok(None) if source.kind == Kind::Cluster => {
            let _ = out.tree.set(None);
            return Some(Raw::Cluster(raw::Cluster::default()));
        }
        Ok(None) => {
            let _ = out.tree.set(None);
            out.diagnostics.push(
                Diagnostic::error(
                    "empty-file",
                    &out.path,
                    file_start(),
                    format!("this {} file is empty", kind_noun(source.kind)),
                )
                .with_help(required_help(source.kind)),
            );
            return None;
        }
        Err(e) => {
            let _ = out.tree.set(None);
            out.diagnostics.push(Diagnostic::error(
                e.kind.code(),
                &out.path,
                e.span,
                e.message,
            ));
            return None;
        }
    };
    let json = tree.to_json();
    let validator = schema::validator(source.kind);
    let mut typed = None;
    if validator.is_valid(&json) {
        match deserialize(source.kind, json) {
            Ok(raw) => typed = Some(raw),
            Err(e) => out.diagnostics.push(Diagnostic::error(
                "invalid-value",
                &out.path,
                tree.span,
                e.to_string(),
            )),
        }
    } else {
        // Still type the file when its shape allows, so the semantic rules
        // report their problems in the same run (a bad host pattern should
        // not hide a bad origin). Values the schema refused but serde took
        // are then checked again; `diagnostic::sort` keeps one per place.
        typed = deserialize(source.kind, json.clone()).ok();
        for error in validator.iter_errors(&json) {
            out.diagnostics.push(schema_diagnostic(
                source.kind,
                &out.path,
                &tree,
                error.instance_path().as_str(),
                error.kind(),
                &error.to_string(),
            ));
        }
    }
    if !out.diagnostics.is_empty() {
        // Its semantic problems will be located in it too.
        let _ = out.tree.set(Some(Box::new(tree)));
    }
    typed
}

fn required_help(kind: Kind) -> &'static str {
    match kind {
        Kind::Site => "a site needs at least `host` and `origin` (or `origins`)",
        Kind::Zone => "a zone needs at least `name`",
        Kind::Node => "a node needs at least `name`, `roles` and `region`",
        Kind::Cluster => "",
    }
}

fn deserialize(kind: Kind, json: Json) -> Result<Raw, serde_json::Error> {
    Ok(match kind {
        Kind::Cluster => Raw::Cluster(serde_json::from_value(json)?),
        Kind::Site => Raw::Site(serde_json::from_value(json)?),
        Kind::Zone => Raw::Zone(serde_json::from_value(json)?),
        Kind::Node => Raw::Node(serde_json::from_value(json)?),
    })
}

/// Keys that look like an attempt to write a secret into the repository.
fn looks_like_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "api_key",
        "apikey",
        "private_key",
    ]
    .iter()
    .any(|s| key.contains(s))
        && !key.ends_with("_env")
}

/// The closest known key to a misspelt one, if close enough.
pub(crate) fn suggest<'a>(unknown: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    known
        .map(|k| (strsim::levenshtein(unknown, k), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| k)
}

/// The property names the schema allows at a pointer's object, for
/// "did you mean" help.
fn known_keys(kind: Kind, pointer: &str) -> Vec<String> {
    let schema: Json = serde_json::from_str(schema::embedded(kind)).unwrap_or(Json::Null);
    let mut node = &schema;
    for token in pointer.split('/').skip(1) {
        let next = if token.parse::<usize>().is_ok() {
            node.get("items")
        } else {
            node.get("properties").and_then(|p| p.get(token))
        };
        node = match next {
            Some(n) => n,
            None => return Vec::new(),
        };
        node = resolve(&schema, node);
    }
    let node = resolve(&schema, node);
    node.get("properties")
        .and_then(Json::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

fn resolve<'a>(root: &'a Json, node: &'a Json) -> &'a Json {
    match node.get("$ref").and_then(Json::as_str) {
        Some(r) => r
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .unwrap_or(node),
        None => node,
    }
}

fn type_name(value: &Json) -> &'static str {
    match value {
        Json::Null => "nothing (null)",
        Json::Bool(_) => "a boolean",
        Json::Number(n) if n.is_f64() => "a number",
        Json::Number(_) => "an integer",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a mapping",
    }
}

fn expected_name(kind: &TypeKind) -> String {
    let one = |t: &jsonschema::JsonType| match t.to_string().as_str() {
        "object" => "a mapping".to_owned(),
        "array" => "a list".to_owned(),
        "string" => "a string".to_owned(),
        "integer" => "an integer".to_owned(),
        "number" => "a number".to_owned(),
        "boolean" => "a boolean (true or false)".to_owned(),
        "null" => "null".to_owned(),
        other => other.to_owned(),
    };
    match kind {
        TypeKind::Single(t) => one(t),
        TypeKind::Multiple(set) => {
            let names: Vec<String> = set
                .iter()
                .filter(|t| t.to_string() != "null")
                .map(|t| one(&t))
                .collect();
            names.join(" or ")
        }
    }
}

/// What a pattern failure means, by the field it is on.
fn pattern_message(kind: Kind, pointer: &str, value: &str) -> (String, Option<&'static str>) {
    let field = pointer
        .rsplit('/')
        .find(|t| t.parse::<usize>().is_err())
        .unwrap_or_default();
    match field {
        "host" | "aliases" => (
            format!("`{value}` is not a valid lower-case hostname"),
            Some(
                "letters a-z, digits and `-`, labels separated by dots; `*.` may start a wildcard",
            ),
        ),
        "geo_codes" => (
            format!("`{value}` is not an ISO 3166-1 alpha-2 country code"),
            Some("two upper-case letters, e.g. `DE`, `US`"),
        ),
        "origin" | "origins" | "public_url" => {
            (format!("`{value}` is not an http:// or https:// URL"), None)
        }
        "url" if kind == Kind::Node => (format!("`{value}` is not a redis:// URL"), None),
        "url" => (format!("`{value}` is not an mqtt:// or mqtts:// URL"), None),
        "name" | "region" | "regions" => (
            format!("`{value}` is not a valid name"),
            Some("lower-case letters, digits and `-`, starting with a letter or digit"),
        ),
        "levels" => (
            format!("`{value}` is not an nginx cache `levels` value"),
            Some("one to three levels of 1 or 2 characters, e.g. `1:2`"),
        ),
        "fail_timeout" => (
            format!("`{value}` is not a duration"),
            Some("a number with a unit: `500ms`, `30s`, `5m`, `1h`"),
        ),
        "password_env" => (
            format!("`{value}` is not an environment variable name"),
            None,
        ),
        "dirs" | "root" => (
            format!("`{value}` is not an absolute path"),
            Some("it starts with `/` and has no empty, `.` or `..` folder"),
        ),
        _ => (format!("`{value}` has an invalid form for `{field}`"), None),
    }
}

fn schema_diagnostic(
    kind: Kind,
    path: &Arc<str>,
    tree: &Node,
    pointer: &str,
    error: &ValidationErrorKind,
    fallback: &str,
) -> Diagnostic {
    let at = tree.locate(pointer);
    let value = tree
        .pointer(pointer)
        .map(Node::to_json)
        .unwrap_or(Json::Null);
    let noun = kind_noun(kind);
    match error {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            // One diagnostic for the first unexpected key; the rest are
            // reported by their own errors when the schema yields them.
            let key = unexpected.first().map(String::as_str).unwrap_or_default();
            let object = tree.pointer(pointer);
            let span = object.and_then(|o| o.key_span(key)).unwrap_or(at);
            if looks_like_secret(key) {
                let d = Diagnostic::error(
                    "inline-secret",
                    path,
                    span,
                    format!("`{key}` looks like a secret; secrets never live in the repository"),
                )
                .with_help(
                    "put the secret in an environment variable on the host and name it with \
                     `password_env`",
                );
                let secret = object.and_then(|o| o.pointer(&format!("/{}", escape_token(key))));
                return match secret.map(|n| &n.value) {
                    Some(yaml::Value::Str(s)) if !s.is_empty() => d.with_secret(s.clone()),
                    Some(yaml::Value::Int(i)) => d.with_secret(i.to_string()),
                    _ => d,
                };
            }
            let mut d = Diagnostic::error(
                "unknown-key",
                path,
                span,
                if unexpected.len() > 1 {
                    format!("unknown keys in {noun}: {}", quote_list(unexpected))
                } else {
                    format!("unknown key `{key}` in {noun}")
                },
            );
            let known = known_keys(kind, pointer);
            if let Some(s) = suggest(key, known.iter().map(String::as_str)) {
                d = d.with_help(format!("did you mean `{s}`?"));
            } else if !known.is_empty() {
                d = d.with_help(format!("known keys: {}", known.join(", ")));
            }
            d
        }
        ValidationErrorKind::Required { property } => {
            let property = property.as_str().unwrap_or_default();
            let span = if pointer.is_empty() { file_start() } else { at };
            Diagnostic::error(
                "missing-key",
                path,
                span,
                format!(
                    "missing required key `{property}`{}",
                    if pointer.is_empty() {
                        format!(" in {noun}")
                    } else {
                        format!(" in `{}`", display_pointer(pointer))
                    }
                ),
            )
        }
        ValidationErrorKind::Type { kind: expected } => {
            let what = if pointer.is_empty() {
                format!(
                    "a {noun} file must be a mapping, found {}",
                    type_name(&value)
                )
            } else {
                format!(
                    "`{}` must be {}, found {}",
                    display_pointer(pointer),
                    expected_name(expected),
                    type_name(&value)
                )
            };
            Diagnostic::error("wrong-type", path, at, what)
        }
        ValidationErrorKind::Enum { options } => {
            let allowed: Vec<String> = options
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|v| !v.is_null())
                        .map(|v| v.to_string().trim_matches('"').to_owned())
                        .collect()
                })
                .unwrap_or_default();
            Diagnostic::error(
                "invalid-value",
                path,
                at,
                format!(
                    "{} is not a valid `{}`",
                    show(&value),
                    display_pointer(pointer)
                ),
            )
            .with_help(format!("one of: {}", allowed.join(", ")))
        }
        ValidationErrorKind::Pattern { .. } => {
            let text = value.as_str().unwrap_or_default();
            let (message, help) = pattern_message(kind, pointer, text);
            let d = Diagnostic::error("invalid-value", path, at, message);
            match help {
                Some(h) => d.with_help(h),
                None => d,
            }
        }
        ValidationErrorKind::Minimum { limit }
        | ValidationErrorKind::ExclusiveMinimum { limit } => Diagnostic::error(
            "out-of-range",
            path,
            at,
            format!(
                "`{}` is {}, below the minimum {limit}",
                display_pointer(pointer),
                show(&value)
            ),
        ),
        ValidationErrorKind::Maximum { limit }
        | ValidationErrorKind::ExclusiveMaximum { limit } => Diagnostic::error(
            "out-of-range",
            path,
            at,
            format!(
                "`{}` is {}, above the maximum {limit}",
                display_pointer(pointer),
                show(&value)
            ),
        ),
        ValidationErrorKind::MinItems { limit } => Diagnostic::error(
            "invalid-value",
            path,
            at,
            format!(
                "`{}` needs at least {limit} item(s)",
                display_pointer(pointer)
            ),
        ),
        ValidationErrorKind::MinLength { .. } => Diagnostic::error(
            "invalid-value",
            path,
            at,
            format!("`{}` must not be empty", display_pointer(pointer)),
        ),
        ValidationErrorKind::MaxLength { limit } => Diagnostic::error(
            "invalid-value",
            path,
            at,
            format!(
                "`{}` is longer than {limit} characters",
                display_pointer(pointer)
            ),
        ),
        _ => Diagnostic::error("invalid-value", path, at, fallback.to_owned()),
    }
}

fn show(value: &Json) -> String {
    match value {
        Json::String(s) => format!("`{s}`"),
        other => format!("`{other}`"),
    }
}

fn quote_list(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `/cache_rules/0/ttl` → `cache_rules[0].ttl`.
#[must_use]
pub fn display_pointer(pointer: &str) -> String {
    let mut out = String::new();
    for token in pointer.split('/').skip(1) {
        if token.parse::<usize>().is_ok() {
            out.push('[');
            out.push_str(token);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&token.replace("~1", "/").replace("~0", "~"));
        }
    }
    out
}

/// A key as a JSON-pointer token.
fn escape_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
