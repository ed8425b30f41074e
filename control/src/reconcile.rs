//! The reconciler: the scheduled sync, heal and certificates jobs, the
//! daemon loop and its signals, and the network pull (`--pull
//! REMOTE/BRANCH`). The certificates job is [`crate::renew::job`].
//!
//! Two daemons (two control hosts, one shared state store) run together:
//! the daemon runs its jobs only while it holds the state store's lease
//! ([`crate::store::lease`]): one lease for every side-effecting job
//! (sync, heal, the purge outbox, certificates), not one per job, because
//! the jobs share the tracker, the last good commit and each target's
//! apply lock, and two daemons splitting them would still contend on the
//! same targets. The other stands by and takes the lease over, then syncs
//! at once, within `ttl + ttl / 3` of the holder's end (`ttl`: half the
//! shorter of `--sync-every` and `--heal-every`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::many::{Settings, heal_all, sync_all};
use compiler::workspace::{self, Source, Valid};
use gitsource::{remote, signed};

/// Load and check `rev` for one run; an invalid repository is logged
/// (every diagnostic) and is an error saying `not_done` (what the run
/// therefore does not do).
pub(crate) fn checked(root: &Path, rev: Option<&str>, not_done: &str) -> Result<Valid> {
    match workspace::load(root, rev)?.check().valid() {
        Ok(valid) => Ok(valid),
        Err(invalid) => {
            for d in &invalid.diagnostics {
                tracing::error!(at = %d.location(), code = d.code, "{}", compiler::report::clip(&d.message));
            }
            anyhow::bail!(
                "{} is invalid ({}){not_done}",
                invalid.root.display(),
                invalid.summary()
            )
        }
    }
}

/// Load, check and compile for one run; an invalid repository is logged
/// (every diagnostic) and the run pushes nothing.
fn load(root: &Path, rev: Option<&str>, state_dir: &Path) -> Result<Source> {
    let valid = checked(root, rev, "; nothing was pushed")?;
    // Every certificate a site uses, valid now, or nothing is pushed (an
    // expired one refuses the run, typed).
    let now = i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX);
    let certs = crate::certs::for_push_from(state_dir, &valid.config, now)?;
    Ok(valid.compile_with(&certs))
}

/// Which scheduled job to run once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Once {
    Sync,
    Heal,
    /// Order missing ACME certificates, renew due ones, push them at each
    /// target's own commit ([`crate::renew::job`]).
    Certs,
}

impl Once {
    /// The job's name in logs and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Once::Sync => "sync",
            Once::Heal => "heal",
            Once::Certs => "certs",
        }
    }
}

/// Fetch `remote/branch` through git2 and return the fetched commit id.
/// Private remotes: SSH (key file or ssh-agent, host key checked against
/// a known_hosts file) or HTTPS (token), see [`gitsource::remote`].
///
/// # Errors
/// A [`gitsource::remote::PullError`]: no such remote, unreadable key or
/// known_hosts file, refused host key, no or refused credentials, fetch
/// failure.
pub fn pull(root: &Path, spec: &str, auth: &remote::Auth) -> Result<String> {
    use remote::PullError;
    let repo =
        git2::Repository::discover(root).map_err(|_| PullError::NoRepository(root.to_owned()))?;
    let (name, branch) = split_spec(spec, &repo)?;
    let mut r = repo
        .find_remote(name)
        .map_err(|_| PullError::NoRemote(name.to_owned()))?;
    let refspec = format!("+refs/heads/{branch}:refs/remotes/{name}/{branch}");
    remote::fetch(&mut r, &refspec, spec, auth)?;
    // The remote-tracking ref by its full name: a tag or local branch
    // called `origin/main` (pushed, or left in the clone) never stands in
    // for what was fetched.
    let id = repo
        .find_reference(&format!("refs/remotes/{name}/{branch}"))?
        .peel_to_commit()?
        .id()
        .to_string();
    Ok(id)
}

/// `REMOTE/BRANCH` split where REMOTE names a remote of `repo` (a remote's
/// name may hold `/` too); the first `/` when none does, for the error.
fn split_spec<'s>(
    spec: &'s str,
    repo: &git2::Repository,
) -> Result<(&'s str, &'s str), remote::PullError> {
    let known = repo.remotes().ok();
    let known: Vec<&str> = known
        .iter()
        .flat_map(|r| r.iter().flatten().flatten())
        .collect();
    let splits: Vec<(&str, &str)> = spec
        .match_indices('/')
        .map(|(i, _)| (&spec[..i], &spec[i + 1..]))
        .filter(|(r, b)| !r.is_empty() && !b.is_empty())
        .collect();
    let existing: Vec<(&str, &str)> = splits
        .iter()
        .copied()
        .filter(|(r, _)| known.contains(r))
        .collect();
    match existing.as_slice() {
        [one] => Ok(*one),
        [] => splits
            .first()
            .copied()
            .ok_or_else(|| remote::PullError::Spec(spec.to_owned())),
        many => Err(remote::PullError::Ambiguous {
            spec: spec.to_owned(),
            remotes: many.iter().map(|(r, _)| (*r).to_owned()).collect(),
        }),
    }
}

/// A run that could not load its revision: the refused commit, or the
/// error with `what` (what the run therefore did not do).
fn log_not_loaded(e: &anyhow::Error, what: &'static str) {
    match e.downcast_ref::<signed::RefusedCommit>() {
        Some(refused) => log_refused(refused),
        None => tracing::error!(cause = %edgeredis::one_line(e), "{what}"),
    }
}

fn log_refused(refused: &signed::RefusedCommit) {
    tracing::error!(
        commit = %refused.commit,
        reason = refused.refusal.as_str(),
        kept = refused.kept.as_deref().unwrap_or("none"),
        "reconcile: {refused}"
    );
}

/// The revision one run pushes, the refusal when the newest one may not
/// be pushed (`--require-signed-by`) but an earlier good one is kept, and
/// the allowed signers every target's history is checked against.
struct Pick {
    rev: Option<String>,
    refused: Option<signed::RefusedCommit>,
    signers: Option<signed::AllowedSigners>,
    /// The last good commit before this run's (what a target without a
    /// live commit is checked from).
    since: Option<String>,
    /// The commit verified for this run, to be kept as the last good one
    /// once a target has it.
    verified: Option<String>,
}

/// The revision to push: the pulled commit, `--rev`, or (with
/// `--require-signed-by`, which never pushes a working tree) `HEAD`;
/// with `--require-signed-by`, only when its signature verifies and,
/// after the last good commit (`last_good`: the last one verified and
/// applied, kept in the state directory across restarts and `--once`
/// runs),
/// when it descends from it (unless `allow_rollback`) through a history
/// signed throughout. A verified commit becomes the last good one once a
/// target has it (the run's end). A refused commit falls back to
/// `last_good` or, without one, fails the run. (Each target's own live commit is checked the same way by the
/// gate.)
fn pick(
    root: &Path,
    rev: Option<&str>,
    pull_spec: Option<&str>,
    git: &remote::GitOptions,
    auth: &remote::Auth,
    allow_rollback: bool,
    last_good: &std::cell::RefCell<Option<String>>,
) -> Result<Pick> {
    let rev = match pull_spec {
        Some(spec) => Some(pull(root, spec, auth)?),
        None => rev.map(str::to_owned),
    };
    let Some(signers) = &git.require_signed_by else {
        return Ok(Pick {
            rev,
            refused: None,
            signers: None,
            since: None,
            verified: None,
        });
    };
    let signers = signed::AllowedSigners::load(signers)?;
    let repo =
        git2::Repository::discover(root).context("--require-signed-by needs a git repository")?;
    let commit = repo
        .revparse_single(rev.as_deref().unwrap_or("HEAD"))
        .with_context(|| format!("no revision {}", rev.as_deref().unwrap_or("HEAD")))?
        .peel_to_commit()?
        .id();
    let verdict = match signed::verify(&repo, &commit.to_string(), &signers)? {
        Ok(v) => match history(&repo, last_good, commit, &signers, allow_rollback)? {
            Ok(()) => Ok(v),
            Err(refusal) => Err(refusal),
        },
        Err(refusal) => Err(refusal),
    };
    let commit = commit.to_string();
    let since = last_good.borrow().clone();
    match verdict {
        Ok(v) => {
            tracing::info!(%commit, signer = %v.principal, "reconcile: signature verified");
            Ok(Pick {
                rev: Some(commit.clone()),
                refused: None,
                signers: Some(signers),
                since,
                verified: Some(commit),
            })
        }
        Err(refusal) => {
            let refused = signed::RefusedCommit {
                commit,
                refusal,
                kept: last_good.borrow().clone(),
            };
            match refused.kept.clone() {
                Some(good) => {
                    log_refused(&refused);
                    Ok(Pick {
                        rev: Some(good),
                        refused: Some(refused),
                        signers: Some(signers),
                        since,
                        verified: None,
                    })
                }
                // Logged by the run, as its one error.
                None => Err(refused.into()),
            }
        }
    }
}

/// Whether `commit` may follow the last good commit: descends from it
/// (unless `allow_rollback`) and every commit between them verifies.
/// With none known (a new state directory), only the tip was verified:
/// said in a warning.
fn history(
    repo: &git2::Repository,
    last_good: &std::cell::RefCell<Option<String>>,
    commit: git2::Oid,
    signers: &signed::AllowedSigners,
    allow_rollback: bool,
) -> Result<Result<(), signed::Refusal>> {
    let Some(good) = last_good.borrow().clone() else {
        tracing::warn!(
            %commit,
            "reconcile: no last good commit is known (state directory): only this commit's \
             signature was verified, not its history; it becomes the last good commit"
        );
        return Ok(Ok(()));
    };
    let good_id = git2::Oid::from_str(&good)?;
    if repo.find_commit(good_id).is_err() {
        anyhow::bail!(
            "the last good commit {good} (state directory) is not in the repository: \
             fetch it, or see docs/operations.md to start the signed history again"
        );
    }
    if good_id == commit {
        return Ok(Ok(()));
    }
    if !allow_rollback && !repo.graph_descendant_of(commit, good_id)? {
        return Ok(Err(signed::Refusal::NotDescendant { last_good: good }));
    }
    Ok(
        signed::verify_history(repo, good_id, commit, signers)?.map_err(|(commit, r)| {
            signed::Refusal::UnsignedHistory {
                commit,
                why: r.as_str(),
            }
        }),
    )
}

/// The daemon's lease on the state store, kept from a thread (None: no
/// shared store and no state directory, a daemon alone).
fn lease(
    state_dir: &Path,
    only: &[String],
    sync_every: Duration,
    heal_every: Duration,
    metrics: &Arc<crate::metrics::Metrics>,
) -> Result<Option<Arc<crate::store::lease::Leader>>> {
    use crate::store::lease;
    let Some(store) = crate::store::open_existing(state_dir)? else {
        tracing::info!(
            state_dir = %state_dir.display(),
            "reconcile: no state directory and no shared state store: running without a lease \
             (a second daemon on these targets would not be excluded)"
        );
        metrics.lease_held(true);
        return Ok(None);
    };
    let ttl = lease::ttl_for(sync_every, heal_every);
    let name = lease::scope(only);
    let m = Arc::clone(metrics);
    let leader = lease::Leader::start(Arc::from(store), &name, ttl, move |held| {
        m.lease_held(held);
    })?;
    crate::lock::run_under(Arc::clone(&leader));
    if !leader.held() {
        let holder = leader.current().ok().flatten().unwrap_or_default();
        tracing::info!(
            lease = %name,
            %holder,
            ttl_ms = ttl.as_millis(),
            "reconcile: another daemon holds the lease in {}; standing by",
            crate::store::describe(state_dir)
        );
    }
    Ok(Some(leader))
}

/// How long an urgent heal waits for the rest of a loss's pushes, how
/// often it is tried again while a target fails, and for how long.
const URGENT_SETTLE: Duration = Duration::from_millis(200);
const URGENT_RETRY: Duration = Duration::from_secs(1);
const URGENT_RETRY_FOR: Duration = Duration::from_secs(60);

/// The sync job under `apply.waves`: the live rollout moved on (a newer
/// commit waits for it), or this commit's rollout started. `None`: not a
/// rollout (no waves and none live, `--node` given, or every target at
/// the commit): sync as usual.
async fn rollout_sync(
    source: &Source,
    flags: &Settings,
    root: &Path,
    state_dir: &Path,
    only: &[String],
) -> Option<super::many::Report> {
    use crate::rollout::run::{Advanced, Ctx, advance, load as load_book};
    if !only.is_empty() {
        return None;
    }
    let store = if source.config.cluster.rollout.waves.is_empty() {
        crate::store::open_existing(state_dir).ok().flatten()?
    } else {
        match crate::store::open(state_dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(cause = %e, "rollout: no state store; nothing pushed");
                return Some(failed_report());
            }
        }
    };
    let book = match load_book(&*store) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(cause = %edgeredis::one_line(&e), "rollout: nothing pushed");
            return Some(failed_report());
        }
    };
    let live = book.live().map(|r| r.commit.clone());
    if source.config.cluster.rollout.waves.is_empty() && live.is_none() {
        return None;
    }
    let ctx = Ctx {
        root,
        flags,
        store: &*store,
        action: super::gate::Action::Sync,
    };
    let other;
    let rolling = match live {
        Some(c) if c != source.commit => {
            tracing::info!(live = %c, waiting = %source.commit, "rollout: one commit at a time; the new commit waits for the live rollout");
            other = match load(root, Some(&c), state_dir) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(commit = %c, cause = %edgeredis::one_line(&e), "rollout: the live rollout's commit cannot be loaded");
                    return Some(failed_report());
                }
            };
            &other
        }
        _ => source,
    };
    match advance(&ctx, rolling, false).await {
        Ok(Advanced::NotARollout) => None,
        Ok(Advanced::Blocked(b)) => {
            tracing::warn!(commit = %rolling.commit, why = ?b, "rollout: the commit is not applied");
            Some(super::many::Report::default())
        }
        Ok(Advanced::Frozen(why)) => {
            tracing::warn!(commit = %rolling.commit, %why, "rollout: the next wave waits");
            Some(super::many::Report::default())
        }
        Ok(Advanced::Stands {
            record,
            applied,
            notes,
        }) => {
            for n in &notes {
                tracing::info!(commit = %record.commit, "rollout: {n}");
            }
            // Halted: 1 (also for a daemon restarted on a halted rollout).
            // Aborted: left as it is, so the alert of the gate's automatic
            // rollback stays until the next rollout starts. Moving on
            // (promoted elsewhere) clears it.
            match record.state {
                crate::rollout::State::Halted { .. } => {
                    flags.metrics.rollout_halted(&record.commit, true);
                }
                crate::rollout::State::Aborted { .. } => {}
                _ => flags.metrics.rollout_halted(&record.commit, false),
            }
            tracing::info!(commit = %record.commit, state = record.state.as_str(), waves_applied = record.applied_count(), "rollout");
            Some(super::many::applied_report("sync", rolling, applied, flags))
        }
        Err(e) => {
            tracing::error!(cause = %edgeredis::one_line(&e), "rollout: failed");
            Some(failed_report())
        }
    }
}

/// A run that could not start: one failed outcome, so it exits 1.
fn failed_report() -> super::many::Report {
    super::many::Report {
        targets: vec![("rollout".to_owned(), super::many::Ended::Failed)],
    }
}

/// `edgeform reconcile`: sync every `sync_every`, heal every
/// `heal_every`, the certificates job at start and every `certs_every`,
/// until SIGTERM or ctrl-c (or one job with `once`). The daemon runs them
/// only while it holds the state store's lease (module documentation);
/// `once` takes none.
///
/// Only the targets in `only` (all when empty; an unknown name fails each
/// run, logged).
///
/// # Errors
/// Only setup errors; a failing target or an invalid revision is logged
/// and retried at the next tick; a target whose Redis may have lost its
/// data (the tracker's pushes) is healed at once.
#[allow(clippy::too_many_arguments)]
pub async fn reconcile(
    root: PathBuf,
    rev: Option<String>,
    only: Vec<String>,
    pull_spec: Option<String>,
    sync_every: Duration,
    heal_every: Duration,
    certs_every: Duration,
    once: Option<Once>,
    flags: Settings,
    git: remote::GitOptions,
    full_heal_every: u32,
    state_dir: PathBuf,
) -> Result<u8> {
    let auth = git.auth();
    if once.is_none() {
        // The daemon fails at start on a file it could never use, rather
        // than logging the same error on every tick.
        if let Some(path) = &git.require_signed_by {
            signed::AllowedSigners::load(path)?;
        }
        if let Some(key) = &auth.ssh_key {
            remote::check_key_file(key)?;
        }
    }
    // The last good commit, kept in the state directory so that `--once`
    // runs and a restarted daemon check a new commit's history from it.
    let store = match &git.require_signed_by {
        Some(_) => Some(crate::store::open(&state_dir)?),
        None => None,
    };
    let last_good = std::cell::RefCell::new(match &store {
        Some(s) => s.last_good()?,
        None => None,
    });
    let load_source = |root: &Path| -> Result<(Source, Pick)> {
        let p = pick(
            root,
            rev.as_deref(),
            pull_spec.as_deref(),
            &git,
            &auth,
            flags.allow_rollback,
            &last_good,
        )?;
        Ok((load(root, p.rev.as_deref(), &state_dir)?, p))
    };
    // The daemon's heals compare what each target's Redis reports written
    // (the tracked heal); `--once` has no history to go on.
    let tracker = once
        .is_none()
        .then(|| std::sync::Arc::new(super::track::Tracker::new(full_heal_every)));
    let run = |which: Once| {
        let last_good = &last_good;
        let store = store.as_ref();
        let tracker = tracker.clone();
        let root = root.clone();
        let only = only.clone();
        let mut flags = flags.clone();
        let source = load_source(&root);
        let state_dir = state_dir.clone();
        async move {
            let (source, pick) = match source {
                Ok(s) => s,
                Err(e) => {
                    log_not_loaded(&e, "reconcile: nothing pushed");
                    return 1;
                }
            };
            let Pick {
                refused,
                signers,
                since,
                verified,
                ..
            } = pick;
            let refused = refused.is_some();
            flags.signers = signers;
            flags.last_good = since;
            if let Some(w) = compiler::model::resolved::FreezeWindow::open_at_any(
                &source.config.cluster.freeze,
                &compiler::clock::freeze_instants(),
            ) {
                tracing::warn!(
                    window = %w.name,
                    reason = %w.reason.as_deref().map(edgestate::untrusted::escape).unwrap_or_default(),
                    until = %compiler::clock::rfc3339(w.end),
                    break_glass = flags.break_glass,
                    "reconcile: a freeze window is open; no target moves to another commit"
                );
            }
            let jobs = match super::many::jobs(&source, &only) {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::error!(cause = %edgeredis::one_line(&e), "reconcile: nothing pushed");
                    return 1;
                }
            };
            // Purge jobs kept for nodes whose Redis did not answer: each
            // run delivers what it can, in order. Under the lease only one
            // daemon delivers; a second delivery would be harmless anyway
            // (the agent runs a job id it recorded no second time).
            if let Ok(Some(outbox)) = crate::store::open_existing(&state_dir) {
                crate::outbox::flush_all(
                    &*outbox,
                    &source.config.nodes,
                    crate::outbox::Unknown::Drop,
                )
                .await;
                if let Ok(depths) = crate::outbox::depths(&*outbox) {
                    flags.metrics.outbox(&depths);
                }
            }
            tracing::info!(commit = %source.commit, targets = jobs.len(), job = ?which, "reconcile");
            let report = match which {
                Once::Sync => match rollout_sync(&source, &flags, &root, &state_dir, &only).await {
                    Some(report) => report,
                    None => sync_all(&source, jobs, &flags, &root).await,
                },
                Once::Heal => {
                    // Under `apply.waves`, a heal repairs only the targets
                    // at this commit: it never moves one behind a rollout.
                    let jobs = if source.config.cluster.rollout.waves.is_empty() {
                        jobs
                    } else {
                        let at = crate::rollout::run::healable(&source).await;
                        jobs.into_iter()
                            .filter(|j| at.contains(&j.node.name))
                            .collect()
                    };
                    heal_all(&source, jobs, &flags, &root, tracker).await
                }
                // Not here: the certificates job has its own loader (below).
                Once::Certs => super::many::Report::default(),
            };
            // The verified commit is the last good one once a target has
            // it (a run that moved none, e.g. every target frozen, keeps
            // the previous one).
            if let Some(commit) = verified
                && report.targets.iter().any(|(_, e)| {
                    matches!(
                        e,
                        super::many::Ended::InSync | super::many::Ended::Written(_)
                    )
                })
                && last_good.borrow().as_deref() != Some(commit.as_str())
            {
                if let Some(store) = store
                    && let Err(e) = store.set_last_good(&commit)
                {
                    tracing::error!(cause = %e, "reconcile: cannot keep the last good commit");
                    return 1;
                }
                *last_good.borrow_mut() = Some(commit);
            }
            // A refused newer commit fails the run even when the last good
            // one was kept in place.
            if refused { 1 } else { report.exit_code() }
        }
    };
    // The certificates job: the revision picked as for sync (pulled,
    // signature verified), its ACME sites' certificates ordered or renewed
    // and pushed at each target's own commit.
    let certs = || {
        let picked = pick(
            &root,
            rev.as_deref(),
            pull_spec.as_deref(),
            &git,
            &auth,
            flags.allow_rollback,
            &last_good,
        );
        let root = root.clone();
        let only = only.clone();
        let flags = flags.clone();
        let state_dir = state_dir.clone();
        async move {
            let rev = match picked {
                Ok(p) => p.rev,
                Err(e) => {
                    log_not_loaded(&e, "reconcile: no certificate ordered");
                    return 1;
                }
            };
            crate::renew::job::run(&root, rev.as_deref(), &only, &flags, &state_dir).await
        }
    };
    // Metrics: count the run, write the textfile.
    let metrics = std::sync::Arc::clone(&flags.metrics);
    let run = |which: Once| {
        // From loading the repository (check and compile) to the last target.
        let start = std::time::Instant::now();
        let job: std::pin::Pin<Box<dyn std::future::Future<Output = u8> + '_>> = match which {
            Once::Certs => Box::pin(certs()),
            Once::Sync | Once::Heal => Box::pin(run(which)),
        };
        let metrics = std::sync::Arc::clone(&metrics);
        async move {
            let code = job.await;
            let name = which.as_str();
            tracing::info!(
                job = name,
                exit = code,
                elapsed_ms = start.elapsed().as_millis(),
                "reconcile: run done"
            );
            // Exit code 1: a target failed or was refused (2: drift seen
            // by a dry run, which is not a failure).
            metrics.run_done(name, code == 1);
            code
        }
    };
    if let Some(which) = once {
        return Ok(run(which).await);
    }
    let leader = lease(&state_dir, &only, sync_every, heal_every, &metrics)?;
    let leading = || leader.as_ref().is_none_or(|l| l.held());
    // Certificates first: a site's missing certificate is ordered before
    // the first sync needs it.
    if leading() {
        run(Once::Certs).await;
    }
    let mut sync = tokio::time::interval(sync_every);
    let mut heal = tokio::time::interval(heal_every);
    let mut certs_tick =
        tokio::time::interval_at(tokio::time::Instant::now() + certs_every, certs_every);
    sync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    certs_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // A target's Redis that may have lost its data is healed at once (the
    // tracker says so), and again every second while a target fails (the
    // Redis restarting) for up to a minute.
    let urgent = tracker.as_ref().map_or_else(
        || std::sync::Arc::new(tokio::sync::Notify::new()),
        |t| t.urgent(),
    );
    let mut retry_until: Option<tokio::time::Instant> = None;
    loop {
        let retry = async {
            match retry_until {
                Some(_) => tokio::time::sleep(URGENT_RETRY).await,
                None => std::future::pending().await,
            }
        };
        let gained = async {
            match &leader {
                Some(l) => l.gained().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sync.tick() => { if leading() { run(Once::Sync).await; } }
            _ = heal.tick() => { if leading() { run(Once::Heal).await; } }
            _ = certs_tick.tick() => { if leading() { run(Once::Certs).await; } }
            () = gained => {
                // Taken over from a daemon that stopped or died: its work
                // now, the newest commit first.
                tracing::warn!("reconcile: took the lease over; syncing now");
                run(Once::Sync).await;
                run(Once::Certs).await;
            }
            () = urgent.notified(), if leading() => {
                // Let the burst of pushes of one loss arrive.
                tokio::time::sleep(URGENT_SETTLE).await;
                tracing::warn!("reconcile: a target's Redis may have lost its data; healing now");
                retry_until = Some(tokio::time::Instant::now() + URGENT_RETRY_FOR);
                if run(Once::Heal).await != 1 {
                    retry_until = None;
                }
            }
            () = retry, if leading() => {
                if run(Once::Heal).await != 1
                    || retry_until.is_some_and(|t| tokio::time::Instant::now() >= t)
                {
                    retry_until = None;
                }
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    if let Some(l) = &leader {
        l.stop();
    }
    tracing::info!("reconcile: stopped");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_spec_splits_at_the_remote_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        for name in ["origin", "corp", "team/eu"] {
            repo.remote(name, "https://git.example.net/config.git")
                .unwrap();
        }
        let split = |spec: &'static str| split_spec(spec, &repo).map_err(|e| e.to_string());
        assert_eq!(split("origin/main"), Ok(("origin", "main")));
        assert_eq!(split("origin/release/2026"), Ok(("origin", "release/2026")));
        assert_eq!(split("team/eu/main"), Ok(("team/eu", "main")));
        // No such remote: the first part, named by the fetch's error.
        assert_eq!(split("nope/main"), Ok(("nope", "main")));
        assert!(split("main").unwrap_err().contains("REMOTE/BRANCH"));
        // Two remotes make it a branch each: refused, naming both.
        repo.remote("corp/origin", "https://git.example.net/other.git")
            .unwrap();
        let e = split("corp/origin/main").unwrap_err();
        assert!(e.contains("`corp` and `corp/origin`"), "{e}");
    }
}
