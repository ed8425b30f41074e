//! How a node's own Redis and the MQTT broker are reached, as a
//! configuration writes them: the `redis` block of `agent.yaml` and of a
//! node file, the broker's URL and login. Pure: checked here, connected to
//! by `edgeredis` and `edgemqtt` (which re-export these types).

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
                if !matches!(scheme, Some("redis" | "rediss" | "unix")) || !redis_url_accepted(&url)
                {
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
                    if sentinel_addr(s).is_none() {
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
    String::from_utf8_lossy(&percent_decoded(text)).into_owned()
}

/// `%XY` → the byte (as the `percent-encoding` crate decodes).
fn percent_decoded(text: &str) -> Vec<u8> {
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
    out
}

/// Whether a URL asks the redis crate to skip certificate checks
/// (`rediss://…#insecure`). Pure.
#[must_use]
pub fn is_insecure(url: &str) -> bool {
    url.split_once('#')
        .is_some_and(|(_, fragment)| fragment.eq_ignore_ascii_case("insecure"))
}

/// Whether the redis crate takes `text` as a connection URL (what its
/// `IntoConnectionInfo` accepts for a string): `redis`/`rediss`/`valkey`/
/// `valkeys` with a host that is not a wildcard, a numeric database
/// path, UTF-8 credentials, a `protocol` of 2/resp2/3/resp3, and on TLS
/// no fragment but `#insecure`; `unix`/`redis+unix`/`valkey+unix` with a
/// file path and a numeric `db`. Pure; `edgeredis` proves it agrees with
/// the redis crate.
#[must_use]
pub fn redis_url_accepted(text: &str) -> bool {
    let Ok(url) = url::Url::parse(text) else {
        return false;
    };
    let query: std::collections::HashMap<_, _> = url.query_pairs().collect();
    let protocol_ok = query
        .get("protocol")
        .is_none_or(|p| matches!(p.as_ref(), "2" | "resp2" | "3" | "resp3"));
    match url.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            let host = match url.host() {
                Some(url::Host::Domain(d)) => d.to_owned(),
                Some(url::Host::Ipv4(v4)) => v4.to_string(),
                Some(url::Host::Ipv6(v6)) => v6.to_string(),
                None => return false,
            };
            if host == "0.0.0.0" || host == "::" {
                return false;
            }
            let tls = matches!(url.scheme(), "rediss" | "valkeys");
            if tls && url.fragment().is_some_and(|f| f != "insecure") {
                return false;
            }
            let db_ok = match url.path().trim_matches('/') {
                "" => true,
                path => path.parse::<i64>().is_ok(),
            };
            let utf8 = |s: &str| std::str::from_utf8(&percent_decoded(s)).is_ok();
            db_ok && utf8(url.username()) && url.password().is_none_or(utf8) && protocol_ok
        }
        "unix" | "redis+unix" | "valkey+unix" => {
            url.to_file_path().is_ok()
                && query.get("db").is_none_or(|d| d.parse::<i64>().is_ok())
                && protocol_ok
        }
        _ => false,
    }
}

/// The port a Redis URL names, if it parses and names one (`redis://h:0`
/// parses but reaches nothing: callers refuse it).
#[must_use]
pub fn redis_url_port(text: &str) -> Option<u16> {
    let url = url::Url::parse(text).ok()?;
    matches!(
        url.scheme(),
        "redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" | "unix"
    )
    .then(|| url.port())
    .flatten()
}

/// Where the MQTT broker is and how to log in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// `mqtt://host[:1883]` or `mqtts://host[:8883]`.
    pub url: String,
    pub username: Option<String>,
    /// The environment variable holding the password.
    pub password_env: Option<String>,
    /// PEM CA certificate(s) to trust for `mqtts://` (default: the system's).
    pub ca_file: Option<PathBuf>,
}

/// Why a broker URL is refused: the message, and the URL parser's own
/// error as its cause when the text is not a URL at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrlError {
    pub message: String,
    pub cause: Option<url::ParseError>,
}

impl std::fmt::Display for BrokerUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BrokerUrlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_ref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

impl BrokerUrlError {
    /// The message with its cause (`` `x` is not a URL: relative URL
    /// without a base ``).
    #[must_use]
    pub fn with_cause(&self) -> String {
        match &self.cause {
            Some(c) => format!("{}: {c}", self.message),
            None => self.message.clone(),
        }
    }
}

/// The host, port and whether TLS is used, from a broker URL.
///
/// # Errors
/// Not a URL, another scheme, credentials or a path in the URL, no host,
/// port 0.
pub fn parse_broker_url(text: &str) -> Result<(String, u16, bool), BrokerUrlError> {
    let refuse = |message: String| BrokerUrlError {
        message,
        cause: None,
    };
    let url = url::Url::parse(text).map_err(|e| BrokerUrlError {
        message: format!("`{text}` is not a URL"),
        cause: Some(e),
    })?;
    let tls = match url.scheme() {
        "mqtt" | "tcp" => false,
        "mqtts" | "ssl" => true,
        other => {
            return Err(refuse(format!(
                "`{text}`: scheme `{other}` is not mqtt:// or mqtts://"
            )));
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse(format!(
            "`{text}`: put the username in `username` and the password in an environment variable, not in the URL"
        )));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(refuse(format!(
            "`{text}`: a broker URL has no path or query"
        )));
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| refuse(format!("`{text}` has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = url.port().unwrap_or(if tls { 8883 } else { 1883 });
    if port == 0 {
        return Err(refuse(format!("`{text}`: port 0 is not a broker's port")));
    }
    Ok((host, port, tls))
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

/// A Sentinel as written, `host:port` (an IPv6 host in brackets): its host,
/// without the brackets, and port; `None` when the host is empty or the
/// port is not one. The one reading both the validator and the connection
/// use. Pure.
#[must_use]
pub fn sentinel_addr(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    if host.is_empty() {
        return None;
    }
    let port = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port))
}

#[cfg(test)]
mod sentinel_addr_tests {
    use super::sentinel_addr;

    #[test]
    fn sentinel_addresses_split_with_ipv6_in_brackets() {
        assert_eq!(sentinel_addr("127.0.0.1:26379"), Some(("127.0.0.1", 26379)));
        assert_eq!(sentinel_addr("[::1]:26379"), Some(("::1", 26379)));
        assert_eq!(sentinel_addr("sentinel"), None);
        assert_eq!(sentinel_addr("h:port"), None);
        assert_eq!(sentinel_addr(":26379"), None);
        assert_eq!(sentinel_addr("h:70000"), None);
    }
}
