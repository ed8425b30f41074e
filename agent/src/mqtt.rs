//! The MQTT channel (SPEC §4): one persistent session (clean_session =
//! false, QoS 1) per node.
//!
//! - Publishes the retained `online` status (last will: `offline`) and,
//!   through [`crate::health`], the retained health report.
//! - Subscribes to every node's health and status and feeds them to
//!   routing; with the broker away, the last known values stay in use,
//!   marked stale.
//! - Subscribes to `<prefix>/cmd/<node>` and runs commands one at a time,
//!   in order. A command is acknowledged to the broker only once handled,
//!   so one published while the agent was down (or that arrived just
//!   before a crash) is delivered again; its id, recorded in local Redis
//!   before anything runs, makes sure it runs once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use edgestate::mqtt::{self as wire, Command, CommandResult, HealthReport, Message, Outcome};
use edgestate::route::{Health, NodeHealth};
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, Packet, Publish, QoS};

use crate::config::{Config, MqttConfig};
use crate::metrics::{Metrics, gauge_value};
use crate::routing::State;
use crate::shutdown::Shutdown;

/// A node silent for this many of its report intervals is offline.
pub const SILENT_AFTER_INTERVALS: u64 = 3;
/// … and never sooner than this.
pub const MIN_SILENCE: Duration = Duration::from_secs(15);

/// The most a health change waits before routing sees it.
pub const FLUSH: Duration = Duration::from_millis(200);

/// How long a command id is remembered at least.
pub const ID_TTL_SECS: u64 = 7 * 24 * 3600;

/// Every node's last health and status as heard on the broker.
#[derive(Debug, Default)]
pub struct Book {
    nodes: BTreeMap<String, Entry>,
}

#[derive(Debug, Default)]
struct Entry {
    report: Option<HealthReport>,
    /// When the last report arrived (this host's clock: immune to skew).
    received: Option<Instant>,
    /// From `<prefix>/status/<node>`.
    online: Option<bool>,
    stale: bool,
}

impl Book {
    /// Take a retained/new message; `false` when it was not ours to read.
    pub fn take(&mut self, prefix: &str, topic: &str, payload: &[u8]) -> Result<bool, String> {
        self.take_at(prefix, topic, payload, Instant::now())
    }

    /// [`Book::take`] at `now`.
    pub fn take_at(
        &mut self,
        prefix: &str,
        topic: &str,
        payload: &[u8],
        now: Instant,
    ) -> Result<bool, String> {
        match wire::read_message(prefix, topic, payload)? {
            Some(Message::Report(node, None)) => {
                // A cleared retained report: the node is gone.
                if let Some(e) = self.nodes.get_mut(node) {
                    e.report = None;
                }
                Ok(true)
            }
            Some(Message::Report(node, Some(report))) => {
                let e = self.nodes.entry(node.to_owned()).or_default();
                e.report = Some(*report);
                e.received = Some(now);
                e.stale = false;
                Ok(true)
            }
            Some(Message::Status(node, online)) => {
                let e = self.nodes.entry(node.to_owned()).or_default();
                e.online = online;
                e.stale = false;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The broker went away: keep everything, marked stale.
    pub fn mark_stale(&mut self) {
        for e in self.nodes.values_mut() {
            e.stale = true;
        }
    }

    /// Whether any node is known (nothing to re-check otherwise).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The snapshot routing reads, at `now`. A node is online when its
    /// status says so, or — with no status heard — when it has a report;
    /// `offline` (the last will) always wins. While the broker is
    /// reachable (`connected`), a node whose reports stopped for
    /// [`SILENT_AFTER_INTERVALS`] of its own interval (at least
    /// [`MIN_SILENCE`]) counts as offline even if no will came (a hung
    /// agent keeps its connection); with the broker away nothing ages —
    /// the last known values stay in use, marked stale.
    #[must_use]
    pub fn health_at(&self, now: Instant, connected: bool) -> Health {
        let silent = |e: &Entry| {
            let (Some(r), Some(at)) = (&e.report, e.received) else {
                return false;
            };
            let limit = Duration::from_millis(
                r.interval_ms
                    .unwrap_or(5000)
                    .saturating_mul(SILENT_AFTER_INTERVALS),
            )
            .max(MIN_SILENCE);
            connected && now.saturating_duration_since(at) > limit
        };
        let mut h = self.health();
        for (name, n) in &mut h.nodes {
            if self.nodes.get(name).is_some_and(silent) {
                n.online = Some(false);
            }
        }
        h
    }

    /// [`Book::health_at`] without the silence rule (as if nothing aged).
    #[must_use]
    pub fn health(&self) -> Health {
        Health {
            nodes: self
                .nodes
                .iter()
                .filter(|(_, e)| e.report.is_some() || e.online.is_some())
                .map(|(name, e)| {
                    let r = e.report.as_ref();
                    (
                        name.clone(),
                        NodeHealth {
                            online: Some(e.online.unwrap_or(r.is_some())),
                            play_sessions: r.and_then(|r| r.play_sessions),
                            out_kbit: r.and_then(|r| r.out_kbit),
                            streams: r.and_then(|r| r.streams.clone()),
                            stale: e.stale,
                        },
                    )
                })
                .collect(),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Run the channel until shutdown. Broker outages are logged and retried
/// with backoff; they never stop the agent.
///
/// # Errors
/// Only setup errors (a password variable that is not set, a CA file that
/// cannot be read).
pub async fn run(
    config: Arc<Config>,
    mqtt: MqttConfig,
    state: Arc<State>,
    metrics: Arc<Metrics>,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let prefix = mqtt.topic_prefix.clone();
    let node = config.node.clone();
    let status = wire::status_topic(&prefix, &node);
    let cmd_topic = wire::cmd_topic(&prefix, &node);
    let mut options = edgemqtt::options(&mqtt.broker, &format!("edgeform-agent-{node}"), true)?;
    options.set_last_will(LastWill::new(
        &status,
        wire::OFFLINE,
        QoS::AtLeastOnce,
        true,
    ));
    options.set_manual_acks(true);
    let (client, mut events) = AsyncClient::new(options, 1024);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::health::report(
        config.clone(),
        client.clone(),
        wire::health_topic(&prefix, &node),
        metrics.clone(),
        shutdown.clone(),
    ));
    let (commands, queue) = tokio::sync::mpsc::channel::<Publish>(1024);
    tasks.spawn(run_commands(
        config.clone(),
        mqtt.clone(),
        client.clone(),
        queue,
        metrics.clone(),
        shutdown.clone(),
    ));
    let mut book = Book::default();
    let mut backoff = Duration::from_millis(250);
    let mut down_since: Option<std::time::Instant> = None;
    // Health changes are handed to routing at most every FLUSH, so a burst
    // of reports (hundreds of nodes reconnecting) costs one snapshot, not
    // one per message.
    let mut flush = tokio::time::interval(FLUSH);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dirty = false;
    // Silence is a matter of time passing: look again every second.
    let mut recheck = tokio::time::interval(Duration::from_secs(1));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut connected = false;
    loop {
        let event = tokio::select! {
            e = events.poll() => e,
            _ = recheck.tick(), if !book.is_empty() => {
                dirty = true;
                continue;
            }
            _ = flush.tick(), if dirty => {
                let health = book.health_at(Instant::now(), connected);
                metrics
                    .cluster_nodes_reporting
                    .set(gauge_value(health.nodes.len() as u64));
                state.set_health(health);
                dirty = false;
                continue;
            }
            () = shutdown.wait() => break,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                backoff = Duration::from_millis(250);
                connected = true;
                match down_since.take() {
                    Some(t) => {
                        tracing::info!(broker = %mqtt.broker.url, after = ?t.elapsed(), session_present = ack.session_present, "mqtt: reconnected")
                    }
                    None => {
                        tracing::info!(broker = %mqtt.broker.url, session_present = ack.session_present, "mqtt: connected")
                    }
                }
                metrics.mqtt_connected.set(1);
                // Queued on the request channel; sent by this loop.
                let subscribed = client
                    .try_subscribe(&cmd_topic, QoS::AtLeastOnce)
                    .and_then(|()| {
                        client.try_subscribe(format!("{prefix}/health/+"), QoS::AtMostOnce)
                    })
                    .and_then(|()| {
                        client.try_subscribe(format!("{prefix}/status/+"), QoS::AtMostOnce)
                    })
                    .and_then(|()| {
                        client.try_publish(&status, QoS::AtLeastOnce, true, wire::ONLINE)
                    });
                if let Err(e) = subscribed {
                    tracing::error!(cause = %e, "mqtt: cannot queue the subscriptions");
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if p.topic == cmd_topic {
                    if let Err(e) = commands.try_send(p) {
                        // Not acknowledged: the broker delivers it again.
                        tracing::warn!(cause = %e, "mqtt: command queue full; the command is redelivered later");
                    }
                    continue;
                }
                match book.take(&prefix, &p.topic, &p.payload) {
                    Ok(true) => {
                        metrics.health_messages.inc();
                        dirty = true;
                    }
                    Ok(false) => {}
                    Err(e) => tracing::debug!(problem = %e, "mqtt: message ignored"),
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics.mqtt_connected.set(0);
                connected = false;
                if down_since.is_none() {
                    down_since = Some(std::time::Instant::now());
                    tracing::warn!(broker = %mqtt.broker.url, cause = %edgemqtt::describe(&e), "mqtt: broker unreachable; routing keeps the last known health (stale), retrying");
                    book.mark_stale();
                    state.set_health(book.health_at(Instant::now(), false));
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.wait() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
    goodbye(&client, &mut events, &status).await;
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// On a clean stop: say `offline` (the will only fires on a lost
/// connection) and disconnect, without waiting long for a broker that
/// is not there.
async fn goodbye(client: &AsyncClient, events: &mut EventLoop, status: &str) {
    if client
        .try_publish(status, QoS::AtLeastOnce, true, wire::OFFLINE)
        .is_err()
    {
        return;
    }
    let _ = client.try_disconnect();
    let drained = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match events.poll().await {
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    let _ = drained.await;
}

/// Handle commands one at a time, in arrival order; acknowledge each to
/// the broker only once its result is recorded and published.
async fn run_commands(
    config: Arc<Config>,
    mqtt: MqttConfig,
    client: AsyncClient,
    mut queue: tokio::sync::mpsc::Receiver<Publish>,
    metrics: Arc<Metrics>,
    mut shutdown: Shutdown,
) {
    let mut con: Option<redis::aio::MultiplexedConnection> = None;
    loop {
        let p = tokio::select! {
            p = queue.recv() => match p { Some(p) => p, None => return },
            () = shutdown.wait() => return,
        };
        // A shutdown mid-command drops (and kills) the action; the command
        // stays unacknowledged and its id recorded as started, so after
        // the restart it is reported as interrupted, not run again.
        let handled = tokio::select! {
            r = handle(&config, &mqtt, &mut con, &p.payload) => r,
            () = shutdown.wait() => return,
        };
        if let Some(result) = handled {
            Metrics::count(&metrics.commands, outcome_name(result.status));
            let topic = wire::result_topic(&mqtt.topic_prefix, &config.node, &result.id);
            let payload = serde_json::to_vec(&result).unwrap_or_default();
            if let Err(e) = client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await
            {
                tracing::warn!(cause = %e, id = %result.id, "mqtt: cannot queue the result");
            }
        }
        if let Err(e) = client.ack(&p).await {
            tracing::warn!(cause = %e, "mqtt: cannot acknowledge the command");
        }
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "ok",
        Outcome::Failed => "failed",
        Outcome::Refused => "refused",
        Outcome::Expired => "expired",
    }
}

fn result(
    cmd_id: &str,
    node: &str,
    action: &str,
    status: Outcome,
    reason: String,
) -> CommandResult {
    CommandResult {
        id: cmd_id.to_owned(),
        node: node.to_owned(),
        action: action.to_owned(),
        status,
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        duration_ms: 0,
        reason: Some(reason),
        finished_at: unix_now(),
    }
}

/// One command: check, claim its id in Redis, run, record. `None` when
/// there is nothing to answer (no usable id).
async fn handle(
    config: &Config,
    mqtt: &MqttConfig,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    payload: &[u8],
) -> Option<CommandResult> {
    let node = config.node.as_str();
    let cmd: Command = match serde_json::from_slice(payload) {
        Ok(c) => c,
        Err(e) => {
            let id = serde_json::from_slice::<serde_json::Value>(payload)
                .ok()
                .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_owned))
                .filter(|id| wire::is_topic_level(id));
            tracing::warn!(cause = %e, id = id.as_deref().unwrap_or("-"), "command: malformed; refused");
            return id.map(|id| {
                result(
                    &id,
                    node,
                    "",
                    Outcome::Refused,
                    format!("malformed command: {e}"),
                )
            });
        }
    };
    if !wire::is_topic_level(&cmd.id) {
        tracing::warn!(id = %cmd.id, "command: the id cannot be a topic level; dropped");
        return None;
    }
    let now = unix_now();
    let verdict = crate::commands::check(
        &cmd,
        node,
        &config.actions,
        mqtt.command_key.as_deref(),
        now,
    );
    // A command that fails authentication does not get to claim its id.
    if let Err(r) = &verdict
        && (r.reason.starts_with("unsigned") || r.reason.starts_with("bad signature"))
    {
        tracing::warn!(id = %cmd.id, action = %cmd.action, reason = %r.reason, "command refused");
        return Some(result(
            &cmd.id,
            node,
            &cmd.action,
            r.status,
            r.reason.clone(),
        ));
    }
    let key = edgestate::keys::command(&cmd.id);
    let ttl = ID_TTL_SECS.max(cmd.expires_at.saturating_sub(now) + 86_400);
    let claim = claim(config, con, &key, ttl, now).await;
    match claim {
        Err(e) => {
            let reason = format!(
                "local redis unreachable ({e:#}): the id cannot be recorded, so the command is not run (it must run at most once)"
            );
            tracing::warn!(id = %cmd.id, reason = %reason, "command refused");
            return Some(result(&cmd.id, node, &cmd.action, Outcome::Refused, reason));
        }
        Ok(Some(previous)) => {
            tracing::info!(id = %cmd.id, "command: duplicate id; not run again");
            if let Ok(mut earlier) = serde_json::from_str::<CommandResult>(&previous) {
                earlier.reason = Some(match earlier.reason {
                    Some(r) => format!("{r} (duplicate id: this is the result of the first run)"),
                    None => "duplicate id: this is the result of the first run".into(),
                });
                return Some(earlier);
            }
            return Some(result(
                &cmd.id,
                node,
                &cmd.action,
                Outcome::Refused,
                "duplicate id: a command with this id started earlier and never finished (the agent stopped while it ran); not run again".into(),
            ));
        }
        Ok(None) => {}
    }
    let out = match verdict {
        Err(r) => {
            tracing::warn!(id = %cmd.id, action = %cmd.action, reason = %r.reason, "command refused");
            result(&cmd.id, node, &cmd.action, r.status, r.reason)
        }
        Ok(argv) => {
            let timeout = config
                .actions
                .get(&cmd.action)
                .map_or(crate::config::DEFAULT_ACTION_TIMEOUT, |a| a.timeout);
            tracing::info!(id = %cmd.id, action = %cmd.action, argv = ?argv, "command: running");
            let ran = crate::commands::run(&argv, timeout, node, &cmd.id).await;
            tracing::info!(id = %cmd.id, status = outcome_name(ran.status), exit_code = ?ran.exit_code, elapsed = ?ran.duration, "command finished");
            CommandResult {
                id: cmd.id.clone(),
                node: node.to_owned(),
                action: cmd.action.clone(),
                status: ran.status,
                exit_code: ran.exit_code,
                stdout: ran.stdout,
                stderr: ran.stderr,
                duration_ms: u64::try_from(ran.duration.as_millis()).unwrap_or(u64::MAX),
                reason: ran.reason,
                finished_at: unix_now(),
            }
        }
    };
    if let Err(e) = record(config, con, &key, ttl, &out).await {
        tracing::warn!(id = %cmd.id, cause = %format!("{e:#}"), "command: result not recorded in redis (a duplicate will be reported as interrupted)");
    }
    Some(out)
}

/// `SET key running NX EX ttl`: `None` when claimed now, else what the
/// earlier claim holds.
async fn claim(
    config: &Config,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    key: &str,
    ttl: u64,
    now: u64,
) -> anyhow::Result<Option<String>> {
    let attempt = async {
        let c = edgeredis::reuse(&config.redis, &config.node, con).await?;
        let marker = serde_json::json!({"started_at": now}).to_string();
        let (set, previous): (Option<String>, Option<String>) = redis::pipe()
            .cmd("SET")
            .arg(key)
            .arg(&marker)
            .arg("NX")
            .arg("EX")
            .arg(ttl)
            .cmd("GET")
            .arg(key)
            .query_async(c)
            .await?;
        anyhow::Ok(if set.is_some() {
            None
        } else {
            previous.or(Some(String::new()))
        })
    };
    let r = tokio::time::timeout(Duration::from_secs(3), attempt)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within 3s")));
    if r.is_err() {
        *con = None;
    }
    r
}

async fn record(
    config: &Config,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    key: &str,
    ttl: u64,
    out: &CommandResult,
) -> anyhow::Result<()> {
    let attempt = async {
        let c = edgeredis::reuse(&config.redis, &config.node, con).await?;
        redis::cmd("SET")
            .arg(key)
            .arg(serde_json::to_string(out)?)
            .arg("EX")
            .arg(ttl)
            .query_async::<()>(c)
            .await?;
        anyhow::Ok(())
    };
    let r = tokio::time::timeout(Duration::from_secs(3), attempt)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within 3s")));
    if r.is_err() {
        *con = None;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str, sessions: u64) -> Vec<u8> {
        serde_json::to_vec(&HealthReport {
            node: node.into(),
            ts: 1,
            interval_ms: Some(5000),
            play_sessions: Some(sessions),
            out_kbit: Some(100),
            streams: Some(vec!["s".into()]),
            config: wire::ConfigState::default(),
            purge: wire::PurgeState::default(),
            redis: wire::RedisState::default(),
            version: "0".into(),
        })
        .unwrap()
    }

    #[test]
    fn book_follows_reports_status_and_outages() {
        let mut b = Book::default();
        assert_eq!(b.take("p", "p/health/a", &report("a", 3)), Ok(true));
        assert_eq!(b.take("p", "p/status/b", b"online"), Ok(true));
        assert_eq!(b.take("p", "other/health/a", &report("a", 3)), Ok(false));
        assert!(
            b.take("p", "p/health/c", &report("x", 1)).is_err(),
            "node mismatch"
        );
        assert!(b.take("p", "p/health/c", b"{").is_err());
        assert!(b.take("p", "p/status/c", b"maybe").is_err());
        let h = b.health();
        assert_eq!(h.nodes.len(), 2);
        assert_eq!(
            h.nodes["a"].online,
            Some(true),
            "a report without status: online"
        );
        assert_eq!(h.nodes["a"].play_sessions, Some(3));
        assert_eq!(h.nodes["b"].play_sessions, None);
        // The last will.
        b.take("p", "p/status/a", b"offline").unwrap();
        assert_eq!(b.health().nodes["a"].online, Some(false));
        assert_eq!(b.health().nodes["a"].play_sessions, Some(3), "kept");
        b.mark_stale();
        assert!(b.health().nodes.values().all(|n| n.stale));
        b.take("p", "p/health/a", &report("a", 5)).unwrap();
        assert!(!b.health().nodes["a"].stale && b.health().nodes["b"].stale);
        // Cleared retained messages forget the node.
        b.take("p", "p/health/a", b"").unwrap();
        b.take("p", "p/status/a", b"").unwrap();
        assert!(!b.health().nodes.contains_key("a"));
    }

    #[test]
    fn silent_nodes_go_offline_only_while_connected() {
        let mut b = Book::default();
        let t0 = Instant::now();
        b.take_at("p", "p/health/a", &report("a", 3), t0).unwrap();
        b.take_at("p", "p/status/a", b"online", t0).unwrap();
        b.take_at("p", "p/status/b", b"online", t0).unwrap();
        // interval_ms 5000 → silent after 15 s.
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(b.health_at(at(14), true).nodes["a"].online, Some(true));
        assert_eq!(b.health_at(at(16), true).nodes["a"].online, Some(false));
        assert_eq!(
            b.health_at(at(16), true).nodes["b"].online,
            Some(true),
            "no report: status rules"
        );
        assert_eq!(
            b.health_at(at(600), false).nodes["a"].online,
            Some(true),
            "with the broker away nothing ages"
        );
        b.take_at("p", "p/health/a", &report("a", 4), at(20))
            .unwrap();
        assert_eq!(
            b.health_at(at(21), true).nodes["a"].online,
            Some(true),
            "reporting again"
        );
    }
}
