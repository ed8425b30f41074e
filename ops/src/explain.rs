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
    /// Output: the steps, or one JSON object.
    pub format: ExplainFormat,
    /// Explain every request of this file (`-`: stdin), one JSON object a
    /// line; prints one JSON decision a line.
    pub batch: Option<PathBuf>,
    /// Unix time for checking clearance cookies (default: now).
    pub now: Option<u64>,
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
    secret: Option<Vec<u8>>,
    now: u64,
    routers: BTreeMap<String, Arc<Router>>,
    /// node → site key → prepared document.
    sites: BTreeMap<String, BTreeMap<String, Result<Arc<Site>, DocError>>>,
}

/// A decision and what was looked up for it.
struct Explained {
    decision: edge::Decision,
    node: Option<String>,
    client: Option<IpAddr>,
    country: Option<String>,
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

    #[allow(clippy::too_many_arguments)]
    fn explain(
        &mut self,
        node: Option<&str>,
        host: &str,
        url: &str,
        peer: IpAddr,
        method: &str,
        headers: &Headers,
    ) -> Result<Explained> {
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
        let (client, router) = match chosen {
            Some((name, t)) => {
                let router = self.router(name, t)?;
                let xff = forwarded_for(headers);
                let ip = router.client_ip(peer, xff.as_deref(), &mut pre);
                (ip, Some(router))
            }
            None => (peer, None),
        };
        drop(router);
        let country = self.country(client)?;
        let uri = request_uri(url);
        let req = Request {
            method,
            host,
            uri,
            client_ip: Some(client),
            country: country.as_deref(),
            referer: header(headers, "referer"),
            origin: header(headers, "origin"),
            acr_method: header(headers, "access-control-request-method"),
            cookie: header(headers, "cookie"),
            authorization: header(headers, "authorization"),
            content_length: header(headers, "content-length"),
            ..Request::default()
        };
        let clearance = Clearance {
            secret: self.secret.as_deref(),
            now: self.now,
        };
        let mut decision = match chosen {
            None => edge::decide(&req, Found::None, clearance),
            Some((name, t)) => {
                let hit = candidates
                    .iter()
                    .find_map(|h| find_value(t, &edgestate::keys::site(h)).map(|v| (h, v)));
                match hit {
                    None => edge::decide(&req, Found::None, clearance),
                    Some((key, text)) => {
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
                        match &site {
                            Ok(site) => edge::decide(
                                &req,
                                Found::Site {
                                    key,
                                    site,
                                    suspended,
                                },
                                clearance,
                            ),
                            Err(error) => edge::decide(&req, Found::Bad { key, error }, clearance),
                        }
                    }
                }
            }
        };
        let mut reasons = pre;
        reasons.push(match &country {
            Some(c) => format!("client {client}, country {c}"),
            None if self.geoip.is_some() => format!("client {client}, country unknown"),
            None => format!("client {client} (no --geoip: country unknown)"),
        });
        if let Some((name, _)) = chosen {
            reasons.push(format!("documents of node {name}"));
        }
        reasons.append(&mut decision.reasons);
        decision.reasons = reasons;
        Ok(Explained {
            decision,
            node: chosen.map(|(n, _)| n.clone()),
            client: Some(client),
            country,
        })
    }
}

/// One answer: the decision's fields, then what was looked up.
#[derive(serde::Serialize)]
struct Out<'a> {
    #[serde(flatten)]
    decision: &'a edge::Decision,
    node: Option<&'a str>,
    client_ip: Option<IpAddr>,
    country: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a serde_json::Value>,
}

fn to_json(e: &Explained, id: Option<&serde_json::Value>) -> String {
    serde_json::to_string(&Out {
        decision: &e.decision,
        node: e.node.as_deref(),
        client_ip: e.client,
        country: e.country.as_deref(),
        id,
    })
    .unwrap_or_default()
}

fn human(e: &Explained) -> String {
    use std::fmt::Write as _;
    let d = &e.decision;
    let mut s = String::new();
    for (i, r) in d.reasons.iter().enumerate() {
        let _ = writeln!(s, "  {}. {r}", i + 1);
    }
    let verdict = serde_json::to_value(d.verdict).unwrap_or_default();
    let _ = write!(
        s,
        "verdict: {} {}",
        verdict.as_str().unwrap_or_default(),
        d.status
    );
    if let Some(r) = d.reason {
        let _ = write!(s, " (X-Edgeform-Reason: {r})");
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
    s
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
            let e = ex.explain(node, &r.host, &r.url, r.ip, &r.method, &headers)?;
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
    let e = ex.explain(args.node.as_deref(), host, url, ip, &args.method, &headers)?;
    match args.format {
        ExplainFormat::Json => writeln!(out, "{}", to_json(&e, None))?,
        ExplainFormat::Human => out.write_all(human(&e).as_bytes())?,
    }
    out.flush()?;
    Ok(0)
}
