//! Certificates from an ACME CA (RFC 8555) over HTTP-01, through the
//! edges: for each name of an order, the challenge's key authorization is
//! written as `acme:<token>` (with a TTL of the order's bound,
//! `cluster.yaml` `acme.order_timeout`, [`ORDER_LIFE`] by default)
//! into the Redis of every node the CA's request can reach; the edge
//! answers `GET /.well-known/acme-challenge/<token>` from it. The keys are
//! removed when the order ends, whatever the outcome.
//!
//! The client is the `instant-acme` crate; the account key is kept in the
//! state directory ([`Store::acme_account`], `acme/account.json`, 0600),
//! made on first use. The certificate's key is fresh for every order
//! (P-256, made and put in the CSR with OpenSSL). What the CA returns goes
//! through the same checks as an imported certificate ([`certs::parse`],
//! [`certs::check_now`], and it must name every host) before it replaces
//! the certificate of that name as a whole: a failed order keeps the old
//! one, and nothing half-made is stored.
//!
//! The client's HTTP is `CaHttp`: instant-acme's own stack (hyper +
//! rustls), wrapped so that every request is bounded in time and the
//! `Retry-After` of an error response is kept — instant-acme gives an
//! error response's problem document but not its headers. A CA's error
//! response that is not a problem document becomes one (`about:blank`
//! with the HTTP status), so it is still the CA's problem.
//!
//! A problem this side made has `"type": "about:blank"` and a `kind`
//! member ([`LocalKind`]) saying what went wrong, for programs.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::BodyExt;

use compiler::tls::Certificate;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, BodyWrapper, BytesResponse, ChallengeType,
    HttpClient, Identifier, NewAccount, NewOrder, OrderStatus, Problem, RetryPolicy,
};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::stack::Stack;
use openssl::x509::X509ReqBuilder;
use openssl::x509::extension::SubjectAlternativeName;

use crate::certs;
use crate::store::{Store, StoredCert};

/// How long an order may take, from its creation to the certificate, when
/// `cluster.yaml` does not say (`acme.order_timeout`): the bound of the
/// whole order, and the TTL of its challenge keys (a key outlives no
/// order, even when this process dies before removing it).
pub const ORDER_LIFE: Duration =
    Duration::from_secs(compiler::model::resolved::ACME_ORDER_TIMEOUT_DEFAULT_S);

/// The longest one HTTP request to the CA may take (answer and body),
/// within the order's bound.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `cluster.yaml`'s `acme`: the CA's directory URL, the account's contacts
/// (`mailto:` URIs), and a PEM file of roots to trust for the directory's
/// HTTPS instead of the system's (a private or test CA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub directory: String,
    pub contact: Vec<String>,
    pub ca_file: Option<PathBuf>,
    /// The bound of one order ([`ORDER_LIFE`] by default).
    pub order_timeout: Duration,
}

/// One certificate to order: its name in the state directory and the DNS
/// names it must cover (a site's host and aliases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub name: String,
    pub hosts: Vec<String>,
}

/// Why a host got no certificate: the host and the CA's problem document
/// (RFC 7807, as JSON), or what went wrong on this side (as a problem
/// document of type `about:blank` with a `kind`, [`LocalKind`], read by
/// [`Failure::local_kind`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub host: String,
    /// The problem document, JSON.
    pub problem: String,
    /// Whether the CA said it (false: this side, e.g. Redis or the store).
    pub from_ca: bool,
    /// The CA asked to wait this many seconds before trying again
    /// (`rateLimited` with `Retry-After`).
    pub retry_after: Option<u64>,
}

/// What went wrong on this side (or with what the CA sent), the `kind`
/// member of a local problem document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalKind {
    /// The CA did not answer one request within its bound.
    CaNoAnswer,
    /// The CA could not be reached or spoke no HTTP we understand.
    CaUnreachable,
    /// The order stayed `pending` (or `processing`) past the order's bound.
    OrderPending,
    /// The whole order took longer than its bound.
    OrderTimeout,
    /// The order went invalid without saying why.
    OrderInvalid,
    /// The CA offers no http-01 challenge for a name.
    NoHttp01,
    /// What the CA sent as the certificate is not usable: not PEM, a chain
    /// out of order, not the key of this order, not valid now.
    BadCertificate,
    /// The CA's certificate does not name a host of the order.
    NameMissing,
    /// An edge's Redis did not take a challenge.
    Edge,
    /// The state directory could not keep the certificate.
    Store,
    /// Anything else on this side (e.g. making the key).
    Other,
}

impl LocalKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CaNoAnswer => "ca-no-answer",
            Self::CaUnreachable => "ca-unreachable",
            Self::OrderPending => "order-pending",
            Self::OrderTimeout => "order-timeout",
            Self::OrderInvalid => "order-invalid",
            Self::NoHttp01 => "no-http-01",
            Self::BadCertificate => "bad-certificate",
            Self::NameMissing => "name-missing",
            Self::Edge => "edge",
            Self::Store => "store",
            Self::Other => "other",
        }
    }
}

impl Failure {
    fn ca(host: &str, p: &Problem, retry_after: Option<u64>) -> Failure {
        Failure {
            host: host.to_owned(),
            problem: problem_json(p),
            from_ca: true,
            retry_after,
        }
    }

    fn local(host: &str, kind: LocalKind, detail: impl std::fmt::Display) -> Failure {
        Failure {
            host: host.to_owned(),
            problem: serde_json::json!({
                "type": "about:blank",
                "kind": kind.as_str(),
                "detail": detail.to_string(),
            })
            .to_string(),
            from_ca: false,
            retry_after: None,
        }
    }

    /// What the CA sent as the certificate is refused: `kind`
    /// `bad-certificate`, and `certificate` the check's own kind
    /// ([`certs::CertErrorKind::as_str`]: `not-pem`, `chain-order`,
    /// `key-mismatch`, …).
    fn bad_certificate(host: &str, e: &certs::CertError) -> Failure {
        let mut f = Failure::local(
            host,
            LocalKind::BadCertificate,
            format!("the CA's certificate is not usable: {e}"),
        );
        if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&f.problem) {
            v["certificate"] = e.kind.as_str().into();
            f.problem = v.to_string();
        }
        f
    }

    /// The `kind` of a problem made on this side ([`LocalKind::as_str`]);
    /// `None` for the CA's.
    #[must_use]
    pub fn local_kind(&self) -> Option<String> {
        if self.from_ca {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&self.problem).ok()?;
        v.get("kind")?.as_str().map(str::to_owned)
    }
}

impl std::fmt::Display for Failure {
    /// `host H got no certificate: {problem}`, and `; retry after N s` when
    /// the CA asked to wait.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host {} got no certificate: {}", self.host, self.problem)?;
        if let Some(s) = self.retry_after {
            write!(f, "; retry after {s} s")?;
        }
        Ok(())
    }
}

fn problem_json(p: &Problem) -> String {
    let mut v = serde_json::json!({});
    if let Some(t) = &p.r#type {
        v["type"] = t.clone().into();
    }
    if let Some(d) = &p.detail {
        v["detail"] = d.clone().into();
    }
    if let Some(s) = p.status {
        v["status"] = s.into();
    }
    if !p.subproblems.is_empty() {
        v["subproblems"] = p
            .subproblems
            .iter()
            .map(|sp| {
                let mut o = serde_json::json!({});
                if let Some(t) = &sp.r#type {
                    o["type"] = t.clone().into();
                }
                if let Some(d) = &sp.detail {
                    o["detail"] = d.clone().into();
                }
                if let Some(instant_acme::Identifier::Dns(h)) = &sp.identifier {
                    o["identifier"] = serde_json::json!({"type": "dns", "value": h});
                }
                o
            })
            .collect();
    }
    v.to_string()
}

/// The one request the CA did not answer within its bound.
#[derive(Debug)]
struct NoAnswer(Duration);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the CA did not answer within {} s", self.0.as_secs())
    }
}

impl std::error::Error for NoAnswer {}

/// The HTTP client of the ACME account: instant-acme's own stack (hyper +
/// rustls, HTTP/1.1 and HTTP/2), each request and its body bounded by
/// `timeout`, and the `Retry-After` of the last error response kept in
/// `retry_after` (seconds from when it came) for [`issue`] to give with
/// the failure.
struct CaHttp {
    inner: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        BodyWrapper<Bytes>,
    >,
    timeout: Duration,
    retry_after: Arc<Mutex<Option<u64>>>,
}

impl CaHttp {
    fn new(
        ca_file: Option<&std::path::Path>,
        timeout: Duration,
        retry_after: Arc<Mutex<Option<u64>>>,
    ) -> Result<CaHttp, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match ca_file {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| format!("acme ca_file {}: {e}", path.display()))?;
                let certs = openssl::x509::X509::stack_from_pem(&pem).map_err(|_| {
                    format!("acme ca_file {}: not PEM certificates", path.display())
                })?;
                let mut roots = rustls::RootCertStore::empty();
                for c in certs {
                    let der = c.to_der().map_err(|e| e.to_string())?;
                    roots
                        .add(der.into())
                        .map_err(|e| format!("acme ca_file {}: {e}", path.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!(
                        "acme ca_file {}: holds no certificate",
                        path.display()
                    ));
                }
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                builder.with_tls_config(config)
            }
            None => builder
                .with_provider_and_platform_verifier(provider)
                .map_err(|e| format!("the system's roots: {e}"))?,
        };
        let connector = builder.https_only().enable_http1().enable_http2().build();
        let inner =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        Ok(CaHttp {
            inner,
            timeout,
            retry_after,
        })
    }
}

/// `Retry-After` (seconds, or an HTTP date) as seconds from `now`.
fn retry_after_secs(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map_or(0, |d| d.as_secs()))
}

impl HttpClient for CaHttp {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let fut = self.inner.request(req);
        let timeout = self.timeout;
        let seen = Arc::clone(&self.retry_after);
        Box::pin(async move {
            let no_answer = || instant_acme::Error::Other(Box::new(NoAnswer(timeout)));
            let deadline = tokio::time::Instant::now() + timeout;
            let rsp = tokio::time::timeout_at(deadline, fut)
                .await
                .map_err(|_| no_answer())?
                .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
            let (parts, body) = rsp.into_parts();
            let body = tokio::time::timeout_at(deadline, body.collect())
                .await
                .map_err(|_| no_answer())?
                .map_err(instant_acme::Error::Hyper)?
                .to_bytes();
            let mut parts = parts;
            let mut body = body;
            if parts.status.is_client_error() || parts.status.is_server_error() {
                let after = parts
                    .headers
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry_after_secs(v, SystemTime::now()));
                if let Ok(mut s) = seen.lock() {
                    *s = after;
                }
                // An error without a problem document (a proxy's page, an
                // empty body) is still the CA's answer: made one.
                if serde_json::from_slice::<Problem>(&body).is_err() {
                    body = Bytes::from(
                        serde_json::json!({
                            "type": "about:blank",
                            "status": parts.status.as_u16(),
                            "detail": format!(
                                "the CA answered HTTP {} without a problem document",
                                parts.status
                            ),
                        })
                        .to_string(),
                    );
                    parts.headers.insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/problem+json"),
                    );
                    parts.headers.remove(http::header::CONTENT_LENGTH);
                }
            } else if let Ok(mut s) = seen.lock() {
                *s = None;
            }
            let full = http_body_util::Full::new(body);
            Ok(BytesResponse::from(http::Response::from_parts(parts, full)))
        })
    }
}

/// An open ACME account and what its HTTP client saw.
pub struct Ca {
    pub account: Account,
    /// The `Retry-After` of the CA's last error response, seconds.
    retry_after: Arc<Mutex<Option<u64>>>,
    /// The bound of one order.
    pub order_timeout: Duration,
}

impl Ca {
    fn last_retry_after(&self) -> Option<u64> {
        self.retry_after.lock().ok().and_then(|mut s| s.take())
    }
}

/// Open the account: the one in `store`, or a new one at the CA (kept in
/// `store` before it is used).
///
/// # Errors
/// The CA cannot be reached, does not answer in time, or refuses; the
/// store cannot be read or written; the kept credentials do not parse.
pub async fn account(store: &dyn Store, settings: &Settings) -> Result<Ca, String> {
    let seen = Arc::new(Mutex::new(None));
    // Half the order's bound at most: a request the CA leaves unanswered
    // is named as such before the order's bound ends it.
    let request_timeout = REQUEST_TIMEOUT
        .min(settings.order_timeout / 2)
        .max(Duration::from_secs(1));
    let builder = || -> Result<instant_acme::AccountBuilder, String> {
        Ok(Account::builder_with_http(Box::new(CaHttp::new(
            settings.ca_file.as_deref(),
            request_timeout,
            Arc::clone(&seen),
        )?)))
    };
    let ca = |account| Ca {
        account,
        retry_after: Arc::clone(&seen),
        order_timeout: settings.order_timeout,
    };
    if let Some(json) = store.acme_account().map_err(|e| e.to_string())? {
        let creds: AccountCredentials = serde_json::from_str(&json)
            .map_err(|e| format!("acme/account.json in the state directory: {e}"))?;
        return builder()?
            .from_credentials(creds)
            .await
            .map(ca)
            .map_err(|e| format!("ACME account at {}: {e}", settings.directory));
    }
    let contact: Vec<&str> = settings.contact.iter().map(String::as_str).collect();
    let (account, creds) = builder()?
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            settings.directory.clone(),
            None,
        )
        .await
        .map_err(|e| format!("ACME account at {}: {e}", settings.directory))?;
    let json = serde_json::to_string(&creds).map_err(|e| e.to_string())?;
    store.set_acme_account(&json).map_err(|e| e.to_string())?;
    Ok(ca(account))
}

/// Where challenge keys go: the Redis of every node the CA's request can
/// reach (see [`issue_sites`] for which), one connection each, by node.
pub struct RedisSink {
    pub nodes: Vec<(String, redis::aio::MultiplexedConnection)>,
}

impl RedisSink {
    /// Set `key` to `value` for `ttl` on every node.
    ///
    /// # Errors
    /// The first node that could not be written (the caller removes what
    /// was written).
    pub async fn put(&mut self, key: &str, value: &str, ttl: Duration) -> Result<(), String> {
        for (node, conn) in &mut self.nodes {
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("EX")
                .arg(ttl.as_secs().max(1))
                .query_async::<()>(conn)
                .await
                .map_err(|e| format!("node {node}'s Redis did not take the challenge: {e}"))?;
        }
        Ok(())
    }

    /// Remove `key` from every node it can (best effort: the TTL ends the
    /// rest).
    pub async fn remove(&mut self, key: &str) {
        for (node, conn) in &mut self.nodes {
            if let Err(e) = redis::cmd("DEL").arg(key).query_async::<()>(conn).await {
                tracing::warn!(node = %node, key, error = %e, "challenge key not removed (its TTL will)");
            }
        }
    }
}

/// How far ahead of the local clock a just-issued certificate may start
/// (whole-second clocks on both sides, and the CA's clock).
const ISSUED_CLOCK_SKEW_SECS: i64 = 300;

/// Order `req`'s certificate and keep it in `store` as `req.name`; on any
/// failure, the hosts that failed with the problem (the store unchanged).
///
/// # Errors
/// Each failed host with its problem document.
pub async fn issue(
    ca: &Ca,
    store: &dyn Store,
    sink: &mut RedisSink,
    req: &Request,
    now: i64,
) -> Result<Certificate, Vec<Failure>> {
    let mut keys = Vec::new();
    let bound = ca.order_timeout;
    let out = match tokio::time::timeout(bound, order(ca, store, sink, req, now, &mut keys)).await {
        Ok(out) => out,
        Err(_) => Err(all(req, |h| {
            Failure::local(
                h,
                LocalKind::OrderTimeout,
                format!(
                    "the order did not complete within {} s (acme.order_timeout)",
                    bound.as_secs()
                ),
            )
        })),
    };
    for k in &keys {
        sink.remove(k).await;
    }
    out
}

fn all(req: &Request, f: impl Fn(&str) -> Failure) -> Vec<Failure> {
    req.hosts.iter().map(|h| f(h)).collect()
}

/// `e` for every host of `req`: the CA's problem (with the `Retry-After`
/// its response carried), or this side's.
fn ca_or_local(ca: &Ca, req: &Request, e: &instant_acme::Error) -> Vec<Failure> {
    match e {
        instant_acme::Error::Api(p) => {
            let after = ca.last_retry_after();
            all(req, |h| Failure::ca(h, p, after))
        }
        instant_acme::Error::Other(inner) if inner.downcast_ref::<NoAnswer>().is_some() => {
            all(req, |h| Failure::local(h, LocalKind::CaNoAnswer, inner))
        }
        instant_acme::Error::Other(inner) => {
            // hyper's error says little by itself: its cause too.
            let mut text = inner.to_string();
            let mut cause = inner.source();
            while let Some(c) = cause {
                text = format!("{text}: {c}");
                cause = c.source();
            }
            all(req, |h| Failure::local(h, LocalKind::CaUnreachable, &text))
        }
        instant_acme::Error::Hyper(_) | instant_acme::Error::Http(_) => {
            all(req, |h| Failure::local(h, LocalKind::CaUnreachable, e))
        }
        other => all(req, |h| Failure::local(h, LocalKind::Other, other)),
    }
}

async fn order(
    ca: &Ca,
    store: &dyn Store,
    sink: &mut RedisSink,
    req: &Request,
    now: i64,
    keys: &mut Vec<String>,
) -> Result<Certificate, Vec<Failure>> {
    // `now` is when the order starts; the certificate is checked at the
    // time it arrives (a CA may start its validity at issuance).
    let started = Instant::now();
    let account = &ca.account;
    let ca_or_local = |e: &instant_acme::Error| ca_or_local(ca, req, e);
    let ids: Vec<Identifier> = req.hosts.iter().cloned().map(Identifier::Dns).collect();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .map_err(|e| ca_or_local(&e))?;
    // A refusal while the challenges are set ready may come from an order
    // already invalid (the CA validated one host before the next was set
    // ready, and answers with the order's problem): attributed per host
    // from the order's state, like an order that went invalid later.
    let mut refused = None;
    let mut authzs = order.authorizations();
    while let Some(authz) = authzs.next().await {
        let mut authz = match authz {
            Ok(a) => a,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        if authz.status != AuthorizationStatus::Pending {
            continue;
        }
        let host = authz.identifier().to_string();
        let Some(mut ch) = authz.challenge(ChallengeType::Http01) else {
            return Err(vec![Failure::local(
                &host,
                LocalKind::NoHttp01,
                "the CA offers no http-01 challenge",
            )]);
        };
        let key = edgestate::keys::acme(&ch.token);
        keys.push(key.clone());
        // The key lives no longer than the order may.
        let ttl = ca.order_timeout.saturating_sub(started.elapsed());
        sink.put(&key, ch.key_authorization().as_str(), ttl)
            .await
            .map_err(|e| vec![Failure::local(&host, LocalKind::Edge, e)])?;
        if let Err(e) = ch.set_ready().await {
            refused = Some(e);
            break;
        }
    }
    if let Some(e) = refused {
        if matches!(e, instant_acme::Error::Api(_))
            && order
                .refresh()
                .await
                .is_ok_and(|s| s.status == OrderStatus::Invalid)
        {
            return Err(invalid_order(&mut order, req).await);
        }
        return Err(ca_or_local(&e));
    }
    // Polls back off to at most a few seconds apart, and end before the
    // order's bound so that a stuck order is named as such.
    let retry = |started: Instant| {
        RetryPolicy::new()
            .initial_delay(Duration::from_millis(250))
            .backoff(1.5)
            .timeout(ca.order_timeout.saturating_sub(started.elapsed()))
    };
    let status = match order.poll_ready(&retry(started)).await {
        Ok(s) => s,
        // The order went invalid: its problem, attributed per host below.
        Err(instant_acme::Error::Api(_)) => OrderStatus::Invalid,
        Err(instant_acme::Error::Timeout(_)) => {
            let status = order.state().status;
            return Err(all(req, |h| {
                Failure::local(
                    h,
                    LocalKind::OrderPending,
                    format!(
                        "the order stayed {} for {} s (acme.order_timeout)",
                        format!("{status:?}").to_ascii_lowercase(),
                        ca.order_timeout.as_secs()
                    ),
                )
            }));
        }
        Err(e) => return Err(ca_or_local(&e)),
    };
    if status != OrderStatus::Ready {
        return Err(invalid_order(&mut order, req).await);
    }
    let (csr, key_pem) =
        csr(&req.hosts).map_err(|e| all(req, |h| Failure::local(h, LocalKind::Other, &e)))?;
    order
        .finalize_csr(&csr)
        .await
        .map_err(|e| ca_or_local(&e))?;
    let chain = match order.poll_certificate(&retry(started)).await {
        Ok(chain) => chain,
        Err(instant_acme::Error::Timeout(_)) => {
            return Err(all(req, |h| {
                Failure::local(
                    h,
                    LocalKind::OrderPending,
                    format!(
                        "the order stayed processing for {} s (acme.order_timeout)",
                        ca.order_timeout.as_secs()
                    ),
                )
            }));
        }
        Err(e) => return Err(ca_or_local(&e)),
    };
    let cert = certs::parse(&req.name, &chain, &key_pem)
        .and_then(|c| {
            let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
            let at = now.saturating_add(elapsed).saturating_add(1);
            // `now` and the elapsed times are whole seconds, and a CA
            // (pebble) may start the validity at the very second it
            // issues: a fresh certificate starting at most
            // `ISSUED_CLOCK_SKEW_SECS` ahead is checked from its start.
            let at = at.max(c.not_before.min(at.saturating_add(ISSUED_CLOCK_SKEW_SECS)));
            certs::check_now(&c, at).map(|()| c)
        })
        .map_err(|e| all(req, |h| Failure::bad_certificate(h, &e)))?;
    let missing: Vec<Failure> = req
        .hosts
        .iter()
        .filter(|h| !cert.covers(h))
        .map(|h| {
            Failure::local(
                h,
                LocalKind::NameMissing,
                "the CA's certificate does not name this host",
            )
        })
        .collect();
    if !missing.is_empty() {
        return Err(missing);
    }
    store
        .set_certificate(
            &req.name,
            &StoredCert {
                chain: cert.chain.clone(),
                key: cert.key.clone(),
            },
        )
        .map_err(|e| all(req, |h| Failure::local(h, LocalKind::Store, &e)))?;
    Ok(cert)
}

/// The hosts of an order that went invalid, each with its problem: the
/// hosts whose challenge the CA failed, with its problem; when none says
/// so (yet), the hosts whose authorization is invalid, with the order's
/// problem; when none is, every host not valid, with the order's problem
/// (an authorization left pending by an order that failed elsewhere is
/// not named while another is known to have failed).
async fn invalid_order(order: &mut instant_acme::Order, req: &Request) -> Vec<Failure> {
    let order_problem = order.state().error.clone();
    let mut own = Vec::new();
    let mut invalid = Vec::new();
    let mut others = Vec::new();
    let mut authzs = order.authorizations();
    while let Some(authz) = authzs.next().await {
        let Ok(authz) = authz else { continue };
        if authz.status == AuthorizationStatus::Valid {
            continue;
        }
        let host = authz.identifier().to_string();
        let failed = authz.status == AuthorizationStatus::Invalid;
        match authz.challenges.iter().find_map(|c| c.error.as_ref()) {
            Some(p) => own.push(Failure::ca(&host, p, None)),
            None => (if failed { &mut invalid } else { &mut others }).push(match &order_problem {
                Some(p) => Failure::ca(&host, p, None),
                None => Failure::local(
                    &host,
                    LocalKind::OrderInvalid,
                    format!("authorization {:?}", authz.status),
                ),
            }),
        }
    }
    if !own.is_empty() {
        return own;
    }
    if !invalid.is_empty() {
        return invalid;
    }
    if !others.is_empty() {
        return others;
    }
    match &order_problem {
        Some(p) => all(req, |h| Failure::ca(h, p, None)),
        None => all(req, |h| {
            Failure::local(h, LocalKind::OrderInvalid, "the order went invalid")
        }),
    }
}

/// What `edgeform certs issue` did for one site: its host, and the
/// certificate kept or each failed host with its problem.
pub type SiteOutcome = (String, Result<Certificate, Vec<Failure>>);

/// Why `certs issue` could not start at all.
#[derive(Debug)]
pub enum IssueError {
    /// No site has `tls: {acme: true}`; with `--site HOST`, the site of
    /// that host has not (or there is none).
    NoSite(Option<String>),
    /// `cluster.yaml` has no `acme` section.
    NoCa,
    /// No edge node has a Redis to answer challenges from.
    NoEdge,
    /// An edge's Redis cannot be reached: writing the challenges to only
    /// some edges would fail whenever the router sends the CA elsewhere.
    Edge(String),
    /// The account cannot be opened or made.
    Account(String),
}

impl std::fmt::Display for IssueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoSite(None) => f.write_str("no site has `tls: {acme: true}`"),
            Self::NoSite(Some(host)) => {
                write!(
                    f,
                    "no site whose host is `{host}` has `tls: {{acme: true}}`"
                )
            }
            Self::NoCa => f.write_str("cluster.yaml has no `acme` (the CA's directory)"),
            Self::NoEdge => f.write_str("no edge node has a Redis to answer challenges from"),
            Self::Edge(e) | Self::Account(e) => f.write_str(e),
        }
    }
}

/// The ACME sites of `config` (or the one whose host is `only`): one
/// request per site, covering its host and aliases.
#[must_use]
pub fn requests(config: &compiler::Config, only: Option<&str>) -> Vec<Request> {
    config
        .sites
        .iter()
        .filter(|s| only.is_none_or(|h| h == s.host))
        .filter_map(|s| match &s.tls {
            Some(compiler::model::resolved::Tls::Acme(name)) => Some(Request {
                name: name.clone(),
                hosts: s.hosts().map(str::to_owned).collect(),
            }),
            _ => None,
        })
        .collect()
}

/// `config`'s `acme` as [`Settings`].
///
/// # Errors
/// `cluster.yaml` has no `acme` section.
pub fn settings(config: &compiler::Config) -> Result<Settings, IssueError> {
    let Some(ca) = &config.cluster.acme else {
        return Err(IssueError::NoCa);
    };
    Ok(Settings {
        directory: ca.directory.clone(),
        contact: ca.contact.clone(),
        ca_file: ca.ca_file.as_ref().map(PathBuf::from),
        order_timeout: Duration::from_secs(ca.order_timeout_s),
    })
}

/// The challenge sink of `config`: a connection to the Redis of **every
/// edge node** (whatever a site's `regions`): the :80 geo router sends the
/// CA's request to the nearest healthy edge, not to one carrying the site.
///
/// # Errors
/// An edge's Redis cannot be reached, or there is no edge.
pub async fn sink(config: &compiler::Config) -> Result<RedisSink, IssueError> {
    let mut sink = RedisSink { nodes: Vec::new() };
    for node in &config.nodes {
        if !node.roles.contains(&compiler::model::raw::Role::Edge) {
            continue;
        }
        let Some(target) = &node.redis else { continue };
        let conn = edgeredis::master(target, &node.name)
            .await
            .map_err(|e| IssueError::Edge(format!("edge {}: {e:#}", node.name)))?;
        sink.nodes.push((node.name.clone(), conn));
    }
    if sink.nodes.is_empty() {
        return Err(IssueError::NoEdge);
    }
    Ok(sink)
}

/// Order each of `requests`, one after the other (a site that fails does
/// not stop the next); `now` is when the first starts. Each outcome is
/// keyed by the request's first host (the site's).
///
/// # Errors
/// The CA account cannot be opened or made.
pub async fn issue_requests(
    config: &compiler::Config,
    store: &dyn Store,
    requests: &[Request],
    now: i64,
) -> Result<Vec<SiteOutcome>, IssueError> {
    let settings = settings(config)?;
    let mut sink = sink(config).await?;
    let account = account(store, &settings)
        .await
        .map_err(IssueError::Account)?;
    // `now` is when the command started; each order starts later.
    let began = Instant::now();
    let mut out = Vec::new();
    for req in requests {
        let started = now.saturating_add(i64::try_from(began.elapsed().as_secs()).unwrap_or(0));
        let r = issue(&account, store, &mut sink, req, started).await;
        out.push((req.hosts[0].clone(), r));
    }
    Ok(out)
}

/// `edgeform certs issue [--site HOST]`: order the certificate of every
/// `tls: {acme: true}` site (or the one whose host is `only`), one order
/// per site covering host and aliases ([`issue_requests`]). The
/// challenges go to every edge ([`sink`]), each reachable before any order
/// starts.
///
/// # Errors
/// Nothing to do or no way to do it ([`IssueError`]); per-site failures
/// are in the outcomes.
pub async fn issue_sites(
    config: &compiler::Config,
    store: &dyn Store,
    only: Option<&str>,
    now: i64,
) -> Result<Vec<SiteOutcome>, IssueError> {
    let requests = requests(config, only);
    if requests.is_empty() {
        return Err(IssueError::NoSite(only.map(str::to_owned)));
    }
    issue_requests(config, store, &requests, now).await
}

/// A fresh P-256 key (PEM, PKCS8 form) and a CSR (DER) for `hosts`.
fn csr(hosts: &[String]) -> Result<(Vec<u8>, String), openssl::error::ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut b = X509ReqBuilder::new()?;
    b.set_pubkey(&key)?;
    let mut san = SubjectAlternativeName::new();
    for h in hosts {
        san.dns(h);
    }
    let mut exts = Stack::new()?;
    exts.push(san.build(&b.x509v3_context(None))?)?;
    b.add_extensions(&exts)?;
    b.sign(&key, MessageDigest::sha256())?;
    let der = b.build().to_der()?;
    let pem = String::from_utf8(key.private_key_to_pem_pkcs8()?).unwrap_or_default();
    Ok((der, pem))
}

#[cfg(test)]
mod tests;
