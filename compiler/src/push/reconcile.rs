//! The reconciler: the scheduled sync and heal jobs, the daemon loop and
//! its signals, and the network pull (`--pull REMOTE/BRANCH`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::many::{Settings, heal_all, sync_all};
use crate::workspace::{self, Source};

/// Load, check and compile for one run; an invalid repository is logged
/// (every diagnostic) and the run pushes nothing.
fn load(root: &Path, rev: Option<&str>) -> Result<Source> {
    match workspace::load(root, rev)?.check().valid() {
        Ok(valid) => Ok(valid.compile()),
        Err(invalid) => {
            for d in &invalid.diagnostics {
                tracing::error!(at = %d.location(), code = d.code, "{}", crate::report::clip(&d.message));
            }
            anyhow::bail!(
                "{} is invalid ({}); nothing was pushed",
                invalid.root.display(),
                invalid.summary()
            )
        }
    }
}

/// Which scheduled job to run once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Once {
    Sync,
    Heal,
}

/// Fetch `remote/branch` through git2 and return the fetched commit id.
///
/// # Errors
/// No such remote, fetch failure.
pub fn pull(root: &Path, spec: &str) -> Result<String> {
    let (remote, branch) = spec
        .split_once('/')
        .context("--pull takes REMOTE/BRANCH, e.g. origin/main")?;
    let repo = git2::Repository::discover(root).context("--pull needs a git repository")?;
    let mut r = repo
        .find_remote(remote)
        .with_context(|| format!("no remote `{remote}`"))?;
    let refspec = format!("+refs/heads/{branch}:refs/remotes/{remote}/{branch}");
    r.fetch(&[refspec.as_str()], None, None)
        .with_context(|| format!("fetching {spec}"))?;
    let id = repo
        .revparse_single(spec)?
        .peel_to_commit()?
        .id()
        .to_string();
    Ok(id)
}

/// `edgeform reconcile`: sync every `sync_every`, heal every
/// `heal_every`, until SIGTERM or ctrl-c (or one job with `once`).
///
/// Only the targets in `only` (all when empty; an unknown name fails each
/// run, logged).
///
/// # Errors
/// Only setup errors; a failing target or an invalid revision is logged
/// and retried at the next tick.
#[allow(clippy::too_many_arguments)]
pub async fn reconcile(
    root: PathBuf,
    rev: Option<String>,
    only: Vec<String>,
    pull_spec: Option<String>,
    sync_every: Duration,
    heal_every: Duration,
    once: Option<Once>,
    flags: Settings,
) -> Result<u8> {
    let load_source = |root: &Path| -> Result<Source> {
        let rev = match &pull_spec {
            Some(spec) => Some(pull(root, spec)?),
            None => rev.clone(),
        };
        load(root, rev.as_deref())
    };
    let run = |which: Once| {
        let root = root.clone();
        let only = only.clone();
        let flags = flags.clone();
        let source = load_source(&root);
        async move {
            let source = match source {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(cause = %edgeredis::one_line(&e), "reconcile: nothing pushed");
                    return 1;
                }
            };
            // See: #19 item 6
            let jobs = match super::many::jobs(&source, &only) {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::error!(cause = %edgeredis::one_line(&e), "reconcile: nothing pushed");
                    return 1;
                }
            };
            tracing::info!(commit = %source.commit, targets = jobs.len(), job = ?which, "reconcile");
            match which {
                Once::Sync => sync_all(&source, jobs, &flags, &root).await,
                Once::Heal => heal_all(&source, jobs, &flags, &root).await,
            }
        }
    };
    // Metrics (#15 item 6): count the run, write the textfile.
    let run = |which: Once| {
        let job = run(which);
        async move {
            let failed = job.await;
            let name = match which {
                Once::Sync => "sync",
                Once::Heal => "heal",
            };
            crate::metrics::global().run_done(name, failed);
            failed
        }
    };
    if let Some(which) = once {
        return Ok(u8::from(run(which).await > 0));
    }
    let mut sync = tokio::time::interval(sync_every);
    let mut heal = tokio::time::interval(heal_every);
    sync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = sync.tick() => { run(Once::Sync).await; }
            _ = heal.tick() => { run(Once::Heal).await; }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    tracing::info!("reconcile: stopped");
    Ok(0)
}
