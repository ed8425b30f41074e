//! The gate: whether a write may move a target,
//! decided **before** writing, for `apply`, `reconcile`'s sync and heal
//! alike. Pure: what was read and the run's options in, a decision out.
//!
//! - Repairing drift back to the commit a target already has is free
//!   (sync and heal): git already approved that state.
//! - Moving a target to another commit (or writing a first one) passes
//!   every check `apply` makes: the rollback guard, the empty-state
//!   refusal and the thresholds (`--force`, `--allow-rollback` honoured
//!   the same way), the descent rule (the desired commit contains the
//!   live one; under `--require-signed-by`, every commit between them is
//!   signed), and no open freeze window (`--break-glass`) — the new
//!   commit's *or the live commit's*: a commit cannot lift the freeze it
//!   is applied under by deleting it. Likewise the thresholds are the
//!   stricter of the new commit's and the live commit's: a commit cannot
//!   raise the limits it is checked against.
//! - `apply` itself always passes the checks, as it always did.
//! - A certificate renewal (`Action::Renew`) never moves a target: it is
//!   pushed at the target's own live commit, so it is a repair (outside
//!   thresholds and freeze windows — the renewal job decides the 72-hour
//!   freeze rule before it orders); should the live commit have moved
//!   meanwhile, it is refused (`Refusal::NotLive`) and left to the next
//!   sync.

use super::apply::Options;
use super::plan::{self, Ancestry, Changes, Refusal};
use super::state::{Desired, Live};
use compiler::model::resolved::Thresholds;

/// Which command writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Apply,
    Sync,
    Heal,
    /// A renewed certificate pushed at the target's own commit.
    Renew,
}

impl Action {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Apply => "apply",
            Action::Sync => "sync",
            Action::Heal => "heal",
            Action::Renew => "renew",
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

/// What the gate knows of a target's live commit: where the desired
/// commit stands relative to it, and the freeze window and thresholds
/// the live commit's own `cluster.yaml` sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub ancestry: Ancestry,
    pub frozen: Option<Frozen>,
    /// The live commit's `apply` thresholds, when its `cluster.yaml` was
    /// read: a move is checked against the stricter of these and the new
    /// commit's, so a commit cannot raise its own.
    pub thresholds: Option<Thresholds>,
}

impl From<Ancestry> for Relation {
    fn from(ancestry: Ancestry) -> Relation {
        Relation {
            ancestry,
            frozen: None,
            thresholds: None,
        }
    }
}

/// How callers learn a target's [`Relation`] from its live commit.
pub type Relate<'a> = dyn Fn(Option<&str>) -> Relation + Send + Sync + 'a;

/// The freeze window in force for a move: the new commit's, else the
/// live commit's (either one open stops the move).
#[must_use]
pub fn in_force<'a>(options: &'a Options, relation: &'a Relation) -> Option<&'a Frozen> {
    options.frozen.as_ref().or(relation.frozen.as_ref())
}

/// The thresholds in force for a move: each the stricter of the new
/// commit's and the live commit's (a commit cannot raise its own).
#[must_use]
pub fn thresholds_in_force(new: Thresholds, relation: &Relation) -> Thresholds {
    relation.thresholds.map_or(new, |live| new.stricter(live))
}

/// Whether writing `desired_commit` moves a target whose meta names
/// `live_commit` to another commit.
#[must_use]
pub fn moving(live_commit: Option<&str>, desired_commit: &str) -> bool {
    live_commit != Some(desired_commit)
}

/// The decision for one target: `live` and `changes` as `apply` reads and
/// computes them (the manifest against the desired state), `relation` of
/// the desired commit to the live one.
///
/// # Errors
/// The refusal, with its kind ([`Refusal::kind`]).
pub fn decide(
    options: &Options,
    desired: &Desired,
    live: &Live,
    changes: &Changes,
    relation: Relation,
) -> Result<Move, Refusal> {
    // A repair too: an edge reinstalled with older code must not be sent
    // what it cannot read.
    plan::skew(desired, live)?;
    let moves = moving(live.meta.commit.as_deref(), &options.commit);
    if moves && options.action == Action::Renew {
        return Err(Refusal::NotLive {
            live: live.meta.commit.clone(),
            desired: options.commit.clone(),
        });
    }
    if !moves && options.action != Action::Apply {
        return Ok(Move::Repair);
    }
    if moves
        && !options.break_glass
        && let Some(f) = in_force(options, &relation)
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
        relation.ancestry.clone(),
        thresholds_in_force(options.thresholds, &relation),
        options.overrides,
    )?;
    Ok(if moves { Move::Advance } else { Move::Repair })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::plan::{Overrides, RefusalKind};
    use crate::state::Meta;
    use compiler::model::resolved::Thresholds;

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
            audit: crate::audit::Audit::default(),
            metrics: Arc::default(),
            bodies: Arc::default(),
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
                decide(
                    &o,
                    &d,
                    &live("b", 100),
                    &mass_deletion(),
                    Ancestry::Forward.into()
                ),
                Ok(Move::Repair)
            );
            // Another commit: exactly apply's refusal.
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &mass_deletion(),
                Ancestry::Forward.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Deletes);
            let mut forced = o.clone();
            forced.overrides.force = true;
            assert_eq!(
                decide(
                    &forced,
                    &d,
                    &live("a", 100),
                    &mass_deletion(),
                    Ancestry::Forward.into()
                ),
                Ok(Move::Advance)
            );
            // Rollbacks and empty states as apply.
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                Ancestry::Older.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Rollback);
            let r = decide(
                &o,
                &desired(0),
                &live("a", 1),
                &Changes::default(),
                Ancestry::Forward.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Empty);
        }
        // apply keeps its checks even at its own commit.
        let r = decide(
            &options(Action::Apply),
            &d,
            &live("b", 100),
            &mass_deletion(),
            Ancestry::Forward.into(),
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
                Ancestry::Forward.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Frozen, "{action:?}");
            // --force is not --break-glass.
            o.overrides.force = true;
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                Ancestry::Forward.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Frozen);
            assert_eq!(
                decide(
                    &o,
                    &d,
                    &live("b", 100),
                    &Changes::default(),
                    Ancestry::Forward.into()
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
                    Ancestry::Forward.into()
                ),
                Ok(Move::Advance)
            );
        }
    }

    #[test]
    fn the_live_commits_freeze_is_in_force_too() {
        let d = desired(40);
        let live_frozen = Relation {
            ancestry: Ancestry::Forward,
            frozen: Some(Frozen {
                window: "final".into(),
                until: "2026-12-26T06:00:00Z".into(),
            }),
            thresholds: None,
        };
        for action in [Action::Apply, Action::Sync, Action::Heal] {
            // The new commit has no window (it deleted it): the live one's holds.
            let mut o = options(action);
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                live_frozen.clone(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Frozen, "{action:?}");
            // Repair at the own commit goes on.
            if action != Action::Apply {
                assert_eq!(
                    decide(
                        &o,
                        &d,
                        &live("b", 100),
                        &Changes::default(),
                        live_frozen.clone()
                    ),
                    Ok(Move::Repair)
                );
            }
            o.break_glass = true;
            assert_eq!(
                decide(
                    &o,
                    &d,
                    &live("a", 100),
                    &Changes::default(),
                    live_frozen.clone()
                ),
                Ok(Move::Advance)
            );
            // The history records the window broken.
            let e = o.entry(&live_frozen, Some("a"), 2, 0, 0, 0);
            assert_eq!(e.freeze.as_deref(), Some("final"));
        }
    }

    #[test]
    fn a_diverged_commit_needs_allow_rollback_and_unsigned_history_is_never_moved_to() {
        let d = desired(40);
        for action in [Action::Apply, Action::Sync, Action::Heal] {
            let mut o = options(action);
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &Changes::default(),
                Ancestry::Diverged.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Diverged, "{action:?}");
            let unsigned = || -> Relation {
                Ancestry::Unsigned {
                    commit: "c".into(),
                    why: "unsigned",
                }
                .into()
            };
            let r = decide(&o, &d, &live("a", 100), &Changes::default(), unsigned());
            assert_eq!(r.unwrap_err().kind(), RefusalKind::UnsignedHistory);
            o.overrides.allow_rollback = true;
            o.overrides.force = true;
            assert_eq!(
                decide(
                    &o,
                    &d,
                    &live("a", 100),
                    &Changes::default(),
                    Ancestry::Diverged.into()
                ),
                Ok(Move::Advance)
            );
            let r = decide(&o, &d, &live("a", 100), &Changes::default(), unsigned());
            assert_eq!(r.unwrap_err().kind(), RefusalKind::UnsignedHistory);
        }
    }

    #[test]
    fn a_first_write_is_a_move_and_passes_every_check() {
        assert!(moving(None, "b"));
        assert!(moving(Some("a"), "b"));
        assert!(!moving(Some("b"), "b"));
        let fresh = Live::default();
        for action in [Action::Apply, Action::Sync, Action::Heal] {
            let o = options(action);
            assert_eq!(
                decide(
                    &o,
                    &desired(1),
                    &fresh,
                    &Changes::default(),
                    Ancestry::Forward.into()
                ),
                Ok(Move::Advance),
                "{action:?}"
            );
            let r = decide(
                &o,
                &desired(0),
                &fresh,
                &Changes::default(),
                Ancestry::Forward.into(),
            );
            assert_eq!(r.unwrap_err().kind(), RefusalKind::Empty, "{action:?}");
        }
    }

    #[test]
    fn a_commit_cannot_raise_its_own_thresholds() {
        let d = desired(40);
        // The new commit allows deleting everything; the live one keeps
        // the defaults (25 %): a move is refused ...
        let mut o = options(Action::Sync);
        o.thresholds = Thresholds {
            max_delete_percent: 100,
            max_change_percent: 100,
            min_keys: 10,
        };
        let lax_new = |live: Option<Thresholds>| Relation {
            ancestry: Ancestry::Forward,
            frozen: None,
            thresholds: live,
        };
        for action in [Action::Apply, Action::Sync, Action::Heal] {
            o.action = action;
            let r = decide(
                &o,
                &d,
                &live("a", 100),
                &mass_deletion(),
                lax_new(Some(Thresholds::default())),
            );
            assert_eq!(
                r,
                Err(Refusal::Deletes {
                    removed: 60,
                    managed: 100,
                    limit: 25
                }),
                "{action:?}"
            );
        }
        // ... and goes once the raised limit is the live commit's own, or
        // with --force.
        let raised = Some(o.thresholds);
        assert_eq!(
            decide(&o, &d, &live("a", 100), &mass_deletion(), lax_new(raised)),
            Ok(Move::Advance)
        );
        o.overrides.force = true;
        assert_eq!(
            decide(
                &o,
                &d,
                &live("a", 100),
                &mass_deletion(),
                lax_new(Some(Thresholds::default()))
            ),
            Ok(Move::Advance)
        );
        // A lower limit in the new commit holds at once.
        o.overrides.force = false;
        o.thresholds = Thresholds {
            max_delete_percent: 5,
            ..Thresholds::default()
        };
        let few = Changes {
            removed: (0..10).map(|i| format!("site:x{i:03}")).collect(),
            ..Changes::default()
        };
        let r = decide(&o, &d, &live("a", 100), &few, lax_new(raised));
        assert_eq!(r.unwrap_err().kind(), RefusalKind::Deletes);
    }

    #[test]
    fn the_new_commits_freeze_window_is_named_before_the_live_ones() {
        let mut o = options(Action::Apply);
        let relation = Relation {
            ancestry: Ancestry::Forward,
            frozen: Some(Frozen {
                window: "live".into(),
                until: "2026-12-27T00:00:00Z".into(),
            }),
            thresholds: None,
        };
        assert_eq!(
            in_force(&o, &relation).map(|f| f.window.as_str()),
            Some("live")
        );
        o.frozen = Some(Frozen {
            window: "new".into(),
            until: "2026-12-26T00:00:00Z".into(),
        });
        assert_eq!(
            in_force(&o, &relation).map(|f| f.window.as_str()),
            Some("new")
        );
        let r = decide(
            &o,
            &desired(1),
            &live("a", 1),
            &Changes::default(),
            relation,
        );
        assert_eq!(
            r,
            Err(Refusal::Frozen {
                window: "new".into(),
                until: "2026-12-26T00:00:00Z".into()
            })
        );
        assert_eq!(
            in_force(&options(Action::Apply), &Ancestry::Forward.into()),
            None
        );
    }

    #[test]
    fn a_renewal_repairs_at_the_live_commit_whatever_the_thresholds_and_freeze_and_never_moves() {
        let d = desired(40);
        let mut o = options(Action::Renew);
        o.frozen = Some(Frozen {
            window: "final".into(),
            until: "2026-12-26T06:00:00Z".into(),
        });
        let frozen_live = Relation {
            ancestry: Ancestry::Forward,
            frozen: o.frozen.clone(),
            thresholds: Some(Thresholds::default()),
        };
        // At the own commit: a repair, over thresholds and in a freeze.
        assert_eq!(
            decide(
                &o,
                &d,
                &live("b", 100),
                &mass_deletion(),
                frozen_live.clone()
            ),
            Ok(Move::Repair)
        );
        // Another live commit (it moved meanwhile), or none: refused, even
        // with every override.
        o.break_glass = true;
        o.overrides.force = true;
        o.overrides.allow_rollback = true;
        for l in [live("a", 100), Live::default()] {
            let r = decide(&o, &d, &l, &Changes::default(), Ancestry::Forward.into());
            assert_eq!(r.unwrap_err().kind(), RefusalKind::NotLive);
        }
    }

    #[test]
    fn actions_are_named_as_the_cli_and_logs_name_them() {
        for (action, name) in [
            (Action::Apply, "apply"),
            (Action::Sync, "sync"),
            (Action::Heal, "heal"),
            (Action::Renew, "renew"),
        ] {
            assert_eq!(action.as_str(), name);
            assert_eq!(
                serde_json::to_string(&action).unwrap(),
                format!("\"{name}\"")
            );
        }
    }
}
