//! `agent.yaml`: what the agent needs to know about its node.
//!
//! Read with the same spanned YAML as the compiler, so every error names
//! `file:line:col`; unknown keys are errors (a typo must not silently
//! leave a setting at its default).

use std::path::{Path, PathBuf};

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
}

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
    Ok(Config {
        node: raw.node,
        region: raw.region,
        redis,
        cache,
        http,
        routing,
    })
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
}
