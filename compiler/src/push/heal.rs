//! Heal: compare a target's full live content with the desired state and
//! repair every difference — documents changed or deleted by hand, keys
//! nobody manages (`site:*`/`suspended:*` written outside git: git is the
//! source of truth), a tampered manifest. Reads every value, so it runs
//! less often than plan (default every 5 minutes).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use edgestate::keys;
use redis::aio::MultiplexedConnection;

use super::apply::{Lock, Options, get_raw_values, read_live_lenient, set_meta};
use super::escape_bytes;
use super::plan::Ancestry;
use super::state::Desired;

/// What kind of drift a key had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriftKind {
    /// A desired key is absent.
    Missing,
    /// A desired key holds another value.
    Changed,
    /// A `site:`/`suspended:` key git does not know (or no longer wants).
    Unmanaged,
    /// The manifest does not describe the content.
    Manifest,
}

impl DriftKind {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Missing => "missing",
            DriftKind::Changed => "changed",
            DriftKind::Unmanaged => "unmanaged",
            DriftKind::Manifest => "manifest",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Drift {
    /// The key; bytes that are not UTF-8 as `\xNN` ([`escape_bytes`]).
    pub key: String,
    pub kind: DriftKind,
}

/// Every `site:*` and `suspended:*` key on the target, as bytes: a key
/// written by hand need not be UTF-8.
///
/// # Errors
/// Redis errors.
pub async fn document_keys(con: &mut MultiplexedConnection) -> Result<BTreeSet<Vec<u8>>> {
    let mut out = BTreeSet::new();
    for pattern in [
        format!("{}*", keys::SITE_PREFIX),
        format!("{}*", keys::SUSPENDED_PREFIX),
    ] {
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(con)
                .await?;
            out.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(out)
}

/// Compare and repair one target. Returns the drift found (empty: healthy).
///
/// # Errors
/// Lock timeout, Redis errors, repeated transaction conflicts.
pub async fn heal(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Vec<Drift>> {
    let lock = Lock::acquire(con, options.lease, options.lock_wait).await?;
    let result = heal_locked(con, desired, options, ancestry).await;
    lock.release(con).await;
    result
}

async fn heal_locked(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Vec<Drift>> {
    for _attempt in 0..5 {
        redis::cmd("WATCH")
            .arg(keys::MANIFEST)
            .arg(keys::META)
            .exec_async(con)
            .await?;
        let (live, manifest_clean) = read_live_lenient(con).await?;
        // Healing to an older commit would be a rollback by the back door.
        let a = ancestry(live.meta.commit.as_deref());
        if a != Ancestry::Forward && !options.overrides.allow_rollback {
            redis::cmd("UNWATCH").exec_async(con).await?;
            anyhow::bail!(
                "not healing: the live commit {} is newer than {} or unknown here (use --allow-rollback)",
                live.meta.commit.as_deref().unwrap_or("?"),
                options.commit
            );
        }
        let wanted: Vec<String> = desired.iter().map(|(k, _, _)| k.to_owned()).collect();
        let values = get_raw_values(con, &wanted).await?;
        let present = document_keys(con).await?;

        let mut drift = Vec::new();
        let mut fixes: Vec<(&str, &str)> = Vec::new();
        let mut manifest_ok = manifest_clean && live.manifest.len() == desired.len();
        for ((key, value, hash), actual) in desired.iter().zip(&values) {
            match actual {
                None => {
                    drift.push(Drift {
                        key: key.to_owned(),
                        kind: DriftKind::Missing,
                    });
                    fixes.push((key, value));
                }
                Some(a) if a.as_slice() != value.as_bytes() => {
                    drift.push(Drift {
                        key: key.to_owned(),
                        kind: DriftKind::Changed,
                    });
                    fixes.push((key, value));
                }
                Some(_) => {}
            }
            manifest_ok &= live.manifest.get(key).is_some_and(|h| h == hash);
        }
        let desired_keys: BTreeSet<&[u8]> = desired.iter().map(|(k, _, _)| k.as_bytes()).collect();
        // Keys to remove: unmanaged documents, and managed keys git dropped.
        let mut remove: BTreeSet<Vec<u8>> = present
            .iter()
            .filter(|k| !desired_keys.contains(k.as_slice()))
            .cloned()
            .collect();
        remove.extend(
            live.manifest
                .keys()
                .filter(|k| !desired_keys.contains(k.as_bytes()))
                .map(|k| k.as_bytes().to_vec()),
        );
        for k in &remove {
            drift.push(Drift {
                key: escape_bytes(k),
                kind: DriftKind::Unmanaged,
            });
        }
        if !manifest_ok {
            drift.push(Drift {
                key: keys::MANIFEST.to_owned(),
                kind: DriftKind::Manifest,
            });
        }
        if drift.is_empty() {
            redis::cmd("UNWATCH").exec_async(con).await?;
            return Ok(drift);
        }

        let mut pipe = redis::pipe();
        pipe.atomic();
        for chunk in fixes.chunks(1000) {
            pipe.cmd("MSET").arg(chunk).ignore();
        }
        let remove: Vec<Vec<u8>> = remove.into_iter().collect();
        for chunk in remove.chunks(1000) {
            pipe.cmd("DEL").arg(chunk).ignore();
        }
        // Rewrite the manifest whole: it is the index plan trusts.
        pipe.cmd("DEL").arg(keys::MANIFEST).ignore();
        let hashes: BTreeMap<&str, &str> = desired.iter().map(|(k, _, h)| (k, h)).collect();
        let fields: Vec<(&str, &str)> = hashes.into_iter().collect();
        for chunk in fields.chunks(1000) {
            pipe.cmd("HSET").arg(keys::MANIFEST).arg(chunk).ignore();
        }
        set_meta(&mut pipe, &options.commit, live.meta.generation + 1);
        let done: Option<redis::Value> = pipe.query_async(con).await.context("MULTI/EXEC")?;
        if done.is_some() {
            drift.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
            return Ok(drift);
        }
    }
    anyhow::bail!("the target kept changing under the heal (5 WATCH conflicts)")
}
