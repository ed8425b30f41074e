//! Work on many targets: which targets (`jobs`), and every one of them
//! applied, healed or synced concurrently (bounded by
//! [`Settings::parallel`]), each outcome kept and logged.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::apply::{self, Expect, Options, Outcome};
use super::plan::Overrides;
use super::run::{Ancestor, each};
use super::saved::{SavedPlan, desired_digest};
use super::{Job, heal};
use crate::workspace::Source;

/// How to push: the safety overrides, concurrency and lock wait
/// (`apply`'s and `reconcile`'s flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Override the safety thresholds and the empty-state refusal.
    pub force: bool,
    /// Allow pushing a commit older than the one live.
    pub allow_rollback: bool,
    /// Targets worked on at once.
    pub parallel: usize,
    /// How long to wait for another apply's lock on a target.
    pub lock_wait: Duration,
}

/// The jobs for `--node` (all targets when empty).
///
/// # Errors
/// A `--node` that names no target.
pub fn jobs(source: &Source, only: &[String]) -> Result<Vec<Job>> {
    for n in only {
        if !source.compiled.targets.contains_key(n) {
            let known: Vec<&String> = source.compiled.targets.keys().collect();
            bail!("--node {n}: no such target (targets are nodes with a redis block: {known:?})");
        }
    }
    let jobs = {
        let _span = tracing::info_span!("jobs (hashes)").entered();
        super::jobs(&source.config, &source.compiled, only)
    };
    if jobs.is_empty() {
        bail!("no targets: no node has a `redis` block");
    }
    Ok(jobs)
}

/// The apply options for `source` under `settings`.
#[must_use]
pub fn options(source: &Source, flags: &Settings) -> Options {
    Options {
        commit: source.commit.clone(),
        thresholds: source.config.cluster.apply,
        overrides: Overrides {
            force: flags.force,
            allow_rollback: flags.allow_rollback,
        },
        lease: Duration::from_secs(300),
        lock_wait: flags.lock_wait,
    }
}

/// One target's apply outcome, for reports and tests.
pub type Applied = (Job, Result<Outcome>);

/// Apply to every job, `tick` after each; returns each outcome.
pub async fn apply_all(
    source: &Source,
    jobs: Vec<Job>,
    flags: &Settings,
    expect: Option<&SavedPlan>,
    root: &Path,
    tick: Arc<dyn Fn() + Send + Sync>,
) -> Vec<Applied> {
    let options = Arc::new(options(source, flags));
    let ancestor = Arc::new(Ancestor::new(root, &source.commit));
    let expect: Option<Arc<SavedPlan>> = expect.map(|p| Arc::new(p.clone()));
    each(jobs, flags.parallel, |job| {
        let options = options.clone();
        let ancestor = ancestor.clone();
        let expect = expect.clone();
        let tick = tick.clone();
        async move {
            let start = Instant::now();
            let result = async {
                let e = match &expect {
                    Some(p) => {
                        let t = p
                            .targets
                            .iter()
                            .find(|t| t.node == job.node.name)
                            .context("target not in the saved plan")?;
                        if t.desired_digest != desired_digest(&job.desired) {
                            bail!("the repository differs from the saved plan's; plan again");
                        }
                        Some(Expect { generation: t.generation, manifest_digest: t.manifest_digest.clone() })
                    }
                    None => None,
                };
                let mut con = job.node.redis_master().await?;
                let relate = |live: Option<&str>| ancestor.relate(live);
                apply::apply(&mut con, &job.desired, &options, e.as_ref(), &relate).await
            }
            .await;
            tick();
            crate::metrics::global().apply_seconds.observe(start.elapsed().as_secs_f64());
            tracing::debug!(node = %job.node.name, elapsed = ?start.elapsed(), ok = result.is_ok(), "apply");
            result
        }
    })
    .await
}

/// Heal every target; log every drift. Returns the number of failures.
pub async fn heal_all(source: &Source, jobs: Vec<Job>, flags: &Settings, root: &Path) -> usize {
    let options = Arc::new(options(source, flags));
    let ancestor = Arc::new(Ancestor::new(root, &source.commit));
    let results = each(jobs, flags.parallel, |job| {
        let options = options.clone();
        let ancestor = ancestor.clone();
        async move {
            let start = Instant::now();
            let result = async {
                let mut con = job.node.redis_master().await?;
                let relate = |live: Option<&str>| ancestor.relate(live);
                heal::heal(&mut con, &job.desired, &options, &relate).await
            }
            .await;
            crate::metrics::global()
                .heal_seconds
                .observe(start.elapsed().as_secs_f64());
            result
        }
    })
    .await;
    let mut failed = 0;
    let metrics = crate::metrics::global();
    for (job, r) in results {
        match &r {
            Ok(h) => {
                metrics.succeeded(&job.node.name, "heal", &source.commit);
                for d in &h.drift {
                    metrics.drift(&job.node.name, d.kind.as_str(), 1);
                }
            }
            Err(e) => metrics.failed(&job.node.name, "heal", e),
        }
        match r {
            Ok(h) if h.drift.is_empty() => {
                tracing::info!(target = %job.node.name, bytes = h.bytes, calls = h.calls, slowest_call = ?h.slowest_call, "heal: no drift")
            }
            Ok(h) => {
                for d in &h.drift {
                    tracing::warn!(target = %job.node.name, key = %d.key, kind = d.kind.as_str(), "drift repaired");
                }
                tracing::info!(target = %job.node.name, repaired = h.drift.len(), bytes = h.bytes, calls = h.calls, slowest_call = ?h.slowest_call, "heal: drift repaired");
            }
            Err(e) => {
                failed += 1;
                tracing::error!(target = %job.node.name, at = %job.node.redis_at(), cause = %edgeredis::one_line(&e), "heal failed");
            }
        }
    }
    failed
}

/// Sync every target (an apply with the usual safety); log outcomes.
pub async fn sync_all(source: &Source, jobs: Vec<Job>, flags: &Settings, root: &Path) -> usize {
    let results = apply_all(source, jobs, flags, None, root, Arc::new(|| {})).await;
    let mut failed = 0;
    let metrics = crate::metrics::global();
    for (job, r) in &results {
        match r {
            Ok(o) => {
                metrics.succeeded(&job.node.name, "sync", &source.commit);
                if let Outcome::Applied { changes, .. } = o {
                    metrics.drift(&job.node.name, "missing", changes.added.len());
                    metrics.drift(&job.node.name, "changed", changes.changed.len());
                    metrics.drift(&job.node.name, "removed", changes.removed.len());
                }
            }
            Err(e) => metrics.failed(&job.node.name, "sync", e),
        }
    }
    for (job, r) in results {
        match r {
            Ok(Outcome::Applied {
                changes,
                generation,
            }) => {
                for k in &changes.added {
                    tracing::warn!(target = %job.node.name, key = %k, kind = "missing", "drift: pushed");
                }
                for k in &changes.changed {
                    tracing::warn!(target = %job.node.name, key = %k, kind = "changed", "drift: pushed");
                }
                for k in &changes.removed {
                    tracing::warn!(target = %job.node.name, key = %k, kind = "removed", "drift: pruned");
                }
                tracing::info!(target = %job.node.name, generation, "sync: applied");
            }
            Ok(Outcome::Unchanged { generation }) => {
                tracing::info!(target = %job.node.name, generation, "sync: in sync");
            }
            Err(e) => {
                failed += 1;
                tracing::error!(target = %job.node.name, at = %job.node.redis_at(), cause = %edgeredis::one_line(&e), "sync failed");
            }
        }
    }
    failed
}
