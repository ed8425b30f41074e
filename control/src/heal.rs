//! Heal: compare a target's live content with the desired state and
//! repair every difference — documents changed or deleted by hand, keys
//! nobody manages (`site:*`/`suspended:*`/`tls:*` written outside git: git
//! is the source of truth), a tampered manifest.
//!
//! The comparison runs inside the target's Redis: a Lua script,
//! called over bounded chunks of manifest entries (a bucket's string read
//! with GETRANGE under a budget of entries a call, a big bucket split
//! across calls at a record's byte offset), hashes each value the
//! manifest names and compares it with the manifest's hash, and recomputes
//! each bucket's digest to check it against `edgeform:manifest:buckets`;
//! the control host checks the chunks' combined digest against the meta
//! and the desired state. A second script counts the documents present
//! (SCAN inside Redis); only when the count is off are the keys listed.
//! A healthy target so costs a few hundred bytes, a drifted one its drift.
//! When the manifest does not describe the desired state, every value is
//! compared from here and the manifest rewritten.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use edgestate::keys;
use redis::aio::MultiplexedConnection;

use super::apply::{Body, Lock, Options, multi_exec};
use super::plan::Changes;
use super::state::{Desired, Live, Meta, hex128};

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
    pub key: String,
    pub kind: DriftKind,
}

/// Every `site:*` and `suspended:*` key on the target, as bytes (import
/// reads what is there, UTF-8 or not; never a certificate).
///
/// # Errors
/// Redis errors.
pub async fn document_keys(con: &mut MultiplexedConnection) -> Result<BTreeSet<Vec<u8>>> {
    keys_under(con, &[keys::SITE_PREFIX, keys::SUSPENDED_PREFIX], &mut 0).await
}

/// Every key on the target under one of `prefixes`, as bytes.
async fn keys_under(
    con: &mut MultiplexedConnection,
    prefixes: &[&str],
    bytes: &mut usize,
) -> Result<BTreeSet<Vec<u8>>> {
    let mut out = BTreeSet::new();
    for pattern in prefixes.iter().map(|p| format!("{p}*")) {
        let mut cursor: u64 = 0;
        loop {
            let reply: redis::Value = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(con)
                .await?;
            *bytes += resp_len(&reply);
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)?;
            out.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(out)
}

/// What one heal of one target found and cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Healed {
    /// The drift found and repaired (empty: healthy).
    pub drift: Vec<Drift>,
    /// Bytes of the replies read from the target (RESP size).
    pub bytes: usize,
    /// Server-side comparison calls (EVALSHA) made.
    pub calls: usize,
    /// The slowest of those calls, round trip included (and the wait
    /// behind the calls of the other chains on the same connection).
    pub slowest_call: std::time::Duration,
    /// The longest chain of those calls, made one after another: the
    /// round trips the heal waits for in turn (the calls run in chains
    /// at once, [`CHAINS`]).
    pub rounds: usize,
    /// What was compared, for the log: everything, or (the daemon's
    /// tracked heal) only the keys written since the last heal.
    #[serde(skip)]
    pub compared: String,
    /// Every managed key was compared (not only a [`Scope::Keys`] list).
    #[serde(skip)]
    pub everything: bool,
    /// The most manifest entries one comparison call covered (the
    /// per-call budget, [`per_call`], bounds it).
    pub largest_call: usize,
    /// Dry run: the refusal a real heal would give (then it would write
    /// nothing, drift or not).
    #[serde(skip)]
    pub refusal: Option<super::plan::Refusal>,
}

/// Compares the values the manifest names with their hashes inside Redis,
/// for at most ARGV[3] manifest entries (a bounded chunk), resuming the
/// walk over buckets ARGV[4] up to (not including) ARGV[8] at bucket
/// ARGV[4], byte offset ARGV[5] of its string (`0`: the bucket's start),
/// with ARGV[6]/ARGV[7] the digest (hex) and entry count of the part of
/// that bucket earlier calls covered. A bucket bigger than the budget is
/// so split across calls (at 1M sites a bucket holds ~7,000 entries); its
/// digest is checked against `edgeform:manifest:buckets` (ARGV[2]) by the
/// call that finishes it. Returns the keys that are missing, the keys
/// whose value differs from the manifest's hash (or is not a string), the
/// buckets whose stored digest does not describe their manifest (or whose
/// string is not whole records, or not a string), the XOR of the digests
/// of the buckets this call finished and their entry count, where to
/// resume (bucket, offset, running digest and count of that bucket) and
/// the entries this call covered.
///
/// The budget is kept exactly: the script reads the bucket's string in
/// windows of 16 KiB (`GETRANGE`), takes whole records up to what is left
/// of the budget, and the next window (or call) starts at the first
/// record not taken — a record cut at a window's end is read again. Redis
/// keeps no state: the offset travels in the reply and the next ARGV. A
/// string that is not whole records (cut short, garbage, a record longer
/// than a window), a bucket of another type, or a string that shrank
/// under the walk make the bucket bad, and heal compares everything; a
/// string rewritten under the walk misaligns the records, and its digest
/// then fails — never a false "healthy".
const COMPARE: &str = include_str!("lua/heal_compare.lua");

/// One SCAN step per document prefix inside Redis, each limited to its
/// prefix (`MATCH`): ARGV[1] is the COUNT of each, then one cursor per
/// prefix (`done` when that scan finished), then the patterns
/// ([`keys::DOCUMENT_PREFIXES`]). Returns the next cursors and how many
/// keys they found — a count, not the keys. Heal never scans outside its
/// prefixes (an ACL user's keys, docs/operations.md).
const COUNT: &str = include_str!("lua/heal_count.lua");

/// A [`COMPARE`] reply: missing keys, changed keys, bad buckets, the
/// digest and entry count of the buckets the call finished, where to
/// resume (bucket, byte offset, that bucket's running digest and count),
/// the entries the call covered.
type Compared = (
    Vec<Vec<u8>>,
    Vec<Vec<u8>>,
    Vec<i64>,
    String,
    usize,
    usize,
    usize,
    String,
    usize,
    usize,
);

/// Manifest entries compared per server-side call: a call hashes at most
/// this many values. 512: ~24.5 M redis-server instructions a call, 3.4–4.5 ms on this machine
/// (a whole 7,000-entry bucket, 1M sites: 343.5 M; `bench/heal_buckets.py
/// --callgrind`, bench/RESULTS.md).
const PER_CALL: usize = 512;

/// The per-call budget of [`COMPARE`]: [`PER_CALL`] entries, or
/// `EDGEFORM_TEST_HEAL_PER_CALL` (tests force small budgets so a bucket
/// is split across calls).
#[must_use]
pub fn per_call() -> usize {
    std::env::var("EDGEFORM_TEST_HEAL_PER_CALL")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(PER_CALL)
}

/// Approximate RESP size of a reply, to report the bytes a heal moved.
#[must_use]
pub fn resp_len(v: &redis::Value) -> usize {
    match v {
        redis::Value::BulkString(b) => b.len() + 5 + b.len().to_string().len(),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            4 + items.iter().map(resp_len).sum::<usize>()
        }
        redis::Value::Map(pairs) => {
            4 + pairs
                .iter()
                .map(|(k, v)| resp_len(k) + resp_len(v))
                .sum::<usize>()
        }
        redis::Value::SimpleString(s) => s.len() + 3,
        redis::Value::Int(i) => i.to_string().len() + 3,
        _ => 5,
    }
}

/// Compare and repair one target. Returns the drift found (empty: healthy)
/// and the bytes read.
///
/// # Errors
/// Lock timeout, Redis errors, repeated transaction conflicts.
pub async fn heal(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    ancestry: &super::gate::Relate<'_>,
) -> Result<Healed> {
    heal_scoped(con, desired, options, ancestry, Scope::Everything).await
}

/// What a heal compares.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Every managed key (the manifest's comparison inside Redis, or every
    /// value from here).
    Everything,
    /// Only these keys: the ones the target's Redis said were written
    /// since a comparison that found the target healthy (see
    /// [`super::track`]). Falls back to [`Scope::Everything`] when one of
    /// them is the meta or the manifest, or when the meta does not say the
    /// target holds the desired manifest.
    Keys(&'a [Vec<u8>]),
}

/// [`heal`] over `scope`.
///
/// # Errors
/// See [`heal`].
pub async fn heal_scoped(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    ancestry: &super::gate::Relate<'_>,
    scope: Scope<'_>,
) -> Result<Healed> {
    // A repair may rewrite the manifest: refuse a key it cannot record.
    desired.check_keys().map_err(anyhow::Error::new)?;
    if options.dry_run {
        // Reads only; no lock (taking one is a write).
        return heal_locked(con, desired, options, ancestry, scope).await;
    }
    let lock = Lock::acquire(con, options.lease, options.lock_wait, &options.metrics).await?;
    let result = heal_locked(con, desired, options, ancestry, scope).await;
    lock.release(con).await;
    result
}

async fn heal_locked(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    ancestry: &super::gate::Relate<'_>,
    scope: Scope<'_>,
) -> Result<Healed> {
    let mut healed = Healed::default();
    for _attempt in 0..5 {
        redis::cmd("WATCH")
            .arg(keys::MANIFEST)
            .arg(keys::MANIFEST_BUCKETS)
            .arg(keys::META)
            .exec_async(con)
            .await?;
        let reply: redis::Value = redis::pipe()
            .add_command(crate::state::hgetall_capped(
                keys::META,
                crate::state::EDGE_FIELD_MAX,
            ))
            .cmd("EXISTS")
            .arg(keys::MANIFEST)
            .query_async(con)
            .await
            .context("reading edgeform:meta")?;
        healed.bytes += resp_len(&reply);
        let (meta, old): (BTreeMap<String, String>, bool) = redis::from_redis_value(reply)?;
        let meta = Meta::from_hash(&meta);
        // Heal is repair, not rollout: moving the target to
        // another commit passes apply's checks first.
        if let Err(refusal) = gate(con, desired, options, &meta, ancestry).await? {
            if !options.dry_run {
                redis::cmd("UNWATCH").exec_async(con).await?;
                return Err(anyhow::Error::new(refusal));
            }
            healed.refusal = Some(refusal);
        }
        let keys_only = match scope {
            Scope::Keys(keys) => compare_keys(con, desired, &meta, old, keys, &mut healed).await?,
            Scope::Everything => None,
        };
        let (drift, body) = match keys_only {
            Some(found) => found,
            None => {
                healed.everything = true;
                compare(con, desired, &meta, old, &mut healed).await?
            }
        };
        if drift.is_empty() || options.dry_run {
            redis::cmd("UNWATCH").exec_async(con).await?;
            healed.drift = sorted(drift);
            return Ok(healed);
        }
        let (changes, deletes, rewrite) = body;
        let live = Live {
            legacy: rewrite,
            ..Live::default()
        };
        let generation = crate::apply::next_generation(meta.generation)?;
        let entry = options.entry(
            &ancestry(meta.commit.as_deref()),
            meta.commit.as_deref(),
            generation,
            changes.added.len(),
            changes.changed.len(),
            deletes.len(),
        );
        let body = Body::new(desired, &changes, &live, &options.commit, generation)
            .deleting(deletes)
            .recording(entry);
        if multi_exec(con, body).await? {
            healed.drift = sorted(drift);
            return Ok(healed);
        }
    }
    anyhow::bail!("the target kept changing under the heal (5 WATCH conflicts)")
}

/// The repair: documents to write (as `changed`), keys to delete, and
/// whether the manifest is rewritten whole.
pub type Repair = (Changes, Vec<Vec<u8>>, bool);

/// The comparison alone, no writes: the drift on a target whose meta is
/// `meta` (`old`: a format-1 `edgeform:manifest` exists) and the repair
/// that removes it (empty drift: healthy). Inside Redis when the meta says
/// the target holds the desired manifest; from here, every value, when
/// the manifest does not describe the desired state (tampered, stale, or
/// format 1) or turns out not to. Adds what it read and the calls it made
/// to `healed`. The caller decides what to do with the drift (repair it,
/// only report it, refuse).
///
/// # Errors
/// Redis errors.
pub async fn compare(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    meta: &Meta,
    old: bool,
    healed: &mut Healed,
) -> Result<(Vec<Drift>, Repair)> {
    if manifest_is_current(desired, meta, old)
        && let Some(found) = compare_in_redis(con, desired, healed).await?
    {
        return Ok(found);
    }
    compare_everything(con, desired, &mut healed.bytes).await
}

/// The comparison of `keys` alone (the keys written since the target was
/// last found healthy): each desired one read back and compared, each
/// document key nobody wants checked for existence. `None` when that is
/// not enough: the meta does not say the target holds the desired
/// manifest, or one of `keys` is the meta or part of the manifest.
async fn compare_keys(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    meta: &Meta,
    old: bool,
    keys: &[Vec<u8>],
    healed: &mut Healed,
) -> Result<Option<(Vec<Drift>, Repair)>> {
    if !keys_suffice(desired, meta, old, keys) {
        return Ok(None);
    }
    let (wanted, strays) = sort_out(desired, keys);
    let mut drift = read_back(con, &wanted, &mut healed.bytes, &mut healed.slowest_call).await?;
    let fixes: Vec<String> = drift.iter().map(|d| d.key.clone()).collect();
    let mut unmanaged = Vec::new();
    for chunk in strays.chunks(1000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("EXISTS").arg(*k);
        }
        let reply: redis::Value = pipe.query_async(con).await?;
        healed.bytes += resp_len(&reply);
        let found: Vec<bool> = redis::from_redis_value(reply)?;
        for (k, there) in chunk.iter().zip(found) {
            if there {
                drift.push(unmanaged_drift(k));
                unmanaged.push(k.to_vec());
            }
        }
    }
    let changes = Changes {
        changed: fixes,
        ..Changes::default()
    };
    Ok(Some((drift, (changes, unmanaged, false))))
}

/// Whether the target's manifest is the desired one by its meta: format 3
/// or later (a format-2 target's buckets are hashes: compared from here
/// and rewritten), no format-1 `edgeform:manifest` (`old`), and the meta's
/// manifest digest the desired state's. Only then is the comparison made
/// inside Redis, or limited to the keys written since the last heal.
fn manifest_is_current(desired: &Desired, meta: &Meta, old: bool) -> bool {
    !old && meta.format.is_some_and(|f| f >= 3)
        && meta.manifest_digest.as_deref() == Some(desired.digest())
}

/// Whether comparing `keys` alone is enough: the manifest is current and
/// none of them is the meta or part of the manifest (a write to those
/// calls for the whole comparison).
fn keys_suffice(desired: &Desired, meta: &Meta, old: bool, keys: &[Vec<u8>]) -> bool {
    let manifest = keys::MANIFEST.as_bytes();
    manifest_is_current(desired, meta, old)
        && !keys.iter().any(|k| {
            k.as_slice() == keys::META.as_bytes()
                || (k.starts_with(manifest)
                    && (k.len() == manifest.len() || k[manifest.len()] == b':'))
        })
}

/// Written keys sorted out (see [`sort_out`]): desired keys with their
/// values, and documents nobody wants.
type SortedOut<'a> = (Vec<(&'a [u8], &'a str)>, Vec<&'a [u8]>);

/// `keys` sorted out: the desired ones with their values, to read back,
/// and the documents nobody wants, to look for. Others are ignored.
fn sort_out<'a>(desired: &'a Desired, keys: &'a [Vec<u8>]) -> SortedOut<'a> {
    let mut wanted: Vec<(&[u8], &str)> = Vec::new();
    let mut strays: Vec<&[u8]> = Vec::new();
    for k in keys {
        match desired.value(k) {
            Some(v) => wanted.push((k, v)),
            None if is_document(k) => strays.push(k),
            None => {}
        }
    }
    (wanted, strays)
}

/// How a key read back differs from its desired value `wanted`: absent
/// from `MGET` is missing, unless the key `exists` (a key of another type:
/// changed); another value is changed; `None`: no drift.
fn value_drift(actual: Option<&[u8]>, exists: bool, wanted: &str) -> Option<DriftKind> {
    match actual {
        None if exists => Some(DriftKind::Changed),
        None => Some(DriftKind::Missing),
        Some(a) if a != wanted.as_bytes() => Some(DriftKind::Changed),
        Some(_) => None,
    }
}

/// Drift in report order: by kind, then key.
fn sorted(mut drift: Vec<Drift>) -> Vec<Drift> {
    drift.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
    drift
}

/// Reads `wanted` (key, desired value) back from the target, 1,000 keys a
/// call, and names each key whose value differs: missing, or changed — to
/// another value, or to a key of another type (`MGET` answers nil for it
/// too; `EXISTS` tells them apart, as the server-side comparison does).
/// Adds the bytes read to `bytes` and keeps the slowest call in `slowest`.
async fn read_back(
    con: &mut MultiplexedConnection,
    wanted: &[(&[u8], &str)],
    bytes: &mut usize,
    slowest: &mut std::time::Duration,
) -> Result<Vec<Drift>> {
    let mut drift = Vec::new();
    for chunk in wanted.chunks(1000) {
        let t = std::time::Instant::now();
        let mut mget = redis::cmd("MGET");
        for (k, _) in chunk {
            mget.arg(*k);
        }
        let reply: redis::Value = mget.query_async(con).await?;
        *slowest = (*slowest).max(t.elapsed());
        *bytes += resp_len(&reply);
        let values: Vec<Option<Vec<u8>>> = redis::from_redis_value(reply)?;
        let mut exists = redis::pipe();
        for (actual, (k, _)) in values.iter().zip(chunk) {
            if actual.is_none() {
                exists.cmd("EXISTS").arg(*k);
            }
        }
        let mut there: std::vec::IntoIter<bool> = if values.iter().any(Option::is_none) {
            let reply: redis::Value = exists.query_async(con).await?;
            *bytes += resp_len(&reply);
            redis::from_redis_value::<Vec<bool>>(reply)?.into_iter()
        } else {
            Vec::new().into_iter()
        };
        for (actual, (key, value)) in values.iter().zip(chunk) {
            let exists = actual.is_none() && there.next() == Some(true);
            let Some(kind) = value_drift(actual.as_deref(), exists, value) else {
                continue;
            };
            drift.push(Drift {
                key: String::from_utf8_lossy(key).into_owned(),
                kind,
            });
        }
    }
    Ok(drift)
}

/// The server-side comparison, for a target whose meta says it holds the
/// desired manifest. `None` when the manifest turns out not to match its
/// meta or the desired state (then everything is compared).
async fn compare_in_redis(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    healed: &mut Healed,
) -> Result<Option<(Vec<Drift>, Repair)>> {
    let budget = per_call();
    let counts: Arc<[usize]> = desired
        .summary()
        .buckets
        .iter()
        .map(|&(_, count)| usize::try_from(count).unwrap_or(usize::MAX))
        .collect();
    // CHAINS walks over disjoint bucket ranges, at once on this connection
    // (each call still bounded; Redis runs them one at a time), and the
    // document count beside them: the heal waits for the longest chain of
    // round trips, not for their sum (~3,750 calls a target at 1M
    // sites, each a WAN round trip). The first chain to find the manifest
    // wrong stops the others.
    let stop = Arc::new(AtomicBool::new(false));
    let mut walks = tokio::task::JoinSet::new();
    for i in 0..CHAINS {
        let range = keys::BUCKETS * i / CHAINS..keys::BUCKETS * (i + 1) / CHAINS;
        let (con, counts, stop) = (con.clone(), counts.clone(), stop.clone());
        let total = desired.len();
        walks.spawn(async move { walk(con, range, budget, &counts, total, &stop).await });
    }
    let counting = {
        let (mut con, stop) = (con.clone(), stop.clone());
        tokio::spawn(async move { count_documents(&mut con, budget, &stop).await })
    };
    let mut all = Walked::default();
    let mut whole = true;
    while let Some(walked) = walks.join_next().await {
        match walked.context("a comparison task failed")?? {
            Some(w) => {
                healed.rounds = healed.rounds.max(w.calls);
                all.add(w);
            }
            None => whole = false,
        }
    }
    let (present, counted) = counting.await.context("the count task failed")??;
    healed.rounds = healed.rounds.max(counted.calls);
    healed.calls += all.calls + counted.calls;
    healed.bytes += all.bytes + counted.bytes;
    healed.slowest_call = healed.slowest_call.max(all.slowest).max(counted.slowest);
    healed.largest_call = healed.largest_call.max(all.largest);
    let Walked {
        mut missing,
        mut changed,
        digest,
        entries,
        ..
    } = all;
    if !whole {
        return Ok(None);
    }
    // A string may name a key twice (then its digest is wrong, and the
    // walk does not describe the desired manifest): list each key once.
    for list in [&mut missing, &mut changed] {
        list.sort_unstable();
        list.dedup();
    }
    if !walk_describes(desired, entries, digest) {
        return Ok(None);
    }
    // The manifest is the desired one and describes the values; count the
    // documents present: the desired ones present plus any unmanaged.
    let mut unmanaged = Vec::new();
    if !documents_add_up(desired, &missing, present) {
        unmanaged = keys_under(con, &keys::DOCUMENT_PREFIXES, &mut healed.bytes)
            .await?
            .into_iter()
            .filter(|k| desired.value(k).is_none())
            .collect();
    }
    Ok(Some(in_redis_repair(&missing, &changed, unmanaged)))
}

/// Whether the chains' walk covered the desired manifest: as many entries,
/// and the same digest (XOR of the entries' digests).
fn walk_describes(desired: &Desired, entries: usize, digest: u128) -> bool {
    entries == desired.len() && hex128(digest) == desired.digest()
}

/// Whether `present` documents are what a target holding the desired
/// documents, less the `missing` ones, has: else some are unmanaged and
/// the keys are listed.
fn documents_add_up(desired: &Desired, missing: &[Vec<u8>], present: usize) -> bool {
    let desired_docs = desired
        .iter()
        .filter(|(k, _, _)| is_document(k.as_bytes()))
        .count();
    let missing_docs = missing.iter().filter(|k| is_document(k)).count();
    present == desired_docs.saturating_sub(missing_docs)
}

/// The drift and repair of a server-side comparison: `missing` and
/// `changed` keys are written again (each once), `unmanaged` ones deleted;
/// the manifest is kept.
fn in_redis_repair(
    missing: &[Vec<u8>],
    changed: &[Vec<u8>],
    unmanaged: Vec<Vec<u8>>,
) -> (Vec<Drift>, Repair) {
    let mut drift = Vec::new();
    let mut fixes = Vec::new();
    for (list, kind) in [(missing, DriftKind::Missing), (changed, DriftKind::Changed)] {
        for k in list {
            let key = String::from_utf8_lossy(k).into_owned();
            drift.push(Drift {
                key: key.clone(),
                kind,
            });
            fixes.push(key);
        }
    }
    drift.extend(unmanaged.iter().map(|k| unmanaged_drift(k)));
    fixes.sort_unstable();
    fixes.dedup();
    let changes = Changes {
        changed: fixes,
        ..Changes::default()
    };
    (drift, (changes, unmanaged, false))
}

/// Whether a key is a document heal looks for unmanaged copies of
/// (`site:*`, `suspended:*`, `tls:*`).
fn is_document(k: &[u8]) -> bool {
    keys::DOCUMENT_PREFIXES
        .iter()
        .any(|p| k.starts_with(p.as_bytes()))
}

/// The drift of a document key nobody manages. Written by hand: it may be
/// any bytes (`\xNN`), never raw control characters in a log.
fn unmanaged_drift(k: &[u8]) -> Drift {
    Drift {
        key: edgestate::untrusted::preview(k, k.len()),
        kind: DriftKind::Unmanaged,
    }
}

/// Chains of [`COMPARE`] calls a heal runs at once, each over its own
/// range of buckets.
const CHAINS: usize = 8;

/// What chains of server-side calls found and cost.
#[derive(Debug, Default)]
struct Walked {
    missing: Vec<Vec<u8>>,
    changed: Vec<Vec<u8>>,
    /// XOR of the digests of the buckets walked.
    digest: u128,
    /// Manifest entries walked.
    entries: usize,
    calls: usize,
    bytes: usize,
    slowest: std::time::Duration,
    largest: usize,
}

impl Walked {
    fn add(&mut self, other: Walked) {
        self.missing.extend(other.missing);
        self.changed.extend(other.changed);
        self.digest ^= other.digest;
        self.entries += other.entries;
        self.calls += other.calls;
        self.bytes += other.bytes;
        self.slowest = self.slowest.max(other.slowest);
        self.largest = self.largest.max(other.largest);
    }

    /// One call made: its round trip and reply.
    fn call(&mut self, started: std::time::Instant, reply: &redis::Value) {
        self.calls += 1;
        self.bytes += resp_len(reply);
        self.slowest = self.slowest.max(started.elapsed());
    }
}

/// [`COMPARE`] over the buckets in `range`, call after call (bucket,
/// byte offset and the running digest of a split bucket carried from one
/// to the next). `None` when the manifest cannot describe the desired
/// state (a bad bucket, a stuffed bucket, a reply that does not move on)
/// or another chain found so (`stop`, which this one sets in turn).
async fn walk(
    mut con: MultiplexedConnection,
    range: std::ops::Range<usize>,
    budget: usize,
    counts: &[usize],
    total: usize,
    stop: &AtomicBool,
) -> Result<Option<Walked>> {
    let compare = redis::Script::new(COMPARE);
    let prefix = format!("{}:", keys::MANIFEST);
    let mut walked = Walked::default();
    let mut bucket = range.start;
    let mut offset = 0usize;
    let mut carry = 0u128;
    let mut carried = 0usize;
    let give_up = || {
        stop.store(true, Ordering::Relaxed);
        Ok(None)
    };
    while bucket < range.end {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let t = std::time::Instant::now();
        let reply: redis::Value = compare
            .arg(&prefix)
            .arg(keys::MANIFEST_BUCKETS)
            .arg(budget)
            .arg(bucket)
            .arg(offset)
            .arg(hex128(carry))
            .arg(carried)
            .arg(range.end)
            .invoke_async(&mut con)
            .await
            .context("comparing values in Redis")?;
        walked.call(t, &reply);
        let (m, c, bad, digest, n, next, next_offset, running, running_n, done): Compared =
            redis::from_redis_value(reply)?;
        walked.largest = walked.largest.max(done);
        if !bad.is_empty() || !moves_on(bucket, offset, next, next_offset) {
            // A bad bucket, or a reply that does not move on.
            return give_up();
        }
        walked.digest ^= u128::from_str_radix(&digest, 16).context("a digest from Redis")?;
        walked.entries += n;
        walked.missing.extend(m);
        walked.changed.extend(c);
        bucket = next;
        offset = next_offset;
        carry = u128::from_str_radix(&running, 16).context("a digest from Redis")?;
        carried = running_n;
        // More entries in a bucket (or in all) than the desired manifest
        // has: it cannot describe it; stop hashing a stuffed bucket.
        if overfull(counts, bucket, carried, walked.entries, total) {
            return give_up();
        }
    }
    Ok(Some(walked))
}

/// Whether a [`COMPARE`] reply resuming at (`next`, `next_offset`) moves
/// on from the call made at (`bucket`, `offset`): a later bucket, or
/// further into the same one.
fn moves_on(bucket: usize, offset: usize, next: usize, next_offset: usize) -> bool {
    next > bucket || (next == bucket && next_offset > offset)
}

/// Whether the manifest holds more entries than the desired state has —
/// `carried` in the split `bucket` beyond its desired count, or `entries`
/// walked beyond the `total` — so it cannot describe it.
fn overfull(counts: &[usize], bucket: usize, carried: usize, entries: usize, total: usize) -> bool {
    carried > counts.get(bucket).copied().unwrap_or(0) || entries > total
}

/// The documents ([`keys::DOCUMENT_PREFIXES`]) present, counted inside
/// Redis ([`COUNT`], one SCAN step a call), and what counting cost. Stops
/// early (the count then meaningless, and unused) when `stop` is set.
async fn count_documents(
    con: &mut MultiplexedConnection,
    budget: usize,
    stop: &AtomicBool,
) -> Result<(usize, Walked)> {
    let count = redis::Script::new(COUNT);
    let mut cost = Walked::default();
    let mut present = 0usize;
    let patterns = keys::DOCUMENT_PREFIXES.map(|p| format!("{p}*"));
    let mut cursors = keys::DOCUMENT_PREFIXES.map(|_| "0".to_owned());
    while !stop.load(Ordering::Relaxed) {
        let t = std::time::Instant::now();
        let mut call = count.prepare_invoke();
        // Counting a key costs ~1/10 of comparing an entry
        // (bench/README.md): 8 keys per entry of the budget keep a call
        // under what a COMPARE call costs (split between the prefixes).
        call.arg((8 * budget / patterns.len()).max(1));
        call.arg(&cursors).arg(&patterns);
        let reply: redis::Value = call
            .invoke_async(con)
            .await
            .context("counting documents in Redis")?;
        cost.call(t, &reply);
        let (next, n) = counted(reply)?;
        present = present.saturating_add(n);
        if next.iter().all(|c| c == "done") {
            break;
        }
        cursors = next;
    }
    Ok((present, cost))
}

/// A [`COUNT`] reply: the `N` next cursors, then the keys found.
fn counted<const N: usize>(reply: redis::Value) -> Result<([String; N], usize)> {
    let wrong = || anyhow::anyhow!("the document count's reply has the wrong shape");
    let mut items: Vec<redis::Value> = redis::from_redis_value(reply)?;
    // An untrusted reply: a negative count is refused, not wrapped.
    let n: i64 = redis::from_redis_value(items.pop().ok_or_else(wrong)?)?;
    let n = usize::try_from(n).map_err(|_| wrong())?;
    let cursors: Vec<String> = items
        .into_iter()
        .map(redis::from_redis_value)
        .collect::<Result<_, _>>()?;
    Ok((cursors.try_into().map_err(|_| wrong())?, n))
}

/// The full comparison: every desired value read back (as bytes), every
/// document key listed. Used when the manifest cannot be trusted; the
/// repair rewrites it whole (reported as manifest drift).
async fn compare_everything(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    bytes: &mut usize,
) -> Result<(Vec<Drift>, Repair)> {
    let wanted: Vec<(&[u8], &str)> = desired.iter().map(|(k, v, _)| (k.as_bytes(), v)).collect();
    // The slowest call is reported for the server-side comparison only.
    let mut slowest = std::time::Duration::ZERO;
    let mut drift = read_back(con, &wanted, bytes, &mut slowest).await?;
    let fixes: Vec<String> = drift.iter().map(|d| d.key.clone()).collect();
    let unmanaged: Vec<Vec<u8>> = keys_under(con, &keys::DOCUMENT_PREFIXES, bytes)
        .await?
        .into_iter()
        .filter(|k| desired.value(k).is_none())
        .collect();
    drift.extend(unmanaged.iter().map(|k| unmanaged_drift(k)));
    drift.push(Drift {
        key: keys::MANIFEST.to_owned(),
        kind: DriftKind::Manifest,
    });
    let changes = Changes {
        changed: fixes,
        ..Changes::default()
    };
    Ok((drift, (changes, unmanaged, true)))
}

/// The gate before a heal writes: free when the target's
/// meta names the desired commit; otherwise the manifest is read as
/// `apply` reads it and [`super::gate::decide`] judges the move. Called
/// inside the heal's WATCH.
///
/// # Errors
/// Redis errors (a refusal is the inner `Err`).
async fn gate(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
    meta: &Meta,
    ancestry: &super::gate::Relate<'_>,
) -> Result<Result<super::gate::Move, super::plan::Refusal>> {
    if !super::gate::moving(meta.commit.as_deref(), &options.commit) {
        return Ok(Ok(super::gate::Move::Repair));
    }
    let live = super::apply::read_live(con, desired).await?;
    let changes = super::apply::live_changes(desired, &live);
    let a = ancestry(live.meta.commit.as_deref());
    Ok(super::gate::decide(options, desired, &live, &changes, a))
}

#[cfg(test)]
mod tests;
