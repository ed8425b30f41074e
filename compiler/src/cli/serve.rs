//! `edgeform serve`: the read-only HTTP API the reference edge asks on a
//! Redis miss ("the Lua's control-plane API call is a fallback
//! for a Redis miss, not the primary path").
//!
//! `GET /v1/nodes/<node>/keys/<key>` answers exactly the value `edgeform
//! build` gives that node for that key, with `ETag` = the commit. The
//! repository is read at `--rev` (default `HEAD`) through git2; the
//! revision is resolved again on every request and the documents are
//! recompiled when it moves (a revision that fails `check` is refused and
//! the last good one keeps serving). `Authorization: Bearer
//! $EDGEFORM_SERVE_TOKEN` is required (401). TLS with `--tls-cert` and
//! `--tls-key` (PEM), else plain HTTP (behind a TLS-terminating proxy).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::compile::Target;
use crate::load;

/// Environment variable holding the bearer token.
pub const TOKEN_ENV: &str = "EDGEFORM_SERVE_TOKEN";

/// Arguments of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Where to listen, e.g. 127.0.0.1:8440.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM, PKCS#8).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// One compiled revision.
struct Snapshot {
    commit: String,
    targets: BTreeMap<String, Target>,
}

struct Shared {
    repo: PathBuf,
    rev: String,
    token: String,
    current: tokio::sync::Mutex<Option<Arc<Snapshot>>>,
}

fn compile_at(repo: &Path, rev: &str) -> Result<Snapshot> {
    let loaded = load::from_rev(repo, rev)?;
    let checked = crate::check(&loaded);
    let Some(config) = checked.config.as_ref().filter(|_| checked.is_valid()) else {
        bail!("revision `{rev}` fails check: not served");
    };
    let compiled = crate::compile::compile(config);
    Ok(Snapshot {
        commit: loaded.commit.clone().unwrap_or_default(),
        targets: compiled.targets,
    })
}

impl Shared {
    /// The snapshot of the revision as it is now (recompiled when it moved).
    async fn snapshot(self: &Arc<Self>) -> Option<Arc<Snapshot>> {
        let mut current = self.current.lock().await;
        let me = self.clone();
        let now = tokio::task::spawn_blocking(move || load::resolve_rev(&me.repo, &me.rev))
            .await
            .ok()
            .and_then(Result::ok);
        let stale = match (&*current, &now) {
            (Some(s), Some(c)) => &s.commit != c,
            (None, _) => true,
            (Some(_), None) => false,
        };
        if stale {
            let me = self.clone();
            match tokio::task::spawn_blocking(move || compile_at(&me.repo, &me.rev)).await {
                Ok(Ok(s)) => {
                    tracing::info!(commit = %s.commit, "serving");
                    *current = Some(Arc::new(s));
                }
                Ok(Err(e)) => tracing::error!("{e:#}; keeping the last good revision"),
                Err(e) => tracing::error!("compiling: {e}"),
            }
        }
        current.clone()
    }
}

/// Constant-time equality of the presented and the expected token.
fn token_ok(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn value<'t>(target: &'t Target, key: &str) -> Option<&'t str> {
    target.entries().find(|(k, _)| *k == key).map(|(_, v)| v)
}

async fn get_key(
    State(shared): State<Arc<Shared>>,
    UrlPath((node, key)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !token_ok(&headers, &shared.token) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token\n",
        )
            .into_response();
    }
    let Some(snap) = shared.snapshot().await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no valid revision to serve\n",
        )
            .into_response();
    };
    let etag = HeaderValue::from_str(&format!("\"{}\"", snap.commit))
        .unwrap_or(HeaderValue::from_static("\"\""));
    let Some(target) = snap.targets.get(&node) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::ETAG, etag)],
            "unknown node\n",
        )
            .into_response();
    };
    match value(target, &key) {
        Some(v) => (
            StatusCode::OK,
            [
                (header::ETAG, etag),
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                ),
            ],
            v.to_owned(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(header::ETAG, etag)],
            "the node does not get this key\n",
        )
            .into_response(),
    }
}

/// TLS connections for `axum::serve`: handshakes that fail are dropped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_native_tls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_native_tls::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let handshake = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                self.acceptor.accept(stream),
            );
            match handshake.await {
                Ok(Ok(tls)) => return (tls, addr),
                Ok(Err(e)) => tracing::debug!("TLS handshake with {addr}: {e}"),
                Err(_) => tracing::debug!("TLS handshake with {addr} timed out"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// `edgeform serve`: runs until SIGINT/SIGTERM.
///
/// # Errors
/// No token in the environment, no git repository, unreadable TLS files,
/// the address cannot be bound.
pub async fn serve(repo: &Path, rev: Option<&str>, args: &ServeArgs) -> Result<u8> {
    let token = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .with_context(|| format!("set {TOKEN_ENV}: edgeform serve requires a bearer token"))?;
    let rev = rev.unwrap_or("HEAD").to_owned();
    load::resolve_rev(repo, &rev)?;
    let shared = Arc::new(Shared {
        repo: repo.to_path_buf(),
        rev,
        token,
        current: tokio::sync::Mutex::new(None),
    });
    if shared.snapshot().await.is_none() {
        bail!("nothing to serve: the revision does not pass check");
    }
    let app = axum::Router::new()
        .route("/v1/nodes/{node}/keys/{*key}", axum::routing::get(get_key))
        .with_state(shared);
    let tcp = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let cert_pem =
            std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
        let key_pem = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
        let identity = native_tls::Identity::from_pkcs8(&cert_pem, &key_pem)
            .context("the TLS certificate and key")?;
        let acceptor = native_tls::TlsAcceptor::new(identity).context("TLS setup")?;
        eprintln!("edgeform serve: https://{}", args.listen);
        let listener = TlsListener {
            tcp,
            acceptor: acceptor.into(),
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await?;
    } else {
        eprintln!("edgeform serve: http://{}", args.listen);
        axum::serve(tcp, app)
            .with_graceful_shutdown(shutdown)
            .await?;
    }
    Ok(0)
}
