//! `nodes/*.yaml`: roles, addresses, location, Redis target, cache settings.

use super::*;
use edgestate::target::TlsFiles;
use std::path::PathBuf;

pub(super) fn node(ctx: &mut Ctx<'_>, raw: &raw::Node) -> Node {
    let mut roles = BTreeSet::new();
    for (i, role) in raw.roles.iter().enumerate() {
        if !roles.insert(*role) {
            ctx.error(
                "duplicate-value",
                &format!("/roles/{i}"),
                format!("role `{}` is listed twice", role.as_str()),
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
            Ok(a) if a.to_string() != *text => {
                let d = ctx.error(
                    "non-canonical-address",
                    &format!("/addresses/{i}"),
                    format!("`{text}` is written otherwise than `{a}`"),
                );
                help(d, format!("write `{a}`"));
            }
            Ok(a) => {
                if let Some(kind) = internal(a)
                    && !raw.loopback
                {
                    let d = ctx.error(
                        "loopback-target",
                        &format!("/addresses/{i}"),
                        format!(
                            "`{a}` is {kind} address: a router would send viewers to its own host"
                        ),
                    );
                    help(
                        d,
                        "set `loopback: true` on the node if that is meant (a test); private \
                         (RFC 1918, ULA) addresses need no flag",
                    );
                }
                addresses.push(a);
            }
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
        let before = ctx.out.len();
        check_url(ctx, "/public_url", url, &["http", "https"], false);
        if ctx.out.len() == before
            && let Some(i) = url.find(['?', '#'])
        {
            // The stream is appended to the URL's path: after a query it
            // would land in the query, after a fragment it is never sent.
            let d = ctx.error(
                "invalid-url",
                "/public_url",
                format!(
                    "`{url}` has a query or fragment (`{}`); the stream name is appended to its path",
                    &url[i..]
                ),
            );
            help(d, "a payload URL is scheme://host[:port][/path]");
        }
        check_target(ctx, "/public_url", url, raw.loopback, "node");
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
    if let Err(why) = edgestate::purge::check_template(&cache.key) {
        // At the value when the node gives one; the default is valid.
        let d = ctx.error("invalid-value", "/cache/key", format!("`cache.key`: {why}"));
        help(
            d,
            "the default is `$scheme://$host$request_uri`; changing a node's key makes its cache cold once",
        );
    }
    let https = https(ctx, raw);
    if let Some(i) = &raw.install
        && i.listen == i.smoke_listen
    {
        ctx.error(
            "install-smoke-listen",
            "/install/smoke_listen",
            "`smoke_listen` must differ from `listen`: the candidate is tested on the alternate address, never on live traffic".to_owned(),
        );
    }
    if let Some(i) = &raw.install {
        // Both reach ssh's command line as `user@host`: neither may read
        // as an option (`-oProxyCommand=…`) or carry a second `@`.
        let user_ok = i
            .user
            .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && i.user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !user_ok {
            let d = ctx.error(
                "invalid-value",
                "/install/user",
                format!(
                    "`{}` is not a user name ssh can be given: a letter or `_`, then letters, digits, `_`, `-`, `.`",
                    edgestate::untrusted::escape(&i.user)
                ),
            );
            help(d, "the node's login, e.g. `root` or `deploy`");
        }
        if i.ssh.starts_with('-')
            || i.ssh.chars().any(|c| {
                c.is_whitespace() || c.is_control() || matches!(c, '@' | '\'' | '"' | '\\')
            })
        {
            ctx.error(
                "invalid-value",
                "/install/ssh",
                format!(
                    "`{}` is not a host for ssh: `host`, `host:port` or `[v6]:port`",
                    edgestate::untrusted::escape(&i.ssh)
                ),
            );
        }
        for (field, vars) in [("vars", &i.vars), ("candidate_vars", &i.candidate_vars)] {
            for (name, value) in vars {
                let why = if value.is_empty() {
                    None
                } else if secret_var(name) {
                    Some("its name".to_owned())
                } else {
                    secret_value(value).map(|kind| format!("its value is {kind}"))
                };
                if let Some(why) = why {
                    let d = ctx.error(
                        "inline-secret",
                        &format!("/install/{field}/{}", pointer_escape(name)),
                        format!(
                            "`install.{field}.{name}` looks like a secret ({why}); secrets never live in the repository"
                        ),
                    );
                    help(
                        d,
                        "keep it in the control host's state directory (`edgeform secrets set NODE NAME`); the installer writes it to the node's environment file and the template reads it with `env NAME;` and `os.getenv`",
                    );
                    d.secret = Some(value.clone());
                }
            }
        }
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
        https,
    }
}

/// `https:`: each listener `[host:]port`, the two different; only on an
/// edge.
fn https(ctx: &mut Ctx<'_>, raw: &raw::Node) -> crate::model::resolved::HttpsListen {
    use crate::model::resolved::{HttpsListen, listen_port};
    let mut out = HttpsListen::default();
    let Some(h) = &raw.https else {
        return out;
    };
    if !raw.roles.contains(&Role::Edge) {
        ctx.error(
            "https-not-edge",
            "/https",
            format!("node `{}` has `https` but is not an edge", raw.name),
        );
    }
    for (field, value) in [("listen", &h.listen), ("proxy_listen", &h.proxy_listen)] {
        let Some(v) = value else { continue };
        match listen_port(v) {
            Some(port) => {
                if field == "listen" {
                    out.listen.clone_from(v);
                } else {
                    out.proxy_listen.clone_from(v);
                    out.proxy_port = port;
                }
            }
            None => {
                let d = ctx.error(
                    "invalid-listen",
                    &format!("/https/{field}"),
                    format!("`https.{field}` `{v}` is not an nginx listen address `[host:]port`"),
                );
                help(d, "e.g. `443`, `0.0.0.0:443` or `[::]:443`");
            }
        }
    }
    if listen_port(&out.listen) == Some(out.proxy_port) {
        ctx.error(
            "https-listen-conflict",
            "/https/proxy_listen",
            "`https.proxy_listen` must differ from `https.listen`: routers' PROXY-protocol connections need their own port".to_owned(),
        );
    }
    out
}

/// Whether an `install.vars` name looks like a secret's: a part (split on
/// `_`, `-`, `.`) that is a token, secret, password or key.
fn secret_var(name: &str) -> bool {
    name.to_ascii_lowercase()
        .split(['_', '-', '.'])
        .any(|part| {
            matches!(
                part,
                "token"
                    | "secret"
                    | "password"
                    | "passwd"
                    | "pass"
                    | "pwd"
                    | "key"
                    | "apikey"
                    | "credential"
                    | "credentials"
            ) || part.ends_with("token")
                || part.ends_with("secret")
                || part.ends_with("password")
        })
}

/// Why an `install.vars` value looks like a secret whatever its name, or
/// `None`: an HTTP credential (`Bearer …`, `Basic …`, `Token …`), a PEM
/// private key, a URL with a password, a well-known token prefix (GitHub,
/// GitLab, Slack, Stripe, AWS), or a long random-looking token (a run of
/// `A-Z a-z 0-9 + _ -` of 20 or more characters mixing upper case, lower
/// case and digits, that switches between them often and repeats little;
/// or 32 or more hex digits). Sizes, addresses, paths, URLs, words and
/// identifiers are not.
fn secret_value(value: &str) -> Option<&'static str> {
    let v = value.trim();
    let lower = v.to_ascii_lowercase();
    for scheme in ["bearer ", "basic ", "token ", "digest "] {
        if lower.starts_with(scheme) && !v[scheme.len()..].trim().is_empty() {
            return Some("an HTTP credential");
        }
    }
    if v.contains("-----BEGIN") && v.contains("PRIVATE KEY") {
        return Some("a private key");
    }
    if let Some(i) = v.find("://") {
        let rest = &v[i + 3..];
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if authority
            .rfind('@')
            .is_some_and(|at| authority[..at].contains(':'))
        {
            return Some("a URL with a password");
        }
    }
    let known = [
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
        "glpat-",
        "xoxb-",
        "xoxp-",
        "xoxa-",
        "sk_live_",
        "rk_live_",
        "akia",
    ];
    if known
        .iter()
        .any(|p| lower.starts_with(p) && v.len() >= p.len() + 16)
    {
        return Some("a known token");
    }
    let token_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '_' | '-');
    if v.split(|c: char| !token_char(c)).any(random_token) {
        return Some("a long random-looking token");
    }
    None
}

/// Whether a run of token characters looks random (see [`secret_value`]).
fn random_token(run: &str) -> bool {
    let n = run.len();
    if n < 20 {
        return false;
    }
    let b = run.as_bytes();
    let has = |f: fn(&u8) -> bool| b.iter().any(f);
    let digit = has(u8::is_ascii_digit);
    if b.iter().all(u8::is_ascii_hexdigit) {
        return n >= 32 && digit && has(u8::is_ascii_alphabetic);
    }
    if !(digit && has(u8::is_ascii_lowercase) && has(u8::is_ascii_uppercase)) {
        return false;
    }
    let class = |c: u8| match c {
        b'a'..=b'z' => 0,
        b'A'..=b'Z' => 1,
        b'0'..=b'9' => 2,
        _ => 3,
    };
    let switches = b.windows(2).filter(|w| class(w[0]) != class(w[1])).count();
    let mut counts = [0usize; 256];
    for &c in b {
        counts[usize::from(c)] += 1;
    }
    #[allow(clippy::cast_precision_loss)]
    let entropy: f64 = counts
        .iter()
        .filter(|&&k| k > 0)
        .map(|&k| {
            let p = k as f64 / n as f64;
            -p * p.log2()
        })
        .sum();
    #[allow(clippy::cast_precision_loss)]
    let often = switches as f64 / (n - 1) as f64 >= 0.35;
    often && entropy >= 3.8
}

/// A JSON pointer segment (`~` → `~0`, `/` → `~1`).
fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// `url` without its user part (`redis://user@host` → `redis://host`).
fn without_user(url: &str) -> String {
    let Some(i) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[i..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{}{}", &url[..i], &rest[at + 1..]),
        None => url.to_owned(),
    }
}

pub(super) fn redis(ctx: &mut Ctx<'_>, raw: &raw::Redis) -> Option<RedisTarget> {
    let tls = raw.tls.as_ref().map(|t| TlsFiles {
        ca_file: t.ca_file.as_ref().map(PathBuf::from),
        cert_file: t.cert_file.as_ref().map(PathBuf::from),
        key_file: t.key_file.as_ref().map(PathBuf::from),
    });
    if let Some(t) = &tls
        && t.cert_file.is_some() != t.key_file.is_some()
    {
        let given = if t.cert_file.is_some() {
            "/redis/tls/cert_file"
        } else {
            "/redis/tls/key_file"
        };
        ctx.error(
            "invalid-redis",
            given,
            "`tls.cert_file` and `tls.key_file` go together".into(),
        );
    }
    if let Some(u) = &raw.username
        && !edgestate::target::valid_username(u)
    {
        ctx.error(
            "invalid-redis",
            "/redis/username",
            edgestate::target::TargetError::Username.to_string(),
        );
    }
    let mut username = raw.username.clone();
    match (&raw.url, &raw.sentinels, &raw.master) {
        (Some(url), None, None) => {
            // A user part without a password names the ACL user: no
            // secret in it. (With a password it is an inline secret.)
            match edgestate::target::url_user(url) {
                Ok(Some(user)) => {
                    if username.as_ref().is_some_and(|u| *u != user) {
                        ctx.error(
                            "invalid-redis",
                            "/redis/username",
                            edgestate::target::TargetError::UsernameTwice.to_string(),
                        );
                    }
                    username = Some(user);
                    check_url(
                        ctx,
                        "/redis/url",
                        &without_user(url),
                        &["redis", "rediss"],
                        false,
                    );
                }
                Ok(None) | Err(edgestate::target::TargetError::UrlPassword) => {
                    check_url(ctx, "/redis/url", url, &["redis", "rediss"], false);
                }
                Err(e) => {
                    check_url(ctx, "/redis/url", url, &["redis", "rediss"], false);
                    ctx.error("invalid-redis", "/redis/url", e.to_string());
                }
            }
            if edgestate::target::is_insecure(url) {
                ctx.error(
                    "invalid-redis",
                    "/redis/url",
                    "`#insecure` is not allowed: certificates are always verified (give `tls.ca_file`)"
                        .into(),
                );
            }
            if tls.is_some() && !url.starts_with("rediss://") {
                let d = ctx.error(
                    "invalid-redis",
                    "/redis/tls",
                    "`tls` needs a `rediss://` URL".into(),
                );
                help(d, "write `url: rediss://host:port`, or remove `tls`");
            }
            Some(RedisTarget::Url {
                url: url.clone(),
                username,
                password_env: raw.password_env.clone(),
                tls,
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
                username,
                password_env: raw.password_env.clone(),
                tls,
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

#[cfg(test)]
mod secret_value_tests {
    use super::secret_value;

    #[test]
    fn credentials_and_random_tokens_look_like_secrets() {
        for v in [
            "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x",
            "bearer abc",
            "Basic dXNlcjpwYXNz",
            "Token 1234",
            "https://user:hunter2@api.example.com/v1",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----",
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "glpat-abcdefghij0123456789",
            "xoxb-1234567890-abcdefghijkl",
            "AKIAIOSFODNN7EXAMPLE",
            "Xk9fT2pLq8vZ3mN7wR4sYb",
            "rj5TW4N9Pp4oWStBT3dGEvOASSYph9Bu",
            "YbvgIAIgBbc2gGp1zU9jNimuU6Zxv-ycq1",
            "9a7169d59bcbb400764bdf09feef40a8",
            "prefix:nCZS8ZLZYNL5aGiyQ5jGE4USn8pbEECx",
        ] {
            assert!(secret_value(v).is_some(), "{v}");
        }
    }

    #[test]
    fn settings_words_and_identifiers_do_not() {
        for v in [
            // The example repository's install.vars.
            "false",
            "http://127.0.0.1:9",
            "10g",
            "geoip/GeoLite2-City.mmdb",
            "127.0.0.1",
            "8480",
            "auto",
            // Other settings a role template reads.
            "1",
            "100m",
            "/var/cache/nginx/edge_cache",
            "ams-1.edge.example.net",
            "[2001:db8::1]:8443",
            "$scheme://$host$request_uri",
            "max_size=10g inactive=60m",
            "proxy_cache_levels_1_2",
            "edge-ams-1-primary-2026",
            "3f2b8c1e-7d4a-4e2b-9f1a-2c3d4e5f6a7b",
            "a1b2c3d4e5f6a7b8c9d0e1f2",
            "internationalization2024",
            "MyServiceName2024Production",
            "X509CertificateV3Extensions",
            "HTTP2ServerPushEnabled",
            "https://api.example.com/v1?user=edge",
            "Bearer",
            "SuperSecretValue123",
        ] {
            assert_eq!(secret_value(v), None, "{v}");
        }
    }
}
