//! `plan`, `apply` and `reconcile`: the commands that talk to targets.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::compile::{self, Compiled};
use crate::diff::{pretty, unified};
use crate::load;
use crate::push::apply::{self, Expect, Options, Outcome};
use crate::push::plan::{Changes, Overrides};
use crate::push::run::{Ancestor, each};
use crate::push::state::Live;
use crate::push::{self, Job, heal};
use crate::{Config, report};

/// What every push command loads: the checked, compiled repository.
pub struct Source {
    pub repo: load::Repo,
    pub config: Config,
    pub compiled: Compiled,
    /// Written to `edgeform:meta` as `commit`.
    pub commit: String,
    /// The revision it was read from (`None`: the working tree).
    pub rev: Option<String>,
}

/// A checked repository and the commit it is, not compiled: what `status`
/// and `exec` need (they read the nodes, not the documents).
pub struct Valid {
    pub repo: load::Repo,
    pub config: Config,
    /// Written to `edgeform:meta` as `commit`.
    pub commit: String,
    /// The revision it was read from (`None`: the working tree).
    pub rev: Option<String>,
}

/// Load and check; print diagnostics when invalid.
///
/// # Errors
/// I/O or git errors, and an invalid repository (nothing is pushed).
pub fn valid(root: &Path, rev: Option<&str>, color: bool) -> Result<Valid> {
    let t = Instant::now();
    let repo = load::load(root, rev)?;
    push::timing("load", t);
    let t = Instant::now();
    let checked = crate::check(&repo);
    push::timing("check", t);
    if !checked.diagnostics.is_empty() && checked.config.is_none() {
        eprint!(
            "{}",
            report::diagnostics_human(&checked.diagnostics, &repo, color)
        );
    }
    let Some(config) = checked.config else {
        bail!(
            "{} is invalid ({}); nothing was pushed",
            root.display(),
            report::summary(&checked.diagnostics, repo.sources.len())
        );
    };
    let t = Instant::now();
    let commit = match rev {
        Some(_) => repo.commit.clone().unwrap_or_else(|| "worktree".into()),
        None => load::worktree_commit(root),
    };
    push::timing("commit", t);
    let rev = rev.map(|_| repo.commit.clone().unwrap_or_default());
    Ok(Valid {
        repo,
        config,
        commit,
        rev,
    })
}

/// Load, check and compile; print diagnostics when invalid.
///
/// # Errors
/// See [`valid`].
pub fn source(root: &Path, rev: Option<&str>, color: bool) -> Result<Source> {
    let Valid {
        repo,
        config,
        commit,
        rev,
    } = valid(root, rev, color)?;
    let t = Instant::now();
    let compiled = compile::compile(&config);
    push::timing("compile", t);
    Ok(Source {
        repo,
        config,
        compiled,
        commit,
        rev,
    })
}

/// Free a loaded repository on another thread: the 100,000 parsed sites
/// of a large repository take a while to free, and a command that is about
/// to exit need not wait for it.
pub fn free_later(source: Source) {
    std::thread::spawn(move || drop(source));
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
    let t = Instant::now();
    let jobs = push::jobs(&source.config, &source.compiled, only);
    push::timing("jobs (hashes)", t);
    if jobs.is_empty() {
        bail!("no targets: no node has a `redis` block");
    }
    Ok(jobs)
}

// ------------------------------------------------------------------ plan

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
pub fn desired_digest(desired: &push::state::Desired) -> String {
    desired.digest().to_owned()
}

async fn plan_target(job: Job, show_diffs: bool) -> Result<TargetPlan> {
    let t = Instant::now();
    let mut con = job.node.redis_master().await?;
    push::timing("  connect", t);
    let t = Instant::now();
    // Reads the meta only when live is in sync, the differing buckets
    // otherwise (#16).
    let live: Live = apply::read_live(&mut con, &job.desired).await?;
    push::timing("  read_live", t);
    let t = Instant::now();
    let changes = apply::live_changes(&job.desired, &live);
    push::timing("  changes", t);
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
            let b = before.as_deref().map(pretty).unwrap_or_default();
            diffs.push((key.clone(), unified(key, &b, &pretty(after))));
        }
    }
    let desired_digest = desired_digest(&job.desired);
    let manifest_digest = live.digest.clone();
    Ok(TargetPlan {
        node: job.node.name.clone(),
        generation: live.meta.generation,
        live_commit: live.meta.commit.clone(),
        manifest_digest,
        desired_digest,
        changes,
        diffs,
    })
}

/// Keys listed per kind and target in human output.
const SHOWN: usize = 50;

/// Output formats of `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Human,
    Json,
}

/// `edgeform plan`.
///
/// # Errors
/// Loading errors (an unreachable target is reported, not an error).
pub async fn plan(
    source: &Source,
    only: &[String],
    format: PlanFormat,
    out: Option<&Path>,
    detailed: bool,
    parallel: usize,
) -> Result<u8> {
    let jobs = jobs(source, only)?;
    let human = format == PlanFormat::Human;
    let results = each(jobs, parallel, |job| plan_target(job, human)).await;
    let mut failed = 0;
    let mut changed = 0;
    let mut text = String::new();
    let mut json_targets = Vec::new();
    let mut saved = Vec::new();
    for (job, result) in &results {
        match result {
            Ok(p) => {
                if !p.changes.is_empty() {
                    changed += 1;
                }
                if human {
                    render_plan(&mut text, p, &job.node.redis_at());
                }
                json_targets.push(serde_json::json!({
                    "node": p.node, "status": "ok", "generation": p.generation,
                    "live_commit": p.live_commit, "added": p.changes.added,
                    "changed": p.changes.changed, "removed": p.changes.removed,
                }));
                let mut s = p.clone();
                s.diffs.clear();
                saved.push(s);
            }
            Err(e) => {
                failed += 1;
                if human {
                    let _ = writeln!(
                        text,
                        "{}: ERROR ({}): {}",
                        job.node.name,
                        job.node.redis_at(),
                        edgeredis::one_line(e)
                    );
                }
                json_targets.push(serde_json::json!({"node": job.node.name, "status": "error", "error": edgeredis::one_line(e)}));
            }
        }
    }
    if human {
        let _ = writeln!(
            text,
            "\nPlan for {}: {changed} target(s) to change, {} unchanged, {failed} unreachable or failed.",
            short(&source.commit),
            results.len() - changed - failed
        );
        std::io::stdout().lock().write_all(text.as_bytes())?;
    } else {
        let v = serde_json::json!({"commit": source.commit, "changes": changed > 0, "targets": json_targets});
        writeln!(std::io::stdout().lock(), "{v}")?;
    }
    if let Some(path) = out {
        if failed > 0 {
            bail!(
                "not saving a plan with unreachable targets: {} would not be covered",
                path.display()
            );
        }
        let plan = SavedPlan {
            edgeform_plan: 1,
            created_at: push::state::now_rfc3339(),
            commit: source.commit.clone(),
            rev: source.rev.clone(),
            targets: saved,
        };
        std::fs::write(path, serde_json::to_string_pretty(&plan)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "saved plan to {} (apply it with `edgeform apply --plan {} --yes`)",
            path.display(),
            path.display()
        );
    }
    Ok(if failed > 0 {
        1
    } else if detailed && changed > 0 {
        2
    } else {
        0
    })
}

fn short(commit: &str) -> String {
    let (id, dirty) = commit
        .strip_suffix("+dirty")
        .map_or((commit, ""), |c| (c, "+dirty"));
    format!("{}{dirty}", &id[..12.min(id.len())])
}

fn render_plan(out: &mut String, p: &TargetPlan, at: &str) {
    let c = &p.changes;
    if c.is_empty() {
        let _ = writeln!(
            out,
            "{} ({at}): no changes (generation {})",
            p.node, p.generation
        );
        return;
    }
    let _ = writeln!(
        out,
        "{} ({at}): {} to add, {} to change, {} to remove (live generation {}, commit {})",
        p.node,
        c.added.len(),
        c.changed.len(),
        c.removed.len(),
        p.generation,
        p.live_commit
            .as_deref()
            .map_or_else(|| "none".into(), short)
    );
    for k in c.added.iter().take(SHOWN) {
        let _ = writeln!(out, "  + {k}");
    }
    if c.added.len() > SHOWN {
        let _ = writeln!(out, "  + … and {} more", c.added.len() - SHOWN);
    }
    for (k, d) in &p.diffs {
        let _ = writeln!(out, "  ~ {k}");
        for line in d.lines() {
            let _ = writeln!(out, "      {line}");
        }
    }
    if c.changed.len() > p.diffs.len() {
        let _ = writeln!(out, "  ~ … and {} more", c.changed.len() - p.diffs.len());
    }
    for k in c.removed.iter().take(SHOWN) {
        let _ = writeln!(out, "  - {k}");
    }
    if c.removed.len() > SHOWN {
        let _ = writeln!(out, "  - … and {} more", c.removed.len() - SHOWN);
    }
}

// ----------------------------------------------------------------- apply

/// Flags shared by `apply` and `reconcile`.
#[derive(Debug, Clone, clap::Args)]
pub struct PushFlags {
    /// Override the safety thresholds and the empty-state refusal.
    #[arg(long)]
    pub force: bool,
    /// Allow pushing a commit older than the one live.
    #[arg(long)]
    pub allow_rollback: bool,
    /// How many targets to work on at once.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub parallel: usize,
    /// How long to wait for another apply's lock on a target.
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = duration)]
    pub lock_wait: Duration,
}

/// `500ms`, `5s`, `15m`, `1h`.
///
/// # Errors
/// Anything else.
pub fn duration(text: &str) -> Result<Duration, String> {
    crate::validate::parse_duration_ms(text)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration (e.g. 500ms, 30s, 15m, 1h)"))
}

fn options(source: &Source, flags: &PushFlags) -> Options {
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

/// Apply to every job; returns each outcome.
pub async fn apply_all(
    source: &Source,
    jobs: Vec<Job>,
    flags: &PushFlags,
    expect: Option<&SavedPlan>,
    root: &Path,
) -> Vec<Applied> {
    let options = Arc::new(options(source, flags));
    let ancestor = Arc::new(Ancestor::new(root, &source.commit));
    let expect: Option<Arc<SavedPlan>> = expect.map(|p| Arc::new(p.clone()));
    let bar = progress(jobs.len());
    let results = each(jobs, flags.parallel, |job| {
        let options = options.clone();
        let ancestor = ancestor.clone();
        let expect = expect.clone();
        let bar = bar.clone();
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
            bar.inc(1);
            tracing::debug!(node = %job.node.name, elapsed = ?start.elapsed(), ok = result.is_ok(), "apply");
            result
        }
    })
    .await;
    bar.finish_and_clear();
    results
}

fn progress(len: usize) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() || len < 2 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} {pos}/{len} targets {wide_bar} {elapsed}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Print apply outcomes; returns the number of failures.
#[must_use]
pub fn report_applied(results: &[Applied], took: Duration) -> usize {
    let mut failed = 0;
    let mut applied = 0;
    let mut out = String::new();
    for (job, r) in results {
        let name = &job.node.name;
        match r {
            Ok(Outcome::Applied {
                changes,
                generation,
            }) => {
                applied += 1;
                let _ = writeln!(
                    out,
                    "{name}: applied generation {generation} (+{} ~{} -{})",
                    changes.added.len(),
                    changes.changed.len(),
                    changes.removed.len()
                );
            }
            Ok(Outcome::Unchanged { generation }) => {
                let _ = writeln!(out, "{name}: unchanged (generation {generation})");
            }
            Err(e) => {
                failed += 1;
                let _ = writeln!(
                    out,
                    "{name}: FAILED ({}): {}",
                    job.node.redis_at(),
                    edgeredis::one_line(e)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "Apply: {applied} applied, {} unchanged, {failed} failed (push {:.3} s).",
        results.len() - applied - failed,
        took.as_secs_f64()
    );
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    failed
}

/// `edgeform apply`.
///
/// # Errors
/// Loading errors, a missing `--yes`, an unreadable plan file.
pub async fn apply_cmd(
    root: &Path,
    rev: Option<&str>,
    only: &[String],
    plan_file: Option<&Path>,
    yes: bool,
    flags: &PushFlags,
    color: bool,
) -> Result<u8> {
    let saved: Option<SavedPlan> = match plan_file {
        Some(p) => Some(
            serde_json::from_slice(
                &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("{} is not an edgeform plan", p.display()))?,
        ),
        None => None,
    };
    // A saved plan applies exactly what it was made from: its commit, or
    // the working tree (checked against the plan's digests below).
    let rev_owned = saved.as_ref().and_then(|p| p.rev.clone());
    let rev = rev_owned.as_deref().or(rev);
    let source = source(root, rev, color)?;
    let only: Vec<String> = match &saved {
        Some(p) if only.is_empty() => p.targets.iter().map(|t| t.node.clone()).collect(),
        _ => only.to_vec(),
    };
    let jobs = jobs(&source, &only)?;
    if !yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "refusing to apply without --yes: stdin is not a terminal (run `edgeform plan` to review first)"
            );
        }
        let code = plan(
            &source,
            &only,
            PlanFormat::Human,
            None,
            false,
            flags.parallel,
        )
        .await?;
        if code == 1 {
            eprintln!("(some targets are unreachable; apply continues with the others)");
        }
        eprint!(
            "Apply {} to {} target(s)? Only `yes` is accepted: ",
            short(&source.commit),
            jobs.len()
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if answer.trim() != "yes" {
            eprintln!("Apply cancelled.");
            return Ok(1);
        }
    }
    let started = Instant::now();
    let results = apply_all(&source, jobs, flags, saved.as_ref(), root).await;
    let failed = report_applied(&results, started.elapsed());
    free_later(source);
    Ok(u8::from(failed > 0))
}

// ------------------------------------------------------------- reconcile

/// Which scheduled job to run once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Once {
    Sync,
    Heal,
}

/// Heal every target; log every drift. Returns the number of failures.
pub async fn heal_all(source: &Source, jobs: Vec<Job>, flags: &PushFlags, root: &Path) -> usize {
    let options = Arc::new(options(source, flags));
    let ancestor = Arc::new(Ancestor::new(root, &source.commit));
    let results = each(jobs, flags.parallel, |job| {
        let options = options.clone();
        let ancestor = ancestor.clone();
        async move {
            let mut con = job.node.redis_master().await?;
            let relate = |live: Option<&str>| ancestor.relate(live);
            heal::heal(&mut con, &job.desired, &options, &relate).await
        }
    })
    .await;
    let mut failed = 0;
    for (job, r) in results {
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
pub async fn sync_all(source: &Source, jobs: Vec<Job>, flags: &PushFlags, root: &Path) -> usize {
    let results = apply_all(source, jobs, flags, None, root).await;
    let mut failed = 0;
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

/// `edgeform reconcile`.
///
/// # Errors
/// Only setup errors; a failing target or an invalid revision is logged
/// and retried at the next tick.
pub async fn reconcile(
    root: PathBuf,
    rev: Option<String>,
    pull_spec: Option<String>,
    sync_every: Duration,
    heal_every: Duration,
    once: Option<Once>,
    flags: PushFlags,
) -> Result<u8> {
    let load_source = |root: &Path| -> Result<Source> {
        let rev = match &pull_spec {
            Some(spec) => Some(pull(root, spec)?),
            None => rev.clone(),
        };
        source(root, rev.as_deref(), false)
    };
    let run = |which: Once| {
        let root = root.clone();
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
            let jobs = push::jobs(&source.config, &source.compiled, &[]);
            tracing::info!(commit = %source.commit, targets = jobs.len(), job = ?which, "reconcile");
            match which {
                Once::Sync => sync_all(&source, jobs, &flags, &root).await,
                Once::Heal => heal_all(&source, jobs, &flags, &root).await,
            }
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
