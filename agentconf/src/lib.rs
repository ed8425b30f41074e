//! `agent.yaml`: what the agent needs to know about its node.
//!
//! Read the way the compiler reads its repository: the spanned YAML tree
//! (`yamlspan`) becomes raw serde structs ([`raw`]), which the validation
//! ([`check`]) turns into the [`Config`] the agent runs with. Every
//! problem goes into one list, each at `file:line:col` with the key path
//! in the message where it helps; unknown keys are errors (a typo must not
//! silently leave a setting at its default).
//!
//! [`parse_with`] is pure but for what the file names outside itself: the
//! environment variables (`password_env`, `command_key_env`) are read
//! through the function it is given, every missing one reported at once,
//! and the command key files (and, when asked, the MQTT CA) are read at
//! the end. No runtime, no network: the compiler's bundle gate runs the
//! very same validation on every rendered `agent.yaml`.

pub mod check;
pub mod files;
pub mod raw;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use edgestate::target::{Broker, RedisTarget};

/// The agent's settings, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub node: String,
    pub region: String,
    pub redis: RedisTarget,
    pub cache: CacheConfig,
    /// The HTTP listener (`/route`, `/healthz`); absent: none.
    pub http: Option<HttpConfig>,
    pub routing: RoutingConfig,
    /// The broker for health, status and commands; absent: none of them.
    pub mqtt: Option<MqttConfig>,
    pub health: HealthConfig,
    /// The only commands `<prefix>/cmd/<node>` may run, by name.
    pub actions: BTreeMap<String, Action>,
    /// `metrics.listen`: a separate listener serving only `/metrics`
    /// e.g. on a management address while `/route` is public.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `state_dir`: what the agent keeps on its own disk, durably — the
    /// record of the commands it took (the agent's command ledger), which
    /// bounds replay even when the node's Redis loses its claims.
    pub state_dir: PathBuf,
}

/// Where the agent keeps its state when `state_dir` is not set (the
/// systemd unit's `StateDirectory=edgeform-agent`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/edgeform-agent";

/// `mqtt:` — the broker.
#[derive(Debug, Clone)]
pub struct MqttConfig {
    pub broker: Broker,
    pub topic_prefix: String,
    /// The HMAC-SHA256 key commands must be signed with (read from the
    /// variable `command_key_env` names at start); `None`: unsigned
    /// commands are accepted.
    pub command_key: Option<Vec<u8>>,
    /// The variable holding the command key.
    pub command_key_env: Option<String>,
    /// The control host's ed25519 public key (PEM): commands signed
    /// `ed25519:` with its private key run.
    pub command_public_key_file: Option<PathBuf>,
    /// This node's own result key (64 hex digits, `edgeform keygen
    /// --result-key NODE`): results of ed25519 commands are signed with it.
    pub result_key_file: Option<PathBuf>,
    /// What commands are checked with: the public key read from
    /// `command_public_key_file`, and the legacy HMAC key while
    /// `command_key_env` is still set (the migration).
    pub keys: edgestate::cmdkey::CommandKeys,
    /// The result key read from `result_key_file`.
    pub result_key: Option<Vec<u8>>,
}

/// `health:` — what the report carries and how often.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    pub interval: Duration,
    pub play_sessions: Option<Source>,
    pub streams: Option<Source>,
    /// The installed bundle's manifest (`<root>/current/manifest.json`):
    /// its version and commit go into the report (docs/install.md).
    pub bundle_manifest: Option<PathBuf>,
    /// VOD assets held: the field is an object asset → revision or list of
    /// revisions.
    pub vod: Option<Source>,
    /// The edge's own listeners the agent probes every second with a
    /// request for the reserved host (docs/edge.md, "The serving probe");
    /// empty: no probe, and the report has no `serving`.
    pub probe: Vec<Probe>,
    /// The edge's per-site metrics (`http://IP:PORT/metrics`, the role's
    /// metrics listener): read every [`sites_interval`](Self::sites_interval)
    /// into the retained `<prefix>/sites/<node>` figures `edgeform top`
    /// prints. `None`: no sites figures.
    pub edge_metrics: Option<String>,
}

/// The shortest period of the sites figures (`edgeform top`).
pub const SITES_MIN_INTERVAL: Duration = Duration::from_secs(10);

impl HealthConfig {
    /// How often the sites figures are read and published: the health
    /// interval, at least [`SITES_MIN_INTERVAL`] (a report can be tens of
    /// kilobytes; nothing routes on it).
    #[must_use]
    pub fn sites_interval(&self) -> Duration {
        self.interval.max(SITES_MIN_INTERVAL)
    }
}

/// One listener of the edge the agent probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The listener's address (`IP:PORT`).
    pub addr: std::net::SocketAddr,
    /// How it is spoken to (the URL's scheme).
    pub kind: ProbeKind,
}

/// How a probed listener is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// `http://IP:PORT`: plain HTTP.
    Http,
    /// `https://IP:PORT`: TLS with SNI the reserved probe host.
    Https,
    /// `proxy://IP:PORT`: the routers' PROXY-protocol listener: a PROXY v1
    /// header (`PROXY UNKNOWN`, no address), then TLS as `https`.
    Proxy,
}

impl ProbeKind {
    /// The URL scheme naming it in agent.yaml.
    #[must_use]
    pub fn scheme(self) -> &'static str {
        match self {
            ProbeKind::Http => "http",
            ProbeKind::Https => "https",
            ProbeKind::Proxy => "proxy",
        }
    }
}

/// Where a metric is read: a JSON document from a URL or a file, and the
/// field in it (`name`, or a JSON pointer `/a/b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub from: SourceFrom,
    pub field: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceFrom {
    /// `http://…` (plain HTTP, meant for a local stats endpoint).
    Url(String),
    File(PathBuf),
}

/// One allowed command: a fixed argv where `{arg}` elements are filled
/// from the command's arguments, each checked against its regex.
#[derive(Debug, Clone)]
pub struct Action {
    pub argv: Vec<String>,
    /// Anchored: the whole value must match.
    pub args: BTreeMap<String, regex::Regex>,
    pub timeout: Duration,
}

/// How long an action may run when its `timeout` is not set.
pub const DEFAULT_ACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest health interval: peers believe a report's interval for at
/// most this long (a forged one must not keep a dead node routable), so a
/// node reporting less often would be counted silent between reports.
pub const HEALTH_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// The health interval when not set.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// How often the routing table and health file are checked when not set.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);

/// `http:` — the listener.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub listen: std::net::SocketAddr,
    /// Where viewers go for a node without a payload URL (the router
    /// proxies); `{node}` and `{stream}` are replaced.
    pub proxy_url: String,
    /// Whether `/metrics` is served on this (viewer-facing) listener:
    /// `http.metrics`, by default only when `listen` is a loopback
    /// address. Metrics name the node, its queue depths and load: not
    /// for viewers (`metrics.listen` is the place for them).
    pub metrics: bool,
}

/// `routing:` — where health comes from and how often to look.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    /// A health snapshot file (`edgeform route --health` format).
    pub health_file: Option<PathBuf>,
    pub refresh: std::time::Duration,
    /// Where the agent writes the cluster's health it knows (same format,
    /// plus `at`), every `refresh`, atomically: the geo router's nginx
    /// reads it (docs/router.md).
    pub share_health: Option<PathBuf>,
}

impl Config {
    /// The node's purge queue, `cdn:purge:<region>:<node>`.
    #[must_use]
    pub fn purge_queue(&self) -> String {
        edgestate::keys::purge_queue(&self.region, &self.node)
    }
}

/// The nginx cache this node's purges clean.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dirs: Vec<PathBuf>,
    pub levels: String,
    pub key: String,
}

/// A configuration error, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for Error {}

/// Every error of one file, in file order (never empty). Dereferences to
/// the first; displays one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Errors(pub Vec<Error>);

impl std::ops::Deref for Errors {
    type Target = Error;
    fn deref(&self) -> &Error {
        &self.0[0]
    }
}

impl std::fmt::Display for Errors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Errors {}

/// Parse `agent.yaml` text; `file` names it in errors. The environment is
/// read last, for the variables the text names.
///
/// # Errors
/// YAML errors, unknown keys, missing or invalid values, unset variables:
/// all of them, each with its position.
pub fn parse(file: &str, text: &str) -> Result<Config, Errors> {
    parse_with(file, text, &|var| std::env::var(var).ok(), false)
}

/// [`parse`] with `env` as the environment; with `files`, the files the
/// configuration names (the MQTT CA) must be readable too, checked in the
/// same pass (what the agent's `load` and `--check-config` do).
///
/// # Errors
/// See [`parse`].
pub fn parse_with(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    files: bool,
) -> Result<Config, Errors> {
    check::check(file, text, env, files, true)
}

/// [`parse_with`] without `files`, and without reading the command key
/// files either: for a configuration rendered from a pull request (the
/// bundle gate of `edgeform check`), whose file names must never make
/// this host read its own files and say what they hold. The names are
/// still validated as the fields' types say.
///
/// # Errors
/// See [`parse`].
pub fn parse_unread(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, Errors> {
    check::check(file, text, env, false, false)
}

/// One error at the start of `file` (`line 1, column 1`).
#[must_use]
pub fn at_start(file: &str, message: String) -> Errors {
    Errors(vec![Error {
        file: file.to_owned(),
        line: 1,
        column: 1,
        message,
    }])
}

/// `1500ms`, `5s`, `2m` — the way durations are written in config.
#[must_use]
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `{name}` → `name` when the element is exactly one placeholder.
#[must_use]
pub fn placeholder(element: &str) -> Option<&str> {
    let inner = element.strip_prefix('{')?.strip_suffix('}')?;
    (!inner.is_empty()
        && inner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    .then_some(inner)
}

#[cfg(test)]
mod tests;
