//! `agent.yaml`: what the agent needs to know about its node.
//!
//! Read with the same spanned YAML as the compiler, so every error names
//! `file:line:col`; unknown keys are errors (a typo must not silently
//! leave a setting at its default). Like the compiler, it collects: one
//! function per section checks its keys and values and adds every problem
//! to the list, so one run reports all of them.
//!
//! [`parse`] is pure but for the environment: the variables the file
//! names (`password_env`, `command_key_env`) are read in one step at the
//! end ([`environment`]), so every missing one is reported at once, and a
//! `ca_file` is checked to be readable then too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgeredis::RedisTarget;
use serde_json::{Map, Value};

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
    /// (#15 item 6), e.g. on a management address while `/route` is public.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `state_dir`: what the agent keeps on its own disk, durably — the
    /// record of the commands it took ([`crate::commands::ledger`]), which
    /// bounds replay even when the node's Redis loses its claims.
    pub state_dir: PathBuf,
}

/// Where the agent keeps its state when `state_dir` is not set (the
/// systemd unit's `StateDirectory=edgeform-agent`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/edgeform-agent";

/// `mqtt:` — the broker.
#[derive(Debug, Clone)]
pub struct MqttConfig {
    pub broker: edgemqtt::Broker,
    pub topic_prefix: String,
    /// The HMAC-SHA256 key commands must be signed with (read from the
    /// variable `command_key_env` names at start); `None`: unsigned
    /// commands are accepted.
    pub command_key: Option<Vec<u8>>,
    /// The variable holding the command key.
    pub command_key_env: Option<String>,
    /// The control host's ed25519 public key (PEM): commands signed
    /// `ed25519:` with its private key run (#15 item 5).
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
    /// revisions (#18 item 3).
    pub vod: Option<Source>,
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

/// Read and validate `path`.
///
/// # Errors
/// Unreadable file, YAML errors, unknown keys, missing or invalid values,
/// unset variables: all of them, each with its position.
pub fn load(path: &Path) -> Result<Config, Errors> {
    let text = crate::files::read_regular(path, 1 << 20).map_err(|e| {
        let hint = if path == Path::new(DEFAULT_PATH) {
            " (the default; pass --config FILE to use another, e.g. packaging/agent.yaml)"
                .to_owned()
        } else {
            String::new()
        };
        Errors(vec![Error {
            file: path.display().to_string(),
            line: 1,
            column: 1,
            message: format!("cannot read the configuration: {e}{hint}"),
        }])
    })?;
    let file = path.display().to_string();
    parse_with(&file, &text, &|var| std::env::var(var).ok(), true)
}

/// Where `edgeform-agent` looks without `--config`.
pub const DEFAULT_PATH: &str = "/etc/edgeform/agent.yaml";

/// Parse `agent.yaml` text; `file` names it in errors. The environment is
/// read last, for the variables the text names.
///
/// # Errors
/// See [`load`].
pub fn parse(file: &str, text: &str) -> Result<Config, Errors> {
    parse_with(file, text, &|var| std::env::var(var).ok(), false)
}

/// [`parse`] with `env` as the environment; with `files`, the files the
/// configuration names (the MQTT CA) must be readable too, checked in the
/// same pass (what [`load`] and `--check-config` do).
///
/// # Errors
/// See [`load`].
pub fn parse_with(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    files: bool,
) -> Result<Config, Errors> {
    let tree = match yamlspan::parse(text) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(Errors(vec![Error {
                file: file.to_owned(),
                line: 1,
                column: 1,
                message: "empty configuration: `node`, `region` and `redis` are required".into(),
            }]));
        }
        Err(e) => {
            return Err(Errors(vec![Error {
                file: file.to_owned(),
                line: e.span.line,
                column: e.span.column,
                message: e.message,
            }]));
        }
    };
    let json = tree.to_json();
    let mut cx = Cx {
        file,
        tree: &tree,
        errors: Vec::new(),
    };
    let config = document(&mut cx, &json);
    if let Some(config) = &config {
        environment(&mut cx, config, env);
        if files {
            named_files(&mut cx, config);
        }
    }
    let config = config.map(|c| c.with_environment(env));
    let config = config.map(|c| key_files(&mut cx, c));
    cx.errors.sort_by_key(|e| (e.line, e.column));
    cx.errors.dedup();
    match config {
        Some(c) if cx.errors.is_empty() => Ok(c),
        _ if cx.errors.is_empty() => Err(Errors(vec![Error {
            file: file.to_owned(),
            line: 1,
            column: 1,
            message: "invalid configuration".into(),
        }])),
        _ => Err(Errors(cx.errors)),
    }
}

/// The collector: where errors go, and how pointers become positions.
struct Cx<'a> {
    file: &'a str,
    tree: &'a yamlspan::Node,
    errors: Vec<Error>,
}

impl Cx<'_> {
    fn at_span(&mut self, span: yamlspan::Span, message: String) {
        self.errors.push(Error {
            file: self.file.to_owned(),
            line: span.line,
            column: span.column,
            message,
        });
    }

    /// An error at the value `pointer` names (or its nearest parent).
    fn at(&mut self, pointer: &str, message: String) {
        let span = self.tree.locate(pointer);
        self.at_span(span, message);
    }

    /// An error at the key `key` of the mapping at `parent`.
    fn at_key(&mut self, parent: &str, key: &str, message: String) {
        let span = self
            .tree
            .pointer(parent)
            .and_then(|n| n.key_span(key))
            .unwrap_or_else(|| self.tree.locate(parent));
        self.at_span(span, message);
    }

    /// The mapping at `pointer`, its unknown keys reported.
    fn mapping<'v>(
        &mut self,
        v: &'v Value,
        pointer: &str,
        allowed: &[&str],
    ) -> Option<&'v Map<String, Value>> {
        let Some(map) = v.as_object() else {
            self.at(
                pointer,
                format!("invalid type: {}, expected a mapping", kind(v)),
            );
            return None;
        };
        for key in map.keys() {
            if !allowed.contains(&key.as_str()) {
                let expected: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
                self.at_key(
                    pointer,
                    key,
                    format!(
                        "unknown field `{key}`, expected one of {}",
                        expected.join(", ")
                    ),
                );
            }
        }
        Some(map)
    }

    /// An optional string field.
    fn string(&mut self, map: &Map<String, Value>, pointer: &str, key: &str) -> Option<String> {
        match map.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => {
                self.at(
                    &format!("{pointer}/{key}"),
                    format!("invalid type: {}, expected a string", kind(other)),
                );
                None
            }
        }
    }

    /// A required string field (`Err(())`: reported).
    fn required(&mut self, map: &Map<String, Value>, pointer: &str, key: &str) -> Option<String> {
        if !map.contains_key(key) {
            self.at(pointer, format!("missing field `{key}`"));
            return None;
        }
        self.string(map, pointer, key)
    }

    /// An optional list of strings.
    fn strings(
        &mut self,
        map: &Map<String, Value>,
        pointer: &str,
        key: &str,
    ) -> Option<Vec<String>> {
        let here = format!("{pointer}/{key}");
        match map.get(key)? {
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => out.push(s.clone()),
                        other => self.at(
                            &format!("{here}/{i}"),
                            format!("invalid type: {}, expected a string", kind(other)),
                        ),
                    }
                }
                Some(out)
            }
            Value::Null => None,
            other => {
                self.at(
                    &here,
                    format!("invalid type: {}, expected a sequence", kind(other)),
                );
                None
            }
        }
    }

    /// An optional duration (`500ms`, `5s`, `1m`), more than zero.
    fn duration(&mut self, map: &Map<String, Value>, pointer: &str, key: &str) -> Option<Duration> {
        let text = self.string(map, pointer, key)?;
        let d = edgestate::parse_duration_ms(&text)
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        if d.is_none() {
            self.at(
                &format!("{pointer}/{key}"),
                format!("`{text}` is not a duration (500ms, 5s, 1m)"),
            );
        }
        d
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

/// The whole file: every section, each checked even when another failed.
fn document(cx: &mut Cx<'_>, json: &Value) -> Option<Config> {
    let root = cx.mapping(
        json,
        "",
        &[
            "node",
            "region",
            "redis",
            "cache",
            "http",
            "routing",
            "mqtt",
            "health",
            "actions",
            "metrics",
            "state_dir",
        ],
    )?;
    let node = cx.required(root, "", "node");
    let region = cx.required(root, "", "region");
    if node.as_deref() == Some("") || region.as_deref() == Some("") {
        cx.at("/node", "`node` and `region` must not be empty".into());
    }
    let redis = match root.get("redis") {
        Some(v) => redis(cx, v),
        None => {
            cx.at("", "missing field `redis`".into());
            None
        }
    };
    let cache = cache(cx, root.get("cache"));
    let http = root.get("http").and_then(|v| http(cx, v));
    let routing = routing(cx, root.get("routing"));
    let mqtt = root.get("mqtt").and_then(|v| mqtt(cx, v));
    if root.get("mqtt").is_some() && routing.as_ref().is_some_and(|r| r.health_file.is_some()) {
        cx.at(
            "/routing/health_file",
            "`routing.health_file` and `mqtt` are both set: with a broker, health comes from MQTT; remove one".into(),
        );
    }
    let health = health(cx, root.get("health"));
    let actions = actions(cx, root.get("actions"));
    let metrics_listen = match root.get("metrics") {
        None => Some(None),
        Some(v) => metrics(cx, v).map(Some),
    };
    let state_dir = match cx.string(root, "", "state_dir") {
        None => Some(PathBuf::from(DEFAULT_STATE_DIR)),
        Some(d) if Path::new(&d).is_absolute() && lexical(Path::new(&d)).is_some() => {
            Some(PathBuf::from(d))
        }
        Some(d) => {
            cx.at(
                "/state_dir",
                format!("`state_dir` must be an absolute path without `..`, not `{d}`"),
            );
            None
        }
    };
    Some(Config {
        node: node.filter(|n| !n.is_empty())?,
        region: region.filter(|r| !r.is_empty())?,
        redis: redis?,
        cache: cache?,
        http: match root.get("http") {
            Some(_) => Some(http?),
            None => None,
        },
        routing: routing?,
        mqtt: match root.get("mqtt") {
            Some(_) => Some(mqtt?),
            None => None,
        },
        health: health?,
        actions: actions?,
        metrics_listen: metrics_listen?,
        state_dir: state_dir?,
    })
}

/// `metrics: {listen: ADDR}`.
fn metrics(cx: &mut Cx<'_>, v: &Value) -> Option<std::net::SocketAddr> {
    let m = cx.mapping(v, "/metrics", &["listen"])?;
    let listen = cx.required(m, "/metrics", "listen")?;
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.port() == 0 => {
            cx.at(
                "/metrics/listen",
                format!("`{listen}`: port 0 would listen on a random port; name the port"),
            );
            None
        }
        Ok(a) => Some(a),
        Err(_) => {
            cx.at(
                "/metrics/listen",
                format!("`{listen}` is not an address:port"),
            );
            None
        }
    }
}

/// `redis:` through [`RedisTarget::from_parts`], shared with the
/// compiler's node validation.
fn redis(cx: &mut Cx<'_>, v: &Value) -> Option<RedisTarget> {
    let m = cx.mapping(
        v,
        "/redis",
        &[
            "url",
            "sentinels",
            "master",
            "username",
            "password_env",
            "tls",
        ],
    )?;
    let url = cx.string(m, "/redis", "url");
    let sentinels = cx.strings(m, "/redis", "sentinels");
    let master = cx.string(m, "/redis", "master");
    let username = cx.string(m, "/redis", "username");
    let password_env = cx.string(m, "/redis", "password_env");
    // A bad `tls` block is reported with the rest, not on its own.
    let mut tls_bad = false;
    let tls = match m.get("tls") {
        None => None,
        Some(t) => match cx.mapping(t, "/redis/tls", &["ca_file", "cert_file", "key_file"]) {
            Some(t) => Some(edgeredis::TlsFiles {
                ca_file: cx.string(t, "/redis/tls", "ca_file").map(PathBuf::from),
                cert_file: cx.string(t, "/redis/tls", "cert_file").map(PathBuf::from),
                key_file: cx.string(t, "/redis/tls", "key_file").map(PathBuf::from),
            }),
            None => {
                tls_bad = true;
                None
            }
        },
    };
    // Port 0 parses but reaches nothing: refused here, at its value.
    let mut port_zero = false;
    if let Some(u) = &url
        && redis::parse_redis_url(u).is_some_and(|p| p.port() == Some(0))
    {
        cx.at("/redis/url", format!("`{u}`: port 0 is not a Redis port"));
        port_zero = true;
    }
    for (i, s) in sentinels.iter().flatten().enumerate() {
        if s.rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>() == Ok(0))
        {
            cx.at(
                &format!("/redis/sentinels/{i}"),
                format!("`{s}`: port 0 is not a Sentinel port"),
            );
            port_zero = true;
        }
    }
    match RedisTarget::from_parts(url, sentinels, master, username, password_env, tls) {
        Ok(_) if tls_bad || port_zero => None,
        Ok(t) => Some(t),
        Err(errors) => {
            for e in errors {
                cx.at(&format!("/redis{}", e.pointer()), e.to_string());
            }
            None
        }
    }
}

fn cache(cx: &mut Cx<'_>, v: Option<&Value>) -> Option<CacheConfig> {
    let defaults = edgestate::purge::CacheDefaults::default();
    let empty = Map::new();
    let m = match v {
        None => &empty,
        Some(v) => cx.mapping(v, "/cache", &["dirs", "levels", "key"])?,
    };
    let dirs: Vec<PathBuf> = cx.strings(m, "/cache", "dirs").map_or_else(
        || defaults.dirs.iter().map(PathBuf::from).collect(),
        |d| d.into_iter().map(PathBuf::from).collect(),
    );
    let levels = cx
        .string(m, "/cache", "levels")
        .unwrap_or_else(|| defaults.levels.to_owned());
    let key = cx
        .string(m, "/cache", "key")
        .unwrap_or_else(|| defaults.key.to_owned());
    let mut ok = true;
    if let Err(e) = crate::cache::Levels::parse(&levels) {
        cx.at("/cache/levels", format!("invalid `levels`: {e}"));
        ok = false;
    }
    if dirs.is_empty() {
        cx.at(
            "/cache/dirs",
            "`cache.dirs` must not be empty: the purge worker would clean nothing (leave `dirs` out for the defaults)".into(),
        );
        ok = false;
    }
    let mut seen: Vec<(usize, PathBuf)> = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let here = format!("/cache/dirs/{i}");
        if !d.is_absolute() {
            cx.at(&here, "cache dirs must be absolute paths".into());
            ok = false;
            continue;
        }
        let Some(clean) = lexical(d) else {
            cx.at(
                &here,
                format!(
                    "`{}`: `..` is not allowed in a cache dir (write the path it means)",
                    d.display()
                ),
            );
            ok = false;
            continue;
        };
        if let Some((j, other)) = seen
            .iter()
            .find(|(_, o)| clean.starts_with(o) || o.starts_with(&clean))
        {
            let how = if clean == *other {
                "is listed twice".to_owned()
            } else if clean.starts_with(other) {
                format!("is inside `{}` (dirs[{j}])", other.display())
            } else {
                format!("holds `{}` (dirs[{j}])", other.display())
            };
            cx.at(
                &here,
                format!(
                    "cache dir `{}` {how}: cache dirs must not overlap (a purge would scan, and count, the same files twice)",
                    d.display()
                ),
            );
            ok = false;
        }
        seen.push((i, clean));
    }
    if let Err(e) = edgestate::purge::check_template(&key) {
        cx.at("/cache/key", format!("invalid `key` `{key}`: {e}"));
        ok = false;
    }
    ok.then_some(CacheConfig { dirs, levels, key })
}

/// `path` with `.` components and repeated or trailing `/` removed;
/// `None` when it holds `..` (what it means depends on links).
fn lexical(path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => return None,
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

fn http(cx: &mut Cx<'_>, v: &Value) -> Option<HttpConfig> {
    let m = cx.mapping(v, "/http", &["listen", "proxy_url", "metrics"])?;
    let metrics = match m.get("metrics") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            cx.at(
                "/http/metrics",
                format!("invalid type: {}, expected a boolean", kind(other)),
            );
            return None;
        }
    };
    let listen = cx.required(m, "/http", "listen")?;
    let proxy_url = cx
        .string(m, "/http", "proxy_url")
        .unwrap_or_else(|| "/proxy/{node}/{stream}".to_owned());
    let listen: std::net::SocketAddr = match listen.parse() {
        Ok(listen) => listen,
        Err(_) => {
            cx.at("/http/listen", format!("`{listen}` is not an address:port"));
            return None;
        }
    };
    if listen.port() == 0 {
        cx.at(
            "/http/listen",
            format!("`{listen}`: port 0 would listen on a random port; name the port"),
        );
        return None;
    }
    Some(HttpConfig {
        listen,
        proxy_url,
        metrics: metrics.unwrap_or_else(|| listen.ip().is_loopback()),
    })
}

fn routing(cx: &mut Cx<'_>, v: Option<&Value>) -> Option<RoutingConfig> {
    let Some(v) = v else {
        return Some(RoutingConfig {
            health_file: None,
            refresh: DEFAULT_REFRESH,
            share_health: None,
        });
    };
    let m = cx.mapping(v, "/routing", &["health_file", "refresh", "share_health"])?;
    let health_file = cx.string(m, "/routing", "health_file").map(PathBuf::from);
    let share_health = cx.string(m, "/routing", "share_health").map(PathBuf::from);
    let refresh = match m.get("refresh") {
        None => Some(DEFAULT_REFRESH),
        Some(_) => cx.duration(m, "/routing", "refresh"),
    };
    Some(RoutingConfig {
        health_file,
        refresh: refresh?,
        share_health,
    })
}

/// What `mqtt:` needs from the environment, resolved in [`environment`].
fn mqtt(cx: &mut Cx<'_>, v: &Value) -> Option<MqttConfig> {
    let m = cx.mapping(
        v,
        "/mqtt",
        &[
            "url",
            "topic_prefix",
            "username",
            "password_env",
            "ca_file",
            "command_key_env",
            "command_public_key_file",
            "result_key_file",
        ],
    )?;
    let url = cx.required(m, "/mqtt", "url");
    let mut ok = true;
    let tls = match &url {
        Some(u) => match edgemqtt::parse_url(u) {
            Ok((_, _, tls)) => tls,
            Err(e) => {
                cx.at("/mqtt/url", format!("{e:#}"));
                ok = false;
                false
            }
        },
        None => false,
    };
    let topic_prefix = cx
        .string(m, "/mqtt", "topic_prefix")
        .unwrap_or_else(|| edgestate::mqtt::DEFAULT_PREFIX.to_owned());
    if topic_prefix.is_empty()
        || topic_prefix
            .split('/')
            .any(|l| !edgestate::mqtt::is_topic_level(l))
    {
        cx.at(
            "/mqtt/topic_prefix",
            format!(
                "`{topic_prefix}` is not a topic prefix (levels separated by `/`, no wildcards)"
            ),
        );
        ok = false;
    }
    let username = cx.string(m, "/mqtt", "username");
    let password_env = cx.string(m, "/mqtt", "password_env");
    if password_env.is_some() && username.is_none() {
        cx.at(
            "/mqtt/password_env",
            "`password_env` needs a `username`".into(),
        );
        ok = false;
    }
    let ca_file = cx.string(m, "/mqtt", "ca_file").map(PathBuf::from);
    if ca_file.is_some() && url.is_some() && !tls {
        cx.at(
            "/mqtt/ca_file",
            "`ca_file` is for an mqtts:// broker".into(),
        );
        ok = false;
    }
    if ca_file.as_ref().is_some_and(|f| !f.is_absolute()) {
        cx.at("/mqtt/ca_file", "`ca_file` must be an absolute path".into());
        ok = false;
    }
    let command_key_env = cx.string(m, "/mqtt", "command_key_env");
    let command_public_key_file = cx
        .string(m, "/mqtt", "command_public_key_file")
        .map(PathBuf::from);
    let result_key_file = cx.string(m, "/mqtt", "result_key_file").map(PathBuf::from);
    for (key, file) in [
        ("command_public_key_file", &command_public_key_file),
        ("result_key_file", &result_key_file),
    ] {
        if file.as_ref().is_some_and(|f| !f.is_absolute()) {
            cx.at(
                &format!("/mqtt/{key}"),
                format!("`{key}` must be an absolute path"),
            );
            ok = false;
        }
    }
    match (&command_public_key_file, &result_key_file) {
        (Some(_), None) => {
            cx.at(
                "/mqtt/command_public_key_file",
                "`command_public_key_file` needs `result_key_file` (this node's result key, `edgeform keygen --result-key NODE`): results must be signed so no other node can forge them".into(),
            );
            ok = false;
        }
        (None, Some(_)) => {
            cx.at(
                "/mqtt/result_key_file",
                "`result_key_file` is for ed25519 commands: set `command_public_key_file` too"
                    .into(),
            );
            ok = false;
        }
        _ => {}
    }
    (ok && url.is_some()).then(|| MqttConfig {
        broker: edgemqtt::Broker {
            url: url.unwrap_or_default(),
            username,
            password_env,
            ca_file,
        },
        topic_prefix,
        command_key: None,
        command_key_env,
        command_public_key_file,
        result_key_file,
        keys: edgestate::cmdkey::CommandKeys::default(),
        result_key: None,
    })
}

fn health(cx: &mut Cx<'_>, v: Option<&Value>) -> Option<HealthConfig> {
    let Some(v) = v else {
        return Some(HealthConfig {
            interval: DEFAULT_HEALTH_INTERVAL,
            play_sessions: None,
            streams: None,
            bundle_manifest: None,
            vod: None,
        });
    };
    let m = cx.mapping(
        v,
        "/health",
        &[
            "interval",
            "play_sessions",
            "streams",
            "bundle_manifest",
            "vod",
        ],
    )?;
    let bundle_manifest = cx
        .string(m, "/health", "bundle_manifest")
        .map(PathBuf::from);
    if let Some(p) = &bundle_manifest
        && !p.is_absolute()
    {
        cx.at(
            "/health/bundle_manifest",
            "`bundle_manifest` must be an absolute path".into(),
        );
    }
    let interval = match m.get("interval") {
        None => Some(DEFAULT_HEALTH_INTERVAL),
        Some(_) => cx.duration(m, "/health", "interval"),
    };
    let play_sessions = source(cx, m.get("play_sessions"), "play_sessions");
    let streams = source(cx, m.get("streams"), "streams");
    let vod = source(cx, m.get("vod"), "vod");
    Some(HealthConfig {
        interval: interval?,
        play_sessions: play_sessions?,
        streams: streams?,
        bundle_manifest,
        vod: vod?,
    })
}

/// One metric source; `Some(None)` when absent, `None` when invalid.
#[allow(clippy::option_option)]
fn source(cx: &mut Cx<'_>, v: Option<&Value>, name: &str) -> Option<Option<Source>> {
    let Some(v) = v else { return Some(None) };
    let here = format!("/health/{name}");
    let m = cx.mapping(v, &here, &["url", "file", "field"])?;
    let url = cx.string(m, &here, "url");
    let file = cx.string(m, &here, "file").map(PathBuf::from);
    let field = cx.required(m, &here, "field");
    let from = match (url, file) {
        (Some(u), None) if u.starts_with("http://") => Some(SourceFrom::Url(u)),
        (Some(u), None) => {
            cx.at(
                &format!("{here}/url"),
                format!("`{u}`: only http:// URLs (a local stats endpoint)"),
            );
            None
        }
        (None, Some(f)) if f.is_absolute() => Some(SourceFrom::File(f)),
        (None, Some(_)) => {
            cx.at(
                &format!("{here}/file"),
                "the file must be an absolute path".into(),
            );
            None
        }
        _ => {
            cx.at(
                &here,
                format!("`{name}` needs exactly one of `url` and `file`"),
            );
            None
        }
    };
    if field.as_deref() == Some("") {
        cx.at(&format!("{here}/field"), "`field` must not be empty".into());
        return None;
    }
    Some(Some(Source {
        from: from?,
        field: field?,
    }))
}

fn actions(cx: &mut Cx<'_>, v: Option<&Value>) -> Option<BTreeMap<String, Action>> {
    let Some(v) = v else {
        return Some(BTreeMap::new());
    };
    let Some(m) = v.as_object() else {
        cx.at(
            "/actions",
            format!("invalid type: {}, expected a mapping", kind(v)),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (name, a) in m {
        // No whitespace: edgestate::mqtt::PROBE_ACTION relies on it.
        if !edgestate::mqtt::is_topic_level(name) || name.chars().any(char::is_whitespace) {
            cx.at_key("/actions", name, format!("`{name}` is not an action name"));
            ok = false;
            continue;
        }
        match action(cx, name, a) {
            Some(a) => {
                out.insert(name.clone(), a);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Check one action: an absolute program, `{arg}` placeholders that fill
/// whole elements and are all declared, every declared argument used,
/// regexes that compile.
fn action(cx: &mut Cx<'_>, name: &str, v: &Value) -> Option<Action> {
    let here = format!("/actions/{}", name.replace('~', "~0").replace('/', "~1"));
    let m = cx.mapping(v, &here, &["argv", "args", "timeout"])?;
    if !m.contains_key("argv") {
        cx.at(&here, "missing field `argv`".into());
    }
    let argv = cx.strings(m, &here, "argv").unwrap_or_default();
    let mut raw_args = BTreeMap::new();
    if let Some(a) = m.get("args") {
        if let Some(am) = a.as_object() {
            for (arg, pattern) in am {
                match pattern {
                    Value::String(p) => {
                        raw_args.insert(arg.clone(), p.clone());
                    }
                    other => cx.at(
                        &format!("{here}/args/{arg}"),
                        format!("invalid type: {}, expected a string", kind(other)),
                    ),
                }
            }
        } else {
            cx.at(
                &format!("{here}/args"),
                format!("invalid type: {}, expected a mapping", kind(a)),
            );
        }
    }
    let timeout = match m.get("timeout") {
        None => Some(DEFAULT_ACTION_TIMEOUT),
        Some(_) => cx.duration(m, &here, "timeout"),
    };
    let before = cx.errors.len();
    match argv.first() {
        None if m.contains_key("argv") => cx.at(
            &format!("{here}/argv"),
            format!("action `{name}`: `argv` must name a program"),
        ),
        Some(program) if !program.starts_with('/') => cx.at(
            &format!("{here}/argv/0"),
            format!(
                "action `{name}`: the program must be an absolute path (no PATH lookup), not `{program}`"
            ),
        ),
        _ => {}
    }
    let mut used = std::collections::BTreeSet::new();
    for (i, element) in argv.iter().enumerate() {
        if let Some(arg) = placeholder(element) {
            if i == 0 {
                cx.at(
                    &format!("{here}/argv/0"),
                    format!("action `{name}`: the program cannot be an argument"),
                );
            } else if !raw_args.contains_key(arg) {
                cx.at(
                    &format!("{here}/argv/{i}"),
                    format!("action `{name}`: `{{{arg}}}` is not declared in `args`"),
                );
            }
            used.insert(arg.to_owned());
        } else if element.contains('{') && element.contains('}') {
            cx.at(
                &format!("{here}/argv/{i}"),
                format!(
                    "action `{name}`: a placeholder must be a whole argv element, like \"{{host}}\"; `{element}` mixes it with text"
                ),
            );
        }
    }
    let mut args = BTreeMap::new();
    for (arg, pattern) in raw_args {
        let pointer = format!("{here}/args/{arg}");
        if !used.contains(&arg) {
            cx.at(
                &pointer,
                format!(
                    "action `{name}`: argument `{arg}` is declared but no argv element is `{{{arg}}}`"
                ),
            );
            continue;
        }
        match regex::Regex::new(&format!("^(?:{pattern})$")) {
            Ok(re) => {
                args.insert(arg, re);
            }
            Err(e) => cx.at(
                &pointer,
                format!("action `{name}`: argument `{arg}`: invalid regex: {e}"),
            ),
        }
    }
    if cx.errors.len() > before || argv.is_empty() {
        return None;
    }
    Some(Action {
        argv,
        args,
        timeout: timeout?,
    })
}

/// The environment step: every variable the file names, read once, each
/// missing one reported at its key.
fn environment(cx: &mut Cx<'_>, config: &Config, env: &dyn Fn(&str) -> Option<String>) {
    let set = |var: &str| env(var).is_some_and(|v| !v.is_empty());
    if let Some(var) = config.redis.password_env()
        && !set(var)
    {
        cx.at(
            "/redis/password_env",
            format!("the Redis password variable `{var}` is not set (or empty) in the environment"),
        );
    }
    let Some(m) = &config.mqtt else { return };
    if let Some(var) = &m.broker.password_env
        && !set(var)
    {
        cx.at(
            "/mqtt/password_env",
            format!("the MQTT password variable `{var}` is not set in the environment"),
        );
    }
    if let Some(var) = &m.command_key_env
        && !set(var)
    {
        cx.at(
            "/mqtt/command_key_env",
            format!(
                "the command signing key variable `{var}` is not set (or empty) in the environment"
            ),
        );
    }
}

/// The files the configuration names: the MQTT CA must be readable now,
/// not fail later when MQTT starts (it would then be off).
fn named_files(cx: &mut Cx<'_>, config: &Config) {
    let Some(ca) = config.mqtt.as_ref().and_then(|m| m.broker.ca_file.as_ref()) else {
        return;
    };
    match crate::files::read_regular(ca, 1 << 20) {
        Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => {}
        Ok(_) => cx.at(
            "/mqtt/ca_file",
            format!("`{}` holds no PEM certificate", ca.display()),
        ),
        Err(e) => cx.at(
            "/mqtt/ca_file",
            format!("cannot read the MQTT CA file `{}`: {e}", ca.display()),
        ),
    }
}

/// The command key files (#15 item 5), read whenever the configuration
/// is: without them commands could not be checked. Each problem is one
/// line at its key, naming the file.
fn key_files(cx: &mut Cx<'_>, mut config: Config) -> Config {
    let Some(m) = &mut config.mqtt else {
        return config;
    };
    if let Some(f) = &m.command_public_key_file {
        match crate::files::read_regular(f, 64 << 10) {
            Ok(text) => match edgestate::cmdkey::verifying_key_from_pem(&text) {
                Ok(k) => m.keys.ed25519 = Some(k),
                Err(e) => cx.at(
                    "/mqtt/command_public_key_file",
                    format!("`{}`: {e}", f.display()),
                ),
            },
            Err(e) => cx.at(
                "/mqtt/command_public_key_file",
                format!("cannot read the command public key `{}`: {e}", f.display()),
            ),
        }
    }
    if let Some(f) = &m.result_key_file {
        match crate::files::read_regular(f, 4 << 10) {
            Ok(text) => match edgestate::cmdkey::result_key_from_text(&text) {
                Ok(k) => m.result_key = Some(k),
                Err(e) => cx.at("/mqtt/result_key_file", format!("`{}`: {e}", f.display())),
            },
            Err(e) => cx.at(
                "/mqtt/result_key_file",
                format!("cannot read the result key `{}`: {e}", f.display()),
            ),
        }
    }
    m.keys.hmac.clone_from(&m.command_key);
    config
}

/// The key commands must be signed with, from `command_key_env`.
impl Config {
    /// Fill what the environment holds (the command key). Called by
    /// [`parse_with`] after [`environment`] found every variable set.
    fn with_environment(mut self, env: &dyn Fn(&str) -> Option<String>) -> Config {
        if let Some(m) = &mut self.mqtt {
            m.command_key = m
                .command_key_env
                .as_deref()
                .and_then(env)
                .filter(|k| !k.is_empty())
                .map(String::into_bytes);
        }
        self
    }
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
mod tests {
    use super::*;

    // See: #15 item 2
    #[test]
    fn r15_2_redis_tls_block() {
        let c = parse(
            "agent.yaml",
            "node: e\nregion: eu\nredis:\n  url: rediss://10.0.0.5:6380\n  tls: {ca_file: /etc/ca.pem, cert_file: /c.pem, key_file: /k.pem}\n",
        )
        .unwrap();
        let tls = c.redis.tls().unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(tls.key_file.as_deref(), Some(Path::new("/k.pem")));
        // `tls` with redis://, a cert without its key, an unknown key:
        // every error, each located.
        let e = parse(
            "agent.yaml",
            "node: e\nregion: eu\nredis:\n  url: redis://x\n  tls: {cert_file: /c.pem}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("agent.yaml:5:"), "{e}");
        assert!(e.contains("`tls` needs a `rediss://` URL"), "{e}");
        assert!(e.contains("go together"), "{e}");
        let e = parse(
            "agent.yaml",
            "node: e\nregion: eu\nredis:\n  url: rediss://x\n  tls: {ca_fle: /c.pem}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("agent.yaml:5:") && e.contains("ca_fle"), "{e}");
    }

    #[test]
    fn full_and_defaults() {
        let c = parse(
            "agent.yaml",
            "node: edge-1\nregion: eu\nredis:\n  url: redis://127.0.0.1:6379\n",
        )
        .unwrap();
        assert_eq!(c.purge_queue(), "cdn:purge:eu:edge-1");
        assert_eq!(c.cache.levels, "1:2");
        assert_eq!(c.cache.key, "$scheme$host$request_uri");
        assert_eq!(c.cache.dirs.len(), 4);
        assert!(c.cache.dirs[0].ends_with("static"));
        let c = parse(
            "a.yaml",
            "node: e\nregion: us\nredis: {sentinels: [\"127.0.0.1:26379\"], master: e, password_env: PATH}\n\
             cache: {dirs: [/var/cache/x], levels: \"2\", key: $host$uri}\n",
        )
        .unwrap();
        assert!(matches!(c.redis, RedisTarget::Sentinel { .. }));
        assert_eq!(c.cache.levels, "2");
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(
            "agent.yaml",
            "node: e\nregion: eu\nredis:\n  url: redis://x\n  pasword_env: X\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.column), (5, 3), "{e}");
        assert!(
            e.to_string()
                .starts_with("agent.yaml:5:3: unknown field `pasword_env`"),
            "{e}"
        );
        let e = parse(
            "agent.yaml",
            "node: e\nregion: eu\nredis: {url: redis://x}\ncache:\n  levels: \"3:3\"\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 5, "{e}");
        let e = parse("agent.yaml", "node: e\nregion: eu\n").unwrap_err();
        assert!(e.message.contains("redis"), "{e}");
        let e = parse("agent.yaml", "node: e\nregion: eu\nredis: {}\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        let e = parse("agent.yaml", "node: [\n").unwrap_err();
        assert!(e.line >= 1);
        let e = parse(
            "agent.yaml",
            "node: e\nregion: eu\nredis: {url: redis://x}\ncache: {dirs: [relative]}\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 4, "{e}");
    }

    #[test]
    fn mqtt_health_and_actions() {
        let base = "node: e\nregion: eu\nredis: {url: redis://x}\n";
        let c = parse(
            "agent.yaml",
            &format!(
                "{base}mqtt:\n  url: mqtts://broker.example:8884\n  topic_prefix: cdn/prod\n  \
                 username: edge\n  password_env: PATH\n  ca_file: /etc/edgeform/ca.pem\n\
                 health:\n  interval: 2s\n  play_sessions: {{url: \"http://127.0.0.1:8080/stats\", field: /server/sessions}}\n  \
                 streams: {{file: /run/streams.json, field: live}}\n\
                 actions:\n  reload:\n    argv: [/usr/sbin/nginx, -s, reload]\n  \
                 peer:\n    argv: [/usr/local/bin/peer, add, \"{{ip}}\"]\n    args: {{ip: \"[0-9.]+\"}}\n    timeout: 10s\n"
            ),
        )
        .unwrap();
        let m = c.mqtt.unwrap();
        assert_eq!(m.topic_prefix, "cdn/prod");
        assert_eq!(m.broker.password_env.as_deref(), Some("PATH"));
        assert!(m.command_key.is_none());
        assert_eq!(c.health.interval, Duration::from_secs(2));
        assert_eq!(
            c.health.streams.unwrap().from,
            SourceFrom::File("/run/streams.json".into())
        );
        assert_eq!(c.actions["reload"].timeout, DEFAULT_ACTION_TIMEOUT);
        assert!(c.actions["peer"].args["ip"].is_match("10.0.0.1"));
        assert!(
            !c.actions["peer"].args["ip"].is_match("10.0.0.1x"),
            "anchored"
        );

        // Each mistake is located.
        let cases: &[(&str, u32, &str)] = &[
            ("mqtt: {url: \"http://x\"}\n", 4, "scheme"),
            (
                "mqtt:\n  url: mqtt://x\n  topic_prefix: \"a/#\"\n",
                6,
                "topic prefix",
            ),
            (
                "mqtt:\n  url: mqtt://x\n  command_key_env: EDGEFORM_SURELY_UNSET_KEY\n",
                6,
                "not set",
            ),
            ("mqtt:\n  url: mqtt://x\n  password_env: P\n", 6, "username"),
            (
                "mqtt:\n  url: mqtt://x\n  username: u\n  password_env: EDGEFORM_SURELY_UNSET_PW\n",
                7,
                "not set",
            ),
            ("mqtt:\n  url: mqtt://x\n  ca_file: /ca.pem\n", 6, "mqtts"),
            (
                "mqtt: {url: \"mqtt://x\"}\nrouting: {health_file: /h.json}\n",
                5,
                "both set",
            ),
            ("health: {interval: soon}\n", 4, "not a duration"),
            ("health:\n  streams: {field: x}\n", 5, "exactly one"),
            (
                "health:\n  streams: {url: \"https://x\", field: x}\n",
                5,
                "only http",
            ),
            (
                "health:\n  streams: {file: rel.json, field: x}\n",
                5,
                "absolute",
            ),
            ("actions:\n  a:\n    argv: []\n", 6, "must name a program"),
            ("actions:\n  a:\n    argv: [nginx]\n", 6, "absolute path"),
            (
                "actions:\n  a:\n    argv: [/bin/x, \"{y}\"]\n",
                6,
                "not declared",
            ),
            (
                "actions:\n  a:\n    argv: [/bin/x, \"--host={y}\"]\n    args: {y: x}\n",
                6,
                "whole argv element",
            ),
            (
                "actions:\n  a:\n    argv: [/bin/x]\n    args: {y: x}\n",
                7,
                "no argv element",
            ),
            (
                "actions:\n  a:\n    argv: [/bin/x, \"{y}\"]\n    args: {y: \"(\"}\n",
                7,
                "invalid regex",
            ),
            (
                "actions:\n  a:\n    argv: [/bin/x]\n    timeout: forever\n",
                7,
                "not a duration",
            ),
            (
                "actions:\n  a:\n    argv: [/bin/x]\n    shell: true\n",
                7,
                "unknown field",
            ),
            (
                "actions:\n  \"a/b\":\n    argv: [/bin/x]\n",
                5,
                "not an action name",
            ),
            (
                "actions:\n  \"edgeform probe\":\n    argv: [/bin/x]\n",
                5,
                "not an action name",
            ),
        ];
        for (text, line, needle) in cases {
            let e = parse("agent.yaml", &format!("{base}{text}")).expect_err(text);
            assert_eq!(e.line, *line, "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }

    /// Settings that parse but cannot work, each refused at its value:
    /// empty or overlapping cache dirs, an empty or uncomputable cache
    /// key, port 0 anywhere an address is given.
    #[test]
    fn unusable_settings_are_refused_at_their_value() {
        let redis = "redis: {url: redis://x}\n";
        let cases: &[(&str, &str, u32, u32, &str)] = &[
            (redis, "cache:\n  dirs: []\n", 5, 9, "must not be empty"),
            (
                redis,
                "cache:\n  dirs:\n    - /var/cache/a\n    - /var/cache/a/b\n",
                7,
                7,
                "is inside `/var/cache/a` (dirs[0])",
            ),
            (
                redis,
                "cache:\n  dirs:\n    - /var/cache/a/b\n    - /var/cache/a\n",
                7,
                7,
                "holds `/var/cache/a/b` (dirs[0])",
            ),
            (
                redis,
                "cache:\n  dirs:\n    - /var/cache/a\n    - /var//cache/./a/\n",
                7,
                7,
                "is listed twice",
            ),
            (
                redis,
                "cache:\n  dirs:\n    - /var/cache/a\n    - /var/cache/b/../a\n",
                7,
                7,
                "`..` is not allowed",
            ),
            (redis, "cache:\n  key: \"\"\n", 5, 8, "empty"),
            (
                redis,
                "cache:\n  key: $scheme$host$cookie_id$uri\n",
                5,
                8,
                "`$cookie_id`",
            ),
            (
                redis,
                "cache:\n  key: $scheme$host\n",
                5,
                8,
                "no $request_uri or $uri",
            ),
            (redis, "http:\n  listen: 127.0.0.1:0\n", 5, 11, "port 0"),
            (redis, "http:\n  listen: \"[::]:0\"\n", 5, 11, "port 0"),
            (
                redis,
                "http:\n  listen: 127.0.0.1:8080\n  metrics: yes\n",
                6,
                12,
                "expected a boolean",
            ),
            (redis, "metrics:\n  listen: 127.0.0.1:0\n", 5, 11, "port 0"),
            ("redis:\n  url: redis://127.0.0.1:0\n", "", 4, 8, "port 0"),
            (
                "redis:\n  sentinels: [\"10.0.0.1:26379\", \"10.0.0.2:0\"]\n  master: m\n",
                "",
                4,
                33,
                "port 0",
            ),
            (redis, "mqtt:\n  url: mqtt://broker:0\n", 5, 8, "port 0"),
        ];
        for (redis, text, line, column, needle) in cases {
            let text = format!("node: e\nregion: eu\n{redis}{text}");
            let e = parse_with("agent.yaml", &text, &|_| None, false).expect_err(&text);
            assert_eq!(e.0.len(), 1, "{text}: {e}");
            assert_eq!((e.line, e.column), (*line, *column), "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }

    /// `/metrics` on the HTTP listener: by default only on loopback.
    #[test]
    fn metrics_on_the_http_listener_only_on_loopback_by_default() {
        for (http, served) in [
            ("{listen: \"127.0.0.1:8080\"}", true),
            ("{listen: \"[::1]:8080\"}", true),
            ("{listen: \"0.0.0.0:8080\"}", false),
            ("{listen: \"192.0.2.10:80\"}", false),
            ("{listen: \"0.0.0.0:8080\", metrics: true}", true),
            ("{listen: \"127.0.0.1:8080\", metrics: false}", false),
        ] {
            let c = parse(
                "agent.yaml",
                &format!("node: e\nregion: eu\nredis: {{url: redis://x}}\nhttp: {http}\n"),
            )
            .unwrap();
            assert_eq!(c.http.unwrap().metrics, served, "{http}");
        }
    }

    // See: #13 item 5
    #[test]
    fn r13_5_every_error_at_once_each_located() {
        let text = "node: e\nregion: eu\nredis: {url: redis://x, pasword_env: X}\n\
                    cache: {levels: \"3:3\", dirs: [relative]}\nhttp: {listen: nowhere}\n\
                    mqtt: {url: \"http://x\", command_key_env: K}\n\
                    health: {interval: soon}\nactions:\n  a:\n    argv: [nginx]\n";
        let e = parse_with("agent.yaml", text, &|_| None, false).unwrap_err();
        let lines: Vec<u32> = e.0.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 4, 4, 5, 6, 7, 10], "{e}");
        assert!(
            e.0[0].message.starts_with("unknown field `pasword_env`"),
            "{e}"
        );
        // The environment: every missing variable, at its key.
        let text = "node: e\nregion: eu\nredis: {url: redis://x, password_env: A}\n\
                    mqtt:\n  url: mqtt://x\n  username: u\n  password_env: B\n  command_key_env: C\n";
        let e = parse_with("agent.yaml", text, &|_| None, false).unwrap_err();
        let got: Vec<(u32, bool)> =
            e.0.iter()
                .map(|e| (e.line, e.message.contains("not set")))
                .collect();
        assert_eq!(got, [(3, true), (7, true), (8, true)], "{e}");
        let c = parse_with("agent.yaml", text, &|v| Some(format!("{v}-value")), false).unwrap();
        assert_eq!(
            c.mqtt.unwrap().command_key.as_deref(),
            Some(b"C-value".as_slice())
        );
    }
}
