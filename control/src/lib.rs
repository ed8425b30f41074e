//! The control plane: desired state (compiled from git by `compiler`)
//! into every target's own Redis master — plan, apply, heal, reconcile.
//! **Only this crate writes to Redis.**
//!
//! - `edgeredis` (crate): reach a target's master by URL or through its
//!   Sentinels, password from the environment variable the node names.
//! - [`state`]: what a target holds: `edgeform:manifest` (key → content
//!   hash) and `edgeform:meta`; desired content hashes.
//! - [`plan`]: pure: desired vs live → added/changed/removed, and the
//!   safety checks (rollback, empty, thresholds).
//! - [`lock`]: the apply lease lock; who holds it, taking over a dead
//!   holder's lock, `unlock`.
//! - [`apply`]: lease lock, then one WATCH/MULTI/EXEC per target.
//! - [`heal`]: full live-content comparison and repair.
//! - [`run`]: every target concurrently (bounded), each outcome reported,
//!   one failing target never stopping the others.
//! - [`many`]: which targets, and apply/heal/sync over all of them.
//! - [`saved`]: one target's plan and the saved-plan file format.
//! - [`reconcile`]: the scheduled jobs, daemon loop, signals, `--pull`.
//! - [`renew`]: when an ACME certificate is renewed (pure rules), and
//!   the reconciler's certificates job that runs them (`renew::job`).
//! - `gitsource` (crate): credentials and SSH host key checks for
//!   `--pull`; `--require-signed-by`'s allowed signers and signatures.
//! - [`metrics`]: what the reconciler did, for Prometheus (one `Arc`
//!   handed down in [`many::Settings`]).
//! - [`store`]: the control host's state directory (secrets, the last
//!   good commit).
//! - [`gate`]: pure: whether a write may move a target to another commit
//!   (thresholds, rollback, empty state, freeze), before writing.
//! - [`audit`]: who wrote what: meta fields and `edgeform:history`.

pub mod acme;
pub mod apply;
pub mod audit;
pub mod bodies;
#[cfg(test)]
mod bodies_tests;
pub mod certs;
pub mod cmd;
pub mod gate;
pub mod heal;
pub mod import;
pub mod lock;
#[cfg(test)]
mod manifest_tests;
pub mod many;
pub mod metrics;
pub mod outbox;
pub mod plan;
pub mod reconcile;
pub mod renew;
pub mod rollout;
pub mod run;
pub mod saved;
#[cfg(test)]
mod skew_tests;
pub mod state;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod track;

use std::sync::Arc;

use compiler::compile::Target;
use compiler::model::resolved::Node;

/// One target to work on: its node (how to connect) and what it must hold.
#[derive(Debug, Clone)]
pub struct Job {
    pub node: Arc<Node>,
    pub desired: Arc<state::Desired>,
}

/// What the desired state came from, written to `edgeform:meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Commit id (`+dirty` when the working tree differs from it), or
    /// `worktree` outside git.
    pub commit: String,
}

/// Build the jobs for the compiled targets, hashing each distinct value
/// list once (edges of a region share one list).
#[must_use]
pub fn jobs(
    config: &compiler::Config,
    compiled: &compiler::compile::Compiled,
    only: &[String],
) -> Vec<Job> {
    let mut cache = state::HashCache::default();
    config
        .nodes
        .iter()
        .filter(|n| n.redis.is_some())
        .filter(|n| only.is_empty() || only.iter().any(|o| o == &n.name))
        .filter_map(|n| {
            let target: &Target = compiled.targets.get(&n.name)?;
            Some(Job {
                node: Arc::new(n.clone()),
                desired: Arc::new(cache.desired(target, n)),
            })
        })
        .collect()
}

/// A dedicated connection to `node`'s Redis master.
///
/// # Errors
/// No `redis` block, or see [`edgeredis::master`].
pub async fn master(node: &Node) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let target = node
        .redis
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("node {} has no redis block", node.name))?;
    edgeredis::master(target, &node.name).await
}

/// Write what `node`'s installed edge code reads into its Redis
/// (`edgeform:bundle`, replaced whole), or remove it (`None`: the seed's
/// fields are assumed, as after a rollback to code of unknown reach).
/// What plan and apply check documents against (docs/operations.md,
/// "Version skew").
///
/// # Errors
/// Connection and Redis errors.
pub async fn declare_bundle(
    node: &Node,
    bundle: Option<&edgestate::bundle::Bundle>,
) -> anyhow::Result<()> {
    let mut con = master(node).await?;
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("DEL")
        .arg(edgestate::keys::BUNDLE)
        .ignore();
    if let Some(b) = bundle {
        let mut hset = redis::cmd("HSET");
        hset.arg(edgestate::keys::BUNDLE);
        for (k, v) in b.to_hash() {
            hset.arg(k).arg(v);
        }
        pipe.add_command(hset).ignore();
    }
    let () = pipe.query_async(&mut con).await?;
    Ok(())
}
