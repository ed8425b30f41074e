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
//! Results: the worker writes `{<node>: <files removed>}` into the hash
//! `cdn:purge:done:<id>` (a failed job writes `failed: <reason>`), kept
//! for [`DONE_TTL_SECS`].

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
}

/// What a job asks for, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<'a> {
    Grep(&'a str),
    Keys(Vec<&'a str>),
}

impl Job {
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
}

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
            key: "$scheme$host$request_uri",
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
            Ok("$uri") => out.push_str(uri),
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
            "$scheme$host$request_uri",
            &["example.com", "www.example.com"],
            "/img/",
        )
        .unwrap();
        let m = matcher(&re).unwrap();
        assert!(m.is_match(b"KEY: httpexample.com/img/a.png"));
        assert!(m.is_match(b"KEY: httpswww.example.com/img/"));
        assert!(!m.is_match(b"KEY: httpexample.com/css/a.css"));
        assert!(!m.is_match(b"KEY: httpnotexample.com/img/a.png"));
        assert!(!m.is_match(b"KEY: httpexample.com.evil/img/a.png"));
        let wild = key_line_regex("$scheme$host$request_uri", &["*.cdn.example.io"], "/").unwrap();
        let m = matcher(&wild).unwrap();
        assert!(m.is_match(b"KEY: httpst1.cdn.example.io/x"));
        assert!(!m.is_match(b"KEY: httpcdn.example.io/x"));
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
