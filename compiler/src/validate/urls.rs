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
