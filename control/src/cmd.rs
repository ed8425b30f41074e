//! The `plan`, `apply` and `unlock` commands over every target: their
//! output (human or JSON), exit codes and the saved plan file.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use compiler::Config;
use compiler::workspace::{Source, free_later};

use crate::apply::Outcome;
use crate::lock;
use crate::many::{Applied, Settings, apply_all, jobs};
use crate::run::{Ancestor, each};
use crate::saved::{Guard, SHOWN, SavedPlan, TargetPlan, plan_target};

/// How `plan` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanFormat {
    /// Per target: its changes and diffs, then a summary.
    Human,
    /// One JSON document.
    Json,
}

// ------------------------------------------------------------------ plan

/// `edgeform plan`: exit 0; 2 with `detailed` when a target changes; 1
/// when a target could not be planned.
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
    // The waves the change goes through (`apply.waves`; none: all at once).
    let waves = crate::rollout::plan(&source.config.cluster.rollout, &source.config.nodes);
    let guard = std::sync::Arc::new(Guard {
        commit: source.commit.clone(),
        ancestor: std::sync::Arc::new(Ancestor::new(root, &source.commit)),
        thresholds: source.config.cluster.apply,
        frozen: crate::many::frozen(source),
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
        render_waves(&mut text, &waves);
        std::io::stdout().lock().write_all(text.as_bytes())?;
    } else {
        let v = serde_json::json!({"commit": source.commit, "changes": changed > 0, "targets": json_targets, "waves": waves});
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
    // The live commit is the edge's text: cut by character, escaped.
    let id: String = id.chars().take(12).collect();
    format!("{}{dirty}", edgestate::untrusted::escape(&id))
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
        let _ = writeln!(out, "  + {}", edgestate::untrusted::escape(k));
    }
    if c.added.len() > SHOWN {
        let _ = writeln!(out, "  + … and {} more", c.added.len() - SHOWN);
    }
    for (k, d) in &p.diffs {
        // Keys and values read from the edge: escaped.
        let _ = writeln!(out, "  ~ {}", edgestate::untrusted::escape(k));
        for line in d.lines() {
            let _ = writeln!(out, "      {}", edgestate::untrusted::escape(line));
        }
    }
    if c.changed.len() > p.diffs.len() {
        let _ = writeln!(out, "  ~ … and {} more", c.changed.len() - p.diffs.len());
    }
    for k in c.removed.iter().take(SHOWN) {
        let _ = writeln!(out, "  - {}", edgestate::untrusted::escape(k));
    }
    if c.removed.len() > SHOWN {
        let _ = writeln!(out, "  - … and {} more", c.removed.len() - SHOWN);
    }
}

// ----------------------------------------------------------------- apply

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

/// `plan`'s lines on the waves a change goes through.
fn render_waves(text: &mut String, waves: &[crate::rollout::PlannedWave]) {
    if waves.is_empty() {
        return;
    }
    let _ = writeln!(text, "Rollout in {} wave(s) (apply.waves):", waves.len());
    for (i, w) in waves.iter().enumerate() {
        let _ = writeln!(
            text,
            "  {}. {}: {} — bake {}s",
            i + 1,
            w.name,
            if w.nodes.is_empty() {
                "(no target)".to_owned()
            } else {
                w.nodes.join(", ")
            },
            w.bake_s
        );
    }
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
                match crate::many::refusal(e) {
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

/// A plan file `plan --out` saved.
///
/// # Errors
/// Unreadable, or not an edgeform plan.
pub fn read_plan(path: &Path) -> Result<SavedPlan> {
    serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not an edgeform plan", path.display()))
}

/// `edgeform apply` of `source` (with a saved plan: the source the plan
/// was made from, its `rev`, checked against its digests).
///
/// # Errors
/// Loading errors, a missing `--yes`, [`Refused`].
#[allow(clippy::too_many_arguments)]
pub async fn apply(
    root: &Path,
    source: Source,
    saved: Option<&SavedPlan>,
    only: &[String],
    yes: bool,
    allow_dirty: bool,
    settings: &Settings,
    state_dir: &Path,
) -> Result<u8> {
    // A dirty working tree has no ancestry for the rollback guard to
    // protect: refused unless asked for.
    if source.dirty && !allow_dirty {
        return Err(Refused::Dirty {
            commit: source.commit.clone(),
        }
        .into());
    }
    // With `apply.waves`, a whole-cluster apply moves the rollout one wave
    // on (`--node` and a saved plan apply what they name, as without).
    if saved.is_none()
        && only.is_empty()
        && let Some(code) = apply_waves(root, &source, yes, settings, state_dir).await?
    {
        free_later(source);
        return Ok(code);
    }
    let only: Vec<String> = match saved {
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
            settings.parallel,
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
        settings,
        crate::gate::Action::Apply,
        saved,
        root,
        tick,
    )
    .await;
    bar.finish_and_clear();
    let failed = report_applied(&results, started.elapsed());
    free_later(source);
    Ok(u8::from(failed > 0))
}

/// `apply` under `apply.waves`: the next wave of the commit's rollout
/// (started if need be), or why it waits. `None`: not a rollout (no
/// waves, or every target holds the commit), apply as usual.
async fn apply_waves(
    root: &Path,
    source: &Source,
    yes: bool,
    settings: &Settings,
    state_dir: &Path,
) -> Result<Option<u8>> {
    use crate::rollout::run::{Advanced, Ctx, advance};
    use crate::rollout::{Blocked, Step};
    // Without waves, only a live rollout (of a commit that had them) is
    // in the way; no state is made for nothing.
    let store = if source.config.cluster.rollout.waves.is_empty() {
        match crate::store::open_existing(state_dir)? {
            Some(store) if crate::rollout::run::load(&*store)?.live().is_some() => store,
            _ => return Ok(None),
        }
    } else {
        crate::store::open(state_dir)?
    };
    if !yes {
        eprint!(
            "Roll {} out to its next wave? Only `yes` is accepted: ",
            short(&source.commit)
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if answer.trim() != "yes" {
            eprintln!("Apply cancelled.");
            return Ok(Some(1));
        }
    }
    let ctx = Ctx {
        root,
        flags: settings,
        store: &*store,
        action: crate::gate::Action::Apply,
    };
    let started = Instant::now();
    let mut out = std::io::stdout().lock();
    match advance(&ctx, source, true).await? {
        Advanced::NotARollout => Ok(None),
        Advanced::Blocked(Blocked::Busy { live, state }) => {
            writeln!(
                out,
                "{} waits: the rollout of {} is {state} (one commit at a time; \
                 `edgeform rollout status`, `rollout promote` or `rollout abort`). Nothing was applied.",
                short(&source.commit),
                short(&live)
            )?;
            Ok(Some(1))
        }
        Advanced::Blocked(Blocked::Aborted) => {
            writeln!(
                out,
                "{} was aborted and is not applied again; commit a fix (a newer commit starts a new rollout). Nothing was applied.",
                short(&source.commit)
            )?;
            Ok(Some(1))
        }
        Advanced::Frozen(why) => {
            writeln!(
                out,
                "the next wave waits: {why} (--break-glass overrides). Nothing was applied."
            )?;
            Ok(Some(1))
        }
        Advanced::Stands {
            record,
            applied,
            notes,
        } => {
            drop(out);
            let nothing = applied.is_empty();
            let failed = if nothing {
                0
            } else {
                report_applied(&applied, started.elapsed())
            };
            let mut out = std::io::stdout().lock();
            for n in &notes {
                writeln!(out, "{n}")?;
            }
            let now = compiler::clock::checked_now();
            let applied_waves = record.applied_count();
            let last = applied_waves
                .checked_sub(1)
                .map(|i| record.waves[i].name.clone());
            match (record.step(now), &record.state) {
                (_, crate::rollout::State::Halted { .. })
                | (_, crate::rollout::State::Aborted { .. }) => {
                    write!(
                        out,
                        "{}",
                        crate::rollout::run::render(&crate::rollout::run::load(ctx.store)?, now)
                    )?;
                    return Ok(Some(1));
                }
                (Step::Wait { wave, until }, _) => writeln!(
                    out,
                    "{}wave {} applied; bakes until {}; `edgeform rollout promote` or the daemon moves it on",
                    if nothing { "nothing applied: " } else { "" },
                    record.waves[wave].name,
                    compiler::clock::rfc3339(until)
                )?,
                (Step::Judge { wave }, _) => writeln!(
                    out,
                    "wave {} applied and baked; the next `apply` (or the daemon) asks the gate and moves it on",
                    record.waves[wave].name
                )?,
                (Step::Apply { wave }, _) => writeln!(
                    out,
                    "wave {} passed; the next `apply` (or the daemon) applies wave {}",
                    last.unwrap_or_default(),
                    record.waves[wave].name
                )?,
                (Step::Done, _) => writeln!(
                    out,
                    "rollout of {} complete: every wave applied",
                    short(&record.commit)
                )?,
                (Step::Halted, _) => {}
            }
            Ok(Some(u8::from(failed > 0)))
        }
    }
}

// ----------------------------------------------------------------- unlock

/// `edgeform unlock --node N [--force]`.
///
/// # Errors
/// Unknown node, Redis errors.
pub async fn unlock(config: &Config, node: &str, force: bool) -> Result<u8> {
    use lock::Unlocked;
    let Some(n) = config
        .nodes
        .iter()
        .find(|n| n.name == node && n.redis.is_some())
    else {
        bail!("--node {node}: no such target (targets are nodes with a redis block)");
    };
    let mut con = crate::master(n).await?;
    let mut out = std::io::stdout().lock();
    match lock::unlock(&mut con, force).await? {
        Unlocked::NoLock => {
            writeln!(out, "{node}: not locked")?;
            Ok(0)
        }
        Unlocked::Removed { holder, dead } => {
            let holder = edgestate::untrusted::escape(&holder);
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
            let holder = edgestate::untrusted::escape(&holder);
            eprintln!(
                "{node}: locked by {holder}; {}, so it may be alive. Wait for its lease \
                 (5 minutes), or rerun with --force once that apply is gone",
                why.as_str()
            );
            Ok(1)
        }
    }
}
