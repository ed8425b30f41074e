//! The role templates' engine (`roles/<role>/*.tmpl`, docs/install.md):
//! `{{ a.b.0 }}` replaced by the value at that path of a JSON context,
//! and filters (`host`, `port`, `lua`, `nginx_env`, `ca_file`). The installer
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
    // In a YAML or JSON file a list or map is written as JSON flow, whose
    // strings are quoted; anywhere else each string inside it must be one
    // word too.
    let structured = [".yaml.tmpl", ".yml.tmpl", ".json.tmpl"]
        .iter()
        .any(|x| file.ends_with(x));
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
                Some(v) => match apply(filter, v, structured) {
                    Ok(text) => out.push_str(&text),
                    Err(why) => errors.push(err(
                        ErrorKind::TemplateSyntax,
                        format!("`{reference}` = {v} {why}"),
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

/// A string written as it is (no filter) must be one word
/// ([`breaking_char`]); the filters, `{{ x | NAME }}` (docs/install.md,
/// "Templates"):
/// - `words`: a string of space-separated words, each one word as above,
///   written with one space between them (`resolver 10.0.0.2 10.0.0.3`);
/// - `host`, `port`: the host or port of a URL value;
/// - `lua`: the value as a Lua literal (`{url = "redis://…", sentinels =
///   {"a:1"}}`), for a Lua block: every string quoted with any byte but
///   plain printable ASCII written `\ddd`, so no value can end the string,
///   the block or the directive it is written into (and no brace or
///   newline appears inside a string, which the nginx gate refuses);
/// - `nginx_env`: for a `redis` block, nginx's `env VAR;` for its
///   `password_env` (the password stays in the environment), or a comment
///   when it has none;
/// - `ca_file`: for a `redis` block, its `tls.ca_file`, else the system
///   trust store (what `lua_ssl_trusted_certificate` verifies against);
/// - `loopback`: for an nginx `listen` value (`80`, `0.0.0.0:80`, `*:80`,
///   `[::]:443`, `10.0.0.5:80`), the `IP:PORT` a process on the node itself
///   reaches it at: `127.0.0.1` (`[::1]` for `[::]`) for a wildcard or a
///   bare port, else the address as given (the agent's serving probe).
const FILTERS: [&str; 8] = [
    "words",
    "host",
    "port",
    "lua",
    "nginx_env",
    "ca_file",
    "loopback",
    "listen_port",
];

/// The system trust store (Debian's `ca-certificates`).
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The first character of `s` that could end the token it is written
/// into — in nginx's configuration (`;`, braces, `#`, quotes, whitespace),
/// a Lua block (quotes, parentheses, `,`, long brackets `[[`/`[=`) or YAML
/// (`#`, quotes, braces, `,`) — or a backslash or control character. A string written
/// as it is (no filter) or by `words` must have none: a node's YAML value
/// is data and must stay one word, whatever template it reaches.
fn breaking_char(s: &str) -> Option<(usize, char)> {
    s.char_indices()
        .enumerate()
        .find(|&(_, (at, c))| {
            c.is_whitespace()
                || c.is_control()
                || matches!(c, ';' | '{' | '}' | '#' | '"' | '\'' | '\\' | '`' | '(' | ')' | ',')
                // Lua's long brackets (`f[[text]]` calls `f`); `[::]:443`
                // stays a word.
                || (c == '[' && s[at + 1..].starts_with(['[', '=']))
        })
        .map(|(i, (_, c))| (i, c))
}

/// Every string of `v`: itself, or those inside its lists and maps (a
/// list written as JSON flow is one nginx token up to its first `;`).
fn strings_of(v: &Value) -> Box<dyn Iterator<Item = &str> + '_> {
    match v {
        Value::String(s) => Box::new(std::iter::once(s.as_str())),
        Value::Array(items) => Box::new(items.iter().flat_map(strings_of)),
        Value::Object(m) => Box::new(
            m.iter()
                .flat_map(|(k, v)| std::iter::once(k.as_str()).chain(strings_of(v))),
        ),
        _ => Box::new(std::iter::empty()),
    }
}

/// Why `s` cannot be written as one word, said after the value.
fn not_a_word(s: &str, how: &str) -> Option<String> {
    let (i, c) = breaking_char(s)?;
    Some(format!(
        "holds {c:?} (character {}): {how} must be one word (no whitespace, control characters, \
         quotes, backslashes, braces, parentheses, `;`, `#`, `,`, `[[` or `[=`); use a filter: `| lua` in a Lua \
         block, `| words` for several words",
        i + 1
    ))
}

/// A filter's output, or why the value has none (said after the value).
fn apply(filter: Option<&str>, v: &Value, structured: bool) -> Result<String, String> {
    let Some(f) = filter else {
        let why = match v {
            Value::String(s) => not_a_word(s, "a value written as it is"),
            _ if structured => None,
            _ => strings_of(v).find_map(|s| not_a_word(s, "a string written as it is")),
        };
        if let Some(why) = why {
            return Err(why);
        }
        return Ok(scalar(v));
    };
    let no = || format!("has no {f} (a URL like redis://host:6379)");
    let url = || {
        v.as_str()
            .and_then(|s| url::Url::parse(s).ok())
            .ok_or_else(no)
    };
    match f {
        "host" => url()?.host_str().map(str::to_owned).ok_or_else(no),
        "port" => url()?
            .port_or_known_default()
            .map(|p| p.to_string())
            .ok_or_else(no),
        "loopback" => v.as_str().and_then(loopback).ok_or_else(|| {
            "has no loopback address (a listen value: PORT, IP:PORT or [IPv6]:PORT)".into()
        }),
        "listen_port" => v
            .as_str()
            .and_then(split_listen)
            .map(|(_, port)| port.to_string())
            .ok_or_else(|| "has no port (a listen value: PORT, IP:PORT or [IPv6]:PORT)".into()),
        "words" => {
            let Value::String(s) = v else {
                return Err("is not a string (`words` writes its space-separated words)".into());
            };
            let words: Vec<&str> = s.split(' ').filter(|w| !w.is_empty()).collect();
            if words.is_empty() {
                return Err("has no word".into());
            }
            if let Some(why) = words
                .iter()
                .find_map(|w| not_a_word(w, "each of its words"))
            {
                return Err(why);
            }
            Ok(words.join(" "))
        }
        "lua" => {
            let mut out = String::new();
            lua_literal(v, &mut out);
            Ok(out)
        }
        "nginx_env" | "ca_file" => {
            let Value::Object(block) = v else {
                return Err(format!(
                    "is not a redis block (`{f}` reads `password_env` and `tls`)"
                ));
            };
            if f == "ca_file" {
                return match block.get("tls").and_then(|t| t.get("ca_file")) {
                    None | Some(Value::Null) => Ok(SYSTEM_CA_FILE.to_owned()),
                    Some(Value::String(p)) if !p.is_empty() && breaking_char(p).is_none() => {
                        Ok(p.clone())
                    }
                    Some(_) => Err("has a `tls.ca_file` nginx cannot read as one file name".into()),
                };
            }
            match block.get("password_env") {
                None | Some(Value::Null) => {
                    Ok("# (no redis.password_env: no Redis password)".to_owned())
                }
                Some(Value::String(var))
                    if !var.is_empty()
                        && !var.starts_with(|c: char| c.is_ascii_digit())
                        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                {
                    Ok(format!("env {var};"))
                }
                Some(_) => Err("has a `password_env` that is not a variable name".into()),
            }
        }
        _ => Err(format!("has no {f}")),
    }
}

/// The `IP:PORT` on the node itself of an nginx `listen` value.
/// An nginx `listen` value (`PORT`, `IP:PORT`, `*:PORT`, `[IPv6]:PORT`)
/// → its host part (empty for a bare port) and its port (never 0).
fn split_listen(listen: &str) -> Option<(&str, u16)> {
    let listen = listen.trim();
    let (host, port) = if listen.bytes().all(|b| b.is_ascii_digit()) {
        ("", listen)
    } else if let Some(rest) = listen.strip_prefix('[') {
        rest.split_once("]:")?
    } else {
        listen.rsplit_once(':')?
    };
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    Some((host, port))
}

fn loopback(listen: &str) -> Option<String> {
    let (host, port) = split_listen(listen)?;
    let ip: std::net::IpAddr = match host {
        "" | "*" => std::net::Ipv4Addr::LOCALHOST.into(),
        h => match h.parse::<std::net::IpAddr>().ok()? {
            std::net::IpAddr::V4(a) if a.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(a) if a.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            a => a,
        },
    };
    Some(std::net::SocketAddr::new(ip, port).to_string())
}

/// `v` as a Lua literal: `nil`, booleans and numbers as JSON writes them,
/// strings quoted (see [`lua_string`]), lists and maps as table
/// constructors (keys as names when they are identifiers).
fn lua_literal(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("nil"),
        Value::Bool(_) | Value::Number(_) => out.push_str(&v.to_string()),
        Value::String(s) => lua_string(s, out),
        Value::Array(items) => {
            out.push('{');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                lua_literal(item, out);
            }
            out.push('}');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let name = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if name {
                    out.push_str(k);
                } else {
                    out.push('[');
                    lua_string(k, out);
                    out.push(']');
                }
                out.push_str(" = ");
                lua_literal(item, out);
            }
            out.push('}');
        }
    }
}

/// A quoted Lua string: letters, digits, space and `-./:_@%+=,~^!#$&*()<>?|`
/// as they are; every other byte (quotes, backslash, brackets, braces,
/// `;`, control characters, UTF-8) as `\ddd`, which Lua reads back as
/// that byte.
fn lua_string(s: &str, out: &mut String) {
    out.push('"');
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b" -./:_@%+=,~^!#$&*()<>?|".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\{b:03}"));
        }
    }
    out.push('"');
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
    fn the_redis_filters_pass_the_block_as_data_that_cannot_break_out() {
        let cx = serde_json::json!({"node": {
            "a": {"url": "redis://u@127.0.0.1:6401", "password_env": "EDGE_PW"},
            "s": {"sentinels": ["10.0.0.5:26379"], "master": "m", "tls": {"ca_file": "/etc/r/ca.pem"}},
            "hostile": {"master": "a\"]]}) os.exit() --{\n\\é", "x-y": [1, true, null]},
            "env": {"password_env": "1BAD"},
        }});
        let t = "{{ node.a | lua }}|{{ node.a | nginx_env }}|{{ node.a | ca_file }}|\
                 {{ node.s | nginx_env }}|{{ node.s | ca_file }}|{{ node.a.url | port }}|{{ node.s | lua }}";
        assert_eq!(
            render("t", t, &cx).unwrap(),
            r#"{password_env = "EDGE_PW", url = "redis://u@127.0.0.1:6401"}|env EDGE_PW;|/etc/ssl/certs/ca-certificates.crt|# (no redis.password_env: no Redis password)|/etc/r/ca.pem|6401|{master = "m", sentinels = {"10.0.0.5:26379"}, tls = {ca_file = "/etc/r/ca.pem"}}"#
        );
        // Quotes, brackets, braces, newlines and UTF-8 only as \ddd.
        assert_eq!(
            render("t", "{{ node.hostile | lua }}", &cx).unwrap(),
            r#"{master = "a\034\093\093\125) os.exit() --\123\010\092\195\169", ["x-y"] = {1, true, nil}}"#
        );
        for bad in [
            "{{ node.env | nginx_env }}",
            "{{ node.a.url | ca_file }}",
            "{{ node.a.url | nginx_env }}",
        ] {
            let e = render("roles/edge/nginx.conf.tmpl", bad, &cx).unwrap_err();
            assert_eq!(e[0].kind, ErrorKind::TemplateSyntax, "{bad}");
            assert!(
                e[0].to_string()
                    .starts_with("roles/edge/nginx.conf.tmpl:1:1: `node."),
                "{}",
                e[0]
            );
        }
    }

    #[test]
    fn loopback_is_where_the_node_itself_reaches_a_listener() {
        for (listen, want) in [
            ("80", Some("127.0.0.1:80")),
            ("0.0.0.0:443", Some("127.0.0.1:443")),
            ("*:10443", Some("127.0.0.1:10443")),
            ("[::]:443", Some("[::1]:443")),
            ("10.0.0.5:8080", Some("10.0.0.5:8080")),
            ("[2001:db8::1]:80", Some("[2001:db8::1]:80")),
            ("edge.example.net:80", None),
            ("0", None),
            ("127.0.0.1", None),
            ("", None),
        ] {
            assert_eq!(loopback(listen).as_deref(), want, "{listen}");
        }
        let cx = serde_json::json!({"l": "0.0.0.0:80", "v6": "[::]:10443", "n": 3});
        assert_eq!(
            render("t", "{{ l | loopback }}", &cx).unwrap(),
            "127.0.0.1:80"
        );
        assert!(render("t", "{{ n | loopback }}", &cx).is_err());
        assert_eq!(render("t", "{{ l | listen_port }}", &cx).unwrap(), "80");
        assert_eq!(render("t", "{{ v6 | listen_port }}", &cx).unwrap(), "10443");
        assert!(render("t", "{{ n | listen_port }}", &cx).is_err());
    }

    #[test]
    fn a_value_written_as_it_is_stays_one_word_in_any_template() {
        let cx = serde_json::json!({"v": {
            "lua": "false, _pwn = os.execute('id')",
            "nginx": "auto; user root",
            "dir": "/c levels=1:2 keys_zone=x:1m;\n add_header X 1;",
            "tab": "/etc/ca.pem\t#",
            "two": "10.0.0.2  10.0.0.3",
            "key": "$scheme://$host$request_uri",
            "url": "http://127.0.0.1:9/x?a=b",
            "listen": "[::]:443",
            "call": "os.execute[[id]]",
        }});
        for bad in ["lua", "nginx", "dir", "tab", "two", "call"] {
            let e = render("t", &format!("x {{{{ v.{bad} }}}};"), &cx).unwrap_err();
            assert_eq!(e[0].kind, ErrorKind::TemplateSyntax, "{bad}");
            assert!(e[0].message.contains("must be one word"), "{}", e[0]);
        }
        assert_eq!(
            render("t", "{{ v.key }} {{ v.url }} {{ v.listen }}", &cx).unwrap(),
            "$scheme://$host$request_uri http://127.0.0.1:9/x?a=b [::]:443"
        );
        assert_eq!(
            render("t", "{{ v.two | words }}", &cx).unwrap(),
            "10.0.0.2 10.0.0.3"
        );
        assert!(render("t", "{{ v.nginx | words }}", &cx).is_err());
        assert!(render("t", "{{ v.dir | words }}", &cx).is_err());
        // Inside a list or map written as it is, too.
        let cx2 = serde_json::json!({"dirs": ["/a", "/x; include /etc/passwd"], "ok": {"url": "redis://h:1", "s": ["a:1"]}});
        assert!(render("t", "{{ dirs }}", &cx2).is_err());
        assert_eq!(
            render("t", "{{ ok }}", &cx2).unwrap(),
            r#"{"s":["a:1"],"url":"redis://h:1"}"#
        );
        // In YAML or JSON, JSON flow quotes its strings.
        assert!(render("a.yaml.tmpl", "dirs: {{ dirs }}", &cx2).is_ok());
        // A ca_file that would end nginx's directive.
        let cx = serde_json::json!({"r": {"tls": {"ca_file": "/etc/ca.pem\t#"}}});
        assert!(render("t", "{{ r | ca_file }}", &cx).is_err());
    }

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
