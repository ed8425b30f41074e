//! Rollouts in waves (`cluster.yaml` `apply.waves`; docs/operations.md,
//! "Rollouts in waves").
//!
//! A new commit moves wave by wave: the first wave is applied, bakes its
//! `bake` time, the [`gate`] judges it, then the next wave is applied, and
//! so on. The [`Record`] of the rollout (commit, each target's previous
//! commit, the waves with their nodes, when each was applied and until
//! when it bakes, the [`State`]) is kept in the state store
//! ([`crate::store::Store::rollout`]), so every reconciler sharing the
//! store sees the same rollout; so is the list of aborted commits, which
//! sync never applies again.
//!
//! This module is pure: which targets are in which wave ([`plan`]) and
//! the state machine ([`Record::step`], [`Record::applied`],
//! [`Record::judged`], [`Record::promote`], [`Record::abort`]). The I/O
//! (applying a wave, the store, the gate's queries) is in [`run`].
//!
//! One commit at a time: while a rollout is live (baking, ready or
//! halted), a newer commit waits; it starts once the live one completes
//! or is aborted.

pub mod cmd;
pub mod figures;
pub mod gate;
pub mod prom;
pub mod run;

use std::collections::BTreeMap;

use compiler::model::resolved::{Node, Rollout};
use serde::{Deserialize, Serialize};

/// How many aborted commits the store remembers (the oldest forgotten).
pub const ABORTED_CAP: usize = 100;

/// One wave as planned: its name, targets and bake time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedWave {
    pub name: String,
    pub nodes: Vec<String>,
    pub bake_s: u64,
}

/// Pure: the waves a change goes through, each with its targets (nodes
/// with a `redis` block), in order. Waves that select no target are
/// kept (`check` refuses them; a `--node` subset may empty one).
#[must_use]
pub fn plan(rollout: &Rollout, nodes: &[Node]) -> Vec<PlannedWave> {
    rollout
        .waves
        .iter()
        .zip(rollout.assign(nodes))
        .map(|(w, nodes)| PlannedWave {
            name: w.name.clone(),
            nodes,
            bake_s: w.bake_s,
        })
        .collect()
}

/// One wave of a live rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveRecord {
    pub name: String,
    pub nodes: Vec<String>,
    pub bake_s: u64,
    /// When it was applied (seconds since the epoch); `None`: not yet.
    #[serde(default)]
    pub applied_at: Option<u64>,
    /// Until when it bakes (`applied_at + bake_s`).
    #[serde(default)]
    pub bake_until: Option<u64>,
    /// Who moved the rollout on to this wave before the previous one's
    /// bake was over (`rollout promote`), `user@host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_by: Option<String>,
}

/// Where a rollout stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum State {
    /// The last applied wave bakes until its `bake_until`.
    Baking,
    /// The last applied wave passed the gate; the next one may go.
    Ready,
    /// The gate halted it: `site` and `figure` name the regression (or the
    /// gate's error: `site` empty, `figure` its kind).
    Halted {
        site: String,
        figure: String,
        detail: String,
    },
    /// Every applied wave went back to its previous commit.
    Aborted { by: String },
    /// Every wave applied and passed.
    Complete,
}

impl State {
    /// The word `rollout status` and the metrics use.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Baking => "baking",
            State::Ready => "ready",
            State::Halted { .. } => "halted",
            State::Aborted { .. } => "aborted",
            State::Complete => "complete",
        }
    }

    /// Baking, ready or halted: the rollout holds the cluster (one commit
    /// at a time).
    #[must_use]
    pub fn is_live(&self) -> bool {
        matches!(self, State::Baking | State::Ready | State::Halted { .. })
    }
}

/// A rollout of one commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub commit: String,
    /// Each target's commit before the rollout (`None`: it had none).
    pub previous: BTreeMap<String, Option<String>>,
    /// The hosts whose compiled document the commit changes (what the
    /// gate looks at).
    #[serde(default)]
    pub changed_hosts: Vec<String>,
    pub waves: Vec<WaveRecord>,
    /// When the first wave was applied.
    pub started_at: u64,
    #[serde(flatten)]
    pub state: State,
}

/// What a rollout needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The wave `wave` bakes until `until`.
    Wait { wave: usize, until: u64 },
    /// The wave `wave`'s bake is over: ask the gate.
    Judge { wave: usize },
    /// Apply the wave `wave` (the previous one passed).
    Apply { wave: usize },
    /// Halted: waits for `rollout promote` or `rollout abort`.
    Halted,
    /// Complete or aborted: nothing left.
    Done,
}

/// What the state store keeps about rollouts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Book {
    /// The latest rollout (live or ended).
    #[serde(default)]
    pub current: Option<Record>,
    /// Commits aborted (by the gate with `auto_rollback`, or by `rollout
    /// abort`), newest last, at most [`ABORTED_CAP`]: sync never applies
    /// them again.
    #[serde(default)]
    pub aborted: Vec<String>,
}

impl Book {
    /// Read the store's text (`None`: nothing kept yet).
    ///
    /// # Errors
    /// Text that is not a rollout book.
    pub fn parse(text: Option<&str>) -> Result<Book, serde_json::Error> {
        let book: Book = text.map_or_else(|| Ok(Book::default()), serde_json::from_str)?;
        // A book is read from a store others write: one that would make
        // a step point at a wave it does not have is refused, not
        // stepped through.
        if let Some(r) = &book.current
            && r.state == State::Baking
            && r.applied_count() == 0
        {
            return Err(serde::de::Error::custom(
                "its current rollout is baking a wave, but no wave of it was applied",
            ));
        }
        Ok(book)
    }

    /// The text kept in the store.
    #[must_use]
    pub fn to_text(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Whether `commit` was aborted.
    #[must_use]
    pub fn is_aborted(&self, commit: &str) -> bool {
        self.aborted.iter().any(|c| c == commit)
    }

    /// Remember `commit` as aborted.
    pub fn remember_aborted(&mut self, commit: &str) {
        if !self.is_aborted(commit) {
            self.aborted.push(commit.to_owned());
        }
        if self.aborted.len() > ABORTED_CAP {
            let extra = self.aborted.len() - ABORTED_CAP;
            self.aborted.drain(..extra);
        }
    }

    /// The live rollout (baking, ready or halted), if any.
    #[must_use]
    pub fn live(&self) -> Option<&Record> {
        self.current.as_ref().filter(|r| r.state.is_live())
    }
}

/// Why a commit may not start a rollout now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// Another commit's rollout is live: one commit at a time.
    Busy { live: String, state: &'static str },
    /// This commit was aborted; a newer commit may start a new rollout.
    Aborted,
}

/// Pure: whether `commit` may start a rollout with `book` as it is
/// (`None`), or continue its own live one (also `None`).
#[must_use]
pub fn blocked(book: &Book, commit: &str) -> Option<Blocked> {
    if book.is_aborted(commit) {
        return Some(Blocked::Aborted);
    }
    match book.live() {
        Some(r) if r.commit != commit => Some(Blocked::Busy {
            live: r.commit.clone(),
            state: r.state.as_str(),
        }),
        _ => None,
    }
}

impl Record {
    /// A new rollout of `commit` through `waves` (none applied yet).
    #[must_use]
    pub fn new(
        commit: &str,
        previous: BTreeMap<String, Option<String>>,
        changed_hosts: Vec<String>,
        waves: &[PlannedWave],
        now: u64,
    ) -> Record {
        Record {
            commit: commit.to_owned(),
            previous,
            changed_hosts,
            waves: waves
                .iter()
                .map(|w| WaveRecord {
                    name: w.name.clone(),
                    nodes: w.nodes.clone(),
                    bake_s: w.bake_s,
                    applied_at: None,
                    bake_until: None,
                    promoted_by: None,
                })
                .collect(),
            started_at: now,
            state: State::Ready,
        }
    }

    /// The number of waves applied (they are applied in order).
    #[must_use]
    pub fn applied_count(&self) -> usize {
        self.waves
            .iter()
            .take_while(|w| w.applied_at.is_some())
            .count()
    }

    /// The targets of every applied wave.
    #[must_use]
    pub fn applied_nodes(&self) -> Vec<String> {
        self.waves[..self.applied_count()]
            .iter()
            .flat_map(|w| w.nodes.iter().cloned())
            .collect()
    }

    /// The targets of the waves not applied yet.
    #[must_use]
    pub fn pending_nodes(&self) -> Vec<String> {
        self.waves[self.applied_count()..]
            .iter()
            .flat_map(|w| w.nodes.iter().cloned())
            .collect()
    }

    /// The name of the wave `node` is in.
    #[must_use]
    pub fn wave_of(&self, node: &str) -> Option<&str> {
        self.waves
            .iter()
            .find(|w| w.nodes.iter().any(|n| n == node))
            .map(|w| w.name.as_str())
    }

    /// Pure: what the rollout needs at `now`.
    #[must_use]
    pub fn step(&self, now: u64) -> Step {
        let applied = self.applied_count();
        match &self.state {
            State::Complete | State::Aborted { .. } => Step::Done,
            State::Halted { .. } => Step::Halted,
            State::Ready if applied >= self.waves.len() => Step::Done,
            State::Ready => Step::Apply { wave: applied },
            State::Baking => {
                let wave = applied.saturating_sub(1);
                // A book with no applied wave is refused when read
                // (`Book::parse`); a made-up one bakes nothing.
                let Some(w) = self.waves.get(wave) else {
                    return Step::Halted;
                };
                let until = w.bake_until.unwrap_or(0);
                if now < until {
                    Step::Wait { wave, until }
                } else {
                    Step::Judge { wave }
                }
            }
        }
    }

    /// The wave `wave` was applied at `now`: it bakes.
    pub fn applied(&mut self, wave: usize, now: u64) {
        if let Some(w) = self.waves.get_mut(wave) {
            w.applied_at = Some(now);
            w.bake_until = Some(now.saturating_add(w.bake_s));
        }
        self.state = State::Baking;
    }

    /// The gate's verdict on the last applied wave: passed → ready (or
    /// complete after the last wave); otherwise halted.
    pub fn judged(&mut self, verdict: Result<(), State>) {
        self.state = match verdict {
            Ok(()) if self.applied_count() >= self.waves.len() => State::Complete,
            Ok(()) => State::Ready,
            Err(halted) => halted,
        };
    }

    /// `rollout promote` by `by`: the next wave now, whatever the bake
    /// or a halt said (the operator's call, recorded on the wave).
    /// Returns the wave to apply, or `None` when nothing is left: a live
    /// rollout whose every wave is applied is then complete (the
    /// operator accepts the last wave without its bake or past a halt).
    pub fn promote(&mut self, by: &str) -> Option<usize> {
        if !self.state.is_live() {
            return None;
        }
        let next = self.applied_count();
        let Some(wave) = self.waves.get_mut(next) else {
            self.state = State::Complete;
            return None;
        };
        wave.promoted_by = Some(by.to_owned());
        self.state = State::Ready;
        Some(next)
    }

    /// The wave `wave` reached its targets after the rollout ended (an
    /// abort ran meanwhile): counted as applied, so that rolling back the
    /// applied waves covers it; the state stays.
    pub fn applied_late(&mut self, wave: usize, now: u64) {
        if let Some(w) = self.waves.get_mut(wave)
            && w.applied_at.is_none()
        {
            w.applied_at = Some(now);
        }
    }

    /// The rollout was rolled back (every applied wave at its previous
    /// commit again) by `by`.
    pub fn abort(&mut self, by: &str) {
        self.state = State::Aborted { by: by.to_owned() };
    }
}

/// Pure: the halted state of a gate verdict (`Ok(())` for a pass).
pub fn verdict_state(verdict: &Result<gate::Verdict, gate::GateError>) -> Result<(), State> {
    match verdict {
        Ok(gate::Verdict::Pass { .. }) => Ok(()),
        Ok(gate::Verdict::Halt {
            host,
            figure,
            before,
            after,
            threshold,
        }) => Err(State::Halted {
            site: host.clone(),
            figure: figure.clone(),
            detail: format!("{figure} {before:.4} → {after:.4} (threshold {threshold:.4})"),
        }),
        Err(e) => Err(State::Halted {
            site: String::new(),
            figure: e.kind.as_str().to_owned(),
            detail: e.detail.clone(),
        }),
    }
}

/// Pure: the hosts whose compiled `site:`/`suspended:` value differs
/// between two compiled states (every target's keys together), sorted.
#[must_use]
pub fn changed_hosts(
    before: &compiler::compile::Compiled,
    after: &compiler::compile::Compiled,
) -> Vec<String> {
    use std::collections::BTreeSet;
    let docs = |c: &compiler::compile::Compiled| -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        // Edges of a region share one list: each list read once.
        let mut seen = BTreeSet::new();
        for target in c.targets.values() {
            if !seen.insert(std::sync::Arc::as_ptr(&target.sites)) {
                continue;
            }
            for (key, value) in target.sites.iter().map(|(k, v)| (&**k, &**v)) {
                let host = key
                    .strip_prefix(edgestate::keys::SITE_PREFIX)
                    .or_else(|| key.strip_prefix(edgestate::keys::SUSPENDED_PREFIX));
                if let Some(host) = host {
                    out.entry(host.to_owned())
                        .or_default()
                        .insert(format!("{key}\0{value}"));
                }
            }
        }
        out
    };
    let (a, b) = (docs(before), docs(after));
    let hosts: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    hosts
        .into_iter()
        .filter(|h| a.get(*h) != b.get(*h))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;
