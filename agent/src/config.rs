//! `agent.yaml`: what the agent needs to know about its node.
//!
//! Read with the same spanned YAML as the compiler, so every error names
//! `file:line:col`; unknown keys are errors (a typo must not silently
//! leave a setting at its default).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgeredis::RedisTarget;
use serde::Deserialize;

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
}

/// `mqtt:` — the broker.
#[derive(Debug, Clone)]
pub struct MqttConfig {
    pub broker: edgemqtt::Broker,
    pub topic_prefix: String,
    /// The HMAC-SHA256 key commands must be signed with (read from the
    /// variable `command_key_env` names at start); `None`: unsigned
    /// commands are accepted.
    pub command_key: Option<Vec<u8>>,
}

/// `health:` — what the report carries and how often.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    pub interval: Duration,
    pub play_sessions: Option<Source>,
    pub streams: Option<Source>,
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

/// `http:` — the listener.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub listen: std::net::SocketAddr,
    /// Where viewers go for a node without a payload URL (the router
    /// proxies); `{node}` and `{stream}` are replaced.
    pub proxy_url: String,
}

/// `routing:` — where health comes from and how often to look.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    /// A health snapshot file (`edgeform route --health` format).
    pub health_file: Option<PathBuf>,
    pub refresh: std::time::Duration,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    node: String,
    region: String,
    redis: RawRedis,
    #[serde(default)]
    cache: RawCache,
    #[serde(default)]
    http: Option<RawHttp>,
    #[serde(default)]
    routing: Option<RawRouting>,
    #[serde(default)]
    mqtt: Option<RawMqtt>,
    #[serde(default)]
    health: Option<RawHealth>,
    #[serde(default)]
    actions: BTreeMap<String, RawAction>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMqtt {
    url: String,
    #[serde(default)]
    topic_prefix: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password_env: Option<String>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    command_key_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    play_sessions: Option<RawSource>,
    #[serde(default)]
    streams: Option<RawSource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    file: Option<PathBuf>,
    field: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAction {
    argv: Vec<String>,
    #[serde(default)]
    args: BTreeMap<String, String>,
    #[serde(default)]
    timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: String,
    #[serde(default)]
    proxy_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    #[serde(default)]
    health_file: Option<PathBuf>,
    #[serde(default)]
    refresh: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    sentinels: Option<Vec<String>>,
    #[serde(default)]
    master: Option<String>,
    #[serde(default)]
    password_env: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    #[serde(default)]
    dirs: Option<Vec<PathBuf>>,
    #[serde(default)]
    levels: Option<String>,
    #[serde(default)]
    key: Option<String>,
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

/// Read and validate `path`.
///
/// # Errors
/// Unreadable file, YAML errors, unknown keys, missing or invalid values,
/// each with its position.
pub fn load(path: &Path) -> Result<Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error {
        file: path.display().to_string(),
        line: 0,
        column: 0,
        message: format!("cannot read: {e}"),
    })?;
    parse(&path.display().to_string(), &text)
}

/// Parse `agent.yaml` text; `file` names it in errors.
///
/// # Errors
/// See [`load`].
pub fn parse(file: &str, text: &str) -> Result<Config, Error> {
    let at = |span: yamlspan::Span, message: String| Error {
        file: file.to_owned(),
        line: span.line,
        column: span.column,
        message,
    };
    let tree = match yamlspan::parse(text) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(at(
                yamlspan::Span {
                    line: 1,
                    column: 1,
                    ..Default::default()
                },
                "empty configuration: `node`, `region` and `redis` are required".into(),
            ));
        }
        Err(e) => return Err(at(e.span, e.message)),
    };
    let json = tree.to_json();
    let raw: Raw = serde_path_to_error::deserialize(json).map_err(|e| {
        let pointer: String = e
            .path()
            .iter()
            .filter_map(|seg| match seg {
                serde_path_to_error::Segment::Map { key } => Some(format!("/{key}")),
                serde_path_to_error::Segment::Seq { index } => Some(format!("/{index}")),
                _ => None,
            })
            .collect();
        let message = e.inner().to_string();
        // Point an unknown key at the key itself.
        let span = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .and_then(|key| {
                let parent = pointer.rsplit_once('/').map_or("", |(p, _)| p);
                let parent = if pointer.ends_with(&format!("/{key}")) {
                    parent
                } else {
                    pointer.as_str()
                };
                tree.pointer(parent).and_then(|n| n.key_span(key))
            })
            .unwrap_or_else(|| tree.locate(&pointer));
        let message = message
            .split(" at line ")
            .next()
            .unwrap_or(&message)
            .to_owned();
        at(span, message)
    })?;
    let redis = match (raw.redis.url, raw.redis.sentinels, raw.redis.master) {
        (Some(url), None, None) => RedisTarget::Url {
            url,
            password_env: raw.redis.password_env,
        },
        (None, Some(sentinels), Some(master)) if !sentinels.is_empty() => RedisTarget::Sentinel {
            sentinels,
            master,
            password_env: raw.redis.password_env,
        },
        _ => {
            return Err(at(
                tree.locate("/redis"),
                "`redis` needs either `url`, or `sentinels` and `master`".into(),
            ));
        }
    };
    let defaults = edgestate::purge::CacheDefaults::default();
    let cache = CacheConfig {
        dirs: raw
            .cache
            .dirs
            .unwrap_or_else(|| defaults.dirs.iter().map(PathBuf::from).collect()),
        levels: raw
            .cache
            .levels
            .unwrap_or_else(|| defaults.levels.to_owned()),
        key: raw.cache.key.unwrap_or_else(|| defaults.key.to_owned()),
    };
    if let Err(e) = crate::cache::Levels::parse(&cache.levels) {
        return Err(at(
            tree.locate("/cache/levels"),
            format!("invalid `levels`: {e}"),
        ));
    }
    if let Some((i, _)) = cache
        .dirs
        .iter()
        .enumerate()
        .find(|(_, d)| !d.is_absolute())
    {
        return Err(at(
            tree.locate(&format!("/cache/dirs/{i}")),
            "cache dirs must be absolute paths".into(),
        ));
    }
    if raw.node.is_empty() || raw.region.is_empty() {
        return Err(at(
            tree.locate("/node"),
            "`node` and `region` must not be empty".into(),
        ));
    }
    let http = match raw.http {
        None => None,
        Some(h) => Some(HttpConfig {
            listen: h.listen.parse().map_err(|_| {
                at(
                    tree.locate("/http/listen"),
                    format!("`{}` is not an address:port", h.listen),
                )
            })?,
            proxy_url: h
                .proxy_url
                .unwrap_or_else(|| "/proxy/{node}/{stream}".to_owned()),
        }),
    };
    let routing = match raw.routing {
        None => RoutingConfig {
            health_file: None,
            refresh: crate::routing::DEFAULT_REFRESH,
        },
        Some(r) => RoutingConfig {
            health_file: r.health_file,
            refresh: match r.refresh {
                None => crate::routing::DEFAULT_REFRESH,
                Some(t) => edgestate::parse_duration_ms(&t)
                    .filter(|ms| *ms > 0)
                    .map(std::time::Duration::from_millis)
                    .ok_or_else(|| {
                        at(
                            tree.locate("/routing/refresh"),
                            format!("`{t}` is not a duration (500ms, 5s, 1m)"),
                        )
                    })?,
            },
        },
    };
    let duration = |text: &str, pointer: &str| {
        edgestate::parse_duration_ms(text)
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
            .ok_or_else(|| {
                at(
                    tree.locate(pointer),
                    format!("`{text}` is not a duration (500ms, 5s, 1m)"),
                )
            })
    };
    let mqtt = match raw.mqtt {
        None => None,
        Some(m) => {
            if let Err(e) = edgemqtt::parse_url(&m.url) {
                return Err(at(tree.locate("/mqtt/url"), format!("{e:#}")));
            }
            let topic_prefix = m
                .topic_prefix
                .unwrap_or_else(|| edgestate::mqtt::DEFAULT_PREFIX.to_owned());
            if topic_prefix.is_empty()
                || topic_prefix
                    .split('/')
                    .any(|l| !edgestate::mqtt::is_topic_level(l))
            {
                return Err(at(
                    tree.locate("/mqtt/topic_prefix"),
                    format!(
                        "`{topic_prefix}` is not a topic prefix (levels separated by `/`, no wildcards)"
                    ),
                ));
            }
            let command_key = match &m.command_key_env {
                None => None,
                Some(var) => match std::env::var(var) {
                    Ok(k) if !k.is_empty() => Some(k.into_bytes()),
                    _ => {
                        return Err(at(
                            tree.locate("/mqtt/command_key_env"),
                            format!(
                                "the command signing key variable `{var}` is not set (or empty) in the environment"
                            ),
                        ));
                    }
                },
            };
            if let Some(var) = &m.password_env {
                if m.username.is_none() {
                    return Err(at(
                        tree.locate("/mqtt/password_env"),
                        "`password_env` needs a `username`".into(),
                    ));
                }
                if std::env::var_os(var).is_none() {
                    return Err(at(
                        tree.locate("/mqtt/password_env"),
                        format!("the MQTT password variable `{var}` is not set in the environment"),
                    ));
                }
            }
            if m.ca_file.is_some() && !m.url.starts_with("mqtts://") {
                return Err(at(
                    tree.locate("/mqtt/ca_file"),
                    "`ca_file` is for an mqtts:// broker".into(),
                ));
            }
            Some(MqttConfig {
                broker: edgemqtt::Broker {
                    url: m.url,
                    username: m.username,
                    password_env: m.password_env,
                    ca_file: m.ca_file,
                },
                topic_prefix,
                command_key,
            })
        }
    };
    if mqtt.is_some() && routing.health_file.is_some() {
        return Err(at(
            tree.locate("/routing/health_file"),
            "`routing.health_file` and `mqtt` are both set: with a broker, health comes from MQTT; remove one".into(),
        ));
    }
    let source = |raw: Option<RawSource>, name: &str| -> Result<Option<Source>, Error> {
        let Some(r) = raw else { return Ok(None) };
        let here = format!("/health/{name}");
        let from = match (r.url, r.file) {
            (Some(u), None) if u.starts_with("http://") => SourceFrom::Url(u),
            (Some(u), None) => {
                return Err(at(
                    tree.locate(&format!("{here}/url")),
                    format!("`{u}`: only http:// URLs (a local stats endpoint)"),
                ));
            }
            (None, Some(f)) if f.is_absolute() => SourceFrom::File(f),
            (None, Some(_)) => {
                return Err(at(
                    tree.locate(&format!("{here}/file")),
                    "the file must be an absolute path".into(),
                ));
            }
            _ => {
                return Err(at(
                    tree.locate(&here),
                    format!("`{name}` needs exactly one of `url` and `file`"),
                ));
            }
        };
        if r.field.is_empty() {
            return Err(at(
                tree.locate(&format!("{here}/field")),
                "`field` must not be empty".into(),
            ));
        }
        Ok(Some(Source {
            from,
            field: r.field,
        }))
    };
    let health = match raw.health {
        None => HealthConfig {
            interval: DEFAULT_HEALTH_INTERVAL,
            play_sessions: None,
            streams: None,
        },
        Some(h) => HealthConfig {
            interval: match h.interval {
                None => DEFAULT_HEALTH_INTERVAL,
                Some(t) => duration(&t, "/health/interval")?,
            },
            play_sessions: source(h.play_sessions, "play_sessions")?,
            streams: source(h.streams, "streams")?,
        },
    };
    let mut actions = BTreeMap::new();
    for (name, a) in raw.actions {
        let here = format!("/actions/{name}");
        if !edgestate::mqtt::is_topic_level(&name) || name.chars().any(char::is_whitespace) {
            return Err(at(
                tree.pointer("/actions")
                    .and_then(|n| n.key_span(&name))
                    .unwrap_or_else(|| tree.locate("/actions")),
                format!("`{name}` is not an action name"),
            ));
        }
        let action = action(&name, a, &here, &tree, &at, &duration)?;
        actions.insert(name, action);
    }
    Ok(Config {
        node: raw.node,
        region: raw.region,
        redis,
        cache,
        http,
        routing,
        mqtt,
        health,
        actions,
    })
}

/// Check one action: an absolute program, `{arg}` placeholders that fill
/// whole elements and are all declared, every declared argument used,
/// regexes that compile.
fn action(
    name: &str,
    a: RawAction,
    here: &str,
    tree: &yamlspan::Node,
    at: &dyn Fn(yamlspan::Span, String) -> Error,
    duration: &dyn Fn(&str, &str) -> Result<Duration, Error>,
) -> Result<Action, Error> {
    let Some(program) = a.argv.first() else {
        return Err(at(
            tree.locate(&format!("{here}/argv")),
            format!("action `{name}`: `argv` must name a program"),
        ));
    };
    if !program.starts_with('/') {
        return Err(at(
            tree.locate(&format!("{here}/argv/0")),
            format!(
                "action `{name}`: the program must be an absolute path (no PATH lookup), not `{program}`"
            ),
        ));
    }
    let mut used = std::collections::BTreeSet::new();
    for (i, element) in a.argv.iter().enumerate() {
        let placeholder = placeholder(element);
        if let Some(arg) = placeholder {
            if i == 0 {
                return Err(at(
                    tree.locate(&format!("{here}/argv/0")),
                    format!("action `{name}`: the program cannot be an argument"),
                ));
            }
            if !a.args.contains_key(arg) {
                return Err(at(
                    tree.locate(&format!("{here}/argv/{i}")),
                    format!("action `{name}`: `{{{arg}}}` is not declared in `args`"),
                ));
            }
            used.insert(arg.to_owned());
        } else if element.contains('{') && element.contains('}') {
            return Err(at(
                tree.locate(&format!("{here}/argv/{i}")),
                format!(
                    "action `{name}`: a placeholder must be a whole argv element, like \"{{host}}\"; `{element}` mixes it with text"
                ),
            ));
        }
    }
    let mut args = BTreeMap::new();
    for (arg, pattern) in a.args {
        let pointer = format!("{here}/args/{arg}");
        if !used.contains(&arg) {
            return Err(at(
                tree.locate(&pointer),
                format!(
                    "action `{name}`: argument `{arg}` is declared but no argv element is `{{{arg}}}`"
                ),
            ));
        }
        let re = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
            at(
                tree.locate(&pointer),
                format!("action `{name}`: argument `{arg}`: invalid regex: {e}"),
            )
        })?;
        args.insert(arg, re);
    }
    let timeout = match a.timeout {
        None => DEFAULT_ACTION_TIMEOUT,
        Some(t) => duration(&t, &format!("{here}/timeout"))?,
    };
    Ok(Action {
        argv: a.argv,
        args,
        timeout,
    })
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
            "node: e\nregion: us\nredis: {sentinels: [\"127.0.0.1:26379\"], master: e, password_env: PW}\n\
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
        ];
        for (text, line, needle) in cases {
            let e = parse("agent.yaml", &format!("{base}{text}")).expect_err(text);
            assert_eq!(e.line, *line, "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }
}
