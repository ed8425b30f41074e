//! The per-site figures `edgeform top` prints: every
//! [`sites_interval`](agentconf::HealthConfig::sites_interval) the edge's
//! `/metrics` (`health.edge_metrics`) is read, the change since the last
//! read turned into rates ([`edgestate::sites::report`]: the busiest sites,
//! the rest folded) and published retained, QoS 0, on
//! `<prefix>/sites/<node>` — the next one supersedes it, and nothing routes
//! on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, QoS};

use edgestate::sites::{Snapshot, report, sites_topic};

use crate::config::Config;
use crate::shutdown::Shutdown;

/// The largest exposition read (an edge tracking 10,000 sites exports about
/// 25 MB; more is refused, not truncated into wrong figures).
pub const EXPOSITION_MAX: usize = 64 << 20;

/// Read the edge's exposition, bounded by [`EXPOSITION_MAX`].
async fn fetch(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let mut r = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("{url}: HTTP {}", r.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > EXPOSITION_MAX {
            return Err(format!("{url}: more than {EXPOSITION_MAX} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| format!("{url}: not UTF-8"))
}

/// Publish the sites figures until shutdown (nothing when
/// `health.edge_metrics` is not set). The first read only sets the
/// baseline; each later one publishes the rates since the one before.
pub async fn publish(
    config: Arc<Config>,
    client: AsyncClient,
    prefix: String,
    mut shutdown: Shutdown,
) {
    let Some(url) = config.health.edge_metrics.clone() else {
        return;
    };
    let topic = sites_topic(&prefix, &config.node);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let every = config.health.sites_interval();
    let mut last: Option<(Snapshot, Instant)> = None;
    let mut warned: Option<String> = None;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.wait() => return,
        }
        wait = every;
        let text = match fetch(&http, &url).await {
            Ok(t) => t,
            Err(e) => {
                // Logged when it starts; the retained figures age, and
                // `top` shows how old they are.
                if warned.as_ref() != Some(&e) {
                    tracing::warn!(problem = %e, "sites: the edge's metrics are unreadable; no sites figures");
                }
                warned = Some(e);
                last = None;
                continue;
            }
        };
        warned = None;
        let read_at = Instant::now();
        let Ok(cur) = tokio::task::spawn_blocking(move || Snapshot::parse(&text)).await else {
            continue;
        };
        if let Some((prev, at)) = &last {
            let secs = read_at.duration_since(*at).as_secs_f64();
            let figures = report(&config.node, crate::unix_now(), prev, &cur, secs);
            let payload = serde_json::to_vec(&figures).unwrap_or_default();
            if let Err(e) = client.try_publish(&topic, QoS::AtMostOnce, true, payload) {
                tracing::debug!(cause = %e, "sites: figures not queued");
            }
        }
        last = Some((cur, read_at));
    }
}
