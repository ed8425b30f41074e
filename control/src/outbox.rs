//! The purge outbox: a job that could not be queued on a node's Redis is
//! kept in the state store (`Store::set_outbox`: in the state directory
//! `<state>/outbox/<node>/<sequence>-<id>`, one fsync'd file per job,
//! written atomically; in a shared store one hash field per job), in order, and delivered by `edgeform purge --flush`
//! and the reconcile daemon when the node's Redis answers.
//!
//! Delivery is in order and stops at the first failure, so an older job
//! kept here reaches the queue before a newer one. The one exception: a
//! job tracked because no replica confirmed it (`track`), lost in a
//! failover and queued again, lands after the jobs queued meanwhile
//! (purges are idempotent). A delivered job stays in
//! the outbox until the node records `cdn:purge:done:<id>`; one that is in
//! neither the queue, the processing list nor the record (the node's
//! Redis restarted without persistence) is queued again. The agent runs an
//! id it already recorded no second time, so a re-delivery is harmless.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use compiler::model::resolved::Node;
use edgestate::purge;
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError, valid_node};

/// One kept job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// The job id (`cdn:purge:done:<id>` is its record).
    pub id: String,
    /// The job as queued (JSON text).
    pub job: String,
    /// When it was kept (Unix seconds).
    pub spooled_at: u64,
    /// When it was last queued on the node (Unix seconds), if ever.
    #[serde(default)]
    pub delivered_at: Option<u64>,
    /// Its file name (the order), not stored.
    #[serde(skip)]
    pub file: String,
}

impl Entry {
    /// An entry from its stored text, when it is what `edgeform purge`
    /// keeps: an entry whose job the agent reads and carries the entry's
    /// own id (its done record is looked up by that id). Anything else is
    /// never delivered (a store that is not ours may hold anything).
    ///
    /// # Errors
    /// Why not (never the job's content).
    pub fn read(text: &str) -> Result<Entry, String> {
        let e: Entry =
            serde_json::from_str(text).map_err(|e| format!("not an outbox entry: {e}"))?;
        match edgestate::purge::Job::parse_bytes(e.job.as_bytes()) {
            Ok(j) if j.id.as_deref() == Some(e.id.as_str()) => Ok(e),
            Ok(_) => Err("its job carries another id".to_owned()),
            Err(why) => Err(why),
        }
    }
}

/// What one node's outbox holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Depth {
    /// Jobs kept and never queued, or lost and waiting to be queued again.
    pub waiting: usize,
    /// Jobs queued on the node, not yet recorded done there.
    pub delivered: usize,
    /// When the oldest job was kept (Unix seconds).
    pub oldest: Option<u64>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether `id` can be part of a file name (the ids `purge` makes).
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Keep `job` (id `id`) for `node`, after every job already kept for it.
///
/// # Errors
/// A bad node name or id, the store not writable.
pub fn spool(store: &dyn Store, node: &str, id: &str, job: &str) -> Result<(), StoreError> {
    keep(store, node, id, job, None)
}

/// Track `job`, queued on `node`'s master but confirmed by no replica,
/// as delivered: the flush drops it once the node records it and queues
/// it again if the node lost it (a failover to a replica that never had
/// it). Newer jobs are not held behind it.
///
/// # Errors
/// As [`spool`].
pub fn track(store: &dyn Store, node: &str, id: &str, job: &str) -> Result<(), StoreError> {
    keep(store, node, id, job, Some(now()))
}

/// Stop tracking job `id` for `node` (its record was read): the entries of
/// that id are removed. Returns how many.
///
/// # Errors
/// The store unreadable or not writable.
pub fn forget(store: &dyn Store, node: &str, id: &str) -> Result<usize, StoreError> {
    let mut n = 0;
    for e in entries(store, node)?.iter().filter(|e| e.id == id) {
        remove(store, node, e)?;
        n += 1;
    }
    Ok(n)
}

fn keep(
    store: &dyn Store,
    node: &str,
    id: &str,
    job: &str,
    delivered_at: Option<u64>,
) -> Result<(), StoreError> {
    if !valid_id(id) {
        return Err(StoreError::NodeName(format!("job id {id}")));
    }
    if !valid_node(node) {
        return Err(StoreError::NodeName(node.to_owned()));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // After the last kept one even if the clock went back.
    let last = entries(store, node)?
        .last()
        .and_then(|e| e.file.split('-').next()?.parse::<u128>().ok())
        .unwrap_or(0);
    // A stored name at u128::MAX (only a hand-made one) is not followed.
    let seq = nanos.max(last.saturating_add(1));
    let entry = Entry {
        id: id.to_owned(),
        job: job.to_owned(),
        spooled_at: now(),
        delivered_at,
        file: String::new(),
    };
    let text = serde_json::to_string(&entry).unwrap_or_default();
    let name = format!("{seq:039}-{id}");
    // Never kept where it could not be read back (and delivered).
    if text.len() > crate::store::MAX_OUTBOX_ENTRY_BYTES {
        return Err(StoreError::TooLarge {
            path: std::path::PathBuf::from(format!("outbox/{node}/{name}")),
            cap: crate::store::MAX_OUTBOX_ENTRY_BYTES,
        });
    }
    store.set_outbox(node, &name, &text)
}

/// `node`'s kept jobs, oldest first. An entry [`Entry::read`] refuses is
/// skipped (and stays for an operator to see).
///
/// # Errors
/// The folder unsafe or unreadable.
pub fn entries(store: &dyn Store, node: &str) -> Result<Vec<Entry>, StoreError> {
    let mut out = Vec::new();
    for (name, text) in store.outbox(node)? {
        match Entry::read(&text) {
            Ok(mut e) => {
                e.file = name;
                out.push(e);
            }
            Err(why) => tracing::warn!(
                node,
                entry = %edgestate::untrusted::escape(&name),
                bytes = text.len(),
                cause = %why,
                "purge outbox: an entry edgeform would not deliver is skipped (it stays kept for an operator to see)"
            ),
        }
    }
    Ok(out)
}

/// Every node's outbox that holds something.
///
/// # Errors
/// The store unreadable.
pub fn depths(store: &dyn Store) -> Result<BTreeMap<String, Depth>, StoreError> {
    let mut out = BTreeMap::new();
    for node in store.outbox_nodes()? {
        let all = entries(store, &node)?;
        if all.is_empty() {
            continue;
        }
        let delivered = all.iter().filter(|e| e.delivered_at.is_some()).count();
        out.insert(
            node,
            Depth {
                waiting: all.len() - delivered,
                delivered,
                oldest: all.iter().map(|e| e.spooled_at).min(),
            },
        );
    }
    Ok(out)
}

fn rewrite(store: &dyn Store, node: &str, e: &Entry) -> Result<(), StoreError> {
    let text = serde_json::to_string(e).unwrap_or_default();
    store.set_outbox(node, &e.file, &text)
}

fn remove(store: &dyn Store, node: &str, e: &Entry) -> Result<(), StoreError> {
    store.remove_outbox(node, &e.file)
}

/// What one flush of a node did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Queued now for the first time.
    pub queued: usize,
    /// Queued again: the node's Redis had lost them.
    pub requeued: usize,
    /// Recorded done by the node, taken out of the outbox.
    pub done: usize,
    /// Still kept (queued and not done yet, or not delivered).
    pub left: usize,
    /// Jobs not delivered (the node's Redis did not answer).
    pub waiting: usize,
}

/// Deliver `node`'s outbox, in order: a job recorded done leaves it, a job
/// on the node's queue or processing list stays tracked, any other job is
/// queued (again). Nothing is delivered after a failure.
///
/// # Errors
/// The node's Redis does not answer (or is not a master), the store
/// cannot be written; the jobs stay kept.
pub async fn flush(store: &dyn Store, node: &Node) -> Result<Flushed> {
    let all = entries(store, &node.name)?;
    let mut out = Flushed::default();
    if all.is_empty() {
        return Ok(out);
    }
    let redis = node
        .redis
        .as_ref()
        .with_context(|| format!("node {} has no redis block", node.name))?;
    let queue = edgestate::keys::purge_queue(&node.region, &node.name);
    let processing = purge::processing_key(&queue);
    let mut con = match edgeredis::master(redis, &node.name).await {
        Ok(c) => c,
        Err(e) => {
            return Err(e.context(format!("{} jobs kept for {}", all.len(), node.name)));
        }
    };
    // One snapshot (MULTI: the agent moves a job from the queue to the
    // processing list and records it atomically): the queue, the
    // processing list and each job's record. Commands of the documented
    // control ACL only (LRANGE, HGET).
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("LRANGE")
        .arg(&queue)
        .arg(0)
        .arg(-1)
        .cmd("LRANGE")
        .arg(&processing)
        .arg(0)
        .arg(-1);
    for e in &all {
        pipe.cmd("HGET").arg(purge::done_key(&e.id)).arg(&node.name);
    }
    let snapshot: Vec<redis::Value> = pipe
        .query_async(&mut con)
        .await
        .with_context(|| format!("reading the purge queue of {}", node.name))?;
    let list = |v: Option<&redis::Value>| -> Vec<String> {
        v.and_then(|v| redis::from_redis_value::<Vec<String>>(v.clone()).ok())
            .unwrap_or_default()
    };
    let on_node: std::collections::HashSet<String> = list(snapshot.first())
        .into_iter()
        .chain(list(snapshot.get(1)))
        .collect();
    for (i, mut e) in all.into_iter().enumerate() {
        let done = matches!(snapshot.get(i + 2), Some(v) if !matches!(v, redis::Value::Nil));
        if done {
            remove(store, &node.name, &e)?;
            out.done += 1;
            continue;
        }
        if on_node.contains(&e.job) {
            // Found there though not marked delivered (the run that queued
            // it stopped before marking it, or its reply was lost): marked
            // now, so newer jobs for this node are no longer kept behind it.
            if e.delivered_at.is_none() {
                e.delivered_at = Some(now());
                rewrite(store, &node.name, &e)?;
            }
            out.left += 1;
            continue;
        }
        redis::cmd("RPUSH")
            .arg(&queue)
            .arg(&e.job)
            .exec_async(&mut con)
            .await
            .with_context(|| format!("queueing purge {} on {}", e.id, node.name))?;
        if e.delivered_at.is_some() {
            out.requeued += 1;
        } else {
            out.queued += 1;
        }
        e.delivered_at = Some(now());
        rewrite(store, &node.name, &e)?;
        out.left += 1;
    }
    Ok(out)
}

/// Whether `node` has kept jobs that are not on its queue yet (a newer job
/// must then be kept behind them, not queued first).
///
/// # Errors
/// The store unreadable.
pub fn has_waiting(store: &dyn Store, node: &str) -> Result<bool, StoreError> {
    Ok(entries(store, node)?
        .iter()
        .any(|e| e.delivered_at.is_none()))
}

/// How long one node's flush may take: a Redis that took the connection
/// and answers nothing holds no other node's delivery (nor the daemon's
/// sync) for longer. A job whose write landed meanwhile is found on the
/// node by the next flush, not queued twice.
pub const FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// [`flush`] within [`FLUSH_DEADLINE`].
///
/// # Errors
/// As [`flush`]; no answer within the deadline.
pub async fn flush_within(store: &dyn Store, node: &Node) -> Result<Flushed> {
    match tokio::time::timeout(FLUSH_DEADLINE, flush(store, node)).await {
        Ok(r) => r,
        Err(_) => Err(anyhow::anyhow!(
            "no answer from {}'s Redis in {} s; its jobs stay kept",
            node.name,
            FLUSH_DEADLINE.as_secs()
        )),
    }
}

/// What [`flush_all`] does with jobs kept for a node `nodes` lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// Dropped, each logged (the daemon: its repository removed the node).
    Drop,
    /// Left kept (`purge --flush`: the repository given may be the wrong
    /// one; nothing an operator types drops a purge).
    Keep,
}

/// Flush every node of `nodes` that has kept jobs; a node whose Redis does
/// not answer within [`FLUSH_DEADLINE`] is logged and skipped (the next
/// call retries).
pub async fn flush_all(
    store: &dyn Store,
    nodes: &[Node],
    unknown: Unknown,
) -> BTreeMap<String, Result<Flushed>> {
    let mut out = BTreeMap::new();
    if unknown == Unknown::Drop {
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        drop_removed(store, &names);
    }
    let Ok(kept) = depths(store) else {
        return out;
    };
    for node in nodes.iter().filter(|n| kept.contains_key(&n.name)) {
        let r = flush_within(store, node)
            .await
            .map_err(|e| edgeredis::with_refusal(&node.name, e));
        match &r {
            Ok(f) => tracing::info!(
                node = %node.name,
                queued = f.queued,
                requeued = f.requeued,
                done = f.done,
                left = f.left,
                "purge outbox flushed"
            ),
            Err(e) => {
                tracing::warn!(node = %node.name, error = %edgeredis::one_line(e), "purge outbox kept")
            }
        }
        out.insert(node.name.clone(), r);
    }
    out
}

/// Drop the jobs kept for nodes no longer in the repository (`known`):
/// nothing can deliver them, and they would hold the outbox metric and
/// its alert up forever. Each dropped job is logged (node and id).
/// Returns how many were dropped per node.
pub fn drop_removed(store: &dyn Store, known: &[&str]) -> BTreeMap<String, usize> {
    let mut dropped = BTreeMap::new();
    let Ok(kept) = depths(store) else {
        return dropped;
    };
    for node in kept.keys().filter(|n| !known.contains(&n.as_str())) {
        let Ok(all) = entries(store, node) else {
            continue;
        };
        let mut n = 0;
        for e in &all {
            match remove(store, node, e) {
                Ok(()) => {
                    tracing::warn!(%node, id = %e.id, "purge outbox: job dropped, the node is no longer in the repository");
                    n += 1;
                }
                Err(x) => {
                    tracing::warn!(%node, id = %e.id, error = %x, "purge outbox: job of a removed node not dropped")
                }
            }
        }
        dropped.insert(node.clone(), n);
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DirStore;

    /// A job as `edgeform purge` spools it: its own id, one key.
    fn job(id: &str) -> String {
        format!(r#"{{"id":"{id}","key":"k"}}"#)
    }

    #[test]
    fn jobs_of_a_node_no_longer_in_the_repository_are_dropped() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        spool(&s, "edge-1", "a-1", &job("a-1")).unwrap();
        spool(&s, "gone-1", "b-1", &job("b-1")).unwrap();
        spool(&s, "gone-1", "b-2", &job("b-2")).unwrap();
        let dropped = drop_removed(&s, &["edge-1", "edge-2"]);
        assert_eq!(dropped, BTreeMap::from([("gone-1".to_owned(), 2)]));
        let left = depths(&s).unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), ["edge-1"]);
        assert!(drop_removed(&s, &["edge-1"]).is_empty());
    }

    #[test]
    fn the_largest_job_of_escaped_characters_is_kept_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        // A job at the agent's limit whose text is all `\"`: kept as a JSON
        // string, each character is escaped again.
        let body = "\\\"".repeat((purge::MAX_JOB_BYTES - 32) / 2);
        let job = format!("{{\"id\":\"a-1\",\"grep\":\"{body}\"}}");
        assert!(job.len() <= purge::MAX_JOB_BYTES);
        spool(&s, "edge-1", "a-1", &job).unwrap();
        let e = entries(&s, "edge-1").unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].job, job);
    }

    #[test]
    fn a_tracked_job_counts_as_delivered_holds_nothing_back_and_is_forgotten_by_id() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        track(&s, "edge-1", "a-1", &job("a-1")).unwrap();
        assert!(!has_waiting(&s, "edge-1").unwrap());
        let depth = depths(&s).unwrap();
        assert_eq!((depth["edge-1"].waiting, depth["edge-1"].delivered), (0, 1));
        spool(&s, "edge-1", "b-2", &job("b-2")).unwrap();
        assert!(has_waiting(&s, "edge-1").unwrap());
        assert_eq!(forget(&s, "edge-1", "a-1").unwrap(), 1);
        assert_eq!(forget(&s, "edge-1", "a-1").unwrap(), 0);
        let left = entries(&s, "edge-1").unwrap();
        assert_eq!(
            left.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["b-2"]
        );
        assert!(track(&s, "../x", "a", "{}").is_err());
    }

    #[test]
    fn kept_jobs_come_back_in_order_with_private_files() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        for id in ["b-1", "a-2", "c-3"] {
            spool(&s, "edge-1", id, &job(id)).unwrap();
        }
        let e = entries(&s, "edge-1").unwrap();
        assert_eq!(
            e.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["b-1", "a-2", "c-3"]
        );
        let mode = std::fs::metadata(d.path().join("state/outbox/edge-1").join(&e[0].file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let depth = depths(&s).unwrap();
        assert_eq!(depth["edge-1"].waiting, 3);
        assert!(spool(&s, "../x", "a", "{}").is_err());
        assert!(spool(&s, "edge-1", "../a", "{}").is_err());
    }
}
