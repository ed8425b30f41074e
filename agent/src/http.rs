//! The agent's HTTP listener: `GET /route/<stream>` (the playback
//! decision), `GET /healthz`.
//!
//! `GET /metrics` is the Prometheus text format.
//!
//! `/route` answers `302` + `Location` (the node's payload URL, or the
//! proxy URL when it has none), `503` + `Retry-After`, `404` or `403`.
//! With `?format=json` or `Accept: application/json` it answers the whole
//! decision: the zone chain with each zone's nodes by increasing load and
//! why each was or was not eligible.

use std::net::SocketAddr;
use std::sync::Arc;

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

/// The routes.
pub fn app(app: Arc<App>) -> Http {
    Http::new()
        .route("/route/{stream}", get(route))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(app)
}

#[derive(serde::Deserialize)]
struct Params {
    format: Option<String>,
}

fn wants_json(params: &Params, headers: &HeaderMap) -> bool {
    params.format.as_deref() == Some("json")
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("application/json"))
}

async fn route(
    Extract(app): Extract<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(stream): Path<String>,
    Query(params): Query<Params>,
    headers: HeaderMap,
) -> Response {
    let Some(router) = app.state.router() else {
        crate::metrics::Metrics::count(&app.metrics.route_requests, "503");
        let mut r = (StatusCode::SERVICE_UNAVAILABLE, "no routing table yet\n").into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        return r;
    };
    let health = app.state.health();
    // Every X-Forwarded-For line, in order: a trusted proxy appends its
    // own line after a forged one (#12 item 2).
    let xff = edgestate::route::join_xff(
        headers
            .get_all("x-forwarded-for")
            .iter()
            .map(HeaderValue::as_bytes),
    );
    let xff = xff.as_deref();
    let json = wants_json(&params, &headers);
    // The redirect path skips the explanation; the choice is the same.
    let d = if json {
        router.decide(Some(peer.ip()), xff, &stream, &health)
    } else {
        router.decide_quick(Some(peer.ip()), xff, &stream, &health)
    };
    let location = match (d.mode, &d.location, &d.node) {
        (Some(Mode::Redirect), Some(l), _) => Some(l.clone()),
        (Some(Mode::Proxy), _, Some(node)) => Some(
            app.proxy_url
                .replace("{node}", &edgestate::route::encode_segment(node))
                .replace("{stream}", &edgestate::route::encode_segment(&stream)),
        ),
        _ => None,
    };
    let status = StatusCode::from_u16(d.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    crate::metrics::Metrics::count(&app.metrics.route_requests, status.as_str());
    let mut response = if json {
        let mut v = serde_json::to_value(&d).unwrap_or_default();
        if let Some(l) = &location {
            v["location"] = serde_json::Value::String(l.clone());
        }
        v["generation"] = serde_json::json!(app.state.generation());
        v["stale_health"] = serde_json::json!(health.nodes.values().any(|h| h.stale));
        (status, axum::Json(v)).into_response()
    } else {
        (
            status,
            format!("{}\n", status.canonical_reason().unwrap_or("")),
        )
            .into_response()
    };
    if let Some(l) = location
        && let Ok(v) = HeaderValue::from_str(&l)
    {
        response.headers_mut().insert(header::LOCATION, v);
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

async fn metrics(Extract(app): Extract<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
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
