//! The pusher: desired state (compiled from git) into every target's own
//! Redis master. **Only this module writes to Redis.**
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
//! - [`remote`]: credentials and SSH host key checks for `--pull`.
//! - [`signed`]: `--require-signed-by`: allowed signers, commit signatures.
//! - [`gate`]: pure: whether a write may move a target to another commit
//!   (thresholds, rollback, empty state, freeze), before writing.
//! - [`audit`]: who wrote what: meta fields and `edgeform:history`.

pub mod apply;
pub mod audit;
pub mod gate;
pub mod heal;
pub mod lock;
pub mod many;
pub mod plan;
pub mod reconcile;
pub mod remote;
pub mod run;
pub mod saved;
pub mod signed;
pub mod state;
pub mod track;

use std::sync::Arc;

use crate::compile::Target;
use crate::model::resolved::Node;

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
    config: &crate::Config,
    compiled: &crate::compile::Compiled,
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

/// A Redis key or value for messages: valid UTF-8 as is (control
/// characters escaped), any other byte as `\xNN`.
#[must_use]
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}
