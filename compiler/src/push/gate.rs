//! The gate (#15 items 1 and 9): whether a write may move a target,
//! decided **before** writing, for `apply`, `reconcile`'s sync and heal
//! alike. Pure: what was read and the run's options in, a decision out.
//!
//! - Repairing drift back to the commit a target already has is free
//!   (sync and heal): git already approved that state.
//! - Moving a target to another commit (or writing a first one) passes
//!   every check `apply` makes: the rollback guard, the empty-state
//!   refusal and the thresholds (`--force`, `--allow-rollback` honoured
//!   the same way), and no open freeze window (`--break-glass`).
//! - `apply` itself always passes the checks, as it always did.

use super::apply::Options;
use super::plan::{self, Ancestry, Changes, Refusal};
use super::state::{Desired, Live};

/// Which command writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Apply,
    Sync,
    Heal,
}

impl Action {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Apply => "apply",
            Action::Sync => "sync",
            Action::Heal => "heal",
        }
    }
}

/// What a permitted write does to a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Back to the state of the commit the target already has.
    Repair,
    /// To another commit (or the first one): passed every check.
    Advance,
}

/// An open freeze window, as the run saw it when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frozen {
    pub window: String,
    /// When it closes (RFC 3339).
    pub until: String,
}

/// Whether writing `desired_commit` moves a target whose meta names
/// `live_commit` to another commit.
#[must_use]
pub fn moving(live_commit: Option<&str>, desired_commit: &str) -> bool {
    live_commit != Some(desired_commit)
}

/// The decision for one target: `live` and `changes` as `apply` reads and
/// computes them (the manifest against the desired state), `ancestry` of
/// the desired commit relative to the live one.
///
/// # Errors
/// The refusal, with its kind ([`Refusal::kind`]).
pub fn decide(
    options: &Options,
    desired: &Desired,
    live: &Live,
    changes: &Changes,
    ancestry: Ancestry,
) -> Result<Move, Refusal> {
    let moves = moving(live.meta.commit.as_deref(), &options.commit);
    if !moves && options.action != Action::Apply {
        return Ok(Move::Repair);
    }
    if moves
        && !options.break_glass
        && let Some(f) = &options.frozen
    {
        return Err(Refusal::Frozen {
            window: f.window.clone(),
            until: f.until.clone(),
        });
    }
    plan::allowed(
        &options.commit,
        desired,
        live,
        changes,
        ancestry,
        options.thresholds,
        options.overrides,
    )?;
    Ok(if moves { Move::Advance } else { Move::Repair })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::model::resolved::Thresholds;
    use crate::push::plan::{Overrides, RefusalKind};
    use crate::push::state::Meta;

    fn options(action: Action) -> Options {
        Options {
            commit: "b".into(),
            thresholds: Thresholds::default(),
            overrides: Overrides::default(),
            lease: Duration::from_secs(1),
            lock_wait: Duration::ZERO,
            action,
            frozen: None,
            break_glass: false,
            dry_run: false,
            audit: crate::push::audit::Audit::default(),
        }
    }

    fn desired(n: usize) -> Desired {
        let sites = (0..n)
            .map(|i| (Arc::from(format!("site:s{i:03}")), Arc::from("{}")))
            .collect();
        Desired::for_tests(sites, true)
    }

    fn live(commit: &str, managed: usize) -> Live {
        Live {
            meta: Meta {
                commit: Some(commit.into()),
                ..Meta::default()
            },
            managed,
            ..Live::default()
        }
    }

    /// 100 managed keys, 60 of them to delete.
    fn mass_deletion() -> Changes {
        Changes {
            removed: (0..60).map(|i| format!("site:x{i:03}")).collect(),
            ..Changes::default()
        }
    }

    #[test]
    fn repair_at_the_own_commit_is_free_moving_is_checked() {
        let d = desired(40);
        for action in [Action::Sync, Action::Heal] {
            let o = options(action);
            // Same commit: free, whatever the size of the repair.
            assert_eq!(
                decide(&o, &d, &live("b", 100), &mass_deletion(), Ancestry::Forward),
                Ok(Move::Repair)
            );
            // Another commit: exactly apply's refusal.
            let r = decide(&o, &d, &live("a", 100), &mass_deletion(), Ancestry::Forward);
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Deletes);
            let mut forced = o.clone();
            forced.overrides.force = true;
            assert_eq!(
                decide(
                    &forced,
                    &d,
                    &live("a", 100),
                    &mass_deletion(),
                    Ancestry::Forward
                ),
                Ok(Move::Advance)
            );
            // Rollbacks and empty states as apply.
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                Ancestry::Older,
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Rollback);
            let r = decide(
                &o,
                &desired(0),
                &live("a", 1),
                &Changes::default(),
                Ancestry::Forward,
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Empty);
        }
        // apply keeps its checks even at its own commit.
        let r = decide(
            &options(Action::Apply),
            &d,
            &live("b", 100),
            &mass_deletion(),
            Ancestry::Forward,
        );
        assert_eq!(r.unwrap_err().kind(), RefusalKind::Deletes);
    }

    #[test]
    fn a_freeze_stops_moves_not_repairs_and_breaks_with_glass() {
        let d = desired(40);
        for action in [Action::Apply, Action::Sync, Action::Heal] {
            let mut o = options(action);
            o.frozen = Some(Frozen {
                window: "final".into(),
                until: "2026-12-26T06:00:00Z".into(),
            });
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                Ancestry::Forward,
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Frozen, "{action:?}");
            // --force is not --break-glass.
            o.overrides.force = true;
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                Ancestry::Forward,
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Frozen);
            assert_eq!(
                decide(
                    &o,
                    &d,
                    &live("b", 100),
                    &Changes::default(),
                    Ancestry::Forward
                ),
                Ok(Move::Repair)
            );
            o.overrides.force = false;
            o.break_glass = true;
            assert_eq!(
                decide(
                    &o,
                    &d,
                    &live("a", 100),
                    &Changes::default(),
                    Ancestry::Forward
                ),
                Ok(Move::Advance)
            );
        }
    }
}
