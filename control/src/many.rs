//! Work on many targets: which targets (`jobs`), and every one of them
//! applied, healed or synced concurrently (bounded by
//! [`Settings::parallel`]), each outcome kept and logged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::apply::{self, Expect, Options, Outcome};
use super::gate::{Action, Frozen};
use super::plan::{Overrides, Refusal, RefusalKind};
use super::run::{Ancestor, each};
use super::saved::{SavedPlan, desired_digest};
use super::track::{self, Scope, Tracker};
use super::{Job, heal};
use compiler::model::resolved::FreezeWindow;
use compiler::workspace::Source;

/// How to push: the safety overrides, concurrency and lock wait
/// (`apply`'s and `reconcile`'s flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Override the safety thresholds and the empty-state refusal.
    pub force: bool,
    /// Allow pushing a commit that does not descend from the one live.
    pub allow_rollback: bool,
    /// `apply --adopt` ([`crate::plan::Overrides::adopt`]).
    pub adopt: bool,
    /// Targets worked on at once.
    pub parallel: usize,
    /// How long to wait for another apply's lock on a target.
    pub lock_wait: Duration,
    /// Write through an open freeze window (recorded in the history).
    pub break_glass: bool,
    /// Heal: report the drift, write nothing.
    pub dry_run: bool,
    /// `reconcile --require-signed-by`: the history from each target's
    /// live commit to the one pushed must be signed throughout.
    pub signers: Option<gitsource::signed::AllowedSigners>,
    /// With `signers`: the last good commit the control host knows (its
    /// state directory), which a target without a live commit is checked
    /// from (descent, signed history, freeze) in place of one.
    pub last_good: Option<String>,
    /// Where every target's outcome is counted (the reconciler serves them).
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// For a target whose `edgeform:meta` names no commit (lost, or never
/// written): learn the live commits of every target of the repository
/// (not only this run's `--node`s) once per run, so that their freeze
/// windows are in force for it too.
async fn learn_others(
    ancestor: &Ancestor,
    con: &mut redis::aio::MultiplexedConnection,
    all: &[compiler::model::resolved::Node],
) {
    let commit = |c: redis::RedisResult<Option<String>>| c.ok().flatten().filter(|c| !c.is_empty());
    let live = commit(
        redis::cmd("HGET")
            .arg(edgestate::keys::META)
            .arg("commit")
            .query_async(con)
            .await,
    );
    if live.is_some() {
        return;
    }
    ancestor
        .learnt
        .get_or_init(|| async {
            // Concurrently: an unreachable target costs its connect
            // timeout once, not once per target.
            let targets: Vec<_> = all.iter().filter(|n| n.redis.is_some()).cloned().collect();
            let others: BTreeSet<String> = live_commits(&targets)
                .await
                .into_values()
                .filter_map(|r| r.ok().flatten())
                .collect();
            ancestor.learn(others.into_iter().collect());
        })
        .await;
}

/// What the run knows of each target's live commit, by node.
pub(crate) type LiveCommits = BTreeMap<String, Result<Option<String>, String>>;

/// Read the commit in each target's `edgeform:meta`, concurrently.
pub(crate) async fn live_commits(nodes: &[compiler::model::resolved::Node]) -> LiveCommits {
    let mut set = tokio::task::JoinSet::new();
    for node in nodes {
        let node = node.clone();
        set.spawn(async move {
            let read = async {
                let mut con = crate::master(&node).await?;
                let commit: Option<String> = redis::cmd("HGET")
                    .arg(edgestate::keys::META)
                    .arg("commit")
                    .query_async(&mut con)
                    .await
                    .context("reading edgeform:meta")?;
                anyhow::Ok(commit.filter(|c| !c.is_empty()))
            };
            let r = read.await.map_err(|e| {
                edgeredis::one_line(&edgeredis::with_refusal(&node.name, e)).to_string()
            });
            (node.name.clone(), r)
        });
    }
    let mut out = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        if let Ok((name, r)) = joined {
            out.insert(name, r);
        }
    }
    out
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

/// The options of `action` for `source` under `settings`: the freeze
/// window open now ([`compiler::clock::now`]) and who writes.
#[must_use]
pub fn options(source: &Source, flags: &Settings, action: Action) -> Options {
    // The CLI checked the clock (EDGEFORM_NOW refused) before the run.
    let now = compiler::clock::checked_now();
    let frozen = frozen(source);
    Options {
        commit: source.commit.clone(),
        thresholds: source.config.cluster.apply,
        overrides: Overrides {
            force: flags.force,
            allow_rollback: flags.allow_rollback,
            adopt: flags.adopt,
        },
        lease: Duration::from_secs(300),
        lock_wait: flags.lock_wait,
        action,
        frozen,
        break_glass: flags.break_glass,
        dry_run: flags.dry_run && action == Action::Heal,
        audit: super::audit::Audit::current(now),
        metrics: Arc::clone(&flags.metrics),
        bodies: Arc::default(),
    }
}

/// The freeze window of `source` open at `now`, if any.
#[must_use]
pub fn frozen_at(source: &Source, now: u64) -> Option<Frozen> {
    FreezeWindow::open_at(&source.config.cluster.freeze, now).map(|w| Frozen {
        window: w.name.clone(),
        until: compiler::clock::rfc3339(w.end),
    })
}

/// The freeze window of `source` open now ([`compiler::clock::now`]) or,
/// under `--now`, at the real time ([`compiler::clock::freeze_instants`]).
#[must_use]
pub fn frozen(source: &Source) -> Option<Frozen> {
    frozen_in(&source.config)
}

/// The freeze window of `config` open now, as [`frozen`] decides it.
#[must_use]
pub fn frozen_in(config: &compiler::Config) -> Option<Frozen> {
    FreezeWindow::open_at_any(&config.cluster.freeze, &compiler::clock::freeze_instants()).map(
        |w| Frozen {
            window: w.name.clone(),
            until: compiler::clock::rfc3339(w.end),
        },
    )
}

/// How one target's sync or heal ended: typed, so logs, exit codes and
/// metrics count the same thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Nothing to do.
    InSync,
    /// Written: this many keys (sync: documents written and deleted;
    /// heal: drifted keys repaired).
    Written(usize),
    /// Dry run: this much drift found, nothing written.
    WouldRepair(usize),
    /// The gate refused (nothing written).
    Refused(RefusalKind),
    /// Unreachable, lock timeout, Redis error.
    Failed,
}

/// Every target's [`Ended`], in node order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub targets: Vec<(String, Ended)>,
}

impl Report {
    /// 1 when a target failed or was refused; else 2 when a dry run found
    /// drift; else 0.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        let any = |f: fn(&Ended) -> bool| self.targets.iter().any(|(_, e)| f(e));
        if any(|e| matches!(e, Ended::Failed | Ended::Refused(_))) {
            1
        } else if any(|e| matches!(e, Ended::WouldRepair(n) if *n > 0)) {
            2
        } else {
            0
        }
    }

    /// Targets that failed or were refused.
    #[must_use]
    pub fn failed(&self) -> usize {
        self.targets
            .iter()
            .filter(|(_, e)| matches!(e, Ended::Failed | Ended::Refused(_)))
            .count()
    }
}

/// The refusal inside an error, when the gate refused.
#[must_use]
pub fn refusal(e: &anyhow::Error) -> Option<&Refusal> {
    e.downcast_ref::<Refusal>()
}

/// One target's apply outcome, for reports and tests.
pub type Applied = (Job, Result<Outcome>);

/// Apply to every job (as `action`: apply or sync), `tick` after each;
/// returns each outcome.
#[allow(clippy::too_many_arguments)]
pub async fn apply_all(
    source: &Source,
    jobs: Vec<Job>,
    flags: &Settings,
    action: Action,
    expect: Option<&SavedPlan>,
    root: &Path,
    tick: Arc<dyn Fn() + Send + Sync>,
) -> Vec<Applied> {
    let options = Arc::new(options(source, flags, action));
    apply_all_with(source, jobs, flags, options, expect, root, tick).await
}

/// [`apply_all`] recording `wave` (the rollout wave, in the meta and the
/// history) and `consent` (the rollback guard's consent a rollout gave)
/// with every write.
pub async fn apply_rollout(
    source: &Source,
    jobs: Vec<Job>,
    flags: &Settings,
    action: Action,
    root: &Path,
    wave: Option<&str>,
    consent: Option<&str>,
) -> Vec<Applied> {
    let mut options = options(source, flags, action);
    options.audit.wave = wave.map(str::to_owned);
    options.audit.consent = consent.map(str::to_owned);
    apply_all_with(
        source,
        jobs,
        flags,
        Arc::new(options),
        None,
        root,
        Arc::new(|| {}),
    )
    .await
}

/// [`apply_all`] with the run's options made by the caller.
async fn apply_all_with(
    source: &Source,
    jobs: Vec<Job>,
    flags: &Settings,
    options: Arc<Options>,
    expect: Option<&SavedPlan>,
    root: &Path,
    tick: Arc<dyn Fn() + Send + Sync>,
) -> Vec<Applied> {
    let ancestor = Arc::new(
        Ancestor::new(root, &source.commit)
            .signed_by(flags.signers.clone())
            .since(flags.last_good.clone()),
    );
    let expect: Option<Arc<SavedPlan>> = expect.map(|p| Arc::new(p.clone()));
    let all = Arc::new(source.config.nodes.clone());
    options
        .bodies
        .expect(&jobs.iter().map(|j| &*j.desired).collect::<Vec<_>>());
    each(jobs, flags.parallel, |job| {
        let options = options.clone();
        let ancestor = ancestor.clone();
        let all = all.clone();
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
                let mut con = crate::master(&job.node).await?;
                learn_others(&ancestor, &mut con, &all).await;
                let relate = |live: Option<&str>| ancestor.relate(live);
                apply::apply(&mut con, &job.desired, &options, e.as_ref(), &relate).await
            }
            .await;
            tick();
            options.metrics.apply_seconds.observe(start.elapsed().as_secs_f64());
            tracing::debug!(node = %job.node.name, elapsed = ?start.elapsed(), ok = result.is_ok(), "apply");
            result
        }
    })
    .await
}

/// Heal every target; log every drift (with `dry_run`, print it and
/// write nothing) and every refusal. With a `tracker` (the daemon), a
/// target compares only the keys its Redis reported written since it was
/// last found healthy (see [`super::track`]).
pub async fn heal_all(
    source: &Source,
    jobs: Vec<Job>,
    flags: &Settings,
    root: &Path,
    tracker: Option<Arc<Tracker>>,
) -> Report {
    let options = Arc::new(options(source, flags, Action::Heal));
    let dry = options.dry_run;
    let ancestor = Arc::new(
        Ancestor::new(root, &source.commit)
            .signed_by(flags.signers.clone())
            .since(flags.last_good.clone()),
    );
    let all = Arc::new(source.config.nodes.clone());
    let results = each(jobs, flags.parallel, |job| {
        let options = options.clone();
        let ancestor = ancestor.clone();
        let all = all.clone();
        let tracker = tracker.clone().filter(|_| !dry);
        async move {
            let start = Instant::now();
            let verified = track::verified(&options.commit, job.desired.digest());
            let begun = match &tracker {
                Some(t) => match t.begin(&job.node, &verified).await {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::warn!(target = %job.node.name, cause = %edgeredis::one_line(&e), "heal: no tracking connection; comparing everything");
                        None
                    }
                },
                None => None,
            };
            let scope = begun.as_ref().map(|b| &b.scope);
            let result = async {
                if let (Some(Scope::Clean), Some(b)) = (scope, &begun) {
                    return Ok(heal::Healed {
                        bytes: b.bytes,
                        ..heal::Healed::default()
                    });
                }
                let mut con = crate::master(&job.node).await?;
                learn_others(&ancestor, &mut con, &all).await;
                let relate = |live: Option<&str>| ancestor.relate(live);
                let what = match scope {
                    Some(Scope::Keys(keys)) => heal::Scope::Keys(keys),
                    _ => heal::Scope::Everything,
                };
                heal::heal_scoped(&mut con, &job.desired, &options, &relate, what).await
            }
            .await;
            let result = result.map(|mut h| {
                h.compared = match scope {
                    Some(Scope::Clean) => "nothing written".to_owned(),
                    Some(Scope::Keys(keys)) if h.everything => format!(
                        "everything: {} key(s) written, the meta or manifest among them",
                        keys.len()
                    ),
                    Some(Scope::Keys(keys)) => format!("{} key(s) written", keys.len()),
                    Some(Scope::Everything(why)) => format!("everything: {why}"),
                    None => "everything".to_owned(),
                };
                h
            });
            if let (Some(t), Some(b)) = (&tracker, &begun) {
                t.end(b, result.is_ok(), &verified);
            }
            options.metrics
                .heal_seconds
                .observe(start.elapsed().as_secs_f64());
            result
        }
    })
    .await;
    let mut report = Report::default();
    let mut listing = String::new();
    let metrics = &flags.metrics;
    for (job, r) in results {
        let node = &job.node.name;
        if !dry {
            match &r {
                Ok(h) => {
                    metrics.succeeded(node, "heal", &source.commit);
                    for d in &h.drift {
                        metrics.drift(node, d.kind.as_str(), 1);
                    }
                }
                Err(e) => metrics.failed(node, "heal", e),
            }
        }
        let ended = match r {
            Ok(h) if dry => {
                for d in &h.drift {
                    tracing::warn!(target = %node, key = %d.key, kind = d.kind.as_str(), "drift (dry run: not repaired)");
                    listing.push_str(&format!("{node}\t{}\t{}\n", d.kind.as_str(), d.key));
                }
                if let Some(r) = &h.refusal {
                    tracing::warn!(target = %node, reason = r.kind().as_str(), cause = %r, "heal would be refused (dry run)");
                    listing.push_str(&format!("{node}\trefused\t{r}\n"));
                }
                tracing::info!(target = %node, drift = h.drift.len(), bytes = h.bytes, calls = h.calls, "heal (dry run): nothing written");
                match &h.refusal {
                    Some(r) => Ended::Refused(r.kind()),
                    None => Ended::WouldRepair(h.drift.len()),
                }
            }
            Ok(h) if h.drift.is_empty() => {
                tracing::info!(target = %node, compared = %h.compared, bytes = h.bytes, calls = h.calls, rounds = h.rounds, slowest_call = ?h.slowest_call, largest_call = h.largest_call, "heal: no drift");
                Ended::InSync
            }
            Ok(h) => {
                for d in &h.drift {
                    tracing::warn!(target = %node, key = %d.key, kind = d.kind.as_str(), "drift repaired");
                }
                tracing::info!(target = %node, compared = %h.compared, repaired = h.drift.len(), bytes = h.bytes, calls = h.calls, rounds = h.rounds, slowest_call = ?h.slowest_call, largest_call = h.largest_call, "heal: drift repaired");
                Ended::Written(h.drift.len())
            }
            Err(e) => failed_or_refused("heal", &job, &e),
        };
        report.targets.push((node.clone(), ended));
    }
    if dry {
        use std::io::Write as _;
        let _ = std::io::stdout().lock().write_all(listing.as_bytes());
    }
    report
}

/// Log a target's error: a refusal (with its kind) or a failure.
fn failed_or_refused(what: &str, job: &Job, e: &anyhow::Error) -> Ended {
    match refusal(e) {
        Some(r) => {
            tracing::error!(target = %job.node.name, reason = r.kind().as_str(), cause = %r, "{what} refused: nothing written");
            Ended::Refused(r.kind())
        }
        None => {
            tracing::error!(target = %job.node.name, at = %job.node.redis_at(), cause = %edgeredis::one_line(e), "{what} failed");
            Ended::Failed
        }
    }
}

/// Sync every target (an apply with the usual safety); log outcomes.
pub async fn sync_all(source: &Source, jobs: Vec<Job>, flags: &Settings, root: &Path) -> Report {
    let results = apply_all(
        source,
        jobs,
        flags,
        Action::Sync,
        None,
        root,
        Arc::new(|| {}),
    )
    .await;
    applied_report("sync", source, results, flags)
}

/// Push renewed certificates to `jobs`, each target at its own live
/// commit, `source.commit` (the caller grouped the targets by it): a
/// repair the gate never lets move a target ([`Action::Renew`]), outside
/// thresholds. `urgent`: the freeze window open and the certificates
/// that would otherwise expire within 72 hours, recorded in the history.
pub async fn renew_all(
    source: &Source,
    jobs: Vec<Job>,
    flags: &Settings,
    root: &Path,
    urgent: Option<super::audit::UrgentRenewal>,
) -> Report {
    let mut options = options(source, flags, Action::Renew);
    options.audit.urgent_renewal = urgent;
    let results = apply_all_with(
        source,
        jobs,
        flags,
        Arc::new(options),
        None,
        root,
        Arc::new(|| {}),
    )
    .await;
    applied_report("renew", source, results, flags)
}

/// Count and log each target's apply outcome of `what` (sync, renew).
pub(crate) fn applied_report(
    what: &str,
    source: &Source,
    results: Vec<Applied>,
    flags: &Settings,
) -> Report {
    let mut report = Report::default();
    let metrics = &flags.metrics;
    for (job, r) in &results {
        match r {
            Ok(o) => {
                metrics.succeeded(&job.node.name, what, &source.commit);
                if let Outcome::Applied { changes, .. } = o {
                    metrics.drift(&job.node.name, "missing", changes.added.len());
                    metrics.drift(&job.node.name, "changed", changes.changed.len());
                    metrics.drift(&job.node.name, "removed", changes.removed.len());
                }
            }
            Err(e) => metrics.failed(&job.node.name, what, e),
        }
    }
    for (job, r) in results {
        let ended = match r {
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
                tracing::info!(target = %job.node.name, generation, commit = %source.commit, "{what}: applied");
                Ended::Written(changes.count())
            }
            Ok(Outcome::Unchanged { generation }) => {
                tracing::info!(target = %job.node.name, generation, "{what}: in sync");
                Ended::InSync
            }
            Err(e) => failed_or_refused(what, &job, &e),
        };
        report.targets.push((job.node.name.clone(), ended));
    }
    report
}
