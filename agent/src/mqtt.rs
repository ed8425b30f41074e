//! The MQTT channel (README, "The agent"): one persistent session (clean_session =
//! false, QoS 1) per node, plus, while it reads some node's health
//! directly, the clean-session [`crate::direct`] reader.
//!
//! - Publishes the retained `online` status (last will: `offline`) and,
//!   through [`crate::health`], the retained health report.
//! - Subscribes to every node's status and every region's health summary
//!   (`summary/+`, [`crate::summary`]) and feeds the [`crate::book::Book`]
//!   (routing-table nodes only; a new table asks for the retained messages
//!   again); a region without a fresh summary, and the agent's own region
//!   while it is the region's summarizer, are read node by node
//!   (`health/<node>`) on a second connection read in batches
//!   ([`crate::direct`]). With the broker away, the last known values stay
//!   in use, marked stale.
//! - Subscribes to `<prefix>/cmd/<node>` and hands each command to
//!   [`crate::commands::serve`], which runs them one at a time, in order.
//!   A command is acknowledged to the broker only once handled, so one
//!   published while the agent was down (or that arrived just before a
//!   crash) is delivered again; its id, recorded in local Redis before
//!   anything runs, makes sure it runs once.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgestate::mqtt as wire;
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, Packet, Publish, QoS, SubscribeFilter};

use crate::book::{Book, FRESH_SLACK};
use crate::direct::{self, Heard, Reader};
use crate::summary::{Election, Step};

use crate::config::{Config, MqttConfig};
use crate::metrics::{Metrics, gauge_value};
use crate::routing::State;
use crate::shutdown::Shutdown;

/// The most a health change waits before routing sees it.
pub const FLUSH: Duration = Duration::from_millis(200);

/// The routing table's nodes with their regions, when there is a table.
fn table_regions(state: &State) -> Option<BTreeMap<String, String>> {
    state.router().map(|r| {
        r.table()
            .nodes
            .iter()
            .map(|(n, node)| (n.clone(), node.region.clone()))
            .collect()
    })
}

/// The nodes whose `health/<node>` this agent reads itself at `now`: its
/// own region's while it summarizes it, and every node of a region with
/// no fresh summary (none yet, an older fleet, a failover in progress) —
/// once `grace` (the retained summaries' arrival after connecting) is over.
#[must_use]
pub fn direct_nodes(
    book: &Book,
    own_region: Option<&str>,
    holding: bool,
    now: Instant,
    grace_over: bool,
) -> BTreeSet<String> {
    book.regions()
        .into_iter()
        .filter(|(region, _)| {
            (holding && own_region == Some(*region))
                || (grace_over && !book.summary_fresh(region, now))
        })
        .flat_map(|(_, nodes)| nodes.into_iter().map(str::to_owned))
        .collect()
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
    // A region's summary carries every report of the region: up to
    // SUMMARY_MAX_BYTES (larger ones are refused by the book; larger
    // packets by the broker, `max_packet_size`).
    options.set_max_packet_size(wire::MAX_PACKET_BYTES, wire::MAX_PACKET_BYTES);
    let (client, mut events) = AsyncClient::new(options, 1024);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::health::report(
        config.clone(),
        client.clone(),
        wire::health_topic(&prefix, &node),
        metrics.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(crate::sites::publish(
        config.clone(),
        client.clone(),
        prefix.clone(),
        shutdown.clone(),
    ));
    let (commands, queue) = tokio::sync::mpsc::unbounded_channel::<Publish>();
    let mut dropped = Dropped::default();
    let mut ignored = Ignored::default();
    let mut reassert = Reassert::default();
    tasks.spawn(crate::commands::serve(
        config.clone(),
        mqtt.clone(),
        client.clone(),
        queue,
        metrics.clone(),
        shutdown.clone(),
    ));
    // Nothing is tracked before the routing table is known.
    let mut book = Book::for_table(table_regions(&state).unwrap_or_default());
    let mut generation = state.generation();
    let interval = config.health.interval;
    let mut own_region = book.region_of(&node).map(str::to_owned);
    // Regions whose summarizer claims this node's session may still
    // follow (it was moved out of them): unsubscribed while connected,
    // kept until the request is queued.
    let mut leave: BTreeSet<String> = BTreeSet::new();
    // Whether the broker kept this client's session at the last connection.
    let mut session_kept = false;
    let mut election = Election::new(&node, interval);
    // The nodes whose health topics are subscribed one by one, on the
    // direct reader's connection (opened while there are some).
    let mut direct: BTreeSet<String> = BTreeSet::new();
    let mut reader: Option<Reader> = None;
    let mut idle_since: Option<Instant> = None;
    // Its reports, taken one by one before the next event.
    let mut pending: VecDeque<Publish> = VecDeque::new();
    // Subscribe to every wanted one again (their retained reports).
    let mut resend = false;
    // Per-node subscriptions an earlier agent left in the persistent main
    // session: dropped a few at a time.
    let mut leftover: BTreeSet<String> = BTreeSet::new();
    let mut connected_at: Option<Instant> = None;
    // The summarizer publishes one summary per health interval.
    let mut summarize = tokio::time::interval(interval);
    let mut seq: u64 = 0;
    // A summary is due before the next interval (a node went down or up).
    let mut urgent = false;
    let mut last_urgent: Option<Instant> = None;
    summarize.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Jittered: after a broker restart hundreds of agents
    // must not reconnect in lock-step.
    let mut backoff =
        edgestate::backoff::Backoff::random(Duration::from_millis(250), Duration::from_secs(10));
    let mut down_since: Option<std::time::Instant> = None;
    // Health changes are handed to routing at most every FLUSH, so a burst
    // of reports (hundreds of nodes reconnecting) costs one snapshot, not
    // one per message. Only a change routing must see at once (`prompt`:
    // a node went down or up, a summary, a status) waits for the next
    // FLUSH; new load figures alone (a summarizer hears its region's
    // reports all the time) wait until the snapshot is an interval old —
    // the bound other regions' load figures have through the summaries —
    // so a summarizer builds a snapshot of every node about once an
    // interval, not once a second. Time alone makes a new one only when a
    // node falls silent or the connection comes or goes.
    let mut flush = tokio::time::interval(FLUSH);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dirty = false;
    let mut prompt = false;
    // Silence is a matter of time passing: look again every second.
    let mut recheck = tokio::time::interval(Duration::from_secs(1));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut connected = false;
    // When routing's snapshot was last taken, and whether connected then:
    // time alone changes it only when a node falls silent since, or the
    // connection came or went.
    let mut snapshot = (Instant::now(), false);
    loop {
        // Silence counts only while both connections hear the broker.
        let hearing = connected && reader.as_ref().is_none_or(Reader::connected);
        // A summarizer whose direct connection stays down stops
        // summarizing (its region's figures would only age): the others
        // then read the region themselves, and one takes the role over.
        let summarizing = connected
            && election.holding()
            && reader
                .as_ref()
                .and_then(|r| r.down_for(Instant::now()))
                .is_none_or(|d| d < interval * 2);
        let event = if let Some(p) = pending.pop_front() {
            Ok(Event::Incoming(Packet::Publish(p)))
        } else {
            tokio::select! {
                e = events.poll() => {
                    acknowledge_unless_command(&client, &e, &cmd_topic);
                    e
                }
                heard = direct::next(&mut reader) => {
                    match heard {
                        Heard::Reports(batch) => pending.extend(batch),
                        Heard::Connected => {
                            // A clean session: subscribe again at once.
                            direct.clear();
                            resend = true;
                            recheck.reset_immediately();
                        }
                        Heard::Lost => {
                            // Nothing read directly is heard: stale, as
                            // with the broker away (summaries refresh the
                            // others).
                            direct.clear();
                            resend = true;
                            book.mark_stale();
                            dirty = true;
                            prompt = true;
                        }
                    }
                    continue;
                }
                _ = recheck.tick() => {
                    if connected {
                        reassert.tick(&client, &status);
                    }
                    // A new routing table: track its nodes, and ask for the
                    // retained reports and statuses again (the ones of new
                    // nodes were ignored until now).
                    if state.generation() != generation {
                        generation = state.generation();
                        if book.set_table(table_regions(&state).unwrap_or_default()) {
                            // A kept session may follow any region's claims
                            // (the table arrived after the connection).
                            if session_kept {
                                leave.extend(book.regions().into_keys().map(str::to_owned));
                            }
                            let region = book.region_of(&node).map(str::to_owned);
                            if region != own_region {
                                leave.extend(own_region.take());
                                own_region = region;
                                election = Election::new(&node, interval);
                                if connected {
                                    election.connected(Instant::now());
                                }
                            }
                            if connected {
                                subscribe_health(&client, &prefix, own_region.as_deref());
                            }
                        }
                    }
                    if connected {
                        leave_regions(&client, &prefix, &mut leave, own_region.as_deref());
                    }
                    let now = Instant::now();
                    if connected && own_region.is_some() {
                        let holder = election.holder().map(str::to_owned);
                        let step = election.tick(
                            now,
                            holder.as_deref().and_then(|h| book.online(h)),
                            holder.as_deref().is_none_or(|h| book.region_of(h) == own_region.as_deref()),
                        );
                        publish_claim(&client, &prefix, own_region.as_deref(), step);
                    }
                    if connected {
                        let grace_over = connected_at.is_some_and(|t| now.saturating_duration_since(t) >= FRESH_SLACK);
                        let want = direct_nodes(&book, own_region.as_deref(), election.holding(), now, grace_over);
                        if grace_over || election.holding() {
                            read_directly(
                                &mut reader,
                                || Reader::start(&mqtt, &node, shutdown.clone()),
                                &prefix,
                                (&mut direct, &want, &mut resend),
                                &mut idle_since,
                                now,
                            );
                        }
                        follow_directly(&client, &prefix, &mut leftover, &BTreeSet::new(), &mut false);
                    }
                    let aged = book.silence_due(snapshot.0, now) || snapshot.1 != hearing;
                    dirty |= !book.is_empty() && aged;
                    prompt |= aged || now.saturating_duration_since(snapshot.0) >= interval;
                    continue;
                }
                _ = summarize.tick(), if summarizing => {
                    if let Some(region) = &own_region {
                        publish_summary(&client, &prefix, &book, region, &node, (election.epoch(), &mut seq), interval);
                    }
                    urgent = false;
                    continue;
                }
                _ = flush.tick(), if dirty && prompt => {
                    snapshot = (Instant::now(), hearing);
                    let health = book.health_at(snapshot.0, hearing);
                    metrics
                        .cluster_nodes_reporting
                        .set(gauge_value(health.nodes.len() as u64));
                    state.set_health(health);
                    dirty = false;
                    prompt = false;
                    // A node of the region went down or up (its report cleared,
                    // or its serving probe changed): summarized at once, not
                    // at the next interval.
                    if urgent && summarizing && let Some(region) = &own_region {
                        publish_summary(&client, &prefix, &book, region, &node, (election.epoch(), &mut seq), interval);
                    }
                    urgent = false;
                    continue;
                }
                () = shutdown.wait() => break,
            }
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                backoff.reset();
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
                let subscribed =
                    client
                        .try_subscribe(&cmd_topic, QoS::AtLeastOnce)
                        .and_then(|()| {
                            client.try_publish(&status, QoS::AtLeastOnce, true, wire::ONLINE)
                        });
                if let Err(e) = subscribed {
                    tracing::error!(cause = %e, "mqtt: cannot queue the subscriptions");
                }
                // A table loaded since the last check: tracked before the
                // retained summaries and statuses arrive.
                if state.generation() != generation {
                    generation = state.generation();
                    book.set_table(table_regions(&state).unwrap_or_default());
                    let region = book.region_of(&node).map(str::to_owned);
                    if region != own_region {
                        leave.extend(own_region.take());
                        own_region = region;
                        election = Election::new(&node, interval);
                    }
                }
                // A persistent session may follow the claims of a region
                // this node has left: while disconnected, or before this
                // process started (an agent restarted after the move).
                // Unsubscribing from one not followed costs one packet.
                session_kept = ack.session_present;
                if session_kept {
                    leave.extend(book.regions().into_keys().map(str::to_owned));
                } else {
                    leave.clear();
                }
                leave_regions(&client, &prefix, &mut leave, own_region.as_deref());
                subscribe_health(&client, &prefix, own_region.as_deref());
                // A persistent session keeps what an earlier agent
                // followed node by node on it: dropped at the checks.
                leftover = if ack.session_present {
                    book.regions()
                        .into_values()
                        .flatten()
                        .map(str::to_owned)
                        .collect()
                } else {
                    BTreeSet::new()
                };
                connected_at = Some(Instant::now());
                election.connected(Instant::now());
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if p.topic == status && &p.payload[..] == wire::OFFLINE.as_bytes() {
                    reassert.heard_offline(&client, &status);
                }
                if p.topic == cmd_topic {
                    if p.qos == QoS::AtMostOnce || p.payload.len() > wire::COMMAND_MAX_BYTES {
                        // Not a control host's (it sends commands at QoS 1,
                        // well under the limit): dropped here, so a flood
                        // of them grows no queue (the QoS 1 ones the
                        // broker holds in flight are bounded by its
                        // `max_inflight_messages`).
                        Metrics::count(&metrics.commands, "dropped");
                        dropped.note(p.qos, p.payload.len());
                        if p.qos != QoS::AtMostOnce {
                            let _ = client.try_ack(&p);
                        }
                        continue;
                    }
                    if commands.send(p).is_err() {
                        // Not acknowledged: the broker delivers it again.
                        tracing::warn!(
                            "mqtt: the command handler has stopped; the command is redelivered later"
                        );
                    }
                    continue;
                }
                match wire::parse_topic(&prefix, &p.topic) {
                    Some(wire::Topic::Summary(region)) => {
                        match book.take_summary_at(region, &p.payload, Instant::now()) {
                            Ok(Some(heard)) => {
                                if own_region.as_deref() == Some(region) {
                                    election.on_summary(&heard.by, heard.epoch, Instant::now());
                                }
                                metrics.health_messages.inc();
                                dirty = true;
                                prompt = true;
                            }
                            Ok(None) => {}
                            Err(e) => {
                                metrics.health_ignored.inc();
                                ignored.note("summary", &e.to_string());
                            }
                        }
                        continue;
                    }
                    Some(wire::Topic::SummaryLock(region)) => {
                        if own_region.as_deref() == Some(region) {
                            match wire::read_claim(region, &p.payload, |n| {
                                book.region_of(n).map(str::to_owned)
                            }) {
                                Ok(claim) => {
                                    let step = election.on_claim(claim, Instant::now());
                                    publish_claim(&client, &prefix, own_region.as_deref(), step);
                                }
                                Err(e) => {
                                    metrics.health_ignored.inc();
                                    ignored.note("summary claim", &e.to_string());
                                }
                            }
                        }
                        continue;
                    }
                    _ => {}
                }
                let (subject, report) = match wire::parse_topic(&prefix, &p.topic) {
                    Some(wire::Topic::Health(n)) => (Some(n.to_owned()), true),
                    Some(wire::Topic::Status(n)) => (Some(n.to_owned()), false),
                    _ => (None, false),
                };
                // A report of the summarizer's own region: its summary
                // goes out at once when the node went down or up.
                let about = subject.as_deref().is_some_and(|n| {
                    report && election.holding() && book.region_of(n) == own_region.as_deref()
                });
                let before = subject.as_deref().map(|n| book.availability(n));
                match book.take_delivered_at(
                    &prefix,
                    &p.topic,
                    &p.payload,
                    Instant::now(),
                    p.retain,
                ) {
                    Ok(true) => {
                        metrics.health_messages.inc();
                        dirty = true;
                        let changed = subject
                            .as_deref()
                            .zip(before)
                            .is_some_and(|(n, before)| book.availability(n) != before);
                        prompt |= changed || !report;
                        urgent |= changed && about;
                        // At once, unless one went out in the last FLUSH
                        // (then at the flush tick): a burst of changes
                        // costs one summary per FLUSH.
                        if urgent
                            && summarizing
                            && last_urgent.is_none_or(|t: Instant| t.elapsed() >= FLUSH)
                            && let Some(region) = &own_region
                        {
                            publish_summary(
                                &client,
                                &prefix,
                                &book,
                                region,
                                &node,
                                (election.epoch(), &mut seq),
                                interval,
                            );
                            last_urgent = Some(Instant::now());
                            urgent = false;
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        metrics.health_ignored.inc();
                        ignored.note("health or status message", &e);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics.mqtt_connected.set(0);
                connected = false;
                election.disconnected();
                if down_since.is_none() {
                    down_since = Some(std::time::Instant::now());
                    tracing::warn!(broker = %mqtt.broker.url, cause = %edgemqtt::describe(&e), "mqtt: broker unreachable; routing keeps the last known health (stale), retrying");
                    book.mark_stale();
                    snapshot = (Instant::now(), false);
                    state.set_health(book.health_at(snapshot.0, false));
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                    () = shutdown.wait() => break,
                }
            }
        }
    }
    drop(reader);
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

/// Acknowledge at once a QoS 1 message of this session that is not a
/// command (commands are acknowledged once handled). Acknowledgements are
/// manual for the whole session: a message left unacknowledged holds one
/// of the broker's in-flight places for this client (mosquitto's
/// `max_inflight_messages`, 20), is sent again on every reconnection, and
/// once they are all taken the broker holds back every later QoS 1
/// message, commands included. Nothing subscribes at QoS 1 but the
/// commands today; an older agent's session may still deliver so.
fn acknowledge_unless_command(
    client: &AsyncClient,
    event: &Result<Event, rumqttc::ConnectionError>,
    cmd_topic: &str,
) {
    if let Ok(Event::Incoming(Packet::Publish(p))) = event
        && p.qos != QoS::AtMostOnce
        && p.topic != cmd_topic
        && let Err(e) = client.try_ack(p)
    {
        // It holds its in-flight place until the next connection, where
        // the broker sends it again.
        tracing::warn!(cause = %e, topic = %edgestate::untrusted::escape(&p.topic), "mqtt: acknowledgement not queued");
    }
}

/// Its own status heard `offline` while connected (a stale last will, or
/// another client's forgery where the broker lets anyone write it): say
/// `online` again, at most once a second; a forger repeating it faster
/// gets the last answer at the next [`Reassert::tick`].
#[derive(Default)]
struct Reassert {
    last: Option<Instant>,
    due: bool,
}

impl Reassert {
    fn heard_offline(&mut self, client: &AsyncClient, status: &str) {
        self.due = true;
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.tick(client, status);
        }
    }

    /// Say it, if it is owed (connected: the caller's to know).
    fn tick(&mut self, client: &AsyncClient, status: &str) {
        if !std::mem::take(&mut self.due) {
            return;
        }
        self.last = Some(Instant::now());
        tracing::info!("mqtt: heard this node reported offline while connected; said online again");
        if let Err(e) = client.try_publish(status, QoS::AtLeastOnce, true, wire::ONLINE) {
            tracing::warn!(cause = %e, "mqtt: cannot queue the online status");
        }
    }
}

/// Health messages, summaries and claims refused (malformed, forged,
/// about a node the table lacks): each at `debug`, and a warning at most
/// once a minute with how many since the last one (a forger repeating
/// them must not flood the log; `health_ignored` counts every one).
#[derive(Default)]
struct Ignored {
    logged: Option<Instant>,
    since: u64,
}

impl Ignored {
    fn note(&mut self, what: &str, problem: &str) {
        let problem = edgestate::untrusted::escape(problem);
        self.since += 1;
        if self
            .logged
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            tracing::debug!(%problem, "mqtt: {what} ignored");
            return;
        }
        tracing::warn!(
            ignored = self.since,
            %problem,
            "mqtt: {what} ignored (with the others since the last warning; at most one warning a minute)"
        );
        self.logged = Some(Instant::now());
        self.since = 0;
    }
}

/// Commands dropped as they arrive, logged at most once a second (a
/// flood of them must not flood the log too).
#[derive(Default)]
struct Dropped {
    logged: Option<Instant>,
    since: u64,
}

impl Dropped {
    fn note(&mut self, qos: QoS, bytes: usize) {
        self.since += 1;
        if self
            .logged
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        tracing::warn!(
            ?qos,
            bytes,
            dropped = self.since,
            "command dropped: a control host sends commands at QoS 1 and under {} bytes",
            wire::COMMAND_MAX_BYTES
        );
        self.logged = Some(Instant::now());
        self.since = 0;
    }
}

/// (Re)subscribe to every node's status, every region's summary and the
/// own region's summarizer claim: the broker sends the retained ones
/// again. The session is persistent: an older agent's `health/+` is
/// dropped (its per-node health topics are subscribed by
/// [`follow_directly`]).
fn subscribe_health(client: &AsyncClient, prefix: &str, own_region: Option<&str>) {
    let mut filters = vec![
        SubscribeFilter::new(format!("{prefix}/status/+"), QoS::AtMostOnce),
        SubscribeFilter::new(format!("{prefix}/summary/+"), QoS::AtMostOnce),
    ];
    // The claim at QoS 0 (it is published at QoS 1, retained): every
    // subscription sends the retained claim again, and a disconnection
    // starts the election over, so no claim is missed; at QoS 1 the
    // persistent session would keep every claim made while this agent
    // was away and hand them all over on its return.
    if let Some(region) = own_region {
        filters.push(SubscribeFilter::new(
            wire::summary_lock_topic(prefix, region),
            QoS::AtMostOnce,
        ));
    }
    let subscribed = client
        .try_unsubscribe(format!("{prefix}/health/+"))
        .and_then(|()| client.try_subscribe_many(filters));
    if let Err(e) = subscribed {
        tracing::error!(cause = %e, "mqtt: cannot queue the health subscriptions");
    }
}

/// Stop following the summarizer claims of the regions in `leave`
/// (regions this node has left: their claims are not ours to read, and
/// would cost a message each), never `own`. A region stays in `leave`
/// until its UNSUBSCRIBE is queued (the request channel is bounded: the
/// rest wait for the next check).
fn leave_regions(
    client: &AsyncClient,
    prefix: &str,
    leave: &mut BTreeSet<String>,
    own: Option<&str>,
) {
    if let Some(own) = own {
        leave.remove(own);
    }
    while let Some(region) = leave.first() {
        if let Err(e) = client.try_unsubscribe(wire::summary_lock_topic(prefix, region)) {
            tracing::debug!(region, cause = %e, "mqtt: leaving a region's claims waits for the next check");
            return;
        }
        leave.pop_first();
    }
}

/// The most UNSUBSCRIBE packets queued per check (one topic each): the
/// request channel is bounded.
const UNSUBSCRIBE_PER_CHECK: usize = 200;

/// Subscribe to the health topics of the nodes of `want` not yet
/// followed (all of them when `resend`), unsubscribe from those no longer
/// wanted (at most [`UNSUBSCRIBE_PER_CHECK`] now, the rest at the next
/// check).
fn follow_directly(
    client: &AsyncClient,
    prefix: &str,
    direct: &mut BTreeSet<String>,
    want: &BTreeSet<String>,
    resend: &mut bool,
) {
    if *direct == *want && !*resend {
        return;
    }
    let added: Vec<SubscribeFilter> = want
        .iter()
        .filter(|n| *resend || !direct.contains(*n))
        .map(|n| SubscribeFilter::new(wire::health_topic(prefix, n), QoS::AtMostOnce))
        .collect();
    // At most 500 filters per SUBSCRIBE packet.
    for chunk in added.chunks(500) {
        if let Err(e) = client.try_subscribe_many(chunk.to_vec()) {
            // Retried at the next check.
            tracing::warn!(cause = %e, "mqtt: cannot queue the direct health subscriptions");
            return;
        }
    }
    if !added.is_empty() {
        tracing::debug!(nodes = want.len(), "mqtt: health topics read directly");
    }
    *resend = false;
    direct.extend(want.iter().cloned());
    let dropped: Vec<String> = direct
        .difference(want)
        .take(UNSUBSCRIBE_PER_CHECK)
        .cloned()
        .collect();
    for n in dropped {
        if client
            .try_unsubscribe(wire::health_topic(prefix, &n))
            .is_err()
        {
            return;
        }
        direct.remove(&n);
    }
}

/// Follow `want` on the direct reader: opened when there is a node to
/// read directly, closed after [`direct::IDLE_CLOSE`] with none; the
/// subscriptions go out once it is connected.
fn read_directly(
    reader: &mut Option<Reader>,
    open: impl FnOnce() -> anyhow::Result<Reader>,
    prefix: &str,
    (direct, want, resend): (&mut BTreeSet<String>, &BTreeSet<String>, &mut bool),
    idle_since: &mut Option<Instant>,
    now: Instant,
) {
    if want.is_empty() {
        let since = *idle_since.get_or_insert(now);
        if reader.is_some() && now.saturating_duration_since(since) >= direct::IDLE_CLOSE {
            *reader = None;
            direct.clear();
            tracing::debug!("mqtt: no health topic read directly; its connection is closed");
            return;
        }
    } else {
        *idle_since = None;
        if reader.is_none() {
            match open() {
                Ok(r) => {
                    *reader = Some(r);
                    direct.clear();
                    *resend = true;
                }
                Err(e) => {
                    tracing::error!(cause = %e, "mqtt: cannot open the direct health connection");
                    return;
                }
            }
        }
    }
    if let Some(r) = reader.as_ref().filter(|r| r.connected()) {
        follow_directly(&r.client, prefix, direct, want, resend);
    }
}

/// Publish the region's summary (retained, QoS 0: the next one supersedes
/// a lost one, and a slow broker never queues old ones).
fn publish_summary(
    client: &AsyncClient,
    prefix: &str,
    book: &Book,
    region: &str,
    node: &str,
    (epoch, seq): (u64, &mut u64),
    interval: Duration,
) {
    let summary = book.summary_at(
        region,
        node,
        (epoch, *seq),
        interval,
        crate::unix_now(),
        Instant::now(),
    );
    *seq += 1;
    let payload = serde_json::to_vec(&summary).unwrap_or_default();
    if let Err(e) = client.try_publish(
        wire::summary_topic(prefix, region),
        QoS::AtMostOnce,
        true,
        payload,
    ) {
        tracing::debug!(cause = %e, "mqtt: summary not queued");
    }
}

/// Publish a claim of the region's summarizer role (retained, QoS 1).
fn publish_claim(client: &AsyncClient, prefix: &str, region: Option<&str>, step: Step) {
    let (Step::Claim(mut claim), Some(region)) = (step, region) else {
        return;
    };
    claim.ts = crate::unix_now();
    tracing::info!(
        region,
        epoch = claim.epoch,
        "mqtt: claiming the region's health summaries"
    );
    let payload = serde_json::to_vec(&claim).unwrap_or_default();
    if let Err(e) = client.try_publish(
        wire::summary_lock_topic(prefix, region),
        QoS::AtLeastOnce,
        true,
        payload,
    ) {
        tracing::warn!(cause = %e, "mqtt: summary claim not queued");
    }
}
