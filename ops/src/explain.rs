//! `edgeform explain`: the reference edge's decision for one request (or a
//! file of them), made offline from the compiled documents at any revision
//! by `edgestate::edge` — the rules `edge/lua/cdn_router.lua` applies.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use edgestate::edge::{self, Clearance, DocError, Found, Request, Site};
use edgestate::route::Router;
use serde::Deserialize;

use compiler::compile::{Compiled, Target};

/// Output formats of `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExplainFormat {
    Human,
    Json,
}

/// Options of `explain`: one request (`host`, `url`, `ip`), or a `batch`
/// file of them.
#[derive(Debug, Clone)]
pub struct ExplainOptions {
    /// The request's Host.
    pub host: Option<String>,
    /// The request URI (`/path?query`, or a full URL whose path and query
    /// are used).
    pub url: Option<String>,
    /// The socket peer's IP.
    pub ip: Option<IpAddr>,
    /// The request method.
    pub method: String,
    /// Request headers, `Name: value`; only X-Forwarded-For may repeat
    /// (its lines are one list, in order).
    pub headers: Vec<String>,
    /// The edge whose documents decide (default: the first, by name, that
    /// carries the host).
    pub node: Option<String>,
    /// MaxMind City/Country database for the client's country.
    pub geoip: Option<PathBuf>,
    /// The client's country, stated (ISO 3166-1 alpha-2), instead of a
    /// database.
    pub country: Option<String>,
    /// Output: the steps, or one JSON object.
    pub format: ExplainFormat,
    /// Explain every request of this file (`-`: stdin), one JSON object a
    /// line; prints one JSON decision a line.
    pub batch: Option<PathBuf>,
    /// Unix time for checking clearance cookies and certificates' expiry
    /// (default: now).
    pub now: Option<u64>,
    /// `https`: the request comes over TLS (the certificate's outcome is
    /// reported first).
    pub scheme: edge::Scheme,
    /// The TLS server name (default with https: the host).
    pub sni: Option<String>,
    /// The PROXY-protocol header's address: the request came through a
    /// router's 443 pool to the edge's PROXY listener, `ip` being that
    /// router (the peer). Believed only from a router of the routing
    /// table ([`Router::client_ip_proxied`]); otherwise refused.
    pub proxy: Option<String>,
}

/// One request of a batch file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    host: String,
    url: String,
    ip: IpAddr,
    #[serde(default = "get")]
    method: String,
    #[serde(default)]
    headers: BTreeMap<String, HeaderLines>,
    #[serde(default)]
    node: Option<String>,
    /// `http` (default) or `https`.
    #[serde(default)]
    scheme: Option<String>,
    #[serde(default)]
    sni: Option<String>,
    /// The PROXY header's address (the viewer behind router `ip`).
    #[serde(default)]
    proxy: Option<String>,
    #[serde(default)]
    id: serde_json::Value,
}

fn get() -> String {
    "GET".into()
}

/// A batch request's header: one line, or several (X-Forwarded-For).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HeaderLines {
    One(String),
    Many(Vec<String>),
}

/// A request's headers: name (any case) → its lines, in order.
type Headers = BTreeMap<String, Vec<String>>;

/// Add one header line; a second line of any header but X-Forwarded-For is
/// refused (the edge reads one).
fn add_header(headers: &mut Headers, name: &str, value: String) -> Result<()> {
    let key = name.to_ascii_lowercase();
    let lines = headers.entry(key.clone()).or_default();
    if !lines.is_empty() && key != "x-forwarded-for" {
        bail!("header `{name}` given more than once (only X-Forwarded-For may repeat)");
    }
    lines.push(value);
    Ok(())
}

/// The explainer: the compiled targets, and per node its router and the
/// documents prepared so far (regexes compiled once).
struct Explainer<'a> {
    compiled: &'a Compiled,
    geoip: Option<maxminddb::Reader<Vec<u8>>>,
    /// The viewer's country as `--country` states it (instead of a
    /// database).
    country: Option<String>,
    secret: Option<Vec<u8>>,
    now: u64,
    routers: BTreeMap<String, Arc<Router>>,
    /// node → site key → prepared document.
    sites: BTreeMap<String, BTreeMap<String, Result<Arc<Site>, DocError>>>,
}

/// The reason of a request refused on the PROXY listener: the edge closes
/// the connection without an answer (nginx's 444), so no
/// `X-Edgeform-Reason` is ever sent with it.
pub const PROXY_REFUSED: &str = "proxy-refused";

/// A request whose verdict depends on the viewer's country, explained
/// with neither `--geoip` nor `--country`.
#[derive(Debug)]
pub struct CountryNeeded {
    pub site: String,
}

impl std::fmt::Display for CountryNeeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the answer for this request depends on the viewer's country (site `{}` has a \
             geo_mode policy), unknown without a database: give --geoip DB or --country XX",
            edgestate::untrusted::escape(&self.site)
        )
    }
}

impl std::error::Error for CountryNeeded {}

/// A decision and what was looked up for it.
struct Explained {
    /// The handshake's outcome (https only).
    tls: Option<edgestate::tls::TlsAnswer>,
    decision: edge::Decision,
    node: Option<String>,
    client: Option<IpAddr>,
    country: Option<String>,
}

/// Where a request came from: the socket peer, and the PROXY header's
/// address when it arrived on the routers' listener.
#[derive(Clone, Copy)]
struct From<'a> {
    peer: IpAddr,
    proxy: Option<&'a str>,
}

fn header<'h>(headers: &'h Headers, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|lines| lines.first())
        .map(String::as_str)
}

/// `$http_x_forwarded_for` as nginx 1.22 builds it: every line, joined
/// with `, `.
fn forwarded_for(headers: &Headers) -> Option<String> {
    edgestate::route::join_xff(
        headers
            .get("x-forwarded-for")
            .into_iter()
            .flatten()
            .map(String::as_bytes),
    )
}

fn request_uri(url: &str) -> &str {
    match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => url,
    }
}

fn find_value<'t>(target: &'t Target, key: &str) -> Option<&'t str> {
    target
        .sites
        .binary_search_by(|(k, _)| (**k).cmp(key))
        .ok()
        .map(|i| &*target.sites[i].1)
}

impl Explainer<'_> {
    fn router(&mut self, node: &str, target: &Target) -> Result<Arc<Router>> {
        if let Some(r) = self.routers.get(node) {
            return Ok(r.clone());
        }
        let table = serde_json::from_str(&target.routing).context("the compiled routing table")?;
        let router = Arc::new(Router::new(table).map_err(|e| anyhow::anyhow!("{e}"))?);
        self.routers.insert(node.to_owned(), router.clone());
        Ok(router)
    }

    fn country(&self, ip: IpAddr) -> Result<Option<String>> {
        if let Some(c) = &self.country {
            return Ok(Some(c.clone()));
        }
        let Some(reader) = &self.geoip else {
            return Ok(None);
        };
        let found = reader
            .lookup(ip)
            .with_context(|| format!("looking up {ip}"))?;
        let c: Option<maxminddb::geoip2::Country> =
            found.decode().with_context(|| format!("decoding {ip}"))?;
        Ok(c.and_then(|c| c.country.iso_code.map(str::to_owned)))
    }

    #[allow(clippy::too_many_arguments, clippy::too_many_lines)]
    fn explain(
        &mut self,
        node: Option<&str>,
        host: &str,
        url: &str,
        from: From<'_>,
        method: &str,
        headers: &Headers,
        tls: Option<&str>,
    ) -> Result<Explained> {
        // nginx drops the spaces around a header's value (not tabs).
        let header_host = host.trim_matches(' ');
        // An absolute request line (`GET http://b.test/x`) names the host
        // itself: nginx serves that host, whatever the Host header says.
        let target_host = url
            .split_once("://")
            .map(|(_, rest)| &rest[..rest.find(['/', '?']).unwrap_or(rest.len())]);
        let line_host = target_host.filter(|h| !h.is_empty() && *h != header_host);
        let host = line_host.unwrap_or(header_host);
        let norm = edge::normalize_host(host);
        let candidates = edge::lookup_hosts(&norm);
        let carries = |t: &Target| {
            candidates
                .iter()
                .any(|h| find_value(t, &edgestate::keys::site(h)).is_some())
        };
        let chosen: Option<(&String, &Target)> =
            match node {
                Some(n) => Some(self.compiled.targets.get_key_value(n).with_context(|| {
                    format!("no target node `{n}` (a node with a redis block)")
                })?),
                None => self
                    .compiled
                    .targets
                    .iter()
                    .find(|(_, t)| carries(t))
                    .or_else(|| self.compiled.targets.iter().next()),
            };
        let mut pre = Vec::new();
        if let Some(h) = line_host {
            pre.push(format!(
                "the request line names the host `{h}`: nginx serves it, not the Host header's"
            ));
        }
        let xff = forwarded_for(headers);
        // Through PROXY the viewer stands for the peer, if the peer is a
        // router (the routing table's); no table: no router to believe.
        let client = match chosen {
            Some((name, t)) => {
                let router = self.router(name, t)?;
                router.client_ip_proxied(from.peer, from.proxy, xff.as_deref(), &mut pre)
            }
            None if from.proxy.is_some() => {
                pre.push("no routing table: no router's PROXY header is believed".into());
                None
            }
            None => Some(from.peer),
        };
        let country = match client {
            Some(ip) => self.country(ip)?,
            None => None,
        };
        let uri = request_uri(url);
        // The handshake first: the certificate the edge serves for the SNI,
        // from the node's tls:<host> documents.
        let handshake = tls.map(|sni| {
            let docs = chosen.map(|(_, t)| t);
            edgestate::tls::outcome(Some(sni), &norm, self.now, |k| {
                docs.and_then(|t| find_value(t, k))
            })
        });
        let req = Request {
            method,
            host,
            uri,
            scheme: if tls.is_some() {
                edge::Scheme::Https
            } else {
                edge::Scheme::Http
            },
            sni: tls,
            client_ip: client,
            country: country.as_deref(),
            referer: header(headers, "referer"),
            origin: header(headers, "origin"),
            acr_method: header(headers, "access-control-request-method"),
            cookie: header(headers, "cookie"),
            authorization: header(headers, "authorization"),
            content_length: header(headers, "content-length"),
        };
        let clearance = Clearance {
            secret: self.secret.as_deref(),
            now: self.now,
        };
        // The site document the request finds (prepared once per node).
        let found: Option<(String, Result<Arc<Site>, DocError>, bool)> = match chosen {
            None => None,
            Some((name, t)) => candidates
                .iter()
                .find_map(|h| find_value(t, &edgestate::keys::site(h)).map(|v| (h, v)))
                .map(|(key, text)| {
                    let known = self
                        .sites
                        .get(name.as_str())
                        .and_then(|m| m.get(key.as_str()));
                    let site = match known {
                        Some(s) => s.clone(),
                        None => {
                            let s = Site::parse(text).map(Arc::new);
                            self.sites
                                .entry(name.clone())
                                .or_default()
                                .insert(key.clone(), s.clone());
                            s
                        }
                    };
                    let suspended = find_value(t, &edgestate::keys::suspended(key))
                        == Some(edgestate::keys::SUSPENDED_VALUE);
                    (key.clone(), site, suspended)
                }),
        };
        let decide = |req: &Request<'_>| match &found {
            None => edge::decide(req, Found::None, clearance),
            Some((key, Ok(site), suspended)) => edge::decide(
                req,
                Found::Site {
                    key,
                    site,
                    suspended: *suspended,
                },
                clearance,
            ),
            Some((key, Err(error), _)) => edge::decide(req, Found::Bad { key, error }, clearance),
        };
        let mut decision = decide(&req);
        // Without a database or a stated country the country is unknown
        // here but not at the edge: a verdict that depends on it would be
        // a guess, so none is given.
        if self.geoip.is_none()
            && self.country.is_none()
            && client.is_some()
            && let Some((key, Ok(site), _)) = &found
            && !site.geo_codes().is_empty()
        {
            let mut tried = vec![None, Some("ZZ")];
            tried.extend(site.geo_codes().iter().map(|c| Some(c.as_str())));
            let differs = tried.into_iter().any(|c| {
                let other = decide(&Request {
                    country: c,
                    ..req.clone()
                });
                (other.status, other.reason) != (decision.status, decision.reason)
            });
            if differs {
                return Err(CountryNeeded { site: key.clone() }.into());
            }
        }
        // A refused PROXY header: what nginx answers before the edge's Lua
        // stands; anything else (the path check included) is dropped
        // before the edge answers.
        if client.is_none() && !answered_by_nginx(&decision) {
            decision = unanswered(
                444,
                PROXY_REFUSED,
                "the PROXY header is refused: the edge closes the connection without an \
                 answer (444)"
                    .into(),
            );
        }
        // What nginx refuses in the request line itself, before any of
        // the above is looked at.
        let refused = refused_line(method, url, tls.is_none(), headers, header_host)
            .or_else(|| target_host.and_then(|t| refused_absolute(t, header_host)));
        if let Some((status, reason, why)) = refused {
            decision = unanswered(status, reason, why);
        }
        let mut reasons = pre;
        if let Some(a) = &handshake {
            reasons.extend(a.reasons.iter().map(|r| format!("tls: {r}")));
            if a.tls == edgestate::tls::TlsOutcome::NoCertificate {
                reasons.push(
                    "tls: the handshake fails, no request reaches the edge; what follows is \
                     the decision had it arrived"
                        .into(),
                );
            }
        }
        if let Some(client) = client {
            reasons.push(match &country {
                Some(c) => format!("client {client}, country {c}"),
                None if self.geoip.is_some() => format!("client {client}, country unknown"),
                None => format!("client {client} (no --geoip: country unknown)"),
            });
        }
        if let Some((name, _)) = chosen {
            reasons.push(format!("documents of node {name}"));
        }
        reasons.append(&mut decision.reasons);
        decision.reasons = reasons;
        Ok(Explained {
            tls: handshake,
            decision,
            node: chosen.map(|(n, _)| n.clone()),
            client,
            country,
        })
    }
}

/// A request answered before any site is looked at (by nginx, or closed
/// unanswered): `status`, `reason`, and the one step that says why.
fn unanswered(status: u16, reason: &'static str, why: String) -> edge::Decision {
    edge::Decision {
        verdict: edge::Verdict::Blocked,
        status,
        location: None,
        cache: edge::Cache {
            cached: false,
            ttl: None,
        },
        origin: None,
        origin_host: None,
        fallback_origins: Vec::new(),
        reason: Some(reason),
        waf: Vec::new(),
        site: None,
        reasons: vec![why],
    }
}

/// `X-Edgeform-Reason` of none: nginx's own 414 for a request line past
/// its buffer.
pub const URI_TOO_LONG: &str = "uri-too-long";

/// The longest request line, or header line, nginx reads over HTTP/1.1,
/// with its CRLF: one of the `large_client_header_buffers` (the edge
/// keeps nginx's 8k).
const LINE_MAX: usize = 8192;

/// What nginx answers a request it refuses before the edge's Lua, from
/// its request line (`METHOD URL HTTP/1.1`) and header lines: a space or
/// control byte anywhere in the target (400, since nginx 1.21.1); over
/// plain HTTP/1.1 (`http`), a request line past its buffer (414) or a
/// header line past it (400). Over HTTPS the edge speaks HTTP/2 too,
/// whose limits differ: those two are not judged there.
fn refused_line(
    method: &str,
    url: &str,
    http: bool,
    headers: &Headers,
    host: &str,
) -> Option<(u16, &'static str, String)> {
    if url.bytes().any(|b| b <= 0x20 || b == 0x7f) {
        return Some((
            400,
            edge::reason::BAD_REQUEST,
            "nginx refuses a request target holding a space or a control character (400, \
             before the edge's Lua)"
                .into(),
        ));
    }
    if !http {
        return None;
    }
    let line = method.len() + 1 + url.len() + " HTTP/1.1\r\n".len();
    if line > LINE_MAX {
        return Some((
            414,
            URI_TOO_LONG,
            format!(
                "the request line is {line} bytes, past nginx's {LINE_MAX}-byte buffer \
                 (large_client_header_buffers): 414, before the edge's Lua"
            ),
        ));
    }
    let header_lines = headers
        .iter()
        .flat_map(|(name, values)| values.iter().map(move |v| (name.as_str(), v.len())))
        .chain([("host", host.len())]);
    for (name, len) in header_lines {
        let line = name.len() + ": ".len() + len + "\r\n".len();
        if line > LINE_MAX {
            return Some((
                400,
                edge::reason::BAD_REQUEST,
                format!(
                    "the {name} header line is {line} bytes, past nginx's {LINE_MAX}-byte \
                     buffer: 400 (Request Header Or Cookie Too Large), before the edge's Lua"
                ),
            ));
        }
    }
    None
}

/// An absolute request line (`GET http://b.test/x`): nginx reads its host
/// as letters, digits, `.` and `-` (and a port, or a bracketed IPv6
/// address), and still checks the Host header — empty or malformed, 400.
fn refused_absolute(target_host: &str, header: &str) -> Option<(u16, &'static str, String)> {
    let refuse = |why: String| Some((400, edge::reason::BAD_REQUEST, why));
    let (name, port) = match target_host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((addr, port)) => (addr, port),
            None => ("", ""),
        },
        None => target_host
            .find(':')
            .map_or((target_host, ""), |i| target_host.split_at(i)),
    };
    let name_ok = if target_host.starts_with('[') {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
    } else {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
    if !name_ok || !port_ok {
        return refuse(format!(
            "nginx refuses the host `{}` of the request line: letters, digits, `.` and `-` \
             only (400, before the edge's Lua)",
            edgestate::untrusted::escape(target_host)
        ));
    }
    if edge::norm::nginx_host(header).is_none() {
        return refuse(format!(
            "nginx refuses the Host header `{}` even when the request line names the host \
             (400, before the edge's Lua)",
            edgestate::untrusted::escape(header)
        ));
    }
    None
}

/// Whether nginx itself answers `d`, before the edge's Lua runs (so also
/// on a refused PROXY header, which the Lua refuses first).
fn answered_by_nginx(d: &edge::Decision) -> bool {
    matches!(
        d.reason,
        Some(edge::reason::BAD_REQUEST | edge::reason::BODY_TOO_LARGE)
    ) && d.site.is_none()
}

/// One answer: the decision's fields, then what was looked up.
#[derive(serde::Serialize)]
struct Out<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<&'static str>,
    #[serde(flatten)]
    decision: &'a edge::Decision,
    /// Who answers without the site's rules: `edge` for an ACME challenge
    /// (from the edge's Redis, docs/edge.md "ACME challenges").
    #[serde(skip_serializing_if = "Option::is_none")]
    answered_by: Option<&'static str>,
    node: Option<&'a str>,
    client_ip: Option<IpAddr>,
    country: Option<&'a str>,
    /// A proxied request's origins, in the order the edge tries them
    /// (`origin`, then `fallback_origins`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    origins: Vec<&'a str>,
    /// For a proxied request: whether a stale cached copy can answer when
    /// every origin fails (the response is cached: the edge's
    /// `proxy_cache_use_stale`).
    #[serde(skip_serializing_if = "Option::is_none")]
    stale: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a serde_json::Value>,
}

/// A proxied decision's origins in the order they are tried.
fn origin_order(d: &edge::Decision) -> Vec<&str> {
    d.origin
        .iter()
        .chain(d.fallback_origins.iter())
        .map(String::as_str)
        .collect()
}

/// Whether a stale copy can answer a proxied decision when every origin
/// fails: only a cached response has one.
fn stale_possible(d: &edge::Decision) -> Option<bool> {
    d.origin.as_ref().map(|_| d.cache.cached)
}

fn to_json(e: &Explained, id: Option<&serde_json::Value>) -> String {
    serde_json::to_string(&Out {
        tls: e.tls.as_ref().map(|a| a.tls.as_str()),
        decision: &e.decision,
        answered_by: (e.decision.verdict == edge::Verdict::AcmeChallenge).then_some("edge"),
        node: e.node.as_deref(),
        client_ip: e.client,
        country: e.country.as_deref(),
        origins: origin_order(&e.decision),
        stale: stale_possible(&e.decision),
        id,
    })
    .unwrap_or_default()
}

/// The human text as a terminal may show it: each line with its control
/// characters escaped (the host, method and URL asked about are the
/// caller's, and reasons quote them).
fn shown(text: &str) -> String {
    text.lines()
        .map(|l| edgestate::untrusted::escape(l) + "\n")
        .collect()
}

fn human(e: &Explained) -> String {
    use std::fmt::Write as _;
    let d = &e.decision;
    let mut s = String::new();
    for (i, r) in d.reasons.iter().enumerate() {
        let _ = writeln!(s, "  {}. {r}", i + 1);
    }
    if let Some(a) = &e.tls {
        let _ = write!(s, "tls: {}", a.tls.as_str());
        if let Some(k) = &a.key {
            let _ = write!(s, " ({k})");
        }
        s.push('\n');
    }
    let verdict = serde_json::to_value(d.verdict).unwrap_or_default();
    let _ = write!(
        s,
        "verdict: {} {}",
        verdict.as_str().unwrap_or_default(),
        d.status
    );
    match d.reason {
        Some(PROXY_REFUSED) => {
            let _ = write!(s, " (no answer, the connection is closed: {PROXY_REFUSED})");
        }
        Some(r) => {
            let _ = write!(s, " (X-Edgeform-Reason: {r})");
        }
        None => {}
    }
    if let Some(l) = &d.location {
        let _ = write!(s, " → {l}");
    }
    if let Some(o) = &d.origin {
        let _ = write!(
            s,
            " → {o}; cache: {}",
            match (d.cache.cached, d.cache.ttl) {
                (false, _) => "off".to_owned(),
                (true, Some(t)) => format!("{t} s"),
                (true, None) => "origin's freshness".to_owned(),
            }
        );
    }
    s.push('\n');
    if d.origin.is_some() {
        let _ = writeln!(
            s,
            "origins, in order: {}\nwhen every origin fails: {}",
            origin_order(d).join(" → "),
            if stale_possible(d) == Some(true) {
                "a cached copy is served stale (X-Cache-Status: STALE); without one, \
                 the last origin's 5xx or 502/504"
            } else {
                "the last origin's 5xx or 502/504 (not cached: no stale copy)"
            }
        );
    }
    s
}

/// The server name of an https request: `sni`, else the host without its
/// port (what a client sends); `None` for http.
fn tls_name(scheme: edge::Scheme, sni: Option<&str>, host: &str) -> Result<Option<String>> {
    match (scheme, sni) {
        (edge::Scheme::Http, Some(_)) => bail!("--sni needs --scheme https"),
        (edge::Scheme::Http, None) => Ok(None),
        (edge::Scheme::Https, Some(s)) => Ok(Some(s.to_owned())),
        (edge::Scheme::Https, None) => Ok(Some(edge::normalize_host(host))),
    }
}

/// `edgeform explain`.
///
/// # Errors
/// Bad arguments, unreadable files.
pub fn explain(compiled: &Compiled, args: &ExplainOptions) -> Result<u8> {
    let geoip = match &args.geoip {
        Some(p) => Some(
            maxminddb::Reader::open_readfile(p)
                .with_context(|| format!("opening {}", p.display()))?,
        ),
        None => None,
    };
    let now = args.now.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let mut ex = Explainer {
        compiled,
        geoip,
        country: args.country.clone(),
        secret: std::env::var("EDGEFORM_CHALLENGE_SECRET")
            .ok()
            .filter(|s| !s.is_empty())
            .map(String::into_bytes),
        now,
        routers: BTreeMap::new(),
        sites: BTreeMap::new(),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if let Some(path) = &args.batch {
        let reader: Box<dyn BufRead> = if path == Path::new("-") {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            ))
        };
        for (n, line) in reader.lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let r: BatchRequest = serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: not a request", path.display(), n + 1))?;
            let node = r.node.as_deref().or(args.node.as_deref());
            let mut headers = Headers::new();
            for (name, value) in r.headers {
                let lines = match value {
                    HeaderLines::One(v) => vec![v],
                    HeaderLines::Many(v) => v,
                };
                for v in lines {
                    add_header(&mut headers, &name, v)
                        .with_context(|| format!("{}:{}", path.display(), n + 1))?;
                }
            }
            let scheme = match r.scheme.as_deref() {
                None => edge::Scheme::Http,
                Some(s) => edge::Scheme::parse(s).with_context(|| {
                    format!(
                        "{}:{}: scheme `{}` is not http or https",
                        path.display(),
                        n + 1,
                        edgestate::untrusted::escape(s)
                    )
                })?,
            };
            let sni = tls_name(scheme, r.sni.as_deref(), &r.host)
                .with_context(|| format!("{}:{}", path.display(), n + 1))?;
            let e = ex.explain(
                node,
                &r.host,
                &r.url,
                From {
                    peer: r.ip,
                    proxy: r.proxy.as_deref(),
                },
                &r.method,
                &headers,
                sni.as_deref(),
            )?;
            writeln!(out, "{}", to_json(&e, Some(&r.id)))?;
        }
        out.flush()?;
        return Ok(0);
    }
    let (Some(host), Some(url), Some(ip)) = (&args.host, &args.url, args.ip) else {
        bail!("give --host, --url and --ip (or --batch FILE)");
    };
    let mut headers = Headers::new();
    for h in &args.headers {
        let (k, v) = h
            .split_once(':')
            .with_context(|| format!("--header `{h}` is not `Name: value`"))?;
        // As nginx reads a header line: spaces around the value dropped,
        // nothing else (a tab or U+00A0 stays part of it).
        add_header(&mut headers, k.trim(), v.trim_matches(' ').to_owned())?;
    }
    let sni = tls_name(args.scheme, args.sni.as_deref(), host)?;
    let e = ex.explain(
        args.node.as_deref(),
        host,
        url,
        From {
            peer: ip,
            proxy: args.proxy.as_deref(),
        },
        &args.method,
        &headers,
        sni.as_deref(),
    )?;
    match args.format {
        ExplainFormat::Json => writeln!(out, "{}", to_json(&e, None))?,
        ExplainFormat::Human => out.write_all(shown(&human(&e)).as_bytes())?,
    }
    out.flush()?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use edgestate::routing::{GeoSettings, RoutingTable};
    use edgestate::tls::TlsDoc;

    const DOC: &str = r#"{"cache_rules":[],"cached":true,"cors_mode":"off","edge_rules":[],"geo_codes":"","geo_mode":"off","hotlink_mode":"off","ip_list":"","ip_mode":"off","origin":"http://o.test","rate_mode":"off","waf_mode":"off"}"#;
    const REDIRECT: &str = r#"{"cache_rules":[],"cached":true,"cors_mode":"off","edge_rules":[],"geo_codes":"","geo_mode":"off","hotlink_mode":"off","https_redirect":true,"ip_list":"","ip_mode":"off","origin":"http://o.test","rate_mode":"off","tls":"certificate:a","waf_mode":"off"}"#;

    fn cert(not_after: u64) -> String {
        TlsDoc {
            chain: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            fingerprint: "0f".repeat(32),
            key: "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n".into(),
            not_after,
        }
        .to_canonical_json()
    }

    /// A compiled key set as `build` gives it, with the certificate
    /// documents the contract adds (`tls:<host>`).
    fn compiled() -> Compiled {
        let table = RoutingTable {
            format: edgestate::FORMAT_VERSION,
            cluster: "t".into(),
            trusted_proxies: Vec::new(),
            geo: GeoSettings::default(),
            zones: BTreeMap::new(),
            nodes: [(
                "router-1".to_owned(),
                edgestate::routing::Node {
                    roles: vec!["router".into()],
                    region: "eu".into(),
                    zone: None,
                    public_url: None,
                    location: None,
                    addresses: vec!["198.51.100.7".into()],
                    playback_session_limit: None,
                    playback_bandwidth_kbit: None,
                    network_bandwidth_kbit: None,
                    drain: false,
                },
            )]
            .into(),
            router_pool: None,
        };
        let mut sites: Vec<(Arc<str>, Arc<str>)> = [
            ("site:a.test", DOC.to_owned()),
            ("site:b.test", DOC.to_owned()),
            ("site:old.test", DOC.to_owned()),
            ("site:plain.test", REDIRECT.to_owned()),
            ("site:*.w.test", DOC.to_owned()),
            ("tls:a.test", cert(2_000)),
            ("tls:b.test", cert(2_000)),
            ("tls:old.test", cert(999)),
            ("tls:plain.test", cert(2_000)),
            ("tls:*.w.test", cert(2_000)),
        ]
        .into_iter()
        .map(|(k, v)| (Arc::from(k), Arc::from(v.as_str())))
        .collect();
        sites.sort();
        let mut targets = BTreeMap::new();
        targets.insert(
            "edge-1".to_owned(),
            Target {
                node: "edge-1".into(),
                region: "eu".into(),
                routing: serde_json::to_string(&table).unwrap().into(),
                sites: Arc::new(sites),
            },
        );
        Compiled {
            targets,
            nginx: BTreeMap::new(),
        }
    }

    fn run(
        c: &Compiled,
        host: &str,
        url: &str,
        scheme: edge::Scheme,
        sni: Option<&str>,
    ) -> Explained {
        let mut ex = Explainer {
            compiled: c,
            geoip: None,
            country: None,
            secret: None,
            now: 1_000,
            routers: BTreeMap::new(),
            sites: BTreeMap::new(),
        };
        let sni = tls_name(scheme, sni, host).unwrap();
        ex.explain(
            None,
            host,
            url,
            From {
                peer: "192.0.2.1".parse().unwrap(),
                proxy: None,
            },
            "GET",
            &Headers::new(),
            sni.as_deref(),
        )
        .unwrap()
    }

    fn answer(e: &Explained) -> (Option<&'static str>, u16, Option<&'static str>) {
        (
            e.tls.as_ref().map(|a| a.tls.as_str()),
            e.decision.status,
            e.decision.reason,
        )
    }

    #[test]
    fn https_reports_the_certificate_before_the_verdict() {
        let c = compiled();
        let https = edge::Scheme::Https;
        assert_eq!(
            answer(&run(&c, "a.test", "/", https, None)),
            (Some("ok"), 200, None)
        );
        assert_eq!(
            answer(&run(&c, "A.test:443", "/", https, Some("a.TEST."))),
            (Some("ok"), 200, None)
        );
        assert_eq!(
            answer(&run(&c, "x.w.test", "/", https, None)),
            (Some("ok"), 200, None)
        );
        assert_eq!(
            answer(&run(&c, "old.test", "/", https, None)),
            (Some("expired"), 200, None)
        );
        // No certificate: the handshake fails, said first.
        let e = run(&c, "nocert.test", "/", https, None);
        assert_eq!(
            answer(&e),
            (Some("no-certificate"), 404, Some("unknown-host"))
        );
        assert!(
            e.decision
                .reasons
                .iter()
                .any(|r| r.contains("handshake fails")),
            "{:?}",
            e.decision.reasons
        );
        // Another site's SNI: its certificate does not cover the host, and
        // the request is misdirected.
        assert_eq!(
            answer(&run(&c, "b.test", "/", https, Some("a.test"))),
            (Some("name-mismatch"), 421, Some("misdirected-request"))
        );
        // https_redirect: 301 on http, served on https.
        let e = run(&c, "plain.test", "/p?q=1", edge::Scheme::Http, None);
        assert_eq!(answer(&e), (None, 301, Some("https-redirect")));
        assert_eq!(
            e.decision.location.as_deref(),
            Some("https://plain.test/p?q=1")
        );
        assert_eq!(
            answer(&run(&c, "plain.test", "/", https, None)),
            (Some("ok"), 200, None)
        );
        // --sni without https is an error.
        assert!(tls_name(edge::Scheme::Http, Some("a.test"), "a.test").is_err());
    }

    #[test]
    fn an_absolute_request_line_names_the_host_as_nginx_reads_it() {
        let c = compiled();
        let absolute = run(
            &c,
            "a.test",
            "http://plain.test/x",
            edge::Scheme::Http,
            None,
        );
        let direct = run(&c, "plain.test", "/x", edge::Scheme::Http, None);
        assert_eq!(absolute.decision.verdict, direct.decision.verdict);
        assert_eq!(absolute.decision.status, direct.decision.status);
        assert!(
            absolute.decision.reasons[0].contains("names the host `plain.test`"),
            "{:?}",
            absolute.decision.reasons
        );
        // The caller's text reaches the terminal escaped.
        assert_eq!(shown("a\u{1b}[2Jb\nc\u{7}\n"), "a\\u{1b}[2Jb\nc\\u{7}\n");
    }

    #[test]
    fn what_nginx_refuses_in_the_request_line_and_host_is_explained_as_nginx_answers() {
        let c = compiled();
        let http = edge::Scheme::Http;
        let direct = run(&c, "plain.test", "/x", http, None);
        // A control byte or a space in the query: nginx's 400.
        for url in ["/x?a=\u{1}", "/x?a b", "/x?\u{7f}"] {
            let e = run(&c, "plain.test", url, http, None);
            assert_eq!(
                (e.decision.status, e.decision.reason),
                (400, Some(edge::reason::BAD_REQUEST)),
                "{url:?}"
            );
        }
        // A request line past nginx's 8k buffer: 414; just under it: served.
        let fits = format!("/x?{}", "a".repeat(8192 - "GET /x? HTTP/1.1\r\n".len()));
        assert_eq!(
            run(&c, "plain.test", &fits, http, None).decision.status,
            direct.decision.status
        );
        let long = format!("{fits}a");
        let e = run(&c, "plain.test", &long, http, None);
        assert_eq!(
            (e.decision.status, e.decision.reason),
            (414, Some(URI_TOO_LONG))
        );
        // nginx drops the spaces around the Host's value.
        let spaced = run(&c, " plain.test ", "/x", http, None);
        assert_eq!(
            (spaced.decision.status, spaced.decision.reason),
            (direct.decision.status, direct.decision.reason)
        );
        // A Host line past the buffer: 400 over HTTP/1.1.
        let long_host = format!("{}.test", "a".repeat(8192 - "host: .test\r\n".len() + 1));
        assert_eq!(run(&c, &long_host, "/x", http, None).decision.status, 400);
        // Over HTTPS (HTTP/2 too) neither line limit is judged.
        let https = edge::Scheme::Https;
        assert_ne!(
            run(&c, "plain.test", &long, https, None).decision.status,
            414
        );
        // An absolute request line: its host is letters, digits, `.`, `-`
        // and a port; the Host header is still checked.
        for (host, url, refused) in [
            ("plain.test", "http://plain.test:80/x", false),
            ("x.test", "http://plain.test/x", false),
            ("plain.test", "http://[::1]:80/x", false),
            ("plain.test", "http://u@plain.test/x", true),
            ("plain.test", "http://pl_ain.test/x", true),
            ("plain.test", "http://plain.test:8a/x", true),
            ("", "http://plain.test/x", true),
            ("   ", "http://plain.test/x", true),
            ("bad host", "http://plain.test/x", true),
        ] {
            let e = run(&c, host, url, http, None);
            assert_eq!(
                e.decision.status == 400,
                refused,
                "{host:?} {url}: {:?}",
                e.decision.reasons
            );
        }
    }

    #[test]
    fn json_and_text_carry_tls_first_and_only_with_https() {
        let c = compiled();
        let e = run(&c, "old.test", "/", edge::Scheme::Https, None);
        let json = to_json(&e, None);
        assert!(
            json.starts_with(r#"{"tls":"expired","verdict":"proxy""#),
            "{json}"
        );
        assert!(
            !json.contains("PRIVATE KEY") && !json.contains("MIIE"),
            "{json}"
        );
        let text = human(&e);
        let tls_at = text.find("tls: expired (tls:old.test)").expect(&text);
        assert!(tls_at < text.find("verdict:").unwrap(), "{text}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        let http = to_json(&run(&c, "a.test", "/", edge::Scheme::Http, None), None);
        assert!(!http.contains("\"tls\""), "{http}");
    }

    #[test]
    fn a_proxy_header_is_believed_from_a_router_only() {
        let c = compiled();
        let mut ex = Explainer {
            compiled: &c,
            geoip: None,
            country: None,
            secret: None,
            now: 1_000,
            routers: BTreeMap::new(),
            sites: BTreeMap::new(),
        };
        let mut ask = |peer: &str, proxy: &str, url: &str| {
            ex.explain(
                None,
                "a.test",
                url,
                From {
                    peer: peer.parse().unwrap(),
                    proxy: Some(proxy),
                },
                "GET",
                &Headers::new(),
                Some("a.test"),
            )
            .unwrap()
        };
        // From the router: the viewer is the PROXY address.
        let e = ask("198.51.100.7", "81.2.69.142", "/");
        assert_eq!(answer(&e), (Some("ok"), 200, None));
        assert_eq!(e.client, Some("81.2.69.142".parse().unwrap()));
        // From anyone else, or an address that does not parse: refused,
        // the connection closed without an answer.
        for (peer, proxy) in [("192.0.2.9", "81.2.69.142"), ("198.51.100.7", "x")] {
            let e = ask(peer, proxy, "/");
            assert_eq!(answer(&e), (Some("ok"), 444, Some(PROXY_REFUSED)));
            assert_eq!(e.client, None);
            assert!(
                e.decision.reasons.iter().any(|r| r.contains("refused")),
                "{:?}",
                e.decision.reasons
            );
        }
        // The PROXY check comes before the path check: a non-canonical
        // path from a non-router is not answered either.
        let e = ask("192.0.2.9", "81.2.69.142", "//a");
        assert_eq!(answer(&e), (Some("ok"), 444, Some(PROXY_REFUSED)));
        // From a router, the path check answers.
        let e = ask("198.51.100.7", "81.2.69.142", "//a");
        assert_eq!(e.decision.status, 308);
    }
}
