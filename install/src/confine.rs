//! What the nginx gate lets `nginx -t` touch (docs/install.md, "The nginx
//! gate's sandbox"). Pure: reads a rendered configuration's text, never a
//! file.
//!
//! `check` runs on pull requests, so the configuration it tests is
//! untrusted. Before `nginx -t` runs, every directive of the gate's
//! rendering (and of every bundle file it includes) is read here:
//! - `load_module` names exactly one of [`SHIPPED_MODULES`];
//! - `lua_package_path`/`lua_package_cpath` entries are inside the scratch
//!   folder or under one of [`SYSTEM_LUA_DIRS`];
//! - `include` stays inside the scratch folder;
//! - `proxy_ssl_trusted_certificate` and `lua_ssl_trusted_certificate` may
//!   name the system's trust store
//!   ([`SYSTEM_TRUST_STORE`]);
//! - `ssl_engine` and `engine:` keys (OpenSSL engines are shared objects)
//!   are refused;
//! - every other argument that is an absolute path, or climbs with `..`,
//!   must stay inside the scratch folder — except in the directives whose
//!   arguments are URIs ([`URI_DIRECTIVES`]), the data blocks (`map`,
//!   `geo`, `types`, …: only their `include` is read) and Lua blocks.
//!
//! Node YAML paths and `instance.*` are already moved under the scratch
//! folder by the gate's rendering, so a template that takes its paths from
//! there passes; a literal absolute path in a template does not.

use std::path::{Component, Path, PathBuf};

/// The only modules a configuration may load in the gate: the three of
/// `roles/edge/nginx.conf.tmpl` (DEPENDENCIES.md).
pub const SHIPPED_MODULES: [&str; 3] = [
    "/usr/lib/nginx/modules/ndk_http_module.so",
    "/usr/lib/nginx/modules/ngx_http_lua_module.so",
    "/usr/lib/nginx/modules/ngx_http_geoip2_module.so",
];

/// Where `lua_package_path`/`lua_package_cpath` may point outside the
/// scratch folder: the system's Lua 5.1 folders.
pub const SYSTEM_LUA_DIRS: [&str; 5] = [
    "/usr/share/lua/5.1/",
    "/usr/local/share/lua/5.1/",
    "/usr/lib/x86_64-linux-gnu/lua/5.1/",
    "/usr/lib/aarch64-linux-gnu/lua/5.1/",
    "/usr/local/lib/lua/5.1/",
];

/// The system trust store: the one file outside the scratch folder a
/// `*_trusted_certificate` directive may name (a PEM bundle of public CAs,
/// what `lua_ssl_trusted_certificate` and `proxy_ssl_trusted_certificate`
/// verify against when the node names no CA of its own).
pub const SYSTEM_TRUST_STORE: &str = roletmpl::SYSTEM_CA_FILE;

/// Directives whose arguments are URIs, names, headers or expressions,
/// never files `nginx -t` reads.
pub const URI_DIRECTIVES: [&str; 39] = [
    "location",
    "rewrite",
    "return",
    "error_page",
    "try_files",
    "set",
    "if",
    "add_header",
    "add_trailer",
    "proxy_set_header",
    "grpc_set_header",
    "fastcgi_param",
    "uwsgi_param",
    "scgi_param",
    "proxy_redirect",
    "proxy_cookie_path",
    "proxy_cookie_domain",
    "auth_request",
    "mirror",
    "proxy_pass",
    "grpc_pass",
    "fastcgi_pass",
    "uwsgi_pass",
    "scgi_pass",
    "proxy_cache_key",
    "fastcgi_cache_key",
    "uwsgi_cache_key",
    "scgi_cache_key",
    "index",
    "sub_filter",
    "valid_referers",
    "secure_link",
    "secure_link_md5",
    "server_name",
    "default_type",
    "log_format",
    "proxy_hide_header",
    "proxy_pass_header",
    "map",
];

/// Blocks whose entries are data (`/old /new;` in a `map`), not directives.
const DATA_BLOCKS: [&str; 6] = [
    "map",
    "geo",
    "types",
    "split_clients",
    "charset_map",
    "match",
];

/// Log targets outside the scratch folder that are not files.
const LOG_DEVICES: [&str; 3] = ["/dev/null", "/dev/stderr", "/dev/stdout"];

/// The message for a file the confinement cannot read exactly as nginx
/// does: refused, never guessed.
pub const UNREADABLE: &str = "cannot be read exactly as nginx reads it (unbalanced quotes or \
     braces, a `${` not closed as `${name}`, a `}` inside a word, or a Lua block whose end is \
     ambiguous): refused";

/// One refused directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 1-based line in the file it was read from.
    pub line: usize,
    pub message: String,
}

/// One directive: its name, arguments (quotes removed), line, and the
/// directives of its block.
#[derive(Debug, Clone)]
struct Directive {
    name: String,
    args: Vec<String>,
    line: usize,
    block: Option<Vec<Directive>>,
}

/// Where the configuration may point: `prefix` (the release, what relative
/// paths resolve against) and `scratch` (the node's whole scratch folder).
pub struct Bounds<'a> {
    pub prefix: &'a Path,
    pub scratch: &'a Path,
}

/// Every refused directive of `text`, plus the bundle paths (relative to
/// the prefix) it includes with the line of each `include`, so the caller
/// checks those too.
#[must_use]
pub fn check(text: &str, bounds: &Bounds<'_>) -> (Vec<Refused>, Vec<(String, usize)>) {
    let mut refused = Vec::new();
    let mut includes = Vec::new();
    match parse(text) {
        Ok(directives) => walk(&directives, false, bounds, &mut refused, &mut includes),
        Err(line) => refused.push(Refused {
            line,
            message: UNREADABLE.into(),
        }),
    }
    refused.sort_by_key(|r| r.line);
    (refused, includes)
}

fn walk(
    directives: &[Directive],
    in_data: bool,
    bounds: &Bounds<'_>,
    refused: &mut Vec<Refused>,
    includes: &mut Vec<(String, usize)>,
) {
    for d in directives {
        let mut refuse = |message: String| {
            refused.push(Refused {
                line: d.line,
                message,
            });
        };
        if d.name == "include" {
            for a in &d.args {
                match inside(a, bounds) {
                    Some(rel) => includes.push((rel, d.line)),
                    None => refuse(format!(
                        "`include {a}` reads a file outside the bundle; the gate reads only the \
                         bundle's own files"
                    )),
                }
            }
        } else if in_data {
            // Entries of a map/geo/types block are data.
        } else if d.name == "load_module" {
            for a in &d.args {
                if !SHIPPED_MODULES.contains(&a.as_str()) {
                    refuse(format!(
                        "`load_module {a}`: the gate loads only the modules this project ships \
                         ({})",
                        SHIPPED_MODULES.join(", ")
                    ));
                }
            }
        } else if d.name == "ssl_engine" {
            refuse("`ssl_engine` loads an OpenSSL engine (a shared object): refused".into());
        } else if d.name == "lua_package_path" || d.name == "lua_package_cpath" {
            for a in &d.args {
                for entry in a.split(';').filter(|e| !e.is_empty()) {
                    if !lua_entry_allowed(entry, bounds) {
                        refuse(format!(
                            "`{}` entry `{entry}` is outside the bundle and the system's Lua \
                             folders ({})",
                            d.name,
                            SYSTEM_LUA_DIRS.join(", ")
                        ));
                    }
                }
            }
        } else if !URI_DIRECTIVES.contains(&d.name.as_str()) && !d.name.ends_with("_by_lua_block") {
            for a in &d.args {
                if a.starts_with("engine:") {
                    refuse(format!(
                        "`{} {a}`: an OpenSSL engine key loads a shared object: refused",
                        d.name
                    ));
                    continue;
                }
                // `key=value` arguments (`keys_zone=edge:50m`, `path=/x`).
                let value = a.split_once('=').map_or(a.as_str(), |(_, v)| v);
                for candidate in [a.as_str(), value] {
                    if looks_like_path(candidate)
                        && inside(candidate, bounds).is_none()
                        && !(matches!(d.name.as_str(), "error_log" | "access_log")
                            && LOG_DEVICES.contains(&candidate))
                        && !(matches!(
                            d.name.as_str(),
                            "proxy_ssl_trusted_certificate" | "lua_ssl_trusted_certificate"
                        ) && candidate == SYSTEM_TRUST_STORE)
                    {
                        refuse(format!(
                            "`{} {a}` points outside the gate's scratch folder: take paths from \
                             the node's YAML or `instance.*` (moved under the scratch folder \
                             for the gate), or relative to the release",
                            d.name
                        ));
                        break;
                    }
                }
            }
        }
        if let Some(block) = &d.block {
            let data = in_data || DATA_BLOCKS.contains(&d.name.as_str());
            walk(block, data, bounds, refused, includes);
        }
    }
}

/// An absolute path, or a relative one that climbs (`a/../../x`).
fn looks_like_path(s: &str) -> bool {
    s.starts_with('/')
        || s.starts_with("$prefix")
        || s.starts_with("${prefix}")
        || s.split('/').any(|p| p == "..")
}

/// `$prefix` and `${prefix}` replaced by the release folder.
fn expand(s: &str, prefix: &Path) -> String {
    let p = prefix.display().to_string();
    let p = p.trim_end_matches('/');
    s.replace("${prefix}", p).replace("$prefix", p)
}

/// `a` (relative to the prefix) resolved without following links; its
/// path relative to the prefix when inside the scratch folder (`""` when
/// inside the scratch folder but outside the release).
fn inside(a: &str, bounds: &Bounds<'_>) -> Option<String> {
    let expanded = expand(a, bounds.prefix);
    let full = if expanded.starts_with('/') {
        PathBuf::from(&expanded)
    } else {
        bounds.prefix.join(&expanded)
    };
    let normal = normalise(&full)?;
    if !normal.starts_with(bounds.scratch) {
        return None;
    }
    Some(
        normal
            .strip_prefix(bounds.prefix)
            .map(|r| r.display().to_string())
            .unwrap_or_default(),
    )
}

/// `..` and `.` resolved lexically; `None` when it climbs above `/`.
fn normalise(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn lua_entry_allowed(entry: &str, bounds: &Bounds<'_>) -> bool {
    let expanded = expand(entry, bounds.prefix);
    if expanded.split('/').any(|p| p == "..") {
        return false;
    }
    if !expanded.starts_with('/') {
        // Relative to nginx's working folder: the gate runs in the release.
        return true;
    }
    let p = Path::new(&expanded);
    p.starts_with(bounds.scratch) || SYSTEM_LUA_DIRS.iter().any(|d| expanded.starts_with(d))
}

/// The directives of an nginx configuration; `Err(line)` where it cannot
/// be read (nginx itself then refuses it).
fn parse(text: &str) -> Result<Vec<Directive>, usize> {
    let mut lex = Lexer {
        chars: text.chars().collect(),
        at: 0,
        line: 1,
    };
    let (list, closed) = block(&mut lex, 0)?;
    if closed {
        return Err(lex.line);
    }
    Ok(list)
}

/// What nginx's lexer reads as space (nothing else: a no-break space is
/// part of a word there).
fn space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
}

enum Token {
    Word(String, usize),
    Semicolon,
    Open,
    Close,
}

impl Lexer {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn token(&mut self) -> Result<Option<Token>, usize> {
        loop {
            match self.peek() {
                None => return Ok(None),
                Some(c) if space(c) => {
                    self.bump();
                }
                Some('#') => {
                    while let Some(c) = self.bump() {
                        if c == '\n' {
                            break;
                        }
                    }
                }
                Some(';') => {
                    self.bump();
                    return Ok(Some(Token::Semicolon));
                }
                Some('{') => {
                    self.bump();
                    return Ok(Some(Token::Open));
                }
                Some('}') => {
                    self.bump();
                    return Ok(Some(Token::Close));
                }
                Some(q @ ('"' | '\'')) => {
                    let line = self.line;
                    self.bump();
                    let mut word = String::new();
                    loop {
                        match self.bump() {
                            None => return Err(line),
                            Some('\\') => {
                                if let Some(c) = self.bump() {
                                    word.push(c);
                                }
                            }
                            Some(c) if c == q => break,
                            Some(c) => word.push(c),
                        }
                    }
                    return Ok(Some(Token::Word(word, line)));
                }
                Some(_) => {
                    let line = self.line;
                    let mut word = String::new();
                    while let Some(c) = self.peek() {
                        if space(c) || matches!(c, ';' | '{') {
                            break;
                        }
                        // `${var}` inside a word: nginx's lexer keeps the
                        // `{` after a `$` in the word and ends the word at
                        // the next space, `;` or `{` whatever braces it
                        // holds, so only a closed `${name}` is read; any
                        // other `${` or `}` in a word is refused.
                        if c == '$' && self.chars.get(self.at + 1) == Some(&'{') {
                            word.push('$');
                            word.push('{');
                            self.at += 2;
                            loop {
                                match self.peek() {
                                    Some(c) if c.is_ascii_alphanumeric() || c == '_' => {
                                        self.bump();
                                        word.push(c);
                                    }
                                    Some('}') if !word.ends_with('{') => {
                                        self.bump();
                                        word.push('}');
                                        break;
                                    }
                                    _ => return Err(line),
                                }
                            }
                            continue;
                        }
                        if c == '}' {
                            return Err(line);
                        }
                        self.bump();
                        if c == '\\' {
                            if let Some(n) = self.bump() {
                                word.push(n);
                            }
                            continue;
                        }
                        word.push(c);
                    }
                    return Ok(Some(Token::Word(word, line)));
                }
            }
        }
    }

    /// Skip a Lua block's body up to its closing `}` (the `{` is read):
    /// strings, long brackets and comments are Lua's. Where another reader
    /// of the block (lua-nginx-module's) could end it elsewhere, it is
    /// refused (`Err(line)`): a `{` or `}` inside a string or a comment, a
    /// quoted string that runs past its line, a carriage return that is
    /// not before a line feed, a string or comment never closed.
    fn skip_lua(&mut self) -> Result<(), usize> {
        let start = self.line;
        let mut depth = 1usize;
        while let Some(c) = self.bump() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                '\r' if self.peek() != Some('\n') => return Err(self.line),
                '"' | '\'' => {
                    let line = self.line;
                    loop {
                        match self.bump() {
                            None | Some('\n' | '\r' | '{' | '}') => return Err(line),
                            Some('\\') => {
                                if matches!(self.bump(), None | Some('\n' | '\r' | '{' | '}')) {
                                    return Err(line);
                                }
                            }
                            Some(q) if q == c => break,
                            Some(_) => {}
                        }
                    }
                }
                '[' => {
                    let line = self.line;
                    if self.long_bracket() == Some(false) {
                        return Err(line);
                    }
                }
                '-' if self.peek() == Some('-') => {
                    let line = self.line;
                    self.bump();
                    if self.peek() == Some('[') {
                        self.bump();
                        match self.long_bracket() {
                            Some(true) => continue,
                            Some(false) => return Err(line),
                            None => {}
                        }
                    }
                    while let Some(c) = self.bump() {
                        match c {
                            '\n' => break,
                            '\r' | '{' | '}' => return Err(line),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Err(start)
    }

    /// After a `[`: a long bracket `[=*[ … ]=*]` skipped; `None` (nothing
    /// read) when it is not one, `Some(false)` when it holds a brace or a
    /// carriage return or is never closed.
    fn long_bracket(&mut self) -> Option<bool> {
        let mut level = 0;
        while self.chars.get(self.at + level) == Some(&'=') {
            level += 1;
        }
        if self.chars.get(self.at + level) != Some(&'[') {
            return None;
        }
        for _ in 0..=level {
            self.bump();
        }
        let close: String = std::iter::once(']')
            .chain(std::iter::repeat_n('=', level))
            .chain(std::iter::once(']'))
            .collect();
        let close: Vec<char> = close.chars().collect();
        while let Some(c) = self.peek() {
            if self.chars[self.at..].starts_with(&close) {
                for _ in 0..close.len() {
                    self.bump();
                }
                return Some(true);
            }
            if matches!(c, '{' | '}' | '\r') {
                return Some(false);
            }
            self.bump();
        }
        Some(false)
    }
}

/// Directives up to a `}` (`true`) or the end (`false`).
fn block(lex: &mut Lexer, depth: usize) -> Result<(Vec<Directive>, bool), usize> {
    if depth > 64 {
        return Err(lex.line);
    }
    let mut out = Vec::new();
    let mut words: Vec<(String, usize)> = Vec::new();
    while let Some(t) = lex.token()? {
        match t {
            Token::Word(w, line) => words.push((w, line)),
            Token::Semicolon => {
                if let Some(d) = directive(std::mem::take(&mut words), None) {
                    out.push(d);
                }
            }
            Token::Open => {
                let lua = words
                    .first()
                    .is_some_and(|(n, _)| n.ends_with("_by_lua_block"));
                let inner = if lua {
                    lex.skip_lua()?;
                    Vec::new()
                } else {
                    let (inner, closed) = block(lex, depth + 1)?;
                    if !closed {
                        return Err(lex.line);
                    }
                    inner
                };
                match directive(std::mem::take(&mut words), Some(inner)) {
                    Some(d) => out.push(d),
                    None => return Err(lex.line),
                }
            }
            Token::Close => {
                if !words.is_empty() {
                    return Err(lex.line);
                }
                return Ok((out, true));
            }
        }
    }
    if !words.is_empty() {
        return Err(lex.line);
    }
    Ok((out, false))
}

fn directive(words: Vec<(String, usize)>, block: Option<Vec<Directive>>) -> Option<Directive> {
    let mut it = words.into_iter();
    let (name, line) = it.next()?;
    Some(Directive {
        name,
        args: it.map(|(w, _)| w).collect(),
        line,
        block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> Vec<(usize, String)> {
        let b = Bounds {
            prefix: Path::new("/scratch/nginx/e1/release"),
            scratch: Path::new("/scratch/nginx/e1"),
        };
        check(text, &b)
            .0
            .into_iter()
            .map(|r| (r.line, r.message))
            .collect()
    }

    #[test]
    fn code_loading_and_paths_outside_the_scratch_folder_are_refused_at_their_line() {
        let text = "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;\n\
                    load_module lua/../libx.so;\n\
                    load_module /usr/lib/nginx/modules/ngx_http_perl_module.so;\n\
                    ssl_engine pkcs11;\n\
                    http {\n\
                    \x20 include /some/secret/file;\n\
                    \x20 include conf.d/*.conf;\n\
                    \x20 include ../../../etc/passwd;\n\
                    \x20 lua_package_path \"$prefix/lua/?.lua;/usr/share/lua/5.1/?.lua;;\";\n\
                    \x20 lua_package_cpath \"/tmp/?.so\";\n\
                    \x20 geoip2 /var/lib/GeoIP/x.mmdb { $c country iso_code; }\n\
                    \x20 geoip2 geoip/x.mmdb { $c country iso_code; }\n\
                    \x20 ssl_certificate_key engine:pkcs11:x;\n\
                    \x20 proxy_cache_path /scratch/nginx/e1/cache keys_zone=edge:10m;\n\
                    \x20 error_log /dev/stderr;\n\
                    \x20 map $uri $x { /old /new; include /etc/x; }\n\
                    \x20 server { location /admin { return 301 /x; } root /etc; }\n\
                    \x20 init_by_lua_block { local s = \"x\" -- y\n ngx.say(s) }\n\
                    \x20 include /etc/y;\n\
                    \x20 lua_ssl_trusted_certificate /etc/ssl/certs/ca-certificates.crt;\n\
                    \x20 lua_ssl_trusted_certificate /etc/ssl/private/x.pem;\n\
                    \x20 ssl_certificate /etc/ssl/certs/ca-certificates.crt;\n\
                    }\n";
        let lines: Vec<usize> = refused(text).iter().map(|r| r.0).collect();
        assert_eq!(
            lines,
            vec![2, 3, 4, 6, 8, 10, 11, 13, 16, 17, 20, 22, 23],
            "{:?}",
            refused(text)
        );
    }

    #[test]
    fn words_are_split_as_nginx_splits_them_or_refused() {
        for text in [
            "pid ${x;load_module /tmp/x.so;};\n",
            "pid ${x y};\n",
            "pid ${};\n",
            "pid a}b;\n",
            "events { worker_connections 1}; }\n",
        ] {
            assert_eq!(refused(text), vec![(1, UNREADABLE.to_owned())], "{text:?}");
        }
        // A no-break space is part of a word for nginx, not a separator.
        assert_eq!(refused("pid\u{a0}x;\n"), vec![]);
        assert_eq!(
            refused("error_log ${prefix}x.log;\nset $a \"${b}c\";\n"),
            vec![]
        );
    }

    #[test]
    fn lua_blocks_whose_end_another_reader_could_place_elsewhere_are_refused() {
        for (text, line) in [
            (
                "init_by_lua_block { local s = \"\n}\ninclude /etc/x;\nlog_by_lua_block {\n--\"\n}\n",
                1,
            ),
            ("init_by_lua_block { local s = \"}\" }\n", 1),
            ("init_by_lua_block { local s = '{' }\n", 1),
            ("init_by_lua_block {\n local s = \"a\\\nb\" }\n", 2),
            ("init_by_lua_block {\n -- }\n}\n", 2),
            ("init_by_lua_block { local s = [[}]] }\n", 1),
            ("init_by_lua_block {\n --[==[ { ]==] }\n", 2),
            ("init_by_lua_block { local s = [[x }\n", 1),
            ("init_by_lua_block { x = 1 -- a\rinclude /etc/x; }\n", 1),
        ] {
            assert_eq!(
                refused(text),
                vec![(line, UNREADABLE.to_owned())],
                "{text:?}"
            );
        }
        // Braces in code, strings and comments without any: read.
        assert_eq!(
            refused(
                "init_by_lua_block {\n local t = { a = \"x\", [ [[k]] ] = 'y' } -- c\n\
                 --[[ long\n comment ]] f(t)\n}\ninclude /etc/x;\n"
            ),
            vec![(6, refused("include /etc/x;")[0].1.clone())]
        );
    }

    #[test]
    fn the_shipped_template_passes() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../roles/edge/nginx.conf.tmpl"),
        )
        .unwrap()
        .replace("{{ instance.run }}", "/scratch/nginx/e1/srv/run/gate")
        .replace("{{ node.cache.dirs.0 }}", "/scratch/nginx/e1/var/cache");
        // Every other field: a plain value.
        let mut rendered = String::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("{{") {
            rendered.push_str(&rest[..i]);
            rendered.push('1');
            rest = &rest[i + rest[i..].find("}}").unwrap() + 2..];
        }
        rendered.push_str(rest);
        assert_eq!(refused(&rendered), vec![]);
    }
}
