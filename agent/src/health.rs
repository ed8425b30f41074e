//! The health report (README, "Health, status and one-shot commands"): every `health.interval`, a retained JSON
//! report on `<prefix>/health/<node>`.
//!
//! Each metric is read from where it lives — transmit bytes from
//! `/proc/net/dev`, sessions and streams from the configured source, the
//! applied commit and queue depth from local Redis — and a metric that
//! cannot be read is `null`, never a guess: routing treats a missing
//! metric as "not eligible" where a limit needs it, which is the safe
//! side.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgestate::mqtt::{ConfigState, HealthReport, PurgeState, RedisState};
use rumqttc::{AsyncClient, QoS};
use serde_json::Value;

use crate::config::{Config, Source, SourceFrom};
use crate::metrics::{Metrics, gauge_value};
use crate::shutdown::Shutdown;

/// The agent's version as reports carry it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Total transmit bytes over every non-loopback interface in the text of
/// `/proc/net/dev`; `None` when the text is not in that format.
#[must_use]
pub fn transmit_bytes(net_dev: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut seen_header = false;
    for line in net_dev.lines() {
        let Some((name, counters)) = line.split_once(':') else {
            seen_header |= line.contains('|');
            continue;
        };
        let name = name.trim();
        let fields: Vec<&str> = counters.split_whitespace().collect();
        // 8 receive counters, then transmit bytes.
        let tx: u64 = fields.get(8)?.parse().ok()?;
        if name != "lo" {
            total = total.wrapping_add(tx);
        }
    }
    seen_header.then_some(total)
}

/// Total receive + transmit bytes over every non-loopback interface in
/// the text of `/proc/net/dev` (the placement budget's measure,
/// `network_bandwidth_kbit`).
#[must_use]
pub fn receive_transmit_bytes(net_dev: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut seen_header = false;
    for line in net_dev.lines() {
        let Some((name, counters)) = line.split_once(':') else {
            seen_header |= line.contains('|');
            continue;
        };
        let fields: Vec<&str> = counters.split_whitespace().collect();
        let rx: u64 = fields.first()?.parse().ok()?;
        let tx: u64 = fields.get(8)?.parse().ok()?;
        if name.trim() != "lo" {
            total = total.wrapping_add(rx).wrapping_add(tx);
        }
    }
    seen_header.then_some(total)
}

/// kbit/s between two samples of a byte counter; `None` across a counter
/// reset or a zero interval.
#[must_use]
pub fn kbit_per_sec(before: (u64, Instant), after: (u64, Instant)) -> Option<u64> {
    let bytes = after.0.checked_sub(before.0)?;
    let secs = after.1.checked_duration_since(before.1)?.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    Some((bytes as f64 * 8.0 / 1000.0 / secs).round() as u64)
}

/// The value of `field` in `doc`: a JSON pointer when it starts with `/`,
/// else a top-level key.
#[must_use]
pub fn field<'a>(doc: &'a Value, field: &str) -> Option<&'a Value> {
    if field.starts_with('/') {
        doc.pointer(field)
    } else {
        doc.get(field)
    }
}

/// A session count: a non-negative integer (a float is rounded).
#[must_use]
pub fn as_count(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = f.round() as u64;
            n
        })
    })
}

/// A stream list: an array of names, or an object whose keys are names.
#[must_use]
pub fn as_streams(v: &Value) -> Option<Vec<String>> {
    let mut names: Vec<String> = match v {
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<_>>()?,
        Value::Object(map) => map.keys().cloned().collect(),
        _ => return None,
    };
    names.sort();
    names.dedup();
    Some(names)
}

/// VOD assets from a source field: an object asset → revision, or asset →
/// list of revisions; anything else is `None`.
#[must_use]
pub fn as_vod(v: &Value) -> Option<std::collections::BTreeMap<String, Vec<u64>>> {
    let Value::Object(map) = v else { return None };
    map.iter()
        .map(|(asset, revs)| {
            let revs = match revs {
                Value::Array(a) => a.iter().map(as_count).collect::<Option<Vec<u64>>>()?,
                one => vec![as_count(one)?],
            };
            Some((asset.clone(), revs))
        })
        .collect()
}

/// Reads the configured sources (each distinct document once per report).
pub struct Sources {
    http: reqwest::Client,
}

impl Default for Sources {
    fn default() -> Sources {
        Sources {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
        }
    }
}

/// The largest metric source document read (bytes).
const SOURCE_MAX: u64 = 4 << 20;

impl Sources {
    async fn document(&self, from: &SourceFrom) -> Result<Value, String> {
        let text = match from {
            SourceFrom::File(path) => {
                let p = path.clone();
                tokio::task::spawn_blocking(move || crate::files::read_regular(&p, SOURCE_MAX))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
            SourceFrom::Url(url) => {
                let r = self
                    .http
                    .get(url)
                    .send()
                    .await
                    .map_err(|e| format!("{url}: {e}"))?;
                if !r.status().is_success() {
                    return Err(format!("{url}: HTTP {}", r.status()));
                }
                r.text().await.map_err(|e| format!("{url}: {e}"))?
            }
        };
        serde_json::from_str(&text).map_err(|e| format!("{from:?}: not JSON: {e}"))
    }

    /// Read `play_sessions` and `streams` (`None` each when unconfigured
    /// or unreadable; the reason is returned for logging).
    pub async fn read(
        &self,
        play: Option<&Source>,
        streams: Option<&Source>,
    ) -> (Option<u64>, Option<Vec<String>>, Vec<String>) {
        let mut problems = Vec::new();
        let mut cache: Vec<(&SourceFrom, Result<Value, String>)> = Vec::new();
        for s in [play, streams].into_iter().flatten() {
            if !cache.iter().any(|(f, _)| *f == &s.from) {
                let doc = self.document(&s.from).await;
                cache.push((&s.from, doc));
            }
        }
        let mut get = |s: Option<&Source>, what: &str, convert: &dyn Fn(&Value) -> bool| {
            let s = s?;
            let doc = cache.iter().find(|(f, _)| *f == &s.from).map(|(_, d)| d)?;
            match doc {
                Err(e) => {
                    problems.push(format!("{what}: {e}"));
                    None
                }
                Ok(doc) => match field(doc, &s.field) {
                    Some(v) if convert(v) => Some(v.clone()),
                    Some(_) => {
                        problems.push(format!("{what}: field `{}` has the wrong type", s.field));
                        None
                    }
                    None => {
                        problems.push(format!("{what}: no field `{}`", s.field));
                        None
                    }
                },
            }
        };
        let p = get(play, "play_sessions", &|v| as_count(v).is_some());
        let st = get(streams, "streams", &|v| as_streams(v).is_some());
        (
            p.as_ref().and_then(as_count),
            st.as_ref().and_then(as_streams),
            problems,
        )
    }
}

/// Read the local Redis' part of the report.
async fn redis_state(
    config: &Config,
    con: &mut Option<redis::aio::MultiplexedConnection>,
) -> (ConfigState, PurgeState, RedisState) {
    let read = async {
        let c = edgeredis::reuse(&config.redis, &config.node, con).await?;
        let queue = config.purge_queue();
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(edgestate::keys::META)
            .arg("commit")
            .arg("generation")
            .cmd("LLEN")
            .arg(&queue)
            .cmd("LLEN")
            .arg(edgestate::purge::processing_key(&queue))
            .cmd("ROLE");
        let (meta, q, p, role): ((Option<String>, Option<u64>), u64, u64, redis::Value) =
            tokio::time::timeout(Duration::from_secs(2), pipe.query_async(c))
                .await
                .map_err(|_| anyhow::anyhow!("redis did not answer within 2s"))??;
        let role = match role {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                Some(redis::Value::SimpleString(s)) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        };
        anyhow::Ok((
            ConfigState {
                commit: meta.0,
                generation: meta.1,
            },
            PurgeState {
                queue: Some(q),
                processing: Some(p),
            },
            RedisState {
                ok: true,
                role,
                data_lost: false,
            },
        ))
    };
    match read.await {
        Ok(r) => r,
        Err(e) => {
            *con = None;
            tracing::debug!(cause = %format!("{e:#}"), "health: redis unreadable");
            (
                ConfigState::default(),
                PurgeState::default(),
                RedisState {
                    ok: false,
                    role: None,
                    data_lost: false,
                },
            )
        }
    }
}

/// The generations of `edgeform:meta` the agent has read, as the edge
/// follows them (docs/edge.md "Freshness"): `serving` moves forward, and
/// not to a missing meta or a lower generation (Redis lost its data),
/// unless Redis was written again after such a loss.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Generations {
    /// The generation the edge serves (`None` inside: none yet or no meta).
    serving: Option<Option<u64>>,
    /// The generation last read.
    seen: Option<Option<u64>>,
}

impl Generations {
    /// `read`: the meta's generation (`None`: no meta). Whether the Redis
    /// has lost its data since.
    fn read(&mut self, read: Option<u64>) -> bool {
        let moved = match self.serving {
            None => true,
            Some(serving) => {
                if read == serving || read.is_none() {
                    false
                } else if self.seen != self.serving && Some(read) != self.seen {
                    true
                } else {
                    !matches!((read, serving), (Some(r), Some(s)) if r < s)
                }
            }
        };
        if moved {
            self.serving = Some(read);
        }
        self.seen = Some(read);
        self.seen != self.serving
    }
}

fn sample_net() -> Option<(u64, Instant)> {
    let text = std::fs::read_to_string("/proc/net/dev").ok()?;
    Some((transmit_bytes(&text)?, Instant::now()))
}

fn sample_net_total() -> Option<(u64, Instant)> {
    let text = std::fs::read_to_string("/proc/net/dev").ok()?;
    Some((receive_transmit_bytes(&text)?, Instant::now()))
}

/// Publish a report every interval until shutdown. The first one goes out
/// a second after start (so `out_kbit` has a rate), the rest every
/// `health.interval`.
pub async fn report(
    config: Arc<Config>,
    client: AsyncClient,
    topic: String,
    metrics: Arc<Metrics>,
    mut shutdown: Shutdown,
) {
    let sources = Sources::default();
    let mut con = None;
    let mut net = sample_net();
    let mut net_total = sample_net_total();
    let mut warned: Vec<String> = Vec::new();
    let mut generations = Generations::default();
    let mut wait = config.health.interval.min(Duration::from_secs(1));
    let serving = Arc::new(crate::probe::Serving::default());
    tokio::spawn(crate::probe::run(
        config.health.probe.clone(),
        serving.clone(),
        shutdown.clone(),
    ));
    loop {
        // A change of the serving state is reported at once.
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = serving.changed.notified() => {}
            () = shutdown.wait() => return,
        }
        wait = config.health.interval;
        let (play_sessions, streams, problems) = sources
            .read(
                config.health.play_sessions.as_ref(),
                config.health.streams.as_ref(),
            )
            .await;
        // Log a source problem when it starts, not every interval.
        for p in &problems {
            if !warned.contains(p) {
                tracing::warn!(problem = %p, "health: metric unavailable; reported as null");
            }
        }
        warned = problems;
        let now_net = sample_net();
        let out_kbit = match (net, now_net) {
            (Some(a), Some(b)) => kbit_per_sec(a, b),
            _ => None,
        };
        net = now_net;
        let now_total = sample_net_total();
        let net_kbit = match (net_total, now_total) {
            (Some(a), Some(b)) => kbit_per_sec(a, b),
            _ => None,
        };
        net_total = now_total;
        let vod = match &config.health.vod {
            None => None,
            Some(src) => match sources.document(&src.from).await {
                Ok(doc) => match field(&doc, &src.field).map(as_vod) {
                    Some(Some(v)) => Some(v),
                    _ => {
                        tracing::warn!(field = %src.field, "health: vod field missing or not asset → revisions; reported as null");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(problem = %e, "health: vod unavailable; reported as null");
                    None
                }
            },
        };
        let (cfg, purge, mut redis) = redis_state(&config, &mut con).await;
        if redis.ok {
            redis.data_lost = generations.read(cfg.generation);
            if redis.data_lost {
                tracing::warn!(generation = ?cfg.generation, "health: the local Redis lost its data (edgeform:meta gone or older)");
            }
        }
        let report = HealthReport {
            node: config.node.clone(),
            ts: crate::unix_now(),
            interval_ms: u64::try_from(config.health.interval.as_millis()).ok(),
            play_sessions,
            out_kbit,
            streams: streams.map(Into::into),
            vod: vod.map(Into::into),
            net_kbit,
            config: cfg,
            purge,
            redis,
            version: VERSION.to_owned(),
            bundle: config.health.bundle_manifest.as_deref().map(bundle_state),
            serving: serving.get(),
        };
        if let Some(q) = report.purge.queue {
            metrics.purge_queue.set(gauge_value(q));
        }
        if let Some(p) = report.play_sessions {
            metrics.play_sessions.set(gauge_value(p));
        }
        if let Some(k) = report.out_kbit {
            metrics.out_kbit.set(gauge_value(k));
        }
        let payload = serde_json::to_vec(&report).unwrap_or_default();
        // Never block on a broker that is away: the next report replaces
        // this one anyway — which is also why it goes at most once (QoS 0,
        // retained): no acknowledgement per report through the broker.
        match client.try_publish(&topic, QoS::AtMostOnce, true, payload) {
            Ok(()) => {
                metrics.health_reports.inc();
            }
            Err(e) => tracing::debug!(cause = %e, "health: report not queued"),
        }
    }
}

/// The installed bundle from its manifest; an unreadable one reports
/// `version: null` (the node has no release yet, or it is being switched).
fn bundle_state(path: &std::path::Path) -> edgestate::mqtt::BundleState {
    let Ok(text) = crate::files::read_regular(path, 16 << 20) else {
        return edgestate::mqtt::BundleState::default();
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    edgestate::mqtt::BundleState {
        version: field("version"),
        commit: field("commit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_older_generation_is_data_lost_until_redis_is_written_again() {
        let mut g = Generations::default();
        assert!(!g.read(None));
        assert!(!g.read(Some(7)));
        assert!(g.read(None), "meta gone");
        assert!(!g.read(Some(1)), "re-pushed after the flush");
        assert!(!g.read(Some(2)));
        assert!(g.read(Some(1)), "older");
        assert!(g.read(Some(1)));
        assert!(!g.read(Some(3)), "written again");
        assert!(!g.read(Some(3)));
    }

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 9999999    1000    0    0    0     0          0         0  9999999    1000    0    0    0     0       0          0
  eth0: 1000     10    0    0    0     0          0         0     5000      20    0    0    0     0       0          0
  eth1:2000     10    0    0    0     0          0         0     7000      20    0    0    0     0       0          0
";

    #[test]
    fn transmit_over_non_loopback() {
        assert_eq!(transmit_bytes(NET_DEV), Some(12_000));
        assert_eq!(transmit_bytes("garbage"), None);
        assert_eq!(transmit_bytes("eth0: 1 2"), None);
        let t = Instant::now();
        assert_eq!(
            kbit_per_sec((0, t), (125_000, t + Duration::from_secs(1))),
            Some(1000)
        );
        assert_eq!(
            kbit_per_sec((10, t), (5, t + Duration::from_secs(1))),
            None,
            "reset"
        );
        assert_eq!(kbit_per_sec((0, t), (5, t)), None);
    }

    #[test]
    fn receive_and_transmit_over_non_loopback() {
        assert_eq!(
            receive_transmit_bytes(NET_DEV),
            Some(1000 + 5000 + 2000 + 7000)
        );
        assert_eq!(receive_transmit_bytes("garbage"), None);
    }

    #[test]
    fn vod_holdings_from_a_source_field() {
        let v = serde_json::json!({"movie": [1, 3], "trailer": 2});
        let got = as_vod(&v).unwrap();
        assert_eq!(got["movie"], [1, 3]);
        assert_eq!(got["trailer"], [2]);
        assert!(as_vod(&serde_json::json!({"movie": ["x"]})).is_none());
        assert!(as_vod(&serde_json::json!([1])).is_none());
    }

    #[test]
    fn fields_and_conversions() {
        let doc: Value = serde_json::json!({"sessions": 12, "server": {"live": {"a": {}, "b": {}}}, "list": ["x", "y", "x"], "neg": -1, "f": 2.6});
        assert_eq!(field(&doc, "sessions").and_then(as_count), Some(12));
        assert_eq!(field(&doc, "f").and_then(as_count), Some(3));
        assert_eq!(field(&doc, "neg").and_then(as_count), None);
        assert_eq!(
            field(&doc, "/server/live").and_then(as_streams),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            field(&doc, "list").and_then(as_streams),
            Some(vec!["x".into(), "y".into()])
        );
        assert_eq!(field(&doc, "sessions").and_then(as_streams), None);
        assert_eq!(field(&doc, "missing"), None);
    }

    #[tokio::test]
    async fn sources_read_once_and_report_problems() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("stats.json");
        std::fs::write(&f, r#"{"sessions": 4, "streams": ["s1"]}"#).unwrap();
        let src = |field: &str| Source {
            from: SourceFrom::File(f.clone()),
            field: field.into(),
        };
        let s = Sources::default();
        let (p, st, problems) = s.read(Some(&src("sessions")), Some(&src("streams"))).await;
        assert_eq!(
            (p, st, problems.len()),
            (Some(4), Some(vec!["s1".into()]), 0)
        );
        let (p, st, problems) = s.read(Some(&src("streams")), Some(&src("nope"))).await;
        assert_eq!((p, st), (None, None));
        assert_eq!(problems.len(), 2, "{problems:?}");
        std::fs::write(&f, "not json").unwrap();
        let (p, _, problems) = s.read(Some(&src("sessions")), None).await;
        assert_eq!(p, None);
        assert!(problems[0].contains("not JSON"), "{problems:?}");
        let (p, st, problems) = s.read(None, None).await;
        assert_eq!((p, st, problems.len()), (None, None, 0));
    }

    #[tokio::test]
    async fn http_source() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            // Two requests: a stats document, then a 500.
            for body in [r#"{"stats": {"sessions": 9, "live": ["b", "a"]}}"#, ""] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let head = if body.is_empty() {
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n".to_owned()
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    )
                };
                s.write_all(head.as_bytes()).await.unwrap();
                s.write_all(body.as_bytes()).await.unwrap();
                s.shutdown().await.unwrap();
            }
        });
        let url = format!("http://127.0.0.1:{port}/stats");
        let src = |field: &str| Source {
            from: SourceFrom::Url(url.clone()),
            field: field.into(),
        };
        let s = Sources::default();
        // One fetch serves both metrics.
        let (p, st, problems) = s
            .read(Some(&src("/stats/sessions")), Some(&src("/stats/live")))
            .await;
        assert_eq!(problems, Vec::<String>::new());
        assert_eq!((p, st), (Some(9), Some(vec!["a".into(), "b".into()])));
        let (p, _, problems) = s.read(Some(&src("/stats/sessions")), None).await;
        assert_eq!(p, None);
        assert!(problems[0].contains("HTTP 500"), "{problems:?}");
    }
}
