//! The purge job, as queued on `cdn:purge:<region>:<node>`.
//!
//! Two shapes, both JSON objects:
//! - pattern: `{"id", "site", "grep": "<regex>"}` — the regex is matched
//!   against the cache file's `KEY: <key>` line, as the seed's `grep -P`
//!   matched it. The seed's own `{"grep": "KEY:.*example\\.com"}` (no id,
//!   no site) is valid as it is.
//! - exact: `{"id", "site", "keys": ["<cache key>", …]}` (or a single
//!   `"key"`): each key's file path is computed from its md5 and the cache
//!   `levels`, no scan.
//!
//! - `"all": true` (optional, pattern jobs only): the pattern may match
//!   every cached file. Without it, a pattern that matches every key (see
//!   [`scope_guard`]: `""`, `".*"`, `"KEY:"`, …) is failed. `edgeform
//!   purge --all` sets it; its site-scoped patterns do not need it.
//!
//! A job is at most [`MAX_JOB_BYTES`] bytes of UTF-8; anything else is
//! failed without being parsed (and without its content being echoed).
//!
//! Results: the worker writes `{<node>: <files removed>}` into the hash
//! `cdn:purge:done:<id>` (a failed job writes `failed: <reason>`), kept
//! for [`DONE_TTL_SECS`], and announces it on the channel of the same name
//! ([`done_channel`]).

use serde::{Deserialize, Serialize};

/// How long a job's result hash lives.
pub const DONE_TTL_SECS: u64 = 7 * 24 * 3600;

/// Prefix of a failed job's value in the result hash.
pub const FAILED_PREFIX: &str = "failed: ";

/// `cdn:purge:done:<id>`.
#[must_use]
pub fn done_key(id: &str) -> String {
    format!("cdn:purge:done:{id}")
}

/// The channel a worker announces each result on, once it is in
/// [`done_key`] (same name: channels and keys do not collide), with the
/// node's name and its value as the message ([`announcement`]):
/// `edgeform purge --wait` subscribes to it instead of polling. The hash
/// stays the record.
#[must_use]
pub fn done_channel(id: &str) -> String {
    done_key(id)
}

/// The message a worker publishes on [`done_channel`] once its result is
/// in [`done_key`]: the node's name, a newline, and the value it wrote
/// there — so a waiter learns the result without reading the hash back
/// (one round trip less per node). The hash stays the record. Pure.
#[must_use]
pub fn announcement(node: &str, value: &str) -> String {
    format!("{node}\n{value}")
}

/// What an [`announcement`] says: whose result it is, and the value when
/// it carries one. A bare node name (an agent from before the value was
/// added) carries none: it only says "read the hash now". Pure.
#[must_use]
pub fn parse_announcement(message: &str) -> (&str, Option<&str>) {
    match message.split_once('\n') {
        Some((node, value)) => (node, Some(value)),
        None => (message, None),
    }
}

/// The processing list of a queue (reliable-queue pattern).
#[must_use]
pub fn processing_key(queue: &str) -> String {
    format!("{queue}:processing")
}

/// Where a worker parks jobs it could not run, with the reason.
#[must_use]
pub fn failed_key(queue: &str) -> String {
    format!("{queue}:failed")
}

/// A purge job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique id; absent in the seed's jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The site (host) the job is for, for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// Regex over the `KEY: <key>` line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grep: Option<String>,
    /// One exact cache key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Several exact cache keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// The pattern may match every cached file (see [`scope_guard`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// The largest job the agent parses (64 KiB). `edgeform purge` builds
/// jobs of a few hundred bytes; a bigger one is hostile or broken, and
/// parsing a multi-megabyte pattern costs gigabytes in the regex parser.
pub const MAX_JOB_BYTES: usize = 64 * 1024;

/// How many times a job may be started without finishing before the
/// worker records it as failed (it killed the agent each time).
pub const MAX_ATTEMPTS: u32 = 3;

/// What a log or a failed record may show of a job.
pub use crate::untrusted::preview;

/// The key lines a pattern must not match unless the job says `all`: the
/// empty line, the bare `KEY: ` prefix and the root of a host no site can
/// have (`.invalid` is reserved, RFC 2606) under the usual key templates.
/// A pattern matching one of them is not scoped to any site.
pub const SCOPE_PROBES: [&str; 5] = [
    "",
    "KEY: ",
    "KEY: httpedgeform-scope-probe.invalid/",
    "KEY: https://edgeform-scope-probe.invalid/",
    "KEY: edgeform-scope-probe.invalid/",
];

/// Refuse a pattern that matches every key (one of [`SCOPE_PROBES`]).
///
/// # Errors
/// The probe the pattern matches, and how to purge everything on purpose.
pub fn scope_guard(re: &regex::bytes::Regex) -> Result<(), String> {
    match SCOPE_PROBES.iter().find(|p| re.is_match(p.as_bytes())) {
        Some(p) => Err(format!(
            "the pattern matches every cache key (it matches `{p}`, a key no site has); \
             a job that means it sets \"all\": true"
        )),
        None => Ok(()),
    }
}

/// What a job asks for, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<'a> {
    Grep(&'a str),
    Keys(Vec<&'a str>),
}

impl Job {
    /// Parse a job as queued: bytes, at most [`MAX_JOB_BYTES`], UTF-8.
    /// No error repeats the job's content.
    ///
    /// # Errors
    /// Too big, not UTF-8, or what [`Job::parse`] refuses.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Job, String> {
        if bytes.len() > MAX_JOB_BYTES {
            return Err(format!(
                "the job is {} bytes, over the {MAX_JOB_BYTES}-byte limit",
                bytes.len()
            ));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            format!(
                "the job is not UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            )
        })?;
        Job::parse(text)
    }

    /// Parse a queued job.
    ///
    /// # Errors
    /// Not JSON, unknown fields, or not exactly one of `grep` / `key(s)`.
    pub fn parse(text: &str) -> Result<Job, String> {
        let job: Job = serde_json::from_str(text).map_err(|e| format!("not a purge job: {e}"))?;
        job.action()?;
        Ok(job)
    }

    /// The job's action.
    ///
    /// # Errors
    /// When the job has neither or both of `grep` and `key`/`keys`.
    pub fn action(&self) -> Result<Action<'_>, String> {
        let mut keys: Vec<&str> = self.keys.iter().flatten().map(String::as_str).collect();
        if let Some(k) = &self.key {
            keys.push(k);
        }
        match (&self.grep, keys.is_empty()) {
            (Some(g), true) => Ok(Action::Grep(g)),
            (None, false) => Ok(Action::Keys(keys)),
            (Some(_), false) => Err("a job has `grep` or `key`/`keys`, not both".into()),
            (None, true) => Err("a job needs `grep` or `key`/`keys`".into()),
        }
    }

    /// The regex of a pattern job, compiled and scope-checked: what the
    /// agent runs, and what `edgeform purge` checks before enqueueing.
    ///
    /// # Errors
    /// The engine's refusal, or [`scope_guard`]'s without `all`.
    pub fn grep_matcher(pattern: &str, all: bool) -> Result<regex::bytes::Regex, String> {
        let re =
            matcher(pattern).map_err(|e| format!("the regex engine refuses the pattern: {e}"))?;
        if !all {
            scope_guard(&re)?;
        }
        Ok(re)
    }

    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let seed = Job::parse(r#"{"grep": "KEY:.*example\\.com"}"#).unwrap();
        assert_eq!(seed.action().unwrap(), Action::Grep("KEY:.*example\\.com"));
        let exact = Job::parse(r#"{"id":"1","site":"a.com","key":"httpa.com/x"}"#).unwrap();
        assert_eq!(exact.action().unwrap(), Action::Keys(vec!["httpa.com/x"]));
        assert!(Job::parse("not json").is_err());
        assert!(Job::parse(r#"{"id":"1"}"#).is_err());
        assert!(Job::parse(r#"{"grep":"a","key":"b"}"#).is_err());
        assert!(Job::parse(r#"{"grep":"a","rm":"-rf /"}"#).is_err());
    }

    #[test]
    fn bytes_too_big_or_not_utf8_fail_without_echo() {
        let big = format!(r#"{{"grep":"{}"}}"#, "a".repeat(MAX_JOB_BYTES));
        let e = Job::parse_bytes(big.as_bytes()).unwrap_err();
        assert!(
            e.contains("over the 65536-byte limit") && !e.contains("aaaa"),
            "{e}"
        );
        let e = Job::parse_bytes(b"{\"grep\":\"\xff\xfe\"}").unwrap_err();
        assert!(e.contains("not UTF-8"), "{e}");
        assert!(Job::parse_bytes(br#"{"key":"k"}"#).is_ok());
    }

    #[test]
    fn patterns_matching_everything_need_all() {
        for p in ["", ".*", "KEY:", "KEY: ", "^KEY: http", "(?s).", "x*"] {
            let e = Job::grep_matcher(p, false).unwrap_err();
            assert!(e.contains("\"all\": true"), "{p}: {e}");
            assert!(Job::grep_matcher(p, true).is_ok(), "{p}");
        }
        // The seed's job, and what `edgeform purge` builds, are scoped.
        for p in [
            "KEY:.*example\\.com",
            "^KEY: (?:http|https)(?:example\\.com|www\\.example\\.com)(?:/)",
            "^KEY: (?:http|https)(?:[^/]+\\.cdn\\.example\\.io)(?:/)",
            "\\.mp4$",
        ] {
            assert!(Job::grep_matcher(p, false).is_ok(), "{p}");
        }
        let j = Job::parse(r#"{"grep":".*","all":true}"#).unwrap();
        assert!(j.all);
        assert_eq!(j.to_json(), r#"{"grep":".*","all":true}"#);
        assert!(
            !Job::parse(r#"{"key":"k"}"#)
                .unwrap()
                .to_json()
                .contains("all")
        );
    }

    // One engine, one size limit, one verdict.
    #[test]
    fn one_verdict_for_huge_repetitions() {
        let e = matcher("a{1000}{1000}").unwrap_err();
        assert!(e.contains("size limit"), "{e}");
        assert!(Job::grep_matcher("a{1000}{1000}", true).is_err());
    }
}

/// nginx's `levels=` syntax (`1`, `1:2`, `1:1:2`, …): the characters per
/// directory level, outermost first. One to three levels of `1` or `2`;
/// nginx refuses the rest, and so does this.
///
/// # Errors
/// Empty input, more than three levels, or a level other than `1`/`2`.
pub fn parse_levels(s: &str) -> Result<Vec<u8>, LevelsError> {
    let err = |kind| LevelsError {
        input: s.to_owned(),
        kind,
    };
    if s.is_empty() {
        return Err(err(LevelsErrorKind::Empty));
    }
    let mut lens = Vec::with_capacity(MAX_LEVELS);
    for part in s.split(':') {
        if lens.len() == MAX_LEVELS {
            return Err(err(LevelsErrorKind::TooMany));
        }
        lens.push(match part {
            "1" => 1,
            "2" => 2,
            _ => return Err(err(LevelsErrorKind::BadLevel(part.to_owned()))),
        });
    }
    Ok(lens)
}

/// Most cache directory levels nginx accepts (`NGX_MAX_PATH_LEVEL`).
pub const MAX_LEVELS: usize = 3;

/// Why a `levels` value was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelsError {
    input: String,
    kind: LevelsErrorKind,
}

impl LevelsError {
    /// The refused input.
    #[must_use]
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What was wrong with it.
    #[must_use]
    pub fn kind(&self) -> &LevelsErrorKind {
        &self.kind
    }
}

/// The ways a `levels` value can be wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LevelsErrorKind {
    /// No level at all.
    Empty,
    /// More than three levels.
    TooMany,
    /// A level that is not `1` or `2` (the offending part).
    BadLevel(String),
}

impl std::fmt::Display for LevelsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let input = &self.input;
        match &self.kind {
            LevelsErrorKind::Empty => {
                write!(f, "levels `{input}`: expected 1 to 3 levels like `1:2`")
            }
            LevelsErrorKind::TooMany => write!(f, "levels `{input}`: at most 3 levels"),
            LevelsErrorKind::BadLevel(part) => {
                write!(
                    f,
                    "levels `{input}`: a level is `1` or `2` characters, not `{part}`"
                )
            }
        }
    }
}

impl std::error::Error for LevelsError {}

/// The seed's cache layout: the defaults of a node's `cache` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheDefaults {
    pub dirs: [&'static str; 4],
    pub levels: &'static str,
    pub key: &'static str,
}

impl Default for CacheDefaults {
    fn default() -> Self {
        CacheDefaults {
            dirs: [
                "/var/cache/nginx/static",
                "/var/cache/nginx/dynamic",
                "/var/cache/nginx/api",
                "/var/cache/nginx/perma",
            ],
            levels: "1:2",
            key: "$scheme://$host$request_uri",
        }
    }
}

/// Cap on a compiled purge regex (bytes of program), so a hostile pattern
/// cannot exhaust the agent's memory. The engine is linear-time.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The one regex engine purge patterns run on, agent and CLI alike:
/// Rust's `regex` (linear time, no catastrophic backtracking), on bytes.
///
/// # Errors
/// The engine's refusal (syntax, look-around, back-references, too big).
pub fn matcher(pattern: &str) -> Result<regex::bytes::Regex, String> {
    regex::bytes::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::Syntax(s) => s
                .lines()
                .last()
                .unwrap_or_default()
                .trim_start_matches("error: ")
                .to_owned(),
            other => other.to_string(),
        })
}

/// One request, as nginx sees it, for expanding a `proxy_cache_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub scheme: &'a str,
    pub host: &'a str,
    /// Path and query, e.g. `/a.mp4?x=1`.
    pub request_uri: &'a str,
}

/// A request URI (`/path?query`) in the form the edge caches it under:
/// the path canonical (`docs/edge.md`, "The normalised path": the edge
/// proxies and caches only canonical paths and redirects the others to
/// theirs), the query as given. `//api/me` → `/api/me`.
///
/// # Errors
/// A path the edge refuses (400), so nothing of it is ever cached.
pub fn canonical_request_uri(uri: &str) -> Result<String, String> {
    let (path, query) = match uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (uri, None),
    };
    let mut out = crate::edge::norm::canonical_path(path).map_err(|e| {
        format!(
            "`{uri}`: {}: the edge refuses it, so nothing of it is cached",
            e.describe()
        )
    })?;
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

/// nginx's `$uri` of a canonical path: every escape decoded.
fn decoded_uri(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or_default());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The nginx variables a key template may use.
const VARIABLES: [&str; 7] = [
    "$scheme",
    "$host",
    "$http_host",
    "$server_name",
    "$request_uri",
    "$uri",
    "$is_args",
];

fn split_template(template: &str) -> Result<Vec<Result<&str, &str>>, String> {
    // Ok(variable) or Err(literal).
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find('$') {
        if i > 0 {
            out.push(Err(&rest[..i]));
        }
        let tail = &rest[i..];
        // Longest known variable at this point ($uri vs $request_uri...).
        let name = tail[1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(tail, |e| &tail[..=e]);
        let var = ["$args"]
            .iter()
            .chain(VARIABLES.iter())
            .find(|v| **v == name)
            .ok_or_else(|| {
                format!("cache key template uses `{name}`, which edgeform cannot compute")
            })?;
        out.push(Ok(*var));
        rest = &tail[var.len()..];
    }
    if !rest.is_empty() {
        out.push(Err(rest));
    }
    Ok(out)
}

/// Check a `proxy_cache_key` template as a node's settings give it: not
/// empty, only variables edgeform can compute, a path (`$uri` or
/// `$request_uri`), without which every path of a host shares one cache
/// entry and no purge can name a path, and no `$scheme` directly followed
/// by another variable: `$scheme$host` makes `http` + `sbank.test` and
/// `https` + `bank.test` one key, so one site's object would be served
/// (and purged) for another; and a host (`$host` or `$http_host`), for
/// the same reason.
///
/// # Errors
/// What is wrong, naming the variable.
pub fn check_template(template: &str) -> Result<(), String> {
    if template.trim().is_empty() {
        return Err("the cache key template is empty".into());
    }
    let parts = split_template(template)?;
    if let Some(w) = parts
        .windows(2)
        .find(|w| matches!(w, [Ok("$scheme"), Ok(_)]))
    {
        let next = w[1].unwrap_or_default();
        return Err(format!(
            "the cache key template has `$scheme` directly followed by `{next}`: `http` + `sbank.test` and `https` + `bank.test` would make one key, so one site's objects would be served for another; put a separator between them, e.g. `$scheme://$host$request_uri`"
        ));
    }
    // `$server_name` is the edge's `_`: every site the same.
    if !parts
        .iter()
        .any(|p| matches!(p, Ok("$host" | "$http_host")))
    {
        return Err(
            "the cache key template has no $host or $http_host: every site would share one key space, one site's objects served (and purged) for another"
                .into(),
        );
    }
    if !parts
        .iter()
        .any(|p| matches!(p, Ok("$uri" | "$request_uri")))
    {
        return Err(
            "the cache key template has no $request_uri or $uri: every path of a host would share one cache entry, and purges could not name a path"
                .into(),
        );
    }
    Ok(())
}

/// The cache key nginx computes for `request` with `template`.
///
/// # Errors
/// A variable edgeform does not know.
pub fn expand_key(template: &str, request: &Request<'_>) -> Result<String, String> {
    let (uri, args) = request
        .request_uri
        .split_once('?')
        .map_or((request.request_uri, ""), |(u, a)| (u, a));
    let mut out = String::new();
    for part in split_template(template)? {
        match part {
            Err(literal) => out.push_str(literal),
            Ok("$scheme") => out.push_str(request.scheme),
            Ok("$host" | "$http_host" | "$server_name") => out.push_str(request.host),
            Ok("$request_uri") => out.push_str(request.request_uri),
            Ok("$uri") => out.push_str(&decoded_uri(uri)),
            Ok("$is_args") => out.push_str(if args.is_empty() { "" } else { "?" }),
            Ok(_) => out.push_str(args), // $args
        }
    }
    Ok(out)
}

/// A regex over the `KEY: <key>` line that matches the keys of every
/// request to one of `hosts` (either scheme) whose request URI matches
/// `uri_regex` (anchored at the URI's start; `.*` suffixes are the
/// caller's business).
///
/// # Errors
/// A variable edgeform does not know.
pub fn key_line_regex(template: &str, hosts: &[&str], uri_regex: &str) -> Result<String, String> {
    let host_alt = hosts
        .iter()
        .map(|h| match h.strip_prefix("*.") {
            Some(rest) => format!("[^/]+\\.{}", regex::escape(rest)),
            None => regex::escape(h),
        })
        .collect::<Vec<_>>()
        .join("|");
    let mut out = String::from("^KEY: ");
    let mut uri_done = false;
    for part in split_template(template)? {
        match part {
            Err(literal) => out.push_str(&regex::escape(literal)),
            Ok("$scheme") => out.push_str("(?:http|https)"),
            Ok("$host" | "$http_host" | "$server_name") => {
                out.push_str("(?:");
                out.push_str(&host_alt);
                out.push(')');
            }
            Ok("$request_uri" | "$uri") if !uri_done => {
                out.push_str("(?:");
                out.push_str(uri_regex);
                out.push(')');
                uri_done = true;
            }
            Ok(_) => out.push_str(".*"),
        }
    }
    if !uri_done {
        return Err(
            "the cache key template has no $request_uri or $uri: a path cannot be matched".into(),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod template_tests {
    use super::*;

    // The announcement carries the result.
    #[test]
    fn announcements_round_trip_and_bare_names_carry_nothing() {
        let m = announcement("edge-1", "2");
        assert_eq!(m, "edge-1\n2");
        assert_eq!(parse_announcement(&m), ("edge-1", Some("2")));
        let failed = announcement("edge-2", "failed: a\nb");
        assert_eq!(
            parse_announcement(&failed),
            ("edge-2", Some("failed: a\nb"))
        );
        assert_eq!(parse_announcement("edge-3"), ("edge-3", None));
        assert_eq!(parse_announcement("edge-4\n"), ("edge-4", Some("")));
    }

    #[test]
    fn templates_are_checked_whole() {
        for good in [
            "$scheme://$host$request_uri",
            "$host$uri$is_args$args",
            "$scheme://$host$uri",
            "$host$request_uri$scheme",
        ] {
            assert_eq!(check_template(good), Ok(()), "{good}");
        }
        for (bad, needle) in [
            ("", "empty"),
            ("  ", "empty"),
            ("$scheme$host$cookie_id$uri", "`$cookie_id`"),
            ("$host$", "`$`"),
            ("${host}$uri", "`$`"),
            ("$scheme://$host", "no $request_uri or $uri"),
            (
                "$scheme$host$request_uri",
                "`$scheme` directly followed by `$host`",
            ),
            (
                "$scheme$http_host$uri",
                "`$scheme` directly followed by `$http_host`",
            ),
            ("$request_uri", "no $host or $http_host"),
            (
                "$scheme://$server_name$request_uri",
                "no $host or $http_host",
            ),
        ] {
            let e = check_template(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn expand() {
        let r = Request {
            scheme: "http",
            host: "example.com",
            request_uri: "/a.mp4?x=1",
        };
        assert_eq!(
            expand_key("$scheme$host$request_uri", &r).unwrap(),
            "httpexample.com/a.mp4?x=1"
        );
        assert_eq!(
            expand_key("$host$uri$is_args$args", &r).unwrap(),
            "example.com/a.mp4?x=1"
        );
        assert_eq!(
            expand_key("$scheme://$host$uri", &r).unwrap(),
            "http://example.com/a.mp4"
        );
        assert!(expand_key("$scheme$cookie_x", &r).is_err());
    }

    #[test]
    fn regex_over_the_key_line() {
        let re = key_line_regex(
            "$scheme://$host$request_uri",
            &["example.com", "www.example.com"],
            "/img/",
        )
        .unwrap();
        let m = matcher(&re).unwrap();
        assert!(m.is_match(b"KEY: http://example.com/img/a.png"));
        assert!(m.is_match(b"KEY: https://www.example.com/img/"));
        assert!(!m.is_match(b"KEY: http://example.com/css/a.css"));
        assert!(!m.is_match(b"KEY: http://notexample.com/img/a.png"));
        assert!(!m.is_match(b"KEY: http://example.com.evil/img/a.png"));
        // Another site whose name ends in this one's, `s` first: not its.
        assert!(!m.is_match(b"KEY: http://sexample.com/img/a.png"));
        let wild =
            key_line_regex("$scheme://$host$request_uri", &["*.cdn.example.io"], "/").unwrap();
        let m = matcher(&wild).unwrap();
        assert!(m.is_match(b"KEY: https://t1.cdn.example.io/x"));
        assert!(!m.is_match(b"KEY: http://cdn.example.io/x"));
        // The seed's job, as grep -P ran it on the KEY line.
        assert!(
            matcher("KEY:.*example\\.com")
                .unwrap()
                .is_match(b"KEY: httpexample.com/a")
        );
        assert!(matcher("(a+)+$").is_ok());
        assert!(matcher("(?=x)").is_err());
        assert!(matcher("(a)\\1").is_err());
    }
}
