//! Pure planning: what must change on a target, and whether it is allowed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::state::{Desired, Live};
use crate::model::resolved::Thresholds;

/// The keys that differ on one target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    /// Managed keys no longer desired (prune).
    pub removed: Vec<String>,
}

impl Changes {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }

    #[must_use]
    pub fn count(&self) -> usize {
        self.added.len() + self.changed.len() + self.removed.len()
    }
}

/// Compare desired hashes with the live manifest (one merge walk).
#[must_use]
pub fn changes(desired: &Desired, manifest: &BTreeMap<String, String>) -> Changes {
    let mut out = Changes::default();
    let mut live = manifest.iter().peekable();
    for (key, _, hash) in desired.iter() {
        while let Some((lk, _)) = live.peek() {
            if lk.as_str() < key {
                out.removed.push((*lk).clone());
                live.next();
            } else {
                break;
            }
        }
        match live.peek() {
            Some((lk, lh)) if lk.as_str() == key => {
                if lh.as_str() != hash {
                    out.changed.push(key.to_owned());
                }
                live.next();
            }
            _ => out.added.push(key.to_owned()),
        }
    }
    out.removed.extend(live.map(|(k, _)| k.clone()));
    out
}

/// Overrides for the safety checks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// `--force`: thresholds and the empty-state refusal.
    pub force: bool,
    /// `--allow-rollback`.
    pub allow_rollback: bool,
}

/// Where the desired commit stands relative to the live one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ancestry {
    /// No live commit, same commit, or the desired one is newer.
    Forward,
    /// The desired commit is an ancestor of the live one.
    Older,
    /// The live commit is not in this repository (cannot tell).
    Unknown,
}

/// Why an apply to a target is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Rollback {
        live: String,
        desired: String,
    },
    UnknownLive {
        live: String,
    },
    Empty,
    Deletes {
        removed: usize,
        managed: usize,
        limit: u32,
    },
    Changes {
        changed: usize,
        managed: usize,
        limit: u32,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Rollback { live, desired } => write!(
                f,
                "refusing to roll back: {desired} is older than the live commit {live} (use --allow-rollback)"
            ),
            Refusal::UnknownLive { live } => write!(
                f,
                "the live commit {live} is not in this repository, so a rollback cannot be ruled out \
                 (fetch it, or use --allow-rollback)"
            ),
            Refusal::Empty => write!(
                f,
                "refusing an empty desired state: this edge would serve no site (use --force if that is meant)"
            ),
            Refusal::Deletes {
                removed,
                managed,
                limit,
            } => write!(
                f,
                "refusing to delete {removed} of {managed} managed keys (more than {limit} %; use --force)"
            ),
            Refusal::Changes {
                changed,
                managed,
                limit,
            } => write!(
                f,
                "refusing to change {changed} of {managed} managed keys (more than {limit} %; use --force)"
            ),
        }
    }
}

/// The safety checks of one target's apply (SPEC §3, `apply`).
///
/// # Errors
/// The first refusal that applies.
pub fn allowed(
    desired_commit: &str,
    desired: &Desired,
    live: &Live,
    changes: &Changes,
    ancestry: Ancestry,
    thresholds: Thresholds,
    overrides: Overrides,
) -> Result<(), Refusal> {
    let live_commit = live.meta.commit.clone().unwrap_or_default();
    if !overrides.allow_rollback {
        match ancestry {
            Ancestry::Older => {
                return Err(Refusal::Rollback {
                    live: live_commit,
                    desired: desired_commit.to_owned(),
                });
            }
            Ancestry::Unknown => return Err(Refusal::UnknownLive { live: live_commit }),
            Ancestry::Forward => {}
        }
    }
    if overrides.force {
        return Ok(());
    }
    if desired.is_edge && desired.site_count() == 0 {
        return Err(Refusal::Empty);
    }
    let managed = live.manifest.len();
    if managed as u64 >= thresholds.min_keys && managed > 0 {
        let over = |n: usize, limit: u32| n * 100 > managed * limit as usize;
        if over(changes.removed.len(), thresholds.max_delete_percent) {
            return Err(Refusal::Deletes {
                removed: changes.removed.len(),
                managed,
                limit: thresholds.max_delete_percent,
            });
        }
        if over(changes.changed.len(), thresholds.max_change_percent) {
            return Err(Refusal::Changes {
                changed: changes.changed.len(),
                managed,
                limit: thresholds.max_change_percent,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
