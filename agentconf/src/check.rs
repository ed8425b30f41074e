//! Raw → validated: every rule of `agent.yaml`, one function per section.
//!
//! Each function reads its [`raw`] section, adds every problem it finds
//! to the one list (located through the spanned tree by the JSON pointer
//! of the key or value), and returns its validated part only when that
//! part is whole. A section that failed never stops the others.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgestate::target::{Broker, RedisTarget, TlsFiles};

use crate::raw::{self, Field, Text};
use crate::{
    Action, CacheConfig, Config, DEFAULT_ACTION_TIMEOUT, DEFAULT_HEALTH_INTERVAL, DEFAULT_REFRESH,
    DEFAULT_STATE_DIR, Error, Errors, HealthConfig, HttpConfig, MqttConfig, RoutingConfig, Source,
    SourceFrom, placeholder,
};

/// The whole pipeline: YAML → raw → validated, then the environment and
/// the files the configuration names.
pub(crate) fn check(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    files: bool,
    keys: bool,
) -> Result<Config, Errors> {
    let tree = match yamlspan::parse(text) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(crate::at_start(
                file,
                "empty configuration: `node`, `region` and `redis` are required".into(),
            ));
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
    let raw: Field<raw::Config> = match serde_json::from_value(tree.to_json()) {
        Ok(raw) => raw,
        // A `Field` takes any value: not reached.
        Err(e) => return Err(crate::at_start(file, e.to_string())),
    };
    let mut cx = Cx {
        file,
        tree: &tree,
        errors: Vec::new(),
    };
    let config = cx.open(&raw, "").and_then(|r| document(&mut cx, r));
    if let Some(config) = &config {
        environment(&mut cx, config, env);
        if files {
            named_files(&mut cx, config);
        }
    }
    let config = config.map(|c| with_environment(c, env));
    let config = if keys {
        config.map(|c| key_files(&mut cx, c))
    } else {
        config
    };
    cx.errors.sort_by_key(|e| (e.line, e.column));
    cx.errors.dedup();
    match config {
        Some(c) if cx.errors.is_empty() => Ok(c),
        _ if cx.errors.is_empty() => Err(crate::at_start(file, "invalid configuration".into())),
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

    /// The value at `pointer`: its unknown keys and its type error
    /// reported, the typed value when it is one.
    fn open<'r, T>(&mut self, field: &'r Field<T>, pointer: &str) -> Option<&'r T> {
        for key in &field.unknown {
            let expected: Vec<String> = field.expected.iter().map(|a| format!("`{a}`")).collect();
            self.at_key(
                pointer,
                key,
                format!(
                    "unknown field `{key}`, expected one of {}",
                    expected.join(", ")
                ),
            );
        }
        match &field.value {
            Ok(v) => Some(v),
            Err(e) => {
                self.at(pointer, e.clone());
                None
            }
        }
    }

    /// An optional section or value (absent: `None`, nothing reported).
    fn opt<'r, T>(&mut self, field: Option<&'r Field<T>>, pointer: &str) -> Option<&'r T> {
        field.and_then(|f| self.open(f, pointer))
    }

    /// An optional string (absent or null: `None`).
    fn string(&mut self, field: &Text, parent: &str, key: &str) -> Option<String> {
        self.opt(field.as_ref(), &format!("{parent}/{key}"))
            .cloned()
    }

    /// A required string: absent (or null) is `missing field`, at the
    /// mapping that should hold it.
    fn required(&mut self, field: &Text, parent: &str, key: &str) -> Option<String> {
        if field.is_none() {
            self.at(parent, format!("missing field `{key}`"));
            return None;
        }
        self.string(field, parent, key)
    }

    /// An optional list of strings: the strings among its items, each
    /// other item reported at its index.
    fn strings(
        &mut self,
        field: &Option<Field<Vec<Field<String>>>>,
        parent: &str,
        key: &str,
    ) -> Option<Vec<String>> {
        let here = format!("{parent}/{key}");
        let items = self.opt(field.as_ref(), &here)?;
        Some(
            items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| self.open(item, &format!("{here}/{i}")).cloned())
                .collect(),
        )
    }

    /// An optional duration (`500ms`, `5s`, `1m`), more than zero; absent
    /// (or null): `default`.
    fn duration(
        &mut self,
        field: &Text,
        parent: &str,
        key: &str,
        default: Duration,
    ) -> Option<Duration> {
        if field.is_none() {
            return Some(default);
        }
        let text = self.string(field, parent, key)?;
        let d = edgestate::parse_duration_ms(&text)
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        if d.is_none() {
            self.at(
                &format!("{parent}/{key}"),
                format!("`{text}` is not a duration (500ms, 5s, 1m)"),
            );
        }
        d
    }
}

/// The whole file: every section, each checked even when another failed.
fn document(cx: &mut Cx<'_>, r: &raw::Config) -> Option<Config> {
    let node = cx.required(&r.node, "", "node");
    let region = cx.required(&r.region, "", "region");
    if node.as_deref() == Some("") || region.as_deref() == Some("") {
        cx.at("/node", "`node` and `region` must not be empty".into());
    }
    let redis = match &r.redis {
        Some(v) => cx.open(v, "/redis").and_then(|v| redis(cx, v)),
        None => {
            cx.at("", "missing field `redis`".into());
            None
        }
    };
    let cache = match &r.cache {
        None => cache(cx, None),
        Some(v) => cx.open(v, "/cache").and_then(|v| cache(cx, Some(v))),
    };
    let http = cx.opt(r.http.as_ref(), "/http").and_then(|v| http(cx, v));
    let routing = match &r.routing {
        None => Some(RoutingConfig {
            health_file: None,
            refresh: DEFAULT_REFRESH,
            share_health: None,
        }),
        Some(v) => cx.open(v, "/routing").and_then(|v| routing(cx, v)),
    };
    let mqtt = cx.opt(r.mqtt.as_ref(), "/mqtt").and_then(|v| mqtt(cx, v));
    if r.mqtt.is_some() && routing.as_ref().is_some_and(|r| r.health_file.is_some()) {
        cx.at(
            "/routing/health_file",
            "`routing.health_file` and `mqtt` are both set: with a broker, health comes from MQTT; remove one".into(),
        );
    }
    let health = match &r.health {
        None => Some(HealthConfig {
            interval: DEFAULT_HEALTH_INTERVAL,
            play_sessions: None,
            streams: None,
            bundle_manifest: None,
            vod: None,
            probe: Vec::new(),
            edge_metrics: None,
        }),
        Some(v) => cx.open(v, "/health").and_then(|v| health(cx, v)),
    };
    let actions = match &r.actions {
        None => Some(BTreeMap::new()),
        Some(v) => cx.open(v, "/actions").and_then(|v| actions(cx, v)),
    };
    let metrics_listen = match &r.metrics {
        None => Some(None),
        Some(v) => cx
            .open(v, "/metrics")
            .and_then(|v| metrics(cx, v))
            .map(Some),
    };
    let state_dir = match cx.string(&r.state_dir, "", "state_dir") {
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
        http: match r.http {
            Some(_) => Some(http?),
            None => None,
        },
        routing: routing?,
        mqtt: match r.mqtt {
            Some(_) => Some(mqtt?),
            None => None,
        },
        health: health?,
        actions: actions?,
        metrics_listen: metrics_listen?,
        state_dir: state_dir?,
    })
}

/// An `address:port` to listen on, never port 0.
fn listen_address(cx: &mut Cx<'_>, listen: &str, pointer: &str) -> Option<std::net::SocketAddr> {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.port() == 0 => {
            cx.at(
                pointer,
                format!("`{listen}`: port 0 would listen on a random port; name the port"),
            );
            None
        }
        Ok(a) => Some(a),
        Err(_) => {
            cx.at(pointer, format!("`{listen}` is not an address:port"));
            None
        }
    }
}

/// `metrics: {listen: ADDR}`.
fn metrics(cx: &mut Cx<'_>, m: &raw::Metrics) -> Option<std::net::SocketAddr> {
    let listen = cx.required(&m.listen, "/metrics", "listen")?;
    listen_address(cx, &listen, "/metrics/listen")
}

/// `redis:` through [`RedisTarget::from_parts`], shared with the
/// compiler's node validation.
fn redis(cx: &mut Cx<'_>, m: &raw::Redis) -> Option<RedisTarget> {
    let url = cx.string(&m.url, "/redis", "url");
    let sentinels = cx.strings(&m.sentinels, "/redis", "sentinels");
    let master = cx.string(&m.master, "/redis", "master");
    let username = cx.string(&m.username, "/redis", "username");
    let password_env = cx.string(&m.password_env, "/redis", "password_env");
    // A bad `tls` block is reported with the rest, not on its own.
    let mut tls_bad = false;
    let tls = match &m.tls {
        None => None,
        Some(t) => match cx.open(t, "/redis/tls") {
            Some(t) => Some(TlsFiles {
                ca_file: cx
                    .string(&t.ca_file, "/redis/tls", "ca_file")
                    .map(PathBuf::from),
                cert_file: cx
                    .string(&t.cert_file, "/redis/tls", "cert_file")
                    .map(PathBuf::from),
                key_file: cx
                    .string(&t.key_file, "/redis/tls", "key_file")
                    .map(PathBuf::from),
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
        && edgestate::target::redis_url_port(u) == Some(0)
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

/// `cache:` (absent: the seed's layout).
fn cache(cx: &mut Cx<'_>, m: Option<&raw::Cache>) -> Option<CacheConfig> {
    let defaults = edgestate::purge::CacheDefaults::default();
    let (dirs, levels, key) = match m {
        None => (None, None, None),
        Some(m) => (
            cx.strings(&m.dirs, "/cache", "dirs"),
            cx.string(&m.levels, "/cache", "levels"),
            cx.string(&m.key, "/cache", "key"),
        ),
    };
    let dirs: Vec<PathBuf> = dirs.map_or_else(
        || defaults.dirs.iter().map(PathBuf::from).collect(),
        |d| d.into_iter().map(PathBuf::from).collect(),
    );
    let levels = levels.unwrap_or_else(|| defaults.levels.to_owned());
    let key = key.unwrap_or_else(|| defaults.key.to_owned());
    let mut ok = true;
    if let Err(e) = edgestate::purge::parse_levels(&levels) {
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

fn http(cx: &mut Cx<'_>, m: &raw::Http) -> Option<HttpConfig> {
    let metrics = match &m.metrics {
        None => None,
        Some(f) => Some(*cx.open(f, "/http/metrics")?),
    };
    let listen = cx.required(&m.listen, "/http", "listen")?;
    let proxy_url = cx
        .string(&m.proxy_url, "/http", "proxy_url")
        .unwrap_or_else(|| "/proxy/{node}/{stream}".to_owned());
    let listen = listen_address(cx, &listen, "/http/listen")?;
    Some(HttpConfig {
        listen,
        proxy_url,
        metrics: metrics.unwrap_or_else(|| listen.ip().is_loopback()),
    })
}

fn routing(cx: &mut Cx<'_>, m: &raw::Routing) -> Option<RoutingConfig> {
    let health_file = cx
        .string(&m.health_file, "/routing", "health_file")
        .map(PathBuf::from);
    let share_health = cx
        .string(&m.share_health, "/routing", "share_health")
        .map(PathBuf::from);
    let refresh = cx.duration(&m.refresh, "/routing", "refresh", DEFAULT_REFRESH);
    Some(RoutingConfig {
        health_file,
        refresh: refresh?,
        share_health,
    })
}

/// `mqtt:`; what it needs from the environment is resolved in
/// [`environment`], its key files in [`key_files`].
fn mqtt(cx: &mut Cx<'_>, m: &raw::Mqtt) -> Option<MqttConfig> {
    let url = cx.required(&m.url, "/mqtt", "url");
    let mut ok = true;
    let tls = match &url {
        Some(u) => match edgestate::target::parse_broker_url(u) {
            Ok((_, _, tls)) => tls,
            Err(e) => {
                cx.at("/mqtt/url", e.with_cause());
                ok = false;
                false
            }
        },
        None => false,
    };
    let topic_prefix = cx
        .string(&m.topic_prefix, "/mqtt", "topic_prefix")
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
    let username = cx.string(&m.username, "/mqtt", "username");
    let password_env = cx.string(&m.password_env, "/mqtt", "password_env");
    if password_env.is_some() && username.is_none() {
        cx.at(
            "/mqtt/password_env",
            "`password_env` needs a `username`".into(),
        );
        ok = false;
    }
    let ca_file = cx.string(&m.ca_file, "/mqtt", "ca_file").map(PathBuf::from);
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
    let command_key_env = cx.string(&m.command_key_env, "/mqtt", "command_key_env");
    let command_public_key_file = cx
        .string(
            &m.command_public_key_file,
            "/mqtt",
            "command_public_key_file",
        )
        .map(PathBuf::from);
    let result_key_file = cx
        .string(&m.result_key_file, "/mqtt", "result_key_file")
        .map(PathBuf::from);
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
    let url = url.filter(|_| ok)?;
    Some(MqttConfig {
        broker: Broker {
            url,
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

fn health(cx: &mut Cx<'_>, m: &raw::Health) -> Option<HealthConfig> {
    let bundle_manifest = cx
        .string(&m.bundle_manifest, "/health", "bundle_manifest")
        .map(PathBuf::from);
    if let Some(p) = &bundle_manifest
        && !p.is_absolute()
    {
        cx.at(
            "/health/bundle_manifest",
            "`bundle_manifest` must be an absolute path".into(),
        );
    }
    let interval = cx.duration(&m.interval, "/health", "interval", DEFAULT_HEALTH_INTERVAL);
    if interval.is_some_and(|i| i > crate::HEALTH_INTERVAL_MAX) {
        cx.at(
            "/health/interval",
            format!(
                "at most {}s: other agents count a node silent after 3 of its intervals, and believe at most {}s of one",
                crate::HEALTH_INTERVAL_MAX.as_secs(),
                crate::HEALTH_INTERVAL_MAX.as_secs()
            ),
        );
    }
    let play_sessions = source(cx, m.play_sessions.as_ref(), "play_sessions");
    let streams = source(cx, m.streams.as_ref(), "streams");
    let vod = source(cx, m.vod.as_ref(), "vod");
    let mut probe = Vec::new();
    for (i, text) in cx
        .strings(&m.probe, "/health", "probe")
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let parsed = [
            crate::ProbeKind::Http,
            crate::ProbeKind::Https,
            crate::ProbeKind::Proxy,
        ]
        .into_iter()
        .find_map(|kind| {
            let rest = text.strip_prefix(kind.scheme())?.strip_prefix("://")?;
            Some((kind, rest.parse::<std::net::SocketAddr>().ok()?))
        });
        match parsed {
            Some((kind, addr)) => probe.push(crate::Probe { addr, kind }),
            None => cx.at(
                &format!("/health/probe/{i}"),
                "a probe is `http://IP:PORT`, `https://IP:PORT` or `proxy://IP:PORT`: \
                 a plain-HTTP, HTTPS or PROXY-protocol listener of this node's edge"
                    .into(),
            ),
        }
    }
    let edge_metrics = cx.string(&m.edge_metrics, "/health", "edge_metrics");
    if let Some(u) = &edge_metrics
        && !u
            .strip_prefix("http://")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace))
    {
        cx.at(
            "/health/edge_metrics",
            format!("`{u}`: the edge's metrics listener is a plain `http://IP:PORT/metrics` URL"),
        );
    }
    Some(HealthConfig {
        interval: interval?,
        play_sessions: play_sessions?,
        streams: streams?,
        bundle_manifest,
        vod: vod?,
        probe,
        edge_metrics,
    })
}

/// One metric source; `Some(None)` when absent, `None` when invalid.
#[allow(clippy::option_option)]
fn source(cx: &mut Cx<'_>, v: Option<&Field<raw::Source>>, name: &str) -> Option<Option<Source>> {
    let Some(v) = v else { return Some(None) };
    let here = format!("/health/{name}");
    let m = cx.open(v, &here)?;
    let url = cx.string(&m.url, &here, "url");
    let file = cx.string(&m.file, &here, "file").map(PathBuf::from);
    let field = cx.required(&m.field, &here, "field");
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

fn actions(
    cx: &mut Cx<'_>,
    m: &BTreeMap<String, Field<raw::Action>>,
) -> Option<BTreeMap<String, Action>> {
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
fn action(cx: &mut Cx<'_>, name: &str, v: &Field<raw::Action>) -> Option<Action> {
    let here = format!("/actions/{}", name.replace('~', "~0").replace('/', "~1"));
    let m = cx.open(v, &here)?;
    if m.argv.is_none() {
        cx.at(&here, "missing field `argv`".into());
    }
    let argv = cx.strings(&m.argv, &here, "argv").unwrap_or_default();
    let mut raw_args = BTreeMap::new();
    if let Some(am) = cx.opt(m.args.as_ref(), &format!("{here}/args")) {
        for (arg, pattern) in am {
            if let Some(p) = cx.open(pattern, &format!("{here}/args/{arg}")) {
                raw_args.insert(arg.clone(), p.clone());
            }
        }
    }
    let timeout = cx.duration(&m.timeout, &here, "timeout", DEFAULT_ACTION_TIMEOUT);
    let before = cx.errors.len();
    match argv.first() {
        None if m.argv.is_some() => cx.at(
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

/// Fill what the environment holds (the command key), after
/// [`environment`] found every variable set.
fn with_environment(mut config: Config, env: &dyn Fn(&str) -> Option<String>) -> Config {
    if let Some(m) = &mut config.mqtt {
        m.command_key = m
            .command_key_env
            .as_deref()
            .and_then(env)
            .filter(|k| !k.is_empty())
            .map(String::into_bytes);
    }
    config
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

/// The command key files, read whenever the configuration is: without
/// them commands could not be checked. Each problem is one line at its
/// key, naming the file.
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
