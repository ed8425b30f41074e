//! `edgeform purge`: one job onto every targeted node's own queue.
//!
//! All targets at once (at most [`PARALLEL`] connecting): each node's
//! master is reached, and with `--wait` the connection speaks RESP3 and
//! SUBSCRIBEs to `cdn:purge:done:<id>` before the job is queued. The wait
//! then takes each node's result from its agent's announcement on that
//! channel (`PUBLISH`, node name and value), and reads the hash
//! `cdn:purge:done:<id>` (the record) on an announcement without a value
//! and every [`FALLBACK_POLL`] regardless, for an agent that does not
//! announce. No polling storm: at 300 nodes, no read at all when every
//! agent announces.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use edgestate::purge::{self, Job, Request};
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::Receiver;
use tokio::task::JoinSet;

use compiler::Config;
use compiler::model::resolved::{Node, Role, Site};

/// What to purge: exactly one of these.
#[derive(Debug, Clone, Default)]
pub struct What {
    /// One URL (`https://host/path?query`) or path (`/path`, both schemes):
    /// an exact-key purge, no scan.
    pub url: Option<String>,
    /// Every URL whose path starts with this.
    pub prefix: Option<String>,
    /// Every URL whose path (with query) matches this regex (`^` anchors
    /// at the path's start).
    pub regex: Option<String>,
    /// Everything cached for the site.
    pub all: bool,
}

fn job_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

fn find_site<'a>(sites: &'a [Site], host: &str) -> Option<&'a Site> {
    sites
        .iter()
        .find(|s| s.host == host || s.aliases.iter().any(|a| a == host))
}

/// The job for one node (its own cache key template).
///
/// # Errors
/// A pattern the agent's engine refuses, a URL for another site, a key
/// template edgeform cannot compute, a job larger than the agent takes
/// (`edgestate::purge::MAX_JOB_BYTES`).
pub fn build_job(id: &str, site: &Site, node: &Node, what: &What) -> Result<Job, String> {
    let job = job_of(id, site, node, what)?;
    let bytes = job.to_json().len();
    if bytes > purge::MAX_JOB_BYTES {
        return Err(format!(
            "the job for {} would be {bytes} bytes, over the {} its agent takes \
             (every hostname of the site times the URL's length): purge by --prefix instead",
            node.name,
            purge::MAX_JOB_BYTES
        ));
    }
    Ok(job)
}

fn job_of(id: &str, site: &Site, node: &Node, what: &What) -> Result<Job, String> {
    let template = &node.cache.key;
    let hosts: Vec<&str> = std::iter::once(site.host.as_str())
        .chain(site.aliases.iter().map(String::as_str))
        .collect();
    let mut job = Job {
        id: Some(id.to_owned()),
        site: Some(site.host.clone()),
        grep: None,
        key: None,
        keys: None,
        // Site-scoped, but everything of the site: say so.
        all: what.all,
    };
    if let Some(url) = &what.url {
        let (schemes, host, uri): (Vec<&str>, Vec<&str>, &str) =
            if let Some(rest) = url.strip_prefix('/').map(|_| url.as_str()) {
                (vec!["http", "https"], hosts.clone(), rest)
            } else {
                let (scheme, rest) = url
                    .split_once("://")
                    .ok_or_else(|| format!("`{url}` is neither a URL nor a /path"))?;
                if scheme != "http" && scheme != "https" {
                    return Err(format!("`{url}`: only http and https URLs are cached"));
                }
                let (host, path) = rest
                    .find('/')
                    .map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
                if !hosts.contains(&host) {
                    return Err(format!("`{host}` is not a hostname of site {}", site.host));
                }
                (vec![scheme], vec![host], path)
            };
        if host.iter().any(|h| h.starts_with("*.")) {
            return Err("a wildcard site needs a full URL with the real hostname for --url".into());
        }
        // The form the edge caches under: `//api/me` is `/api/me`.
        let uri = &purge::canonical_request_uri(uri)?;
        let mut keys = Vec::new();
        for s in &schemes {
            for h in &host {
                keys.push(purge::expand_key(
                    template,
                    &Request {
                        scheme: s,
                        host: h,
                        request_uri: uri,
                    },
                )?);
            }
        }
        job.keys = Some(keys);
        return Ok(job);
    }
    let uri_regex = if let Some(prefix) = &what.prefix {
        if !prefix.starts_with('/') {
            return Err(format!("--prefix `{prefix}` must start with `/`"));
        }
        regex::escape(&purge::canonical_request_uri(prefix)?)
    } else if let Some(re) = &what.regex {
        purge::matcher(re).map_err(|e| format!("the agent's regex engine refuses `{re}`: {e}"))?;
        match re.strip_prefix('^') {
            Some(anchored) => anchored.to_owned(),
            None => format!("/.*?(?:{re})"),
        }
    } else {
        "/".to_owned()
    };
    let pattern = purge::key_line_regex(template, &hosts, &uri_regex)?;
    // The agent's own verdict: one engine, one size limit, one scope guard.
    Job::grep_matcher(&pattern, job.all)
        .map_err(|e| format!("the built pattern `{pattern}` is refused: {e}"))?;
    job.grep = Some(pattern);
    Ok(job)
}

/// `edgeform purge`.
///
/// # Errors
/// Unknown site or node, a refused pattern, every target unreachable.
pub async fn purge(
    config: &Config,
    host: &str,
    what: &What,
    only: &[String],
    wait: Option<u64>,
    state_dir: &Path,
) -> Result<u8> {
    let site = find_site(&config.sites, host)
        .with_context(|| format!("no site has the hostname `{host}`"))?;
    let carriers: Vec<&Node> = config
        .nodes
        .iter()
        .filter(|n| n.has(Role::Edge) && n.redis.is_some())
        .filter(|n| site.regions.as_ref().is_none_or(|r| r.contains(&n.region)))
        .collect();
    let targets: Vec<&Node> = if only.is_empty() {
        carriers
    } else {
        only.iter()
            .map(|name| {
                carriers
                    .iter()
                    .find(|n| &n.name == name)
                    .copied()
                    .with_context(|| {
                        format!(
                            "--node {name}: not an edge (with a redis block) carrying {}",
                            site.host
                        )
                    })
            })
            .collect::<Result<_>>()?
    };
    if targets.is_empty() {
        bail!(
            "no edge carries {} (edges with a redis block in its regions)",
            site.host
        );
    }
    let started = Instant::now();
    let id = job_id();
    // Build every node's job first: a refused pattern queues nothing.
    let mut jobs = Vec::new();
    for node in &targets {
        let job = build_job(&id, site, node, what).map_err(|e| anyhow::anyhow!("{e}"))?;
        jobs.push((*node, job));
    }
    // Every enqueue at once (bounded): connect, SUBSCRIBE to the result
    // channel when waiting, RPUSH; the connection is kept for the wait.
    let channel = wait.map(|_| purge::done_channel(&id));
    let limit = Arc::new(Semaphore::new(PARALLEL));
    // Jobs kept earlier for a node go first: delivered before this one,
    // or this one is kept behind them.
    // A store that cannot be read holds no purge back (a purge is
    // idempotent: order between two of them changes nothing the viewers
    // see), but says so.
    let kept: Option<Arc<dyn control::store::Store>> = match control::store::open_existing(
        state_dir,
    ) {
        Ok(s) => s.map(Arc::from),
        Err(e) => {
            eprintln!(
                "warning: the state store cannot be opened ({e}): jobs kept earlier are not delivered first"
            );
            None
        }
    };
    let mut tasks = JoinSet::new();
    for (i, (node, job)) in jobs.iter().enumerate() {
        let target = Target::of(node)?;
        let (job, channel, limit) = (job.to_json(), channel.clone(), limit.clone());
        let older = kept
            .clone()
            .filter(|s| match control::outbox::has_waiting(&**s, &node.name) {
                Ok(waiting) => waiting,
                Err(e) => {
                    eprintln!(
                        "warning: {}: its kept jobs cannot be read ({e}): this job is not held back for them",
                        node.name
                    );
                    false
                }
            })
            .map(|s| (s, (*node).clone()));
        tasks.spawn(async move {
            let _slot = limit.acquire_owned().await;
            if let Some((store, node)) = older {
                let flushed = control::outbox::flush_within(&*store, &node).await;
                let waiting = control::outbox::has_waiting(&*store, &node.name).unwrap_or(true);
                if let Err(e) = flushed {
                    return (i, target, Err(e));
                }
                if waiting {
                    let e = anyhow::anyhow!("older jobs kept for this node are not delivered yet");
                    return (i, target, Err(e));
                }
            }
            // A Redis that took the connection and answers nothing is
            // given up in time and the job kept (SPOOLED): a write that
            // landed meanwhile is found there by the flush, not queued
            // twice.
            let link = match tokio::time::timeout(
                ENQUEUE_DEADLINE,
                target.enqueue(job, channel.as_deref()),
            )
            .await
            {
                Ok(link) => link,
                Err(_) => Err(anyhow::anyhow!(
                    "no answer in {} s",
                    ENQUEUE_DEADLINE.as_secs()
                )),
            };
            (i, target, link)
        });
    }
    let mut links: Vec<Option<(Target, Result<Queued>)>> = jobs.iter().map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (i, target, link) = done.context("an enqueue task failed")?;
        links[i] = Some((target, link));
    }
    let mut queued = Vec::new();
    let mut failed = 0;
    let mut spooled = 0;
    let mut tracked = Vec::new();
    for ((node, job), (target, link)) in jobs.iter().zip(links.into_iter().flatten()) {
        let node = *node;
        match link {
            Ok((link, durability)) => {
                if let Durability::Unconfirmed(why) = durability {
                    // Queued, but only the master has it: tracked until the
                    // node records it, queued again by the flush if a
                    // failover lost it.
                    let kept = control::store::open(state_dir)
                        .and_then(|s| control::outbox::track(&*s, &node.name, &id, &job.to_json()));
                    match kept {
                        Ok(()) => {
                            tracked.push(node.name.clone());
                            eprintln!(
                                "{}: queued on its master ({}), {why}; tracked in {} until the \
                                 node records it (a failover that loses it is repaired by \
                                 `purge --flush` or the reconcile daemon)",
                                node.name,
                                node.redis_at(),
                                control::store::outbox_place(state_dir, &node.name)
                            );
                        }
                        Err(e) => eprintln!(
                            "{}: queued on its master ({}), {why}; not tracked: {e} (a failover \
                             before a replica has it would lose it)",
                            node.name,
                            node.redis_at(),
                        ),
                    }
                }
                queued.push((node, target, link));
            }
            Err(e) => {
                let e = edgeredis::with_refusal(&node.name, e);
                // Kept in this host's outbox; delivered by `purge --flush`
                // and the reconcile daemon.
                let kept = control::store::open(state_dir)
                    .and_then(|s| control::outbox::spool(&*s, &node.name, &id, &job.to_json()));
                match kept {
                    Ok(()) => {
                        spooled += 1;
                        eprintln!(
                            "{}: SPOOLED ({}): {}; kept in {} until its Redis answers",
                            node.name,
                            node.redis_at(),
                            edgeredis::one_line(&e),
                            control::store::outbox_place(state_dir, &node.name)
                        );
                    }
                    Err(why) => {
                        failed += 1;
                        eprintln!(
                            "{}: NOT QUEUED ({}): {}; not kept: {why}",
                            node.name,
                            node.redis_at(),
                            edgeredis::one_line(&e)
                        );
                    }
                }
            }
        }
    }
    // 1: a job lost or failed; 3: every job queued or kept, some kept.
    let code = |bad: usize| {
        if bad > 0 {
            1
        } else {
            u8::from(spooled > 0) * SPOOLED_EXIT
        }
    };
    let enqueued = started.elapsed();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{id}")?;
    let names: Vec<&str> = queued.iter().map(|(n, _, _)| n.name.as_str()).collect();
    match names.len() {
        0 => eprintln!("queued for {} on no node", site.host),
        n => eprintln!(
            "queued for {} on {n} node(s): {}",
            site.host,
            names.join(", ")
        ),
    }
    let (Some(secs), Some(channel)) = (wait, channel) else {
        phases(targets.len(), queued.len(), enqueued, &[]);
        return Ok(code(failed));
    };
    // Every node waited for at once: its result, its notification or the
    // slow poll, until the deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut waits = JoinSet::new();
    let mut names = Vec::new();
    for (node, target, link) in queued {
        names.push(node);
        let (key, channel) = (purge::done_key(&id), channel.clone());
        waits.spawn(async move {
            let result = tokio::time::timeout_at(deadline, target.result(&key, &channel, link))
                .await
                .ok();
            (target.name, result, started.elapsed())
        });
    }
    let mut results: BTreeMap<String, String> = BTreeMap::new();
    let mut arrivals = Vec::new();
    while let Some(done) = waits.join_next().await {
        let (name, result, at) = done.context("a wait task failed")?;
        if let Some(v) = result {
            arrivals.push(at);
            results.insert(name, v);
        }
    }
    let queued = names;
    phases(targets.len(), queued.len(), enqueued, &arrivals);
    // A tracked job the node recorded needs no more tracking.
    for name in tracked.iter().filter(|n| results.contains_key(*n)) {
        if let Err(e) =
            control::store::open(state_dir).and_then(|s| control::outbox::forget(&*s, name, &id))
        {
            eprintln!("{name}: recorded, but still tracked in the outbox: {e}");
        }
    }
    let mut bad = failed;
    for node in &queued {
        match results.get(&node.name) {
            Some(v) if v.starts_with(purge::FAILED_PREFIX) => {
                bad += 1;
                // The agent's text: shown escaped.
                writeln!(out, "{}: {}", node.name, edgestate::untrusted::escape(v))?;
            }
            Some(v) => writeln!(
                out,
                "{}: {} file(s) removed",
                node.name,
                edgestate::untrusted::escape(v)
            )?,
            None => {}
        }
    }
    let pending: Vec<&str> = queued
        .iter()
        .filter(|n| !results.contains_key(&n.name))
        .map(|n| n.name.as_str())
        .collect();
    if !pending.is_empty() {
        eprintln!(
            "timed out after {secs} s; still pending: {}",
            pending.join(", ")
        );
        return Ok(1);
    }
    Ok(code(bad))
}

/// The exit code of a purge whose every job was queued or kept in the
/// outbox, some kept (not 1: nothing was lost; not 0: not every node has
/// it yet).
pub const SPOOLED_EXIT: u8 = 3;

/// `edgeform purge --flush`: deliver every node's kept jobs now. Prints
/// one line per node with kept jobs; exit 0 when every outbox is empty or
/// delivered, 3 when a node's Redis still does not answer.
///
/// # Errors
/// The store unreadable.
pub async fn flush(config: &Config, state_dir: &Path) -> Result<u8> {
    let Some(store) = control::store::open_existing(state_dir)? else {
        eprintln!("no state store at {}: nothing kept", state_dir.display());
        return Ok(0);
    };
    let before = control::outbox::depths(&*store)?;
    let nodes: Vec<Node> = config.nodes.clone();
    let results = control::outbox::flush_all(&*store, &nodes, control::outbox::Unknown::Keep).await;
    let mut out = std::io::stdout().lock();
    let mut code = 0;
    for (name, depth) in &before {
        match results.get(name) {
            Some(Ok(f)) => writeln!(
                out,
                "{name}: {} queued, {} queued again, {} done, {} tracked",
                f.queued, f.requeued, f.done, f.left
            )?,
            Some(Err(e)) => {
                code = SPOOLED_EXIT;
                writeln!(
                    out,
                    "{name}: {} kept, not delivered: {}",
                    depth.waiting + depth.delivered,
                    edgeredis::one_line(e)
                )?;
            }
            None => {
                code = SPOOLED_EXIT;
                writeln!(
                    out,
                    "{name}: {} kept for a node this repository does not have; left kept \
                     (is this the right repository? the reconcile daemon drops the jobs \
                     of a node its repository removed)",
                    depth.waiting + depth.delivered
                )?;
            }
        }
    }
    Ok(code)
}

/// How long one node's enqueue (connect, SUBSCRIBE, RPUSH) may take
/// before its job is kept in the outbox instead.
const ENQUEUE_DEADLINE: Duration = Duration::from_secs(10);

/// How long a master with replicas is given to have them confirm a job
/// (`WAIT`) before the job is tracked in the outbox instead. A healthy
/// replica confirms within a round trip.
const REPLICA_WAIT: Duration = Duration::from_secs(1);

/// Enqueues (connect, SUBSCRIBE, RPUSH) in flight at once. Each queued
/// node keeps its connection for the wait anyway, so this bounds only the
/// connects in flight, not the open sockets; at 64, a 300-edge purge went
/// in five waves of round trips.
const PARALLEL: usize = 256;

/// While waiting, each node's result is also read this often: an agent
/// that does not announce its result (one older than the announcement)
/// is still heard from, a second late at most.
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// Push messages kept per node until its waiter reads them.
const PUSH_QUEUE: usize = 256;

/// The largest channel message kept (an announcement is a node name and
/// a count or a short failure).
const PUSH_MAX: usize = 4096;

/// Whether a push is kept for the waiter: a channel message of the
/// announcement's shape and size, a subscription confirmation, or the
/// disconnection; anything else (a flood of odd pushes) is dropped. Pure.
fn kept_push(push: &PushInfo) -> bool {
    match push.kind {
        PushKind::Message => {
            push.data.len() == 2
                && push
                    .data
                    .iter()
                    .map(|v| match v {
                        redis::Value::BulkString(b) => b.len(),
                        _ => PUSH_MAX + 1,
                    })
                    .sum::<usize>()
                    <= PUSH_MAX
        }
        PushKind::Subscribe | PushKind::Disconnection => true,
        _ => false,
    }
}

/// One node to purge, owned by its task.
struct Target {
    name: String,
    region: String,
    redis: edgeredis::RedisTarget,
}

/// A queued node's connection; when waiting, subscribed to the result
/// channel, its messages (and a disconnection) arriving in `pushes`.
struct Link {
    con: MultiplexedConnection,
    pushes: Option<Receiver<PushInfo>>,
    /// The replicas the master listed when connected.
    replicas: usize,
}

/// A node's job queued: its connection, and whether the job survives the
/// loss of its master.
type Queued = (Link, Durability);

/// Whether a queued job survives the loss of the master that took it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Durability {
    /// The master listed no replica: nothing to wait for (a failover has
    /// nothing to promote; the master's own persistence keeps the job).
    Alone,
    /// Every listed replica confirmed it (`WAIT`): a failover keeps it.
    Replicated,
    /// Not every listed replica confirmed it in [`REPLICA_WAIT`] (or
    /// `WAIT` was refused): a failover now could lose it, so it is tracked
    /// in the outbox until the node records it, and queued again if lost.
    Unconfirmed(String),
}

impl Link {
    fn unsubscribed(master: edgeredis::Master) -> Link {
        Link {
            con: master.con,
            pushes: None,
            replicas: master.replicas,
        }
    }
}

impl Target {
    fn of(node: &Node) -> Result<Target> {
        Ok(Target {
            name: node.name.clone(),
            region: node.region.clone(),
            redis: node
                .redis
                .clone()
                .with_context(|| format!("node {} has no redis block", node.name))?,
        })
    }

    /// A connection to the node's master; with `channel`, speaking RESP3
    /// and subscribed to it before anything is queued, so no announcement
    /// is missed.
    async fn connect(&self, channel: Option<&str>) -> Result<Link> {
        let Some(channel) = channel else {
            return Ok(Link::unsubscribed(
                edgeredis::master_counted(&self.redis, &self.name).await?,
            ));
        };
        // Bounded: a hostile Redis flooding the channel while the
        // enqueue waits fills the queue, not this process; what is
        // dropped is found by the slow poll.
        let (tx, rx) = tokio::sync::mpsc::channel(PUSH_QUEUE);
        let tx = move |push: PushInfo| {
            if kept_push(&push) {
                tx.try_send(push).map_err(|_| ())
            } else {
                Err(())
            }
        };
        // ROLE and SUBSCRIBE in one round trip; nothing is written before
        // ROLE said master.
        let master = match edgeredis::master_subscribed(
            &self.redis,
            &self.name,
            std::sync::Arc::new(tx),
            channel,
        )
        .await
        {
            Ok(master) => master,
            // A server without RESP3 (Redis < 6): the slow poll alone.
            Err(e) if resp3_refused(&e) => {
                return Ok(Link::unsubscribed(
                    edgeredis::master_counted(&self.redis, &self.name).await?,
                ));
            }
            Err(e) => return Err(e),
        };
        Ok(Link {
            con: master.con,
            pushes: Some(rx),
            replicas: master.replicas,
        })
    }

    /// Queue `job` on the node's master. A master with replicas is asked,
    /// in the same round trip, to have every replica it listed confirm it
    /// (`WAIT <listed>`; Sentinel may promote any of them): a job a master
    /// acknowledged and lost in a failover before the promoted replica had
    /// it would otherwise be reported queued and be nowhere.
    async fn enqueue(&self, job: String, channel: Option<&str>) -> Result<Queued> {
        let mut link = self.connect(channel).await?;
        let queue = edgestate::keys::purge_queue(&self.region, &self.name);
        if link.replicas == 0 {
            redis::cmd("RPUSH")
                .arg(queue)
                .arg(job)
                .exec_async(&mut link.con)
                .await?;
            return Ok((link, Durability::Alone));
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .cmd("RPUSH")
            .arg(queue)
            .arg(job)
            .cmd("WAIT")
            .arg(link.replicas)
            .arg(u64::try_from(REPLICA_WAIT.as_millis()).unwrap_or(u64::MAX));
        let mut replies: Vec<redis::RedisResult<i64>> = pipe.query_async(&mut link.con).await?;
        let waited = replies.pop();
        // The RPUSH's own error: nothing was queued.
        replies.pop().unwrap_or(Ok(0))?;
        let durability = match waited {
            Some(Ok(n)) if usize::try_from(n).is_ok_and(|n| n >= link.replicas) => {
                Durability::Replicated
            }
            Some(Ok(n)) => Durability::Unconfirmed(format!(
                "{n} of its {} replica(s) confirmed it in {} ms",
                link.replicas,
                REPLICA_WAIT.as_millis()
            )),
            Some(Err(e)) => Durability::Unconfirmed(format!("WAIT refused: {e}")),
            None => Durability::Unconfirmed("no answer to WAIT".to_owned()),
        };
        Ok((link, durability))
    }

    /// The node's result in `key`: read now (it may be in already), then
    /// again on each announcement on `channel` and every
    /// [`FALLBACK_POLL`]. A lost connection is opened again (the caller's
    /// deadline bounds all of it).
    ///
    /// The first read is skipped on a link that was subscribed before its
    /// job was queued: no result can predate the subscription, so the
    /// announcement (or the slow poll) is the first news (one round trip
    /// less per node).
    async fn result(&self, key: &str, channel: &str, link: Link) -> String {
        let mut fresh = link.pushes.is_some();
        let mut link = Some(link);
        loop {
            if link.is_none() {
                link = self.connect(Some(channel)).await.ok();
            }
            if std::mem::take(&mut fresh) {
                // Subscribed before the RPUSH: nothing to read yet.
            } else if let Some(l) = link.as_mut() {
                match redis::cmd("HGET")
                    .arg(key)
                    .arg(&self.name)
                    .query_async::<Option<String>>(&mut l.con)
                    .await
                {
                    Ok(Some(v)) => return v,
                    Ok(None) => {}
                    Err(_) => link = None,
                }
            }
            let news = tokio::select! {
                () = tokio::time::sleep(FALLBACK_POLL) => News::Poll,
                news = announced(link.as_mut(), &self.name) => news,
            };
            match news {
                News::Result(v) => return v,
                News::Poll => {}
                News::Lost => link = None,
            }
        }
    }
}

/// What ended a wait for news of one node.
#[derive(Debug, PartialEq, Eq)]
enum News {
    /// Read the hash: the slow poll, or an announcement without its value
    /// (an older agent).
    Poll,
    /// The node's announcement, with its value.
    Result(String),
    /// The connection is gone.
    Lost,
}

/// What a channel message means to the waiter of `node`: its result, a
/// reason to read the hash, or nothing (another node's announcement on a
/// shared Redis). Pure.
fn news_of(data: &[redis::Value], node: &str) -> Option<News> {
    let message = match data.get(1) {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b),
        _ => return Some(News::Poll),
    };
    match purge::parse_announcement(&message) {
        (n, _) if n != node => None,
        (_, Some(value)) => Some(News::Result(value.to_owned())),
        (_, None) => Some(News::Poll),
    }
}

/// Whether connecting failed because the server does not speak RESP3.
fn resp3_refused(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<redis::RedisError>())
        .any(|r| r.kind() == redis::ErrorKind::RESP3NotSupported)
}

/// Until an announcement for `node` arrives or the connection is lost;
/// never without a subscription.
async fn announced(link: Option<&mut Link>, node: &str) -> News {
    let Some(pushes) = link.and_then(|l| l.pushes.as_mut()) else {
        return std::future::pending().await;
    };
    loop {
        match pushes.recv().await {
            Some(push) if push.kind == PushKind::Message => {
                if let Some(news) = news_of(&push.data, node) {
                    return news;
                }
            }
            Some(push) if push.kind == PushKind::Disconnection => return News::Lost,
            // Subscription confirmations.
            Some(_) => {}
            None => return News::Lost,
        }
    }
}

/// Where the time went (`EDGEFORM_TIMING=1
/// EDGEFORM_LOG=compiler::cli::purge=debug`), in ms
/// since the targets were known: every enqueue done, the first, median and
/// last result.
fn phases(targets: usize, queued: usize, enqueued: Duration, arrivals: &[Duration]) {
    let ms = |d: Option<&Duration>| d.map_or(-1.0, |d| d.as_secs_f64() * 1000.0);
    let mut sorted = arrivals.to_vec();
    sorted.sort();
    tracing::debug!(
        targets,
        queued,
        results = sorted.len(),
        enqueue_ms = ms(Some(&enqueued)),
        first_result_ms = ms(sorted.first()),
        median_result_ms = ms(sorted.get(sorted.len() / 2)),
        last_result_ms = ms(sorted.last()),
        "purge phases"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &str) -> Vec<redis::Value> {
        vec![
            redis::Value::BulkString(b"cdn:purge:done:x".to_vec()),
            redis::Value::BulkString(payload.as_bytes().to_vec()),
        ]
    }

    #[test]
    fn only_announcement_shaped_pushes_are_kept_for_the_waiter() {
        let push = |kind, data| PushInfo { kind, data };
        assert!(kept_push(&push(PushKind::Message, message("edge-1\t2"))));
        assert!(kept_push(&push(PushKind::Disconnection, vec![])));
        let big = "x".repeat(PUSH_MAX);
        assert!(!kept_push(&push(PushKind::Message, message(&big))));
        assert!(!kept_push(&push(
            PushKind::Message,
            vec![redis::Value::Array(vec![]), redis::Value::Nil]
        )));
        assert!(!kept_push(&push(PushKind::Invalidate, vec![])));
    }

    // The announcement carries the result.
    #[test]
    fn news_of_an_announcement() {
        // This node's, with its value: the result, no read.
        assert_eq!(
            news_of(&message("edge-1\n2"), "edge-1"),
            Some(News::Result("2".into()))
        );
        assert_eq!(
            news_of(&message("edge-1\nfailed: disk"), "edge-1"),
            Some(News::Result("failed: disk".into()))
        );
        // An older agent's bare name: read the hash.
        assert_eq!(news_of(&message("edge-1"), "edge-1"), Some(News::Poll));
        // Another node on the same Redis: nothing for this waiter.
        assert_eq!(news_of(&message("edge-2\n5"), "edge-1"), None);
        assert_eq!(news_of(&message("edge-2"), "edge-1"), None);
        // A message of another shape: read the hash.
        assert_eq!(news_of(&[], "edge-1"), Some(News::Poll));
    }
}
