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
//! ours). A connect timeout bounds unreachable targets; a generous
//! response timeout ([`RESPONSE_TIMEOUT`]) bounds a server that took the
//! connection and then answers nothing (frozen, or cut off without a
//! reset): the redis crate's default 500 ms would fail a 100,000-key
//! MULTI/EXEC client-side while the server still applies it, none at all
//! would let one such edge hold a run forever.
//!
//! TLS: a `rediss://` URL, or Sentinels with a `tls` block, connect with
//! TLS (native-tls, i.e. OpenSSL). The server certificate is always
//! verified — against `tls.ca_file` when given, else the system trust
//! store; `#insecure` URLs are refused. `cert_file` + `key_file` add a
//! client certificate.
//!
//! The sockets are opened here (TCP, TLS, Unix) and every reply is read
//! through [`bounded::Bounded`] before the redis crate's parser sees it:
//! a server that announces or sends a reply past [`bounded::LIMITS`]
//! fails the connection instead of growing this process. For the same
//! reason the master is resolved through the Sentinels here
//! (`SENTINEL MASTER`), with or without TLS.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, ConnectionAddr, IntoConnectionInfo,
    RedisConnectionInfo, TlsCertificates,
};

pub mod bounded;

pub use edgestate::target::{
    RedisTarget, TargetError, TlsFiles, describe, is_insecure, redis_url_accepted, url_user,
    valid_username,
};

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

/// How long to wait for a TCP connection (per attempt).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one request (a command, or a whole pipeline or transaction)
/// may go unanswered before the connection is given up: far above what the
/// largest write takes (a full apply of 100,000 sites writes each target in
/// well under ten seconds), so only a server that stopped answering hits
/// it. Callers with a tighter need (the agent's BLMOVE, `purge`'s
/// enqueue) set their own deadline inside it.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

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
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
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
    Ok(connect(target, node, None, None).await?.con)
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
    Ok(connect(target, node, Some(&pushes), None).await?.con)
}

/// A connection to a node's master and what its `ROLE` said of it.
pub struct Master {
    /// The connection.
    pub con: MultiplexedConnection,
    /// How many replicas the master listed as connected: a write it
    /// acknowledged survives a failover only once one of them has it
    /// (`WAIT`).
    pub replicas: usize,
}

/// Like [`master`], with the replicas the master listed (`edgeform
/// purge`, which asks one of them to confirm the job).
///
/// # Errors
/// See [`master`].
pub async fn master_counted(target: &RedisTarget, node: &str) -> Result<Master> {
    connect(target, node, None, None).await
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
) -> Result<Master> {
    connect(target, node, Some(&pushes), Some(channel)).await
}

async fn connect(
    target: &RedisTarget,
    node: &str,
    pushes: Option<&Pushes>,
    subscribe: Option<&str>,
) -> Result<Master> {
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
            let info = url.as_str().into_connection_info()?;
            let settings = settings(
                info.redis_settings().clone(),
                username.clone(),
                password(password_env.as_deref(), node)?,
                pushes,
            );
            let certs = tls.as_ref().map(certificates).transpose()?;
            if certs.is_some() && !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
                bail!("{url}: a `tls` block needs a rediss:// URL");
            }
            let con = open_within(
                Some(node),
                CONNECT_TIMEOUT * 3,
                info.addr(),
                &settings,
                certs.as_ref(),
                config(pushes),
            )
            .await?;
            checked_master(con, &describe(target), subscribe).await
        }
        RedisTarget::Sentinel {
            sentinels,
            master,
            username,
            password_env,
            tls,
        } => {
            let settings = settings(
                RedisConnectionInfo::default(),
                username.clone(),
                password(password_env.as_deref(), node)?,
                pushes,
            );
            let certs = tls.as_ref().map(certificates).transpose()?;
            through_sentinels(
                node,
                sentinels,
                master,
                &settings,
                certs.as_ref(),
                pushes,
                subscribe,
            )
            .await
            .with_context(|| {
                format!(
                    "resolving master `{master}` through {}{}",
                    sentinels.join(","),
                    if tls.is_some() { " (TLS)" } else { "" }
                )
            })
        }
    }
}

/// The handshake settings: the ACL user and password when given, RESP3 for
/// push messages (see [`protocol`]).
fn settings(
    mut settings: RedisConnectionInfo,
    username: Option<String>,
    password: Option<String>,
    pushes: Option<&Pushes>,
) -> RedisConnectionInfo {
    if let Some(u) = username {
        settings = settings.set_username(u);
    }
    if let Some(p) = password {
        settings = settings.set_password(p);
    }
    protocol(settings, pushes)
}

/// [`open`], given up after `limit` (TCP connect, TLS and handshake).
async fn open_within(
    node: Option<&str>,
    limit: Duration,
    addr: &ConnectionAddr,
    settings: &RedisConnectionInfo,
    certs: Option<&TlsCertificates>,
    config: AsyncConnectionConfig,
) -> Result<MultiplexedConnection> {
    tokio::time::timeout(limit, open(node, addr, settings, certs, config))
        .await
        .map_err(|_| anyhow::anyhow!("timed out connecting"))?
}

/// A connection to the server at `addr` (TCP, TLS with `certs`, or a Unix
/// socket), every reply read through [`bounded::Bounded`].
async fn open(
    node: Option<&str>,
    addr: &ConnectionAddr,
    settings: &RedisConnectionInfo,
    certs: Option<&TlsCertificates>,
    config: AsyncConnectionConfig,
) -> Result<MultiplexedConnection> {
    let tcp = |host: String, port: u16| async move {
        let s = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .map_err(|_| anyhow::anyhow!("{host}:{port}: no connection in {CONNECT_TIMEOUT:?}"))?
        .with_context(|| format!("connecting to {host}:{port}"))?;
        s.set_nodelay(true)?;
        Ok::<_, anyhow::Error>(s)
    };
    match addr {
        ConnectionAddr::Tcp(host, port) => {
            let s = tcp(host.clone(), *port).await?;
            start(node, settings, s, config, format!("{host}:{port}")).await
        }
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => {
            if *insecure {
                bail!("{host}:{port}: certificates are always verified");
            }
            let connector = tls_connector(certs)?;
            let s = tcp(host.clone(), *port).await?;
            let s = connector
                .connect(host, s)
                .await
                .with_context(|| format!("TLS with {host}:{port}"))?;
            start(node, settings, s, config, format!("{host}:{port}")).await
        }
        ConnectionAddr::Unix(path) => {
            let s = tokio::net::UnixStream::connect(path)
                .await
                .with_context(|| format!("connecting to {}", path.display()))?;
            start(node, settings, s, config, path.display().to_string()).await
        }
        other => bail!("{other}: not a kind of address edgeform connects to"),
    }
}

/// The handshake (AUTH, HELLO, SELECT as `settings` say) over `stream`,
/// its replies bounded, and the connection's driver spawned (it ends with
/// the last clone of the connection).
async fn start<S>(
    node: Option<&str>,
    settings: &RedisConnectionInfo,
    stream: S,
    config: AsyncConnectionConfig,
    server: String,
) -> Result<MultiplexedConnection>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Only a master connection's refusal is kept for its node's errors.
    let stream = bounded::Bounded::new(stream, bounded::LIMITS, server).for_node(node);
    let (con, driver) = MultiplexedConnection::new_with_config(settings, stream, config).await?;
    tokio::spawn(driver);
    Ok(con)
}

/// A native-tls (OpenSSL) connector verifying with `certs`: their CA file
/// replaces the system trust store (as the redis crate does), their client
/// certificate is presented.
fn tls_connector(certs: Option<&TlsCertificates>) -> Result<tokio_native_tls::TlsConnector> {
    const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const PEM_END: &str = "-----END CERTIFICATE-----";
    let mut builder = native_tls::TlsConnector::builder();
    if let Some(certs) = certs {
        if let Some(ca) = &certs.root_cert {
            let text = std::str::from_utf8(ca).context("the CA file is not PEM text")?;
            builder.disable_built_in_roots(true);
            // `from_pem` reads one certificate: a bundle is split first.
            let mut any = false;
            for block in text
                .split_inclusive(PEM_END)
                .filter_map(|b| b.find(PEM_BEGIN).map(|i| &b[i..]))
            {
                builder.add_root_certificate(
                    native_tls::Certificate::from_pem(block.as_bytes())
                        .context("a certificate of the CA file")?,
                );
                any = true;
            }
            if !any {
                bail!("the CA file holds no PEM certificate");
            }
        }
        if let Some(client) = &certs.client_tls {
            builder.identity(
                native_tls::Identity::from_pkcs8(&client.client_cert, &client.client_key)
                    .context("the client certificate and key (PEM, PKCS#8 key)")?,
            );
        }
    }
    Ok(builder.build()?.into())
}

/// The master `name` as the Sentinels see it: each asked in turn
/// (`SENTINEL MASTER`); the first whose master is flagged up (neither
/// `s_down` nor `o_down`) and answers `ROLE` as a master wins, as the redis
/// crate's Sentinel client decides. Sentinels and master are reached over
/// TLS with `certs` when given.
async fn through_sentinels(
    node: &str,
    sentinels: &[String],
    name: &str,
    settings: &RedisConnectionInfo,
    certs: Option<&TlsCertificates>,
    pushes: Option<&Pushes>,
    subscribe: Option<&str>,
) -> Result<Master> {
    let addr = |host: String, port: u16| match certs {
        Some(_) => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        },
        None => ConnectionAddr::Tcp(host, port),
    };
    let mut last = None;
    for s in sentinels {
        let asked = async {
            let (host, port) = edgestate::target::sentinel_addr(s)
                .with_context(|| format!("`{s}` is not host:port"))?;
            let mut con = open_within(
                None,
                CONNECT_TIMEOUT * 2,
                &addr(host.to_owned(), port),
                &protocol(RedisConnectionInfo::default(), None),
                certs,
                config(None),
            )
            .await?;
            let fields: std::collections::HashMap<String, String> = tokio::time::timeout(
                CONNECT_TIMEOUT,
                redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(name)
                    .query_async(&mut con),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no answer to SENTINEL MASTER"))??;
            master_address(&fields)
                .ok_or_else(|| anyhow::anyhow!("its master `{name}` is down or has no address"))
        };
        let found = match asked.await {
            Ok(found) => found,
            Err(e) => {
                last = Some(e.context(format!("sentinel {s}")));
                continue;
            }
        };
        let (host, port) = found;
        let reached = async {
            let con = open_within(
                Some(node),
                CONNECT_TIMEOUT * 2,
                &addr(host.clone(), port),
                settings,
                certs,
                config(pushes),
            )
            .await?;
            let at = format!("{host}:{port}");
            tokio::time::timeout(CONNECT_TIMEOUT, checked_master(con, &at, subscribe))
                .await
                .map_err(|_| anyhow::anyhow!("{at}: no answer to ROLE"))?
        };
        match reached.await {
            Ok(master) => return Ok(master),
            Err(e) => {
                last = Some(e.context(format!("master `{name}` at {host}:{port} (sentinel {s})")));
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no sentinels")))
}

/// A `SENTINEL MASTER` reply's address, when it flags the master up.
/// Pure.
fn master_address(fields: &std::collections::HashMap<String, String>) -> Option<(String, u16)> {
    let flags = fields.get("flags")?;
    let up = flags.split(',').any(|f| f == "master")
        && !flags.split(',').any(|f| f == "s_down" || f == "o_down");
    let port = fields.get("port")?.parse().ok()?;
    let ip = fields.get("ip")?.clone();
    up.then_some((ip, port))
}

/// `con` (to the server `at`, for the message) checked to be a master:
/// writing to a replica would fail later and less clearly. With a
/// channel, its SUBSCRIBE is sent right behind the ROLE on the same
/// connection (the multiplexer writes both before either reply).
async fn checked_master(
    mut con: MultiplexedConnection,
    at: &str,
    subscribe: Option<&str>,
) -> Result<Master> {
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
        Ok(Master {
            con,
            replicas: replicas_listed(&role),
        })
    } else {
        bail!("{at} is not a master (ROLE says otherwise)")
    }
}

/// How many replicas a master's `ROLE` reply lists (`["master", offset,
/// [[ip, port, offset], …]]`); 0 for anything else. Pure.
fn replicas_listed(role: &[redis::Value]) -> usize {
    match role.get(2) {
        Some(redis::Value::Array(replicas)) => replicas.len(),
        _ => 0,
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

/// `e`, from work on `node`'s Redis, with the reason its connection was
/// dropped when this crate refused a reply on it: the redis crate reports
/// such a connection only as dropped (`broken pipe`). Unchanged when the
/// chain holds no dropped connection, or already says why.
#[must_use]
pub fn with_refusal(node: &str, e: anyhow::Error) -> anyhow::Error {
    let dropped = e.chain().any(|c| {
        c.downcast_ref::<redis::RedisError>()
            .is_some_and(redis::RedisError::is_connection_dropped)
    });
    let said = e.chain().any(|c| {
        c.downcast_ref::<bounded::Refused>().is_some()
            || c.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .is_some_and(|inner| inner.is::<bounded::Refused>())
    });
    match bounded::refused_on(node) {
        Some((server, why)) if dropped && !said => e.context(format!(
            "{server} sent a reply past the limits, connection dropped: {why}"
        )),
        _ => e,
    }
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
    // A server's error reply (or a value the redis crate quotes in a type
    // error) is its own text, of any length: cut, and no control
    // character of it reaches a terminal or a log line.
    if out.len() > ONE_LINE_MAX {
        let mut cut = ONE_LINE_MAX;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        let more = out.len() - cut;
        out.truncate(cut);
        out.push_str(&format!("… ({more} more bytes)"));
    }
    edgestate::untrusted::escape(&out)
}

/// The longest [`one_line`], in bytes before escaping.
pub const ONE_LINE_MAX: usize = 2000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The pure URL check (what agent.yaml and node files are validated
    /// with, without the redis crate) accepts exactly what the redis
    /// crate takes.
    #[test]
    fn the_pure_url_check_agrees_with_the_redis_crate() {
        let urls = [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1",
            "redis://h:6379/0",
            "redis://h:6379/15",
            "redis://h:6379/x",
            "redis://h:6379//3/",
            "redis://h:6379/-1",
            "redis://",
            "redis:///0",
            "redis://0.0.0.0:6379",
            "redis://[::]:6379",
            "redis://[::1]:6379",
            "redis://[::1",
            "redis://h:99999",
            "redis://h:0",
            "rediss://h",
            "rediss://h#insecure",
            "rediss://h/#insecure",
            "rediss://h#",
            "rediss://h#other",
            "redis://h#other",
            "redis://user@h",
            "redis://us%20er@h",
            "redis://%ff@h",
            "redis://u:%ff@h",
            "redis://u:p%41@h",
            "redis://:pw@h",
            "redis://h/?protocol=resp3",
            "redis://h/?protocol=2",
            "redis://h/?protocol=4",
            "redis://h/?protocol=4&protocol=3",
            "redis://h/?username=x",
            "valkey://h",
            "valkeys://h#x",
            "unix:///run/redis.sock",
            "unix:///run/redis.sock?db=2",
            "unix:///run/redis.sock?db=x",
            "unix:///run/redis.sock?protocol=9",
            "unix://host/run/redis.sock",
            "unix://localhost/run/redis.sock",
            "unix:relative",
            "redis+unix:///run/redis.sock",
            "http://h",
            "h:6379",
            "",
            "redis:h",
            "redis://h:6379/0?db=1",
            "redis://ho st",
            "redis://h%41",
        ];
        for url in urls {
            assert_eq!(
                redis_url_accepted(url),
                url.into_connection_info().is_ok(),
                "{url}"
            );
        }
    }

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

    #[test]
    fn one_line_cuts_a_servers_endless_text() {
        let e = anyhow::anyhow!("value was array([{}])", "int(1), ".repeat(100_000));
        let said = one_line(&e);
        assert!(said.len() < ONE_LINE_MAX + 40, "{}", said.len());
        assert!(said.ends_with("more bytes)"), "{said}");
        let e = anyhow::anyhow!("{}", "é".repeat(ONE_LINE_MAX));
        assert!(one_line(&e).contains("… ("));
    }

    #[test]
    fn a_sentinels_master_counts_only_when_flagged_up_with_an_address() {
        let fields = |flags: &str, ip: Option<&str>, port: &str| {
            let mut m = std::collections::HashMap::new();
            m.insert("flags".to_owned(), flags.to_owned());
            m.insert("port".to_owned(), port.to_owned());
            if let Some(ip) = ip {
                m.insert("ip".to_owned(), ip.to_owned());
            }
            m
        };
        assert_eq!(
            master_address(&fields("master", Some("10.0.0.1"), "6379")),
            Some(("10.0.0.1".to_owned(), 6379))
        );
        for down in ["master,s_down", "master,o_down", "s_down,master", "slave"] {
            assert_eq!(
                master_address(&fields(down, Some("h"), "6379")),
                None,
                "{down}"
            );
        }
        assert_eq!(master_address(&fields("master", None, "6379")), None);
        assert_eq!(master_address(&fields("master", Some("h"), "x")), None);
        assert_eq!(master_address(&fields("master", Some("h"), "70000")), None);
    }

    #[test]
    fn a_masters_role_reply_counts_its_listed_replicas() {
        use redis::Value::{Array, BulkString, Int};
        let replica = |port: &[u8]| {
            Array(vec![
                BulkString(b"127.0.0.1".to_vec()),
                BulkString(port.to_vec()),
                BulkString(b"100".to_vec()),
            ])
        };
        let role = |replicas: Vec<redis::Value>| {
            vec![BulkString(b"master".to_vec()), Int(100), Array(replicas)]
        };
        assert_eq!(replicas_listed(&role(vec![])), 0);
        assert_eq!(
            replicas_listed(&role(vec![replica(b"1"), replica(b"2")])),
            2
        );
        assert!(is_master(&role(vec![replica(b"1")])));
        // A replica's reply, or anything short: none listed.
        let of_replica = vec![
            BulkString(b"slave".to_vec()),
            BulkString(b"127.0.0.1".to_vec()),
            Int(6379),
        ];
        assert_eq!(replicas_listed(&of_replica), 0);
        assert_eq!(replicas_listed(&[]), 0);
    }
}
