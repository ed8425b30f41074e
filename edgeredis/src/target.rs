//! What a `redis` block describes, validated without connecting: pure.

use std::path::PathBuf;

/// The `tls` block of a `redis` block: a CA to verify the server with
/// (else the system trust store) and an optional client certificate.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// How to reach a node's own Redis master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Url {
        url: String,
        /// The ACL user (`username`, or the URL's user part).
        username: Option<String>,
        password_env: Option<String>,
        /// Only with `rediss://`.
        tls: Option<TlsFiles>,
    },
    /// With `tls`, Sentinels and the master are both reached over TLS.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        /// The ACL user on the master.
        username: Option<String>,
        password_env: Option<String>,
        tls: Option<TlsFiles>,
    },
}

/// Why a Redis target as written is not valid. [`TargetError::pointer`]
/// is where, relative to the `redis` block, so each caller can locate it
/// in its own file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// Neither `url` nor `sentinels` + `master`, or both.
    Shape,
    /// `url` is not a Redis URL.
    Url(String),
    /// `sentinels` is empty.
    NoSentinels,
    /// `sentinels[i]` is not `host:port`.
    Sentinel(usize, String),
    /// `tls` with a URL that is not `rediss://`.
    TlsWithoutRediss,
    /// Only one of `tls.cert_file` and `tls.key_file`.
    TlsPair,
    /// A `#insecure` URL: certificates are always verified.
    Insecure,
    /// A URL with a password in it (`user:password@`): secrets never live
    /// in the configuration, the password comes from `password_env`.
    UrlPassword,
    /// A `?username=` query: not read; the user is `username` or the
    /// URL's user part.
    UsernameQuery,
    /// `username` and the URL's user part disagree.
    UsernameTwice,
    /// `username` is empty or has characters a Redis user name cannot.
    Username,
}

impl TargetError {
    /// A JSON pointer relative to the `redis` block.
    #[must_use]
    pub fn pointer(&self) -> String {
        match self {
            TargetError::Shape => String::new(),
            TargetError::Url(_) => "/url".into(),
            TargetError::NoSentinels => "/sentinels".into(),
            TargetError::Sentinel(i, _) => format!("/sentinels/{i}"),
            TargetError::TlsWithoutRediss | TargetError::TlsPair => "/tls".into(),
            TargetError::Insecure | TargetError::UrlPassword | TargetError::UsernameQuery => {
                "/url".into()
            }
            TargetError::UsernameTwice | TargetError::Username => "/username".into(),
        }
    }
}

impl std::fmt::Display for TargetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetError::Shape => {
                write!(f, "`redis` needs either `url`, or `sentinels` and `master`")
            }
            TargetError::Url(why) => write!(f, "{why}"),
            TargetError::NoSentinels => write!(f, "`sentinels` needs at least one `host:port`"),
            TargetError::Sentinel(_, s) => write!(f, "`{s}` is not `host:port`"),
            TargetError::TlsWithoutRediss => {
                write!(f, "`tls` needs a `rediss://` URL (or `sentinels`)")
            }
            TargetError::TlsPair => {
                write!(f, "`tls.cert_file` and `tls.key_file` go together")
            }
            TargetError::Insecure => write!(
                f,
                "`#insecure` is not allowed: certificates are always verified (give `tls.ca_file`)"
            ),
            TargetError::UrlPassword => write!(
                f,
                "the URL carries a password; secrets never live in the configuration \
                 (name an environment variable in `password_env`)"
            ),
            TargetError::UsernameQuery => write!(
                f,
                "`?username=` is not read; write the user as `redis://USER@host:port` or in `username`"
            ),
            TargetError::UsernameTwice => {
                write!(f, "`username` and the URL's user part name different users")
            }
            TargetError::Username => write!(
                f,
                "`username` must be a non-empty Redis user name (no spaces, `@`, `:` or control characters)"
            ),
        }
    }
}

impl RedisTarget {
    /// The target a `redis` block describes (agent.yaml, a node file):
    /// `url`, or `sentinels` and `master`; `username` names an ACL user
    /// (or the URL's user part does); `password_env` names the variable
    /// with the password. Pure: the variable is not read here.
    ///
    /// # Errors
    /// Every problem found, each with its place.
    pub fn from_parts(
        url: Option<String>,
        sentinels: Option<Vec<String>>,
        master: Option<String>,
        username: Option<String>,
        password_env: Option<String>,
        tls: Option<TlsFiles>,
    ) -> Result<RedisTarget, Vec<TargetError>> {
        let mut errors = Vec::new();
        if let Some(u) = &username
            && !valid_username(u)
        {
            errors.push(TargetError::Username);
        }
        if let Some(t) = &tls
            && t.cert_file.is_some() != t.key_file.is_some()
        {
            errors.push(TargetError::TlsPair);
        }
        match (url, sentinels, master) {
            (Some(url), None, None) => {
                let scheme = url.split_once("://").map(|(s, _)| s);
                if !matches!(scheme, Some("redis" | "rediss" | "unix")) || !url_parses(&url) {
                    errors.push(TargetError::Url(format!(
                        "`{url}` is not a redis:// or rediss:// URL"
                    )));
                    return Err(errors);
                }
                if is_insecure(&url) {
                    errors.push(TargetError::Insecure);
                }
                let user = match url_user(&url) {
                    Ok(user) => user,
                    Err(e) => {
                        errors.push(e);
                        None
                    }
                };
                if let (Some(a), Some(b)) = (&user, &username)
                    && a != b
                {
                    errors.push(TargetError::UsernameTwice);
                }
                if tls.is_some() && scheme != Some("rediss") {
                    errors.push(TargetError::TlsWithoutRediss);
                }
                if !errors.is_empty() {
                    return Err(errors);
                }
                Ok(RedisTarget::Url {
                    url,
                    username: username.or(user),
                    password_env,
                    tls,
                })
            }
            (None, Some(sentinels), Some(master)) => {
                if sentinels.is_empty() {
                    errors.push(TargetError::NoSentinels);
                }
                for (i, s) in sentinels.iter().enumerate() {
                    let ok = s.rsplit_once(':').is_some_and(|(host, port)| {
                        !host.is_empty() && port.parse::<u16>().is_ok()
                    });
                    if !ok {
                        errors.push(TargetError::Sentinel(i, s.clone()));
                    }
                }
                if errors.is_empty() {
                    Ok(RedisTarget::Sentinel {
                        sentinels,
                        master,
                        username,
                        password_env,
                        tls,
                    })
                } else {
                    Err(errors)
                }
            }
            _ => Err(vec![TargetError::Shape]),
        }
    }

    /// The `tls` block, if any.
    #[must_use]
    pub fn tls(&self) -> Option<&TlsFiles> {
        match self {
            RedisTarget::Url { tls, .. } | RedisTarget::Sentinel { tls, .. } => tls.as_ref(),
        }
    }

    /// The ACL user, if any (else the default user).
    #[must_use]
    pub fn username(&self) -> Option<&str> {
        match self {
            RedisTarget::Url { username, .. } | RedisTarget::Sentinel { username, .. } => {
                username.as_deref()
            }
        }
    }

    /// The variable holding the password, if any.
    #[must_use]
    pub fn password_env(&self) -> Option<&str> {
        match self {
            RedisTarget::Url { password_env, .. } | RedisTarget::Sentinel { password_env, .. } => {
                password_env.as_deref()
            }
        }
    }
}

/// Whether `name` can be a Redis ACL user name as edgeform sends it:
/// non-empty, at most 128 bytes, no whitespace, control characters, `@`
/// or `:` (which a URL's user part could not carry). Pure.
#[must_use]
pub fn valid_username(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '@' | ':' | '/'))
}

/// The user part of a Redis URL (`redis://USER@host`), percent-decoded.
/// Pure.
///
/// # Errors
/// A password in the URL ([`TargetError::UrlPassword`]), a `?username=`
/// query ([`TargetError::UsernameQuery`]), or a user that is not a valid
/// name ([`TargetError::Username`]).
pub fn url_user(url: &str) -> Result<Option<String>, TargetError> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let query = url
        .split_once('?')
        .map(|(_, q)| q.split_once('#').map_or(q, |(q, _)| q));
    if query.is_some_and(|q| {
        q.split('&').any(|p| {
            p.split_once('=')
                .map_or(p, |(k, _)| k)
                .eq_ignore_ascii_case("username")
        })
    }) {
        return Err(TargetError::UsernameQuery);
    }
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return Ok(None);
    };
    if userinfo.contains(':') {
        return Err(TargetError::UrlPassword);
    }
    let user = percent_decode(userinfo);
    if valid_username(&user) {
        Ok(Some(user))
    } else {
        Err(TargetError::Username)
    }
}

fn percent_decode(text: &str) -> String {
    let b = text.as_bytes();
    let hex = |c: u8| char::from(c).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(0));
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a URL asks the redis crate to skip certificate checks
/// (`rediss://…#insecure`). Pure.
#[must_use]
pub fn is_insecure(url: &str) -> bool {
    url.split_once('#')
        .is_some_and(|(_, fragment)| fragment.eq_ignore_ascii_case("insecure"))
}

/// Where a master is, for messages: `redis://host:port` or
/// ``master `name` via sentinel host:port``.
#[must_use]
pub fn describe(target: &RedisTarget) -> String {
    match target {
        RedisTarget::Url { url, .. } => url.clone(),
        RedisTarget::Sentinel {
            sentinels, master, ..
        } => {
            format!("master `{master}` via sentinel {}", sentinels.join(","))
        }
    }
}

/// Whether the redis crate would accept `url` as a connection URL
/// (`redis://`, `rediss://` or `unix://`), decided here without it: a host
/// that is not a wildcard address, a numeric database in the path,
/// UTF-8 user and password, `protocol` 2/3/resp2/resp3, and on `rediss`
/// no fragment but `#insecure`; a `unix` URL needs a file path and a
/// numeric `db`. A test of the `client` feature holds this to the redis
/// crate's own parser.
#[must_use]
pub fn url_parses(url: &str) -> bool {
    let Ok(u) = url::Url::parse(url) else {
        return false;
    };
    let query: Vec<(String, String)> = u.query_pairs().into_owned().collect();
    let last = |key: &str| {
        query
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let protocol_ok = last("protocol").is_none_or(|p| matches!(p, "2" | "resp2" | "3" | "resp3"));
    match u.scheme() {
        "redis" | "rediss" => {
            let host = match u.host() {
                Some(url::Host::Domain(d)) => d.to_owned(),
                Some(url::Host::Ipv4(v4)) => v4.to_string(),
                Some(url::Host::Ipv6(v6)) => v6.to_string(),
                None => return false,
            };
            if host == "0.0.0.0" || host == "::" {
                return false;
            }
            if u.scheme() == "rediss" && u.fragment().is_some_and(|f| f != "insecure") {
                return false;
            }
            let db_ok = match u.path().trim_matches('/') {
                "" => true,
                path => path.parse::<i64>().is_ok(),
            };
            let utf8 = |part: &str| percent_decoded_utf8(part);
            db_ok && utf8(u.username()) && u.password().is_none_or(utf8) && protocol_ok
        }
        "unix" => {
            u.to_file_path().is_ok()
                && last("db").is_none_or(|db| db.parse::<i64>().is_ok())
                && protocol_ok
        }
        _ => false,
    }
}

fn percent_decoded_utf8(text: &str) -> bool {
    let b = text.as_bytes();
    let hex = |c: u8| char::from(c).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(0));
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).is_ok()
}
