//! The direct health reader: the `health/<node>` topics an agent reads
//! node by node ([`crate::mqtt::direct_nodes`]: its own region's while it
//! summarizes it, a region with no fresh summary) come on a second MQTT
//! connection of their own, read in batches every [`PACE`].
//!
//! A summarizer at 1,000 nodes in 4 regions takes its region's 50 reports
//! a second: read as they come, each is a wake-up of the runtime, an
//! `epoll_wait` and a socket read — most of its CPU. Read every [`PACE`],
//! they cost a few wake-ups a second, and commands and purges, on the main
//! connection, wait for none of it. The pace adds at most [`PACE`] to a
//! report's way into the summary and the summarizer's own routing, well
//! inside the interval load figures already wait (docs/operations.md,
//! "Health summaries").
//!
//! The connection has a clean session and no last will; it is opened when
//! there is a node to read directly and closed after [`IDLE_CLOSE`] with
//! none, so an agent that is not a summarizer keeps one connection.
//! Only `health/<node>` messages are handed on: whatever else the broker
//! sends on it (it subscribes to nothing else) is dropped here.

use std::time::Duration;

use edgestate::mqtt as wire;
use rumqttc::{AsyncClient, Event, EventLoop, Outgoing, Packet, Publish};
use tokio::sync::mpsc;

use crate::config::MqttConfig;
use crate::shutdown::Shutdown;

/// How long the reader lets reports gather on its socket between reads.
pub const PACE: Duration = Duration::from_millis(250);
/// With no node to read directly for this long, the connection closes.
pub const IDLE_CLOSE: Duration = Duration::from_secs(60);
/// The most messages in one batch, and batches waiting for the broker
/// loop: a flood waits on the socket (and the broker), not in memory.
const BATCH_MAX: usize = 1024;
const BATCHES_QUEUED: usize = 4;

/// What the reader hands the main loop.
#[derive(Debug)]
pub enum Heard {
    /// (Re)connected with a clean session: nothing is subscribed.
    Connected,
    /// The connection is lost (its subscriptions with it); it is retried.
    Lost,
    /// The health messages read since the last batch, in order.
    Reports(Vec<Publish>),
}

/// The second connection: subscribe on [`Reader::client`], take what it
/// read from [`Reader::next`]. Dropping it disconnects.
pub struct Reader {
    pub client: AsyncClient,
    heard: mpsc::Receiver<Heard>,
    /// Whether the connection is up (its last [`Heard`] was `Connected`).
    pub connected: bool,
}

impl Reader {
    /// Open the reader of `node` (client id `edgeform-agent-<node>/health`:
    /// a node name has no `/`, so it is no other agent's main id).
    ///
    /// # Errors
    /// The broker settings cannot be used (as for the main connection).
    pub fn start(mqtt: &MqttConfig, node: &str, shutdown: Shutdown) -> anyhow::Result<Reader> {
        let options = edgemqtt::options(
            &mqtt.broker,
            &format!("edgeform-agent-{node}/health"),
            false,
        )?;
        let (client, events) = AsyncClient::new(options, 1024);
        let (tx, heard) = mpsc::channel(BATCHES_QUEUED);
        let prefix = mqtt.topic_prefix.clone();
        tokio::spawn(read(events, prefix, tx, shutdown));
        Ok(Reader {
            client,
            heard,
            connected: false,
        })
    }

    /// The next batch or connection change (never, once the reader ended).
    pub async fn next(&mut self) -> Heard {
        match self.heard.recv().await {
            Some(h) => {
                match h {
                    Heard::Connected => self.connected = true,
                    Heard::Lost => self.connected = false,
                    Heard::Reports(_) => {}
                }
                h
            }
            None => std::future::pending().await,
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // The task ends on the DISCONNECT, or at its next step when the
        // connection is down (the channel is closed).
        let _ = self.client.try_disconnect();
    }
}

/// [`Reader::next`] of an optional reader: never without one.
pub async fn next(reader: &mut Option<Reader>) -> Heard {
    match reader {
        Some(r) => r.next().await,
        None => std::future::pending().await,
    }
}

/// The next event if it is ready now (read or buffered), without waiting.
async fn ready_now(events: &mut EventLoop) -> Option<Result<Event, rumqttc::ConnectionError>> {
    tokio::select! {
        biased;
        e = events.poll() => Some(e),
        () = std::future::ready(()) => None,
    }
}

/// Hand one thing on (waiting while the broker loop is behind); `false`
/// when the reader is gone or at shutdown.
async fn send(tx: &mpsc::Sender<Heard>, shutdown: &mut Shutdown, h: Heard) -> bool {
    tokio::select! {
        sent = tx.send(h) => sent.is_ok(),
        () = shutdown.wait() => false,
    }
}

/// The reader's loop: wait for an event, take everything else ready (up
/// to [`BATCH_MAX`] messages), hand the batch on, let the next gather for
/// [`PACE`]. Returns when the [`Reader`] is dropped or at shutdown.
async fn read(
    mut events: EventLoop,
    prefix: String,
    tx: mpsc::Sender<Heard>,
    mut shutdown: Shutdown,
) {
    let mut backoff =
        edgestate::backoff::Backoff::random(Duration::from_millis(250), Duration::from_secs(10));
    let mut batch: Vec<Publish> = Vec::new();
    // Logged once per outage, as the main connection does.
    let mut down = false;
    loop {
        let first = tokio::select! {
            e = events.poll() => e,
            () = shutdown.wait() => return,
            () = tx.closed() => return,
        };
        let mut next = Some(first);
        let mut lost = false;
        while let Some(event) = next.take() {
            match event {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if matches!(
                        wire::parse_topic(&prefix, &p.topic),
                        Some(wire::Topic::Health(_))
                    ) {
                        batch.push(p);
                    }
                }
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff.reset();
                    if std::mem::take(&mut down) {
                        tracing::info!("mqtt: the direct health connection is back");
                    }
                    if !batch.is_empty()
                        && !send(
                            &tx,
                            &mut shutdown,
                            Heard::Reports(std::mem::take(&mut batch)),
                        )
                        .await
                    {
                        return;
                    }
                    if !send(&tx, &mut shutdown, Heard::Connected).await {
                        return;
                    }
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                Ok(_) => {}
                Err(e) => {
                    if !std::mem::replace(&mut down, true) {
                        tracing::warn!(cause = %edgemqtt::describe(&e), "mqtt: the direct health connection is lost; nodes read directly do not age until it is back; retrying");
                    }
                    lost = true;
                    break;
                }
            }
            if batch.len() >= BATCH_MAX {
                break;
            }
            next = ready_now(&mut events).await;
        }
        // A full batch: more is waiting, read on at once.
        let full = batch.len() >= BATCH_MAX;
        if !batch.is_empty()
            && !send(
                &tx,
                &mut shutdown,
                Heard::Reports(std::mem::take(&mut batch)),
            )
            .await
        {
            return;
        }
        let wait = if full {
            Duration::ZERO
        } else if lost {
            if !send(&tx, &mut shutdown, Heard::Lost).await {
                return;
            }
            backoff.next_delay()
        } else {
            PACE
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.wait() => return,
            () = tx.closed() => return,
        }
    }
}
