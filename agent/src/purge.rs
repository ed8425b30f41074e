//! The purge worker: the node's own queue `cdn:purge:<region>:<node>` on
//! its own Redis, consumed in order with the reliable-queue pattern.
//!
//! `BLMOVE queue processing LEFT RIGHT` takes the oldest job into a
//! processing list; the job is removed from it only once done and its
//! result recorded. A crash at any point leaves the job in the processing
//! list, and the next start runs it again first — purging is idempotent, so
//! nothing is lost and nothing is harmed. A Redis restart is survived:
//! errors reconnect with backoff, and a result not yet recorded is kept
//! in memory and written first.
//!
//! Each result recorded in `cdn:purge:done:<id>` is also announced, in
//! the same MULTI, with `PUBLISH cdn:purge:done:<id> "<node>\n<value>"`,
//! so a waiting `edgeform purge --wait` need not poll nor read it back.
//!
//! The blocking BLMOVE runs on a connection without a response timeout
//! (the redis crate's default 500 ms would fail client-side while the
//! server still moved a job, and the job would be lost); its own 5 s
//! timeout bounds it, and shutdown drops it in flight (a job it moved stays
//! in processing and runs at the next start).
//!
//! Jobs are bytes. A malformed job (over 64 KiB, not UTF-8, not JSON,
//! unknown shape, a regex the engine refuses, a pattern matching every key
//! without `"all": true`) is recorded as failed — in `cdn:purge:done:<id>`
//! when it has an id, and in `<queue>:failed` (the job when small, else an
//! escaped prefix and its length) — and the worker goes on. A poison job
//! (one that kills the agent) is failed after its third unfinished start:
//! starts are counted in `<queue>:attempts` before the job runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use edgestate::purge::{self, Action, Job};
use redis::aio::MultiplexedConnection;

use crate::cache::{Index, Layout};
use crate::config::Config;
use crate::shutdown::Shutdown;

/// How long one BLMOVE waits on the server before looping. Shutdown does
/// not wait for it (the BLMOVE is dropped in flight); an idle agent makes
/// one round trip per period (a 1 s period plus an LLEN each time would be
/// 600 wake-ups a second of 300 idle agents and their redis-servers on
/// one host).
const BLOCK_SECS: f64 = 5.0;
/// How long a BLMOVE may go unanswered: the server answers an empty queue
/// after [`BLOCK_SECS`], so a master that stopped answering (frozen,
/// partitioned without a reset) is left for a new connection, resolved
/// again through the Sentinels, within this.
const BLMOVE_DEADLINE: Duration = Duration::from_secs(15);
/// Failed jobs kept in `<queue>:failed`.
const FAILED_KEEP: isize = 1000;

/// What running one job gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed(u64),
    Failed(String),
}

/// How pattern purges find files: the key index (kept current by inotify,
/// drained before every purge), or a scan of the cache dirs when the index
/// could not be built.
pub enum Engine {
    Index(Box<Index>),
    Scan(Layout),
}

impl Engine {
    /// Build the index over `layout`; on failure (e.g. inotify limits),
    /// log and scan instead. Blocking.
    #[must_use]
    pub fn start(layout: Layout) -> Engine {
        let started = Instant::now();
        match Index::build(layout.clone()) {
            Ok(index) => {
                let stats = index.stats();
                tracing::info!(files = stats.files, dirs = stats.dirs, elapsed = ?started.elapsed(), "cache key index built");
                Engine::Index(Box::new(index))
            }
            Err(e) => {
                tracing::warn!(cause = %e, "cache key index unavailable; pattern purges scan the cache dirs");
                Engine::Scan(layout)
            }
        }
    }

    fn purge_matching(
        &self,
        matches: impl Fn(&[u8]) -> bool + Sync,
    ) -> std::io::Result<crate::cache::PurgeStats> {
        match self {
            Engine::Index(i) => i.purge_matching(matches),
            Engine::Scan(l) => l.purge_matching(matches),
        }
    }

    fn purge_keys(&self, keys: &[&str]) -> std::io::Result<crate::cache::PurgeStats> {
        match self {
            Engine::Index(i) => i.purge_keys(keys),
            Engine::Scan(l) => l.purge_keys(keys),
        }
    }

    /// Apply pending cache changes to the index (keeps the inotify queue
    /// short between purges). Blocking.
    pub fn refresh(&self) {
        if let Engine::Index(i) = self {
            i.refresh();
        }
    }
}

/// Run one job's bytes against the cache. Pure of Redis; blocking I/O.
#[must_use]
pub fn execute(layout: &Engine, bytes: &[u8]) -> (Option<String>, Outcome) {
    let job = match Job::parse_bytes(bytes) {
        Ok(j) => j,
        Err(e) => {
            // Keep the id when the job had one, so --wait learns of it
            // (never for a job too big to parse).
            let id = (bytes.len() <= purge::MAX_JOB_BYTES)
                .then(|| {
                    serde_json::from_str::<serde_json::Value>(&String::from_utf8_lossy(bytes)).ok()
                })
                .flatten()
                .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_owned));
            return (id, Outcome::Failed(e));
        }
    };
    let outcome = match job.action() {
        Ok(Action::Grep(pattern)) => match Job::grep_matcher(pattern, job.all) {
            Ok(re) => match layout.purge_matching(|line: &[u8]| re.is_match(line)) {
                Ok(stats) => Outcome::Removed(stats.removed),
                Err(e) => Outcome::Failed(format!("scan failed: {e}")),
            },
            Err(e) => Outcome::Failed(e),
        },
        Ok(Action::Keys(keys)) => match layout.purge_keys(&keys) {
            Ok(stats) => Outcome::Removed(stats.removed),
            Err(e) => Outcome::Failed(format!("purge failed: {e}")),
        },
        Err(e) => Outcome::Failed(e),
    };
    (job.id, outcome)
}

/// The worker: owns its Redis connection and the cache layout.
pub struct Worker {
    config: Arc<Config>,
    layout: Layout,
    /// Built at the start of `run` (it scans the cache).
    engine: Option<Arc<Engine>>,
    queue: String,
    processing: String,
    /// A finished job whose result is not yet recorded (Redis was down).
    pending: Option<(Vec<u8>, Option<String>, Outcome)>,
    /// Whether the current connection moved the queue on (a BLMOVE
    /// answered, a job recorded): only then is the reconnect backoff reset,
    /// so a Redis that connects but errors on every job is retried slowly.
    progressed: bool,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Worker {
    /// # Errors
    /// Invalid cache `levels`.
    pub fn new(config: Arc<Config>, metrics: Arc<crate::metrics::Metrics>) -> Result<Worker> {
        let layout = Layout::new(
            config.cache.dirs.clone(),
            crate::cache::Levels::parse(&config.cache.levels)?,
        );
        let queue = config.purge_queue();
        let processing = purge::processing_key(&queue);
        Ok(Worker {
            config,
            layout,
            engine: None,
            queue,
            processing,
            pending: None,
            progressed: false,
            metrics,
        })
    }

    /// Consume the queue until `shutdown` fires. Never returns early on a
    /// Redis or job error: it logs, backs off and goes on.
    pub async fn run(mut self, mut shutdown: Shutdown) {
        let layout = self.layout.clone();
        let engine = match tokio::task::spawn_blocking(move || Engine::start(layout)).await {
            Ok(e) => Arc::new(e),
            Err(_) => Arc::new(Engine::Scan(self.layout.clone())),
        };
        self.engine = Some(engine.clone());
        // Keep the index's event queue short between purges.
        let mut stop = shutdown.clone();
        let refresher = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stop.wait() => return,
                }
                let e = engine.clone();
                let _ = tokio::task::spawn_blocking(move || e.refresh()).await;
            }
        });
        // Jittered: agents sharing a Redis restart do not
        // come back in lock-step.
        let mut backoff =
            edgestate::backoff::Backoff::random(Duration::from_millis(100), Duration::from_secs(5));
        while !shutdown.is_fired() {
            let con = tokio::select! {
                c = edgeredis::master(&self.config.redis, &self.config.node) => c,
                () = shutdown.wait() => break,
            };
            // A connection refused and one that failed while serving wait
            // alike: never at once, so a server that errors on every
            // command (a key of the wrong type, out of memory) is asked
            // again after a growing pause, not in a loop of connections.
            let failed = match con {
                Ok(mut con) => {
                    tracing::info!(queue = %self.queue, "purge worker connected");
                    self.metrics.redis_up.set(1);
                    self.progressed = false;
                    let served = self.serve(&mut con, &mut shutdown).await;
                    if std::mem::take(&mut self.progressed) {
                        backoff.reset();
                    }
                    served
                        .err()
                        .map(|e| (e, "purge worker: redis error; reconnecting"))
                }
                Err(e) => Some((e, "purge worker: redis unreachable")),
            };
            let Some((e, what)) = failed else { continue };
            self.metrics.redis_up.set(0);
            let delay = backoff.next_delay();
            tracing::warn!(redis = %edgeredis::describe(&self.config.redis), cause = %edgeredis::one_line(&e), retry_in = ?delay, "{what}");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.wait() => break,
            }
        }
        let _ = refresher.await;
        tracing::info!("purge worker stopped");
    }

    /// Work on one connection until it fails or shutdown fires.
    async fn serve(
        &mut self,
        con: &mut MultiplexedConnection,
        shutdown: &mut Shutdown,
    ) -> Result<()> {
        if let Some((text, id, outcome)) = self.pending.take() {
            self.finish(con, &text, id.as_deref(), &outcome)
                .await
                .inspect_err(|_| {
                    self.pending = Some((text.clone(), id.clone(), outcome.clone()));
                })?;
        }
        // Jobs a previous run took but did not finish: run them again, in order.
        let left: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&self.processing)
            .arg(0)
            .arg(-1)
            .query_async(con)
            .await?;
        if !left.is_empty() {
            tracing::info!(
                jobs = left.len(),
                "re-running jobs left in processing by a previous run"
            );
        }
        for text in left {
            self.handle(con, text).await?;
            self.progressed = true;
        }
        loop {
            if shutdown.is_fired() {
                return Ok(());
            }
            let mut blmove = redis::cmd("BLMOVE");
            blmove
                .arg(&self.queue)
                .arg(&self.processing)
                .arg("LEFT")
                .arg("RIGHT")
                .arg(BLOCK_SECS);
            // Jobs are bytes: a non-UTF-8 one is failed, not a decode
            // error that drops the connection.
            let next: Option<Vec<u8>> = tokio::select! {
                r = tokio::time::timeout(BLMOVE_DEADLINE, blmove.query_async(con)) => match r {
                    Ok(r) => r.context("BLMOVE")?,
                    Err(_) => anyhow::bail!("BLMOVE: no answer in {BLMOVE_DEADLINE:?}"),
                },
                // Dropping a BLMOVE in flight is safe: a job it moved
                // stays in processing and is run at the next start.
                () = shutdown.wait() => return Ok(()),
            };
            self.progressed = true;
            // The queue depth for /metrics without MQTT too:
            // read in the MULTI that records a job's result; a BLMOVE that
            // timed out found the queue empty for its whole second (no
            // LLEN round trip per job or per idle second).
            let depth = match next {
                Some(text) => self.handle(con, text).await?,
                None => 0,
            };
            self.metrics
                .purge_queue
                .set(crate::metrics::gauge_value(depth));
        }
    }

    /// Run one job and record it; on a Redis error the result is kept.
    /// Returns the queue's depth once recorded.
    ///
    /// Each start is counted first (`<queue>:attempts`, by the job's
    /// digest): a job started [`purge::MAX_ATTEMPTS`] times without
    /// finishing killed the agent each time, and is failed unrun.
    async fn handle(&mut self, con: &mut MultiplexedConnection, bytes: Vec<u8>) -> Result<u64> {
        let start = Instant::now();
        let (attempts, ran) = self.start(con, &bytes).await?;
        let (id, outcome) = if attempts > purge::MAX_ATTEMPTS {
            (
                ran.map(|(id, _)| id),
                Outcome::Failed(format!(
                    "started {} times without finishing (the agent died running it)",
                    purge::MAX_ATTEMPTS
                )),
            )
        } else if let Some((id, outcome)) = ran.and_then(|(id, r)| r.map(|r| (id, r))) {
            // Delivered again (a purge outbox re-queues a job its Redis
            // seemed to lose): the recorded result stands, nothing runs.
            tracing::info!(id = %id, "purge job already ran here; not run again");
            return match self.finish(con, &bytes, Some(&id), &outcome).await {
                Ok(depth) => Ok(depth),
                Err(e) => {
                    self.pending = Some((bytes, Some(id), outcome));
                    Err(e)
                }
            };
        } else {
            let engine = self
                .engine
                .clone()
                .unwrap_or_else(|| Arc::new(Engine::Scan(self.layout.clone())));
            let job = bytes.clone();
            tokio::task::spawn_blocking(move || execute(&engine, &job))
                .await
                .unwrap_or_else(|e| (None, Outcome::Failed(format!("purge task panicked: {e}"))))
        };
        self.metrics
            .purge_duration
            .observe(start.elapsed().as_secs_f64());
        match &outcome {
            Outcome::Removed(n) => {
                crate::metrics::Metrics::count(&self.metrics.purge_jobs, "done");
                self.metrics.purge_files_removed.inc_by(*n);
                tracing::info!(id = id.as_deref().unwrap_or("-"), removed = n, elapsed = ?start.elapsed(), "purge done");
            }
            Outcome::Failed(why) => {
                crate::metrics::Metrics::count(&self.metrics.purge_jobs, "failed");
                tracing::warn!(id = id.as_deref().unwrap_or("-"), reason = %why, bytes = bytes.len(), job = %purge::preview(&bytes, PREVIEW_BYTES), "purge job failed");
            }
        }
        match self.finish(con, &bytes, id.as_deref(), &outcome).await {
            Ok(depth) => Ok(depth),
            Err(e) => {
                self.pending = Some((bytes, id, outcome));
                Err(e)
            }
        }
    }

    /// A job's start, in one round trip: its starts counted (with this
    /// one), and, when it has an id, that id and the result this node
    /// already recorded for it (its `cdn:purge:done:<id>` holds this
    /// node's result when it ran here before).
    async fn start(
        &self,
        con: &mut MultiplexedConnection,
        bytes: &[u8],
    ) -> Result<(u32, Option<(String, Option<Outcome>)>)> {
        let id = (bytes.len() <= purge::MAX_JOB_BYTES)
            .then(|| Job::parse_bytes(bytes).ok().and_then(|j| j.id))
            .flatten();
        // A server error on either (a key of the wrong type, a counter
        // that is not a number, out of memory) is this job's: it runs
        // uncounted or as never recorded, it does not stop the queue.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("HINCRBY")
            .arg(attempts_key(&self.queue))
            .arg(digest(bytes))
            .arg(1);
        if let Some(id) = &id {
            pipe.cmd("HGET")
                .arg(purge::done_key(id))
                .arg(&self.config.node);
        }
        // Read as values, decoded here: a reply that is not what it should
        // be (a record that is not UTF-8) is that job's, never an error of
        // the whole round trip.
        let mut replies: Vec<redis::RedisResult<redis::Value>> = pipe
            .query_async(con)
            .await
            .context("counting the job's attempts and reading its record")?;
        let recorded = if id.is_some() { replies.pop() } else { None };
        let attempts = match replies.pop() {
            Some(Ok(v)) => redis::from_redis_value::<u32>(v).unwrap_or(1),
            Some(Err(e)) => {
                tracing::warn!(key = %attempts_key(&self.queue), cause = %edgeredis::one_line(&anyhow::Error::from(e)), "purge worker: cannot count the job's starts; running it uncounted");
                1
            }
            None => 1,
        };
        let Some(id) = id else {
            return Ok((attempts, None));
        };
        let recorded = match recorded {
            Some(Ok(redis::Value::BulkString(b))) => match String::from_utf8(b) {
                Ok(v) => Some(v),
                Err(_) => {
                    tracing::warn!(key = %purge::done_key(&id), "purge worker: the job's record is not UTF-8; running it");
                    None
                }
            },
            Some(Err(e)) => {
                tracing::warn!(key = %purge::done_key(&id), cause = %edgeredis::one_line(&anyhow::Error::from(e)), "purge worker: cannot read the job's record; running it");
                None
            }
            _ => None,
        };
        let ran = recorded.map(|v| match v.strip_prefix(purge::FAILED_PREFIX) {
            Some(why) => Outcome::Failed(why.to_owned()),
            None => Outcome::Removed(v.parse().unwrap_or(0)),
        });
        Ok((attempts, Some((id, ran))))
    }

    /// Record the result and take the job out of processing, atomically;
    /// the queue's depth after it (read in the same MULTI).
    async fn finish(
        &self,
        con: &mut MultiplexedConnection,
        bytes: &[u8],
        id: Option<&str>,
        outcome: &Outcome,
    ) -> Result<u64> {
        // A server error on one write (the record or the failed list of
        // the wrong type) does not undo the others, and the job is out of
        // processing once its LREM ran: counted done, never run again in
        // a loop. An error at queueing (out of memory) runs nothing.
        let mut pipe = redis::pipe();
        pipe.atomic().ignore_errors();
        if let Some(id) = id {
            let key = purge::done_key(id);
            let value = match outcome {
                Outcome::Removed(n) => n.to_string(),
                Outcome::Failed(why) => format!("{}{why}", purge::FAILED_PREFIX),
            };
            pipe.cmd("HSET")
                .arg(&key)
                .arg(&self.config.node)
                .arg(&value)
                .ignore();
            pipe.cmd("EXPIRE")
                .arg(&key)
                .arg(purge::DONE_TTL_SECS)
                .ignore();
            // A waiting `edgeform purge --wait` hears of it at once, the
            // value included (the hash above stays the record; a waiter
            // that missed this reads it).
            pipe.cmd("PUBLISH")
                .arg(purge::done_channel(id))
                .arg(purge::announcement(&self.config.node, &value))
                .ignore();
        }
        if let Outcome::Failed(why) = outcome {
            let failed = purge::failed_key(&self.queue);
            // The job as text when it is small valid UTF-8; otherwise an
            // escaped prefix and the length, never megabytes of it.
            let job = match std::str::from_utf8(bytes) {
                Ok(text) if bytes.len() <= PREVIEW_BYTES => text.to_owned(),
                _ => purge::preview(bytes, PREVIEW_BYTES),
            };
            let entry = serde_json::json!({"job": job, "bytes": bytes.len(), "reason": why, "at": crate::unix_now()})
                .to_string();
            pipe.cmd("RPUSH").arg(&failed).arg(entry).ignore();
            pipe.cmd("LTRIM")
                .arg(&failed)
                .arg(-FAILED_KEEP)
                .arg(-1)
                .ignore();
        }
        pipe.cmd("HDEL")
            .arg(attempts_key(&self.queue))
            .arg(digest(bytes))
            .ignore();
        pipe.cmd("LLEN").arg(&self.queue);
        pipe.cmd("LREM").arg(&self.processing).arg(1).arg(bytes);
        if let Some(id) = id {
            // Read back (HGET: the documented ACL's commands only).
            pipe.cmd("HGET")
                .arg(purge::done_key(id))
                .arg(&self.config.node);
        }
        let replies: Vec<redis::RedisResult<redis::Value>> = pipe
            .query_async(con)
            .await
            .context("recording the purge result")?;
        let mut replies = replies.into_iter();
        let depth = replies.next();
        match replies.next() {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                return Err(anyhow::Error::from(e).context("recording the purge result"));
            }
            None => anyhow::bail!("recording the purge result: no reply"),
        }
        if id.is_some() && !matches!(replies.next(), Some(Ok(redis::Value::BulkString(_)))) {
            tracing::warn!(
                id = id.unwrap_or("-"),
                "purge worker: the job's result could not be recorded (its record key is not a hash?); the job is done"
            );
        }
        Ok(depth
            .and_then(Result::ok)
            .and_then(|d| redis::from_redis_value::<u64>(d).ok())
            .unwrap_or(0))
    }
}

/// How much of a failed job a log line or a failed record shows.
const PREVIEW_BYTES: usize = 200;

/// `<queue>:attempts`: starts of the jobs in processing, by digest.
fn attempts_key(queue: &str) -> String {
    format!("{queue}:attempts")
}

/// A job's field in the attempts hash (not a security digest).
fn digest(bytes: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
