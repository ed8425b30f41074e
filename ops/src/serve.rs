//! `edgeform serve`: the read-only HTTP API the reference edge asks on a
//! Redis miss ("the Lua's control-plane API call is a fallback
//! for a Redis miss, not the primary path").
//!
//! `GET /v1/nodes/<node>/keys/<key>` answers exactly the value `edgeform
//! build` gives that node for that key (never a `tls:*` certificate
//! document: 404), with `ETag` = the commit. The
//! repository is read at `--rev` (default `HEAD`) through git2; the
//! revision is resolved again on every request and the documents are
//! recompiled when it moves, by one request while the others keep getting
//! the last good revision. A revision that fails `check` is refused once
//! and remembered: the last good one keeps serving, without recompiling,
//! until the revision moves again. `Authorization: Bearer
//! $EDGEFORM_SERVE_TOKEN` is required (401). TLS with `--tls-cert` and
//! `--tls-key` (PEM), else plain HTTP (behind a TLS-terminating proxy).
//!
//! Connections: each is its own task (the accept loop only accepts),
//! at most [`MAX_CONNECTIONS`] at once; the TLS handshake must finish
//! within [`HANDSHAKE_TIMEOUT`] and a request's headers arrive within
//! [`HEADER_TIMEOUT`], so idle or slow clients cannot hold up others.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use compiler::compile::Target;
use compiler::load;

/// Environment variable holding the bearer token.
pub const TOKEN_ENV: &str = "EDGEFORM_SERVE_TOKEN";

/// Options of `serve`.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen, e.g. 127.0.0.1:8440.
    pub listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM) and [`Self::tls_key`];
    /// plain HTTP unless both are given.
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM, PKCS8).
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
    /// The last good revision, compiled.
    current: std::sync::RwLock<Option<Arc<Snapshot>>>,
    /// Held by the one request that compiles; the commit that last failed
    /// `check` (not compiled again until the revision moves).
    compiling: tokio::sync::Mutex<Option<String>>,
}

/// Connections served at once (more wait to be accepted).
pub const MAX_CONNECTIONS: usize = 512;
/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a client has to send a request's headers.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn compile_at(repo: &Path, rev: &str) -> Result<Snapshot> {
    let loaded = load::from_rev(repo, rev)?;
    let checked = compiler::check(&loaded);
    let Some(config) = checked.config.as_ref().filter(|_| checked.is_valid()) else {
        bail!("revision `{rev}` fails check: not served");
    };
    let compiled = compiler::compile::compile(config);
    Ok(Snapshot {
        commit: loaded.commit.clone().unwrap_or_default(),
        targets: compiled.targets,
    })
}

impl Shared {
    fn current(&self) -> Option<Arc<Snapshot>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The snapshot of the revision as it is now: recompiled when it moved
    /// to a commit not yet compiled nor known to fail `check`; while one
    /// request compiles, the others get the last good snapshot.
    async fn snapshot(self: &Arc<Self>) -> Option<Arc<Snapshot>> {
        let me = self.clone();
        let head = tokio::task::spawn_blocking(move || load::resolve_rev(&me.repo, &me.rev))
            .await
            .ok()
            .and_then(Result::ok);
        let current = self.current();
        // Unresolvable now: the last good one.
        let Some(head) = head else {
            return current;
        };
        if current.as_ref().is_some_and(|s| s.commit == head) {
            return current;
        }
        let mut failed = match &current {
            Some(_) => match self.compiling.try_lock() {
                Ok(guard) => guard,
                Err(_) => return current,
            },
            None => self.compiling.lock().await,
        };
        if failed.as_deref() == Some(head.as_str()) {
            return current;
        }
        // Another request may have compiled it meanwhile.
        let current = self.current();
        if current.as_ref().is_some_and(|s| s.commit == head) {
            return current;
        }
        let me = self.clone();
        let commit = head.clone();
        match tokio::task::spawn_blocking(move || compile_at(&me.repo, &commit)).await {
            Ok(Ok(s)) => {
                tracing::info!(commit = %s.commit, "serving");
                let s = Arc::new(s);
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(s.clone());
                *failed = None;
                Some(s)
            }
            Ok(Err(e)) => {
                tracing::error!(
                    "{e:#}; keeping the last good revision until the revision moves again"
                );
                *failed = Some(head);
                current
            }
            Err(e) => {
                tracing::error!("compiling: {e}");
                current
            }
        }
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
    // Never a certificate document: one bearer token must not hand out
    // every private key (an edge reads its own from its Redis only).
    let found = if edgestate::tls::is_cert_key(&key) {
        None
    } else {
        value(target, &key)
    };
    match found {
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

/// Serve one connection: the TLS handshake (when `tls`) within
/// [`HANDSHAKE_TIMEOUT`], then HTTP/1.1 with [`HEADER_TIMEOUT`] for each
/// request's headers.
async fn connection(
    stream: tokio::net::TcpStream,
    addr: SocketAddr,
    tls: Option<Arc<tokio_native_tls::TlsAcceptor>>,
    app: axum::Router,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let served = match tls {
        Some(acceptor) => {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!("TLS handshake with {addr}: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake with {addr} timed out");
                    return;
                }
            };
            http.serve_connection(TokioIo::new(tls), service).await
        }
        None => http.serve_connection(TokioIo::new(stream), service).await,
    };
    if let Err(e) = served {
        tracing::debug!("connection from {addr}: {e}");
    }
}

/// Accept until `shutdown`, each connection in its own task, at most
/// [`MAX_CONNECTIONS`] at once.
async fn accept_loop(
    tcp: tokio::net::TcpListener,
    tls: Option<tokio_native_tls::TlsAcceptor>,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let tls = tls.map(Arc::new);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            a = tcp.accept() => a,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: back off.
                tracing::debug!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let tls = tls.clone();
        let app = app.clone();
        tokio::spawn(async move {
            connection(stream, addr, tls, app).await;
            drop(permit);
        });
    }
}

/// `edgeform serve`: runs until SIGINT/SIGTERM.
///
/// # Errors
/// No token in the environment, no git repository, unreadable TLS files,
/// the address cannot be bound.
pub async fn serve(repo: &Path, rev: Option<&str>, args: &ServeOptions) -> Result<u8> {
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
        current: std::sync::RwLock::new(None),
        compiling: tokio::sync::Mutex::new(None),
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
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let cert_pem =
                std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
            let key_pem =
                std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
            let identity = native_tls::Identity::from_pkcs8(&cert_pem, &key_pem)
                .context("the TLS certificate and key")?;
            let acceptor = native_tls::TlsAcceptor::new(identity).context("TLS setup")?;
            eprintln!("edgeform serve: https://{}", args.listen);
            Some(acceptor.into())
        }
        _ => {
            eprintln!("edgeform serve: http://{}", args.listen);
            None
        }
    };
    accept_loop(tcp, tls, app, shutdown).await;
    Ok(0)
}
