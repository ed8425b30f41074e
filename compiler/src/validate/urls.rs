//! URLs as written: control characters, user-info and secrets, schemes, Redis database paths.

use super::*;

/// Query parameters that carry a secret (`redis://h?password=…`).
pub(super) fn secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth", "key"]
        .iter()
        .any(|s| name.contains(s))
}

/// `text` for a message: control characters escaped, user-info and
/// secret query values replaced by `…`. Works on the text as written, so
/// nothing a lenient parser would drop or add can hide a secret.
pub(super) fn shown(text: &str) -> String {
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
pub(super) fn check_url(
    ctx: &mut Ctx<'_>,
    pointer: &str,
    text: &str,
    schemes: &[&str],
    bare: bool,
) {
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
    if let Some(why) = host_as_written(authority, &url) {
        ctx.error("invalid-url", pointer, format!("`{}`: {why}", shown(text)));
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

/// Why the host written in `authority` (no user info: refused before) is
/// not one the edge can use as it is: the URL parser would read the name
/// as another (percent-encoded, an IDN: what the edge sends is the text
/// as written), or a name past DNS's lengths (253 characters, labels of 1
/// to 63), which would also repeat in every document naming it. An IP
/// address is `non-canonical-address`'s. Pure.
fn host_as_written(authority: &str, url: &url::Url) -> Option<String> {
    // An address written in another form is `non-canonical-address`'s.
    let Some(url::Host::Domain(parsed)) = url.host() else {
        return None;
    };
    let written = if authority.starts_with('[') {
        authority.find(']').map_or(authority, |i| &authority[..=i])
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    // A scheme the parser does not know (redis, mqtt) keeps its host
    // as written, escapes and Unicode included: refused the same.
    if !parsed
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return Some(format!(
            "the host `{}` is not an ASCII name (letters, digits, `-`, `_`, `.`): write a \
             Unicode name in its `xn--` form, without %-escapes",
            shown(written)
        ));
    }
    if !written.eq_ignore_ascii_case(parsed) {
        let (w, p) = (shown(written), shown(parsed));
        return Some(format!(
            "the host `{w}` is read as `{p}`; write it as `{p}` (the edge uses the text as written)"
        ));
    }
    let name = parsed.strip_suffix('.').unwrap_or(parsed);
    if name.split('.').any(str::is_empty) {
        return Some(format!("the host `{}` has an empty label", shown(written)));
    }
    if name.len() > 253 || name.split('.').any(|l| l.len() > 63) {
        return Some(format!(
            "the host name is {} characters with labels of {}; DNS allows 253, labels of 1 to 63",
            name.len(),
            name.split('.').map(str::len).max().unwrap_or(0)
        ));
    }
    None
}

/// What kind of internal address `ip` is, if any: where an edge or a
/// router connecting to it reaches its own host, not an origin or a node.
pub(super) fn internal(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    };
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("a loopback")
            } else if o[0] == 0 {
                Some("an unspecified (`0.0.0.0/8`)")
            } else if a == std::net::Ipv4Addr::new(169, 254, 169, 254) {
                Some("the cloud metadata service's")
            } else if a.is_link_local() {
                Some("a link-local")
            } else if a.is_broadcast() || a.is_multicast() {
                Some("a broadcast or multicast")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            if a.is_loopback() {
                Some("a loopback")
            } else if a.is_unspecified() {
                Some("an unspecified")
            } else if a.segments()[0] & 0xffc0 == 0xfe80 {
                Some("a link-local")
            } else if a.is_multicast() {
                Some("a multicast")
            } else {
                None
            }
        }
    }
}

fn loopback_refused(ctx: &mut Ctx<'_>, pointer: &str, what: String, kind: &str, owner: &str) {
    let d = ctx.error(
        "loopback-target",
        pointer,
        format!("{what} is {kind} address: the {owner} would connect to its own host"),
    );
    help(
        d,
        format!(
            "set `loopback: true` on the {owner} if that is meant (a test, a sidecar); private \
             (RFC 1918, ULA) addresses need no flag"
        ),
    );
}

/// An origin or node URL's host and port, after [`check_url`] (which
/// reports a URL that does not parse): port 0, empty labels (`a..b`), an
/// address spelled otherwise than its canonical form (`0x7f.1`,
/// `2130706433`), and, unless `loopback`, a loopback, link-local,
/// unspecified or `localhost` host are refused. `owner` names the file
/// kind (`site`, `node`).
pub(super) fn check_target(
    ctx: &mut Ctx<'_>,
    pointer: &str,
    text: &str,
    loopback: bool,
    owner: &str,
) {
    let Ok(url) = url::Url::parse(text) else {
        return;
    };
    let after_scheme = &text[text.find("://").map_or(0, |i| i + 3)..];
    let authority = &after_scheme[..after_scheme
        .find(['/', '?', '#'])
        .unwrap_or(after_scheme.len())];
    if authority.contains('@') {
        return;
    }
    let written = if authority.starts_with('[') {
        authority.find(']').map_or(authority, |i| &authority[..=i])
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    if url.port() == Some(0) {
        ctx.error(
            "invalid-url",
            pointer,
            format!("`{}`: port 0 is not a port to connect to", shown(text)),
        );
        return;
    }
    let Some(host) = url.host() else {
        return;
    };
    match host {
        url::Host::Domain(d) => {
            let labels: Vec<&str> = d.strip_suffix('.').unwrap_or(d).split('.').collect();
            if labels.iter().any(|l| l.is_empty()) {
                ctx.error(
                    "invalid-url",
                    pointer,
                    format!("`{}`: the host `{d}` has an empty label", shown(text)),
                );
                return;
            }
            let local = labels
                .last()
                .is_some_and(|l| l.eq_ignore_ascii_case("localhost"));
            if local && !loopback {
                loopback_refused(
                    ctx,
                    pointer,
                    format!("`{}`", shown(text)),
                    "a `localhost`",
                    owner,
                );
            }
        }
        url::Host::Ipv4(_) | url::Host::Ipv6(_) => {
            let canonical = match host {
                url::Host::Ipv6(a) => format!("[{a}]"),
                ref other => other.to_string(),
            };
            if !written.eq_ignore_ascii_case(&canonical) {
                let d = ctx.error(
                    "non-canonical-address",
                    pointer,
                    format!(
                        "`{}`: the address `{}` is written otherwise than `{canonical}`",
                        shown(text),
                        shown(written)
                    ),
                );
                help(
                    d,
                    format!("write `{canonical}`: every reader then sees the same address"),
                );
                return;
            }
            let ip = match host {
                url::Host::Ipv4(a) => IpAddr::V4(a),
                url::Host::Ipv6(a) => IpAddr::V6(a),
                url::Host::Domain(_) => return,
            };
            if let Some(kind) = internal(ip)
                && !loopback
            {
                loopback_refused(ctx, pointer, format!("`{}`", shown(text)), kind, owner);
            }
        }
    }
}
