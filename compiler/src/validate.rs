//! Semantic validation: every rule of SPEC §1 the schemas cannot express.
//!
//! Input: the per-file results of [`crate::parse`]. Output: the resolved
//! [`Config`] when there is no error, and every diagnostic found (errors
//! and warnings), each located in its file. Nothing stops at the first
//! problem; a file that failed its schema is left out of the cross-file
//! rules rather than producing follow-on noise.
//!
//! Per-file rules run in parallel; cross-file rules (uniqueness,
//! references, coverage) run once over the collected names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use edgestate::routing::{Bucket, GeoSettings, Location};
use edgestate::site::{CacheRule, EdgeRule, SiteDoc};
use ipnet::IpNet;
use rayon::prelude::*;

use crate::country;
use crate::diagnostic::Diagnostic;
use crate::model::raw::{self, AccessMode, CacheAction, EdgeAction, MatchType, Role};
use crate::model::resolved::{
    Anycast, AnycastPrefix, CacheSettings, Cluster, Config, Mqtt, Node, RedisTarget, Site,
    Thresholds, Upstream, Zone,
};
use crate::parse::{ParsedFile, Raw};

/// Collects the diagnostics of one file.
struct Ctx<'a> {
    file: &'a ParsedFile,
    out: Vec<Diagnostic>,
}

impl<'a> Ctx<'a> {
    fn new(file: &'a ParsedFile) -> Self {
        Ctx {
            file,
            out: Vec::new(),
        }
    }

    fn error(&mut self, code: &'static str, pointer: &str, message: String) -> &mut Diagnostic {
        let span = self.file.locate(pointer);
        self.out
            .push(Diagnostic::error(code, &self.file.path, span, message));
        self.out.last_mut().expect("just pushed")
    }

    fn warning(&mut self, code: &'static str, pointer: &str, message: String) -> &mut Diagnostic {
        let span = self.file.locate(pointer);
        self.out
            .push(Diagnostic::warning(code, &self.file.path, span, message));
        self.out.last_mut().expect("just pushed")
    }
}

fn help(d: &mut Diagnostic, text: impl Into<String>) {
    d.help = Some(text.into());
}

/// Validate every parsed file together.
#[must_use]
pub fn validate(files: &[ParsedFile]) -> (Option<Config>, Vec<Diagnostic>) {
    let mut diagnostics: Vec<Diagnostic> = files
        .iter()
        .flat_map(|f| f.diagnostics.iter().cloned())
        .collect();

    // Per-file rules (sites in parallel: there may be 100,000 of them).
    let cluster = files
        .iter()
        .find_map(|f| match &f.raw {
            Some(Raw::Cluster(raw)) => Some(per_file(f, raw, cluster, &mut diagnostics).0),
            _ => None,
        })
        .unwrap_or_else(cluster_defaults);
    let sites: Vec<(Site, Vec<Diagnostic>, &ParsedFile)> = files
        .par_iter()
        .filter_map(|f| match &f.raw {
            Some(Raw::Site(raw)) => {
                let mut ctx = Ctx::new(f);
                Some((site(&mut ctx, raw), ctx.out, f))
            }
            _ => None,
        })
        .collect();
    let sites: Vec<(Site, &ParsedFile)> = sites
        .into_iter()
        .map(|(s, mut d, f)| {
            diagnostics.append(&mut d);
            (s, f)
        })
        .collect();
    let zones: Vec<(Zone, &ParsedFile)> = files
        .iter()
        .filter_map(|f| match &f.raw {
            Some(Raw::Zone(raw)) => Some(per_file(f, raw, zone, &mut diagnostics)),
            _ => None,
        })
        .collect();
    let nodes: Vec<(Node, &ParsedFile)> = files
        .iter()
        .filter_map(|f| match &f.raw {
            Some(Raw::Node(raw)) => Some(per_file(f, raw, node, &mut diagnostics)),
            _ => None,
        })
        .collect();

    // Cross-file rules. Files with per-file errors take part too, so one
    // run reports a duplicate host even in a file with a bad origin.
    unique_hosts(&sites, &mut diagnostics);
    let zone_names = unique_zones(&zones, &mut diagnostics);
    unique_nodes(&nodes, &mut diagnostics);
    references(&sites, &zones, &nodes, &zone_names, &mut diagnostics);
    routes(&zones, &nodes, &mut diagnostics);

    crate::diagnostic::sort(&mut diagnostics);
    let config = (!crate::diagnostic::has_errors(&diagnostics)).then(|| Config {
        cluster,
        sites: sites.into_iter().map(|(s, _)| s).collect(),
        zones: zones.into_iter().map(|(z, _)| z).collect(),
        nodes: nodes.into_iter().map(|(n, _)| n).collect(),
    });
    (config, diagnostics)
}

/// Run one per-file rule set, moving its diagnostics into `out`.
fn per_file<'a, R, T>(
    file: &'a ParsedFile,
    raw: &R,
    rule: fn(&mut Ctx<'_>, &R) -> T,
    out: &mut Vec<Diagnostic>,
) -> (T, &'a ParsedFile) {
    let mut ctx = Ctx::new(file);
    let value = rule(&mut ctx, raw);
    out.append(&mut ctx.out);
    (value, file)
}

// ---------------------------------------------------------------- networks

enum NetError {
    Invalid,
    HostBits(IpNet),
}

/// A CIDR with host bits clear; a bare address is a host route (/32, /128).
fn parse_net(text: &str) -> Result<IpNet, NetError> {
    let net: IpNet = match text.parse() {
        Ok(n) => n,
        Err(_) => match text.parse::<IpAddr>() {
            Ok(addr) => IpNet::from(addr),
            Err(_) => return Err(NetError::Invalid),
        },
    };
    if net.trunc() == net {
        Ok(net)
    } else {
        Err(NetError::HostBits(net.trunc()))
    }
}

fn check_nets(ctx: &mut Ctx<'_>, field: &str, list: &[String]) -> Vec<IpNet> {
    let mut out = Vec::with_capacity(list.len());
    let mut seen: HashMap<IpNet, usize> = HashMap::new();
    for (i, text) in list.iter().enumerate() {
        let pointer = format!("/{field}/{i}");
        match parse_net(text.trim()) {
            Ok(net) => {
                if let Some(first) = seen.insert(net, i) {
                    ctx.error(
                        if field == "routes" {
                            "duplicate-route"
                        } else {
                            "duplicate-value"
                        },
                        &pointer,
                        format!("`{net}` is listed twice in `{field}` (also item {first})"),
                    );
                }
                out.push(net);
            }
            Err(NetError::Invalid) => {
                let d = ctx.error(
                    "invalid-cidr",
                    &pointer,
                    format!("`{text}` is not an IPv4 or IPv6 network"),
                );
                help(
                    d,
                    "write a CIDR such as `198.51.100.0/24` or `2001:db8::/32`",
                );
            }
            Err(NetError::HostBits(network)) => {
                let d = ctx.error(
                    "cidr-host-bits",
                    &pointer,
                    format!("`{text}` has host bits set; the network is `{network}`"),
                );
                help(
                    d,
                    format!("write `{network}`, or a longer prefix if you meant a host"),
                );
            }
        }
    }
    out
}

// ------------------------------------------------------------------- URLs

/// Query parameters that carry a secret (`redis://h?password=…`).
fn secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth", "key"]
        .iter()
        .any(|s| name.contains(s))
}

/// `text` for a message: control characters escaped, user-info and
/// secret query values replaced by `…`. Works on the text as written, so
/// nothing a lenient parser would drop or add can hide a secret.
fn shown(text: &str) -> String {
    let (scheme, rest) = text
        .find("://")
        .map_or(("", text), |i| (&text[..i + 3], &text[i + 3..]));
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let authority = match authority.rfind('@') {
        Some(i) => format!("…@{}", &authority[i + 1..]),
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = query
                .split_once('#')
                .map_or((query, None), |(q, f)| (q, Some(f)));
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if secret_param(k) => format!("{k}=…"),
                    _ => pair.to_owned(),
                })
                .collect();
            let mut t = format!("{path}?{}", pairs.join("&"));
            if let Some(f) = fragment {
                t.push('#');
                t.push_str(f);
            }
            t
        }
        None => tail.to_owned(),
    };
    let mut out = String::new();
    for c in format!("{scheme}{authority}{tail}").chars() {
        if c.is_control() || c.is_whitespace() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Checks a URL as written, then as parsed: no control, whitespace or
/// backslash characters, no user-info, no secret query parameter, a host,
/// one of `schemes`; with `bare`, no path/query/fragment either; a Redis
/// URL's path is a database number.
fn check_url(ctx: &mut Ctx<'_>, pointer: &str, text: &str, schemes: &[&str], bare: bool) {
    if let Some((i, c)) = text
        .chars()
        .enumerate()
        .find(|&(_, c)| c.is_control() || c.is_whitespace() || c == '\\')
    {
        let what = match c {
            '\r' => "a carriage return (CR)".to_owned(),
            '\n' => "a line feed (LF)".to_owned(),
            '\0' => "a NUL".to_owned(),
            '\t' => "a tab".to_owned(),
            '\\' => "a backslash".to_owned(),
            ' ' => "a space".to_owned(),
            c if c.is_control() => format!("the control character U+{:04X}", u32::from(c)),
            c => format!("the whitespace U+{:04X}", u32::from(c)),
        };
        let d = ctx.error(
            "invalid-url",
            pointer,
            format!(
                "`{}` contains {what} (character {}); URLs are checked as written",
                shown(text),
                i + 1
            ),
        );
        help(d, "remove it: it would be sent to the edge as it is");
        return;
    }
    let after_scheme = &text[text.find("://").map_or(0, |i| i + 3)..];
    let authority = &after_scheme[..after_scheme
        .find(['/', '?', '#'])
        .unwrap_or(after_scheme.len())];
    let userinfo = authority.rfind('@').map(|i| &authority[..i]);
    let query = text
        .split_once('?')
        .map(|(_, q)| q.split_once('#').map_or(q, |(q, _)| q));
    let secret_value = query.and_then(|q| {
        q.split('&').find_map(|pair| {
            pair.split_once('=')
                .filter(|(k, v)| secret_param(k) && !v.is_empty())
                .map(|(_, v)| v)
        })
    });
    if let Some(secret) = userinfo.or(secret_value) {
        let d = ctx.error(
            "inline-secret",
            pointer,
            format!(
                "`{}` carries credentials; secrets never live in the repository",
                shown(text)
            ),
        );
        help(
            d,
            "remove them from the URL and name an environment variable in `password_env`",
        );
        if !secret.is_empty() {
            d.secret = Some(secret.to_owned());
        }
        return;
    }
    let url = match url::Url::parse(text) {
        Ok(u) => u,
        Err(e) => {
            ctx.error(
                "invalid-url",
                pointer,
                format!("`{}` is not a valid URL: {e}", shown(text)),
            );
            return;
        }
    };
    if !schemes.contains(&url.scheme()) {
        ctx.error(
            "invalid-url",
            pointer,
            format!(
                "`{}`: the scheme must be {}",
                shown(text),
                schemes.join(" or ")
            ),
        );
        return;
    }
    if url.host_str().is_none_or(str::is_empty) {
        ctx.error(
            "invalid-url",
            pointer,
            format!("`{}` has no host", shown(text)),
        );
        return;
    }
    let rest = &after_scheme[authority.len()..];
    if bare && !rest.is_empty() {
        // The raw text after the authority must be empty: `url` would
        // report a path of "/" for both `http://a` and `http://a/`.
        let d = ctx.error(
            "invalid-url",
            pointer,
            format!(
                "`{}` has a path, query or fragment (`{}`)",
                shown(text),
                shown(rest)
            ),
        );
        help(
            d,
            "an origin is scheme://host[:port] only; the request path is appended",
        );
        return;
    }
    if matches!(url.scheme(), "redis" | "rediss") {
        let path = rest.split(['?', '#']).next().unwrap_or_default();
        let db = path.strip_prefix('/').unwrap_or(path);
        let number = db.len() <= 5 && db.bytes().all(|b| b.is_ascii_digit());
        if !db.is_empty() && !number {
            let d = ctx.error(
                "invalid-url",
                pointer,
                format!(
                    "`{}`: the path must be a database number, not `{}`",
                    shown(text),
                    shown(db)
                ),
            );
            help(
                d,
                "e.g. `redis://10.0.0.5:6379/0`, or no path for database 0",
            );
        }
    }
}

// ------------------------------------------------------------------ sites

fn site(ctx: &mut Ctx<'_>, raw: &raw::Site) -> Site {
    check_url(ctx, "/origin", &raw.origin, &["http", "https"], true);

    let mut geo_codes = Vec::with_capacity(raw.geo_codes.len());
    for (i, code) in raw.geo_codes.iter().enumerate() {
        if !country::is_assigned(code) {
            let d = ctx.error(
                "invalid-country",
                &format!("/geo_codes/{i}"),
                format!("`{code}` is not an assigned ISO 3166-1 alpha-2 country code"),
            );
            if code == "UK" {
                help(d, "the United Kingdom is `GB`");
            }
        } else if geo_codes.contains(code) {
            ctx.warning(
                "duplicate-value",
                &format!("/geo_codes/{i}"),
                format!("`{code}` is listed twice"),
            );
        } else {
            geo_codes.push(code.clone());
        }
    }
    if raw.geo_mode != AccessMode::Off && raw.geo_codes.is_empty() {
        let d = ctx.error(
            "missing-list",
            "/geo_mode",
            format!(
                "`geo_mode: {}` needs a non-empty `geo_codes`",
                mode_name(raw.geo_mode)
            ),
        );
        help(d, "list the countries, or set `geo_mode: off`");
    }
    if raw.geo_mode == AccessMode::Off && !raw.geo_codes.is_empty() {
        ctx.warning(
            "ignored-field",
            "/geo_codes",
            "`geo_codes` has no effect while `geo_mode` is `off`".into(),
        );
    }

    let nets = check_nets(ctx, "ip_list", &raw.ip_list);
    if raw.ip_mode != AccessMode::Off && raw.ip_list.is_empty() {
        let d = ctx.error(
            "missing-list",
            "/ip_mode",
            format!(
                "`ip_mode: {}` needs a non-empty `ip_list`",
                mode_name(raw.ip_mode)
            ),
        );
        help(d, "list the networks, or set `ip_mode: off`");
    }
    if raw.ip_mode == AccessMode::Off && !raw.ip_list.is_empty() {
        ctx.warning(
            "ignored-field",
            "/ip_list",
            "`ip_list` has no effect while `ip_mode` is `off`".into(),
        );
    }

    let mut cache_rules = Vec::with_capacity(raw.cache_rules.len());
    for (i, rule) in raw.cache_rules.iter().enumerate() {
        let base = format!("/cache_rules/{i}");
        check_match(ctx, &base, rule.match_type, &rule.match_value);
        match (rule.action, rule.ttl) {
            (CacheAction::Ttl, None) => {
                let d = ctx.error(
                    "missing-ttl",
                    &format!("{base}/action"),
                    "a cache rule with `action: ttl` needs `ttl` (seconds)".into(),
                );
                help(d, "add e.g. `ttl: 86400`, or use `action: bypass`");
            }
            (CacheAction::Bypass, Some(_)) => {
                ctx.warning(
                    "ignored-field",
                    &format!("{base}/ttl"),
                    "`ttl` has no effect with `action: bypass`".into(),
                );
            }
            _ => {}
        }
        cache_rules.push(CacheRule {
            action: match rule.action {
                CacheAction::Ttl => "ttl",
                CacheAction::Bypass => "bypass",
            }
            .into(),
            match_type: match_name(rule.match_type).into(),
            match_value: rule.match_value.clone(),
            ttl: if rule.action == CacheAction::Ttl {
                rule.ttl
            } else {
                None
            },
        });
    }

    let mut edge_rules = Vec::with_capacity(raw.edge_rules.len());
    for (i, rule) in raw.edge_rules.iter().enumerate() {
        let base = format!("/edge_rules/{i}");
        check_match(ctx, &base, rule.match_type, &rule.match_value);
        let redirect = rule.action == EdgeAction::Redirect;
        if redirect && rule.redirect_status.is_none() {
            let d = ctx.error(
                "missing-redirect-status",
                &format!("{base}/action"),
                "an edge rule with `action: redirect` needs `redirect_status`".into(),
            );
            help(d, "one of 301, 302, 307, 308");
        }
        if !redirect {
            for field in ["redirect_status", "redirect_to"] {
                let present = match field {
                    "redirect_status" => rule.redirect_status.is_some(),
                    _ => rule.redirect_to.is_some(),
                };
                if present {
                    ctx.warning(
                        "ignored-field",
                        &format!("{base}/{field}"),
                        format!("`{field}` has no effect with `action: block`"),
                    );
                }
            }
        }
        edge_rules.push(EdgeRule {
            action: if redirect { "redirect" } else { "block" }.into(),
            match_type: match_name(rule.match_type).into(),
            match_value: rule.match_value.clone(),
            redirect_status: if redirect { rule.redirect_status } else { None },
            redirect_to: if redirect {
                rule.redirect_to.clone()
            } else {
                None
            },
        });
    }

    let mut seen = BTreeSet::new();
    seen.insert(raw.host.as_str());
    for (i, alias) in raw.aliases.iter().enumerate() {
        if !seen.insert(alias.as_str()) {
            ctx.error(
                "duplicate-host",
                &format!("/aliases/{i}"),
                format!("`{alias}` is listed twice in this site"),
            );
        }
    }

    let regions = raw
        .regions
        .as_ref()
        .map(|r| r.iter().cloned().collect::<BTreeSet<_>>());
    if raw.regions.as_ref().is_some_and(Vec::is_empty) {
        let d = ctx.error(
            "invalid-value",
            "/regions",
            "`regions: []` sends the site to no edge".into(),
        );
        help(
            d,
            "remove `regions` to serve the site everywhere, or set `suspended: true`",
        );
    }

    Site {
        file: ctx.file.path.clone(),
        host: raw.host.clone(),
        aliases: raw.aliases.clone(),
        suspended: raw.suspended,
        regions,
        doc: SiteDoc {
            origin: raw.origin.clone(),
            cached: raw.cached,
            geo_mode: mode_name(raw.geo_mode).into(),
            geo_codes: geo_codes.join(","),
            ip_mode: mode_name(raw.ip_mode).into(),
            ip_list: nets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            rate_mode: serde_name(&raw.rate_mode),
            waf_mode: serde_name(&raw.waf_mode),
            cors_mode: serde_name(&raw.cors_mode),
            hotlink_mode: serde_name(&raw.hotlink_mode),
            cache_rules,
            edge_rules,
        },
    }
}

fn mode_name(mode: AccessMode) -> &'static str {
    match mode {
        AccessMode::Off => "off",
        AccessMode::Allow => "allow",
        AccessMode::Block => "block",
    }
}

fn match_name(m: MatchType) -> &'static str {
    match m {
        MatchType::Ext => "ext",
        MatchType::Prefix => "prefix",
        MatchType::Exact => "exact",
        MatchType::Regex => "regex",
    }
}

/// The lower-case name serde reads for a unit enum variant.
fn serde_name<T: std::fmt::Debug>(value: &T) -> String {
    format!("{value:?}").to_ascii_lowercase()
}

fn check_match(ctx: &mut Ctx<'_>, base: &str, kind: MatchType, value: &str) {
    let pointer = format!("{base}/match_value");
    match kind {
        MatchType::Regex => {
            // Parsing and a walk of the syntax tree are the whole check
            // (building the automaton too would cost ~100 µs per rule,
            // seconds over 100,000 sites).
            if let Err(refusal) = crate::rule_regex::check(value) {
                let d = ctx.error("invalid-regex", &pointer, format!("`{value}`: {refusal}"));
                help(
                    d,
                    "rule regexes run in the edge's PCRE: the accepted subset is in \
                     docs/configuration.md (Rust regex syntax PCRE reads alike, no nested \
                     unbounded repetition)",
                );
            }
        }
        MatchType::Prefix | MatchType::Exact if !value.starts_with('/') => {
            let d = ctx.error(
                "invalid-match-value",
                &pointer,
                format!(
                    "a `{}` match is a path and must start with `/`",
                    match_name(kind)
                ),
            );
            help(d, format!("write `/{value}`"));
        }
        MatchType::Ext if !value.starts_with('.') || value.contains('/') => {
            let d = ctx.error(
                "invalid-match-value",
                &pointer,
                format!("`{value}` is not a file extension"),
            );
            help(d, "write it with its dot, e.g. `.mp4`");
        }
        _ => {}
    }
}

// ------------------------------------------------------------------ zones

fn zone(ctx: &mut Ctx<'_>, raw: &raw::Zone) -> Zone {
    let routes = check_nets(ctx, "routes", &raw.routes);
    let fallback = match raw.fallback.as_deref() {
        None | Some("none") => None,
        Some(name) => Some(name.to_owned()),
    };
    if fallback.as_deref() == Some(raw.name.as_str()) {
        ctx.warning(
            "fallback-to-self",
            "/fallback",
            format!(
                "zone `{}` falls back to itself; the chain ends there",
                raw.name
            ),
        );
    }
    Zone {
        file: ctx.file.path.clone(),
        name: raw.name.clone(),
        routes,
        fallback,
    }
}

// ------------------------------------------------------------------ nodes

fn node(ctx: &mut Ctx<'_>, raw: &raw::Node) -> Node {
    let mut roles = BTreeSet::new();
    for (i, role) in raw.roles.iter().enumerate() {
        if !roles.insert(*role) {
            ctx.error(
                "duplicate-value",
                &format!("/roles/{i}"),
                format!("role `{}` is listed twice", serde_name(role)),
            );
        }
    }
    let needs_location = roles.contains(&Role::Edge) || roles.contains(&Role::Router);
    if needs_location && raw.location.is_none() {
        let d = ctx.error(
            "missing-location",
            "",
            format!(
                "node `{}` is an edge or router and needs `location`",
                raw.name
            ),
        );
        help(
            d,
            "add `location: {lat: 52.37, lon: 4.90}`: geo routing measures from it",
        );
    }
    let mut addresses = Vec::new();
    for (i, text) in raw.addresses.iter().enumerate() {
        match text.parse::<IpAddr>() {
            Ok(a) if addresses.contains(&a) => {
                ctx.error(
                    "duplicate-address",
                    &format!("/addresses/{i}"),
                    format!("`{a}` is listed twice"),
                );
            }
            Ok(a) => addresses.push(a),
            Err(_) => {
                ctx.error(
                    "invalid-address",
                    &format!("/addresses/{i}"),
                    format!("`{text}` is not an IPv4 or IPv6 address"),
                );
            }
        }
    }
    if let Some(url) = &raw.public_url {
        check_url(ctx, "/public_url", url, &["http", "https"], false);
    }
    let redis = raw.redis.as_ref().and_then(|r| redis(ctx, r));
    let cache = raw.cache.as_ref().map_or_else(CacheSettings::default, |c| {
        let d = CacheSettings::default();
        CacheSettings {
            dirs: c.dirs.clone().unwrap_or(d.dirs),
            levels: c.levels.clone().unwrap_or(d.levels),
            key: c.key.clone().unwrap_or(d.key),
        }
    });
    if cache.dirs.is_empty() {
        ctx.error(
            "invalid-value",
            "/cache/dirs",
            "`cache.dirs` must not be empty".into(),
        );
    }
    Node {
        file: ctx.file.path.clone(),
        name: raw.name.clone(),
        roles,
        region: raw.region.clone(),
        zone: raw.zone.clone(),
        public_url: raw.public_url.clone(),
        location: raw.location.map(|l| Location {
            lat: l.lat,
            lon: l.lon,
        }),
        addresses,
        redis,
        playback_session_limit: raw.playback_session_limit,
        playback_bandwidth_kbit: raw.playback_bandwidth_kbit,
        network_bandwidth_kbit: raw.network_bandwidth_kbit,
        drain: raw.drain,
        cache,
    }
}

fn redis(ctx: &mut Ctx<'_>, raw: &raw::Redis) -> Option<RedisTarget> {
    match (&raw.url, &raw.sentinels, &raw.master) {
        (Some(url), None, None) => {
            check_url(ctx, "/redis/url", url, &["redis", "rediss"], false);
            Some(RedisTarget::Url {
                url: url.clone(),
                password_env: raw.password_env.clone(),
            })
        }
        (None, Some(sentinels), Some(master)) => {
            if sentinels.is_empty() {
                ctx.error(
                    "invalid-redis",
                    "/redis/sentinels",
                    "`sentinels` needs at least one `host:port`".into(),
                );
            }
            for (i, s) in sentinels.iter().enumerate() {
                if let Some((userinfo, host)) = s.rsplit_once('@') {
                    let d = ctx.error(
                        "inline-secret",
                        &format!("/redis/sentinels/{i}"),
                        format!(
                            "`…@{}` carries credentials; secrets never live in the repository",
                            shown(host)
                        ),
                    );
                    help(
                        d,
                        "write `host:port` and name an environment variable in `password_env`",
                    );
                    if !userinfo.is_empty() {
                        d.secret = Some(userinfo.to_owned());
                    }
                    continue;
                }
                let ok = s
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                let ok = ok && !s.contains(|c: char| c.is_control() || c.is_whitespace());
                if !ok {
                    ctx.error(
                        "invalid-redis",
                        &format!("/redis/sentinels/{i}"),
                        format!("`{}` is not `host:port`", shown(s)),
                    );
                }
            }
            Some(RedisTarget::Sentinel {
                sentinels: sentinels.clone(),
                master: master.clone(),
                password_env: raw.password_env.clone(),
            })
        }
        _ => {
            let d = ctx.error(
                "invalid-redis",
                "/redis",
                "`redis` needs either `url`, or `sentinels` and `master`".into(),
            );
            help(d, "e.g. `redis: {url: redis://10.0.0.5:6379}`");
            None
        }
    }
}

// ---------------------------------------------------------------- cluster

fn cluster_defaults() -> Cluster {
    Cluster {
        name: "edgeform".into(),
        trusted_proxies: Vec::new(),
        mqtt: None,
        apply: Thresholds::default(),
        geo: default_geo(),
        anycast: None,
    }
}

fn default_geo() -> GeoSettings {
    GeoSettings::default()
}

pub use edgestate::parse_duration_ms;

fn cluster(ctx: &mut Ctx<'_>, raw: &raw::Cluster) -> Cluster {
    let trusted_proxies = check_nets(ctx, "trusted_proxies", &raw.trusted_proxies);
    let mqtt = raw.mqtt.as_ref().map(|m| {
        check_url(ctx, "/mqtt/url", &m.url, &["mqtt", "mqtts"], true);
        Mqtt {
            url: m.url.clone(),
            topic_prefix: m.topic_prefix.clone().unwrap_or_else(|| "edgeform".into()),
        }
    });
    let defaults = Thresholds::default();
    let apply = raw.apply.as_ref().map_or(defaults, |a| Thresholds {
        max_delete_percent: a.max_delete_percent.unwrap_or(defaults.max_delete_percent),
        max_change_percent: a.max_change_percent.unwrap_or(defaults.max_change_percent),
        min_keys: a.min_keys.unwrap_or(defaults.min_keys),
    });
    let mut geo = default_geo();
    if let Some(g) = &raw.geo {
        if let Some(t) = g.tie_km {
            geo.tie_km = t;
        }
        if let Some(buckets) = &g.buckets {
            if buckets.windows(2).any(|w| w[0].below_km >= w[1].below_km) {
                let d = ctx.error(
                    "invalid-buckets",
                    "/geo/buckets",
                    "`geo.buckets` must be in strictly increasing `below_km`".into(),
                );
                help(d, "e.g. below_km 500, 2000, 5000");
            }
            geo.buckets = buckets
                .iter()
                .map(|b| Bucket {
                    below_km: b.below_km,
                    weight: b.weight,
                })
                .collect();
        }
        if let Some(w) = g.default_weight {
            geo.default_weight = w;
        }
        if let Some(f) = g.max_fails {
            geo.max_fails = f;
        }
        if let Some(t) = &g.fail_timeout {
            match parse_duration_ms(t) {
                Some(ms) if ms % 1000 == 0 => geo.fail_timeout_s = ms / 1000,
                _ => {
                    ctx.error(
                        "invalid-value",
                        "/geo/fail_timeout",
                        format!("`{t}` is not a whole number of seconds (nginx `fail_timeout`)"),
                    );
                }
            }
        }
    }
    let anycast = raw.anycast.as_ref().map(|a| anycast(ctx, a));
    Cluster {
        name: raw.name.clone().unwrap_or_else(|| "edgeform".into()),
        trusted_proxies,
        mqtt,
        apply,
        geo,
        anycast,
    }
}

/// AS numbers that never appear as a real AS: 0 (RFC 7607), `AS_TRANS`
/// 23456 (RFC 6793), and the last of each range, 65535 and 4294967295
/// (RFC 7300).
const RESERVED_ASNS: [u32; 4] = [0, 23_456, 65_535, u32::MAX];

fn check_asn(ctx: &mut Ctx<'_>, pointer: &str, asn: u32) {
    if RESERVED_ASNS.contains(&asn) {
        let d = ctx.error(
            "invalid-asn",
            pointer,
            format!("AS{asn} is reserved and never a real AS"),
        );
        help(
            d,
            "write the AS number you exchange routes with, e.g. 64496",
        );
    }
}

fn anycast(ctx: &mut Ctx<'_>, raw: &raw::Anycast) -> Anycast {
    for (i, &asn) in raw.origin_asns.iter().enumerate() {
        check_asn(ctx, &format!("/anycast/origin_asns/{i}"), asn);
        if raw.origin_asns[..i].contains(&asn) {
            ctx.error(
                "duplicate-value",
                &format!("/anycast/origin_asns/{i}"),
                format!("AS{asn} is listed twice in `origin_asns`"),
            );
        }
    }
    let mut upstreams: Vec<Upstream> = Vec::with_capacity(raw.upstreams.len());
    for (i, u) in raw.upstreams.iter().enumerate() {
        let base = format!("/anycast/upstreams/{i}");
        check_asn(ctx, &format!("{base}/asn"), u.asn);
        if let Some(j) = upstreams.iter().position(|o| o.name == u.name) {
            ctx.error(
                "duplicate-value",
                &format!("{base}/name"),
                format!("upstream `{}` is named twice (also item {j})", u.name),
            );
        }
        if let Some(j) = upstreams.iter().position(|o| o.asn == u.asn) {
            ctx.error(
                "duplicate-value",
                &format!("{base}/asn"),
                format!("AS{} is listed twice in `upstreams` (also item {j})", u.asn),
            );
        }
        if raw.origin_asns.contains(&u.asn) {
            let d = ctx.error(
                "invalid-asn",
                &format!("{base}/asn"),
                format!("AS{} is one of your `origin_asns`, not an upstream", u.asn),
            );
            help(
                d,
                "an upstream is the provider's AS, the one your routers peer with",
            );
        }
        upstreams.push(Upstream {
            name: u.name.clone(),
            asn: u.asn,
        });
    }
    let mut prefixes: Vec<AnycastPrefix> = Vec::with_capacity(raw.prefixes.len());
    for (i, p) in raw.prefixes.iter().enumerate() {
        let base = format!("/anycast/prefixes/{i}");
        let prefix = match parse_net(p.prefix.trim()) {
            Ok(net) => net,
            Err(NetError::Invalid) => {
                let d = ctx.error(
                    "invalid-cidr",
                    &format!("{base}/prefix"),
                    format!("`{}` is not an IPv4 or IPv6 network", p.prefix),
                );
                help(d, "write a CIDR such as `192.0.2.0/24` or `2001:db8::/32`");
                continue;
            }
            Err(NetError::HostBits(network)) => {
                let d = ctx.error(
                    "cidr-host-bits",
                    &format!("{base}/prefix"),
                    format!(
                        "`{}` has host bits set; the network is `{network}`",
                        p.prefix
                    ),
                );
                help(d, format!("write `{network}`"));
                continue;
            }
        };
        if let Some(j) = raw.prefixes[..i]
            .iter()
            .position(|o| parse_net(o.prefix.trim()).ok() == Some(prefix))
        {
            ctx.error(
                "duplicate-value",
                &format!("{base}/prefix"),
                format!("`{prefix}` is listed twice in `anycast.prefixes` (also item {j})"),
            );
        }
        if let Some(name) = &p.name
            && let Some(j) = raw.prefixes[..i]
                .iter()
                .position(|o| o.name.as_ref() == Some(name))
        {
            ctx.error(
                "duplicate-value",
                &format!("{base}/name"),
                format!("prefix name `{name}` is used twice (also item {j})"),
            );
        }
        let mut wanted = Vec::new();
        match &p.upstreams {
            None => wanted.extend(0..upstreams.len()),
            Some(names) => {
                for (k, name) in names.iter().enumerate() {
                    let pointer = format!("{base}/upstreams/{k}");
                    match upstreams.iter().position(|u| &u.name == name) {
                        Some(idx) if wanted.contains(&idx) => {
                            ctx.error(
                                "duplicate-value",
                                &pointer,
                                format!("upstream `{name}` is listed twice"),
                            );
                        }
                        Some(idx) => wanted.push(idx),
                        None => {
                            let known = || upstreams.iter().map(|u| u.name.as_str());
                            let hint = match crate::parse::suggest(name, known()) {
                                Some(s) => format!("did you mean `{s}`?"),
                                None => format!(
                                    "known upstreams: {}",
                                    known().collect::<Vec<_>>().join(", ")
                                ),
                            };
                            let d = ctx.error(
                                "unknown-upstream",
                                &pointer,
                                format!("`{name}` names no entry of `anycast.upstreams`"),
                            );
                            help(d, hint);
                        }
                    }
                }
                wanted.sort_unstable();
            }
        }
        prefixes.push(AnycastPrefix {
            prefix,
            name: p.name.clone().unwrap_or_else(|| prefix.to_string()),
            upstreams: wanted,
        });
    }
    Anycast {
        origin_asns: raw.origin_asns.clone(),
        prefixes,
        upstreams,
        lopsided_share: raw.lopsided_share.unwrap_or(0.8),
        longer_path_hops: raw.longer_path_hops.unwrap_or(1.0),
    }
}

// ----------------------------------------------------------- cross-file

fn located(file: &ParsedFile, pointer: &str) -> String {
    let s = file.locate(pointer);
    format!("{}:{}:{}", file.path, s.line, s.column)
}

fn unique_hosts(sites: &[(Site, &ParsedFile)], out: &mut Vec<Diagnostic>) {
    let mut seen: HashMap<&str, (&ParsedFile, String)> = HashMap::with_capacity(sites.len());
    for (site, file) in sites {
        let names = std::iter::once(("/host".to_owned(), site.host.as_str())).chain(
            site.aliases
                .iter()
                .enumerate()
                .map(|(i, a)| (format!("/aliases/{i}"), a.as_str())),
        );
        for (pointer, name) in names {
            if let Some((first, first_pointer)) = seen.get(name) {
                if std::ptr::eq(*first, *file) {
                    continue; // reported by the per-file rule
                }
                out.push(
                    Diagnostic::error(
                        "duplicate-host",
                        &file.path,
                        file.locate(&pointer),
                        format!(
                            "host `{name}` is already served by {}",
                            located(first, first_pointer)
                        ),
                    )
                    .with_help("a hostname (host or alias) may belong to one site only"),
                );
            } else {
                seen.insert(name, (file, pointer));
            }
        }
    }
}

fn unique_zones<'a>(
    zones: &'a [(Zone, &ParsedFile)],
    out: &mut Vec<Diagnostic>,
) -> BTreeSet<&'a str> {
    let mut seen: BTreeMap<&str, &ParsedFile> = BTreeMap::new();
    for (zone, file) in zones {
        if let Some(first) = seen.get(zone.name.as_str()) {
            out.push(Diagnostic::error(
                "duplicate-zone",
                &file.path,
                file.locate("/name"),
                format!(
                    "zone `{}` is already defined in {}",
                    zone.name,
                    located(first, "/name")
                ),
            ));
        } else {
            seen.insert(&zone.name, file);
        }
    }
    seen.into_keys().collect()
}

fn unique_nodes(nodes: &[(Node, &ParsedFile)], out: &mut Vec<Diagnostic>) {
    let mut seen: BTreeMap<&str, &ParsedFile> = BTreeMap::new();
    let mut addresses: HashMap<IpAddr, (&str, &ParsedFile, usize)> = HashMap::new();
    for (node, file) in nodes {
        if let Some(first) = seen.get(node.name.as_str()) {
            out.push(Diagnostic::error(
                "duplicate-node",
                &file.path,
                file.locate("/name"),
                format!(
                    "node `{}` is already defined in {}",
                    node.name,
                    located(first, "/name")
                ),
            ));
        } else {
            seen.insert(&node.name, file);
        }
        for (i, addr) in node.addresses.iter().enumerate() {
            if let Some((other, other_file, j)) = addresses.get(addr) {
                out.push(Diagnostic::error(
                    "duplicate-address",
                    &file.path,
                    file.locate(&format!("/addresses/{i}")),
                    format!(
                        "address `{addr}` also belongs to node `{other}` ({})",
                        located(other_file, &format!("/addresses/{j}"))
                    ),
                ));
            } else {
                addresses.insert(*addr, (&node.name, file, i));
            }
        }
    }
}

fn references(
    sites: &[(Site, &ParsedFile)],
    zones: &[(Zone, &ParsedFile)],
    nodes: &[(Node, &ParsedFile)],
    zone_names: &BTreeSet<&str>,
    out: &mut Vec<Diagnostic>,
) {
    let unknown_zone = |name: &str, file: &ParsedFile, pointer: &str, what: &str| {
        let mut d = Diagnostic::error(
            "unknown-zone",
            &file.path,
            file.locate(pointer),
            format!("{what} `{name}` names no zone"),
        );
        let known: Vec<&str> = zone_names.iter().copied().collect();
        d.help = Some(match crate::parse::suggest(name, known.iter().copied()) {
            Some(s) => format!("did you mean `{s}`?"),
            None if known.is_empty() => "no zones are defined (zones/*.yaml)".into(),
            None => format!("known zones: {}", known.join(", ")),
        });
        d
    };
    for (zone, file) in zones {
        if let Some(f) = &zone.fallback
            && !zone_names.contains(f.as_str())
        {
            out.push(unknown_zone(f, file, "/fallback", "fallback"));
        }
    }
    let regions: BTreeSet<&str> = nodes.iter().map(|(n, _)| n.region.as_str()).collect();
    for (node, file) in nodes {
        if let Some(z) = &node.zone
            && !zone_names.contains(z.as_str())
        {
            out.push(unknown_zone(z, file, "/zone", "zone"));
        }
    }
    for (site, file) in sites {
        let Some(wanted) = &site.regions else {
            continue;
        };
        for (i, region) in wanted.iter().enumerate() {
            if !regions.contains(region.as_str()) {
                let known: Vec<&str> = regions.iter().copied().collect();
                let mut d = Diagnostic::error(
                    "unknown-region",
                    &file.path,
                    file.locate(&format!("/regions/{i}")),
                    format!("region `{region}` has no node"),
                );
                d.help = Some(match crate::parse::suggest(region, known.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("regions with nodes: {}", known.join(", ")),
                });
                out.push(d);
            }
        }
    }
    // Operator hints.
    let has_router = nodes.iter().any(|(n, _)| n.has(Role::Router));
    for (node, file) in nodes {
        if node.has(Role::Edge) && node.redis.is_none() {
            out.push(
                Diagnostic::warning(
                    "edge-without-redis",
                    &file.path,
                    file.locate("/name"),
                    format!(
                        "edge `{}` has no `redis` block, so it receives no sites",
                        node.name
                    ),
                )
                .with_help("every edge reads its sites from its own Redis; add `redis`"),
            );
        }
        if has_router && node.has(Role::Edge) && node.addresses.is_empty() {
            out.push(Diagnostic::warning(
                "edge-without-address",
                &file.path,
                file.locate("/name"),
                format!(
                    "edge `{}` has no `addresses`, so no router pool includes it",
                    node.name
                ),
            ));
        }
    }
}

/// Whether the union of `nets` covers its whole address family.
fn covers_all(nets: &[IpNet], v4: bool) -> bool {
    let family: Vec<IpNet> = nets
        .iter()
        .filter(|n| matches!(n, IpNet::V4(_)) == v4)
        .copied()
        .collect();
    if family.iter().any(|n| n.prefix_len() == 0) {
        return true;
    }
    let merged = IpNet::aggregate(&family);
    merged.iter().any(|n| n.prefix_len() == 0)
}

fn routes(zones: &[(Zone, &ParsedFile)], nodes: &[(Node, &ParsedFile)], out: &mut Vec<Diagnostic>) {
    let mut owner: HashMap<IpNet, (&str, &ParsedFile, usize)> = HashMap::new();
    let mut all = Vec::new();
    for (zone, file) in zones {
        for (i, net) in zone.routes.iter().enumerate() {
            all.push(*net);
            if let Some((other, other_file, j)) = owner.get(net) {
                if *other != zone.name {
                    out.push(Diagnostic::error(
                        "duplicate-route",
                        &file.path,
                        file.locate(&format!("/routes/{i}")),
                        format!(
                            "route `{net}` is already in zone `{other}` ({})",
                            located(other_file, &format!("/routes/{j}"))
                        ),
                    )
                    .with_help("a prefix may belong to one zone only; the longest prefix wins, so use a more specific one"));
                }
            } else {
                owner.insert(*net, (&zone.name, file, i));
            }
        }
    }
    if all.is_empty() {
        return; // unrestricted routing: no coverage rules apply
    }
    let first_route_file = zones
        .iter()
        .find(|(z, _)| !z.routes.is_empty())
        .map(|(_, f)| *f);
    for (v4, all_net) in [(true, "0.0.0.0/0"), (false, "::/0")] {
        if !covers_all(&all, v4) {
            let file = first_route_file.expect("routes exist");
            out.push(
                Diagnostic::warning(
                    "uncovered-default-route",
                    &file.path,
                    file.locate("/routes"),
                    format!(
                        "routing is restricted but `{all_net}` is not covered: {} viewers outside \
                         every route are refused",
                        if v4 { "IPv4" } else { "IPv6" }
                    ),
                )
                .with_help(format!("add `{all_net}` to a catch-all zone's routes")),
            );
        }
    }
    let zoned: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|(n, _)| n.zone.as_deref())
        .collect();
    for (zone, file) in zones {
        if !zone.routes.is_empty() && !zoned.contains(zone.name.as_str()) {
            out.push(
                Diagnostic::warning(
                    "empty-zone",
                    &file.path,
                    file.locate("/name"),
                    format!("zone `{}` has routes but no nodes: its viewers go straight to its fallback", zone.name),
                )
                .with_help("set `zone:` on the nodes that should serve it"),
            );
        }
    }
    for (node, file) in nodes {
        let plays = [Role::Edge, Role::Ingest, Role::Origin]
            .iter()
            .any(|r| node.has(*r));
        if plays && node.zone.is_none() {
            out.push(
                Diagnostic::warning(
                    "unzoned-node",
                    &file.path,
                    file.locate("/name"),
                    format!("node `{}` is in no zone while routing is restricted: it can never serve playback", node.name),
                )
                .with_help("set `zone:` on the node, or remove every zone route"),
            );
        }
    }
}
