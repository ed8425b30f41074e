//! `sites/*.yaml`: origin, geo and IP lists, rules (match values, rule regexes), and the wire document.

use super::*;
use crate::model::resolved::acme_certificate_name;

pub(super) fn site(ctx: &mut Ctx<'_>, raw: &raw::Site) -> Site {
    let origins = check_origins(ctx, raw);
    let origin = origins.first().cloned().unwrap_or_default();

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
                raw.geo_mode.as_str()
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
                raw.ip_mode.as_str()
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
        check_canonical_match(ctx, &base, rule.match_type, &rule.match_value);
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
            action: rule.action.as_str().into(),
            match_type: rule.match_type.as_str().into(),
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
        check_canonical_match(ctx, &base, rule.match_type, &rule.match_value);
        let redirect = rule.action == EdgeAction::Redirect;
        if redirect {
            check_redirect_target(ctx, &base, rule);
        }
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
            action: rule.action.as_str().into(),
            match_type: rule.match_type.as_str().into(),
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

    // In file order, so `regions[i]` locates the i-th name as written.
    let regions = raw.regions.as_ref().map(|r| r.clone().into_boxed_slice());
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

    let tls = check_tls(ctx, raw);
    let rollout = raw.rollout.as_ref().map(|r| Box::new(check_rollout(r)));
    let max_body_size = raw
        .max_body_size
        .as_ref()
        .and_then(|size| check_body_size(ctx, size));
    if !raw.origin_tls_verify && !origin.starts_with("https://") {
        ctx.warning(
            "ignored-field",
            "/origin_tls_verify",
            "`origin_tls_verify` has no effect with an `http://` origin".into(),
        );
    }

    // The document's optional fields: present only when not the default.
    let tls_doc = tls.as_ref().map(Tls::doc_value);
    let https_redirect = raw.https_redirect && tls.is_some();

    Site {
        file: ctx.file.path.clone(),
        host: raw.host.clone(),
        aliases: raw.aliases.clone(),
        suspended: raw.suspended,
        regions,
        tls,
        rollout,
        doc: SiteDoc {
            origin,
            fallback_origins: origins.into_iter().skip(1).collect(),
            cached: raw.cached,
            geo_mode: raw.geo_mode.as_str().into(),
            geo_codes: geo_codes.join(","),
            ip_mode: raw.ip_mode.as_str().into(),
            ip_list: nets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            rate_mode: raw.rate_mode.as_str().into(),
            waf_mode: raw.waf_mode.as_str().into(),
            cors_mode: raw.cors_mode.as_str().into(),
            hotlink_mode: raw.hotlink_mode.as_str().into(),
            https_redirect,
            max_body_size,
            origin_tls_verify: raw.origin_tls_verify,
            skippable: Vec::new(),
            tls: tls_doc,
            cache_rules,
            edge_rules,
        }
        .marked(),
    }
}

/// `origin`, or `origins` (one scheme, no duplicates, at most
/// [`MAX_ORIGINS`]): each checked as a URL and a target. The origins in
/// order (empty when neither is given, which is an error).
fn check_origins(ctx: &mut Ctx<'_>, raw: &raw::Site) -> Vec<String> {
    let list: Vec<(String, &String)> = match (&raw.origin, raw.origins.as_slice()) {
        (Some(o), []) => vec![("/origin".to_owned(), o)],
        (Some(_), _) => {
            let d = ctx.error(
                "invalid-value",
                "/origins",
                "a site has `origin` or `origins`, not both".into(),
            );
            help(
                d,
                "list every origin, the first tried first, under `origins`",
            );
            return Vec::new();
        }
        (None, []) => {
            // At `origins: []` when written, else the file's start.
            let d = ctx.error(
                "missing-key",
                "/origins",
                "a site needs `origin` (or a non-empty `origins` list)".into(),
            );
            help(d, "e.g. `origin: https://origin.example.com`");
            return Vec::new();
        }
        (None, list) => list
            .iter()
            .enumerate()
            .map(|(i, o)| (format!("/origins/{i}"), o))
            .collect(),
    };
    if list.len() > MAX_ORIGINS {
        let d = ctx.error(
            "too-many-origins",
            &format!("/origins/{MAX_ORIGINS}"),
            format!(
                "{} origins: the edge tries at most {MAX_ORIGINS} for one request",
                list.len()
            ),
        );
        help(d, "keep the first few in the order they should be tried");
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for (pointer, o) in &list {
        check_url(ctx, pointer, o, &["http", "https"], true);
        check_target(ctx, pointer, o, raw.loopback, "site");
        if out.contains(o) {
            ctx.error(
                "duplicate-value",
                pointer,
                format!("`{o}` is listed twice: it would be tried twice"),
            );
            continue;
        }
        if let Some(first) = out.first()
            && scheme_of(first) != scheme_of(o)
        {
            let d = ctx.error(
                "mixed-origin-schemes",
                pointer,
                format!(
                    "`{o}` is not of the first origin's scheme (`{}://`)",
                    scheme_of(first)
                ),
            );
            help(
                d,
                "the edge proxies a request with one scheme, whichever origin answers: \
                 list only http:// or only https:// origins",
            );
            continue;
        }
        out.push((*o).clone());
    }
    out.truncate(MAX_ORIGINS);
    out
}

fn scheme_of(url: &str) -> &str {
    url.split_once("://").map_or("", |(s, _)| s)
}

pub(super) fn check_match(ctx: &mut Ctx<'_>, base: &str, kind: MatchType, value: &str) {
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
                    kind.as_str()
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

/// The edge matches the normalised path only (docs/edge.md): a `prefix` or
/// `exact` value that is not in that form never matches anything.
fn check_canonical_match(ctx: &mut Ctx<'_>, base: &str, kind: MatchType, value: &str) {
    if !matches!(kind, MatchType::Prefix | MatchType::Exact) || !value.starts_with('/') {
        return;
    }
    match edgestate::edge::norm::canonical_path(value) {
        Ok(c) if c == value => {}
        Ok(c) => {
            let d = ctx.warning(
                "non-canonical-match",
                &format!("{base}/match_value"),
                format!(
                    "`{value}` is not a normalised path: the edge matches `{c}` instead and \
                     never sees `{value}`"
                ),
            );
            help(d, format!("write `{c}`"));
        }
        Err(e) => {
            ctx.warning(
                "non-canonical-match",
                &format!("{base}/match_value"),
                format!(
                    "`{value}`: {}: the edge refuses such a path, so it never matches",
                    e.describe()
                ),
            );
        }
    }
}

/// A redirect whose `Location` can leave the site's host: a scheme-relative
/// or user-info target, or a prefix without a trailing `/` continuing a
/// target that is only a host (`/shop` → `https://shop.example`:
/// `/shop@evil.example` would read as user-info; the edge inserts a `/`).
fn check_redirect_target(ctx: &mut Ctx<'_>, base: &str, rule: &raw::EdgeRule) {
    let to = rule.redirect_to.as_deref().unwrap_or("/");
    let pointer = format!("{base}/redirect_to");
    if to.starts_with("//") || to.starts_with('\\') || to.starts_with("/\\") {
        let d = ctx.warning(
            "open-redirect",
            &pointer,
            format!("`{to}` is a scheme-relative location: browsers go to the host it names"),
        );
        help(
            d,
            "write the full URL (`https://host/path`) or a path with one leading `/`",
        );
        return;
    }
    let authority = to
        .split_once("://")
        .map(|(_, after)| after.split(['/', '?', '#']).next().unwrap_or_default());
    if let Some(authority) = authority {
        if authority.contains('@') {
            let d = ctx.warning(
                "open-redirect",
                &pointer,
                format!("`{to}` carries user-info: browsers go to the host after `@`"),
            );
            help(d, "remove the part up to `@`");
            return;
        }
        let only_host = !to
            .split_once("://")
            .is_some_and(|(_, after)| after.contains(['/', '?', '#']));
        if matches!(rule.match_type, MatchType::Prefix)
            && !rule.match_value.ends_with('/')
            && only_host
        {
            let d = ctx.warning(
                "open-redirect",
                &format!("{base}/match_value"),
                format!(
                    "prefix `{}` without a trailing `/` continues `{to}` with the rest of the \
                     path: `{}@evil.example` would name another host (the edge inserts a `/`, \
                     giving `{to}/@evil.example`)",
                    rule.match_value, rule.match_value
                ),
            );
            help(
                d,
                format!("end the prefix with `/` or give the target a path: `{to}/`"),
            );
        }
    }
}

/// `tls` and `https_redirect`: one way to get a certificate, a valid name;
/// a redirect to HTTPS only where there is HTTPS.
fn check_tls(ctx: &mut Ctx<'_>, raw: &raw::Site) -> Option<Tls> {
    let tls = match &raw.tls {
        None => None,
        Some(raw::Tls {
            certificate: Some(_),
            acme: Some(_),
        }) => {
            let d = ctx.error(
                "invalid-tls",
                "/tls",
                "`tls` takes one of `certificate` and `acme`, not both".into(),
            );
            help(
                d,
                "keep `certificate: NAME` (imported) or `acme: true` (issued by the cluster's CA)",
            );
            None
        }
        Some(raw::Tls {
            acme: Some(false), ..
        }) => {
            let d = ctx.error(
                "invalid-tls",
                "/tls/acme",
                "`acme: false` says nothing: `tls` needs `certificate: NAME` or `acme: true`"
                    .into(),
            );
            help(
                d,
                "import a certificate (`edgeform certs import NAME --cert chain.pem --key key.pem`) \
                 and write `tls: {certificate: NAME}`, or write `tls: {acme: true}`",
            );
            None
        }
        Some(raw::Tls {
            acme: Some(true), ..
        }) => check_acme(ctx, raw),
        Some(raw::Tls {
            certificate: Some(name),
            acme: None,
        }) => {
            if valid_cert_name(name) {
                Some(Tls::Certificate(name.clone()))
            } else {
                // The schema's pattern already said why; no second error.
                None
            }
        }
        Some(raw::Tls {
            certificate: None,
            acme: None,
        }) => {
            let d = ctx.error(
                "invalid-tls",
                "/tls",
                "`tls` needs `certificate: NAME`".into(),
            );
            help(
                d,
                "name a certificate imported with `edgeform certs import NAME`, or remove `tls`",
            );
            None
        }
    };
    if raw.https_redirect && raw.tls.is_none() {
        let d = ctx.error(
            "redirect-without-tls",
            "/https_redirect",
            "`https_redirect: true` needs `tls`: without a certificate the site has no HTTPS \
             to redirect to"
                .into(),
        );
        help(
            d,
            "add `tls: {certificate: NAME}`, or remove `https_redirect`",
        );
    }
    tls
}

/// `tls: {acme: true}`: HTTP-01 proves one name at a time, so no wildcard
/// host or alias; the certificate's name ([`acme_certificate_name`]) must
/// be a valid one.
fn check_acme(ctx: &mut Ctx<'_>, raw: &raw::Site) -> Option<Tls> {
    let mut ok = true;
    let names = std::iter::once(("/host".to_owned(), &raw.host)).chain(
        raw.aliases
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("/aliases/{i}"), a)),
    );
    for (pointer, name) in names {
        if name.starts_with("*.") {
            ok = false;
            let d = ctx.error(
                "acme-wildcard",
                &pointer,
                format!(
                    "`{name}` is a wildcard: `tls: {{acme: true}}` validates over HTTP-01, which \
                     cannot prove a wildcard"
                ),
            );
            help(
                d,
                "list the hosts you serve instead, or import a wildcard certificate \
                 (`tls: {certificate: NAME}`)",
            );
        }
    }
    let name = acme_certificate_name(&raw.host);
    if !valid_cert_name(&name) {
        ok = false;
        ctx.error(
            "invalid-tls",
            "/tls/acme",
            format!(
                "the ACME certificate's name `{name}` is longer than 64 bytes (a host of at most \
                 59 bytes)"
            ),
        );
    }
    ok.then_some(Tls::Acme(name))
}

/// Whether `name` can name a certificate ([`raw::CERT_NAME_PATTERN`], at
/// most 64 bytes).
#[must_use]
pub fn valid_cert_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

/// `max_body_size` in bytes: at least 1, at most [`MAX_BODY_CEILING`].
fn check_body_size(ctx: &mut Ctx<'_>, size: &raw::BodySize) -> Option<u64> {
    let bytes = match size {
        raw::BodySize::Bytes(n) => Some(*n),
        raw::BodySize::Text(t) => parse_size(t),
    };
    match bytes {
        None => {
            let d = ctx.error(
                "invalid-size",
                "/max_body_size",
                format!(
                    "`{}` is not a size",
                    edgestate::untrusted::escape(match size {
                        raw::BodySize::Text(t) => t,
                        raw::BodySize::Bytes(_) => "",
                    })
                ),
            );
            help(
                d,
                "bytes, or digits with `k`, `m` or `g`: `512k`, `25m`, `1g`",
            );
            None
        }
        Some(0) => {
            ctx.error(
                "invalid-size",
                "/max_body_size",
                "`max_body_size` of 0 refuses every request with a body".into(),
            );
            None
        }
        Some(n) if n > MAX_BODY_CEILING => {
            let d = ctx.error(
                "invalid-size",
                "/max_body_size",
                format!("{n} bytes is over the edge's ceiling of 1g ({MAX_BODY_CEILING} bytes)"),
            );
            help(d, "at most `1g`");
            None
        }
        Some(n) => Some(n),
    }
}

/// An nginx size: digits, then an optional `k`/`m`/`g` (either case,
/// powers of 1024). `None`: not one, or too large to count.
#[must_use]
pub fn parse_size(text: &str) -> Option<u64> {
    let (digits, unit) = match text.as_bytes().last()? {
        b'k' | b'K' => (&text[..text.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&text[..text.len() - 1], 1 << 20),
        b'g' | b'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// `rollout:` as the control plane reads it (the schema keeps each ratio
/// from 0 to 1: `out-of-range` at its key).
fn check_rollout(raw: &raw::SiteRollout) -> SiteGate {
    SiteGate {
        min_requests: raw.min_requests,
        max_5xx_ratio_increase: raw.max_5xx_ratio_increase,
        max_refusal_ratio_increase: raw.max_refusal_ratio_increase,
        max_hit_ratio_drop: raw.max_hit_ratio_drop,
    }
}
