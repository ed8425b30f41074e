//! Writing one target: a lease lock, then one WATCH/MULTI/EXEC that writes
//! changed keys, deletes managed keys no longer desired (prune), and updates
//! `edgeform:manifest` and `edgeform:meta` together. A reader never sees
//! half an apply: the documents and the new generation appear at once.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use edgestate::keys;
use redis::aio::MultiplexedConnection;

use super::plan::{self, Ancestry, Changes, Overrides};
use super::state::{Desired, Live, Meta, now_rfc3339};
use crate::model::resolved::Thresholds;

/// Fields per HSET/MGET/DEL command inside a transaction or batch.
const BATCH: usize = 1000;

/// Read `edgeform:manifest` and `edgeform:meta`.
///
/// # Errors
/// Redis errors.
pub async fn read_live(con: &mut MultiplexedConnection) -> Result<Live> {
    let (manifest, meta): (BTreeMap<String, String>, BTreeMap<String, String>) = redis::pipe()
        .cmd("HGETALL")
        .arg(keys::MANIFEST)
        .cmd("HGETALL")
        .arg(keys::META)
        .query_async(con)
        .await
        .context("reading edgeform:manifest and edgeform:meta")?;
    Ok(Live {
        manifest,
        meta: Meta::from_hash(&meta),
    })
}

/// Values of `keys` (None where absent), in batches.
///
/// # Errors
/// Redis errors.
pub async fn get_values(
    con: &mut MultiplexedConnection,
    keys: &[String],
) -> Result<Vec<Option<String>>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(BATCH) {
        let values: Vec<Option<String>> = redis::cmd("MGET").arg(chunk).query_async(con).await?;
        out.extend(values);
    }
    Ok(out)
}

/// The apply lease lock on a target: `SET edgeform:lock <token> NX PX`.
pub struct Lock {
    token: String,
}

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

impl Lock {
    /// Take the lock, waiting up to `wait` for another holder to finish.
    ///
    /// # Errors
    /// Still held by someone else after `wait` (the holder is named).
    pub async fn acquire(
        con: &mut MultiplexedConnection,
        lease: Duration,
        wait: Duration,
    ) -> Result<Lock> {
        let token = format!(
            "{}:{}:{}",
            hostname(),
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let ok: Option<String> = redis::cmd("SET")
                .arg(keys::LOCK)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
                .query_async(con)
                .await?;
            if ok.is_some() {
                return Ok(Lock { token });
            }
            if start.elapsed() >= wait {
                let holder: Option<String> =
                    redis::cmd("GET").arg(keys::LOCK).query_async(con).await?;
                bail!(
                    "locked by another apply ({}) for more than {:?}",
                    holder.unwrap_or_else(|| "unknown".into()),
                    wait
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Release the lock if it is still ours.
    pub async fn release(self, con: &mut MultiplexedConnection) {
        let _: Result<i64, _> = redis::Script::new(RELEASE)
            .key(keys::LOCK)
            .arg(&self.token)
            .invoke_async(con)
            .await;
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "host".into(), |h| h.trim().to_owned())
}

/// What a saved plan saw on a target; apply refuses when it moved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Expect {
    pub generation: u64,
    pub manifest_digest: String,
}

/// Settings of one apply.
#[derive(Debug, Clone)]
pub struct Options {
    pub commit: String,
    pub thresholds: Thresholds,
    pub overrides: Overrides,
    pub lease: Duration,
    pub lock_wait: Duration,
}

/// The result of applying one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Live already equals desired (same content and commit).
    Unchanged {
        generation: u64,
    },
    Applied {
        changes: Changes,
        generation: u64,
    },
}

/// Apply `desired` to one target over `con` (lock, checks, transaction).
///
/// `ancestry` tells where the desired commit stands relative to a live one.
///
/// # Errors
/// Lock timeout, a refusal (rollback, thresholds, empty, stale plan),
/// Redis errors, or repeated transaction conflicts.
pub async fn apply(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    expect: Option<&Expect>,
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Outcome> {
    let lock = Lock::acquire(con, options.lease, options.lock_wait).await?;
    let result = transaction(con, desired, options, expect, ancestry).await;
    lock.release(con).await;
    result
}

async fn transaction(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    expect: Option<&Expect>,
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Outcome> {
    for _attempt in 0..5 {
        redis::cmd("WATCH")
            .arg(keys::MANIFEST)
            .arg(keys::META)
            .exec_async(con)
            .await?;
        let live = read_live(con).await?;
        let checked = check(desired, &live, options, expect, ancestry);
        let changes = match checked {
            Ok(c) => c,
            Err(e) => {
                redis::cmd("UNWATCH").exec_async(con).await?;
                return Err(e);
            }
        };
        if changes.is_empty() && live.meta.commit.as_deref() == Some(options.commit.as_str()) {
            redis::cmd("UNWATCH").exec_async(con).await?;
            return Ok(Outcome::Unchanged {
                generation: live.meta.generation,
            });
        }
        let generation = live.meta.generation + 1;
        let pipe = transaction_pipe(desired, &changes, &options.commit, generation);
        let done: Option<redis::Value> = pipe.query_async(con).await.context("MULTI/EXEC")?;
        if done.is_some() {
            return Ok(Outcome::Applied {
                changes,
                generation,
            });
        }
        // WATCH saw a concurrent write to the manifest or meta: re-read.
    }
    bail!("the target kept changing under the transaction (5 WATCH conflicts); try again")
}

fn check(
    desired: &Desired,
    live: &Live,
    options: &Options,
    expect: Option<&Expect>,
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Changes> {
    if let Some(e) = expect
        && (e.generation != live.meta.generation || e.manifest_digest != live.digest())
    {
        bail!(
            "stale plan: the target moved since it was planned (generation {} then, {} now); plan again",
            e.generation,
            live.meta.generation
        );
    }
    let changes = plan::changes(desired, &live.manifest);
    let a = ancestry(live.meta.commit.as_deref());
    plan::allowed(
        &options.commit,
        desired,
        live,
        &changes,
        a,
        options.thresholds,
        options.overrides,
    )
    .map_err(|r| anyhow::anyhow!("{r}"))?;
    Ok(changes)
}

/// The MULTI/EXEC body: documents, manifest and meta together.
fn transaction_pipe(
    desired: &Desired,
    changes: &Changes,
    commit: &str,
    generation: u64,
) -> redis::Pipeline {
    let write: HashSet<&str> = changes
        .added
        .iter()
        .chain(&changes.changed)
        .map(String::as_str)
        .collect();
    let mut pipe = redis::pipe();
    pipe.atomic();
    // MSET and HSET in batches: a thousand writes per queued command keeps
    // the transaction's queue (and EXEC's reply) small.
    let mut docs: Vec<(&str, &str)> = Vec::with_capacity(BATCH);
    let mut fields: Vec<(&str, &str)> = Vec::with_capacity(BATCH);
    for (key, value, hash) in desired.iter() {
        if write.contains(key) {
            docs.push((key, value));
            fields.push((key, hash));
            if fields.len() == BATCH {
                pipe.cmd("MSET").arg(&docs).ignore();
                pipe.cmd("HSET").arg(keys::MANIFEST).arg(&fields).ignore();
                docs.clear();
                fields.clear();
            }
        }
    }
    if !fields.is_empty() {
        pipe.cmd("MSET").arg(&docs).ignore();
        pipe.cmd("HSET").arg(keys::MANIFEST).arg(&fields).ignore();
    }
    for chunk in changes.removed.chunks(BATCH) {
        pipe.cmd("DEL").arg(chunk).ignore();
        pipe.cmd("HDEL").arg(keys::MANIFEST).arg(chunk).ignore();
    }
    set_meta(&mut pipe, commit, generation);
    pipe
}

/// Append the `edgeform:meta` update that ends every write transaction.
/// Its reply is the one kept: EXEC's nil (a WATCH conflict) then reads as
/// `None`, success as `Some`.
pub(crate) fn set_meta(pipe: &mut redis::Pipeline, commit: &str, generation: u64) {
    pipe.cmd("HSET")
        .arg(keys::META)
        .arg("commit")
        .arg(commit)
        .arg("generation")
        .arg(generation)
        .arg("applied_at")
        .arg(now_rfc3339())
        .arg("format")
        .arg(edgestate::FORMAT_VERSION);
}
