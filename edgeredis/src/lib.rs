//! Reaching a node's own Redis master: the compiler's pusher and the agent
//! both connect through here.
//!
//! By URL, or through the node's own Sentinels: the master is resolved
//! anew for every connection, so a run after a failover lands on the new
//! master. The password comes only from the environment variable the node
//! names (`redis.password_env`), never from the repository. An ACL user is
//! named by `username` (or the URL's user part, without a password); the
//! default user otherwise.
//!
//! Connections are dedicated (never shared between tasks, so WATCH state is
//! ours) and have no response timeout: the redis crate's default 500 ms
//! would fail a 100,000-key MULTI/EXEC client-side while the server still
//! applies it. A connect timeout bounds unreachable targets instead.
//!
//! TLS: a `rediss://` URL, or Sentinels with a `tls` block, connect with
//! TLS (native-tls, i.e. OpenSSL). The server certificate is always
//! verified — against `tls.ca_file` when given, else the system trust
//! store; `#insecure` URLs are refused. `cert_file` + `key_file` add a
//! client certificate. Over Sentinel with TLS the master is resolved here
//! (`SENTINEL get-master-addr-by-name` over TLS), because the redis crate
//! passes custom certificates to Sentinels only with rustls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use redis::aio::MultiplexedConnection;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, IntoConnectionInfo, RedisConnectionInfo,
    TlsCertificates,
};

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
                if !matches!(scheme, Some("redis" | "rediss" | "unix"))
                    || url.as_str().into_connection_info().is_err()
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

fn read(path: &Path, key: &str) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {} (redis.tls.{key})", path.display()))
}

/// The certificates `tls` names, read now: a file that cannot be read is
/// an error naming it.
///
/// # Errors
/// An unreadable file.
pub fn certificates(tls: &TlsFiles) -> Result<TlsCertificates> {
    let root_cert = tls
        .ca_file
        .as_deref()
        .map(|p| read(p, "ca_file"))
        .transpose()?;
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read(cert, "cert_file")?,
            client_key: read(key, "key_file")?,
        }),
        _ => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// A client for `url`, with the certificates of `tls` when given.
fn client(info: redis::ConnectionInfo, tls: Option<&TlsFiles>) -> Result<Client> {
    Ok(match tls {
        Some(tls) => Client::build_with_tls(info, certificates(tls)?)?,
        None => Client::open(info)?,
    })
}

/// How long to wait for a TCP connection (per attempt).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

fn password(env: Option<&str>, node: &str) -> Result<Option<String>> {
    // `node` names whose setting this is, for the message.
    match env {
        None => Ok(None),
        Some(var) => match std::env::var(var) {
            Ok(p) if !p.is_empty() => Ok(Some(p)),
            _ => bail!("environment variable {var} is not set (node {node}'s redis.password_env)"),
        },
    }
}

fn config(pushes: Option<&Pushes>) -> AsyncConnectionConfig {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(None);
    match pushes {
        Some(p) => {
            let p = p.clone();
            config.set_push_sender(move |info| p.send(info))
        }
        None => config,
    }
}

/// Where a connection's push messages go (RESP3: client-side caching
/// invalidations, and a last `Disconnection` when the connection drops).
pub type Pushes = std::sync::Arc<dyn redis::aio::AsyncPushSender>;

/// RESP3 when the connection takes push messages, else the default; never
/// `CLIENT SETINFO` (two commands the server runs on every connection, for
/// `CLIENT LIST` cosmetics, and a purge opens one connection per edge).
fn protocol(settings: RedisConnectionInfo, pushes: Option<&Pushes>) -> RedisConnectionInfo {
    let settings = settings.set_skip_set_lib_name();
    match pushes {
        Some(_) => settings.set_protocol(redis::ProtocolVersion::RESP3),
        None => settings,
    }
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

/// The connection in `slot`, opening one to the master (see [`master`])
/// when there is none: for tasks that keep a connection across loops and
/// drop it (set `None`) after an error, so the next use re-resolves.
///
/// # Errors
/// See [`master`].
pub async fn reuse<'a>(
    target: &RedisTarget,
    node: &str,
    slot: &'a mut Option<MultiplexedConnection>,
) -> Result<&'a mut MultiplexedConnection> {
    if slot.is_none() {
        *slot = Some(master(target, node).await?);
    }
    Ok(slot.as_mut().expect("just set"))
}

/// A dedicated connection to the current master of `target`; `node` names
/// the node in messages.
///
/// # Errors
/// Missing password variable, unreachable server or sentinels, a sentinel
/// that does not know the master, or a "master" that is a replica.
pub async fn master(target: &RedisTarget, node: &str) -> Result<MultiplexedConnection> {
    connect(target, node, None, None).await
}

/// Like [`master`], but over RESP3 with the server's push messages handed
/// to `pushes` (the reconciler's tracked heal, `CLIENT TRACKING`).
///
/// # Errors
/// See [`master`].
pub async fn master_with_pushes(
    target: &RedisTarget,
    node: &str,
    pushes: Pushes,
) -> Result<MultiplexedConnection> {
    connect(target, node, Some(&pushes), None).await
}

/// Like [`master_with_pushes`], and subscribed to `channel`: the `ROLE`
/// check and the `SUBSCRIBE` go out together, one round trip instead of
/// two (`edgeform purge --wait`). A SUBSCRIBE queues nothing, so the
/// invariant holds: nothing is written before `ROLE` said master (the
/// caller writes only once this returns).
///
/// # Errors
/// See [`master`]; a refused SUBSCRIBE.
pub async fn master_subscribed(
    target: &RedisTarget,
    node: &str,
    pushes: Pushes,
    channel: &str,
) -> Result<MultiplexedConnection> {
    connect(target, node, Some(&pushes), Some(channel)).await
}

async fn connect(
    target: &RedisTarget,
    node: &str,
    pushes: Option<&Pushes>,
    subscribe: Option<&str>,
) -> Result<MultiplexedConnection> {
    let connect = async {
        match target {
            RedisTarget::Url {
                url,
                username,
                password_env,
                tls,
            } => {
                if is_insecure(url) {
                    bail!("{url}: `#insecure` is not allowed, certificates are always verified");
                }
                let mut info = url.as_str().into_connection_info()?;
                let mut redis = info.redis_settings().clone();
                if let Some(u) = username {
                    redis = redis.set_username(u.clone());
                }
                if let Some(p) = password(password_env.as_deref(), node)? {
                    redis = redis.set_password(p);
                }
                info = info.set_redis_settings(protocol(redis, pushes));
                let client = client(info, tls.as_ref())?;
                let con = client
                    .get_multiplexed_async_connection_with_config(&config(pushes))
                    .await?;
                Ok::<_, anyhow::Error>(con)
            }
            RedisTarget::Sentinel {
                sentinels,
                master,
                username,
                password_env,
                tls: Some(tls),
            } => {
                let password = password(password_env.as_deref(), node)?;
                sentinel_tls(sentinels, master, username.clone(), password, tls, pushes)
                    .await
                    .with_context(|| {
                        format!(
                            "resolving master `{master}` through {} (TLS)",
                            sentinels.join(",")
                        )
                    })
            }
            RedisTarget::Sentinel {
                sentinels,
                master,
                username,
                password_env,
                tls: None,
            } => {
                let urls: Vec<String> = sentinels.iter().map(|s| format!("redis://{s}")).collect();
                let mut sentinel = Sentinel::build(urls)?;
                let mut settings = RedisConnectionInfo::default();
                if let Some(u) = username {
                    settings = settings.set_username(u.clone());
                }
                if let Some(p) = password(password_env.as_deref(), node)? {
                    settings = settings.set_password(p);
                }
                let info = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(protocol(settings, pushes));
                let client = sentinel
                    .async_master_for(master, Some(&info))
                    .await
                    .with_context(|| {
                        format!(
                            "resolving master `{master}` through {}",
                            sentinels.join(",")
                        )
                    })?;
                let con = client
                    .get_multiplexed_async_connection_with_config(&config(pushes))
                    .await?;
                Ok(con)
            }
        }
    };
    let mut con = tokio::time::timeout(CONNECT_TIMEOUT * 3, connect)
        .await
        .map_err(|_| anyhow::anyhow!("timed out connecting"))??;
    // Writing to a replica would fail later and less clearly; check now.
    // With a channel, its SUBSCRIBE is sent right behind the ROLE on the
    // same connection (the multiplexer writes both before either reply).
    let role = match subscribe {
        None => {
            redis::cmd("ROLE")
                .query_async::<Vec<redis::Value>>(&mut con)
                .await?
        }
        Some(channel) => {
            let mut sub = con.clone();
            let role = redis::cmd("ROLE");
            let (role, subscribed) = tokio::join!(
                role.query_async::<Vec<redis::Value>>(&mut con),
                sub.subscribe(channel)
            );
            let role = role?;
            subscribed.with_context(|| format!("SUBSCRIBE {channel}"))?;
            role
        }
    };
    if is_master(&role) {
        Ok(con)
    } else {
        bail!("{} is not a master (ROLE says otherwise)", describe(target))
    }
}

/// Whether a `ROLE` reply says master. Pure.
fn is_master(role: &[redis::Value]) -> bool {
    match role.first() {
        Some(redis::Value::BulkString(r)) => r == b"master",
        Some(redis::Value::SimpleString(r)) => r == "master",
        _ => false,
    }
}

/// The master `name` through Sentinels reached over TLS, then the master
/// over TLS, both verified with `tls`'s certificates: the first Sentinel
/// that answers with an address wins.
async fn sentinel_tls(
    sentinels: &[String],
    name: &str,
    username: Option<String>,
    password: Option<String>,
    tls: &TlsFiles,
    pushes: Option<&Pushes>,
) -> Result<MultiplexedConnection> {
    let certs = certificates(tls)?;
    let mut last = None;
    for s in sentinels {
        let asked = async {
            let client = Client::build_with_tls(format!("rediss://{s}"), certs.clone())?;
            let mut con = client
                .get_multiplexed_async_connection_with_config(&config(None))
                .await?;
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async(&mut con)
                .await?;
            addr.ok_or_else(|| anyhow::anyhow!("sentinel {s} does not know master `{name}`"))
        };
        match asked.await {
            Ok((host, port)) => {
                let mut info = format!("rediss://{host}:{port}").into_connection_info()?;
                let mut redis = info.redis_settings().clone();
                if let Some(u) = username {
                    redis = redis.set_username(u);
                }
                if let Some(p) = password {
                    redis = redis.set_password(p);
                }
                info = info.set_redis_settings(protocol(redis, pushes));
                let client = Client::build_with_tls(info, certs)?;
                let con = client
                    .get_multiplexed_async_connection_with_config(&config(pushes))
                    .await
                    .with_context(|| format!("master `{name}` at rediss://{host}:{port}"))?;
                return Ok(con);
            }
            Err(e) => last = Some(e.context(format!("sentinel rediss://{s}"))),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no sentinels")))
}

/// An error and its causes on one line, each cause said once (the redis
/// crate repeats its I/O cause in its own message).
#[must_use]
pub fn one_line(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        // The redis crate's I/O errors say their cause twice in one
        // message ("Connection refused (os error 111): Connection
        // refused (os error 111)"): each part is said once.
        for part in cause.to_string().split(": ") {
            if part.is_empty() || out.contains(part) {
                continue;
            }
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_from_parts() {
        let url = RedisTarget::from_parts(
            Some("redis://10.0.0.5:6379".into()),
            None,
            None,
            None,
            None,
            None,
        );
        assert!(matches!(url, Ok(RedisTarget::Url { .. })));
        let e = RedisTarget::from_parts(Some("http://x".into()), None, None, None, None, None)
            .unwrap_err();
        assert_eq!(e[0].pointer(), "/url");
        let e = RedisTarget::from_parts(None, None, None, None, None, None).unwrap_err();
        assert_eq!(e, vec![TargetError::Shape]);
        assert!(
            e[0].to_string()
                .contains("`url`, or `sentinels` and `master`")
        );
        let e = RedisTarget::from_parts(
            None,
            Some(vec!["a:1".into(), "nope".into(), ":2".into()]),
            Some("m".into()),
            None,
            Some("PW".into()),
            None,
        )
        .unwrap_err();
        let places: Vec<String> = e.iter().map(TargetError::pointer).collect();
        assert_eq!(places, ["/sentinels/1", "/sentinels/2"]);
        let ok = RedisTarget::from_parts(
            None,
            Some(vec!["a:1".into()]),
            Some("m".into()),
            None,
            Some("PW".into()),
            None,
        )
        .unwrap();
        assert_eq!(ok.password_env(), Some("PW"));
    }

    #[test]
    fn an_acl_user_from_username_or_the_url_without_a_password() {
        let parts = |url: &str, user: Option<&str>| {
            RedisTarget::from_parts(
                Some(url.into()),
                None,
                None,
                user.map(str::to_owned),
                Some("PW".into()),
                None,
            )
        };
        let t = parts("redis://edgeform@10.0.0.5:6379", None).unwrap();
        assert_eq!(t.username(), Some("edgeform"));
        let t = parts("redis://10.0.0.5:6379", Some("edgeform")).unwrap();
        assert_eq!(t.username(), Some("edgeform"));
        let t = parts("redis://edgeform@10.0.0.5:6379", Some("edgeform")).unwrap();
        assert_eq!(t.username(), Some("edgeform"));
        assert_eq!(
            parts("redis://10.0.0.5:6379", None).unwrap().username(),
            None
        );
        let e = |url: &str, user: Option<&str>| parts(url, user).unwrap_err();
        assert_eq!(
            e("redis://a@h:1", Some("b")),
            vec![TargetError::UsernameTwice]
        );
        assert_eq!(e("redis://a:pw@h:1", None), vec![TargetError::UrlPassword]);
        assert_eq!(e("redis://:pw@h:1", None), vec![TargetError::UrlPassword]);
        assert_eq!(
            e("redis://h:1?username=a", None),
            vec![TargetError::UsernameQuery]
        );
        assert_eq!(e("redis://h:1", Some("a b")), vec![TargetError::Username]);
        assert_eq!(e("redis://h:1", Some("")), vec![TargetError::Username]);
        assert_eq!(
            e("redis://h:1", Some("")).first().map(TargetError::pointer),
            Some("/username".into())
        );
        let s = RedisTarget::from_parts(
            None,
            Some(vec!["a:1".into()]),
            Some("m".into()),
            Some("edgeform".into()),
            Some("PW".into()),
            None,
        )
        .unwrap();
        assert_eq!(s.username(), Some("edgeform"));
    }

    #[test]
    fn tls_needs_rediss_both_client_files_and_verification() {
        let tls = TlsFiles {
            ca_file: Some("/etc/ca.pem".into()),
            ..TlsFiles::default()
        };
        let ok = RedisTarget::from_parts(
            Some("rediss://10.0.0.5:6380".into()),
            None,
            None,
            None,
            None,
            Some(tls.clone()),
        )
        .unwrap();
        assert_eq!(ok.tls(), Some(&tls));
        // `tls` without rediss://.
        let e = RedisTarget::from_parts(
            Some("redis://10.0.0.5:6379".into()),
            None,
            None,
            None,
            None,
            Some(tls.clone()),
        )
        .unwrap_err();
        assert_eq!(e, vec![TargetError::TlsWithoutRediss]);
        assert_eq!(e[0].pointer(), "/tls");
        // A client certificate without its key.
        let half = TlsFiles {
            cert_file: Some("/c.pem".into()),
            ..tls.clone()
        };
        let e = RedisTarget::from_parts(
            None,
            Some(vec!["a:1".into()]),
            Some("m".into()),
            None,
            None,
            Some(half),
        )
        .unwrap_err();
        assert_eq!(e, vec![TargetError::TlsPair]);
        // Never skip verification.
        let e = RedisTarget::from_parts(
            Some("rediss://10.0.0.5:6380/#insecure".into()),
            None,
            None,
            None,
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(e, vec![TargetError::Insecure]);
        assert!(is_insecure("rediss://h:1#insecure"));
        assert!(!is_insecure("rediss://h:1"));
    }

    #[test]
    fn an_unreadable_tls_file_is_named() {
        let tls = TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = certificates(&tls).unwrap_err();
        let line = one_line(&e);
        assert!(
            line.starts_with("cannot read /nonexistent/ca.pem (redis.tls.ca_file)"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn one_line_names_each_cause_once() {
        let e =
            anyhow::anyhow!("Connection refused (os error 111): Connection refused (os error 111)")
                .context("connecting to redis://127.0.0.1:1");
        assert_eq!(
            one_line(&e),
            "connecting to redis://127.0.0.1:1: Connection refused (os error 111)"
        );
    }
}
