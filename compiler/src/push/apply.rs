//! Writing one target: a lease lock, then one WATCH/MULTI/EXEC that writes
//! changed keys, deletes managed keys no longer desired (prune), and updates
//! `edgeform:manifest` and `edgeform:meta` together. A reader never sees
//! half an apply: the documents and the new generation appear at once.
//! The transaction's body is streamed in chunks (encoding the next while
//! the server queues the last), never encoded whole.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use edgestate::keys;
use redis::aio::MultiplexedConnection;
use tracing::Instrument as _;

pub use super::lock::Lock;
use super::plan::{self, Ancestry, Changes, Overrides};
use super::state::{Desired, Live, Manifest, Meta, now_rfc3339};
use crate::model::resolved::Thresholds;

/// Fields per HSET/MGET/DEL command inside a transaction or batch.
const BATCH: usize = 1000;

/// Read `edgeform:manifest` and `edgeform:meta`.
///
/// # Errors
/// Redis errors, or a manifest that is not a hash of UTF-8 strings.
pub async fn read_live(con: &mut MultiplexedConnection) -> Result<Live> {
    Ok(read_live_as(con, false).await?.0)
}

/// [`read_live`] for heal, which rewrites the manifest anyway: entries
/// that are not UTF-8 are left out, and the flag says whether there were
/// none (false: the manifest is drift).
///
/// # Errors
/// Redis errors.
pub async fn read_live_lenient(con: &mut MultiplexedConnection) -> Result<(Live, bool)> {
    read_live_as(con, true).await
}

async fn read_live_as(con: &mut MultiplexedConnection, lenient: bool) -> Result<(Live, bool)> {
    let (manifest, meta): (redis::Value, BTreeMap<String, String>) = redis::pipe()
        .cmd("HGETALL")
        .arg(keys::MANIFEST)
        .cmd("HGETALL")
        .arg(keys::META)
        .query_async(con)
        .await
        .context("reading edgeform:manifest and edgeform:meta")?;
    let (manifest, clean) = manifest_from(manifest, lenient)?;
    Ok((
        Live {
            manifest,
            meta: Meta::from_hash(&meta),
        },
        clean,
    ))
}

/// The no-op plan's fast check: is the live manifest exactly the desired
/// one? One MULTI/EXEC reads HLEN, the meta and HMGET of the desired keys:
/// half the reply of HGETALL and nothing to index. Returns the meta, and
/// whether live is in sync (when not, read the whole manifest to see how).
///
/// # Errors
/// Redis errors.
pub async fn read_if_in_sync(
    con: &mut MultiplexedConnection,
    desired: &Desired,
) -> Result<(Meta, bool)> {
    let mut hmget = redis::Cmd::with_capacity(desired.len() + 2, 40 * desired.len());
    hmget.arg("HMGET").arg(keys::MANIFEST);
    for (key, _, _) in desired.iter() {
        hmget.arg(key);
    }
    let (managed, meta, hashes): (usize, BTreeMap<String, String>, redis::Value) = redis::pipe()
        .atomic()
        .cmd("HLEN")
        .arg(keys::MANIFEST)
        .cmd("HGETALL")
        .arg(keys::META)
        .add_command(hmget)
        .query_async(con)
        .await
        .context("reading edgeform:manifest and edgeform:meta")?;
    let hashes = match hashes {
        redis::Value::Array(items) => items,
        other => bail!("HMGET {} answered {other:?}", keys::MANIFEST),
    };
    let live = hashes.iter().map(|v| match v {
        redis::Value::BulkString(b) => Some(b.as_slice()),
        _ => None,
    });
    let in_sync = plan::in_sync(desired, managed, live);
    Ok((Meta::from_hash(&meta), in_sync))
}

/// HGETALL's reply as a [`Manifest`], taking the reply's strings over
/// without copying them. With `lenient`, non-UTF-8 entries are skipped
/// (the flag returned is false) instead of failing.
fn manifest_from(reply: redis::Value, lenient: bool) -> Result<(Manifest, bool)> {
    let items = match reply {
        redis::Value::Array(items) => items,
        redis::Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        redis::Value::Nil => Vec::new(),
        other => bail!("{} is not a hash: {other:?}", keys::MANIFEST),
    };
    let text = |v: redis::Value| -> Result<Option<String>> {
        match v {
            redis::Value::BulkString(b) => match String::from_utf8(b) {
                Ok(s) => Ok(Some(s)),
                Err(_) if lenient => Ok(None),
                Err(e) => {
                    Err(e).with_context(|| format!("{} holds a non-UTF-8 string", keys::MANIFEST))
                }
            },
            other => bail!("{} holds {other:?}", keys::MANIFEST),
        }
    };
    let mut manifest = Manifest::with_capacity(items.len() / 2);
    let mut clean = true;
    let mut items = items.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        match (text(k)?, text(v)?) {
            (Some(k), Some(v)) => {
                manifest.insert(k, v);
            }
            _ => clean = false,
        }
    }
    Ok((manifest, clean))
}

/// Values of `keys` as bytes (None where absent), in batches: for heal
/// and import, which must read what is there, UTF-8 or not.
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
        let values: Vec<Option<String>> = redis::cmd("MGET").arg(chunk).query_async(con).await?;
        out.extend(values);
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
    hold_for_tests().await;
    let result = transaction(con, desired, options, expect, ancestry).await;
    lock.release(con).await;
    result
}

/// `EDGEFORM_TEST_HOLD_LOCK_MS`: hold the lock this long before writing,
/// so a test can kill an apply that holds it (#12 item 12). Unset in
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
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Outcome> {
    for _attempt in 0..5 {
        redis::cmd("WATCH")
            .arg(keys::MANIFEST)
            .arg(keys::META)
            .exec_async(con)
            .await?;
        let live = read_live(con)
            .instrument(tracing::info_span!("read_live"))
            .await?;
        let checked = tracing::info_span!("check")
            .in_scope(|| check(desired, &live, options, expect, ancestry));
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
        let body = Body::new(desired, &changes, &options.commit, generation);
        let done = multi_exec(con, body)
            .instrument(tracing::info_span!("multi_exec"))
            .await?;
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
    ancestry: &(dyn Fn(Option<&str>) -> Ancestry + Send + Sync),
) -> Result<Changes> {
    let changes = plan::changes(desired, &live.manifest);
    if let Some(e) = expect {
        // Without changes live holds exactly the desired manifest, whose
        // digest is known; otherwise the live one is sorted and hashed.
        let digest = if changes.is_empty() {
            desired.digest().to_owned()
        } else {
            live.digest()
        };
        if e.generation != live.meta.generation || e.manifest_digest != digest {
            bail!(
                "stale plan: the target moved since it was planned (generation {} then, {} now); plan again",
                e.generation,
                live.meta.generation
            );
        }
    }
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
pub(crate) async fn multi_exec(
    con: &mut MultiplexedConnection,
    mut body: Body<'_>,
) -> Result<bool> {
    redis::cmd("MULTI").exec_async(con).await?;
    let mut next = body.chunk();
    while let Some(chunk) = next.take() {
        let (sent, following) =
            tokio::join!(con.send_packed_commands(&chunk, 0, chunk.len()), async {
                body.chunk()
            });
        let refused = match sent {
            Ok(replies) => replies.into_iter().find_map(|r| match r {
                redis::Value::SimpleString(s) if s == "QUEUED" => None,
                redis::Value::Okay => None,
                other => Some(anyhow::anyhow!(
                    "the server refused a queued command: {other:?}"
                )),
            }),
            Err(e) => Some(anyhow::Error::from(e)),
        };
        if let Some(e) = refused {
            let _: Result<(), _> = redis::cmd("DISCARD").exec_async(con).await;
            return Err(e.context("MULTI/EXEC (discarded)"));
        }
        next = following;
    }
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
/// changed document (MSET) with its manifest field (HSET), deletions of
/// keys no longer desired (DEL, HDEL), then the meta.
pub(crate) struct Body<'a> {
    entries: Box<dyn Iterator<Item = (&'a str, &'a str, &'a str)> + Send + 'a>,
    writes: Box<dyn Iterator<Item = &'a str> + Send + 'a>,
    next_write: Option<&'a str>,
    removed: std::slice::Chunks<'a, String>,
    meta: Option<(&'a str, u64)>,
}

impl<'a> Body<'a> {
    pub(crate) fn new(
        desired: &'a Desired,
        changes: &'a Changes,
        commit: &'a str,
        generation: u64,
    ) -> Body<'a> {
        // `added` and `changed` are disjoint and each in desired order:
        // merged, they are the desired keys to write, in order.
        let mut writes: Box<dyn Iterator<Item = &'a str> + Send + 'a> =
            Box::new(merge_sorted(&changes.added, &changes.changed));
        let next_write = writes.next();
        Body {
            entries: Box::new(desired.iter()),
            writes,
            next_write,
            removed: changes.removed.chunks(BATCH),
            meta: Some((commit, generation)),
        }
    }

    /// The next chunk of commands, `None` when all were given.
    pub(crate) fn chunk(&mut self) -> Option<redis::Pipeline> {
        let mut pipe = redis::pipe();
        let mut bytes = 0;
        while bytes < CHUNK_BYTES {
            let mut docs = redis::Cmd::with_capacity(2 * BATCH + 1, 1 << 20);
            docs.arg("MSET");
            let mut fields = redis::Cmd::with_capacity(2 * BATCH + 2, 64 * BATCH);
            fields.arg("HSET").arg(keys::MANIFEST);
            let mut n = 0;
            while n < BATCH {
                let Some(want) = self.next_write else { break };
                let Some((key, value, hash)) = self.entries.next() else {
                    self.next_write = None;
                    break;
                };
                if key != want {
                    continue;
                }
                docs.arg(key).arg(value);
                fields.arg(key).arg(hash);
                bytes += 2 * key.len() + value.len() + hash.len();
                n += 1;
                self.next_write = self.writes.next();
            }
            if n > 0 {
                pipe.add_command(docs).add_command(fields);
                continue;
            }
            if let Some(chunk) = self.removed.next() {
                pipe.cmd("DEL").arg(chunk);
                pipe.cmd("HDEL").arg(keys::MANIFEST).arg(chunk);
                bytes += chunk.iter().map(|k| 2 * k.len()).sum::<usize>();
                continue;
            }
            if let Some((commit, generation)) = self.meta.take() {
                set_meta(&mut pipe, commit, generation);
            }
            break;
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::push::state::content_hash;

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
        let hashes = sites.iter().map(|(_, v)| content_hash(v)).collect();
        let desired = Desired {
            node: "e".into(),
            is_edge: true,
            routing: "{}".into(),
            routing_hash: content_hash("{}"),
            sites: Arc::new(sites),
            site_hashes: Arc::new(hashes),
            digest: Arc::default(),
        };
        // Every other site changed, the routing table added, two to prune.
        let changes = Changes {
            added: vec![keys::ROUTING.to_owned()],
            changed: (0..2500)
                .step_by(2)
                .map(|i| format!("site:s{i:05}"))
                .collect(),
            removed: vec!["site:gone".into(), "suspended:gone".into()],
        };
        let mut body = Body::new(&desired, &changes, "abc", 7);
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
        let fields: Vec<&str> = cmds
            .iter()
            .filter(|c| c[0] == "HSET" && c[1] == keys::MANIFEST)
            .flat_map(|c| c[2..].chunks(2).map(|kv| kv[0].as_str()))
            .collect();
        assert_eq!(fields, want);
        assert!(cmds.iter().all(|c| c.len() <= 2 * BATCH + 2));
        let n = cmds.len();
        assert_eq!(cmds[n - 3], ["DEL", "site:gone", "suspended:gone"]);
        assert_eq!(
            cmds[n - 2],
            ["HDEL", keys::MANIFEST, "site:gone", "suspended:gone"]
        );
        assert_eq!(cmds[n - 1][..2], ["HSET".to_owned(), keys::META.to_owned()]);
        assert!(body.chunk().is_none());
    }
}
