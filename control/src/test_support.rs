//! What the crate's tests against a real redis-server share: an apply's
//! options and a connection.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::apply::Options;
use crate::gate::Action;
use crate::plan::Overrides;
use compiler::model::resolved::Thresholds;

/// Options of `action` at `commit` that let every move through (force,
/// rollback allowed), with short lock times.
pub(crate) fn options(commit: &str, action: Action) -> Options {
    Options {
        commit: commit.into(),
        thresholds: Thresholds::default(),
        overrides: Overrides {
            force: true,
            allow_rollback: true,
            adopt: false,
        },
        lease: Duration::from_secs(10),
        lock_wait: Duration::from_secs(1),
        action,
        frozen: None,
        break_glass: false,
        dry_run: false,
        audit: crate::audit::Audit::default(),
        metrics: Arc::default(),
        bodies: Arc::default(),
    }
}

/// A connection to the redis-server on `port`.
pub(crate) async fn con(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
