//! Transaction bodies shared by the targets of one run that write the same
//! thing: the same desired state (the same shared site list and routing
//! table, and commit) over the same live state read (the same manifest
//! entries of the same buckets). The first such target computes the
//! changes and encodes the body chunk by chunk into a log, at its own pace
//! (it does not wait for its own Redis); every target of the body,
//! that one included, sends the logged chunks to its own Redis. A change
//! to every site of a fleet of edges in one state so costs one diff and
//! one encoding, not one per edge, and a slow or stalled edge holds up
//! only itself.
//!
//! The meta (generation, audit record) is each target's own and sent after
//! the shared chunks, inside the same MULTI/EXEC: nothing about atomicity
//! changes. A body is held weakly by the run (it lives while a target
//! sends it); what the logs keep is capped ([`RETAIN_BYTES`], counted as
//! the keys' and values' bytes: each command is allocated at its size, so
//! that is what the chunks hold, within a few per cent for their argument
//! offsets), and nothing is kept when no two targets
//! of the run share a site list ([`Bodies::expect`]). Past the cap the
//! targets encode the rest themselves (the body is deterministic).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use anyhow::Result;
use compiler::compile::Entries;
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

use super::apply::{Body, send_chunk};
use super::plan::Changes;
use super::state::{Desired, Live, Manifest};

/// Bytes of encoded chunks all shared bodies of a run keep at most (a
/// 100,000-site full write is ~104 MB).
pub const RETAIN_BYTES: usize = 256 << 20;

/// The bodies of one run (one `Options`), by what they write.
#[derive(Debug)]
pub struct Bodies {
    live: Mutex<Vec<Weak<Shared>>>,
    retained: Arc<AtomicUsize>,
    /// [`RETAIN_BYTES`], less in tests, 0 when no two targets of the run
    /// can share ([`Bodies::expect`]).
    cap: Arc<AtomicUsize>,
    counts: Arc<Counts>,
}

impl Default for Bodies {
    fn default() -> Bodies {
        Bodies::with_cap(RETAIN_BYTES)
    }
}

/// How the targets of a run got their bodies.
#[derive(Debug, Default)]
struct Counts {
    /// Targets that encoded their body (whole, or the rest of it).
    encoded: AtomicUsize,
    /// Targets that sent chunks another target encoded.
    reused: AtomicUsize,
}

/// What decides a body, compared in full (never by digest: two states
/// with equal digests are not the same state).
#[derive(Debug)]
struct Key {
    sites: Arc<Entries>,
    site_hashes: Arc<Vec<String>>,
    routing: Arc<str>,
    is_edge: bool,
    commit: String,
    legacy: bool,
    rewrites: bool,
    read_buckets: Vec<u8>,
    manifest: Manifest,
}

impl Key {
    fn of(desired: &Desired, live: &Live, commit: &str) -> Key {
        Key {
            sites: desired.sites.clone(),
            site_hashes: desired.site_hashes.clone(),
            routing: desired.routing.clone(),
            is_edge: desired.is_edge,
            commit: commit.to_owned(),
            legacy: live.legacy,
            rewrites: live.rewrites_manifest(),
            read_buckets: live.read_buckets.clone(),
            manifest: live.manifest.clone(),
        }
    }

    fn same(&self, desired: &Desired, live: &Live, commit: &str) -> bool {
        Arc::ptr_eq(&self.sites, &desired.sites)
            && Arc::ptr_eq(&self.site_hashes, &desired.site_hashes)
            && (Arc::ptr_eq(&self.routing, &desired.routing) || self.routing == desired.routing)
            && self.is_edge == desired.is_edge
            && self.commit == commit
            && self.legacy == live.legacy
            && self.rewrites == live.rewrites_manifest()
            && self.read_buckets == live.read_buckets
            && self.manifest == live.manifest
    }
}

/// How far the encoding target has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// More chunks may come.
    Open,
    /// Every chunk is in the log.
    Complete,
    /// No more will come (the cap, or the encoding target's task was
    /// cancelled): the targets encode the rest themselves.
    Closed,
}

/// One body shared by the targets that write it.
#[derive(Debug)]
pub(crate) struct Shared {
    key: Key,
    changes: OnceLock<Arc<Changes>>,
    /// Taken by the target that encodes.
    encoding: AtomicBool,
    log: Mutex<Vec<Arc<redis::Pipeline>>>,
    logged: AtomicUsize,
    progress: watch::Sender<(usize, End)>,
    retained: Arc<AtomicUsize>,
    cap: Arc<AtomicUsize>,
    counts: Arc<Counts>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.retained
            .fetch_sub(self.logged.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Bodies {
    /// Bodies whose chunks keep at most `cap` bytes in memory.
    #[must_use]
    pub fn with_cap(cap: usize) -> Bodies {
        Bodies {
            live: Mutex::default(),
            retained: Arc::default(),
            cap: Arc::new(AtomicUsize::new(cap)),
            counts: Arc::default(),
        }
    }

    /// The run's targets: when no two of them have the same desired state
    /// (the same shared site list), nothing is kept for sharing (a body is
    /// then only streamed, as without sharing).
    pub fn expect(&self, desired: &[&Desired]) {
        let mut lists: Vec<*const Entries> =
            desired.iter().map(|d| Arc::as_ptr(&d.sites)).collect();
        lists.sort_unstable();
        if lists.windows(2).all(|w| w[0] != w[1]) {
            self.cap.store(0, Ordering::Relaxed);
        }
    }

    /// Whether this run's targets share bodies (see [`Bodies::expect`]).
    #[must_use]
    pub fn sharing(&self) -> bool {
        self.cap.load(Ordering::Relaxed) > 0
    }

    /// Targets of the run that encoded their body, and targets that sent
    /// chunks another one encoded.
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        (
            self.counts.encoded.load(Ordering::Relaxed),
            self.counts.reused.load(Ordering::Relaxed),
        )
    }

    /// The body of `desired` over `live` at `commit`: one another target
    /// of this run already has, or a new one.
    pub(crate) fn body(&self, desired: &Desired, live: &Live, commit: &str) -> Arc<Shared> {
        let mut all = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.retain(|w| w.strong_count() > 0);
        if let Some(s) = all
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.key.same(desired, live, commit))
        {
            return s;
        }
        let s = Arc::new(Shared {
            key: Key::of(desired, live, commit),
            changes: OnceLock::new(),
            encoding: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
            logged: AtomicUsize::new(0),
            progress: watch::Sender::new((0, End::Open)),
            retained: self.retained.clone(),
            cap: self.cap.clone(),
            counts: self.counts.clone(),
        });
        all.push(Arc::downgrade(&s));
        s
    }
}

impl Shared {
    /// The changes this body writes, computed once.
    pub(crate) fn changes(&self, compute: impl FnOnce() -> Changes) -> Arc<Changes> {
        self.changes.get_or_init(|| Arc::new(compute())).clone()
    }

    /// Send every chunk of the body on `con` (inside its MULTI), checking
    /// each chunk's `QUEUED` replies, taken from the log. The first target
    /// here also encodes the body into the log, at its own pace (encoding,
    /// not sending: the others never wait for this target's Redis).
    ///
    /// # Errors
    /// Redis errors; a command the server refused to queue.
    pub(crate) async fn send<'a>(
        &self,
        con: &mut MultiplexedConnection,
        make: impl Fn() -> Body<'a>,
    ) -> Result<()> {
        if self.encoding.swap(true, Ordering::AcqRel) {
            return self.take(con, &make, false).await;
        }
        self.counts.encoded.fetch_add(1, Ordering::Relaxed);
        let ((), sent) = tokio::join!(self.encode(make()), self.take(con, &make, true));
        sent
    }

    /// Send the logged chunks as they come; once the log is closed, encode
    /// the rest here (the body is deterministic).
    async fn take<'a>(
        &self,
        con: &mut MultiplexedConnection,
        make: &impl Fn() -> Body<'a>,
        encoder: bool,
    ) -> Result<()> {
        let mut progress = self.progress.subscribe();
        let mut sent = 0;
        loop {
            let (chunks, end) = *progress.borrow_and_update();
            if sent < chunks {
                if sent == 0 && !encoder {
                    self.counts.reused.fetch_add(1, Ordering::Relaxed);
                }
                let chunk = self
                    .log
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)[sent]
                    .clone();
                send_chunk(con, &chunk).await?;
                sent += 1;
                continue;
            }
            match end {
                End::Complete => return Ok(()),
                End::Closed => {
                    if !encoder {
                        self.counts.encoded.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut body = make();
                    for _ in 0..sent {
                        body.chunk();
                    }
                    return stream(con, body).await;
                }
                End::Open => {
                    // The sender lives in `self`: never closed while here.
                    let _ = progress.changed().await;
                }
            }
        }
    }

    /// Encode `body` into the log, chunk after chunk, yielding between
    /// chunks; stop when the log is closed (the cap).
    async fn encode(&self, mut body: Body<'_>) {
        // However this ends (cancelled with its target), the others are
        // never left waiting.
        struct CloseOnExit<'s>(&'s Shared);
        impl Drop for CloseOnExit<'_> {
            fn drop(&mut self) {
                self.0.progress.send_modify(|p| {
                    if p.1 == End::Open {
                        p.1 = End::Closed;
                    }
                });
            }
        }
        let _close = CloseOnExit(self);
        loop {
            let open = self.progress.borrow().1 == End::Open;
            if !open {
                return;
            }
            let Some(chunk) = body.chunk() else {
                self.progress.send_modify(|p| p.1 = End::Complete);
                return;
            };
            self.log_chunk(Arc::new(chunk), body.last_bytes());
            tokio::task::yield_now().await;
        }
    }

    /// Keep `chunk` for the others, unless the run's cap is reached (then
    /// no more are kept: the others encode from there).
    fn log_chunk(&self, chunk: Arc<redis::Pipeline>, bytes: usize) {
        let open = self.progress.borrow().1 == End::Open;
        if !open {
            return;
        }
        let before = self.retained.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > self.cap.load(Ordering::Relaxed) {
            self.retained.fetch_sub(bytes, Ordering::Relaxed);
            self.progress.send_modify(|p| p.1 = End::Closed);
            return;
        }
        self.logged.fetch_add(bytes, Ordering::Relaxed);
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.push(chunk);
        let n = log.len();
        drop(log);
        self.progress.send_modify(|p| p.0 = n);
    }
}

/// Send the rest of `body` on `con`, encoding the next chunk while the
/// server queues the last.
///
/// # Errors
/// Redis errors; a command the server refused to queue.
pub(crate) async fn stream(con: &mut MultiplexedConnection, mut body: Body<'_>) -> Result<()> {
    let mut next = body.chunk();
    while let Some(chunk) = next.take() {
        let (sent, following) = tokio::join!(send_chunk(con, &chunk), async { body.chunk() });
        sent?;
        next = following;
    }
    Ok(())
}
