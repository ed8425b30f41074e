//! The MQTT channel (README, "The agent"): one persistent session (clean_session =
//! false, QoS 1) per node.
//!
//! - Publishes the retained `online` status (last will: `offline`) and,
//!   through [`crate::health`], the retained health report.
//! - Subscribes to every node's health and status and feeds the
//!   [`crate::book::Book`] (routing-table nodes only; a new table asks for
//!   the retained messages again); with the broker away, the last known
//!   values stay in use, marked stale.
//! - Subscribes to `<prefix>/cmd/<node>` and hands each command to
//!   [`crate::commands::serve`], which runs them one at a time, in order.
//!   A command is acknowledged to the broker only once handled, so one
//!   published while the agent was down (or that arrived just before a
//!   crash) is delivered again; its id, recorded in local Redis before
//!   anything runs, makes sure it runs once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgestate::mqtt as wire;
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, Packet, Publish, QoS};

use crate::book::Book;

use crate::config::{Config, MqttConfig};
use crate::metrics::{Metrics, gauge_value};
use crate::routing::State;
use crate::shutdown::Shutdown;

/// The most a health change waits before routing sees it.
pub const FLUSH: Duration = Duration::from_millis(200);

/// The routing table's node names, when there is a table.
fn table_nodes(state: &State) -> Option<BTreeSet<String>> {
    state
        .router()
        .map(|r| r.table().nodes.keys().cloned().collect())
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
    let (commands, queue) = tokio::sync::mpsc::unbounded_channel::<Publish>();
    tasks.spawn(crate::commands::serve(
        config.clone(),
        mqtt.clone(),
        client.clone(),
        queue,
        metrics.clone(),
        shutdown.clone(),
    ));
    // Nothing is tracked before the routing table is known.
    let mut nodes = table_nodes(&state);
    let mut book = Book::for_nodes(nodes.clone().unwrap_or_default());
    let mut generation = state.generation();
    // Jittered: after a broker restart hundreds of agents
    // must not reconnect in lock-step.
    let mut backoff =
        edgestate::backoff::Backoff::random(Duration::from_millis(250), Duration::from_secs(10));
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
            _ = recheck.tick() => {
                // A new routing table: track its nodes, and ask for the
                // retained reports and statuses again (the ones of new
                // nodes were ignored until now).
                if state.generation() != generation {
                    generation = state.generation();
                    nodes = table_nodes(&state);
                    if book.set_nodes(nodes.clone().unwrap_or_default()) && connected {
                        subscribe_health(&client, &prefix);
                    }
                }
                dirty |= !book.is_empty();
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
                subscribe_health(&client, &prefix);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if p.topic == cmd_topic {
                    if commands.send(p).is_err() {
                        // Not acknowledged: the broker delivers it again.
                        tracing::warn!(
                            "mqtt: the command handler has stopped; the command is redelivered later"
                        );
                    }
                    continue;
                }
                match book.take(&prefix, &p.topic, &p.payload) {
                    Ok(true) => {
                        metrics.health_messages.inc();
                        dirty = true;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        metrics.health_ignored.inc();
                        tracing::debug!(problem = %edgestate::untrusted::escape(&e), "mqtt: message ignored");
                    }
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
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                    () = shutdown.wait() => break,
                }
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

/// (Re)subscribe to every node's health and status: the broker sends the
/// retained ones again.
fn subscribe_health(client: &AsyncClient, prefix: &str) {
    let subscribed = client
        .try_subscribe(format!("{prefix}/health/+"), QoS::AtMostOnce)
        .and_then(|()| client.try_subscribe(format!("{prefix}/status/+"), QoS::AtMostOnce));
    if let Err(e) = subscribed {
        tracing::error!(cause = %e, "mqtt: cannot queue the health subscriptions");
    }
}
