//! Pure planning: what must change on a target, and whether it is allowed.

use serde::{Deserialize, Serialize};

use super::state::{Desired, Live, Manifest, legacy_hash};
use compiler::model::resolved::Thresholds;

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

/// Compare desired hashes with the live manifest: one lookup per desired
/// key; the keys to remove are looked for only when some live key was not
/// met. Every list comes out sorted.
#[must_use]
pub fn changes(desired: &Desired, manifest: &Manifest) -> Changes {
    changes_where(desired, manifest, |_| true, false)
}

/// [`changes`] restricted to the desired keys `in_scope` (the buckets
/// whose manifest was read: `manifest` holds only those), comparing with
/// format 1's hashes when `legacy`.
#[must_use]
pub fn changes_where(
    desired: &Desired,
    manifest: &Manifest,
    in_scope: impl Fn(&str) -> bool,
    legacy: bool,
) -> Changes {
    let mut out = Changes::default();
    let mut met = 0;
    for (key, value, hash) in desired.iter() {
        if !in_scope(key) {
            continue;
        }
        match manifest.get(key) {
            Some(live) => {
                met += 1;
                let same = if legacy {
                    *live == legacy_hash(value)
                } else {
                    live == hash
                };
                if !same {
                    out.changed.push(key.to_owned());
                }
            }
            None => out.added.push(key.to_owned()),
        }
    }
    if met < manifest.len() {
        out.removed = manifest
            .keys()
            .filter(|k| !desired.contains(k))
            .cloned()
            .collect();
        out.removed.sort_unstable();
    }
    out
}

/// The buckets whose live `edgeform:manifest:buckets` value differs from
/// the desired one (`None`: absent).
#[must_use]
pub fn differing_buckets(desired: &Desired, live: &[Option<String>]) -> Vec<u8> {
    let summary = desired.summary();
    (0..edgestate::keys::BUCKETS)
        .filter(|&b| live.get(b).and_then(Option::as_deref) != Some(&summary.bucket_value(b)))
        .filter_map(|b| u8::try_from(b).ok())
        .collect()
}

/// The total count in `edgeform:manifest:buckets` values (`<digest> <n>`).
#[must_use]
pub fn managed_count(live: &[Option<String>]) -> usize {
    live.iter()
        .flatten()
        .filter_map(|v| v.split_once(' ')?.1.parse::<usize>().ok())
        .fold(0, usize::saturating_add)
}

/// Overrides for the safety checks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// `--force`: thresholds and the empty-state refusal.
    pub force: bool,
    /// `--allow-rollback`.
    pub allow_rollback: bool,
    /// `apply --adopt`: a target whose live commit is not in this
    /// repository (an edge moved to git by `import`) is taken over by the
    /// desired commit; recorded in its history. Nothing else is allowed by
    /// it (an older or diverged commit still needs `--allow-rollback`).
    pub adopt: bool,
}

/// Where the desired commit stands relative to the live one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ancestry {
    /// No live commit, same commit, or the desired one descends from it.
    Forward,
    /// The desired commit is an ancestor of the live one.
    Older,
    /// Neither: the desired commit does not contain the live one (a
    /// force-moved branch, an unmerged branch), so moving to it drops
    /// what is live.
    Diverged,
    /// The live commit is not in this repository (cannot tell).
    Unknown,
    /// Signed commits are required and a commit between the live one and
    /// the desired one (reachable from the desired, not from the live)
    /// does not verify: `commit` and why ([`gitsource::signed::Refusal::as_str`]).
    Unsigned { commit: String, why: &'static str },
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
    /// A `cluster.yaml` `apply.freeze` window is open.
    Frozen {
        window: String,
        until: String,
    },
    /// The desired commit does not descend from the live one.
    Diverged {
        live: String,
        desired: String,
    },
    /// Under `--require-signed-by`, a commit of the history from the live
    /// commit to the desired one is not signed by an allowed signer.
    UnsignedHistory {
        commit: String,
        why: &'static str,
    },
    /// The documents use a field (or `tls:*` keys) the target's installed
    /// edge code does not read (`edgeform:bundle`): it would answer those
    /// sites 502. Never overridden: install the edge first.
    InstallFirst {
        node: String,
        /// What the installed code reads, in words.
        reads: String,
        /// What the documents use that it does not, in words.
        uses: String,
    },
    /// A certificate renewal is pushed at a target's own live commit
    /// only: that commit is no longer `desired` (it moved, or the meta
    /// names none).
    NotLive {
        live: Option<String>,
        desired: String,
    },
}

/// The kind of a [`Refusal`], for logs and metrics (a label value that
/// never carries numbers or commits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalKind {
    Rollback,
    UnknownLive,
    Empty,
    Deletes,
    Changes,
    Frozen,
    Diverged,
    UnsignedHistory,
    InstallFirst,
    NotLive,
}

impl RefusalKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalKind::Rollback => "rollback",
            RefusalKind::UnknownLive => "unknown-live",
            RefusalKind::Empty => "empty",
            RefusalKind::Deletes => "deletes",
            RefusalKind::Changes => "changes",
            RefusalKind::Frozen => "frozen",
            RefusalKind::Diverged => "diverged",
            RefusalKind::UnsignedHistory => "unsigned-history",
            RefusalKind::InstallFirst => "install-first",
            RefusalKind::NotLive => "not-live",
        }
    }
}

impl Refusal {
    #[must_use]
    pub fn kind(&self) -> RefusalKind {
        match self {
            Refusal::Rollback { .. } => RefusalKind::Rollback,
            Refusal::UnknownLive { .. } => RefusalKind::UnknownLive,
            Refusal::Empty => RefusalKind::Empty,
            Refusal::Deletes { .. } => RefusalKind::Deletes,
            Refusal::Changes { .. } => RefusalKind::Changes,
            Refusal::Frozen { .. } => RefusalKind::Frozen,
            Refusal::Diverged { .. } => RefusalKind::Diverged,
            Refusal::UnsignedHistory { .. } => RefusalKind::UnsignedHistory,
            Refusal::InstallFirst { .. } => RefusalKind::InstallFirst,
            Refusal::NotLive { .. } => RefusalKind::NotLive,
        }
    }
}

impl std::error::Error for Refusal {}

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
                 (fetch it, or use --allow-rollback; an edge moved to git by `import`: apply --adopt)"
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
            Refusal::Frozen { window, until } => write!(
                f,
                "refusing to move to another commit during the freeze window `{window}` (until {until}; use --break-glass)"
            ),
            Refusal::Diverged { live, desired } => write!(
                f,
                "refusing {desired}: it does not descend from the live commit {live}, so moving to it \
                 would drop what is live (merge it, or use --allow-rollback)"
            ),
            Refusal::UnsignedHistory { commit, why } => write!(
                f,
                "refusing a history with commit {commit} that is not signed by an allowed signer \
                 ({why}): every commit from the live one to the new one must be"
            ),
            Refusal::InstallFirst { node, reads, uses } => write!(
                f,
                "install first: {node}'s installed code reads {reads}; this commit's {uses} \
                 (run `edgeform install {node}`, then apply)"
            ),
            Refusal::NotLive { live, desired } => write!(
                f,
                "a renewal is pushed at the target's own commit {desired} only, and its live commit \
                 is now {}; the next sync pushes the certificate",
                live.as_deref().unwrap_or("none")
            ),
        }
    }
}

/// The version-skew gate (docs/operations.md, "Version skew"): the
/// documents may use only what the target's installed edge code reads.
///
/// # Errors
/// [`Refusal::InstallFirst`] naming the first document of each field.
pub fn skew(desired: &Desired, live: &Live) -> Result<(), Refusal> {
    let missing = live.bundle.missing(desired.uses());
    if missing.is_empty() {
        return Ok(());
    }
    Err(Refusal::InstallFirst {
        node: desired.node.clone(),
        reads: live.bundle.describe(),
        uses: missing.describe(),
    })
}

/// The safety checks of one target's apply (README, "Pushing to the edges").
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
    // What the edge cannot read is refused whatever the overrides.
    skew(desired, live)?;
    // Unsigned history is refused whatever the overrides.
    if let Ancestry::Unsigned { commit, why } = ancestry {
        return Err(Refusal::UnsignedHistory { commit, why });
    }
    if !overrides.allow_rollback {
        match ancestry {
            Ancestry::Older => {
                return Err(Refusal::Rollback {
                    live: live_commit,
                    desired: desired_commit.to_owned(),
                });
            }
            Ancestry::Diverged => {
                return Err(Refusal::Diverged {
                    live: live_commit,
                    desired: desired_commit.to_owned(),
                });
            }
            Ancestry::Unknown if overrides.adopt => {}
            Ancestry::Unknown => return Err(Refusal::UnknownLive { live: live_commit }),
            Ancestry::Forward | Ancestry::Unsigned { .. } => {}
        }
    }
    if overrides.force {
        return Ok(());
    }
    if desired.is_edge && desired.site_count() == 0 {
        return Err(Refusal::Empty);
    }
    let managed = live.managed;
    if managed as u64 >= thresholds.min_keys && managed > 0 {
        let over =
            |n: usize, limit: u32| n.saturating_mul(100) > managed.saturating_mul(limit as usize);
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
