//! The agent's view of routing: the compiled table from local Redis and the
//! cluster's health, both refreshed in the background and swapped in whole,
//! so a request never waits on I/O and never sees half an update.
//!
//! The table is re-read when `edgeform:meta` `generation` changes (a new
//! apply), so a push takes effect within a second without a restart. With
//! Redis unreachable, the last good table keeps answering. Health comes
//! from a file (same format as `edgeform route --health`), re-read when
//! its modification time changes — or, with a broker configured, from
//! MQTT ([`crate::mqtt`] sets it).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use edgestate::route::{Health, Router};
use edgestate::routing::RoutingTable;

use crate::config::Config;
use crate::shutdown::Shutdown;

/// What the HTTP handlers read. Cheap to clone (`Arc`s inside).
#[derive(Default)]
pub struct State {
    router: RwLock<Option<Arc<Router>>>,
    health: RwLock<Arc<Health>>,
    generation: RwLock<Option<u64>>,
}

impl State {
    /// The current router (None until a table was read once).
    #[must_use]
    pub fn router(&self) -> Option<Arc<Router>> {
        self.router
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    #[must_use]
    pub fn health(&self) -> Arc<Health> {
        self.health
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The generation of the table in use.
    #[must_use]
    pub fn generation(&self) -> Option<u64> {
        *self
            .generation
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_router(&self, router: Router, generation: u64) {
        *self
            .router
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(router));
        *self
            .generation
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(generation);
    }

    pub fn set_health(&self, health: Health) {
        *self
            .health
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(health);
    }
}

/// Keep `state` current until shutdown.
pub async fn refresh(
    config: Arc<Config>,
    state: Arc<State>,
    metrics: Arc<crate::metrics::Metrics>,
    mut shutdown: Shutdown,
) {
    let every = config.routing.refresh;
    let mut con: Option<redis::aio::MultiplexedConnection> = None;
    let mut health_mtime: Option<SystemTime> = None;
    let mut warned_redis = false;
    let mut warned_share = false;
    // The generation whose table was refused: not read again until the
    // next apply (a bad 200 MB table would be fetched every refresh).
    let mut refused: Option<u64> = None;
    loop {
        if let Some(path) = &config.routing.health_file {
            refresh_health(path, &mut health_mtime, &state);
        }
        if let Some(path) = &config.routing.share_health {
            match share_health(path, &state.health(), crate::unix_now()) {
                Ok(()) => warned_share = false,
                Err(e) if !warned_share => {
                    tracing::warn!(file = %path.display(), cause = %e, "routing: cannot share the health snapshot with the router");
                    warned_share = true;
                }
                Err(_) => {}
            }
        }
        match refresh_table(&config, &state, &mut con, &mut refused).await {
            Ok(()) => {
                warned_redis = false;
                if let Some(g) = state.generation() {
                    metrics
                        .routing_generation
                        .set(crate::metrics::gauge_value(g));
                }
            }
            Err(e) => {
                // A connection Redis failed on is opened again; one that
                // answered (no table applied yet, a refused table) is kept:
                // an edge waiting for its first apply would otherwise
                // connect again every refresh.
                if redis_failed(&e) {
                    con = None;
                }
                if !warned_redis {
                    tracing::warn!(redis = %edgeredis::describe(&config.redis), cause = %edgeredis::one_line(&e), "routing: cannot read the table from redis; keeping the last good one");
                    warned_redis = true;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.wait() => return,
        }
    }
}

/// Whether `e` came from Redis (the connection, or a reply it refused),
/// not from what it answered.
fn redis_failed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<redis::RedisError>())
}

/// The largest routing table read (bytes): a node's table is far
/// smaller (it lists nodes and zones, not sites).
pub const TABLE_MAX: u64 = 64 << 20;

async fn refresh_table(
    config: &Config,
    state: &State,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    refused: &mut Option<u64>,
) -> anyhow::Result<()> {
    let c = edgeredis::reuse(&config.redis, &config.node, con).await?;
    let generation: Option<u64> = redis::cmd("HGET")
        .arg(edgestate::keys::META)
        .arg("generation")
        .query_async(c)
        .await?;
    let generation = generation.unwrap_or(0);
    if state.router().is_some() && state.generation() == Some(generation) {
        return Ok(());
    }
    if *refused == Some(generation) {
        // Said when it was refused; the last good table keeps serving.
        return Ok(());
    }
    let size: u64 = redis::cmd("STRLEN")
        .arg(edgestate::keys::ROUTING)
        .query_async(c)
        .await?;
    if size > TABLE_MAX {
        *refused = Some(generation);
        anyhow::bail!(
            "{} is {size} bytes, over {TABLE_MAX}: refused (generation {generation})",
            edgestate::keys::ROUTING
        );
    }
    let text: Option<String> = redis::cmd("GET")
        .arg(edgestate::keys::ROUTING)
        .query_async(c)
        .await?;
    let Some(text) = text else {
        anyhow::bail!(
            "no {} in redis yet (nothing applied to this node)",
            edgestate::keys::ROUTING
        );
    };
    let parsed = serde_json::from_str::<RoutingTable>(&text)
        .map_err(anyhow::Error::from)
        .and_then(|table| Router::new(table).map_err(|e| anyhow::anyhow!("{e}")));
    let router = match parsed {
        Ok(r) => r,
        Err(e) => {
            *refused = Some(generation);
            return Err(e.context(format!(
                "{} of generation {generation} refused",
                edgestate::keys::ROUTING
            )));
        }
    };
    state.set_router(router, generation);
    tracing::info!(generation, "routing: table loaded");
    Ok(())
}

/// The snapshot the geo router reads (`routing.share_health`): the
/// [`Health`] routing uses, plus `at` (Unix seconds; an old one means the
/// agent stopped writing) and `stale` (some node's health is the last
/// known while the broker is away). `edgeform route --health` reads the
/// same file.
#[must_use]
pub fn shared_snapshot(health: &Health, at: u64) -> serde_json::Value {
    let mut v = serde_json::to_value(health).unwrap_or_else(|_| serde_json::json!({"nodes": {}}));
    v["at"] = serde_json::json!(at);
    v["stale"] = serde_json::json!(health.nodes.values().any(|n| n.stale));
    v
}

/// Write [`shared_snapshot`] to `path` atomically (a temp file in the same
/// folder, then a rename), so nginx never reads half of it.
///
/// # Errors
/// The folder is not writable.
pub fn share_health(path: &std::path::Path, health: &Health, at: u64) -> std::io::Result<()> {
    let text = shared_snapshot(health, at).to_string();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The largest health snapshot read (bytes).
pub const HEALTH_FILE_MAX: u64 = 64 << 20;

fn refresh_health(path: &PathBuf, mtime: &mut Option<SystemTime>, state: &State) {
    let Ok(modified) = std::fs::metadata(path).and_then(|m| m.modified()) else {
        return;
    };
    if *mtime == Some(modified) {
        return;
    }
    match crate::files::read_regular(path, HEALTH_FILE_MAX)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<Health>(&t).map_err(|e| e.to_string()))
    {
        Ok(h) => {
            state.set_health(h);
            *mtime = Some(modified);
        }
        Err(e) => {
            // Once per change of the file, not at every refresh.
            *mtime = Some(modified);
            tracing::warn!(file = %path.display(), cause = %e, "routing: bad health file; keeping the last one");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_of_redis_itself_drops_the_routing_connection() {
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(redis_failed(&anyhow::Error::from(io).context("HGET")));
        let refused =
            redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "WRONGTYPE"));
        assert!(redis_failed(&anyhow::Error::from(refused)));
        assert!(!redis_failed(&anyhow::anyhow!(
            "no edgeform:routing in redis yet (nothing applied to this node)"
        )));
        assert!(!redis_failed(
            &anyhow::anyhow!("bad table").context("edgeform:routing of generation 3 refused")
        ));
    }
}
