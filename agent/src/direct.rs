//! The direct health reader: the `health/<node>` topics an agent reads
//! node by node ([`crate::mqtt::direct_nodes`]: its own region's while it
//! summarizes it, a region with no fresh summary) come on a second MQTT
//! connection of their own, read in batches every [`PACE`].
//!
//! A summarizer at 1,000 nodes in 4 regions takes its region's 50 reports
//! a second: read as they come, each is a wake-up of the runtime, an
//! `epoll_wait` and a socket read — most of its CPU. Read every [`PACE`],
//! they cost a few wake-ups a second, and commands and purges, on the main
//! connection, wait at most for the batch being taken. The pace adds about
//! [`PACE`] to a report's way into the summary and the summarizer's own
//! routing, well inside the interval load figures already wait
//! (docs/operations.md, "Health summaries").
//!
//! The connection has a clean session and no last will; it is opened when
//! there is a node to read directly and closed after [`IDLE_CLOSE`] with
//! none, so an agent that is not a summarizer keeps one connection.
//! Only `health/<node>` messages are handed on: whatever else the broker
//! sends on it (it subscribes to nothing else) is dropped here.

use std::time::{Duration, Instant};

use edgestate::mqtt as wire;
use rumqttc::{AsyncClient, Event, EventLoop, Outgoing, Packet, Publish};
use tokio::sync::mpsc;

use crate::config::MqttConfig;
use crate::shutdown::Shutdown;

/// How long the reader lets reports gather on its socket between reads.
pub const PACE: Duration = Duration::from_millis(250);
/// With no node to read directly for this long, the connection closes.
pub const IDLE_CLOSE: Duration = Duration::from_secs(60);
/// The most messages and bytes in one batch (one message of up to the
/// packet limit always fits), and batches waiting for the broker loop: a
/// flood waits on the socket (and the broker), not in memory.
const BATCH_MAX: usize = 1024;
const BATCH_MAX_BYTES: usize = 1 << 20;
const BATCHES_QUEUED: usize = 2;

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
    /// Since when the connection is down: opened and not yet connected,
    /// or lost; `None` while it is up.
    down_since: Option<Instant>,
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
            down_since: Some(Instant::now()),
        })
    }

    /// Whether the connection is up (its last [`Heard`] was `Connected`).
    #[must_use]
    pub fn connected(&self) -> bool {
        self.down_since.is_none()
    }

    /// How long the connection has been down at `now` (`None`: it is up).
    #[must_use]
    pub fn down_for(&self, now: Instant) -> Option<Duration> {
        self.down_since.map(|t| now.saturating_duration_since(t))
    }

    /// The next batch or connection change (never, once the reader ended).
    pub async fn next(&mut self) -> Heard {
        match self.heard.recv().await {
            Some(h) => {
                match h {
                    Heard::Connected => self.down_since = None,
                    Heard::Lost => {
                        self.down_since.get_or_insert_with(Instant::now);
                    }
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

/// The next event if it is ready now (buffered, or read at once), without
/// waiting.
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

/// The reader's loop: wait for the next event, take every other one
/// ready now (read or buffered; requests go out in turn), hand the batch
/// on, and let the next reports gather for [`PACE`] — at once instead when
/// the batch reached its cap.
///
/// Taking what is ready drops a `poll()` that is not ready at once, as the
/// main connection's `select!` does whenever a timer fires first. rumqttc
/// keeps a partial read and an unfinished flush; what such a drop can
/// lose is a request it took but could not start writing because a write
/// buffer over 8 KiB must first go into a full socket — a broker that has
/// stopped reading from this connection (a lost ping then resets it; a
/// lost SUBSCRIBE waits for the next reconnection). A version that never
/// dropped a poll read one socket read per turn and, measured at 1,000
/// nodes, fell behind its startup backlog.
async fn read(
    mut events: EventLoop,
    prefix: String,
    tx: mpsc::Sender<Heard>,
    mut shutdown: Shutdown,
) {
    let mut backoff =
        edgestate::backoff::Backoff::random(Duration::from_millis(250), Duration::from_secs(10));
    // Logged once per outage, as the main connection does.
    let mut down = false;
    loop {
        let first = tokio::select! {
            e = events.poll() => e,
            () = shutdown.wait() => return,
            () = tx.closed() => return,
        };
        let mut batch = Batch::default();
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
                // Always the first event of a turn (a lost connection ends
                // the turn): nothing read before it is waiting.
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff.reset();
                    if std::mem::take(&mut down) {
                        tracing::info!("mqtt: the direct health connection is back");
                    }
                    if !send(&tx, &mut shutdown, Heard::Connected).await {
                        return;
                    }
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                Ok(_) => {}
                Err(e) => {
                    if !std::mem::replace(&mut down, true) {
                        tracing::warn!(cause = %edgemqtt::describe(&e), "mqtt: the direct health connection is lost; no node ages by silence until it is back; retrying");
                    }
                    lost = true;
                    break;
                }
            }
            if batch.full() {
                break;
            }
            next = ready_now(&mut events).await;
        }
        let more = batch.full();
        if !batch.is_empty() && !send(&tx, &mut shutdown, Heard::Reports(batch.take())).await {
            return;
        }
        let wait = if lost {
            if !send(&tx, &mut shutdown, Heard::Lost).await {
                return;
            }
            backoff.next_delay()
        } else if more {
            Duration::ZERO
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

/// Health messages on their way to the broker loop, capped in number and
/// bytes.
#[derive(Default)]
struct Batch {
    messages: Vec<Publish>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, p: Publish) {
        self.bytes += p.payload.len() + p.topic.len();
        self.messages.push(p);
    }

    fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn full(&self) -> bool {
        self.messages.len() >= BATCH_MAX || self.bytes >= BATCH_MAX_BYTES
    }

    fn take(&mut self) -> Vec<Publish> {
        self.bytes = 0;
        std::mem::take(&mut self.messages)
    }
}
