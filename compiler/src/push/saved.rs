//! A target's plan (as shown and as saved) and the saved-plan file
//! (`plan --out FILE`, applied with `apply --plan FILE`): planning one
//! target reads its manifest, never its documents (a diff of changed
//! values only for display).

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tracing::Instrument as _;

use super::apply;
use super::plan::Changes;
use super::state::Live;
use super::{Job, state};
use crate::diff::{pretty, unified};

/// Changed keys whose diff a plan shows (and keys listed per kind).
pub const SHOWN: usize = 50;

/// One target's plan, as shown and as saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetPlan {
    pub node: String,
    pub generation: u64,
    pub live_commit: Option<String>,
    pub manifest_digest: String,
    pub desired_digest: String,
    pub changes: Changes,
    /// Unified diffs of changed keys (live → desired), for display.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diffs: Vec<(String, String)>,
}

/// A saved plan (`plan --out FILE`), applied with `apply --plan FILE`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedPlan {
    pub edgeform_plan: u32,
    pub created_at: String,
    pub commit: String,
    /// The commit the plan was compiled from, or `None` for the working tree.
    pub rev: Option<String>,
    pub targets: Vec<TargetPlan>,
}

/// The digest of a target's desired manifest (what a plan was made for).
#[must_use]
pub fn desired_digest(desired: &state::Desired) -> String {
    desired.digest().to_owned()
}

/// Plan one target: what apply would change there.
///
/// # Errors
/// Connection and Redis errors.
pub async fn plan_target(job: Job, show_diffs: bool) -> Result<TargetPlan> {
    let mut con = job
        .node
        .redis_master()
        .instrument(tracing::info_span!("connect"))
        .await?;
    // Reads the meta only when live is in sync, the differing buckets
    // otherwise (#16).
    let live: Live = apply::read_live(&mut con, &job.desired)
        .instrument(tracing::info_span!("read_live"))
        .await?;
    let changes =
        tracing::info_span!("changes").in_scope(|| apply::live_changes(&job.desired, &live));
    let mut diffs = Vec::new();
    if show_diffs && !changes.changed.is_empty() {
        let shown: Vec<String> = changes.changed.iter().take(SHOWN).cloned().collect();
        let before = apply::get_values(&mut con, &shown).await?;
        for (key, before) in shown.iter().zip(before) {
            let after = job
                .desired
                .iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, v, _)| v)
                .unwrap_or_default();
            let b = before.as_deref().map(pretty).unwrap_or_default();
            diffs.push((key.clone(), unified(key, &b, &pretty(after))));
        }
    }
    let desired_digest = desired_digest(&job.desired);
    let manifest_digest = live.digest.clone();
    Ok(TargetPlan {
        node: job.node.name.clone(),
        generation: live.meta.generation,
        live_commit: live.meta.commit.clone(),
        manifest_digest,
        desired_digest,
        changes,
        diffs,
    })
}
