//! The role templates' engine (`roles/<role>/*.tmpl`, docs/install.md):
//! `{{ a.b.0 }}` replaced by the value at that path of a JSON context,
//! `{{ x | host }}` / `{{ x | port }}` for a URL's parts. The installer
//! renders bundles with it and the test harness renders the same edge
//! template with it, so the installed edge is the tested edge.

use serde_json::Value;

/// What is wrong with a template reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A reference names a field the context does not have.
    UnknownField,
    /// `{{` without `}}`, an empty or malformed reference, an unknown filter,
    /// a filter on a value it does not apply to.
    TemplateSyntax,
}

/// One problem, at its `file:line:col`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

/// Render one template: every `{{ a.b.0 }}` replaced by the value at that
/// path of `context` (strings as they are, numbers and booleans as JSON,
/// lists and maps as JSON flow — valid YAML). Every problem is reported,
/// each at its `file:line:col`.
///
/// # Errors
/// Unknown fields, malformed references.
pub fn render(file: &str, template: &str, context: &Value) -> Result<String, Vec<Error>> {
    let mut out = String::with_capacity(template.len());
    let mut errors = Vec::new();
    let mut rest = template;
    let mut offset = 0;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let start = offset + i;
        let (line, column) = line_col(template, start);
        let err = |kind, message: String| Error {
            kind,
            file: file.to_owned(),
            line,
            column,
            message,
        };
        let Some(j) = rest[i + 2..].find("}}") else {
            errors.push(err(
                ErrorKind::TemplateSyntax,
                "`{{` without a closing `}}`".into(),
            ));
            rest = "";
            break;
        };
        let inner = rest[i + 2..i + 2 + j].trim();
        let (reference, filter) = match inner.split_once('|') {
            Some((r, f)) => (r.trim(), Some(f.trim())),
            None => (inner, None),
        };
        let valid = !reference.is_empty()
            && reference.split('.').all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
        if !valid {
            errors.push(err(
                ErrorKind::TemplateSyntax,
                format!(
                    "`{{{{ {inner} }}}}` is not a field reference (e.g. `{{{{ node.name }}}}`)"
                ),
            ));
        } else if let Some(f) = filter.filter(|f| !FILTERS.contains(f)) {
            errors.push(err(
                ErrorKind::TemplateSyntax,
                format!("unknown filter `{f}` (filters: {})", FILTERS.join(", ")),
            ));
        } else {
            match lookup(context, reference) {
                Some(v) => match apply(filter, v) {
                    Some(text) => out.push_str(&text),
                    None => errors.push(err(
                        ErrorKind::TemplateSyntax,
                        format!(
                            "`{reference}` = {v} has no {} (a URL like redis://host:6379)",
                            filter.unwrap_or_default()
                        ),
                    )),
                },
                None => {
                    let known = known_at(context, reference);
                    errors.push(err(
                        ErrorKind::UnknownField,
                        format!("unknown field `{reference}`{known}"),
                    ));
                }
            }
        }
        let consumed = i + 2 + j + 2;
        rest = &rest[consumed..];
        offset += consumed;
    }
    out.push_str(rest);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.chars().count(), |n| before[n + 1..].chars().count())
        + 1;
    (line, column)
}

fn lookup<'a>(context: &'a Value, reference: &str) -> Option<&'a Value> {
    let mut v = context;
    for part in reference.split('.') {
        v = match v {
            Value::Object(m) => m.get(part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// ` (this node has: a, b)` for the deepest existing parent.
fn known_at(context: &Value, reference: &str) -> String {
    let parts: Vec<&str> = reference.split('.').collect();
    for n in (0..parts.len()).rev() {
        let parent = if n == 0 {
            Some(context)
        } else {
            lookup(context, &parts[..n].join("."))
        };
        if let Some(Value::Object(m)) = parent {
            let keys: Vec<&str> = m.keys().map(String::as_str).collect();
            let at = if n == 0 {
                String::new()
            } else {
                format!("`{}` has: ", parts[..n].join("."))
            };
            return format!(" ({at}{})", keys.join(", "));
        }
    }
    String::new()
}

/// `{{ x | host }}`, `{{ x | port }}`: the host or port of a URL value.
const FILTERS: [&str; 2] = ["host", "port"];

fn apply(filter: Option<&str>, v: &Value) -> Option<String> {
    let Some(f) = filter else {
        return Some(scalar(v));
    };
    let url = url::Url::parse(v.as_str()?).ok()?;
    match f {
        "host" => url.host_str().map(str::to_owned),
        "port" => url.port_or_known_default().map(|p| p.to_string()),
        _ => None,
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_fields_and_reports_every_unknown_one_with_its_position() {
        let cx = serde_json::json!({"node": {"name": "e1", "url": "redis://h:6390", "cache": {"dirs": ["/a", "/b"], "levels": "1:2"}, "n": 3}});
        assert_eq!(
            render(
                "t",
                "x {{ node.name }} {{node.cache.dirs.1}} {{ node.n }} {{ node.url | host }}:{{ node.url | port }}",
                &cx
            )
            .unwrap(),
            "x e1 /b 3 h:6390"
        );
        let e = render("f", "\n {{ node.nope }} {{ node.name | bogus }}", &cx).unwrap_err();
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].kind, e[0].line, e[0].column),
            (ErrorKind::UnknownField, 2, 2)
        );
        assert_eq!(e[1].kind, ErrorKind::TemplateSyntax);
        assert!(
            e[0].to_string()
                .starts_with("f:2:2: unknown field `node.nope`"),
            "{}",
            e[0]
        );
    }
}
