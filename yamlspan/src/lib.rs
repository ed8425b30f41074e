//! A YAML tree that remembers where every value came from.
//!
//! Diagnostics must point at the offending value for semantic errors too
//! (a duplicate host, an unknown fallback zone), so we keep a span on every
//! node. The tree is built from `granit-parser`'s spanned events (the
//! parser under serde-saphyr) and converted to a `serde_json::Value` for
//! JSON Schema validation and typed deserialization; a JSON pointer from
//! either of those finds its way back to a span with [`Node::locate`].
//!
//! Scalars resolve by the YAML 1.2 core schema: `off`, `no` and `NO` are
//! strings (no "Norway problem"), `~`/`null`/empty are null. Anchors and
//! aliases work; their expansion is capped so a "billion laughs" file is an
//! error, not an out-of-memory. Duplicate keys, non-scalar keys and several
//! documents in one file are errors. A tag is refused wherever it stands
//! (scalar, sequence, mapping) unless it is the core schema's for that kind
//! of node and the value reads as it says (`!!str`, `!!int 3`, `!!seq`,
//! `!!map`). The parser accepts a few shapes YAML forbids — a flow
//! collection or a quoted scalar inside a block collection whose next lines
//! are not indented past that collection (the YAML test suite's 9C9N,
//! DK95/01, QB6E) — so [`parse`] checks those itself from the spans.

use granit_parser::{Event, Options, Parser, ScalarStyle, Span as PSpan, StructureStyle};

/// A region of one source file. Lines and columns are 1-based (columns
/// count characters); `start`/`end` are byte offsets for snippets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub line: u32,
    pub column: u32,
}

/// A YAML value with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub span: Span,
}

/// A mapping key: always a scalar, kept as its text.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub text: String,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// Why a file is not acceptable YAML for edgeform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Syntax,
    DuplicateKey,
    ComplexKey,
    MultipleDocuments,
    UnsupportedTag,
    TooLarge,
    /// A line inside a flow collection or a quoted scalar indented no
    /// further than the block collection that holds it.
    Indentation,
}

impl ErrorKind {
    /// The diagnostic code for this kind.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::Syntax => "yaml-syntax",
            ErrorKind::DuplicateKey => "yaml-duplicate-key",
            ErrorKind::ComplexKey => "yaml-complex-key",
            ErrorKind::MultipleDocuments => "yaml-multiple-documents",
            ErrorKind::UnsupportedTag => "yaml-unsupported-tag",
            ErrorKind::TooLarge => "yaml-too-large",
            ErrorKind::Indentation => "yaml-syntax",
        }
    }
}

/// Cap on nodes in one document, aliases expanded (billion-laughs guard).
/// A site file has tens of nodes; a zone with 100k routes has 100k.
const MAX_NODES: usize = 4_000_000;
/// Cap on the text (keys and strings) aliases copy in one document: the
/// node cap alone let 1,000 aliases of a 1 MiB string take a gigabyte.
const MAX_ALIAS_BYTES: usize = 64 << 20;
/// Nesting deeper than this is hostile, not configuration.
const MAX_DEPTH: usize = 64;

fn span_of(s: &PSpan) -> Span {
    let start = s.start.byte_offset().unwrap_or(0);
    let end = s.end.byte_offset().unwrap_or(start).max(start);
    Span {
        start,
        end,
        line: u32::try_from(s.start.line()).unwrap_or(u32::MAX).max(1),
        column: u32::try_from(s.start.col() + 1).unwrap_or(u32::MAX),
    }
}

enum Frame {
    Seq {
        items: Vec<Node>,
        span: Span,
        anchor: usize,
        layout: Layout,
    },
    Map {
        entries: Vec<(Key, Node)>,
        pending: Option<Key>,
        /// Key text → entry, built once a mapping grows past a few keys,
        /// so duplicate detection stays linear on hostile 100k-key maps.
        index: Option<std::collections::HashMap<String, usize>>,
        span: Span,
        anchor: usize,
        layout: Layout,
    },
}

/// How a collection is written: block (with the column its entries start
/// at, once known) or flow.
#[derive(Clone, Copy)]
enum Layout {
    Block(Option<usize>),
    Flow,
}

impl Frame {
    fn layout(&self) -> Layout {
        match self {
            Frame::Seq { layout, .. } | Frame::Map { layout, .. } => *layout,
        }
    }
}

/// The column (0-based) the innermost block collection's entries start at,
/// when the node being read is not inside a flow collection.
fn block_indent(stack: &[Frame]) -> Option<Option<usize>> {
    match stack.last()?.layout() {
        Layout::Flow => None,
        Layout::Block(_) => stack.iter().rev().find_map(|f| match f.layout() {
            Layout::Block(Some(c)) => Some(Some(c)),
            _ => None,
        }),
    }
}

/// Every line of `text[start..end]` after its first must be indented (by
/// spaces; a tab is not indentation) past column `indent`, blank lines
/// aside.
fn check_continuation(
    text: &str,
    start: usize,
    end: usize,
    indent: usize,
    what: &str,
) -> Result<(), Error> {
    let end = end.min(text.len());
    let Some(body) = text.get(start..end) else {
        return Ok(());
    };
    for (i, b) in body.bytes().enumerate() {
        if b != b'\n' {
            continue;
        }
        let next = start + i + 1;
        if next >= end {
            break;
        }
        let line = &text[next..end];
        let line = line.split('\n').next().unwrap_or("");
        if line.trim().is_empty() {
            continue;
        }
        let spaces = line.bytes().take_while(|&c| c == b' ').count();
        if spaces <= indent {
            let lineno = text[..next].matches('\n').count() + 1;
            return Err(Error {
                kind: ErrorKind::Indentation,
                message: format!(
                    "this line of {what} must be indented past column {} (the block it is \
                     in), with spaces",
                    indent + 1
                ),
                // At the line's first character, where its column is.
                span: Span {
                    start: next + spaces,
                    end: next + line.len(),
                    line: u32::try_from(lineno).unwrap_or(u32::MAX),
                    column: u32::try_from(spaces + 1).unwrap_or(u32::MAX),
                },
            });
        }
    }
    Ok(())
}

fn tag_error(tag: &granit_parser::Tag, span: Span, on: &str) -> Error {
    Error {
        kind: ErrorKind::UnsupportedTag,
        message: format!(
            "unsupported YAML tag `{}` on {on} (only the core schema's own tag for that kind of \
             value is read)",
            tag.original()
        ),
        span,
    }
}

/// Mappings up to this many keys are checked for duplicates by a scan.
const SCAN_KEYS: usize = 16;

/// Parse one YAML document. `Ok(None)` for a file with no document (empty
/// or only comments).
///
/// # Errors
/// Syntax errors and the structural refusals listed in [`ErrorKind`], each
/// with the span where it was found.
pub fn parse(text: &str) -> Result<Option<Node>, Error> {
    let mut options = Options::default();
    options.emit_comments = false;
    options.block_nesting_limit = MAX_DEPTH;
    options.flow_nesting_limit = MAX_DEPTH;
    let mut parser = Parser::new_from_str_with_options(text, options);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: Vec<Option<Node>> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    let mut nodes = 0usize;
    let mut alias_bytes = 0usize;

    while let Some(next) = parser.next_event() {
        let (event, pspan) = next.map_err(|e| {
            let m = e.marker();
            let byte = m.byte_offset().unwrap_or(0);
            Error {
                kind: ErrorKind::Syntax,
                message: e.info(),
                span: Span {
                    start: byte,
                    end: byte,
                    line: u32::try_from(m.line()).unwrap_or(u32::MAX).max(1),
                    column: u32::try_from(m.col() + 1).unwrap_or(u32::MAX),
                },
            }
        })?;
        let span = span_of(&pspan);
        let complete: Node = match event {
            Event::DocumentStart(..) => {
                documents += 1;
                if documents > 1 {
                    return Err(Error {
                        kind: ErrorKind::MultipleDocuments,
                        message: "more than one YAML document in this file; edgeform reads one \
                                  per file"
                            .into(),
                        span,
                    });
                }
                continue;
            }
            Event::Scalar(value_text, style, anchor, tag) => {
                if !matches!(style, ScalarStyle::Literal | ScalarStyle::Folded)
                    && let Some(indent) = block_indent(&stack).flatten()
                {
                    check_continuation(text, span.start, span.end, indent, "a scalar")?;
                }
                let value = match tag.as_deref() {
                    None => resolve_scalar(&value_text, style),
                    Some(t) if t.is_yaml_core_schema_tag("str") => {
                        Value::Str(value_text.into_owned())
                    }
                    Some(t) => {
                        let v = resolve_scalar(&value_text, ScalarStyle::Plain);
                        let fits = (t.is_yaml_core_schema_tag("int") && matches!(v, Value::Int(_)))
                            || (t.is_yaml_core_schema_tag("float")
                                && matches!(v, Value::Float(_) | Value::Int(_)))
                            || (t.is_yaml_core_schema_tag("bool") && matches!(v, Value::Bool(_)))
                            || (t.is_yaml_core_schema_tag("null") && matches!(v, Value::Null));
                        if !fits {
                            return Err(tag_error(t, span, "this scalar"));
                        }
                        match v {
                            Value::Int(i) if t.is_yaml_core_schema_tag("float") =>
                            {
                                #[allow(clippy::cast_precision_loss)]
                                Value::Float(i as f64)
                            }
                            v => v,
                        }
                    }
                };
                let node = Node { value, span };
                remember(&mut anchors, anchor, &node);
                node
            }
            Event::SequenceStart(style, anchor, tag) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(too_deep(span));
                }
                if let Some(t) = tag.as_deref()
                    && !t.is_yaml_core_schema_tag("seq")
                {
                    return Err(tag_error(t, span, "a sequence"));
                }
                let layout = match style {
                    StructureStyle::Flow => Layout::Flow,
                    StructureStyle::Block => Layout::Block(Some(dash_column(text, span))),
                };
                stack.push(Frame::Seq {
                    items: Vec::new(),
                    span,
                    anchor,
                    layout,
                });
                continue;
            }
            Event::MappingStart(style, anchor, tag) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(too_deep(span));
                }
                if let Some(t) = tag.as_deref()
                    && !t.is_yaml_core_schema_tag("map")
                {
                    return Err(tag_error(t, span, "a mapping"));
                }
                let layout = match style {
                    StructureStyle::Flow => Layout::Flow,
                    // The column of its first key, once read.
                    StructureStyle::Block => Layout::Block(None),
                };
                stack.push(Frame::Map {
                    entries: Vec::new(),
                    pending: None,
                    index: None,
                    span,
                    anchor,
                    layout,
                });
                continue;
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq {
                    items,
                    span: start,
                    anchor,
                    layout,
                }) => {
                    flow_end(text, &stack, layout, start, span, "a flow sequence")?;
                    let span = start;
                    let node = Node {
                        value: Value::Seq(items),
                        span,
                    };
                    remember(&mut anchors, anchor, &node);
                    node
                }
                _ => continue,
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map {
                    entries,
                    span: start,
                    anchor,
                    layout,
                    ..
                }) => {
                    flow_end(text, &stack, layout, start, span, "a flow mapping")?;
                    let span = start;
                    let node = Node {
                        value: Value::Map(entries),
                        span,
                    };
                    remember(&mut anchors, anchor, &node);
                    node
                }
                _ => continue,
            },
            Event::Alias(id) => {
                let Some(Some(target)) = anchors.get(id) else {
                    return Err(Error {
                        kind: ErrorKind::Syntax,
                        message: "alias to an unknown or unfinished anchor".into(),
                        span,
                    });
                };
                nodes += count(target);
                if nodes > MAX_NODES {
                    return Err(too_large(span));
                }
                alias_bytes = alias_bytes.saturating_add(text_bytes(target));
                if alias_bytes > MAX_ALIAS_BYTES {
                    return Err(Error {
                        kind: ErrorKind::TooLarge,
                        message: format!(
                            "aliases copy more than {} MiB of text",
                            MAX_ALIAS_BYTES >> 20
                        ),
                        span,
                    });
                }
                let mut node = target.clone();
                node.span = span;
                node
            }
            _ => continue,
        };
        nodes += 1;
        if nodes > MAX_NODES {
            return Err(too_large(span));
        }
        attach(&mut stack, &mut root, complete)?;
    }
    Ok(root)
}

/// The column (0-based) of a block sequence's `-`: its span starts at the
/// first entry's content, after the indicator.
fn dash_column(text: &str, span: Span) -> usize {
    let before = text.get(..span.start).unwrap_or("");
    let trimmed = before.trim_end_matches([' ', '\t']);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    match trimmed.strip_suffix('-') {
        Some(head) if head.len() >= line_start => text[line_start..head.len()].chars().count(),
        _ => (span.column as usize).saturating_sub(1),
    }
}

/// A flow collection directly inside a block collection ended: its lines
/// after the first must be indented past that block's column.
fn flow_end(
    text: &str,
    stack: &[Frame],
    layout: Layout,
    start: Span,
    end: Span,
    what: &str,
) -> Result<(), Error> {
    if let Layout::Flow = layout
        && let Some(indent) = block_indent(stack).flatten()
    {
        check_continuation(text, start.start, end.end.max(start.end), indent, what)?;
    }
    Ok(())
}

fn too_deep(span: Span) -> Error {
    Error {
        kind: ErrorKind::TooLarge,
        message: format!("nesting deeper than {MAX_DEPTH} levels"),
        span,
    }
}

fn too_large(span: Span) -> Error {
    Error {
        kind: ErrorKind::TooLarge,
        message: format!("document expands to more than {MAX_NODES} values (aliases included)"),
        span,
    }
}

fn remember(anchors: &mut Vec<Option<Node>>, anchor: usize, node: &Node) {
    if anchor == 0 {
        return;
    }
    if anchors.len() <= anchor {
        anchors.resize(anchor + 1, None);
    }
    anchors[anchor] = Some(node.clone());
}

/// The bytes of the keys and strings under `node`.
fn text_bytes(node: &Node) -> usize {
    match &node.value {
        Value::Str(s) => s.len(),
        Value::Seq(items) => items.iter().map(text_bytes).sum(),
        Value::Map(entries) => entries
            .iter()
            .map(|(k, v)| k.text.len() + text_bytes(v))
            .sum(),
        _ => 0,
    }
}

fn count(node: &Node) -> usize {
    match &node.value {
        Value::Seq(items) => 1 + items.iter().map(count).sum::<usize>(),
        Value::Map(entries) => 1 + entries.iter().map(|(_, v)| 1 + count(v)).sum::<usize>(),
        _ => 1,
    }
}

/// Put a finished node where it belongs: a sequence item, a mapping key or
/// value, or the document root.
fn attach(stack: &mut [Frame], root: &mut Option<Node>, node: Node) -> Result<(), Error> {
    match stack.last_mut() {
        None => *root = Some(node),
        Some(Frame::Seq { items, .. }) => items.push(node),
        Some(Frame::Map {
            entries,
            pending,
            index,
            layout,
            ..
        }) => match pending.take() {
            Some(key) => {
                if let Some(index) = index {
                    index.insert(key.text.clone(), entries.len());
                } else if entries.len() + 1 > SCAN_KEYS {
                    let mut built: std::collections::HashMap<String, usize> = entries
                        .iter()
                        .enumerate()
                        .map(|(i, (k, _))| (k.text.clone(), i))
                        .collect();
                    built.insert(key.text.clone(), entries.len());
                    *index = Some(built);
                }
                entries.push((key, node));
            }
            None => {
                let text = match node.value {
                    Value::Str(s) => s,
                    Value::Null => String::new(),
                    Value::Bool(b) => b.to_string(),
                    Value::Int(i) => i.to_string(),
                    Value::Float(f) => f.to_string(),
                    Value::Seq(_) | Value::Map(_) => {
                        return Err(Error {
                            kind: ErrorKind::ComplexKey,
                            message: "a mapping key must be a plain scalar".into(),
                            span: node.span,
                        });
                    }
                };
                let first = match index {
                    Some(index) => index.get(&text).map(|i| &entries[*i]),
                    None => entries.iter().find(|(k, _)| k.text == text),
                };
                if let Some((first, _)) = first {
                    return Err(Error {
                        kind: ErrorKind::DuplicateKey,
                        message: format!(
                            "duplicate key `{text}` (first at line {}:{})",
                            first.span.line, first.span.column
                        ),
                        span: node.span,
                    });
                }
                if let Layout::Block(None) = layout {
                    *layout = Layout::Block(Some(node.span.column as usize - 1));
                }
                *pending = Some(Key {
                    text,
                    span: node.span,
                });
            }
        },
    }
    Ok(())
}

/// YAML 1.2 core schema resolution of a scalar.
fn resolve_scalar(text: &str, style: ScalarStyle) -> Value {
    if style != ScalarStyle::Plain {
        return Value::Str(text.to_owned());
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Value::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Value::Float(f64::NAN),
        _ => {}
    }
    let bytes = text.as_bytes();
    let first = bytes[0];
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.')) {
        return Value::Str(text.to_owned());
    }
    if let Some(hex) = text.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(hex, 16) {
            return Value::Int(i);
        }
    } else if let Some(oct) = text.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(oct, 8) {
            return Value::Int(i);
        }
    } else if is_core_int(text) {
        return text.parse::<i64>().map_or_else(
            |_| Value::Float(text.parse().unwrap_or(f64::NAN)),
            Value::Int,
        );
    } else if is_core_float(text)
        && let Ok(f) = text.parse::<f64>()
    {
        return Value::Float(f);
    }
    Value::Str(text.to_owned())
}

fn is_core_int(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`
fn is_core_float(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match frac {
        None => !int.is_empty() && all_digits(int),
        Some(f) => all_digits(int) && all_digits(f) && !(int.is_empty() && f.is_empty()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && all_digits(e)
    });
    mantissa_ok && exponent_ok
}

impl Node {
    /// The plain JSON value of this tree (for schema validation and typed
    /// deserialization). Non-finite floats become null: JSON has none, and
    /// no edgeform field takes one.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.text.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The node at a JSON pointer (`/cache_rules/0/ttl`), if present.
    #[must_use]
    pub fn pointer(&self, pointer: &str) -> Option<&Node> {
        let mut node = self;
        for token in pointer.split('/').skip(1) {
            let token = token.replace("~1", "/").replace("~0", "~");
            node = match &node.value {
                Value::Map(entries) => entries
                    .iter()
                    .find(|(k, _)| k.text == token)
                    .map(|e| &e.1)?,
                Value::Seq(items) => items.get(token.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(node)
    }

    /// The span of the key `name` in this mapping, if present.
    #[must_use]
    pub fn key_span(&self, name: &str) -> Option<Span> {
        match &self.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.text == name)
                .map(|e| e.0.span),
            _ => None,
        }
    }

    /// The best span for a JSON pointer: the value there, else the deepest
    /// ancestor that exists (a missing key points at its mapping).
    #[must_use]
    pub fn locate(&self, pointer: &str) -> Span {
        let mut p = pointer;
        loop {
            if let Some(node) = self.pointer(p) {
                return node.span;
            }
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => return self.span,
            }
        }
    }
}

#[cfg(test)]
mod tests;
