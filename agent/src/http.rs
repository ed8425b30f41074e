//! The agent's HTTP listener: `GET /route/<stream>` (the playback
//! decision), `GET /healthz`.
//!
//! `GET /metrics`: OpenMetrics when `Accept` asks for it (Prometheus
//! does), else the Prometheus text format 0.0.4; on `metrics.listen`, and
//! on this listener only when `http.metrics` says so (by default, when it
//! listens on loopback).
//!
//! `/route` answers `302` + `Location` (the node's payload URL, or the
//! proxy URL when it has none), `503` + `Retry-After`, `404` or `403`.
//! With `?format=json` or `Accept: application/json` it answers the whole
//! decision: the zone chain with each zone's nodes by increasing load and
//! why each was or was not eligible.
//!
//! [`serve`] is the listener: HTTP/1.1 through hyper with a header-read
//! and idle timeout and a connection cap that closes the oldest
//! connection rather than refusing a new one. A viewer's plain
//! `GET /route/<stream>` (no query, no JSON asked for) is answered before
//! axum's routing and extractors ([`route_quick`]): the same decision and
//! the same answer, with less work per request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router as Http;
use axum::extract::{ConnectInfo, Path, Query, State as Extract};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use edgestate::route::{Mode, RETRY_AFTER_SECS};

use crate::routing::State;

/// Settings the handlers need.
pub struct App {
    pub state: Arc<State>,
    /// `{node}` and `{stream}` are replaced.
    pub proxy_url: String,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// What a listener serves: its routes, and on the viewer listener the
/// `/route` redirect path in front of them.
#[derive(Clone)]
pub struct Service {
    routes: Http,
    quick: Option<Arc<App>>,
}

/// The routes; `/metrics` only when `with_metrics` (`http.metrics`:
/// by default only on a loopback listener, the viewer-facing one answers
/// 404).
pub fn app(app: Arc<App>, with_metrics: bool) -> Service {
    Service {
        routes: routes(app.clone(), with_metrics),
        quick: Some(app),
    }
}

fn routes(app: Arc<App>, with_metrics: bool) -> Http {
    let routes = Http::new()
        .route("/route/{stream}", get(route))
        .route("/vod/{asset}", get(vod))
        .route("/healthz", get(healthz));
    let routes = if with_metrics {
        routes.route("/metrics", get(metrics))
    } else {
        routes
    };
    routes.with_state(app)
}

/// The separate metrics listener's routes: `/metrics` only.
pub fn metrics_app(metrics: Arc<crate::metrics::Metrics>) -> Service {
    let routes = Http::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let metrics = metrics.clone();
            async move { exposition(&headers, metrics.encode()) }
        }),
    );
    Service {
        routes,
        quick: None,
    }
}

#[derive(serde::Deserialize)]
struct Params {
    format: Option<String>,
}

fn wants_json(params: &Params, headers: &HeaderMap) -> bool {
    params.format.as_deref() == Some("json")
        || headers
            .get_all(header::ACCEPT)
            .iter()
            .any(|v| accepts_json(v.as_bytes()))
}

/// Whether one `Accept` header line asks for JSON (`application/json`
/// with a quality above zero). Pure, on the raw bytes (a line that is not
/// text asks for nothing).
#[must_use]
pub fn accepts_json(accept: &[u8]) -> bool {
    std::str::from_utf8(accept).is_ok_and(|a| edgestate::exposition::accepts(a, "application/json"))
}

/// 503 + Retry-After: no routing table has been read yet.
fn no_table() -> Response {
    let mut r = (StatusCode::SERVICE_UNAVAILABLE, "no routing table yet\n").into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

/// Every X-Forwarded-For line, in order: a trusted proxy appends its own
/// line after a forged one.
fn forwarded_for(headers: &HeaderMap) -> Option<String> {
    edgestate::route::join_xff(
        headers
            .get_all("x-forwarded-for")
            .iter()
            .map(HeaderValue::as_bytes),
    )
}

/// A viewer's plain `GET /route/<stream>` — no query, no JSON asked for,
/// a stream name that needs no percent-decoding — answered without axum's
/// routing and extractors: the same decision, status, headers and body as
/// [`route`] gives it. `None` for any other request (and before the first
/// routing table): the routes answer it.
fn route_quick<B>(app: &App, peer: SocketAddr, req: &axum::http::Request<B>) -> Option<Response> {
    if req.method() != axum::http::Method::GET || req.uri().query().is_some() {
        return None;
    }
    let stream = req.uri().path().strip_prefix("/route/")?;
    if stream.is_empty() || stream.bytes().any(|b| b == b'/' || b == b'%') {
        return None;
    }
    let headers = req.headers();
    if headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| accepts_json(v.as_bytes()))
    {
        return None;
    }
    let router = app.state.router()?;
    let health = app.state.health();
    let xff = forwarded_for(headers);
    let d = router.decide_quick(Some(peer.ip()), xff.as_deref(), stream, &health);
    app.metrics.count_route(d.status);
    let choice = Choice {
        status: d.status,
        mode: d.mode,
        location: d.location.as_deref(),
        node: d.node.as_deref(),
    };
    Some(answer(app, &health, &choice, stream, None))
}

async fn route(
    Extract(app): Extract<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(stream): Path<String>,
    Query(params): Query<Params>,
    headers: HeaderMap,
) -> Response {
    let Some(router) = app.state.router() else {
        app.metrics.count_route(503);
        return no_table();
    };
    let health = app.state.health();
    let xff = forwarded_for(&headers);
    let xff = xff.as_deref();
    let json = wants_json(&params, &headers);
    // The redirect path skips the explanation; the choice is the same.
    let d = if json {
        router.decide(Some(peer.ip()), xff, &stream, &health)
    } else {
        router.decide_quick(Some(peer.ip()), xff, &stream, &health)
    };
    app.metrics.count_route(d.status);
    let choice = Choice {
        status: d.status,
        mode: d.mode,
        location: d.location.as_deref(),
        node: d.node.as_deref(),
    };
    answer(&app, &health, &choice, &stream, json.then(|| explain(&d)))
}

/// `GET /vod/<asset>`: the VOD placement (the CDN-zones VOD rule) for the
/// client, answered like `/route`: 302 + Location (the node's payload URL
/// and the asset, or the proxy URL with `{stream}` = the asset), 403, 404,
/// or 503 + Retry-After; `?format=json` explains it (every replica).
async fn vod(
    Extract(app): Extract<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(asset): Path<String>,
    Query(params): Query<Params>,
    headers: HeaderMap,
) -> Response {
    let Some(router) = app.state.router() else {
        return no_table();
    };
    let health = app.state.health();
    let xff = forwarded_for(&headers);
    let d = router.vod(Some(peer.ip()), xff.as_deref(), &asset, &health);
    let choice = Choice {
        status: d.status,
        mode: d.mode,
        location: d.location.as_deref(),
        node: d.node.as_deref(),
    };
    let json = wants_json(&params, &headers).then(|| explain(&d));
    answer(&app, &health, &choice, &asset, json)
}

/// What `/route` and `/vod` answer from: the decision's status, mode and
/// target.
struct Choice<'a> {
    status: u16,
    mode: Option<Mode>,
    location: Option<&'a str>,
    node: Option<&'a str>,
}

/// A decision as JSON (the explanation), or `null`.
fn explain(d: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(d).unwrap_or_default()
}

/// The answer of `/route/<stream>` and `/vod/<asset>`, one shape for both:
/// 302 + Location (the redirect, or the proxy URL with `{node}` and
/// `{stream}` = `name`), 403/404, 503 + Retry-After; `explained` (the
/// decision as JSON, when asked for) is the body with the location, the
/// table's generation and whether health is stale. Never cached.
fn answer(
    app: &App,
    health: &edgestate::route::Health,
    d: &Choice<'_>,
    name: &str,
    explained: Option<serde_json::Value>,
) -> Response {
    let location = match (d.mode, d.location, d.node) {
        (Some(Mode::Redirect), Some(l), _) => Some(l.to_owned()),
        (Some(Mode::Proxy), _, Some(node)) => Some(
            app.proxy_url
                .replace("{node}", &edgestate::route::encode_segment(node))
                .replace("{stream}", &edgestate::route::encode_segment(name)),
        ),
        _ => None,
    };
    let status = StatusCode::from_u16(d.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = if let Some(mut v) = explained {
        if let Some(l) = &location {
            v["location"] = serde_json::Value::String(l.clone());
        }
        v["generation"] = serde_json::json!(app.state.generation());
        v["stale_health"] = serde_json::json!(health.nodes.values().any(|h| h.stale));
        (status, axum::Json(v)).into_response()
    } else {
        (status, reason_line(status)).into_response()
    };
    if let Some(l) = location {
        match HeaderValue::try_from(&l) {
            Ok(v) => {
                response.headers_mut().insert(header::LOCATION, v);
            }
            // A public_url no header can carry (a hostile or hand-edited
            // table: the compiler writes none): never a redirect without
            // its Location.
            Err(_) => {
                tracing::warn!(
                    location = %edgestate::untrusted::escape(&l),
                    "route: the routing table's URL cannot be a Location header; answered 502"
                );
                response = (
                    StatusCode::BAD_GATEWAY,
                    "bad payload URL in the routing table\n",
                )
                    .into_response();
            }
        }
    }
    if d.status == 503 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The plain-text body of an answer: its reason phrase and a newline
/// (static for the statuses `/route` and `/vod` give).
fn reason_line(status: StatusCode) -> std::borrow::Cow<'static, str> {
    match status {
        StatusCode::FOUND => "Found\n".into(),
        StatusCode::FORBIDDEN => "Forbidden\n".into(),
        StatusCode::NOT_FOUND => "Not Found\n".into(),
        StatusCode::SERVICE_UNAVAILABLE => "Service Unavailable\n".into(),
        s => format!("{}\n", s.canonical_reason().unwrap_or("")).into(),
    }
}

async fn metrics(Extract(app): Extract<Arc<App>>, headers: HeaderMap) -> Response {
    exposition(&headers, app.metrics.encode())
}

/// The metrics in the format `Accept` asks for: OpenMetrics for
/// Prometheus, the 0.0.4 text format for anyone else (`promtool check
/// metrics`, `curl`).
fn exposition(headers: &HeaderMap, openmetrics: String) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = edgestate::exposition::negotiate(accept, openmetrics);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn healthz(Extract(app): Extract<Arc<App>>) -> Response {
    let generation = app.state.generation();
    let body = serde_json::json!({"routing_table": generation.is_some(), "generation": generation});
    let status = if generation.is_some() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// How long a connection may go without a new request head while none of
/// its requests is being answered: a client slow to send its headers, and
/// an idle keep-alive connection, are closed after this (within one
/// [`WATCH_TICK`] more).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the listener's watchdog looks at its connections.
const WATCH_TICK: Duration = Duration::from_secs(1);

/// Most open connections, unless the file-descriptor limit is lower.
pub const MAX_CONNECTIONS: usize = 4096;

/// Most bytes a connection buffers (hyper's read and write buffer): a
/// request head longer than this is answered 431 and the connection
/// closed. hyper's default (about 400 KiB) would let the connection cap's
/// 4,096 clients hold 1.6 GiB with long heads; this bounds them to 64 MiB.
/// nginx's default accepts 8 KiB per header line.
pub const MAX_BUFFER: usize = 16 * 1024;

/// Descriptors kept free for Redis, the broker, the cache and the index.
const FD_RESERVE: u64 = 128;

/// How long an evicted or shutting-down connection may finish its request.
const GRACE: Duration = Duration::from_secs(2);

/// How long an evicted connection with no request being answered may
/// take to close (what it was sent is flushed).
const FLUSH: Duration = Duration::from_millis(100);

/// While every slot is taken, one more connection is asked to close this
/// often (each frees its slot within [`FLUSH`], or [`GRACE`] while it
/// answers a request).
const EVICT_TICK: Duration = Duration::from_millis(5);

/// What a listener reports of its connections: the viewers' listener
/// counts into the agent's `http_connections` and `http_evicted`; the
/// metrics listener (`None`) counts nowhere, so a scrape reads the
/// viewers' figures.
#[derive(Clone)]
pub struct Counts {
    /// Open sockets (evicted ones included until closed).
    pub open: prometheus_client::metrics::gauge::Gauge,
    /// Connections asked to close to make room.
    pub evicted: prometheus_client::metrics::counter::Counter,
}

impl Counts {
    /// The agent's own connection metrics.
    #[must_use]
    pub fn of(metrics: &crate::metrics::Metrics) -> Counts {
        Counts {
            open: metrics.http_connections.clone(),
            evicted: metrics.http_evicted.clone(),
        }
    }
}

/// A slot for one more open socket. With none free, the oldest connection
/// not yet asked is asked to close (it finishes its request within
/// [`GRACE`]), and another every [`EVICT_TICK`] until a slot frees.
async fn free_slot(
    slots: &Arc<tokio::sync::Semaphore>,
    live: &Live,
    counts: Option<&Counts>,
) -> tokio::sync::OwnedSemaphorePermit {
    loop {
        if let Ok(slot) = slots.clone().try_acquire_owned() {
            return slot;
        }
        let oldest = live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_first();
        if let Some((_, oldest)) = oldest {
            oldest.close.notify_one();
            if let Some(c) = counts {
                c.evicted.inc();
            }
        }
        if let Ok(Ok(slot)) = tokio::time::timeout(EVICT_TICK, slots.clone().acquire_owned()).await
        {
            return slot;
        }
    }
}

/// The connection cap: [`MAX_CONNECTIONS`], or what the open-file limit
/// leaves after [`FD_RESERVE`]. Raises the soft limit to the hard one
/// first (as Go's runtime does), so the cap is rarely the limit's.
#[must_use]
pub fn connection_cap() -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum)
        && soft < hard
    {
        limit.current = Some(hard);
        if setrlimit(Resource::Nofile, limit).is_err() {
            limit.current = Some(soft);
        }
    }
    limit.current.map_or(MAX_CONNECTIONS, |n| {
        usize::try_from(n.saturating_sub(FD_RESERVE).max(16))
            .unwrap_or(MAX_CONNECTIONS)
            .min(MAX_CONNECTIONS)
    })
}

/// Open connections, oldest first.
type Live = Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Arc<Conn>>>>;

/// One open connection as its task, its service and the watchdog see it.
#[derive(Default)]
struct Conn {
    /// Asks the connection's task to close it.
    close: tokio::sync::Notify,
    /// Request heads read so far (the service counts each call).
    heads: AtomicU64,
    /// Requests whose handler has not returned yet.
    busy: AtomicU32,
    /// The watchdog's own: the `heads` it saw last, and ticks since.
    seen: AtomicU64,
    stalled: AtomicU32,
}

impl Conn {
    /// One watchdog tick: whether the connection has now gone
    /// `limit` ticks without a new request head and without a request
    /// being answered (true once, on the tick it reaches the limit).
    fn stalled_for(&self, limit: u32) -> bool {
        let heads = self.heads.load(Ordering::Relaxed);
        if heads != self.seen.swap(heads, Ordering::Relaxed)
            || self.busy.load(Ordering::Relaxed) > 0
        {
            self.stalled.store(0, Ordering::Relaxed);
            return false;
        }
        self.stalled.fetch_add(1, Ordering::Relaxed) + 1 == limit
    }
}

/// Closes every connection of `live` that has stalled for
/// [`HEADER_TIMEOUT`]. One timer for the listener instead of one per
/// request head (what hyper's `header_read_timeout` arms): the same
/// protection from slow and idle clients, without a timer's allocation and
/// wheel entry on `/route`'s path.
async fn watchdog(live: Live) {
    let limit = u32::try_from(HEADER_TIMEOUT.as_secs() / WATCH_TICK.as_secs()).unwrap_or(u32::MAX);
    let mut tick = tokio::time::interval(WATCH_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let l = live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for conn in l.values() {
            if conn.stalled_for(limit) {
                conn.close.notify_one();
            }
        }
    }
}

/// Marks a request as being answered until dropped.
struct Busy(Arc<Conn>);

impl Busy {
    fn new(conn: &Arc<Conn>) -> Self {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        Busy(conn.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serve `router` on `listener` until `stop` fires: HTTP/1.1, a
/// connection closed once it stalls for [`HEADER_TIMEOUT`] ([`watchdog`]), and at
/// most `cap` connections — at the cap the *oldest* connection is asked to
/// close (at once when idle, after [`GRACE`] otherwise), so idle or slow
/// clients cannot lock new ones out of `/route`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Service,
    cap: usize,
    counts: Option<Counts>,
    mut stop: crate::shutdown::Shutdown,
) {
    let live: Live = Arc::default();
    let watch = tokio::spawn(watchdog(live.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    let mut next: u64 = 0;
    // One slot per open socket, held by its task until the socket is
    // closed: a connection asked to close still holds its slot for up to
    // GRACE, so the cap bounds open sockets (and the descriptors kept in
    // reserve stay free), not only the connections not yet evicted.
    let cap = cap.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let open = move |slots: &tokio::sync::Semaphore| gauge(cap - slots.available_permits());
    loop {
        let slot = tokio::select! {
            s = free_slot(&slots, &live, counts.as_ref()) => s,
            () = stop.wait() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(cause = %e, "http: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.wait() => break,
        };
        while tasks.try_join_next().is_some() {}
        let conn = Arc::new(Conn::default());
        live.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(next, conn.clone());
        if let Some(c) = &counts {
            c.open.set(open(&slots));
        }
        let routes = service
            .routes
            .clone()
            .layer(axum::Extension(ConnectInfo(peer)));
        let quick = service.quick.clone();
        let counted = conn.clone();
        let service = hyper::service::service_fn(move |req: axum::http::Request<_>| {
            counted.heads.fetch_add(1, Ordering::Relaxed);
            let answer = quick
                .as_deref()
                .and_then(|app| route_quick(app, peer, &req));
            // Answered, or the routes (cloned only then) to ask.
            let next = answer.ok_or_else(|| (routes.clone(), Busy::new(&counted)));
            async move {
                match next {
                    Ok(r) => Ok(r),
                    Err((mut routes, _busy)) => {
                        tower_service::Service::call(&mut routes, req).await
                    }
                }
            }
        });
        let (live, counts, slots, id) = (live.clone(), counts.clone(), slots.clone(), next);
        next += 1;
        tasks.spawn(async move {
            // No hyper timer: the watchdog stands for the header-read timeout.
            let mut builder = hyper::server::conn::http1::Builder::new();
            // One flattened write per response: a 302's head and its short
            // body in one `send`, not a `writev` of two pieces.
            builder
                .header_read_timeout(None)
                .writev(false)
                .max_buf_size(MAX_BUFFER);
            // Boxed so that it (and its socket) is dropped here, before
            // the slot is given back.
            let mut served =
                Box::pin(builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service));
            tokio::select! {
                _ = served.as_mut() => {}
                () = conn.close.notified() => {
                    // A request being answered gets GRACE; a connection
                    // with none (idle, or a head still arriving: a slow
                    // client) only the moment to flush what is written.
                    let grace = if conn.busy.load(Ordering::Relaxed) > 0 { GRACE } else { FLUSH };
                    served.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(grace, served.as_mut()).await;
                }
            }
            drop(served);
            live.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&id);
            drop(slot);
            if let Some(c) = &counts {
                c.open.set(open(&slots));
            }
        });
    }
    // Shutdown: every connection finishes its request (or is dropped).
    watch.abort();
    for conn in live
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
    {
        conn.close.notify_one();
    }
    let _ = tokio::time::timeout(GRACE * 2, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_stalls_only_without_new_heads_or_busy_handlers() {
        let conn = Arc::new(Conn::default());
        // Two quiet ticks of three: not yet; the third says so once.
        assert!(!conn.stalled_for(3));
        assert!(!conn.stalled_for(3));
        assert!(conn.stalled_for(3));
        assert!(!conn.stalled_for(3), "said once");
        // A new request head restarts the count.
        let conn = Arc::new(Conn::default());
        assert!(!conn.stalled_for(2));
        conn.heads.fetch_add(1, Ordering::Relaxed);
        assert!(!conn.stalled_for(2));
        assert!(!conn.stalled_for(2));
        assert!(conn.stalled_for(2));
        // A handler still answering holds the clock at zero.
        let conn = Arc::new(Conn::default());
        let busy = Busy::new(&conn);
        for _ in 0..5 {
            assert!(!conn.stalled_for(2));
        }
        drop(busy);
        assert!(!conn.stalled_for(2));
        assert!(conn.stalled_for(2));
    }
}
