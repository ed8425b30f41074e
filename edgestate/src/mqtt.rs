//! The MQTT channel's wire format (README, "Health, status and one-shot commands"): topic names, the health
//! report, the status, one-shot commands and their results, and command
//! signing. Shared by the agent (which reports and runs commands) and the
//! compiler's `status` and `exec` (which read reports and send commands).
//!
//! Times are Unix seconds. A metric that could not be read is `null`,
//! never a made-up value, so every `Option` here serializes as `null`.

use std::collections::BTreeMap;

use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

use crate::hex;

/// `topic_prefix` when none is configured.
pub const DEFAULT_PREFIX: &str = "edgeform";

/// The retained status payloads; `offline` is also the last will.
pub const ONLINE: &str = "online";
pub const OFFLINE: &str = "offline";

/// `<prefix>/health/<node>`: the retained health report.
#[must_use]
pub fn health_topic(prefix: &str, node: &str) -> String {
    format!("{prefix}/health/{node}")
}

/// `<prefix>/status/<node>`: retained `online`, last will `offline`.
#[must_use]
pub fn status_topic(prefix: &str, node: &str) -> String {
    format!("{prefix}/status/{node}")
}

/// `<prefix>/cmd/<node>`: commands for one node (QoS 1, not retained).
#[must_use]
pub fn cmd_topic(prefix: &str, node: &str) -> String {
    format!("{prefix}/cmd/{node}")
}

/// `<prefix>/region/<region>/cmd/<node>`: the same commands, addressed
/// through the node's region. With regional brokers, only that region's
/// bridge takes them from the central broker, and its broker delivers
/// them as `<prefix>/cmd/<node>` (packaging/mosquitto/regional.conf); a
/// single broker has no subscriber for them. No agent subscribes here.
#[must_use]
pub fn region_cmd_topic(prefix: &str, region: &str, node: &str) -> String {
    format!("{prefix}/region/{region}/cmd/{node}")
}

/// `<prefix>/result/<node>/<id>`: a command's result.
#[must_use]
pub fn result_topic(prefix: &str, node: &str, id: &str) -> String {
    format!("{prefix}/result/{node}/{id}")
}

/// `<prefix>/summary/<region>`: the region's retained [`Summary`], one
/// per summarizer interval.
#[must_use]
pub fn summary_topic(prefix: &str, region: &str) -> String {
    format!("{prefix}/summary/{region}")
}

/// `<prefix>/summary-lock/<region>`: the retained [`LockClaim`] of the
/// region's summarizer.
#[must_use]
pub fn summary_lock_topic(prefix: &str, region: &str) -> String {
    format!("{prefix}/summary-lock/{region}")
}

/// Which kind of message a topic carries, and for which node (or region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic<'a> {
    Health(&'a str),
    Status(&'a str),
    Cmd(&'a str),
    Result {
        node: &'a str,
        id: &'a str,
    },
    /// A region's summary.
    Summary(&'a str),
    /// A region's summarizer claim.
    SummaryLock(&'a str),
}

/// Parse a topic under `prefix`; `None` for anything else.
#[must_use]
pub fn parse_topic<'a>(prefix: &str, topic: &'a str) -> Option<Topic<'a>> {
    let rest = topic.strip_prefix(prefix)?.strip_prefix('/')?;
    let (kind, rest) = rest.split_once('/')?;
    let plain = |node: &'a str| (!node.is_empty() && !node.contains('/')).then_some(node);
    match kind {
        "health" => plain(rest).map(Topic::Health),
        "status" => plain(rest).map(Topic::Status),
        "cmd" => plain(rest).map(Topic::Cmd),
        "summary" => plain(rest).map(Topic::Summary),
        "summary-lock" => plain(rest).map(Topic::SummaryLock),
        "result" => {
            let (node, id) = rest.split_once('/')?;
            (!node.is_empty() && !id.is_empty() && !id.contains('/'))
                .then_some(Topic::Result { node, id })
        }
        _ => None,
    }
}

/// A node name or command id usable as one topic level: no MQTT wildcard,
/// separator or control character.
#[must_use]
pub fn is_topic_level(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s
            .chars()
            .any(|c| matches!(c, '/' | '+' | '#') || c.is_control())
}

/// Whether `s` can be a command's id: a topic level of printable ASCII
/// (`edgeform exec` makes `<hex>-<hex>`), so that no id written by
/// someone else can carry bidirectional or invisible characters into the
/// agent's log or the operator's terminal.
#[must_use]
pub fn is_command_id(s: &str) -> bool {
    is_topic_level(s) && s.bytes().all(|b| b.is_ascii_graphic())
}

/// A health or status message, read: the node it is about and what it
/// says; `None` is a cleared retained message (an empty payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    Report(&'a str, Option<Box<HealthReport>>),
    /// `online` → true, `offline` → false.
    Status(&'a str, Option<bool>),
}

/// Read a message on `<prefix>/health/<node>` or `<prefix>/status/<node>`;
/// `Ok(None)` for any other topic.
///
/// # Errors
/// A report that is not JSON of the right shape or names another node, a
/// status that is neither `online` nor `offline`.
pub fn read_message<'a>(
    prefix: &str,
    topic: &'a str,
    payload: &[u8],
) -> Result<Option<Message<'a>>, String> {
    match parse_topic(prefix, topic) {
        Some(Topic::Health(node)) => {
            if payload.is_empty() {
                return Ok(Some(Message::Report(node, None)));
            }
            let report: HealthReport = serde_json::from_slice(payload)
                .map_err(|e| format!("{topic}: not a health report: {e}"))?;
            if report.node != node {
                return Err(format!(
                    "{topic}: the report names node `{}`; ignored",
                    report.node
                ));
            }
            Ok(Some(Message::Report(node, Some(Box::new(report)))))
        }
        Some(Topic::Status(node)) => {
            let online = match payload {
                b"online" => Some(true),
                b"offline" => Some(false),
                b"" => None,
                other => {
                    return Err(format!(
                        "{topic}: status `{}` is neither online nor offline",
                        String::from_utf8_lossy(other)
                    ));
                }
            };
            Ok(Some(Message::Status(node, online)))
        }
        _ => Ok(None),
    }
}

/// The retained report on `<prefix>/health/<node>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    pub node: String,
    /// When the report was made.
    pub ts: u64,
    /// The agent's reporting interval, so readers can judge a report's age.
    #[serde(default)]
    pub interval_ms: Option<u64>,
    pub play_sessions: Option<u64>,
    /// Whole-host transmit rate over non-loopback interfaces.
    pub out_kbit: Option<u64>,
    pub streams: Option<crate::route::Streams>,
    /// VOD assets held: asset → revisions; absent from older
    /// agents' reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vod: Option<crate::route::Vod>,
    /// Whole-host receive + transmit rate over non-loopback interfaces:
    /// what the placement budget `network_bandwidth_kbit` limits; absent
    /// from older agents' reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_kbit: Option<u64>,
    pub config: ConfigState,
    pub purge: PurgeState,
    pub redis: RedisState,
    pub version: String,
    /// The installed bundle (`health.bundle_manifest` of agent.yaml: the
    /// node's `current/manifest.json`, docs/install.md). Left out when
    /// not configured, so older readers are unaffected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleState>,
    /// Whether the node's edge answers the agent's probe on every
    /// configured listener (docs/edge.md, "The serving probe"); left out
    /// when the agent probes nothing. `false`: routing treats the node as
    /// offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
}

/// The installed bundle's version and the commit it was built from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleState {
    pub version: Option<String>,
    #[serde(default)]
    pub commit: Option<String>,
}

/// What the node's Redis holds: `edgeform:meta` `commit` and `generation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigState {
    pub commit: Option<String>,
    pub generation: Option<u64>,
}

/// The purge queue's depth and the jobs in progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeState {
    pub queue: Option<u64>,
    pub processing: Option<u64>,
}

/// Whether the agent reached its Redis, and the role it answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisState {
    pub ok: bool,
    pub role: Option<String>,
    /// The Redis lost its data: `edgeform:meta` gone or its generation
    /// lower than the one read before, and nothing written since (the
    /// edge keeps serving what it had read; the control plane re-pushes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub data_lost: bool,
}

/// The largest summary payload read (bytes): a region of 1,000 nodes with
/// reports of a few KiB each fits.
pub const SUMMARY_MAX_BYTES: usize = 8 << 20;

/// The largest MQTT packet any client of the channel takes (a summary
/// and its topic and header): the agent's connections, the summarizer's
/// direct health reader, `edgeform status`. A larger packet ends a
/// client's connection (its MQTT library takes it as a protocol error),
/// and a retained one would end it again at every reconnection: so the
/// broker must refuse them first, with `max_packet_size` at this value
/// (8454144; packaging/mosquitto/, docs/operations.md).
pub const MAX_PACKET_BYTES: usize = SUMMARY_MAX_BYTES + (64 << 10);

/// A region's nodes' last health reports, as heard by the region's
/// summarizer, on `<prefix>/summary/<region>` (retained, QoS 0: the next
/// interval's summary supersedes a lost one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub region: String,
    /// The summarizer (a node of the region).
    pub by: String,
    /// The epoch of the summarizer's claim ([`LockClaim::epoch`]).
    pub epoch: u64,
    /// When it was made (Unix seconds, the summarizer's clock;
    /// informational: ages are in `nodes`).
    pub ts: u64,
    /// The summarizer's count of its summaries of this epoch: a receiver
    /// drops one not newer than the last it took from the same summarizer
    /// (delivered late).
    #[serde(default)]
    pub seq: u64,
    /// The summarizer's interval: a receiver that hears no summary for
    /// two of them reads the region's health topics itself.
    pub interval_ms: u64,
    pub nodes: Vec<SummaryEntry>,
}

/// One node of a [`Summary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryEntry {
    pub node: String,
    /// How long before the summary was made the summarizer heard the last
    /// health message of the node (the report, or its clearing): a
    /// receiver dates the report `age_ms` before it heard the summary and
    /// applies the same silence rule as to a report heard directly.
    pub age_ms: u64,
    /// The exact last report (`null`: the retained report was cleared).
    pub report: Option<HealthReport>,
}

/// A region summarizer's claim on `<prefix>/summary-lock/<region>`
/// (retained, QoS 1). The highest epoch holds; of two claims of one
/// epoch, the smaller node name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockClaim {
    pub node: String,
    pub epoch: u64,
    /// When it was claimed (Unix seconds; informational).
    pub ts: u64,
}

impl LockClaim {
    /// Whether this claim wins over `other` (highest epoch, then the
    /// smaller node name): every agent decides alike.
    #[must_use]
    pub fn beats(&self, other: &LockClaim) -> bool {
        (self.epoch, std::cmp::Reverse(&self.node)) > (other.epoch, std::cmp::Reverse(&other.node))
    }
}

/// Why a summary or claim was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryErrorKind {
    /// Larger than [`SUMMARY_MAX_BYTES`].
    TooLarge,
    /// Not JSON of the right shape.
    Malformed,
    /// The payload names another region than its topic.
    WrongRegion,
    /// A node that is not in the routing table, of another region, or
    /// listed twice; or a report naming another node.
    ForeignNode,
}

/// A refused summary or claim: its kind and a description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryError {
    pub kind: SummaryErrorKind,
    pub message: String,
}

impl std::fmt::Display for SummaryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SummaryError {}

fn summary_error(kind: SummaryErrorKind, message: String) -> SummaryError {
    SummaryError { kind, message }
}

/// Read the summary on `<prefix>/summary/<region>`: bounded, the region of
/// the topic, every node of that region per `region_of` (the routing
/// table), each once, each report naming its node. `Ok(None)`: a cleared
/// retained summary.
///
/// # Errors
/// A [`SummaryError`] of the kind above; nothing of a refused summary is used.
pub fn read_summary(
    region: &str,
    payload: &[u8],
    region_of: impl Fn(&str) -> Option<String>,
) -> Result<Option<Summary>, SummaryError> {
    if payload.is_empty() {
        return Ok(None);
    }
    if payload.len() > SUMMARY_MAX_BYTES {
        return Err(summary_error(
            SummaryErrorKind::TooLarge,
            format!(
                "summary of region `{region}`: {} bytes, more than {SUMMARY_MAX_BYTES}",
                payload.len()
            ),
        ));
    }
    let s: Summary = serde_json::from_slice(payload).map_err(|e| {
        summary_error(
            SummaryErrorKind::Malformed,
            format!("summary of region `{region}`: not a summary: {e}"),
        )
    })?;
    if s.region != region {
        return Err(summary_error(
            SummaryErrorKind::WrongRegion,
            format!(
                "summary on region `{region}`'s topic names region `{}`",
                s.region
            ),
        ));
    }
    if region_of(&s.by).as_deref() != Some(region) {
        return Err(summary_error(
            SummaryErrorKind::ForeignNode,
            format!(
                "summary of region `{region}` made by `{}`, not a node of the region",
                s.by
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for e in &s.nodes {
        if region_of(&e.node).as_deref() != Some(region) || !seen.insert(e.node.as_str()) {
            return Err(summary_error(
                SummaryErrorKind::ForeignNode,
                format!(
                    "summary of region `{region}` carries node `{}`: not a node of the region in the routing table, or listed twice",
                    e.node
                ),
            ));
        }
        if let Some(r) = &e.report
            && r.node != e.node
        {
            return Err(summary_error(
                SummaryErrorKind::ForeignNode,
                format!(
                    "summary of region `{region}`: the report for `{}` names node `{}`",
                    e.node, r.node
                ),
            ));
        }
    }
    Ok(Some(s))
}

/// Claim epochs below this (2^48) are believed: each take-over adds one, so a
/// region never gets near it (one a second for nine million years). Any
/// agent may write a region's claim; one at the very top (`u64::MAX`)
/// could never be beaten by the next epoch, and a holder that stopped
/// summarizing would keep the role for good.
pub const CLAIM_EPOCH_MAX: u64 = 1 << 48;

/// Read a claim on `<prefix>/summary-lock/<region>`; `Ok(None)`: cleared.
///
/// # Errors
/// Malformed (an epoch not below [`CLAIM_EPOCH_MAX`] too), too large (over 4
/// KiB), or a claimant not of the region.
pub fn read_claim(
    region: &str,
    payload: &[u8],
    region_of: impl Fn(&str) -> Option<String>,
) -> Result<Option<LockClaim>, SummaryError> {
    if payload.is_empty() {
        return Ok(None);
    }
    if payload.len() > 4096 {
        return Err(summary_error(
            SummaryErrorKind::TooLarge,
            format!(
                "summary claim of region `{region}`: {} bytes",
                payload.len()
            ),
        ));
    }
    let c: LockClaim = serde_json::from_slice(payload).map_err(|e| {
        summary_error(
            SummaryErrorKind::Malformed,
            format!("summary claim of region `{region}`: {e}"),
        )
    })?;
    if region_of(&c.node).as_deref() != Some(region) {
        return Err(summary_error(
            SummaryErrorKind::ForeignNode,
            format!(
                "summary claim of region `{region}` by `{}`, not a node of the region",
                c.node
            ),
        ));
    }
    // Below, not at: the take-over after a claim at the top must be
    // believed too.
    if c.epoch >= CLAIM_EPOCH_MAX {
        return Err(summary_error(
            SummaryErrorKind::Malformed,
            format!(
                "summary claim of region `{region}` by `{}` at epoch {}, not below {CLAIM_EPOCH_MAX}",
                c.node, c.epoch
            ),
        ));
    }
    Ok(Some(c))
}

/// The action of `edgeform exec`'s probe: a name no `agent.yaml` can
/// allow (action names have no whitespace), so every agent refuses it,
/// never runs it — what the sender wants is the answer, which comes after
/// the answers to every command delivered before it (a command whose
/// answer does not come while the probe's does was dropped on the way).
pub const PROBE_ACTION: &str = "edgeform probe";

/// The largest command an agent takes: an action name and its arguments
/// (each matched by the agent's own pattern). A larger one is not from a
/// control host, and is dropped as it arrives, before any queue.
pub const COMMAND_MAX_BYTES: usize = 64 << 10;

/// The longest a command lives (`expires_at - issued_at`): `exec --ttl` and
/// `--wait` take at most a day. A longer one is refused.
pub const COMMAND_LIFETIME_MAX_SECS: u64 = 86_400;

/// A one-shot command on `<prefix>/cmd/<node>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Command {
    pub id: String,
    pub action: String,
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    pub issued_at: u64,
    pub expires_at: u64,
    /// The signature of [`Command::signing_payload`], when signed:
    /// `ed25519:<hex>` (the control host's key, [`crate::cmdkey`]) or, the
    /// legacy shared key, unprefixed hex HMAC-SHA256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
}

impl Command {
    /// The bytes a signature covers: the node the command is for and every
    /// field but `sig`, as compact JSON with sorted keys. Binding the node
    /// stops a command signed for one node being replayed to another.
    #[must_use]
    pub fn signing_payload(&self, node: &str) -> Vec<u8> {
        let v = serde_json::json!({
            "action": self.action,
            "args": self.args,
            "expires_at": self.expires_at,
            "id": self.id,
            "issued_at": self.issued_at,
            "node": node,
        });
        // serde_json's map is a BTreeMap here (no preserve_order): sorted.
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// Sign for `node` with `key`.
    pub fn sign(&mut self, node: &str, key: &[u8]) {
        self.sig = Some(hex(&mac(key, &self.signing_payload(node))));
    }

    /// Whether `sig` is a valid signature for `node` under `key`
    /// (constant-time comparison).
    #[must_use]
    pub fn verify(&self, node: &str, key: &[u8]) -> bool {
        let Some(sig) = self.sig.as_deref().and_then(unhex) else {
            return false;
        };
        let Ok(mut m) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
            return false;
        };
        m.update(&self.signing_payload(node));
        m.verify_slice(&sig).is_ok()
    }
}

/// A command's recorded result as the agent keeps it in its own Redis
/// (`edgeform:cmd:<id>`), sealed with `key` (the node's result key) so that
/// a duplicate id is answered with the first run's result only when this
/// agent wrote it: the node's Redis is not trusted, and the answer is
/// signed again when sent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SealedRecord {
    /// The result's JSON text, as sealed.
    pub result: String,
    /// HMAC-SHA256 (hex) of the command id, a newline and `result`.
    pub mac: String,
}

impl SealedRecord {
    /// `result_json` for command `id`, sealed with `key`.
    #[must_use]
    pub fn seal(key: &[u8], id: &str, result_json: String) -> SealedRecord {
        let mac = crate::hex(&mac(key, &Self::payload(id, &result_json)));
        SealedRecord {
            result: result_json,
            mac,
        }
    }

    /// The result text when `key` sealed it for `id` (constant-time
    /// comparison); `None` for anything else.
    #[must_use]
    pub fn open(&self, key: &[u8], id: &str) -> Option<&str> {
        let tag = unhex(&self.mac)?;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).ok()?;
        m.update(&Self::payload(id, &self.result));
        m.verify_slice(&tag).ok()?;
        Some(&self.result)
    }

    fn payload(id: &str, result: &str) -> Vec<u8> {
        let mut p = Vec::with_capacity(id.len() + 1 + result.len());
        p.extend_from_slice(id.as_bytes());
        p.push(b'\n');
        p.extend_from_slice(result.as_bytes());
        p
    }
}

fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length.
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Ran and exited 0.
    Ok,
    /// Ran and exited non-zero, was killed at its timeout, or could not start.
    Failed,
    /// Not run: unknown action, bad argument, bad signature, duplicate…
    Refused,
    /// Not run: arrived after `expires_at`.
    Expired,
}

impl Outcome {
    /// The wire name (`ok`, `failed`, `refused`, `expired`): for logs,
    /// metrics labels and `edgeform exec`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Refused => "refused",
            Outcome::Expired => "expired",
        }
    }
}

/// The scheme prefix of a result signature made with the shared command
/// key. A later per-node key pair (ed25519) gets its own prefix and signs
/// the same [`CommandResult::signing_payload`].
pub const RESULT_SIG_HMAC: &str = "hmac-sha256:";

/// The result on `<prefix>/result/<node>/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    pub id: String,
    pub node: String,
    pub action: String,
    pub status: Outcome,
    pub exit_code: Option<i32>,
    /// The last bytes of the output (at most [`TAIL_BYTES`]).
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    /// Why it was refused or failed; `null` when ok.
    pub reason: Option<String>,
    pub finished_at: u64,
    /// `hmac-sha256:<hex>` over [`CommandResult::signing_payload`], when
    /// the agent verified the command with a key: proof the result comes
    /// from the node that took the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
}

impl CommandResult {
    /// The bytes a result signature covers: every field but `sig`, and the
    /// signature of the command it answers (so a result cannot be replayed
    /// to another command, even one with the same id), as compact JSON with
    /// sorted keys. `id` and `node` are among the fields.
    #[must_use]
    pub fn signing_payload(&self, cmd_sig: &str) -> Vec<u8> {
        let mut result = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = result.as_object_mut() {
            o.remove("sig");
        }
        let v = serde_json::json!({"cmd_sig": cmd_sig, "result": result});
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// Sign as the answer to `cmd` with `key` (nothing when `cmd` is
    /// unsigned: there is nothing to bind to).
    pub fn sign(&mut self, cmd: &Command, key: &[u8]) {
        self.sig = None;
        if let Some(cmd_sig) = &cmd.sig {
            let tag = hex(&mac(key, &self.signing_payload(cmd_sig)));
            self.sig = Some(format!("{RESULT_SIG_HMAC}{tag}"));
        }
    }

    /// Whether this is `node`'s signed answer to `cmd` under `key`
    /// (constant-time comparison).
    #[must_use]
    pub fn verify(&self, cmd: &Command, node: &str, key: &[u8]) -> bool {
        let (Some(cmd_sig), Some(sig)) = (&cmd.sig, &self.sig) else {
            return false;
        };
        let Some(sig) = sig.strip_prefix(RESULT_SIG_HMAC).and_then(unhex) else {
            return false;
        };
        if self.id != cmd.id || self.node != node {
            return false;
        }
        let Ok(mut m) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
            return false;
        };
        m.update(&self.signing_payload(cmd_sig));
        m.verify_slice(&sig).is_ok()
    }
}

/// How much of stdout/stderr a result carries.
pub const TAIL_BYTES: usize = 4096;

/// The last `TAIL_BYTES` of `bytes` as text (lossy UTF-8), cut at a
/// character boundary.
#[must_use]
pub fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(TAIL_BYTES);
    let text = String::from_utf8_lossy(&bytes[start..]);
    text.trim_start_matches('\u{fffd}').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_topics_claims_and_refusals() {
        assert_eq!(parse_topic("p", "p/summary/eu"), Some(Topic::Summary("eu")));
        assert_eq!(
            parse_topic("p", "p/summary-lock/eu"),
            Some(Topic::SummaryLock("eu"))
        );
        assert_eq!(parse_topic("p", "p/summary/eu/x"), None);
        let claim = |node: &str, epoch| LockClaim {
            node: node.into(),
            epoch,
            ts: 9,
        };
        assert!(claim("b", 2).beats(&claim("a", 1)));
        assert!(claim("a", 2).beats(&claim("b", 2)));
        assert!(!claim("b", 2).beats(&claim("a", 2)));
        assert!(!claim("a", 2).beats(&claim("a", 2)));
        let region_of = |n: &str| match n {
            "a1" | "a2" => Some("ra".to_owned()),
            "b1" => Some("rb".to_owned()),
            _ => None,
        };
        let ok = br#"{"region":"ra","by":"a1","epoch":1,"ts":1,"interval_ms":500,"nodes":[{"node":"a2","age_ms":3,"report":null}]}"#;
        let s = read_summary("ra", ok, region_of).unwrap().unwrap();
        assert_eq!((s.seq, s.nodes.len()), (0, 1), "seq defaults to 0");
        assert_eq!(read_summary("ra", b"", region_of), Ok(None));
        let kind = |region: &str, payload: &[u8]| {
            read_summary(region, payload, region_of).unwrap_err().kind
        };
        assert_eq!(kind("rb", ok), SummaryErrorKind::WrongRegion);
        assert_eq!(kind("ra", b"[1]"), SummaryErrorKind::Malformed);
        let foreign = String::from_utf8_lossy(ok).replace("\"node\":\"a2\"", "\"node\":\"b1\"");
        assert_eq!(
            kind("ra", foreign.as_bytes()),
            SummaryErrorKind::ForeignNode
        );
        let by = String::from_utf8_lossy(ok).replace("\"by\":\"a1\"", "\"by\":\"zz\"");
        assert_eq!(kind("ra", by.as_bytes()), SummaryErrorKind::ForeignNode);
        let big = vec![b' '; SUMMARY_MAX_BYTES + 1];
        assert_eq!(kind("ra", &big), SummaryErrorKind::TooLarge);
        assert_eq!(
            read_claim("ra", br#"{"node":"b1","epoch":1,"ts":0}"#, region_of)
                .unwrap_err()
                .kind,
            SummaryErrorKind::ForeignNode
        );
        assert_eq!(
            read_claim("ra", br#"{"node":"a1","epoch":1,"ts":0}"#, region_of),
            Ok(Some(claim("a1", 1)).map(|c| LockClaim { ts: 0, ..c }))
        );
        // An epoch no region reaches: refused, never the unbeatable holder.
        let top = format!(r#"{{"node":"a1","epoch":{},"ts":0}}"#, u64::MAX);
        assert_eq!(
            read_claim("ra", top.as_bytes(), region_of)
                .unwrap_err()
                .kind,
            SummaryErrorKind::Malformed
        );
        let top = format!(r#"{{"node":"a1","epoch":{CLAIM_EPOCH_MAX},"ts":0}}"#);
        assert!(read_claim("ra", top.as_bytes(), region_of).is_err());
        // The highest believed, and the take-over after it, both are.
        for epoch in [CLAIM_EPOCH_MAX - 2, CLAIM_EPOCH_MAX - 1] {
            let c = format!(r#"{{"node":"a1","epoch":{epoch},"ts":0}}"#);
            assert!(read_claim("ra", c.as_bytes(), region_of).is_ok());
        }
    }

    #[test]
    fn topics_round_trip() {
        assert_eq!(
            parse_topic("edgeform", &health_topic("edgeform", "edge-1")),
            Some(Topic::Health("edge-1"))
        );
        assert_eq!(
            parse_topic("a/b", &status_topic("a/b", "n")),
            Some(Topic::Status("n"))
        );
        assert_eq!(
            parse_topic("p", &result_topic("p", "n", "42")),
            Some(Topic::Result {
                node: "n",
                id: "42"
            })
        );
        assert_eq!(parse_topic("p", "p/cmd/n"), Some(Topic::Cmd("n")));
        // Only a bridge takes the region's copy: no agent reads it.
        assert_eq!(parse_topic("p", &region_cmd_topic("p", "eu", "n")), None);
        for bad in [
            "q/health/n",
            "p/health/",
            "p/health/a/b",
            "p/other/n",
            "p",
            "p/result/n",
        ] {
            assert_eq!(parse_topic("p", bad), None, "{bad}");
        }
        assert!(is_topic_level("edge-1"));
        assert!(is_command_id("18f3a-2b1.probe"));
        for bad in ["a\u{202e}b", "a b", "a\u{200b}", "é"] {
            assert!(!is_command_id(bad), "{bad:?}");
        }
        for bad in ["", "a/b", "a+", "#", "a\nb"] {
            assert!(!is_topic_level(bad), "{bad:?}");
        }
    }

    #[test]
    fn signing_binds_every_field_and_the_node() {
        let mut c = Command {
            id: "1".into(),
            action: "reload".into(),
            args: BTreeMap::from([("zone".into(), "eu".into())]),
            issued_at: 10,
            expires_at: 20,
            sig: None,
        };
        assert!(!c.verify("n", b"k"), "unsigned");
        c.sign("n", b"k");
        assert!(c.verify("n", b"k"));
        assert!(!c.verify("other", b"k"), "replayed to another node");
        assert!(!c.verify("n", b"wrong key"));
        let mut t = c.clone();
        t.args.insert("zone".into(), "us".into());
        assert!(!t.verify("n", b"k"), "tampered argument");
        let mut t = c.clone();
        t.expires_at = 99;
        assert!(!t.verify("n", b"k"), "extended expiry");
        let mut t = c.clone();
        t.sig = Some("zz".into());
        assert!(!t.verify("n", b"k"), "not hex");
        // The wire form round-trips and still verifies.
        let back: Command = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert!(back.verify("n", b"k"));
    }

    #[test]
    fn results_are_bound_to_the_command_node_and_key() {
        let mut c = Command {
            id: "1".into(),
            action: "reload".into(),
            args: BTreeMap::new(),
            issued_at: 10,
            expires_at: 20,
            sig: None,
        };
        c.sign("n", b"k");
        let mut r = CommandResult {
            id: "1".into(),
            node: "n".into(),
            action: "reload".into(),
            status: Outcome::Ok,
            exit_code: Some(0),
            stdout: "done".into(),
            stderr: String::new(),
            duration_ms: 3,
            reason: None,
            finished_at: 11,
            sig: None,
        };
        assert!(!r.verify(&c, "n", b"k"), "unsigned");
        r.sign(&c, b"k");
        assert!(r.sig.as_deref().unwrap().starts_with("hmac-sha256:"));
        assert!(r.verify(&c, "n", b"k"));
        assert!(!r.verify(&c, "n", b"other key"));
        assert!(!r.verify(&c, "m", b"k"), "another node");
        let mut other = c.clone();
        other.issued_at = 11;
        other.sign("n", b"k");
        assert!(!r.verify(&other, "n", b"k"), "another command, same id");
        let mut t = r.clone();
        t.status = Outcome::Failed;
        assert!(!t.verify(&c, "n", b"k"), "altered status");
        let mut t = r.clone();
        t.stdout = "forged".into();
        assert!(!t.verify(&c, "n", b"k"), "altered output");
        let back: CommandResult = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert!(back.verify(&c, "n", b"k"), "round trip");
        // An unsigned command gets an unsigned result.
        let mut u = r.clone();
        let mut uc = c.clone();
        uc.sig = None;
        u.sign(&uc, b"k");
        assert!(u.sig.is_none());
        assert_eq!(Outcome::Expired.as_str(), "expired");
    }

    #[test]
    fn nulls_are_written() {
        let r = HealthReport {
            node: "n".into(),
            ts: 1,
            interval_ms: Some(5000),
            play_sessions: None,
            out_kbit: None,
            streams: None,
            vod: None,
            net_kbit: None,
            config: ConfigState::default(),
            purge: PurgeState::default(),
            redis: RedisState::default(),
            version: "0".into(),
            bundle: None,
            serving: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["play_sessions"].is_null() && v["config"]["commit"].is_null());
        assert!(v.as_object().unwrap().contains_key("out_kbit"));
    }

    #[test]
    fn tails_are_bounded() {
        let long = "é".repeat(TAIL_BYTES);
        let t = tail(long.as_bytes());
        assert!(t.len() <= TAIL_BYTES && t.chars().all(|c| c == 'é'));
        assert_eq!(tail(b"short"), "short");
    }
}
