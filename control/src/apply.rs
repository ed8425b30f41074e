//! Writing one target: a lease lock, then one WATCH/MULTI/EXEC that writes
//! changed keys, deletes managed keys no longer desired (prune), and updates
//! `edgeform:manifest` and `edgeform:meta` together. A reader never sees
//! half an apply: the documents and the new generation appear at once.
//! The transaction's body is streamed in chunks (encoding the next while
//! the server queues the last), never encoded whole.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use edgestate::bundle::Bundle;
use edgestate::keys;
use redis::aio::MultiplexedConnection;
use tracing::Instrument as _;

pub use super::lock::Lock;
use super::plan::{self, Changes, Overrides};
use super::state::{Desired, Live, Manifest, Meta};
use compiler::clock::now_rfc3339;
use compiler::model::resolved::Thresholds;

/// Keys per MSET/MGET/DEL command inside a transaction or batch.
const BATCH: usize = 1000;

/// Read what plan and apply compare, in proportion to what differs:
/// the meta (and whether a format-1 manifest exists); when the meta's
/// manifest digest is the desired one, nothing more. Otherwise the 256
/// bucket digests, and the manifest of the buckets that differ (one `GET`
/// each; `HGETALL` on a format-2 target, whose buckets are hashes). A
/// format-1 target is read whole (the next apply migrates it).
///
/// # Errors
/// Redis errors (a bucket of another type than its format's), or a
/// bucket that is not whole records of UTF-8 keys
/// ([`edgestate::manifest::BucketError`]).
pub async fn read_live(con: &mut MultiplexedConnection, desired: &Desired) -> Result<Live> {
    let (meta, old, bundle) = read_meta(con).await?;
    let current = meta.format.is_some_and(|f| f >= 2) && meta.manifest_digest.is_some();
    if old || (!current && meta.generation > 0) {
        let manifest: redis::Value = redis::cmd("HGETALL")
            .arg(keys::MANIFEST)
            .query_async(con)
            .await
            .context("reading edgeform:manifest (format 1)")?;
        let manifest = manifest_from(manifest)?;
        only_documents(&manifest, keys::MANIFEST, None)?;
        let mut live = Live::legacy(manifest, meta);
        live.bundle = bundle;
        return Ok(live);
    }
    // Format 2: the buckets are hashes (rewritten whole by the next write).
    let hash_buckets = current && meta.format == Some(2);
    let digest = meta
        .manifest_digest
        .clone()
        .unwrap_or_else(|| super::state::hex128(0));
    if digest == desired.digest() {
        return Ok(Live {
            managed: desired.len(),
            meta,
            digest,
            bundle,
            hash_buckets,
            ..Live::default()
        });
    }
    let mut get = redis::cmd("HMGET");
    get.arg(keys::MANIFEST_BUCKETS);
    for b in 0..keys::BUCKETS {
        get.arg(format!("{b:02x}"));
    }
    let stored: Vec<Option<String>> = get
        .query_async(con)
        .await
        .context("reading edgeform:manifest:buckets")?;
    let differ = plan::differing_buckets(desired, &stored);
    let mut pipe = redis::pipe();
    for b in &differ {
        pipe.cmd(if hash_buckets { "HGETALL" } else { "GET" })
            .arg(keys::manifest_bucket(*b));
    }
    let replies: Vec<redis::Value> = if differ.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(con)
            .await
            .context("reading edgeform:manifest buckets")?
    };
    let mut manifest = Manifest::new();
    for (reply, b) in replies.into_iter().zip(&differ) {
        let name = keys::manifest_bucket(*b);
        let mut read = Manifest::new();
        if hash_buckets {
            read = manifest_from(reply)?;
        } else {
            bucket_from(reply, &mut read).with_context(|| format!("reading {name}"))?;
        }
        only_documents(&read, &name, Some(*b))?;
        manifest.extend(read);
    }
    Ok(Live {
        manifest,
        meta,
        managed: plan::managed_count(&stored),
        digest,
        legacy: false,
        hash_buckets,
        read_buckets: differ,
        bundle,
    })
}

/// What differs between `desired` and what [`read_live`] read.
#[must_use]
pub fn live_changes(desired: &Desired, live: &Live) -> Changes {
    if live.legacy {
        return plan::changes_where(desired, &live.manifest, |_| true, true);
    }
    let mut read = [false; keys::BUCKETS];
    for b in &live.read_buckets {
        read[usize::from(*b)] = true;
    }
    plan::changes_where(
        desired,
        &live.manifest,
        |k| read[usize::from(keys::bucket(k.as_bytes()))],
        false,
    )
}

/// A manifest (or one bucket of it, `bucket`, read from `name`) names
/// only documents edgeform pushes (`keys::is_document`), each in its own
/// bucket: a record for any other key (the purge queue, the history) was
/// written by something else, and apply would delete that key as removed.
///
/// # Errors
/// The first such record, naming the key it was read from.
fn only_documents(manifest: &Manifest, name: &str, bucket: Option<u8>) -> Result<()> {
    let misplaced = |key: &String| bucket.is_some_and(|b| keys::bucket(key.as_bytes()) != b);
    // The first in name order: the same error every run.
    let first = manifest
        .keys()
        .filter(|k| !keys::is_document(k) || misplaced(k))
        .min();
    if let Some(key) = first {
        bail!(
            "{name} holds a record for `{}`, {}: not written by edgeform, so nothing is \
             written to this target (the record would make apply delete that key)",
            edgestate::untrusted::escape(key),
            if misplaced(key) {
                "which belongs to another bucket"
            } else {
                "which is no document edgeform pushes"
            }
        );
    }
    Ok(())
}

/// A bucket's `GET` reply (format 3: a string of records; nil: empty)
/// added to `manifest`.
fn bucket_from(reply: redis::Value, manifest: &mut Manifest) -> Result<()> {
    let bytes = match reply {
        redis::Value::BulkString(b) => b,
        redis::Value::Nil => return Ok(()),
        other => bail!("not a string: {other:?}"),
    };
    for record in edgestate::manifest::records(&bytes) {
        let (key, hash) = record?;
        let key = std::str::from_utf8(key).context("a key that is not UTF-8")?;
        // Checked as lowercase hex by the parser: ASCII.
        let hash = String::from_utf8_lossy(hash).into_owned();
        manifest.insert(key.to_owned(), hash);
    }
    Ok(())
}

/// HGETALL's reply as a [`Manifest`], taking the reply's strings over
/// without copying them.
fn manifest_from(reply: redis::Value) -> Result<Manifest> {
    let items = match reply {
        redis::Value::Array(items) => items,
        redis::Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        redis::Value::Nil => Vec::new(),
        other => bail!("{} is not a hash: {other:?}", keys::MANIFEST),
    };
    let text = |v: redis::Value| -> Result<String> {
        match v {
            redis::Value::BulkString(b) => String::from_utf8(b)
                .with_context(|| format!("{} holds a non-UTF-8 string", keys::MANIFEST)),
            other => bail!("{} holds {other:?}", keys::MANIFEST),
        }
    };
    let mut manifest = Manifest::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        manifest.insert(text(k)?, text(v)?);
    }
    Ok(manifest)
}

/// Values of `keys` as bytes (None where absent), in batches: for
/// import, which must read what is there, UTF-8 or not.
///
/// # Errors
/// Redis errors.
pub async fn get_raw_values<K: redis::ToRedisArgs + Sync>(
    con: &mut MultiplexedConnection,
    keys: &[K],
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(BATCH) {
        let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(chunk).query_async(con).await?;
        out.extend(values);
    }
    Ok(out)
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
        let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(chunk).query_async(con).await?;
        for (key, v) in chunk.iter().zip(values) {
            out.push(
                v.map(|b| {
                    String::from_utf8(b).map_err(|_| {
                        anyhow::anyhow!(
                            "{} holds a value that is not UTF-8",
                            edgestate::untrusted::escape(key)
                        )
                    })
                })
                .transpose()?,
            );
        }
    }
    Ok(out)
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
    /// Which command writes: decides what the gate checks
    /// ([`super::gate::decide`]).
    pub action: super::gate::Action,
    /// The freeze window open when the run started, if any.
    pub frozen: Option<super::gate::Frozen>,
    /// `--break-glass`: write through an open freeze window.
    pub break_glass: bool,
    /// Heal: find and report the drift, write nothing.
    pub dry_run: bool,
    /// Who writes, recorded in the meta and the history.
    pub audit: super::audit::Audit,
    /// Where the lock wait is counted.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The transaction bodies the run's targets share
    /// ([`super::bodies`]).
    pub bodies: std::sync::Arc<super::bodies::Bodies>,
}

impl Options {
    /// The history entry of a write of `generation` over `previous`.
    #[must_use]
    pub fn entry(
        &self,
        relation: &super::gate::Relation,
        previous: Option<&str>,
        generation: u64,
        added: usize,
        changed: usize,
        deleted: usize,
    ) -> super::audit::Entry {
        super::audit::Entry {
            at: compiler::clock::rfc3339(self.audit.now),
            action: self.action.as_str().to_owned(),
            commit: self.commit.clone(),
            previous_commit: previous.map(str::to_owned),
            generation,
            applied_by: self.audit.applied_by.clone(),
            command: self.audit.command.clone(),
            forced: self.overrides.force,
            break_glass: self.break_glass,
            freeze: super::gate::in_force(self, relation)
                .filter(|_| self.break_glass)
                .map(|f| f.window.clone())
                .or_else(|| self.audit.urgent_renewal.as_ref().map(|u| u.window.clone())),
            urgent_renewal: self.audit.urgent_renewal.as_ref().map(|u| u.hosts.clone()),
            written: added + changed,
            deleted,
            added: Some(added),
            changed: Some(changed),
            adopted: previous
                .filter(|_| self.overrides.adopt && relation.ancestry == plan::Ancestry::Unknown)
                .map(str::to_owned),
            clock_moved: self.audit.moved.map(compiler::clock::rfc3339),
            wave: self.audit.wave.clone(),
            consent: self.audit.consent.clone(),
        }
    }
}

/// The result of applying one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Live already equals desired (same content and commit).
    Unchanged { generation: u64 },
    Applied {
        /// Shared with the other targets of the run that wrote the same.
        changes: std::sync::Arc<Changes>,
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
    ancestry: &super::gate::Relate<'_>,
) -> Result<Outcome> {
    if let Some(unchanged) = unchanged_without_lock(con, desired, options, expect, ancestry).await?
    {
        return Ok(unchanged);
    }
    let lock = Lock::acquire(con, options.lease, options.lock_wait, &options.metrics).await?;
    hold_for_tests().await;
    let result = transaction(con, desired, options, expect, ancestry).await;
    lock.release(con).await;
    result
}

/// A target already in the desired state (the meta's manifest digest and
/// commit are the desired ones, format 3) is reported unchanged from one
/// read of the meta, without taking the lock: a no-op writes nothing, and
/// the meta is only ever written in the transaction that writes the
/// documents, so what it says is a state that was committed whole (a
/// no-op sync costs one round trip per target, not lock + WATCH + unlock).
/// `None` when anything differs or a check would refuse: then the locked
/// path decides (and reports the refusal).
async fn unchanged_without_lock(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    expect: Option<&Expect>,
    ancestry: &super::gate::Relate<'_>,
) -> Result<Option<Outcome>> {
    let (meta, old, bundle) = read_meta(con).await?;
    if old
        || meta.format.is_none_or(|f| f < edgestate::FORMAT_VERSION)
        || meta.manifest_digest.as_deref() != Some(desired.digest())
        || meta.commit.as_deref() != Some(options.commit.as_str())
    {
        return Ok(None);
    }
    let live = Live {
        managed: desired.len(),
        digest: desired.digest().to_owned(),
        meta,
        bundle,
        ..Live::default()
    };
    if check(desired, &live, options, expect, ancestry).is_err() {
        return Ok(None);
    }
    Ok(Some(Outcome::Unchanged {
        generation: live.meta.generation,
    }))
}

/// `edgeform:meta`, and whether a format-1 `edgeform:manifest` exists
/// (one round trip).
/// The meta, whether a format-1 manifest exists, and what the edge's
/// installed code reads (`edgeform:bundle`), in one round trip.
async fn read_meta(con: &mut MultiplexedConnection) -> Result<(Meta, bool, Bundle)> {
    let (meta, old, bundle): (BTreeMap<String, String>, bool, BTreeMap<String, String>) =
        redis::pipe()
            .add_command(crate::state::hgetall_capped(
                keys::META,
                crate::state::EDGE_FIELD_MAX,
            ))
            .cmd("EXISTS")
            .arg(keys::MANIFEST)
            .add_command(crate::state::hgetall_capped(
                keys::BUNDLE,
                crate::state::EDGE_FIELD_MAX,
            ))
            .query_async(con)
            .await
            .context("reading edgeform:meta and edgeform:bundle")?;
    Ok((Meta::from_hash(&meta), old, Bundle::from_hash(&bundle)))
}

/// `EDGEFORM_TEST_HOLD_LOCK_MS`: hold the lock this long before writing,
/// so a test can kill an apply that holds it. Unset in
/// production.
async fn hold_for_tests() {
    if let Some(ms) = std::env::var("EDGEFORM_TEST_HOLD_LOCK_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
    }
}

async fn transaction(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    expect: Option<&Expect>,
    ancestry: &super::gate::Relate<'_>,
) -> Result<Outcome> {
    for _attempt in 0..5 {
        redis::cmd("WATCH")
            .arg(keys::MANIFEST)
            .arg(keys::MANIFEST_BUCKETS)
            .arg(keys::META)
            .exec_async(con)
            .await?;
        let live = read_live(con, desired)
            .instrument(tracing::info_span!("read_live"))
            .await?;
        // Targets of this run that write the same thing share the changes
        // and the encoded body (`bodies`).
        let shared = options
            .bodies
            .sharing()
            .then(|| options.bodies.body(desired, &live, &options.commit));
        let checked = tracing::info_span!("check").in_scope(|| {
            let changes = match &shared {
                Some(s) => s.changes(|| live_changes(desired, &live)),
                None => std::sync::Arc::new(live_changes(desired, &live)),
            };
            check_changes(desired, &live, &changes, options, expect, ancestry).map(|()| changes)
        });
        let changes = match checked {
            Ok(c) => c,
            Err(e) => {
                redis::cmd("UNWATCH").exec_async(con).await?;
                return Err(e);
            }
        };
        if changes.is_empty()
            && !live.rewrites_manifest()
            && live.digest == desired.digest()
            && live.meta.commit.as_deref() == Some(options.commit.as_str())
        {
            redis::cmd("UNWATCH").exec_async(con).await?;
            return Ok(Outcome::Unchanged {
                generation: live.meta.generation,
            });
        }
        let generation = next_generation(live.meta.generation)?;
        let entry = options.entry(
            &ancestry(live.meta.commit.as_deref()),
            live.meta.commit.as_deref(),
            generation,
            changes.added.len(),
            changes.changed.len(),
            changes.removed.len(),
        );
        let done = if let Some(shared) = &shared {
            let make =
                || Body::new(desired, &changes, &live, &options.commit, generation).without_meta();
            let mut tail = redis::pipe();
            set_meta(
                &mut tail,
                &options.commit,
                generation,
                desired,
                Some(&entry),
            );
            multi_exec_shared(con, shared, make, &tail)
                .instrument(tracing::info_span!("multi_exec"))
                .await?
        } else {
            let body =
                Body::new(desired, &changes, &live, &options.commit, generation).recording(entry);
            multi_exec(con, body)
                .instrument(tracing::info_span!("multi_exec"))
                .await?
        };
        if done {
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
    ancestry: &super::gate::Relate<'_>,
) -> Result<Changes> {
    let changes = live_changes(desired, live);
    check_changes(desired, live, &changes, options, expect, ancestry)?;
    Ok(changes)
}

/// The checks before a write of `changes` (`live`'s, to `desired`): keys
/// the manifest can record, a plan that is not stale, the gate.
fn check_changes(
    desired: &Desired,
    live: &Live,
    changes: &Changes,
    options: &Options,
    expect: Option<&Expect>,
    ancestry: &super::gate::Relate<'_>,
) -> Result<()> {
    desired.check_keys().map_err(anyhow::Error::new)?;
    if let Some(e) = expect
        && (e.generation != live.meta.generation || e.manifest_digest != live.digest)
    {
        bail!(
            "stale plan: the target moved since it was planned (generation {} then, {} now); plan again",
            e.generation,
            live.meta.generation
        );
    }
    let a = ancestry(live.meta.commit.as_deref());
    // A typed error: callers count refusals by kind (`Refusal::kind`).
    super::gate::decide(options, desired, live, changes, a).map_err(anyhow::Error::new)?;
    Ok(())
}

/// Bytes of commands sent per round trip inside MULTI: large enough that
/// round trips cost little, small enough that the server parses one chunk
/// while the next is encoded.
const CHUNK_BYTES: usize = 1 << 21;

/// One transaction on a connection that has WATCHed what it read: MULTI,
/// the body streamed in chunks (each chunk's `QUEUED` replies checked while
/// the next chunk is encoded), EXEC. Nothing is applied before EXEC, so a
/// reader sees all of it or none of it.
///
/// Returns `false` when EXEC reports a WATCH conflict (nothing applied).
///
/// # Errors
/// Redis errors; a command the server refused to queue (the transaction
/// is discarded).
pub(crate) async fn multi_exec(con: &mut MultiplexedConnection, body: Body<'_>) -> Result<bool> {
    redis::cmd("MULTI").exec_async(con).await?;
    if let Err(e) = super::bodies::stream(con, body).await {
        return Err(discard(con, e).await);
    }
    exec(con).await
}

/// The transaction of `shared`'s body (sent from the run's shared chunks,
/// or encoded with `make`) followed by this target's own `tail` (its
/// meta), as [`multi_exec`].
///
/// # Errors
/// As [`multi_exec`].
async fn multi_exec_shared<'a>(
    con: &mut MultiplexedConnection,
    shared: &super::bodies::Shared,
    make: impl Fn() -> Body<'a>,
    tail: &redis::Pipeline,
) -> Result<bool> {
    redis::cmd("MULTI").exec_async(con).await?;
    let sent = match shared.send(con, make).await {
        Ok(()) => send_chunk(con, tail).await,
        Err(e) => Err(e),
    };
    if let Err(e) = sent {
        return Err(discard(con, e).await);
    }
    exec(con).await
}

/// Send one chunk of a transaction's commands; every reply must be
/// `QUEUED`.
///
/// # Errors
/// Redis errors; a command the server refused to queue.
pub(crate) async fn send_chunk(
    con: &mut MultiplexedConnection,
    chunk: &redis::Pipeline,
) -> Result<()> {
    let replies = con.send_packed_commands(chunk, 0, chunk.len()).await?;
    match replies.into_iter().find_map(|r| match r {
        redis::Value::SimpleString(s) if s == "QUEUED" => None,
        redis::Value::Okay => None,
        other => Some(other),
    }) {
        Some(other) => bail!("the server refused a queued command: {other:?}"),
        None => Ok(()),
    }
}

/// `e` after DISCARD of the transaction under way.
async fn discard(con: &mut MultiplexedConnection, e: anyhow::Error) -> anyhow::Error {
    let _: Result<(), _> = redis::cmd("DISCARD").exec_async(con).await;
    e.context("MULTI/EXEC (discarded)")
}

/// EXEC: `false` on a WATCH conflict (nothing applied).
///
/// # Errors
/// Redis errors; a command that failed inside the transaction.
async fn exec(con: &mut MultiplexedConnection) -> Result<bool> {
    let done: Option<Vec<redis::Value>> = redis::cmd("EXEC")
        .query_async(con)
        .await
        .context("MULTI/EXEC")?;
    let Some(replies) = done else {
        return Ok(false);
    };
    if let Some(e) = replies.iter().find_map(|r| match r {
        redis::Value::ServerError(e) => Some(e),
        _ => None,
    }) {
        bail!("MULTI/EXEC: a command failed inside the transaction: {e:?}");
    }
    Ok(true)
}

/// What one transaction writes, produced chunk by chunk: every added or
/// changed document (MSET), deletions of keys no longer desired (DEL),
/// then the whole string of each manifest bucket that was read (they
/// differed: one `SET` per bucket, rendered from the desired state's
/// bucket index; `DEL` of the ones left empty), their digests, and the
/// meta with the manifest's digest. A format-1 or format-2 target first
/// loses its old manifest and gets all 256 buckets in format 3.
pub(crate) struct Body<'a> {
    entries: Box<dyn Iterator<Item = (&'a str, &'a str, &'a str)> + Send + 'a>,
    writes: Box<dyn Iterator<Item = &'a str> + Send + 'a>,
    next_write: Option<&'a str>,
    clear: bool,
    removed: std::slice::Chunks<'a, String>,
    /// Further keys to delete, as bytes (heal: unmanaged keys).
    deletes: Vec<Vec<u8>>,
    /// The buckets whose string is written, still to write.
    strings: std::vec::IntoIter<u8>,
    /// The buckets written that are left empty: deleted in one command.
    empty: Vec<String>,
    buckets: Option<Vec<u8>>,
    desired: &'a Desired,
    meta: Option<(&'a str, u64)>,
    /// The audit record written with the meta.
    history: Option<super::audit::Entry>,
    /// Bytes of keys and values in the last chunk given.
    last_bytes: usize,
}

impl<'a> Body<'a> {
    pub(crate) fn new(
        desired: &'a Desired,
        changes: &'a Changes,
        live: &Live,
        commit: &'a str,
        generation: u64,
    ) -> Body<'a> {
        // `added` and `changed` are disjoint and each in desired order:
        // merged, they are the desired keys to write, in order.
        let mut writes: Box<dyn Iterator<Item = &'a str> + Send + 'a> =
            Box::new(merge_sorted(&changes.added, &changes.changed));
        let next_write = writes.next();
        let buckets = if live.rewrites_manifest() {
            (0..=u8::MAX).collect()
        } else {
            live.read_buckets.clone()
        };
        Body {
            entries: Box::new(desired.iter()),
            writes,
            next_write,
            clear: live.rewrites_manifest(),
            removed: changes.removed.chunks(BATCH),
            deletes: Vec::new(),
            strings: buckets.clone().into_iter(),
            empty: Vec::new(),
            buckets: Some(buckets),
            desired,
            meta: Some((commit, generation)),
            history: None,
            last_bytes: 0,
        }
    }

    /// Without the meta: the body that targets writing the same thing
    /// share; each sends its own meta ([`set_meta`]) after it.
    pub(crate) fn without_meta(mut self) -> Body<'a> {
        self.meta = None;
        self
    }

    /// Bytes of keys and values in the last chunk [`Body::chunk`] gave.
    pub(crate) fn last_bytes(&self) -> usize {
        self.last_bytes
    }

    /// Also record `entry`: the meta's audit fields and one
    /// `edgeform:history` entry, in the same transaction.
    pub(crate) fn recording(mut self, entry: super::audit::Entry) -> Body<'a> {
        self.history = Some(entry);
        self
    }

    /// Also delete `keys` (before the meta is written).
    pub(crate) fn deleting(mut self, keys: Vec<Vec<u8>>) -> Body<'a> {
        self.deletes = keys;
        self
    }

    /// The next chunk of commands, `None` when all were given.
    pub(crate) fn chunk(&mut self) -> Option<redis::Pipeline> {
        let mut pipe = redis::pipe();
        let mut bytes = 0;
        if std::mem::take(&mut self.clear) {
            // Format 1's hash and the old digests; format 2's bucket
            // hashes are replaced by the SETs (or DEL) below.
            pipe.cmd("DEL")
                .arg(keys::MANIFEST)
                .arg(keys::MANIFEST_BUCKETS);
        }
        while bytes < CHUNK_BYTES {
            // The MSET's entries first, so that it is allocated at its
            // size: a chunk a shared body keeps holds what it counts
            // (bodies.rs's cap), not a reserve or a doubled buffer.
            let mut batch = Vec::with_capacity(BATCH);
            let mut size = "MSET".len();
            while batch.len() < BATCH && self.next_write.is_some() {
                let Some((key, value, _)) = self.entries.next() else {
                    self.next_write = None;
                    break;
                };
                if self.next_write == Some(key) {
                    batch.push((key, value));
                    size += key.len() + value.len();
                    self.next_write = self.writes.next();
                }
            }
            if !batch.is_empty() {
                let mut docs = redis::Cmd::with_capacity(2 * batch.len() + 1, size);
                docs.arg("MSET");
                for (key, value) in batch {
                    docs.arg(key).arg(value);
                }
                bytes += size;
                pipe.add_command(docs);
                continue;
            }
            if let Some(chunk) = self.removed.next() {
                pipe.cmd("DEL").arg(chunk);
                bytes += chunk.iter().map(String::len).sum::<usize>();
                continue;
            }
            if !self.deletes.is_empty() {
                let n = self.deletes.len().min(BATCH);
                let chunk: Vec<Vec<u8>> = self.deletes.drain(..n).collect();
                bytes += chunk.iter().map(Vec::len).sum::<usize>();
                pipe.cmd("DEL").arg(chunk);
                continue;
            }
            if let Some(b) = self.strings.next() {
                let string = self.desired.bucket_string(b);
                bytes += string.len();
                if string.is_empty() {
                    self.empty.push(keys::manifest_bucket(b));
                } else {
                    pipe.cmd("SET").arg(keys::manifest_bucket(b)).arg(string);
                }
                continue;
            }
            if !self.empty.is_empty() {
                pipe.cmd("DEL").arg(std::mem::take(&mut self.empty));
                continue;
            }
            if let Some(buckets) = self.buckets.take() {
                if !buckets.is_empty() {
                    let summary = self.desired.summary();
                    let mut c = redis::cmd("HSET");
                    c.arg(keys::MANIFEST_BUCKETS);
                    for b in buckets {
                        c.arg(format!("{b:02x}"))
                            .arg(summary.bucket_value(usize::from(b)));
                    }
                    pipe.add_command(c);
                }
                continue;
            }
            if let Some((commit, generation)) = self.meta.take() {
                set_meta(
                    &mut pipe,
                    commit,
                    generation,
                    self.desired,
                    self.history.as_ref(),
                );
            }
            break;
        }
        self.last_bytes = bytes;
        (!pipe.is_empty()).then_some(pipe)
    }
}

/// Two sorted, disjoint lists merged in order.
fn merge_sorted<'a>(a: &'a [String], b: &'a [String]) -> impl Iterator<Item = &'a str> + Send + 'a {
    let mut a = a.iter().map(String::as_str).peekable();
    let mut b = b.iter().map(String::as_str).peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y < x => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

/// Append the `edgeform:meta` update that ends every write transaction.
/// Its reply is the one kept: EXEC's nil (a WATCH conflict) then reads as
/// `None`, success as `Some`.
pub(crate) fn set_meta(
    pipe: &mut redis::Pipeline,
    commit: &str,
    generation: u64,
    desired: &Desired,
    history: Option<&super::audit::Entry>,
) {
    if let Some(entry) = history {
        // Before the meta: the meta's reply stays the last one.
        super::audit::record(pipe, entry);
        if super::audit::clears_wave(entry) {
            pipe.cmd("HDEL").arg(keys::META).arg("wave");
        }
    }
    let mut hset = redis::cmd("HSET");
    hset.arg(keys::META)
        .arg("commit")
        .arg(commit)
        .arg("generation")
        .arg(generation)
        .arg("applied_at")
        .arg(now_rfc3339())
        .arg("format")
        .arg(edgestate::FORMAT_VERSION)
        .arg("manifest_digest")
        .arg(desired.digest())
        .arg("managed")
        .arg(desired.len());
    if let Some(entry) = history {
        super::audit::meta_fields(&mut hset, entry);
    }
    pipe.add_command(hset);
}

/// The generation after `live`'s (`edgeform:meta` `generation`), or an
/// error when it cannot be raised (a value written by something else).
///
/// # Errors
/// `live` is `u64::MAX`.
pub(crate) fn next_generation(live: u64) -> Result<u64> {
    live.checked_add(1).ok_or_else(|| {
        anyhow::anyhow!(
            "edgeform:meta generation is {live}: it cannot be raised (written by something else than edgeform?); set it lower by hand"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn names(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn body_writes_changes_then_prunes_then_meta_in_chunks() {
        let sites: Vec<(Arc<str>, Arc<str>)> = (0..2500)
            .map(|i| {
                (
                    Arc::from(format!("site:s{i:05}")),
                    Arc::from("x".repeat(2100)),
                )
            })
            .collect();
        let desired = Desired::for_tests(sites, true);
        // Every other site changed, the routing table added, two to prune.
        let changes = Changes {
            added: vec![keys::ROUTING.to_owned()],
            changed: (0..2500)
                .step_by(2)
                .map(|i| format!("site:s{i:05}"))
                .collect(),
            removed: vec!["site:gone".into(), "suspended:gone".into()],
        };
        let live = Live {
            read_buckets: vec![1, 2],
            ..Live::default()
        };
        let mut body = Body::new(&desired, &changes, &live, "abc", 7);
        let mut cmds = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = body.chunk() {
            chunks += 1;
            cmds.extend(chunk.cmd_iter().map(names));
        }
        // 1,251 writes of ~2 KB each are more than one 2 MiB chunk.
        assert!(chunks >= 2, "{chunks} chunks");
        let written: Vec<&str> = cmds
            .iter()
            .filter(|c| c[0] == "MSET")
            .flat_map(|c| c[1..].chunks(2).map(|kv| kv[0].as_str()))
            .collect();
        let mut want: Vec<&str> = changes.changed.iter().map(String::as_str).collect();
        want.insert(0, keys::ROUTING);
        assert_eq!(written, want);
        // Each bucket read is written whole, as its string; nothing else
        // of the manifest is written.
        let strings: Vec<&Vec<String>> = cmds
            .iter()
            .filter(|c| c[1].starts_with("edgeform:manifest:") && c[1] != keys::MANIFEST_BUCKETS)
            .collect();
        assert_eq!(strings.len(), 2, "{strings:?}");
        for (c, b) in strings.iter().zip([1u8, 2]) {
            assert_eq!(c[0], "SET");
            assert_eq!(c[1], keys::manifest_bucket(b));
            assert_eq!(
                c[2].as_bytes(),
                desired.bucket_string(b).as_slice(),
                "bucket {b}"
            );
        }
        assert!(cmds.iter().all(|c| c.len() <= 2 * BATCH + 2));
        let n = cmds.len();
        let del = cmds.iter().position(|c| c[0] == "DEL").unwrap();
        assert_eq!(cmds[del], ["DEL", "site:gone", "suspended:gone"]);
        assert!(cmds[del + 1..n - 2].iter().all(|c| c[0] == "SET"));
        assert_eq!(
            cmds[n - 2],
            [
                "HSET".to_owned(),
                keys::MANIFEST_BUCKETS.to_owned(),
                "01".into(),
                desired.summary().bucket_value(1),
                "02".into(),
                desired.summary().bucket_value(2)
            ]
        );
        assert_eq!(cmds[n - 1][..2], ["HSET".to_owned(), keys::META.to_owned()]);
        assert!(body.chunk().is_none());
    }
}
