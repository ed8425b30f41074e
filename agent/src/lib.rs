//! edgeform-agent: one process per node, needing only the node's own Redis.
//!
//! # Layout
//! - [`config`]: `agent.yaml`, with file:line errors.
//! - [`cache`]: the nginx proxy-cache file format, key → path, scanning.
//! - [`purge`]: the purge worker: a reliable queue on local Redis.
//! - [`routing`]: the routing table and health, refreshed in the background.
//! - [`http`]: `/route/<stream>`, `/healthz`, `/metrics`.
//! - [`mqtt`]: the broker session: status, cluster health for routing
//!   (kept in the [`book`]; the health topics read node by node come on
//!   the [`direct`] reader's connection), commands; [`health`] builds the report,
//!   [`commands`] checks, claims, runs and records one-shot actions;
//!   [`metrics`] counts everything for Prometheus; [`sites`] publishes
//!   the edge's per-site figures for `edgeform top`.
//! - [`files`]: bounded, non-blocking reads of regular files only.
//! - [`shutdown`]: SIGTERM/SIGINT → every task stops cleanly.

pub mod book;
pub mod cache;
pub mod commands;
pub mod config;
pub mod direct;
pub use agentconf::files;
pub mod health;
pub mod http;
pub mod metrics;
pub mod mqtt;
pub mod probe;
pub mod purge;
pub mod routing;
pub mod shutdown;
pub mod sites;
pub mod summary;

use std::sync::Arc;

/// Now, in Unix seconds (0 if the clock is before 1970).
#[must_use]
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Run the agent until `signal` resolves, then stop every task cleanly.
///
/// # Errors
/// Setup errors (an invalid cache layout, a listen address in use);
/// runtime errors are logged and retried by each task.
pub async fn run(
    config: Arc<config::Config>,
    signal: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let listener = match &config.http {
        Some(h) => Some(
            tokio::net::TcpListener::bind(h.listen)
                .await
                .map_err(|e| anyhow::anyhow!("binding {}: {e}", h.listen))?,
        ),
        None => None,
    };
    run_with(config, listener, signal).await
}

/// [`run`] with an already bound listener (tests bind `127.0.0.1:0`).
///
/// # Errors
/// See [`run`].
pub async fn run_with(
    config: Arc<config::Config>,
    listener: Option<tokio::net::TcpListener>,
    signal: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("binding metrics.listen {addr}: {e}"))?,
        ),
        None => None,
    };
    let (trigger, shutdown) = shutdown::channel();
    let metrics = Arc::new(metrics::Metrics::default());
    metrics.set_build(&config.node);
    let worker = purge::Worker::new(config.clone(), metrics.clone())?;
    tracing::info!(node = %config.node, queue = %config.purge_queue(), "edgeform-agent starting");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(worker.run(shutdown.clone()));
    let state = Arc::new(routing::State::default());
    tasks.spawn(routing::refresh(
        config.clone(),
        state.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    if let Some(m) = &config.mqtt {
        let channel = mqtt::run(
            config.clone(),
            m.clone(),
            state.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            if let Err(e) = channel.await {
                tracing::error!(cause = %format!("{e:#}"), "mqtt: cannot start; no health reports or commands");
            }
        });
    }
    if let Some(listener) = metrics_listener {
        tracing::info!(addr = %listener.local_addr()?, "metrics listening");
        tasks.spawn(http::serve(
            listener,
            http::metrics_app(metrics.clone()),
            64,
            None,
            shutdown.clone(),
        ));
    }
    if let Some(listener) = listener {
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "http listening");
        let proxy_url = config
            .http
            .as_ref()
            .map_or_else(String::new, |h| h.proxy_url.clone());
        let with_metrics = config.http.as_ref().is_some_and(|h| h.metrics);
        if !with_metrics {
            tracing::info!(%addr, "http: /metrics not served here (http.metrics: false; metrics.listen serves it)");
        }
        let app = http::app(
            Arc::new(http::App {
                state,
                proxy_url,
                metrics: metrics.clone(),
            }),
            with_metrics,
        );
        let cap = http::connection_cap();
        tracing::info!(max_connections = cap, header_timeout = ?http::HEADER_TIMEOUT, "http limits");
        tasks.spawn(http::serve(
            listener,
            app,
            cap,
            Some(http::Counts::of(&metrics)),
            shutdown.clone(),
        ));
    }
    signal.await;
    tracing::info!("shutting down");
    trigger.fire();
    while tasks.join_next().await.is_some() {}
    Ok(())
}
