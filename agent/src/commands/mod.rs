//! One-shot commands from `<prefix>/cmd/<node>` (README, "Health, status and one-shot commands"): the
//! run-at-most-once pipeline — check → claim → run → record — and the
//! consumer that answers each command and acknowledges it to the broker.
//!
//! - [`policy::check`] decides (signature, expiry, action, arguments) and
//!   says *why* with a [`RefusalKind`]; only a policy refusal claims the
//!   command's id ([`Refusal::claims_id`]): an unauthenticated command
//!   must not burn a real command's id, an expired one can never run.
//! - The id is claimed in local Redis (`SET NX`) before anything runs and
//!   the result recorded after; a redelivery finds the claim. Redis
//!   unreachable → refused, never run unrecorded.
//! - Ids are remembered for [`ID_TTL_SECS`] (or the command's validity
//!   plus a day) once run; a policy refusal only until the command
//!   expires (plus [`REFUSED_TTL_MARGIN_SECS`]): after that it is refused
//!   as expired without a claim.
//! - Before an action starts, its id is also written to the agent's own
//!   durable record ([`ledger`], `<state_dir>/commands`, fsync'd): Redis
//!   can lose the claim (`FLUSHALL`, a restore), the record cannot be
//!   walked around — an id in it never runs again, and a command issued
//!   before the record began is refused. Record unusable → refused.
//! - With a command key, the result is signed for the command it answers
//!   ([`CommandResult::sign`]), so `edgeform exec` can tell it from a
//!   forgery; results of unauthenticated commands are not signed.

pub mod ledger;
mod policy;

use std::sync::Arc;
use std::time::Duration;

use edgestate::mqtt::{self as wire, Command, CommandResult, Outcome};
use rumqttc::{AsyncClient, Publish, QoS};

pub use policy::{
    MAX_SKEW_SECS, METACHARACTERS, Ran, Refusal, RefusalKind, check, check_with, run,
};

use crate::config::{Config, MqttConfig};
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::unix_now;

/// How long a command id is remembered at least, once claimed to run.
pub const ID_TTL_SECS: u64 = 7 * 24 * 3600;

/// How long a policy-refused id outlives its command's `expires_at`.
pub const REFUSED_TTL_MARGIN_SECS: u64 = 3600;

/// Handle commands one at a time, in arrival order; acknowledge each to
/// the broker only once its result is recorded and published.
///
/// The queue is unbounded on purpose: it holds at most what the broker
/// has in flight unacknowledged for this client (mosquitto's
/// `max_inflight_messages`) — the MQTT loop drops commands at QoS 0 or
/// over [`wire::COMMAND_MAX_BYTES`] before they reach it — and dropping
/// a message here would lose it until the next reconnect (MQTT
/// redelivers only then).
pub async fn serve(
    config: Arc<Config>,
    mqtt: MqttConfig,
    client: AsyncClient,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Publish>,
    metrics: Arc<Metrics>,
    mut shutdown: Shutdown,
) {
    let mut con: Option<redis::aio::MultiplexedConnection> = None;
    // Opened before the first command is read: a new record refuses
    // commands issued before it began, so it must begin at the start.
    let mut taken = Record::open(&config.state_dir);
    loop {
        let p = tokio::select! {
            p = queue.recv() => match p { Some(p) => p, None => return },
            () = shutdown.wait() => return,
        };
        // A shutdown mid-command drops (and kills) the action; the command
        // stays unacknowledged and its id recorded as started, so after
        // the restart it is reported as interrupted, not run again.
        let handled = tokio::select! {
            r = handle(&config, &mqtt, &mut con, &mut taken, &p.payload) => r,
            () = shutdown.wait() => return,
        };
        if let Some(result) = handled {
            Metrics::count(&metrics.commands, result.status.as_str());
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
        sig: None,
    }
}

/// The durable record of taken commands, or why it cannot be used (then
/// every command that would run is refused, and opening is tried again
/// with the next one).
pub struct Record {
    dir: std::path::PathBuf,
    ledger: Result<ledger::Ledger, String>,
}

impl Record {
    /// Open the record in `dir`, logging what was found.
    #[must_use]
    pub fn open(dir: &std::path::Path) -> Record {
        let ledger = match ledger::Ledger::open(dir, unix_now()) {
            Ok((l, opened)) => {
                match opened {
                    ledger::Opened::Existing { kept } => {
                        tracing::info!(state_dir = %dir.display(), kept, began = l.created_at(), "command record opened");
                    }
                    ledger::Opened::New => {
                        tracing::info!(state_dir = %dir.display(), began = l.created_at(), "command record begun: commands issued before now are refused");
                    }
                    ledger::Opened::Corrupt { moved_to, why } => {
                        tracing::error!(state_dir = %dir.display(), why = %why, moved_to = %moved_to.display(), "command record unreadable; moved aside and begun anew: commands issued before now are refused");
                    }
                }
                Ok(l)
            }
            Err(e) => {
                let why = format!(
                    "the command record in {} cannot be used: {e}",
                    dir.display()
                );
                tracing::error!(problem = %why, "commands are refused until it can (they must run at most once)");
                Err(why)
            }
        };
        Record {
            dir: dir.to_owned(),
            ledger,
        }
    }

    /// Decide about a command about to run, and record it when it may.
    /// `Err`: why it must not run.
    fn take(&mut self, cmd: &Command, now: u64) -> Result<(), String> {
        if self.ledger.is_err() {
            *self = Record::open(&self.dir);
        }
        let l = self.ledger.as_mut().map_err(|why| why.clone())?;
        let keep_until = cmd.expires_at.saturating_add(ledger::MARGIN_SECS);
        // One small append and an fsync, on the one task that runs
        // commands one at a time: nothing else waits for it.
        match l.take(&cmd.id, cmd.issued_at, keep_until, now) {
            Ok(ledger::Verdict::Recorded) => Ok(()),
            Ok(ledger::Verdict::Taken) => Err(
                "duplicate id: this agent's own record shows it took this command before (local Redis had lost its record of it); not run again"
                    .into(),
            ),
            Ok(ledger::Verdict::Before(began)) => Err(format!(
                "issued at {}, before this agent's command record began ({began}): whether it ran before cannot be proven, so it is not run; send it again",
                cmd.issued_at
            )),
            Err(e) => {
                let why = format!(
                    "the command record in {} cannot be written: {e}",
                    self.dir.display()
                );
                self.ledger = Err(why.clone());
                Err(why)
            }
        }
    }
}

/// One command's bytes → its answer. `None` when there is nothing to
/// answer (no usable id).
async fn handle(
    config: &Config,
    mqtt: &MqttConfig,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    taken: &mut Record,
    payload: &[u8],
) -> Option<CommandResult> {
    let node = config.node.as_str();
    let cmd: Command = match serde_json::from_slice(payload) {
        Ok(c) => c,
        Err(e) => {
            let id = serde_json::from_slice::<serde_json::Value>(payload)
                .ok()
                .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_owned))
                .filter(|id| wire::is_command_id(id));
            tracing::warn!(cause = %e, id = id.as_deref().map_or_else(|| "-".to_owned(), edgestate::untrusted::escape), "command: malformed; refused");
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
    if !wire::is_command_id(&cmd.id) {
        tracing::warn!(id = %edgestate::untrusted::escape(&cmd.id), "command: the id is not a topic level of printable ASCII; dropped");
        return None;
    }
    let (mut out, authenticated) = answer(config, &mqtt.keys, con, taken, &cmd, unix_now()).await;
    if authenticated {
        // The answer to an ed25519 command is signed with this node's own
        // result key; to a legacy one with the shared key.
        let key = match mqtt.keys.verify(&cmd, node) {
            Ok(edgestate::cmdkey::Scheme::Ed25519) => mqtt.result_key.as_deref(),
            Ok(edgestate::cmdkey::Scheme::Hmac) => mqtt.command_key.as_deref(),
            Err(_) => None,
        };
        if let Some(key) = key {
            out.sign(&cmd, key);
        }
    }
    Some(out)
}

/// Check → claim → run → record. The answer, and whether the command was
/// authenticated (only then is the answer signed).
async fn answer(
    config: &Config,
    keys: &edgestate::cmdkey::CommandKeys,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    taken: &mut Record,
    cmd: &Command,
    now: u64,
) -> (CommandResult, bool) {
    let node = config.node.as_str();
    let verdict = check_with(cmd, node, &config.actions, keys, now);
    if let Err(r) = &verdict
        && !r.claims_id()
    {
        tracing::warn!(id = %cmd.id, action = %edgestate::untrusted::escape(&cmd.action), kind = ?r.kind, reason = %edgestate::untrusted::escape(&r.reason), "command refused");
        let authenticated = r.kind != RefusalKind::Unauthenticated;
        return (
            result(&cmd.id, node, &cmd.action, r.status, r.reason.clone()),
            authenticated,
        );
    }
    let id_key = edgestate::keys::command(&cmd.id);
    let remaining = cmd.expires_at.saturating_sub(now);
    let ttl = match &verdict {
        // A signed `expires_at` far in the future never overflows here.
        Ok(_) => ID_TTL_SECS.max(remaining.saturating_add(86_400)),
        Err(_) => remaining.saturating_add(REFUSED_TTL_MARGIN_SECS),
    };
    match claim(config, con, &id_key, ttl, now).await {
        Err(e) => {
            let reason = format!(
                "local redis unreachable ({e:#}): the id cannot be recorded, so the command is not run (it must run at most once)"
            );
            tracing::warn!(id = %cmd.id, reason = %reason, "command refused");
            return (
                result(&cmd.id, node, &cmd.action, Outcome::Refused, reason),
                true,
            );
        }
        Ok(Some(previous)) => {
            tracing::info!(id = %cmd.id, "command: duplicate id; not run again");
            let refused = |reason: &str| {
                let out = result(&cmd.id, node, &cmd.action, Outcome::Refused, reason.into());
                (out, true)
            };
            return match recorded(config, &cmd.id, &previous) {
                Recorded::Result(mut earlier) => {
                    earlier.reason = Some(match earlier.reason {
                        Some(r) => {
                            format!("{r} (duplicate id: this is the result of the first run)")
                        }
                        None => "duplicate id: this is the result of the first run".into(),
                    });
                    (earlier, true)
                }
                Recorded::Unsealed => {
                    tracing::warn!(id = %cmd.id, "command: the recorded result of the first run is not sealed by this node; not sent");
                    refused(
                        "duplicate id: a result is recorded for it in this node's Redis, but not sealed by this node's key (changed there?); not run again, not sent",
                    )
                }
                Recorded::Marker => refused(
                    "duplicate id: a command with this id started earlier and never finished (the agent stopped while it ran); not run again",
                ),
            };
        }
        Ok(None) => {}
    }
    // Claimed in Redis; the agent's own record has the last word.
    let verdict = match verdict {
        Ok(argv) => match taken.take(cmd, now) {
            Ok(()) => Ok(argv),
            Err(why) => Err(Refusal {
                kind: RefusalKind::Policy,
                status: Outcome::Refused,
                reason: why,
            }),
        },
        Err(r) => Err(r),
    };
    let out = match verdict {
        Err(r) if cmd.action == wire::PROBE_ACTION && r.kind == RefusalKind::Policy => {
            // `exec --wait` asking whether earlier commands arrived.
            tracing::debug!(id = %cmd.id, "command: a probe; answered, not run");
            result(&cmd.id, node, &cmd.action, r.status, r.reason)
        }
        Err(r) => {
            tracing::warn!(id = %cmd.id, action = %edgestate::untrusted::escape(&cmd.action), reason = %edgestate::untrusted::escape(&r.reason), "command refused");
            result(&cmd.id, node, &cmd.action, r.status, r.reason)
        }
        Ok(argv) => {
            let timeout = config
                .actions
                .get(&cmd.action)
                .map_or(crate::config::DEFAULT_ACTION_TIMEOUT, |a| a.timeout);
            tracing::info!(id = %cmd.id, action = %cmd.action, argv = ?argv, "command: running");
            let ran = run(&argv, timeout, node, &cmd.id).await;
            tracing::info!(id = %cmd.id, status = ran.status.as_str(), exit_code = ?ran.exit_code, elapsed = ?ran.duration, "command finished");
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
                sig: None,
            }
        }
    };
    if let Err(e) = record(config, con, &id_key, ttl, &out).await {
        tracing::warn!(id = %cmd.id, cause = %format!("{e:#}"), "command: result not recorded in redis (a duplicate will be reported as interrupted)");
    }
    (out, true)
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

/// The key results are sealed with in the node's Redis: the key its
/// answers are signed with (the result key; the legacy shared key during
/// the migration). `None`: commands are not authenticated at all.
fn seal_key(config: &Config) -> Option<&[u8]> {
    let m = config.mqtt.as_ref()?;
    m.result_key.as_deref().or(m.command_key.as_deref())
}

/// What an id's record in the node's Redis holds.
enum Recorded {
    /// The first run's result (sealed by this node, or no key to seal with).
    Result(CommandResult),
    /// A result this node did not seal: not to be sent as its word.
    Unsealed,
    /// The claim's marker (the run never finished), or nothing readable.
    Marker,
}

fn recorded(config: &Config, id: &str, text: &str) -> Recorded {
    let parse = |t: &str| serde_json::from_str::<CommandResult>(t).ok();
    match (
        seal_key(config),
        serde_json::from_str::<edgestate::mqtt::SealedRecord>(text),
    ) {
        (Some(key), Ok(sealed)) => match sealed.open(key, id).and_then(parse) {
            Some(r) => Recorded::Result(r),
            None => Recorded::Unsealed,
        },
        (Some(_), Err(_)) if parse(text).is_some() => Recorded::Unsealed,
        (None, _) => parse(text).map_or(Recorded::Marker, Recorded::Result),
        (Some(_), Err(_)) => Recorded::Marker,
    }
}

async fn record(
    config: &Config,
    con: &mut Option<redis::aio::MultiplexedConnection>,
    key: &str,
    ttl: u64,
    out: &CommandResult,
) -> anyhow::Result<()> {
    let text = serde_json::to_string(out)?;
    let text = match seal_key(config) {
        Some(k) => serde_json::to_string(&edgestate::mqtt::SealedRecord::seal(k, &out.id, text))?,
        None => text,
    };
    let attempt = async {
        let c = edgeredis::reuse(&config.redis, &config.node, con).await?;
        redis::cmd("SET")
            .arg(key)
            .arg(&text)
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

    fn config() -> Config {
        crate::config::parse(
            "agent.yaml",
            "node: n\nregion: r\nredis: {url: redis://x}\nactions:\n  reload:\n    argv: [/usr/bin/true]\n",
        )
        .unwrap()
    }

    fn cmd(action: &str, issued_at: u64, expires_at: u64) -> Command {
        Command {
            id: "c1".into(),
            action: action.into(),
            args: std::collections::BTreeMap::new(),
            issued_at,
            expires_at,
            sig: None,
        }
    }

    #[test]
    fn only_policy_refusals_claim_the_id() {
        let c = config();
        let key: &[u8] = b"k";
        // Unsigned, and signed with another key: unauthenticated.
        let unsigned =
            check(&cmd("reload", 1000, 1300), "n", &c.actions, Some(key), 1100).unwrap_err();
        let mut forged = cmd("reload", 1000, 1300);
        forged.sign("n", b"other");
        let bad = check(&forged, "n", &c.actions, Some(key), 1100).unwrap_err();
        for r in [&unsigned, &bad] {
            assert_eq!(r.kind, RefusalKind::Unauthenticated);
            assert!(!r.claims_id());
        }
        // Expired (signed correctly).
        let mut late = cmd("reload", 1000, 1300);
        late.sign("n", key);
        let expired = check(&late, "n", &c.actions, Some(key), 2000).unwrap_err();
        assert_eq!(expired.kind, RefusalKind::Expired);
        assert_eq!(expired.status, Outcome::Expired);
        assert!(!expired.claims_id());
        // Authentic, in time, not allowed: policy, claims.
        let mut rm = cmd("rm", 1000, 1300);
        rm.sign("n", key);
        let policy = check(&rm, "n", &c.actions, Some(key), 1100).unwrap_err();
        assert_eq!(policy.kind, RefusalKind::Policy);
        assert!(policy.claims_id());
        // The decision never reads the text: a reworded reason keeps it.
        let reworded = Refusal {
            reason: "bad signature".into(),
            ..policy
        };
        assert!(reworded.claims_id());
        let reworded = Refusal {
            reason: "policy".into(),
            ..unsigned
        };
        assert!(!reworded.claims_id());
    }
}
