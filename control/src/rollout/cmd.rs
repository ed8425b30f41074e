//! `edgeform rollout status|promote|abort`: what they print and their
//! exit codes (0 done, 1 nothing to do or a target failed).

use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;

use super::run::{
    Advanced, Ctx, abort as abort_rollout, load, promote as promote_rollout, render, to_json,
};
use crate::many::Settings;

/// `rollout status [--format json]`: exit 0 (also with no rollout).
///
/// # Errors
/// The store cannot be read.
pub fn status(state_dir: &Path, json: bool) -> Result<u8> {
    let book = match crate::store::open_existing(state_dir)? {
        Some(store) => load(&*store)?,
        None => super::Book::default(),
    };
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", to_json(&book))?;
    } else {
        write!(out, "{}", render(&book, compiler::clock::checked_now()))?;
    }
    Ok(0)
}

fn by() -> String {
    crate::audit::Audit::current(compiler::clock::checked_now()).applied_by
}

/// `rollout promote`: the next wave of the live rollout now. Exit 1 when
/// no rollout is live or a target failed.
///
/// # Errors
/// The store; loading the rollout's commit.
pub async fn promote(root: &Path, state_dir: &Path, settings: &Settings) -> Result<u8> {
    let store = crate::store::open(state_dir)?;
    let ctx = Ctx {
        root,
        flags: settings,
        store: &*store,
        action: crate::gate::Action::Apply,
    };
    let started = Instant::now();
    let advanced = match promote_rollout(&ctx, &by()).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            return Ok(1);
        }
    };
    let failed = match advanced {
        Advanced::Stands { applied, notes, .. } => {
            let failed = if applied.is_empty() {
                0
            } else {
                crate::cmd::report_applied(&applied, started.elapsed())
            };
            for n in &notes {
                println!("{n}");
            }
            failed
        }
        Advanced::Frozen(why) => {
            eprintln!("the next wave waits: {why} (--break-glass overrides)");
            1
        }
        Advanced::Blocked(_) => {
            // An abort landed between the promote's save and its wave.
            eprintln!("the rollout was aborted or replaced meanwhile: nothing applied");
            1
        }
        Advanced::NotARollout => 0,
    };
    print!(
        "{}",
        render(&load(&*store)?, compiler::clock::checked_now())
    );
    Ok(u8::from(failed > 0))
}

/// `rollout abort`: every applied wave back to its previous commit, the
/// commit remembered as aborted. Exit 1 when no rollout is live or a
/// target failed.
///
/// # Errors
/// The store; loading a previous commit.
pub async fn abort(root: &Path, state_dir: &Path, settings: &Settings) -> Result<u8> {
    let store = crate::store::open(state_dir)?;
    let ctx = Ctx {
        root,
        flags: settings,
        store: &*store,
        action: crate::gate::Action::Apply,
    };
    let started = Instant::now();
    let (record, applied) = abort_rollout(&ctx, &by()).await?;
    if record.is_none() {
        eprintln!("error: no rollout to abort");
        return Ok(1);
    }
    let failed = crate::cmd::report_applied(&applied, started.elapsed());
    print!(
        "{}",
        render(&load(&*store)?, compiler::clock::checked_now())
    );
    Ok(u8::from(failed > 0))
}
