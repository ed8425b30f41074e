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

/// `<prefix>/result/<node>/<id>`: a command's result.
#[must_use]
pub fn result_topic(prefix: &str, node: &str, id: &str) -> String {
    format!("{prefix}/result/{node}/{id}")
}

/// Which kind of message a topic carries, and for which node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic<'a> {
    Health(&'a str),
    Status(&'a str),
    Cmd(&'a str),
    Result { node: &'a str, id: &'a str },
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
    pub streams: Option<Vec<String>>,
    /// VOD assets held: asset → revisions; absent from older
    /// agents' reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vod: Option<std::collections::BTreeMap<String, Vec<u64>>>,
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

/// The action of `edgeform exec`'s probe: a name no `agent.yaml` can
/// allow (action names have no whitespace), so every agent refuses it,
/// never runs it — what the sender wants is the answer, which comes after
/// the answers to every command delivered before it (a command whose
/// answer does not come while the probe's does was dropped on the way).
pub const PROBE_ACTION: &str = "edgeform probe";

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

fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length.
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
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
