//! A target's plan (as shown and as saved) and the saved-plan file
//! (`plan --out FILE`, applied with `apply --plan FILE`): planning one
//! target reads its manifest, never its documents (a diff of changed
//! values only for display).

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tracing::Instrument as _;

use super::apply;
use super::plan::{self, Changes};
use super::state::Live;
use super::{Job, state};
use compiler::diff::{pretty, unified};

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
    /// Keys with no manifest (an edge edgeform never applied, e.g. after
    /// `import`) whose live value is already the desired one: adopted, not
    /// changed. Listed in neither `changes.added` nor `changes.changed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adopted: Vec<String>,
    /// Why `apply` (without overrides) would refuse this target: a
    /// threshold, the empty state or the rollback guard. For display only.
    #[serde(skip)]
    pub refusal: Option<plan::Refusal>,
}

/// What a plan checks `apply`'s refusals against: the desired commit's
/// ancestry and the cluster's thresholds (no overrides: a plan warns about
/// what a plain `apply` would refuse).
pub struct Guard {
    pub commit: String,
    pub ancestor: std::sync::Arc<super::run::Ancestor>,
    pub thresholds: compiler::model::resolved::Thresholds,
    /// The freeze window open now: apply would refuse any
    /// target it moves to another commit.
    pub frozen: Option<super::gate::Frozen>,
}

impl Guard {
    /// The refusal `apply` would give this target, if any.
    #[must_use]
    pub fn refusal(&self, job: &Job, live: &Live, changes: &Changes) -> Option<plan::Refusal> {
        let relation = self.ancestor.relate(live.meta.commit.as_deref());
        // The new commit's freeze, else the live commit's.
        if let Some(f) = self.frozen.as_ref().or(relation.frozen.as_ref())
            && super::gate::moving(live.meta.commit.as_deref(), &self.commit)
        {
            return Some(plan::Refusal::Frozen {
                window: f.window.clone(),
                until: f.until.clone(),
            });
        }
        plan::allowed(
            &self.commit,
            &job.desired,
            live,
            changes,
            relation.ancestry.clone(),
            super::gate::thresholds_in_force(self.thresholds, &relation),
            plan::Overrides::default(),
        )
        .err()
    }
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
pub async fn plan_target(job: Job, show_diffs: bool, guard: &Guard) -> Result<TargetPlan> {
    let mut con = crate::master(&job.node)
        .instrument(tracing::info_span!("connect"))
        .await?;
    // Reads the meta only when live is in sync, the differing buckets
    // otherwise.
    let live: Live = apply::read_live(&mut con, &job.desired)
        .instrument(tracing::info_span!("read_live"))
        .await?;
    let mut changes =
        tracing::info_span!("changes").in_scope(|| apply::live_changes(&job.desired, &live));
    // No manifest: compare content, not hashes.
    let mut adopted = Vec::new();
    if live.managed == 0 && !changes.added.is_empty() {
        let values = apply::get_values(&mut con, &changes.added)
            .instrument(tracing::info_span!("adoption reads"))
            .await?;
        let added = std::mem::take(&mut changes.added);
        let sorted = adopt(&job.desired, added, &values);
        adopted = sorted.adopted;
        changes.added = sorted.added;
        changes.changed = sorted.changed;
    }
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
            // A certificate document is shown with its fingerprint in
            // place of the key, on both sides.
            let b = before
                .as_deref()
                .map(|v| pretty(&edgestate::tls::shown(key, v)))
                .unwrap_or_default();
            let a = pretty(&edgestate::tls::shown(key, after));
            diffs.push((key.clone(), unified(key, &b, &a)));
        }
    }
    let desired_digest = desired_digest(&job.desired);
    let manifest_digest = live.digest.clone();
    let refusal = guard.refusal(&job, &live, &changes);
    Ok(TargetPlan {
        node: job.node.name.clone(),
        generation: live.meta.generation,
        live_commit: live.meta.commit.clone(),
        manifest_digest,
        desired_digest,
        changes,
        diffs,
        adopted,
        refusal,
    })
}

/// Desired keys an edge without a manifest already holds, sorted by what
/// the live value is.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adoption {
    /// The live value is the desired one.
    pub adopted: Vec<String>,
    /// No live value.
    pub added: Vec<String>,
    /// A different live value.
    pub changed: Vec<String>,
}

/// Sort `added` (desired keys, in desired order) by their `live` values
/// (same order), comparing content (pure).
#[must_use]
pub fn adopt(desired: &state::Desired, added: Vec<String>, live: &[Option<String>]) -> Adoption {
    let mut out = Adoption::default();
    let mut entries = desired.iter();
    for (key, value) in added.into_iter().zip(live) {
        let want = entries
            .by_ref()
            .find(|(k, _, _)| *k == key)
            .map(|(_, v, _)| v);
        match value {
            None => out.added.push(key),
            Some(v) if Some(v.as_str()) == want => out.adopted.push(key),
            Some(_) => out.changed.push(key),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::state::Desired;

    #[test]
    fn adopt_sorts_by_live_content() {
        let sites: Vec<(Arc<str>, Arc<str>)> = [("site:a", "1"), ("site:b", "2"), ("site:c", "3")]
            .iter()
            .map(|(k, v)| (Arc::from(*k), Arc::from(*v)))
            .collect();
        let d = Desired::for_tests(sites, true);
        let added: Vec<String> = d.iter().map(|(k, _, _)| k.to_owned()).collect();
        let live = [
            Some("{}".to_owned()),
            Some("1".to_owned()),
            Some("x".to_owned()),
            None,
        ];
        let a = adopt(&d, added, &live);
        assert_eq!(a.adopted, ["edgeform:routing", "site:a"]);
        assert_eq!(a.changed, ["site:b"]);
        assert_eq!(a.added, ["site:c"]);
    }
}
