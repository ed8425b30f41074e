//! The edge's per-request decision (`docs/edge.md`): a request, the site
//! document found for its host, the suspension flag and the client's
//! country → a [`Decision`] with its reasons. No I/O.
//!
//! The reference edge's `edge/lua/edge_decide.lua` implements the very same
//! rules; `edgeform explain` calls this module. The constants both read
//! (methods, WAF rules, hotlink extensions, rate limits, default TTL, the
//! challenge's, [`reason`]) are generated into the Lua ([`crate::lua`]),
//! both run the shared vectors (`testdata/edge/decide.jsonl`), and a
//! differential test (`compiler/tests/it/edge.rs`) drives generated
//! requests through the real nginx and compares every answer with this
//! one. Change both together.
//!
//! Stateful parts are modelled so that both sides agree deterministically:
//! the rate limit is assumed not exceeded (the decision for a client's
//! first requests), and the challenge cookie — a nonce HMAC'd by the edge
//! plus the proof of work the challenge page computes — is verifiable by
//! anyone holding the edge's secret.

use std::net::IpAddr;

use serde::Serialize;

use crate::lpm::Prefix;
use crate::site::{MAX_ORIGINS, SiteDoc};

pub mod norm;
#[cfg(test)]
mod path_tests;
#[cfg(test)]
mod tests;

/// `X-Edgeform-Reason`: the header every refusal carries.
pub const REASON_HEADER: &str = "X-Edgeform-Reason";
/// The clearance cookie set by the challenge page.
pub const CLEARANCE_COOKIE: &str = "edgeform_clearance";
/// The challenge's proof of work: SHA-1 of the clearance cookie's value
/// must start with this many zero bits (2^16 = 65,536 hashes expected).
pub const CHALLENGE_BITS: u32 = 16;
/// Longest expiry (decimal digits) and work counter a clearance may carry.
pub const MAX_EXPIRY_DIGITS: usize = 12;
pub const MAX_COUNTER_DIGITS: usize = 16;
/// Methods the WAF accepts.
pub const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
/// WAF rules: name and the substrings that trigger it, in order.
pub const WAF_RULES: [(&str, &[&str]); 3] = [
    ("traversal", &["../", "..\\", "/etc/passwd"]),
    (
        "sqli",
        &[
            "union select",
            "' or '1'='1",
            " or 1=1",
            "sleep(",
            "information_schema",
            ";--",
        ],
    ),
    ("xss", &["<script", "javascript:", "onerror=", "onload="]),
];
/// Extensions hotlink protection applies to.
pub const HOTLINK_EXTENSIONS: [&str; 24] = [
    ".jpg", ".jpeg", ".png", ".gif", ".webp", ".avif", ".svg", ".ico", ".mp4", ".webm", ".m4v",
    ".mov", ".m3u8", ".ts", ".m4s", ".mpd", ".mp3", ".m4a", ".aac", ".ogg", ".woff", ".woff2",
    ".pdf", ".zip",
];
/// The WAF's rule for a method outside [`METHODS`] (first in the list of
/// matches, as `X-Edgeform-Waf` names it).
pub const WAF_BAD_METHOD: &str = "bad-method";
/// The statuses an edge rule may redirect with.
pub const REDIRECT_STATUSES: [u16; 4] = [301, 302, 307, 308];
/// `rate_mode` limits: (requests per second, burst).
pub const RATE_NORMAL: (u32, u32) = (20, 40);
pub const RATE_STRICT: (u32, u32) = (5, 10);
/// Default cache time of a response the origin gives no freshness for.
pub const DEFAULT_TTL_SECS: u32 = 600;
/// The request body (`Content-Length`, bytes) a site without
/// `max_body_size` accepts: 100m.
pub const DEFAULT_MAX_BODY_SIZE: u64 = 100 * 1024 * 1024;
/// The edge-wide ceiling of `max_body_size`: 1g, nginx's
/// `client_max_body_size` on the edge (a larger body is refused by nginx
/// before the edge's Lua). A document above it is bad.
pub const MAX_BODY_SIZE_CEILING: u64 = 1024 * 1024 * 1024;
/// The largest `Content-Length` nginx reads (its `off_t`); a longer or
/// non-numeric one is its own 400.
const NGINX_MAX_CONTENT_LENGTH: u64 = i64::MAX as u64;

/// Declares the reason constants and [`reason::ALL`], the list the edge's
/// Lua tables are generated from.
macro_rules! reasons {
    ($($(#[doc = $doc:literal])* $name:ident = $value:literal;)*) => {
        $($(#[doc = $doc])* pub const $name: &str = $value;)*
        /// Every reason, by constant name: what `edge_tables.lua` holds.
        pub const ALL: &[(&str, &str)] = &[$((stringify!($name), $name)),*];
    };
}

/// The machine-readable reasons (`X-Edgeform-Reason`) the edge answers
/// with (docs/edge.md, "Evaluation order").
pub mod reason {
    reasons! {
        /// nginx refuses the request before the edge's Lua runs.
        BAD_REQUEST = "bad-request";
        /// The path cannot be normalised.
        BAD_PATH = "bad-path";
        /// A 308 to the path's normalised form.
        NON_CANONICAL_PATH = "non-canonical-path";
        /// No document for the host or its wildcard.
        UNKNOWN_HOST = "unknown-host";
        /// The document does not parse or check.
        BAD_DOCUMENT = "bad-document";
        SUSPENDED = "suspended";
        IP_NOT_ALLOWED = "ip-not-allowed";
        IP_BLOCKED = "ip-blocked";
        GEO_NOT_ALLOWED = "geo-not-allowed";
        GEO_BLOCKED = "geo-blocked";
        WAF_BAD_METHOD = "waf-bad-method";
        WAF_TRAVERSAL = "waf-traversal";
        WAF_SQLI = "waf-sqli";
        WAF_XSS = "waf-xss";
        HOTLINK = "hotlink";
        CORS_ORIGIN = "cors-origin";
        CORS_PREFLIGHT = "cors-preflight";
        CHALLENGE = "challenge";
        EDGE_RULE = "edge-rule";
        /// An `http` request to a site with `https_redirect`: 301 to https.
        HTTPS_REDIRECT = "https-redirect";
        /// An `https` request whose `Host` is not the connection's SNI
        /// (a reused HTTP/2 connection): 421.
        MISDIRECTED_REQUEST = "misdirected-request";
        /// `Content-Length` above the site's `max_body_size` (or the
        /// default): 413.
        BODY_TOO_LARGE = "body-too-large";
        /// The edge's rate limiter (stateful: never a decision of this
        /// module, which assumes a client's first requests).
        RATE_LIMITED = "rate-limited";
        /// No document in Redis and the control plane's read API is
        /// unreachable (the edge's I/O, not this module).
        CONTROL_PLANE_UNREACHABLE = "control-plane-unreachable";
        /// An ACME HTTP-01 challenge answered from `acme:<token>`, before
        /// any site rule.
        ACME_CHALLENGE = "acme-challenge";
        /// A challenge path whose token is not a token (alphabet, length):
        /// 404 without reading Redis.
        ACME_BAD_TOKEN = "acme-bad-token";
        /// No `acme:<token>` in the edge's Redis (the edge's I/O): 404.
        ACME_UNKNOWN_TOKEN = "acme-unknown-token";
        /// The edge's Redis is unreachable for a challenge (the edge's
        /// I/O): 503.
        ACME_REDIS_UNREACHABLE = "acme-redis-unreachable";
    }

    /// The reason of a strict WAF's refusal for its first matching rule.
    #[must_use]
    pub fn waf(rule: &str) -> &'static str {
        match rule {
            super::WAF_BAD_METHOD => WAF_BAD_METHOD,
            "traversal" => WAF_TRAVERSAL,
            "sqli" => WAF_SQLI,
            _ => WAF_XSS,
        }
    }
}

/// The outcome class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Proxy,
    Redirect,
    Blocked,
    Challenged,
    NotFound,
    Suspended,
    Preflight,
    Error,
    /// An ACME HTTP-01 challenge: the edge answers it from its Redis
    /// (`acme:<token>`), before any site rule.
    AcmeChallenge,
}

/// Caching of a proxied response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cache {
    /// Read from and written to the cache.
    pub cached: bool,
    /// Seconds, when a `ttl` rule fixes it; `None`: the origin's
    /// freshness, else [`DEFAULT_TTL_SECS`].
    pub ttl: Option<u32>,
}

/// What the edge does with one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub status: u16,
    pub location: Option<String>,
    pub cache: Cache,
    /// The proxy target (for `proxy`).
    pub origin: Option<String>,
    /// The `Host` header sent to the origin (for `proxy`).
    pub origin_host: Option<String>,
    /// The origins tried after `origin` when it fails, in order (for
    /// `proxy`; empty: the site has one origin). `explain` shows the
    /// whole order as its `origins`.
    #[serde(skip)]
    pub fallback_origins: Vec<String>,
    /// The machine-readable reason (`X-Edgeform-Reason`) of a refusal.
    pub reason: Option<&'static str>,
    /// WAF rules matched (detect mode: sent as `X-Edgeform-Waf`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waf: Vec<&'static str>,
    /// The key the document was found under (`site:<this>`).
    pub site: Option<String>,
    /// Every step, in order, in words.
    pub reasons: Vec<String>,
}

/// Why a document is unusable (the edge answers 502 `bad-document`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocErrorKind {
    /// Not JSON, a missing or unknown field, a wrong type.
    Shape,
    /// An unknown value of a mode, match type or action.
    Mode,
    /// A country code, CIDR, TTL, status or regex that does not parse.
    Value,
}

/// A bad document, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocError {
    pub kind: DocErrorKind,
    pub message: String,
}

impl std::fmt::Display for DocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Allow,
    Block,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Off,
    Normal,
    Strict,
}

#[derive(Debug, Clone)]
enum Matcher {
    Exact(String),
    Prefix(String),
    Ext(String),
    /// Bytes, ASCII classes and case folding: the dialect the edge's PCRE
    /// reads alike (docs/configuration.md, "Rule regexes").
    Regex(regex::bytes::Regex),
}

impl Matcher {
    fn matches(&self, path: &str) -> bool {
        match self {
            Matcher::Exact(v) => path == v,
            Matcher::Prefix(v) => path.starts_with(v.as_str()),
            Matcher::Ext(v) => {
                let name = norm::ext_subject(path);
                name.len() >= v.len()
                    && name.as_bytes()[name.len() - v.len()..].eq_ignore_ascii_case(v.as_bytes())
            }
            Matcher::Regex(r) => r.is_match(path.as_bytes()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Matcher::Exact(v) => format!("exact `{v}`"),
            Matcher::Prefix(v) => format!("prefix `{v}`"),
            Matcher::Ext(v) => format!("ext `{v}`"),
            Matcher::Regex(r) => format!("regex `{}`", r.as_str()),
        }
    }
}

#[derive(Debug, Clone)]
enum CacheAction {
    Ttl(u32),
    Bypass,
}

#[derive(Debug, Clone)]
enum EdgeAction {
    Redirect { status: u16, to: Option<String> },
    Block,
}

/// A site document, checked and prepared for deciding (regexes compiled,
/// networks parsed) — what the edge's Lua caches per worker.
#[derive(Debug, Clone)]
pub struct Site {
    origin: String,
    /// `fallback_origins`: each an origin of `origin`'s scheme.
    fallbacks: Vec<String>,
    origin_host_is_ip: bool,
    origin_authority: String,
    cached: bool,
    geo: Mode,
    geo_codes: Vec<String>,
    ip: Mode,
    ip_list: Vec<Prefix>,
    rate: Level,
    waf: Level,
    cors: Level,
    hotlink: bool,
    https_redirect: bool,
    /// The site's `max_body_size`, else [`DEFAULT_MAX_BODY_SIZE`].
    max_body: u64,
    cache_rules: Vec<(Matcher, CacheAction)>,
    edge_rules: Vec<(Matcher, EdgeAction)>,
}

fn bad(kind: DocErrorKind, message: String) -> DocError {
    DocError { kind, message }
}

fn mode(field: &str, v: &str) -> Result<Mode, DocError> {
    match v {
        "off" => Ok(Mode::Off),
        "allow" => Ok(Mode::Allow),
        "block" => Ok(Mode::Block),
        _ => Err(bad(
            DocErrorKind::Mode,
            format!("{field}: unknown mode `{v}`"),
        )),
    }
}

fn level(field: &str, v: &str, middle: &str) -> Result<Level, DocError> {
    match v {
        "off" => Ok(Level::Off),
        "strict" => Ok(Level::Strict),
        _ if v == middle => Ok(Level::Normal),
        _ => Err(bad(
            DocErrorKind::Mode,
            format!("{field}: unknown mode `{v}`"),
        )),
    }
}

/// A `\x{…}` escape above 0xFF: Rust's bytes regex reads it as UTF-8,
/// the edge's PCRE refuses to compile it (the document is bad there).
fn wide_hex_escape(pattern: &str) -> bool {
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            continue;
        }
        if chars.next() != Some('x') {
            continue;
        }
        let rest = chars.as_str();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            let digits = inner.0.trim();
            if !u32::from_str_radix(digits, 16).is_ok_and(|v| v <= 0xFF) {
                return true;
            }
        }
    }
    false
}

fn matcher(field: &str, kind: &str, value: &str) -> Result<Matcher, DocError> {
    Ok(match kind {
        "exact" => Matcher::Exact(value.to_owned()),
        "prefix" => Matcher::Prefix(value.to_owned()),
        "ext" => Matcher::Ext(value.to_owned()),
        "regex" if wide_hex_escape(value) => {
            return Err(bad(
                DocErrorKind::Value,
                format!(
                    "{field}: bad regex `{value}`: a `\\x{{…}}` escape above `\\xFF`, which \
                     the edge's PCRE (bytes, no UTF mode) cannot compile"
                ),
            ));
        }
        "regex" => Matcher::Regex(
            regex::bytes::RegexBuilder::new(value)
                .unicode(false)
                .build()
                .map_err(|e| {
                    bad(
                        DocErrorKind::Value,
                        format!("{field}: bad regex `{value}`: {e}"),
                    )
                })?,
        ),
        _ => {
            return Err(bad(
                DocErrorKind::Mode,
                format!("{field}: unknown match_type `{kind}`"),
            ));
        }
    })
}

fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty())
}

fn parse_net(s: &str) -> Option<Prefix> {
    if s.contains('/') {
        s.parse().ok()
    } else {
        let ip: IpAddr = s.parse().ok()?;
        let len = if ip.is_ipv4() { 32 } else { 128 };
        Prefix::new(ip, len).ok()
    }
}

/// `scheme://host[:port]`, nothing after → (authority, host, explicit
/// non-default port). A path, query or fragment is refused: nginx's
/// `proxy_pass` would send it in place of every request's path (a hostile
/// Redis's document).
fn split_origin(origin: &str) -> Option<(String, bool)> {
    let (scheme, rest) = origin.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.len() != rest.len() {
        return None;
    }
    let (host, port) = split_host_port(authority);
    let default = if scheme == "http" { "80" } else { "443" };
    let host_is_ip = host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok();
    let header = match port {
        Some(p) if p != default => format!("{host}:{p}"),
        _ => host.to_owned(),
    };
    Some((header, host_is_ip))
}

/// `host[:port]` / `[v6][:port]` → (host, port).
fn split_host_port(authority: &str) -> (&str, Option<&str>) {
    if authority.starts_with('[') {
        match authority.find(']') {
            Some(i) => {
                let port = authority[i + 1..].strip_prefix(':');
                (&authority[..=i], port)
            }
            None => (authority, None),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    }
}

/// `fallback_origins`: at most [`MAX_ORIGINS`] origins in all, each an
/// http(s) origin of `origin`'s scheme (the edge proxies one request with
/// one scheme, whichever origin answers).
fn check_fallbacks(origin: &str, list: &[String]) -> Result<Vec<String>, DocError> {
    if list.len() >= MAX_ORIGINS {
        return Err(bad(
            DocErrorKind::Value,
            format!(
                "fallback_origins: {} origins in all, the edge tries at most {MAX_ORIGINS}",
                list.len() + 1
            ),
        ));
    }
    let scheme = origin.split_once("://").map(|(s, _)| s);
    for (i, o) in list.iter().enumerate() {
        if split_origin(o).is_none() {
            return Err(bad(
                DocErrorKind::Value,
                format!("fallback_origins[{i}]: `{o}` is not an http(s) origin"),
            ));
        }
        if o.split_once("://").map(|(s, _)| s) != scheme {
            return Err(bad(
                DocErrorKind::Value,
                format!("fallback_origins[{i}]: `{o}` is not of the scheme of origin"),
            ));
        }
    }
    Ok(list.to_vec())
}

/// A document with unknown fields it lists in `skippable`, read without
/// them (docs/operations.md, "Version skew"; as the edge's Lua); `None`
/// when it still does not read (another unknown field, a bad list).
fn skip_listed(json: &str) -> Option<SiteDoc> {
    let mut v: serde_json::Value = serde_json::from_str(json).ok()?;
    let obj = v.as_object_mut()?;
    let known: Vec<&str> = crate::site::all_site_fields().iter().map(|f| f.0).collect();
    let listed: Vec<String> = match obj.get(crate::site::SKIPPABLE_FIELD)? {
        serde_json::Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<_>>()?,
        _ => return None,
    };
    for name in &listed {
        if !known.contains(&name.as_str()) {
            obj.remove(name);
        }
    }
    serde_json::from_value(v).ok()
}

impl Site {
    /// The country codes of the site's `geo_mode` policy (empty when off).
    #[must_use]
    pub fn geo_codes(&self) -> &[String] {
        if self.geo == Mode::Off {
            &[]
        } else {
            &self.geo_codes
        }
    }

    /// Parse and check a `site:` value.
    ///
    /// # Errors
    /// What the edge answers `bad-document` for.
    pub fn parse(json: &str) -> Result<Site, DocError> {
        let doc: SiteDoc = match serde_json::from_str(json) {
            Ok(doc) => doc,
            Err(e) => skip_listed(json)
                .ok_or_else(|| bad(DocErrorKind::Shape, format!("not a site document: {e}")))?,
        };
        Site::from_doc(&doc)
    }

    /// Check and prepare a typed document.
    ///
    /// # Errors
    /// Unknown modes, bad values.
    pub fn from_doc(doc: &SiteDoc) -> Result<Site, DocError> {
        let (origin_authority, origin_host_is_ip) = split_origin(&doc.origin).ok_or_else(|| {
            bad(
                DocErrorKind::Value,
                format!("origin: `{}` is not an http(s) origin", doc.origin),
            )
        })?;
        let fallbacks = check_fallbacks(&doc.origin, &doc.fallback_origins)?;
        let geo = mode("geo_mode", &doc.geo_mode)?;
        let geo_codes = split_list(&doc.geo_codes)
            .map(|c| {
                if c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase()) {
                    Ok(c.to_owned())
                } else {
                    Err(bad(
                        DocErrorKind::Value,
                        format!("geo_codes: `{c}` is not a country code"),
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ip = mode("ip_mode", &doc.ip_mode)?;
        let ip_list = split_list(&doc.ip_list)
            .map(|n| {
                parse_net(n).ok_or_else(|| {
                    bad(
                        DocErrorKind::Value,
                        format!("ip_list: `{n}` is not a network"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rate = level("rate_mode", &doc.rate_mode, "normal")?;
        let waf = level("waf_mode", &doc.waf_mode, "detect")?;
        let cors = level("cors_mode", &doc.cors_mode, "permissive")?;
        let hotlink = match &*doc.hotlink_mode {
            "off" => false,
            "block" => true,
            m => {
                return Err(bad(
                    DocErrorKind::Mode,
                    format!("hotlink_mode: unknown mode `{m}`"),
                ));
            }
        };
        let max_body = doc.max_body_size.unwrap_or(DEFAULT_MAX_BODY_SIZE);
        if max_body > MAX_BODY_SIZE_CEILING {
            return Err(bad(
                DocErrorKind::Value,
                format!(
                    "max_body_size: {max_body} is above the edge's ceiling \
                     {MAX_BODY_SIZE_CEILING} (1g)"
                ),
            ));
        }
        let mut cache_rules = Vec::new();
        for (i, r) in doc.cache_rules.iter().enumerate() {
            let field = format!("cache_rules[{i}]");
            let m = matcher(&field, &r.match_type, &r.match_value)?;
            let a = match (&*r.action, r.ttl) {
                ("ttl", Some(t)) if t >= 1 => CacheAction::Ttl(t),
                ("bypass", _) => CacheAction::Bypass,
                ("ttl", _) => {
                    return Err(bad(
                        DocErrorKind::Value,
                        format!("{field}: action ttl needs a ttl >= 1"),
                    ));
                }
                (a, _) => {
                    return Err(bad(
                        DocErrorKind::Mode,
                        format!("{field}: unknown action `{a}`"),
                    ));
                }
            };
            cache_rules.push((m, a));
        }
        let mut edge_rules = Vec::new();
        for (i, r) in doc.edge_rules.iter().enumerate() {
            let field = format!("edge_rules[{i}]");
            let m = matcher(&field, &r.match_type, &r.match_value)?;
            let a = match (&*r.action, r.redirect_status) {
                ("redirect", Some(s)) if REDIRECT_STATUSES.contains(&s) => EdgeAction::Redirect {
                    status: s,
                    to: r.redirect_to.clone(),
                },
                ("block", _) => EdgeAction::Block,
                ("redirect", _) => {
                    return Err(bad(
                        DocErrorKind::Value,
                        format!("{field}: redirect needs redirect_status 301, 302, 307 or 308"),
                    ));
                }
                (a, _) => {
                    return Err(bad(
                        DocErrorKind::Mode,
                        format!("{field}: unknown action `{a}`"),
                    ));
                }
            };
            edge_rules.push((m, a));
        }
        Ok(Site {
            origin: doc.origin.clone(),
            fallbacks,
            origin_host_is_ip,
            origin_authority,
            cached: doc.cached,
            geo,
            geo_codes,
            ip,
            ip_list,
            rate,
            waf,
            cors,
            hotlink,
            https_redirect: doc.https_redirect,
            max_body,
            cache_rules,
            edge_rules,
        })
    }
}

/// How the request reached the edge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    #[default]
    Http,
    Https,
}

impl Scheme {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// `http` or `https`.
    #[must_use]
    pub fn parse(text: &str) -> Option<Scheme> {
        match text {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }
}

/// One request as the edge sees it, after the client IP (docs/edge.md, see
/// [`crate::route::Router::client_ip`]) and its country are known.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    pub method: &'a str,
    /// `https` for a request on a TLS listener.
    pub scheme: Scheme,
    /// The TLS ClientHello's server name (`https` only; `None` or empty:
    /// none sent).
    pub sni: Option<&'a str>,
    /// The `Content-Length` header as sent.
    pub content_length: Option<&'a str>,
    /// The `Host` header (any case, with or without port).
    pub host: &'a str,
    /// The request URI as sent: path and optional `?query`.
    pub uri: &'a str,
    pub client_ip: Option<IpAddr>,
    /// ISO 3166-1 alpha-2 of the client IP, when the database knows it.
    pub country: Option<&'a str>,
    pub referer: Option<&'a str>,
    pub origin: Option<&'a str>,
    /// `Access-Control-Request-Method`.
    pub acr_method: Option<&'a str>,
    pub cookie: Option<&'a str>,
    /// The `Authorization` header: a response to it is never cached.
    pub authorization: Option<&'a str>,
}

/// What verifies challenge cookies.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clearance<'a> {
    /// The edge's challenge secret; `None`: no cookie is valid.
    pub secret: Option<&'a [u8]>,
    /// Unix time, seconds.
    pub now: u64,
}

/// The host the edge looks up: nginx's `$host` ([`norm::nginx_host`]:
/// lower-case, port and one trailing dot removed); a `Host` nginx refuses
/// as it is, lower-cased (the decision answers 400 for it).
#[must_use]
pub fn normalize_host(host: &str) -> String {
    norm::nginx_host(host).unwrap_or_else(|| host.to_ascii_lowercase())
}

/// A `Content-Length` as nginx reads it: decimal digits only, at most its
/// `off_t`; `None`: nginx refuses the request (400).
fn nginx_content_length(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = text.trim_start_matches('0');
    if digits.len() > 19 {
        return None;
    }
    let n: u64 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    (n <= NGINX_MAX_CONTENT_LENGTH).then_some(n)
}

/// Whether an `https` request's Host is not its connection's SNI
/// (compared as the edge reads both: [`crate::tls::normalize_sni`] and
/// nginx's `$host`). No SNI, or an empty one: never misdirected.
#[must_use]
pub fn misdirected(scheme: Scheme, sni: Option<&str>, host: &str) -> bool {
    let Some(sni) = sni.filter(|s| !s.is_empty()) else {
        return false;
    };
    if scheme != Scheme::Https {
        return false;
    }
    let sni = sni.strip_suffix('.').unwrap_or(sni);
    !sni.eq_ignore_ascii_case(host)
}

/// The keys' hosts to try, in order: the host, then its wildcard.
#[must_use]
pub fn lookup_hosts(host: &str) -> Vec<String> {
    let mut v = vec![host.to_owned()];
    if let Some((_, rest)) = host.split_once('.')
        && !rest.is_empty()
    {
        v.push(format!("*.{rest}"));
    }
    v
}

/// HMAC-SHA1 (RFC 2104), what nginx's `ngx.hmac_sha1` computes.
#[must_use]
pub fn hmac_sha1(key: &[u8], msg: &[u8]) -> [u8; 20] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..20].copy_from_slice(&sha1_smol::Sha1::from(key).digest().bytes());
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = sha1_smol::Sha1::new();
    inner.update(&k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = sha1_smol::Sha1::new();
    outer.update(&k.map(|b| b ^ 0x5c));
    outer.update(&inner.digest().bytes());
    outer.digest().bytes()
}

/// The challenge page's nonce for a client of a site, valid until
/// `expiry`: `<expiry>.<hmac>`, the HMAC-SHA1 (lower-case hex) covering
/// `<site>|<hex of the address's bytes>|<expiry>` (bytes, not text, so
/// that no two spellings of one IPv6 address differ).
#[must_use]
pub fn challenge_nonce(secret: &[u8], site: &str, client: IpAddr, expiry: u64) -> String {
    let client = match client {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    };
    let octets = match client {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let ip: String = octets.iter().map(|b| format!("{b:02x}")).collect();
    let mac = hmac_sha1(secret, format!("{site}|{ip}|{expiry}").as_bytes());
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("{expiry}.{hex}")
}

/// Whether a SHA-1 digest starts with `bits` zero bits.
fn leading_zeros(digest: &[u8; 20], bits: u32) -> bool {
    let mut left = bits;
    for &b in digest {
        if left == 0 {
            return true;
        }
        if left >= 8 {
            if b != 0 {
                return false;
            }
            left -= 8;
        } else {
            return b >> (8 - left) == 0;
        }
    }
    left == 0
}

/// The proof of work the challenge page's script computes: the first
/// counter `n` (0, 1, 2, …) for which SHA-1 of `<nonce>.<n>` starts with
/// [`CHALLENGE_BITS`] zero bits; returns the cookie value `<nonce>.<n>`.
#[must_use]
pub fn solve_challenge(nonce: &str) -> String {
    let mut prefix = sha1_smol::Sha1::new();
    prefix.update(nonce.as_bytes());
    prefix.update(b".");
    let mut n: u64 = 0;
    loop {
        let mut h = prefix.clone();
        h.update(n.to_string().as_bytes());
        if leading_zeros(&h.digest().bytes(), CHALLENGE_BITS) {
            return format!("{nonce}.{n}");
        }
        n += 1;
    }
}

/// A solved clearance cookie value for a client of a site, valid until
/// `expiry` (what a browser sends back after running the challenge page).
#[must_use]
pub fn clearance_token(secret: &[u8], site: &str, client: IpAddr, expiry: u64) -> String {
    solve_challenge(&challenge_nonce(secret, site, client, expiry))
}

/// Whether a clearance cookie's value is valid for `client` on `site` at
/// `now` (docs/edge.md, "Challenged"): `<expiry>.<hmac>.<n>` with `expiry`
/// 1–12 decimal digits written as the edge writes it and later than
/// `now`, `<expiry>.<hmac>` the nonce the edge issues for this site and
/// client, `n` 1–16 decimal digits, and SHA-1 of the whole value starting
/// with [`CHALLENGE_BITS`] zero bits.
#[must_use]
pub fn clearance_valid(secret: &[u8], site: &str, client: IpAddr, now: u64, value: &str) -> bool {
    let mut parts = value.split('.');
    let (Some(exp), Some(_), Some(n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let digits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(exp, MAX_EXPIRY_DIGITS) || !digits(n, MAX_COUNTER_DIGITS) {
        return false;
    }
    let Ok(expiry) = exp.parse::<u64>() else {
        return false;
    };
    let nonce = &value[..value.len() - n.len() - 1];
    expiry > now
        && challenge_nonce(secret, site, client, expiry) == nonce
        && leading_zeros(
            &sha1_smol::Sha1::from(value.as_bytes()).digest().bytes(),
            CHALLENGE_BITS,
        )
}

/// A cookie's value from the `Cookie` header, as the Lua reads it: each
/// `;`-separated part trimmed of ASCII whitespace (Lua's `%s`: space, tab,
/// CR, LF, VT, FF) — not Unicode whitespace, which stays part of the value.
fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|part| {
        let part = part.trim_matches(|c| matches!(c, ' ' | '\t' | '\r' | '\n' | '\x0b' | '\x0c'));
        let (k, v) = part.split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The host of an `Origin` or `Referer` value, lower-case.
fn url_host(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let host = split_host_port(authority).0.to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
}

fn same_site(a: &str, b: &str) -> bool {
    a == b || a.ends_with(&format!(".{b}")) || b.ends_with(&format!(".{a}"))
}

/// WAF rules the request matches, in the table's order.
#[must_use]
pub fn waf_matches(method: &str, uri: &str) -> Vec<&'static str> {
    let mut hits = Vec::new();
    if !METHODS.contains(&method) {
        hits.push(WAF_BAD_METHOD);
    }
    let text = norm::waf_text(uri);
    for (name, needles) in WAF_RULES {
        if needles.iter().any(|n| {
            let n = norm::waf_fold(n.as_bytes());
            text.windows(n.len()).any(|w| w == n)
        }) {
            hits.push(name);
        }
    }
    hits
}

fn base(verdict: Verdict, status: u16) -> Decision {
    Decision {
        verdict,
        status,
        location: None,
        cache: Cache {
            cached: false,
            ttl: None,
        },
        origin: None,
        origin_host: None,
        fallback_origins: Vec::new(),
        reason: None,
        waf: Vec::new(),
        site: None,
        reasons: Vec::new(),
    }
}

fn refuse(mut d: Decision, verdict: Verdict, status: u16, reason: &'static str) -> Decision {
    d.verdict = verdict;
    d.status = status;
    d.reason = Some(reason);
    d
}

/// The `Location` of a prefix redirect: `rest` (the path after the
/// prefix) appended to `target` so that it stays in the target's path:
/// one `/` where both have one, a `/` inserted after an authority with no
/// path (`https://shop.example` + `@evil.example` →
/// `https://shop.example/@evil.example`), a run of `/` at the start of
/// `rest` read as one (never `//evil.example` after a target `/`).
#[must_use]
pub fn join_redirect(target: &str, rest: &str) -> String {
    let mut out = target.to_owned();
    if rest.is_empty() {
        return out;
    }
    let slashes = rest.len() - rest.trim_start_matches('/').len();
    let rest = &rest[slashes.saturating_sub(1)..];
    let authority_only = target.split_once("://").is_some_and(|(scheme, after)| {
        !scheme.is_empty()
            && scheme
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'.' | b'-'))
            && !after.contains(['/', '?', '#'])
    });
    if out.ends_with('/') && rest.starts_with('/') {
        out.push_str(&rest[1..]);
    } else {
        if authority_only && !rest.starts_with('/') {
            out.push('/');
        }
        out.push_str(rest);
    }
    out
}

/// The path of ACME HTTP-01 challenges (RFC 8555 §8.3), answered on the
/// plain-HTTP listeners only.
pub const ACME_CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";
/// The shortest and longest token the edge looks up (RFC 8555 asks for
/// at least 128 bits of entropy: 22 base64url characters; CAs send 43).
pub const ACME_TOKEN_MIN: usize = 8;
pub const ACME_TOKEN_MAX: usize = 128;

/// What a request is for the challenge answer (docs/edge.md, "ACME
/// challenges").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acme {
    /// A challenge for this token: the edge reads `acme:<token>`.
    Token(String),
    /// The challenge path with no valid token: 404, Redis not read.
    BadToken,
}

/// Whether `token` is one the edge looks up: base64url alphabet (no
/// padding), [`ACME_TOKEN_MIN`]..=[`ACME_TOKEN_MAX`] characters.
#[must_use]
pub fn acme_token_valid(token: &str) -> bool {
    (ACME_TOKEN_MIN..=ACME_TOKEN_MAX).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The challenge a request asks for: `GET`/`HEAD` on `http` whose
/// matched path ([`norm::match_path`] of the canonical path) starts with
/// [`ACME_CHALLENGE_PREFIX`]; `None`: not a challenge (site rules apply).
#[must_use]
pub fn acme_challenge(method: &str, scheme: Scheme, canonical_path: &str) -> Option<Acme> {
    if scheme != Scheme::Http || !matches!(method, "GET" | "HEAD") {
        return None;
    }
    let path = norm::match_path(canonical_path);
    let token = path.strip_prefix(ACME_CHALLENGE_PREFIX)?;
    Some(if acme_token_valid(token) {
        Acme::Token(token.to_owned())
    } else {
        Acme::BadToken
    })
}

/// What the document lookup found for the request's host.
#[derive(Debug, Clone, Copy)]
pub enum Found<'a> {
    /// No `site:` key for the host or its wildcard.
    None,
    /// The document under `site:<key>` does not parse or check.
    Bad { key: &'a str, error: &'a DocError },
    /// The document under `site:<key>`, and whether `suspended:<key>` is set.
    Site {
        key: &'a str,
        site: &'a Site,
        suspended: bool,
    },
}

/// The decision (`docs/edge.md`, "Evaluation order").
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn decide(req: &Request<'_>, found: Found<'_>, clearance: Clearance<'_>) -> Decision {
    let mut d = base(Verdict::Proxy, 200);
    let (path, query) = match req.uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (req.uri, None),
    };
    // 0. What nginx refuses before the edge's Lua, then the path's form.
    if !norm::nginx_method(req.method) {
        d.reasons.push(format!(
            "nginx refuses the method `{}` (400, before the edge's Lua)",
            req.method
        ));
        return refuse(d, Verdict::Blocked, 400, reason::BAD_REQUEST);
    }
    let canonical = norm::canonical_path(path);
    if let Err(e) = canonical
        && e.refused_by_nginx()
    {
        d.reasons.push(format!(
            "nginx refuses the request: {} (400, before the edge's Lua)",
            e.describe()
        ));
        return refuse(d, Verdict::Blocked, 400, reason::BAD_REQUEST);
    }
    let Some(host) = norm::nginx_host(req.host) else {
        d.reasons.push(format!(
            "nginx refuses the Host `{}` (400, before the edge's Lua)",
            req.host
        ));
        return refuse(d, Verdict::Blocked, 400, reason::BAD_REQUEST);
    };
    let content_length = match req.content_length {
        None => None,
        Some(text) => {
            let Some(n) = nginx_content_length(text) else {
                d.reasons.push(format!(
                    "nginx refuses the Content-Length `{}` (400, before the edge's Lua)",
                    crate::untrusted::escape(text)
                ));
                return refuse(d, Verdict::Blocked, 400, reason::BAD_REQUEST);
            };
            if n > MAX_BODY_SIZE_CEILING {
                d.reasons.push(format!(
                    "Content-Length {n} is above the edge's ceiling {MAX_BODY_SIZE_CEILING} \
                     (1g): nginx refuses it (413, before the edge's Lua)"
                ));
                return refuse(d, Verdict::Blocked, 413, reason::BODY_TOO_LARGE);
            }
            Some(n)
        }
    };
    match canonical {
        Err(e) => {
            d.reasons.push(format!("{}: refused", e.describe()));
            return refuse(d, Verdict::Blocked, 400, reason::BAD_PATH);
        }
        Ok(canonical) if canonical != path => {
            let mut target = canonical;
            if let Some(q) = query {
                target.push('?');
                target.push_str(q);
            }
            d.reasons.push(format!(
                "the path is not in its normalised form: 308 to {target}"
            ));
            d.verdict = Verdict::Redirect;
            d.status = 308;
            d.reason = Some(reason::NON_CANONICAL_PATH);
            d.location = Some(target);
            return d;
        }
        Ok(_) => {}
    }
    // 0b. ACME challenges: before the document and every site rule.
    match acme_challenge(req.method, req.scheme, path) {
        None => {}
        Some(Acme::Token(token)) => {
            d.reasons.push(format!(
                "ACME HTTP-01 challenge: the edge answers it from its Redis key acme:{token} \
                 (200, the key authorization, application/octet-stream; 404 {} when absent, \
                 503 {} when Redis is unreachable), before any site rule",
                reason::ACME_UNKNOWN_TOKEN,
                reason::ACME_REDIS_UNREACHABLE
            ));
            d.verdict = Verdict::AcmeChallenge;
            d.reason = Some(reason::ACME_CHALLENGE);
            return d;
        }
        Some(Acme::BadToken) => {
            d.reasons.push(format!(
                "ACME challenge path with no valid token (base64url, {ACME_TOKEN_MIN} to \
                 {ACME_TOKEN_MAX} characters): 404, Redis not read"
            ));
            return refuse(d, Verdict::NotFound, 404, reason::ACME_BAD_TOKEN);
        }
    }
    let (key, site, suspended) = match found {
        Found::None => {
            d.reasons.push(format!("no document for `{host}`"));
            return refuse(d, Verdict::NotFound, 404, reason::UNKNOWN_HOST);
        }
        Found::Bad { key, error } => {
            d.site = Some(key.to_owned());
            d.reasons
                .push(format!("document site:{key} is invalid: {error}"));
            return refuse(d, Verdict::Error, 502, reason::BAD_DOCUMENT);
        }
        Found::Site {
            key,
            site,
            suspended,
        } => (key, site, suspended),
    };
    d.site = Some(key.to_owned());
    d.reasons.push(format!("document site:{key}"));
    // Every path rule reads the path without its segments' parameters.
    let matched = norm::match_path(path);
    let path: &str = &matched;
    // 3a. A request on a connection made for another name.
    if misdirected(req.scheme, req.sni, &host) {
        d.reasons.push(format!(
            "https: Host `{host}` is not the connection's SNI `{}`: misdirected (421)",
            crate::untrusted::escape(req.sni.unwrap_or_default())
        ));
        return refuse(d, Verdict::Blocked, 421, reason::MISDIRECTED_REQUEST);
    }
    if suspended {
        d.reasons.push(format!("suspended:{key} is set"));
        return refuse(d, Verdict::Suspended, 503, reason::SUSPENDED);
    }
    // 3b. HTTP to a site that wants HTTPS.
    if site.https_redirect && req.scheme == Scheme::Http {
        let target = format!("https://{host}{}", req.uri);
        d.reasons.push(format!(
            "https_redirect: http is redirected 301 to {target}"
        ));
        d.verdict = Verdict::Redirect;
        d.status = 301;
        d.reason = Some(reason::HTTPS_REDIRECT);
        d.location = Some(target);
        return d;
    }
    // 3c. The body's size, as announced.
    if let Some(n) = content_length {
        if n > site.max_body {
            d.reasons.push(format!(
                "Content-Length {n} is above max_body_size {} (413)",
                site.max_body
            ));
            return refuse(d, Verdict::Blocked, 413, reason::BODY_TOO_LARGE);
        }
        d.reasons.push(format!(
            "Content-Length {n} within max_body_size {}",
            site.max_body
        ));
    }
    let client = req.client_ip;
    // 4. IP policy.
    if site.ip != Mode::Off {
        let inside = client.is_some_and(|c| site.ip_list.iter().any(|n| n.contains(c)));
        let who = client.map_or_else(|| "unknown".to_owned(), |c| c.to_string());
        match (site.ip, inside) {
            (Mode::Allow, false) => {
                d.reasons.push(format!(
                    "ip_mode allow: client {who} is in no listed network"
                ));
                return refuse(d, Verdict::Blocked, 403, reason::IP_NOT_ALLOWED);
            }
            (Mode::Block, true) => {
                d.reasons.push(format!(
                    "ip_mode block: client {who} is in a listed network"
                ));
                return refuse(d, Verdict::Blocked, 403, reason::IP_BLOCKED);
            }
            _ => d.reasons.push(format!("ip policy passes client {who}")),
        }
    }
    // 5. Geo policy.
    if site.geo != Mode::Off {
        let listed = req
            .country
            .is_some_and(|c| site.geo_codes.iter().any(|g| g == c));
        let country = req.country.unwrap_or("unknown");
        match (site.geo, listed) {
            (Mode::Allow, false) => {
                d.reasons
                    .push(format!("geo_mode allow: country {country} is not listed"));
                return refuse(d, Verdict::Blocked, 403, reason::GEO_NOT_ALLOWED);
            }
            (Mode::Block, true) => {
                d.reasons
                    .push(format!("geo_mode block: country {country} is listed"));
                return refuse(d, Verdict::Blocked, 403, reason::GEO_BLOCKED);
            }
            _ => d
                .reasons
                .push(format!("geo policy passes country {country}")),
        }
    }
    // 6. WAF.
    if site.waf != Level::Off {
        let hits = waf_matches(req.method, req.uri);
        if let Some(&first) = hits.first() {
            if site.waf == Level::Strict {
                d.reasons
                    .push(format!("waf strict: rule `{first}` matches"));
                d.waf = hits;
                return refuse(d, Verdict::Blocked, 403, reason::waf(first));
            }
            d.reasons.push(format!(
                "waf detect: rules {} match (logged, X-Edgeform-Waf)",
                hits.join(",")
            ));
            d.waf = hits;
        } else {
            d.reasons.push("waf: no rule matches".into());
        }
    }
    // 7. Hotlinks.
    if site.hotlink
        && HOTLINK_EXTENSIONS
            .iter()
            .any(|e| Matcher::Ext((*e).to_owned()).matches(path))
        && let Some(referer) = req.referer
    {
        let ok = url_host(referer).is_some_and(|h| same_site(&h, &host));
        if !ok {
            d.reasons
                .push(format!("hotlink block: asset requested from `{referer}`"));
            return refuse(d, Verdict::Blocked, 403, reason::HOTLINK);
        }
        d.reasons.push("hotlink: same-site referer".into());
    }
    // 8. CORS.
    if site.cors != Level::Off
        && let Some(origin) = req.origin
    {
        if site.cors == Level::Strict {
            let ok = url_host(origin).is_some_and(|h| same_site(&h, &host));
            if !ok {
                d.reasons
                    .push(format!("cors strict: cross-site Origin `{origin}`"));
                return refuse(d, Verdict::Blocked, 403, reason::CORS_ORIGIN);
            }
        }
        if req.method == "OPTIONS" && req.acr_method.is_some() {
            d.reasons
                .push("cors: preflight answered by the edge".into());
            return refuse(d, Verdict::Preflight, 204, reason::CORS_PREFLIGHT);
        }
        d.reasons.push(format!("cors: Origin `{origin}` allowed"));
    }
    // 9. Challenge.
    if site.rate == Level::Strict {
        let cookie = req.cookie.and_then(|c| cookie_value(c, CLEARANCE_COOKIE));
        let valid = match (cookie, clearance.secret, client) {
            (Some(value), Some(secret), Some(ip)) => {
                clearance_valid(secret, key, ip, clearance.now, value)
            }
            _ => false,
        };
        if !valid {
            d.reasons.push(match (cookie, clearance.secret) {
                (None, _) => "rate_mode strict: no clearance cookie: challenge".into(),
                (Some(_), None) => {
                    "rate_mode strict: clearance cookie not verifiable (no secret known): challenge"
                        .into()
                }
                (Some(_), Some(_)) => {
                    "rate_mode strict: clearance cookie invalid, expired or without the proof of work: challenge".into()
                }
            });
            return refuse(d, Verdict::Challenged, 403, reason::CHALLENGE);
        }
        d.reasons
            .push("rate_mode strict: valid clearance cookie".into());
    }
    // 10. Rate limit: assumed within (a client's first requests).
    match site.rate {
        Level::Off => {}
        Level::Normal => d.reasons.push(format!(
            "rate_mode normal: {}/s, burst {} per client (assumed within)",
            RATE_NORMAL.0, RATE_NORMAL.1
        )),
        Level::Strict => d.reasons.push(format!(
            "rate_mode strict: {}/s, burst {} per client (assumed within)",
            RATE_STRICT.0, RATE_STRICT.1
        )),
    }
    // 11. Edge rules.
    for (m, action) in &site.edge_rules {
        if !m.matches(path) {
            continue;
        }
        match action {
            EdgeAction::Block => {
                d.reasons.push(format!("edge rule {} blocks", m.describe()));
                return refuse(d, Verdict::Blocked, 403, reason::EDGE_RULE);
            }
            EdgeAction::Redirect { status, to } => {
                let mut target = to.clone().unwrap_or_else(|| "/".to_owned());
                if let Matcher::Prefix(p) = m {
                    target = join_redirect(&target, &path[p.len()..]);
                }
                if let Some(q) = query {
                    target.push(if target.contains('?') { '&' } else { '?' });
                    target.push_str(q);
                }
                d.reasons.push(format!(
                    "edge rule {} redirects {status} to {target}",
                    m.describe()
                ));
                d.verdict = Verdict::Redirect;
                d.status = *status;
                d.location = Some(target);
                return d;
            }
        }
    }
    // 12. Proxy.
    d.origin = Some(site.origin.clone());
    d.origin_host = Some(if site.origin_host_is_ip {
        host.clone()
    } else {
        site.origin_authority.clone()
    });
    d.fallback_origins.clone_from(&site.fallbacks);
    d.reasons.push(format!(
        "proxy to {} (Host: {})",
        site.origin,
        d.origin_host.as_deref().unwrap_or_default()
    ));
    if !site.fallbacks.is_empty() {
        d.reasons.push(format!(
            "on a connect error, timeout or 5xx, then {} in turn, each with its own \
             Host (a POST or PATCH only while it was never sent)",
            site.fallbacks.join(", then ")
        ));
    }
    if !site.cached {
        d.reasons.push("cached: false: cache bypassed".into());
    } else if req.method != "GET" && req.method != "HEAD" {
        d.reasons.push(format!("{} is never cached", req.method));
    } else if req.authorization.is_some() {
        d.reasons
            .push("a request with Authorization is never cached: cache bypassed".into());
    } else {
        let rule = site.cache_rules.iter().find(|(m, _)| m.matches(path));
        match rule {
            Some((m, CacheAction::Bypass)) => {
                d.reasons
                    .push(format!("cache rule {} bypasses the cache", m.describe()));
            }
            Some((m, CacheAction::Ttl(t))) => {
                d.reasons
                    .push(format!("cache rule {}: cached {t} s", m.describe()));
                d.cache = Cache {
                    cached: true,
                    ttl: Some(*t),
                };
            }
            None => {
                d.reasons.push(format!(
                    "cached: the origin's freshness, else {DEFAULT_TTL_SECS} s"
                ));
                d.cache = Cache {
                    cached: true,
                    ttl: None,
                };
            }
        }
    }
    d
}
