//! The tracked heal: the reconcile daemon keeps, per target, one
//! RESP3 connection with `CLIENT TRACKING on BCAST` over the managed
//! prefixes, so the target's Redis itself tells the daemon every managed
//! key written (by anyone: a hand edit, a restore, our own apply). A heal
//! then compares only the keys written since the target was last found
//! healthy, and a target where nothing was written costs one `PING`.
//!
//! Everything is compared again (inside Redis, see [`super::heal`]) when
//! the tracking connection is new or was lost (Redis restarted, failover,
//! network), when Redis flushed a database, when more keys were written
//! than [`MAX_DIRTY`], when the desired state or commit changed, when the
//! meta or the manifest was written, and every `full_every` heals as a
//! backstop. A `--once` heal has no history and always compares
//! everything.
//!
//! Why no write can be missed: tracking is switched on before the first
//! full comparison starts, so every write after it is reported. Redis
//! queues the invalidation on our connection before the writer's reply
//! leaves (both in the same `beforeSleep`, invalidations first), and the
//! `PING` a heal sends first on the same connection is answered after
//! every push queued before it: after the `PING`'s reply, every write
//! acknowledged before the heal began is in the dirty set (a write racing
//! the `PING` is in the next heal's). A lost connection (also a dropped
//! push: Redis closes a connection whose output buffer overflows) makes
//! the next heal a full one.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use edgestate::keys;
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};

use compiler::model::resolved::Node;

/// Keys written beyond this many between two heals: compare everything
/// (the comparison inside Redis costs less than reading them all back).
pub const MAX_DIRTY: usize = 10_000;

/// The prefixes Redis reports writes under (BCAST mode): the documents,
/// and the meta, manifest and routing table under `edgeform:`.
const PREFIXES: [&str; 4] = [
    keys::SITE_PREFIX,
    keys::SUSPENDED_PREFIX,
    keys::TLS_PREFIX,
    "edgeform:",
];

/// Written under `edgeform:` by every apply and heal, but not state:
/// ignored (else each heal's own lock would make the next one look).
fn ignored(key: &[u8]) -> bool {
    key == keys::LOCK.as_bytes()
        || key == keys::HISTORY.as_bytes()
        || key.starts_with(b"edgeform:cmd:")
}

/// What one heal of a tracked target must compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Nothing was written since the target was found healthy at this
    /// commit and desired state.
    Clean,
    /// Only these keys were written.
    Keys(Vec<Vec<u8>>),
    /// Compare everything; the reason, for the log.
    Everything(&'static str),
}

/// What the push messages of one target's connection told us.
#[derive(Debug, Default)]
struct Seen {
    /// The connection these facts are about (pushes of an older one only
    /// ever add work).
    connection: u64,
    /// The connection dropped: open a new one.
    lost: bool,
    /// Compare everything next time, and why.
    everything: Option<&'static str>,
    dirty: BTreeSet<Vec<u8>>,
    /// The target's Redis may have lost its data (a flush, the meta
    /// written or deleted, the connection lost: a restart): heal now.
    urgent: Option<Arc<tokio::sync::Notify>>,
}

impl Seen {
    fn urgent(&self) {
        if let Some(n) = &self.urgent {
            n.notify_one();
        }
    }

    fn pushed(&mut self, connection: u64, info: &PushInfo) {
        match info.kind {
            PushKind::Invalidate => match info.data.first() {
                Some(Value::Array(keys)) => {
                    for k in keys {
                        if let Value::BulkString(k) = k
                            && !ignored(k)
                        {
                            if k == keys::META.as_bytes() {
                                self.urgent();
                            }
                            self.dirty.insert(k.clone());
                        }
                    }
                    if self.dirty.len() > MAX_DIRTY {
                        self.dirty.clear();
                        self.everything = Some("many keys written");
                    }
                }
                // A flush (FLUSHALL/FLUSHDB, SWAPDB): every key may be gone.
                _ => {
                    self.everything = Some("the database was flushed");
                    self.urgent();
                }
            },
            PushKind::Disconnection => {
                self.everything = Some("the tracking connection was lost");
                if connection == self.connection {
                    self.lost = true;
                    self.urgent();
                }
            }
            _ => {}
        }
    }
}

/// One target's tracking state.
#[derive(Default)]
struct Target {
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    seen: Arc<Mutex<Seen>>,
    progress: Mutex<Progress>,
}

/// What the heals of one target got to.
#[derive(Default)]
struct Progress {
    /// Heals begun on this target.
    heals: u64,
    /// `commit NUL desired digest` the last heal left the target at.
    verified: Option<String>,
}

/// Whether `node`'s heal number `heals` is its periodic full comparison:
/// one heal in `full_every`, at a point of the cycle taken from its name
/// (FNV-1a), so 300 targets spread theirs over the cycle instead of all
/// comparing everything in the same heal.
fn periodic(heals: u64, node: &str, full_every: u32) -> bool {
    let every = u64::from(full_every.max(1));
    let phase = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (heals % every + phase % every).is_multiple_of(every)
}

/// The daemon's trackers, one per target, kept across heals.
pub struct Tracker {
    targets: Mutex<HashMap<String, Arc<Target>>>,
    full_every: u32,
    connections: std::sync::atomic::AtomicU64,
    urgent: Arc<tokio::sync::Notify>,
}

/// A heal begun on a tracked target: what to compare, and what the
/// tracking itself cost.
pub struct Begun {
    pub scope: Scope,
    /// Bytes read by the tracking (the `PING` reply).
    pub bytes: usize,
    target: Arc<Target>,
}

impl Tracker {
    /// `full_every`: every so many heals of a target compare everything
    /// anyway (1: every heal, the untracked behaviour), at a point of the
    /// cycle that differs between targets.
    #[must_use]
    pub fn new(full_every: u32) -> Tracker {
        Tracker {
            targets: Mutex::new(HashMap::new()),
            full_every: full_every.max(1),
            connections: std::sync::atomic::AtomicU64::new(0),
            urgent: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Notified when a tracked target's Redis may have lost its data: the
    /// database flushed, `edgeform:meta` written or deleted, the tracking
    /// connection lost (a restart). The daemon heals at once rather than
    /// at its next tick (a write of our own apply notifies too: one more
    /// comparison, sooner).
    #[must_use]
    pub fn urgent(&self) -> Arc<tokio::sync::Notify> {
        self.urgent.clone()
    }

    fn target(&self, node: &str) -> Arc<Target> {
        self.targets
            .lock()
            .expect("tracker lock")
            .entry(node.to_owned())
            .or_default()
            .clone()
    }

    /// Start a heal of `node` for `verified` (`commit NUL digest`): make
    /// sure the tracking connection is up (opening one means comparing
    /// everything), wait until every write before now has been reported,
    /// and take what was written.
    ///
    /// # Errors
    /// The tracking connection cannot be opened or does not answer (the
    /// caller compares everything without it).
    pub async fn begin(&self, node: &Node, verified: &str) -> Result<Begun> {
        let target = self.target(&node.name);
        let mut slot = target.connection.lock().await;
        let lost = target.seen.lock().expect("seen lock").lost;
        if lost {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.open(node, &target).await?);
        }
        let con = slot.as_mut().expect("just set");
        // The barrier: every push queued before this reply has arrived.
        let pong: redis::Value = match redis::cmd("PING").query_async(con).await {
            Ok(pong) => pong,
            Err(e) => {
                *slot = None;
                target.seen.lock().expect("seen lock").everything =
                    Some("the tracking connection failed");
                return Err(e).context("PING on the tracking connection");
            }
        };
        let (heals, same) = {
            let mut p = target.progress.lock().expect("progress lock");
            p.heals += 1;
            (p.heals, p.verified.as_deref() == Some(verified))
        };
        let mut seen = target.seen.lock().expect("seen lock");
        let dirty = std::mem::take(&mut seen.dirty);
        let scope = if let Some(why) = seen.everything.take() {
            Scope::Everything(why)
        } else if !same {
            Scope::Everything("no healthy comparison at this commit yet")
        } else if periodic(heals, &node.name, self.full_every) {
            Scope::Everything("the periodic full comparison")
        } else if dirty.is_empty() {
            Scope::Clean
        } else {
            Scope::Keys(dirty.into_iter().collect())
        };
        drop(seen);
        drop(slot);
        Ok(Begun {
            scope,
            bytes: super::heal::resp_len(&pong),
            target,
        })
    }

    /// A new tracking connection to `node`'s master, tracking on; what was
    /// seen before it no longer counts (compare everything).
    async fn open(&self, node: &Node, target: &Target) -> Result<MultiplexedConnection> {
        let id = self
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        {
            let mut seen = target.seen.lock().expect("seen lock");
            *seen = Seen {
                connection: id,
                everything: Some("a new tracking connection"),
                urgent: Some(self.urgent.clone()),
                ..Seen::default()
            };
        }
        let redis = node
            .redis
            .as_ref()
            .with_context(|| format!("node {} has no redis block", node.name))?;
        let seen = target.seen.clone();
        let pushes: edgeredis::Pushes = Arc::new(move |info: PushInfo| {
            if let Ok(mut s) = seen.lock() {
                s.pushed(id, &info);
            }
            Ok::<(), redis::aio::SendError>(())
        });
        let mut con = edgeredis::master_with_pushes(redis, &node.name, pushes).await?;
        let mut tracking = redis::cmd("CLIENT");
        tracking.arg("TRACKING").arg("ON").arg("BCAST");
        for p in PREFIXES {
            tracking.arg("PREFIX").arg(p);
        }
        tracking
            .exec_async(&mut con)
            .await
            .context("CLIENT TRACKING on the target")?;
        Ok(con)
    }

    /// The heal begun with `begun` ended: `healthy` when it left the target
    /// at the desired state (no drift, or drift repaired), at `verified`.
    /// Otherwise the next heal compares everything.
    pub fn end(&self, begun: &Begun, healthy: bool, verified: &str) {
        let target = &begun.target;
        let mut p = target.progress.lock().expect("progress lock");
        if healthy {
            p.verified = Some(verified.to_owned());
        } else {
            p.verified = None;
            // The keys taken by `begin` were not all checked.
            target.seen.lock().expect("seen lock").everything = Some("the last heal failed");
        }
    }
}

/// What a tracker verifies a target against: the commit and the desired
/// state's digest.
#[must_use]
pub fn verified(commit: &str, digest: &str) -> String {
    format!("{commit}\0{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalidate(keys: &[&str]) -> PushInfo {
        PushInfo {
            kind: PushKind::Invalidate,
            data: vec![Value::Array(
                keys.iter()
                    .map(|k| Value::BulkString(k.as_bytes().to_vec()))
                    .collect(),
            )],
        }
    }

    #[test]
    fn writes_are_collected_and_the_lock_and_history_ignored() {
        let mut s = Seen::default();
        s.pushed(
            0,
            &invalidate(&["site:a", "edgeform:lock", "edgeform:history"]),
        );
        s.pushed(0, &invalidate(&["site:a", "edgeform:cmd:1", "suspended:b"]));
        assert_eq!(
            s.dirty.iter().map(|k| k.as_slice()).collect::<Vec<_>>(),
            [b"site:a".as_slice(), b"suspended:b"]
        );
        assert_eq!(s.everything, None);
    }

    #[test]
    fn a_flush_the_meta_written_and_a_lost_connection_ask_for_a_heal_now() {
        let urgent = Arc::new(tokio::sync::Notify::new());
        let asked = |s: &mut Seen, connection: u64, info: &PushInfo| {
            s.pushed(connection, info);
            // A permit is stored when someone asked (no waiter yet).
            let n = urgent.notified();
            tokio::pin!(n);
            n.as_mut().enable()
        };
        let mut s = Seen {
            connection: 1,
            urgent: Some(urgent.clone()),
            ..Seen::default()
        };
        assert!(!asked(&mut s, 1, &invalidate(&["site:a", "edgeform:lock"])));
        assert!(asked(&mut s, 1, &invalidate(&["edgeform:meta"])));
        let flush = PushInfo {
            kind: PushKind::Invalidate,
            data: vec![Value::Nil],
        };
        assert!(asked(&mut s, 1, &flush));
        let gone = PushInfo {
            kind: PushKind::Disconnection,
            data: vec![],
        };
        assert!(!asked(&mut s, 0, &gone));
        assert!(asked(&mut s, 1, &gone));
    }

    #[test]
    fn periodic_full_comparisons_are_one_in_n_and_spread_over_targets() {
        for node in ["edge-1", "edge-2", "x"] {
            let full = (1..=12).filter(|h| periodic(*h, node, 12)).count();
            assert_eq!(full, 1, "{node}");
            assert!((1..=5).all(|h| periodic(h, node, 1)));
        }
        // 300 targets: about 25 per heal, never all at once.
        let most = (1..=12)
            .map(|h| {
                (1..=300)
                    .filter(|i| periodic(h, &format!("edge-{i}"), 12))
                    .count()
            })
            .max()
            .unwrap();
        assert!(most < 60, "{most}");
    }

    #[test]
    fn a_flush_a_lost_connection_and_too_many_writes_mean_everything() {
        let mut s = Seen::default();
        s.pushed(
            0,
            &PushInfo {
                kind: PushKind::Invalidate,
                data: vec![Value::Nil],
            },
        );
        assert_eq!(s.everything, Some("the database was flushed"));

        let mut s = Seen {
            connection: 2,
            ..Seen::default()
        };
        // An older connection's goodbye adds work but does not drop this one.
        let gone = PushInfo {
            kind: PushKind::Disconnection,
            data: vec![],
        };
        s.pushed(1, &gone);
        assert!(!s.lost);
        assert!(s.everything.is_some());
        s.pushed(2, &gone);
        assert!(s.lost);

        let mut s = Seen::default();
        let keys: Vec<String> = (0..=MAX_DIRTY).map(|i| format!("site:{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        s.pushed(0, &invalidate(&keys));
        assert!(s.dirty.is_empty());
        assert_eq!(s.everything, Some("many keys written"));
    }
}
