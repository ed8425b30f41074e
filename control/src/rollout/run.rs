//! The rollout's I/O: applying a wave, asking the gate, rolling the
//! applied waves back, and keeping the [`Book`] in the state store.
//! `apply` (one step: the next wave) and the reconcile daemon's sync job
//! (every step due) call [`advance`]; `rollout status|promote|abort` call
//! [`status`], [`promote`] and [`abort`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use compiler::workspace::Source;

use super::gate::{self, GateRequest};
use super::{Blocked, Book, Record, State, Step, blocked, changed_hosts, plan, verdict_state};
use crate::gate::Action;
use crate::many::{Applied, Settings, apply_rollout, live_commits};
use crate::store::Store;

/// The consent the rollback guard records when a rollout rolls a target
/// back (in place of `--allow-rollback`).
pub const ABORT_CONSENT: &str = "rollback by rollout abort";

/// The shortest "before" window the gate compares with (a wave that bakes
/// less still compares with the last minute before the rollout).
pub const BEFORE_WINDOW_MIN_S: u64 = 60;

/// Where a rollout's I/O happens.
pub struct Ctx<'a> {
    /// The repository (for earlier commits: the previous one, to roll back).
    pub root: &'a Path,
    pub flags: &'a Settings,
    pub store: &'a dyn Store,
    /// `apply` (the CLI) or `sync` (the daemon).
    pub action: Action,
}

/// What [`advance`] did.
#[derive(Debug)]
pub enum Advanced {
    /// Every target holds the commit already, or no waves are configured:
    /// not a rollout (the caller applies or syncs as without waves).
    NotARollout,
    /// The commit may not move now.
    Blocked(Blocked),
    /// A freeze window is open: the next wave waits (`--break-glass`
    /// overrides).
    Frozen(String),
    /// Where the rollout stands after this call, with what was applied.
    Stands {
        record: Record,
        applied: Vec<Applied>,
        notes: Vec<String>,
    },
}

fn now() -> u64 {
    compiler::clock::checked_now()
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// The book as the store keeps it.
///
/// # Errors
/// The store cannot be read, or holds something that is not a book.
pub fn load(store: &dyn Store) -> Result<Book> {
    load_seen(store).map(|(book, _)| book)
}

/// [`load`], with the text it was read from: what [`save_over`] expects
/// the store still to hold.
fn load_seen(store: &dyn Store) -> Result<(Book, Option<String>)> {
    let text = store.rollout_state()?;
    let book = Book::parse(text.as_deref()).context("the state store's rollout book is not one")?;
    Ok((book, text))
}

/// Keep `book` in the store only if it still holds `seen` (what this run
/// read): whether it was kept (then `seen` is what it holds now). A book
/// is never written over one another writer — `rollout abort`, `promote`,
/// another host's daemon — changed meanwhile: an abort always sticks.
///
/// # Errors
/// The store cannot be read or written.
fn save_over(store: &dyn Store, seen: &mut Option<String>, book: &Book) -> Result<bool> {
    let text = book.to_text();
    let kept = store.replace_rollout_state(seen.as_deref(), &text)?;
    if kept {
        *seen = Some(text);
    }
    Ok(kept)
}

/// How many times an abort reads the book again when another writer
/// changed it during the rollback.
const ABORT_ATTEMPTS: usize = 5;

/// The source of `commit`, compiled with the certificates in `store`.
fn source_at(root: &Path, store: &dyn Store, commit: &str) -> Result<Source> {
    let valid = crate::reconcile::checked(root, Some(commit), "")?;
    let now = i64::try_from(now()).unwrap_or(i64::MAX);
    let certs = crate::certs::for_push(store, &valid.config, now)?;
    Ok(valid.compile_with(&certs))
}

/// The freeze window open now under any commit live during the rollout:
/// the new one's and each target's previous one's (the stricter of them
/// wins). A previous commit that cannot be read is logged and skipped.
fn frozen_live(root: &Path, source: &Source, record: &Record) -> Option<crate::gate::Frozen> {
    if let Some(f) = crate::many::frozen(source) {
        return Some(f);
    }
    let previous: std::collections::BTreeSet<&str> = record
        .previous
        .values()
        .flatten()
        .map(String::as_str)
        .filter(|c| *c != source.commit)
        .collect();
    previous.into_iter().find_map(|c| {
        match crate::reconcile::checked(root, Some(c), "") {
            Ok(valid) => crate::many::frozen_in(&valid.config),
            Err(e) => {
                tracing::warn!(commit = c, cause = %edgeredis::one_line(&e), "rollout: the previous commit cannot be read; its freeze windows are not known");
                None
            }
        }
    })
}

/// Start a rollout of `source`'s commit: every target's live commit is
/// its previous one; `None` when every target holds the commit already.
async fn start(ctx: &Ctx<'_>, source: &Source) -> Result<Option<Record>> {
    let waves = plan(&source.config.cluster.rollout, &source.config.nodes);
    let targets: Vec<_> = source
        .config
        .nodes
        .iter()
        .filter(|n| n.redis.is_some())
        .cloned()
        .collect();
    let live = live_commits(&targets).await;
    if live
        .values()
        .all(|c| matches!(c, Ok(Some(c)) if *c == source.commit))
    {
        return Ok(None);
    }
    let previous: BTreeMap<String, Option<String>> = live
        .into_iter()
        .map(|(n, c)| (n, c.ok().flatten()))
        .collect();
    // The changed sites: against the commit most targets hold.
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for c in previous.values().flatten() {
        *counts.entry(c.as_str()).or_default() += 1;
    }
    let common = counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(c, _)| (*c).to_owned());
    let changed = match common.as_deref().map(|c| source_at(ctx.root, ctx.store, c)) {
        Some(Ok(before)) => changed_hosts(&before.compiled, &source.compiled),
        other => {
            if let Some(Err(e)) = other {
                tracing::warn!(cause = %edgeredis::one_line(&e), "rollout: the previous commit cannot be compiled; every site counts as changed");
            }
            let empty = compiler::compile::Compiled::default();
            changed_hosts(&empty, &source.compiled)
        }
    };
    ctx.flags.metrics.rollouts_halted_clear();
    Ok(Some(Record::new(
        &source.commit,
        previous,
        changed,
        &waves,
        now(),
    )))
}

/// Move the rollout of `source`'s commit on: start it, apply the next
/// wave, ask the gate after a bake. `one_wave`: stop after applying one
/// wave (`apply`); otherwise every step that is due (the daemon).
///
/// # Errors
/// The store cannot be read or written; loading the previous commit.
pub async fn advance(ctx: &Ctx<'_>, source: &Source, one_wave: bool) -> Result<Advanced> {
    let rollout = &source.config.cluster.rollout;
    let (mut book, mut seen) = load_seen(ctx.store)?;
    if let Some(b) = blocked(&book, &source.commit) {
        return Ok(Advanced::Blocked(b));
    }
    let mut record = match book.current.take() {
        Some(r) if r.commit == source.commit && r.state.is_live() => r,
        Some(r) if r.commit == source.commit && r.state == State::Complete => {
            book.current = Some(r);
            return Ok(Advanced::NotARollout);
        }
        other => {
            book.current = other;
            if rollout.waves.is_empty() {
                return Ok(Advanced::NotARollout);
            }
            match start(ctx, source).await? {
                Some(r) => {
                    // Kept before its first wave is applied: an abort
                    // from then on finds this rollout (not the one
                    // before), and two runs never both start it.
                    book.current = Some(r.clone());
                    if !save_over(ctx.store, &mut seen, &book)? {
                        anyhow::bail!(
                            "the rollouts' book changed while the rollout of {} started \
                             (another command or host wrote it): nothing applied; see \
                             `rollout status` and run it again",
                            r.commit
                        );
                    }
                    r
                }
                None => return Ok(Advanced::NotARollout),
            }
        }
    };
    let mut applied = Vec::new();
    let mut notes = Vec::new();
    loop {
        match record.step(now()) {
            Step::Apply { wave } => {
                if let Some(f) = frozen_live(ctx.root, source, &record)
                    && !ctx.flags.break_glass
                {
                    book.current = Some(record);
                    // Nothing was applied: if another writer changed the
                    // book meanwhile, what it wrote stands.
                    save_over(ctx.store, &mut seen, &book)?;
                    return Ok(Advanced::Frozen(format!(
                        "freeze window {} is open until {}",
                        f.window, f.until
                    )));
                }
                let w = &record.waves[wave];
                let jobs = crate::many::jobs(source, &w.nodes)?;
                let results = apply_rollout(
                    source,
                    jobs,
                    ctx.flags,
                    ctx.action,
                    ctx.root,
                    Some(&w.name),
                    None,
                )
                .await;
                let ok = results.iter().all(|(_, r)| r.is_ok());
                applied.extend(results);
                if !ok {
                    notes.push(format!(
                        "wave {} not applied to every target: retried next time",
                        record.waves[wave].name
                    ));
                    break;
                }
                record.applied(wave, now());
                book.current = Some(record.clone());
                if !save_over(ctx.store, &mut seen, &book)? {
                    return changed_under(ctx, record, wave, applied, notes).await;
                }
                if one_wave {
                    break;
                }
            }
            Step::Judge { wave } => {
                let w = record.waves[wave].clone();
                let applied_at = w.applied_at.unwrap_or(record.started_at);
                let span = w.bake_s.max(BEFORE_WINDOW_MIN_S);
                let req = GateRequest {
                    commit: record.commit.clone(),
                    previous: record
                        .previous
                        .values()
                        .flatten()
                        .next()
                        .cloned()
                        .unwrap_or_default(),
                    changed_hosts: record.changed_hosts.clone(),
                    applied_nodes: record.applied_nodes(),
                    pending_nodes: record.pending_nodes(),
                    before: (
                        at(record.started_at.saturating_sub(span)),
                        at(record.started_at),
                    ),
                    bake: (at(applied_at), at(w.bake_until.unwrap_or(applied_at))),
                    site_gates: gate::site_gates(&source.config),
                };
                let verdict = gate::judge(&source.config.cluster.rollout.gate, &req).await;
                if let Ok(gate::Verdict::Pass { notes: n }) = &verdict {
                    notes.extend(n.iter().map(|n| format!("wave {}: {n}", w.name)));
                }
                let state = verdict_state(&verdict);
                record.judged(state.clone());
                book.current = Some(record.clone());
                if !save_over(ctx.store, &mut seen, &book)? {
                    // The verdict is not kept over another writer's book;
                    // the next run asks the gate again if it still should.
                    notes.push(format!(
                        "the rollouts' book changed while the gate judged wave {} (another \
                         command or host wrote it): its verdict is not saved over it",
                        w.name
                    ));
                    return Ok(Advanced::Stands {
                        record: as_kept(ctx.store, record)?,
                        applied,
                        notes,
                    });
                }
                if let Err(State::Halted {
                    site,
                    figure,
                    detail,
                }) = &state
                {
                    tracing::error!(commit = %record.commit, wave = %w.name, site = %site, figure = %figure, detail = %detail, "rollout halted by the gate");
                    ctx.flags.metrics.rollout_halted(&record.commit, true);
                    if rollout.auto_rollback {
                        let by = format!("gate (auto_rollback): {site} {figure}");
                        let (r, back) = abort(ctx, &by).await?;
                        applied.extend(back);
                        record = r.unwrap_or(record);
                        // The regression still alerts after the automatic
                        // rollback (an operator looks at it); the series goes
                        // when the next rollout starts.
                        ctx.flags.metrics.rollout_halted(&record.commit, true);
                    }
                    break;
                }
            }
            Step::Wait { .. } | Step::Halted | Step::Done => break,
        }
    }
    Ok(Advanced::Stands {
        record,
        applied,
        notes,
    })
}

/// `rollout promote`: the next wave now, whatever the bake time or a
/// halt said (recorded on the wave: `promoted_by`), then applied.
///
/// # Errors
/// No live rollout; the store; loading the rollout's commit.
pub async fn promote(ctx: &Ctx<'_>, by: &str) -> Result<Advanced> {
    let (mut book, mut seen) = load_seen(ctx.store)?;
    let Some(record) = book.current.as_mut().filter(|r| r.state.is_live()) else {
        anyhow::bail!("no rollout is live: nothing to promote");
    };
    let commit = record.commit.clone();
    let next = record.promote(by);
    let promoted = record.clone();
    if !save_over(ctx.store, &mut seen, &book)? {
        anyhow::bail!(
            "the rollouts' book changed while promoting (another command or host wrote it): \
             nothing promoted; see `rollout status` and run it again"
        );
    }
    ctx.flags.metrics.rollout_halted(&commit, false);
    if next.is_none() {
        // Every wave applied: the operator completed it.
        return Ok(Advanced::Stands {
            record: promoted,
            applied: Vec::new(),
            notes: Vec::new(),
        });
    }
    let source = source_at(ctx.root, ctx.store, &commit)?;
    advance(ctx, &source, true).await
}

/// Roll every applied wave of the current rollout back to each target's
/// previous commit (the rollback guard's consent recorded as
/// [`ABORT_CONSENT`]), and remember the commit as aborted. Targets still
/// at the rollout's commit after a failed attempt are rolled back by the
/// next call. Returns the record (`None`: no rollout to abort) and what
/// was applied.
///
/// # Errors
/// The store; loading a previous commit.
pub async fn abort(ctx: &Ctx<'_>, by: &str) -> Result<(Option<Record>, Vec<Applied>)> {
    let mut results = Vec::new();
    // The rollout the first attempt finds is the one aborted: a retry
    // never aborts another one started meanwhile.
    let mut which: Option<(String, u64)> = None;
    for _ in 0..ABORT_ATTEMPTS {
        if let Some(record) = abort_once(ctx, by, &mut which, &mut results).await? {
            return Ok((record, results));
        }
        // Another writer changed the book during the rollback (a wave
        // applied meanwhile, say): read it again, and roll back what it
        // added too.
    }
    anyhow::bail!(
        "the rollouts' book kept changing during the abort ({ABORT_ATTEMPTS} times): \
         run `rollout abort` again"
    )
}

/// Which rollout `r` is: its commit and when it started.
fn identity(r: &Record) -> (String, u64) {
    (r.commit.clone(), r.started_at)
}

/// One attempt of [`abort`]: `None` when the book changed during it (not
/// saved over), else the record (`Some(None)`: no rollout to abort).
/// `which`: the rollout an earlier attempt found (then only that one).
///
/// # Errors
/// The store; loading a previous commit; the current rollout is not
/// `which` any more.
async fn abort_once(
    ctx: &Ctx<'_>,
    by: &str,
    which: &mut Option<(String, u64)>,
    results: &mut Vec<Applied>,
) -> Result<Option<Option<Record>>> {
    let (mut book, mut seen) = load_seen(ctx.store)?;
    let Some(record) = book
        .current
        .as_mut()
        .filter(|r| r.state.is_live() || matches!(r.state, State::Aborted { .. }))
    else {
        return Ok(Some(None));
    };
    match which {
        Some(w) if *w != identity(record) => anyhow::bail!(
            "another rollout ({}) started during the abort of {}: it is not aborted; \
             see `rollout status`",
            record.commit,
            w.0
        ),
        Some(_) => {}
        None => *which = Some(identity(record)),
    }
    results.extend(roll_back(ctx, record).await?);
    let commit = record.commit.clone();
    if !matches!(record.state, State::Aborted { .. }) {
        record.abort(by);
    }
    let record = record.clone();
    book.remember_aborted(&commit);
    if !save_over(ctx.store, &mut seen, &book)? {
        return Ok(None);
    }
    ctx.flags.metrics.rollout_halted(&commit, false);
    Ok(Some(Some(record)))
}

/// Put the targets of `record`'s applied waves still at its commit back
/// on their previous commits (the rollback guard's consent recorded as
/// [`ABORT_CONSENT`]). The book is not touched.
///
/// # Errors
/// Loading a previous commit or the rollout's.
async fn roll_back(ctx: &Ctx<'_>, record: &Record) -> Result<Vec<Applied>> {
    let applied_nodes = record.applied_nodes();
    let nodes: Vec<_> = ctx_nodes(ctx, record, &applied_nodes)?;
    let live = live_commits(&nodes).await;
    // By previous commit: the targets still at the rollout's commit.
    let mut by_previous: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut notes = Vec::new();
    for node in &applied_nodes {
        let at_commit = matches!(live.get(node), Some(Ok(Some(c))) if *c == record.commit);
        if !at_commit {
            continue;
        }
        match record.previous.get(node).cloned().flatten() {
            Some(prev) => by_previous.entry(prev).or_default().push(node.clone()),
            None => notes.push(node.clone()),
        }
    }
    for node in &notes {
        tracing::warn!(target = %node, "rollout abort: the target had no commit before the rollout; left at the rollout's commit");
    }
    let mut flags = ctx.flags.clone();
    flags.allow_rollback = true;
    let mut results = Vec::new();
    for (prev, nodes) in &by_previous {
        let source = source_at(ctx.root, ctx.store, prev)?;
        let jobs = crate::many::jobs(&source, nodes)?;
        results.extend(
            apply_rollout(
                &source,
                jobs,
                &flags,
                ctx.action,
                ctx.root,
                None,
                Some(ABORT_CONSENT),
            )
            .await,
        );
    }
    Ok(results)
}

/// The book changed while `record`'s wave `wave` was applied: another
/// writer's book stands, never saved over. When the rollout was aborted
/// meanwhile, its rollback could not see this wave: the wave is counted
/// applied in the aborted record (while it is still the current one) and
/// its targets are put back on their previous commits here. Otherwise
/// the next run applies the wave again if it still should (its targets
/// already there are unchanged).
async fn changed_under(
    ctx: &Ctx<'_>,
    record: Record,
    wave: usize,
    mut applied: Vec<Applied>,
    mut notes: Vec<String>,
) -> Result<Advanced> {
    let name = record
        .waves
        .get(wave)
        .map(|w| w.name.clone())
        .unwrap_or_default();
    let this = identity(&record);
    let mut aborted = false;
    for _ in 0..ABORT_ATTEMPTS {
        let (mut book, mut seen) = load_seen(ctx.store)?;
        aborted = book.is_aborted(&record.commit);
        let Some(current) = book
            .current
            .as_mut()
            .filter(|r| identity(r) == this && matches!(r.state, State::Aborted { .. }))
        else {
            break;
        };
        aborted = true;
        current.applied_late(wave, now());
        if save_over(ctx.store, &mut seen, &book)? {
            break;
        }
    }
    if aborted {
        // `record` counts the wave applied: its targets go back too.
        applied.extend(roll_back(ctx, &record).await?);
        notes.push(format!(
            "wave {name} reached its targets while the rollout was aborted: rolled back too"
        ));
    } else {
        notes.push(format!(
            "the rollouts' book changed while wave {name} was applied (another command or host \
             wrote it): not saved over; the next run reads it"
        ));
    }
    Ok(Advanced::Stands {
        record: as_kept(ctx.store, record)?,
        applied,
        notes,
    })
}

/// `record` as the store keeps it now, after another writer's change
/// (itself when the current rollout is another one).
///
/// # Errors
/// The store cannot be read, or holds something that is not a book.
fn as_kept(store: &dyn Store, record: Record) -> Result<Record> {
    let this = identity(&record);
    Ok(load(store)?
        .current
        .filter(|r| identity(r) == this)
        .unwrap_or(record))
}

/// The nodes named in `names`, from the rollout commit's configuration
/// (a node removed since is not found and left out).
fn ctx_nodes(
    ctx: &Ctx<'_>,
    record: &Record,
    names: &[String],
) -> Result<Vec<compiler::model::resolved::Node>> {
    let valid = crate::reconcile::checked(ctx.root, Some(&record.commit), "")?;
    Ok(valid
        .config
        .nodes
        .iter()
        .filter(|n| names.contains(&n.name))
        .cloned()
        .collect())
}

/// The targets a heal may touch while waves are configured: only those
/// whose live commit is `source`'s (a heal never moves a target to
/// another commit behind a rollout's back).
pub async fn healable(source: &Source) -> Vec<String> {
    let targets: Vec<_> = source
        .config
        .nodes
        .iter()
        .filter(|n| n.redis.is_some())
        .cloned()
        .collect();
    live_commits(&targets)
        .await
        .into_iter()
        .filter(|(_, c)| matches!(c, Ok(Some(c)) if *c == source.commit))
        .map(|(n, _)| n)
        .collect()
}

/// `rollout status` as text.
#[must_use]
pub fn render(book: &Book, now: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let Some(r) = &book.current else {
        let _ = writeln!(out, "no rollout");
        return out;
    };
    let _ = writeln!(
        out,
        "rollout of {}: {}",
        short(&r.commit),
        describe(&r.state, r, now)
    );
    let applied = r.applied_count();
    for (i, w) in r.waves.iter().enumerate() {
        let state = match (w.applied_at, i.cmp(&applied)) {
            (Some(t), _) => {
                let until = w.bake_until.unwrap_or(t);
                if now < until && i + 1 == applied && r.state == State::Baking {
                    format!(
                        "applied {}; bakes until {}",
                        compiler::clock::rfc3339(t),
                        compiler::clock::rfc3339(until)
                    )
                } else {
                    format!("applied {}", compiler::clock::rfc3339(t))
                }
            }
            _ => "pending".to_owned(),
        };
        let promoted = w
            .promoted_by
            .as_deref()
            .map(|b| format!(" (promoted by {})", edgestate::untrusted::escape(b)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  wave {} [{}] bake {}s: {state}{promoted}",
            w.name,
            w.nodes.join(", "),
            w.bake_s
        );
    }
    if !r.changed_hosts.is_empty() {
        let _ = writeln!(out, "  changed sites: {}", r.changed_hosts.join(", "));
    }
    if !book.aborted.is_empty() {
        let _ = writeln!(
            out,
            "aborted commits (never re-applied): {}",
            book.aborted
                .iter()
                .map(|c| short(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out
}

fn describe(state: &State, r: &Record, now: u64) -> String {
    match state {
        State::Halted {
            site,
            figure,
            detail,
        } if site.is_empty() => format!("halted: the gate could not judge ({figure}: {detail})"),
        State::Halted {
            site,
            figure,
            detail,
        } => format!("halted: site {site} regressed ({figure}; {detail})"),
        State::Aborted { by } => {
            format!("aborted by {}", edgestate::untrusted::escape(by))
        }
        State::Baking => match r.step(now) {
            Step::Wait { wave, until } => format!(
                "baking: wave {} until {}",
                r.waves[wave].name,
                compiler::clock::rfc3339(until)
            ),
            _ => "baked: the gate judges it at the next step".to_owned(),
        },
        other => other.as_str().to_owned(),
    }
}

/// `rollout status --format json`.
#[must_use]
pub fn to_json(book: &Book) -> serde_json::Value {
    serde_json::json!({
        "rollout": book.current,
        "aborted": book.aborted,
    })
}

fn short(c: &str) -> &str {
    c.get(..12).unwrap_or(c)
}
