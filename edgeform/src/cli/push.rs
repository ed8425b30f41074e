//! `plan`, `apply` and `reconcile`: the commands that talk to targets.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use compiler::workspace::{Source, free_later};
use control::apply::Outcome;
use control::many::{Applied, Settings, apply_all, jobs};
use control::run::Ancestor;
use control::run::each;
use control::saved::{Guard, SHOWN, SavedPlan, TargetPlan, plan_target};
use control::{self, lock};

// ------------------------------------------------------------------ plan

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
#[allow(clippy::too_many_arguments)]
pub async fn plan(
    root: &Path,
    source: &Source,
    only: &[String],
    format: PlanFormat,
    out: Option<&Path>,
    detailed: bool,
    parallel: usize,
) -> Result<u8> {
    let jobs = jobs(source, only)?;
    let human = format == PlanFormat::Human;
    let guard = std::sync::Arc::new(Guard {
        commit: source.commit.clone(),
        ancestor: std::sync::Arc::new(Ancestor::new(root, &source.commit)),
        thresholds: source.config.cluster.apply,
        frozen: control::many::frozen(source),
    });
    let results = each(jobs, parallel, |job| {
        let guard = guard.clone();
        async move { plan_target(job, human, &guard).await }
    })
    .await;
    let mut refused = 0;
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
                if let Some(r) = &p.refusal {
                    refused += 1;
                    if human {
                        let _ = writeln!(text, "  warning: apply would refuse {}: {r}", p.node);
                    }
                }
                json_targets.push(serde_json::json!({
                    "node": p.node, "status": "ok", "generation": p.generation,
                    "live_commit": p.live_commit, "added": p.changes.added,
                    "changed": p.changes.changed, "removed": p.changes.removed,
                    "adopted": p.adopted,
                    "apply_refused": p.refusal.as_ref().map(ToString::to_string),
                    "apply_refused_kind": p.refusal.as_ref().map(|r| r.kind().as_str()),
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
        if refused > 0 {
            let _ = writeln!(
                text,
                "warning: apply would refuse {refused} target(s) (see above)."
            );
        }
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
            created_at: compiler::clock::now_rfc3339(),
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
    if !p.adopted.is_empty() {
        let _ = writeln!(
            out,
            "{} ({at}): {} keys adopted, content identical (no manifest yet: apply records it)",
            p.node,
            p.adopted.len()
        );
    }
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
    /// Allow pushing a commit that does not descend from the one live (an
    /// older commit, or another branch).
    #[arg(long)]
    pub allow_rollback: bool,
    /// How many targets to work on at once.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = parallel())]
    pub parallel: usize,
    /// How long to wait for another apply's lock on a target (at most 1h).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = lock_wait)]
    pub lock_wait: Duration,
    /// Write through an open `apply.freeze` window (cluster.yaml); recorded
    /// in each target's history.
    #[arg(long)]
    pub break_glass: bool,
}

impl PushFlags {
    /// The library's settings.
    #[must_use]
    pub fn settings(&self) -> Settings {
        Settings {
            force: self.force,
            allow_rollback: self.allow_rollback,
            parallel: self.parallel,
            lock_wait: self.lock_wait,
            break_glass: self.break_glass,
            dry_run: false,
            signers: None,
            last_good: None,
            metrics: std::sync::Arc::new(control::metrics::Metrics::new(super::version())),
        }
    }
}

/// `500ms`, `5s`, `15m`, `1h`, at most 30 days.
///
/// # Errors
/// Anything else.
pub fn duration(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::ZERO, Duration::from_secs(30 * 86_400))
}

/// A duration flag between `min` and `max`, checked at parse time so no
/// later arithmetic (deadlines, timers) can overflow.
fn duration_in(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = compiler::validate::parse_duration_ms(text)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration (e.g. 500ms, 30s, 15m, 1h)"))?;
    if d < min || d > max {
        return Err(format!(
            "`{text}` is out of range ({}..={})",
            human(min),
            human(max)
        ));
    }
    Ok(d)
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `--lock-wait`: up to one hour.
///
/// # Errors
/// Not a duration, or out of range.
pub fn lock_wait(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::ZERO, Duration::from_secs(3600))
}

/// `--sync-every`, `--heal-every`: one second to seven days.
///
/// # Errors
/// Not a duration, or out of range.
pub fn interval(text: &str) -> Result<Duration, String> {
    duration_in(
        text,
        Duration::from_secs(1),
        Duration::from_secs(7 * 86_400),
    )
}

/// `exec --ttl`: one second to one day.
///
/// # Errors
/// Not a duration, or out of range.
pub fn ttl(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::from_secs(1), Duration::from_secs(86_400))
}

/// `--parallel`: 1 to 1024 targets at once.
#[must_use]
pub fn parallel() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024)
}

/// `--wait SECS`: 1 second to one day.
#[must_use]
pub fn wait_secs() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86_400)
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
                match control::many::refusal(e) {
                    Some(r) => {
                        tracing::error!(target = %name, reason = r.kind().as_str(), cause = %r, "apply refused: nothing written");
                        let _ = writeln!(out, "{name}: REFUSED ({}): {r}", r.kind().as_str());
                    }
                    None => {
                        let _ = writeln!(
                            out,
                            "{name}: FAILED ({}): {}",
                            job.node.redis_at(),
                            edgeredis::one_line(e)
                        );
                    }
                }
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

/// Why `apply` refuses before touching any target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The working tree's config files differ from HEAD.
    Dirty { commit: String },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Dirty { commit } => write!(
                f,
                "the working tree has uncommitted config changes ({commit}); commit them \
                 first, apply a commit with --rev, or pass --allow-dirty (a dirty tree has \
                 no ancestry for the rollback guard to protect); nothing was applied"
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// `edgeform apply`.
///
/// # Errors
/// Loading errors, a missing `--yes`, an unreadable plan file, [`Refused`].
#[allow(clippy::too_many_arguments)]
pub async fn apply_cmd(
    root: &Path,
    rev: Option<&str>,
    only: &[String],
    plan_file: Option<&Path>,
    yes: bool,
    allow_dirty: bool,
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
    let source = super::source(root, rev, color)?;
    // See: #19 item 3
    if source.dirty && !allow_dirty {
        return Err(Refused::Dirty {
            commit: source.commit.clone(),
        }
        .into());
    }
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
            root,
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
    let bar = progress(jobs.len());
    let tick = {
        let bar = bar.clone();
        Arc::new(move || bar.inc(1))
    };
    let results = apply_all(
        &source,
        jobs,
        &flags.settings(),
        control::gate::Action::Apply,
        saved.as_ref(),
        root,
        tick,
    )
    .await;
    bar.finish_and_clear();
    let failed = report_applied(&results, started.elapsed());
    free_later(source);
    Ok(u8::from(failed > 0))
}

// ------------------------------------------------------------- reconcile

// ----------------------------------------------------------------- unlock

/// `edgeform unlock --node N [--force]`.
///
/// # Errors
/// Invalid repository, unknown node, Redis errors.
pub async fn unlock_cmd(
    root: &Path,
    rev: Option<&str>,
    node: &str,
    force: bool,
    color: bool,
) -> Result<u8> {
    use lock::Unlocked;
    let valid = super::valid(root, rev, color)?;
    let Some(n) = valid
        .config
        .nodes
        .iter()
        .find(|n| n.name == node && n.redis.is_some())
    else {
        bail!("--node {node}: no such target (targets are nodes with a redis block)");
    };
    let mut con = control::master(n).await?;
    let mut out = std::io::stdout().lock();
    match lock::unlock(&mut con, force).await? {
        Unlocked::NoLock => {
            writeln!(out, "{node}: not locked")?;
            Ok(0)
        }
        Unlocked::Removed { holder, dead } => {
            match dead {
                Some(why) => writeln!(
                    out,
                    "{node}: removed the lock of a dead holder ({holder}: {})",
                    why.as_str()
                )?,
                None => writeln!(out, "{node}: removed the lock held by {holder} (--force)")?,
            }
            Ok(0)
        }
        Unlocked::Refused { holder, why } => {
            eprintln!(
                "{node}: locked by {holder}; {}, so it may be alive. Wait for its lease \
                 (5 minutes), or rerun with --force once that apply is gone",
                why.as_str()
            );
            Ok(1)
        }
    }
}
