//! The gate's source: a Prometheus server scraping the edges
//! (`cluster.yaml` `apply.prometheus`), asked over its HTTP API
//! (`POST /api/v1/query` with `time=`, instant queries evaluated at a
//! window's end) for each changed site's counts per window — the
//! edge's counters (docs/edge.md, "Metrics"):
//!
//! ```text
//! sum by (host, class)  (increase(edgeform_site_requests_total{node=~"…",host=~"…"}[<window>]))
//! sum by (host, reason) (increase(edgeform_site_refusals_total{…}[<window>]))
//! sum by (host, cache)  (increase(edgeform_site_cache_total{…}[<window>]))
//! ```
//!
//! Node and host names are regex-escaped (a host is matched literally,
//! `*.example.com` included). Errors are typed: [`PromErrorKind`]
//! `Unreachable` (no answer, a timeout, a 5xx) or `BadAnswer` (anything
//! that is not a query result). The gate halts on either: an unjudged
//! wave never passes.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::figures::{Counts, Windows};

/// The metrics the gate reads (the edge's names, kept exactly).
pub const REQUESTS: &str = "edgeform_site_requests_total";
/// Refusals by `reason`.
pub const REFUSALS: &str = "edgeform_site_refusals_total";
/// Cache statuses by `cache`.
pub const CACHE: &str = "edgeform_site_cache_total";

/// How long one query may take.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most hosts one query names (longer lists are split).
pub const HOSTS_PER_QUERY: usize = 200;
/// The largest answer read (a query result for 200 hosts is far smaller).
pub const MAX_ANSWER: usize = 16 << 20;

/// Why a query gave no figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromError {
    pub kind: PromErrorKind,
    /// For the operator (never decided on).
    pub detail: String,
}

/// The kinds of [`PromError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromErrorKind {
    /// No answer: refused, timed out, or a 5xx from Prometheus.
    Unreachable,
    /// An answer that is not a query result (a refused query, bad JSON,
    /// a value that is not a finite number, too large).
    BadAnswer,
}

impl fmt::Display for PromError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            PromErrorKind::Unreachable => "unreachable",
            PromErrorKind::BadAnswer => "bad answer",
        };
        write!(f, "prometheus {kind}: {}", self.detail)
    }
}

impl std::error::Error for PromError {}

fn bad(detail: impl Into<String>) -> PromError {
    PromError {
        kind: PromErrorKind::BadAnswer,
        detail: detail.into(),
    }
}

/// One series of an instant vector: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

type Https = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

/// A Prometheus server's query API, over `http://` or `https://`
/// (verified against the system's trust store), each query bounded by
/// [`QUERY_TIMEOUT`].
#[derive(Clone)]
pub struct Prometheus {
    http: Https,
    query_url: url::Url,
}

impl fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prometheus")
            .field("query_url", &self.query_url.as_str())
            .finish_non_exhaustive()
    }
}

impl Prometheus {
    /// For the server at `base` (`http(s)://host:port`, a path prefix
    /// kept).
    ///
    /// # Errors
    /// `base` is not an `http(s)://` URL, or the system's trust store
    /// cannot be read (kind `Unreachable`: no server can be asked).
    pub fn new(base: &str) -> Result<Prometheus, PromError> {
        let unusable = |detail: String| PromError {
            kind: PromErrorKind::Unreachable,
            detail,
        };
        let mut url = url::Url::parse(base).map_err(|e| unusable(format!("{base}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(unusable(format!("{base}: not an http(s):// URL")));
        }
        let path = format!("{}/api/v1/query", url.path().trim_end_matches('/'));
        url.set_path(&path);
        url.set_query(None);
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_platform_verifier(provider)
            .map_err(|e| unusable(format!("the system's roots: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        Ok(Prometheus {
            http,
            query_url: url,
        })
    }

    /// An instant query evaluated at `at`.
    ///
    /// # Errors
    /// See [`PromError`].
    pub async fn query(&self, promql: &str, at: SystemTime) -> Result<Vec<Sample>, PromError> {
        use http_body_util::BodyExt as _;
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("query", promql)
            .append_pair("time", &unix(at))
            .finish();
        let unreachable = |detail: String| PromError {
            kind: PromErrorKind::Unreachable,
            detail: format!("{}: {detail}", self.query_url),
        };
        let req = http::Request::post(self.query_url.as_str())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(|e| unreachable(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + QUERY_TIMEOUT;
        let timed_out = || unreachable(format!("no answer within {}s", QUERY_TIMEOUT.as_secs()));
        let res = tokio::time::timeout_at(deadline, self.http.request(req))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| unreachable(e.to_string()))?;
        let status = res.status();
        let text = tokio::time::timeout_at(
            deadline,
            http_body_util::Limited::new(res.into_body(), MAX_ANSWER).collect(),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| {
            bad(format!(
                "the answer could not be read (at most {MAX_ANSWER} bytes): {e}"
            ))
        })?
        .to_bytes();
        if status.is_server_error() {
            return Err(unreachable(format!(
                "HTTP {status}: {}",
                edgestate::untrusted::preview(&text, 300)
            )));
        }
        parse_answer(&text)
    }

    /// Every window's counts for `hosts`: `before` and `bake` on
    /// `applied`, `bake` on `pending` (no query for an empty group).
    ///
    /// # Errors
    /// The first query that failed.
    pub async fn windows(
        &self,
        hosts: &[String],
        applied: &[String],
        pending: &[String],
        before: (SystemTime, SystemTime),
        bake: (SystemTime, SystemTime),
    ) -> Result<Windows, PromError> {
        Ok(Windows {
            before: self.counts(hosts, applied, before).await?,
            applied: self.counts(hosts, applied, bake).await?,
            pending: self.counts(hosts, pending, bake).await?,
        })
    }

    /// Counts per host on `nodes` over `window`.
    ///
    /// # Errors
    /// The first query that failed.
    pub async fn counts(
        &self,
        hosts: &[String],
        nodes: &[String],
        window: (SystemTime, SystemTime),
    ) -> Result<BTreeMap<String, Counts>, PromError> {
        let mut out: BTreeMap<String, Counts> = BTreeMap::new();
        if nodes.is_empty() || hosts.is_empty() {
            return Ok(out);
        }
        let range = range(window);
        for chunk in hosts.chunks(HOSTS_PER_QUERY) {
            let sel = selector(nodes, chunk);
            for (metric, by) in [(REQUESTS, "class"), (REFUSALS, "reason"), (CACHE, "cache")] {
                let q = format!("sum by (host, {by}) (increase({metric}{sel}[{range}]))");
                for s in self.query(&q, window.1).await? {
                    let (Some(host), Some(label)) = (s.labels.get("host"), s.labels.get(by)) else {
                        continue;
                    };
                    let c = out.entry(host.clone()).or_default();
                    match by {
                        "class" => {
                            c.requests += s.value;
                            if label == "5xx" {
                                c.errors_5xx += s.value;
                            }
                        }
                        "reason" => *c.refusals.entry(label.clone()).or_default() += s.value,
                        _ => *c.cache.entry(label.clone()).or_default() += s.value,
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Seconds since the epoch with milliseconds, as Prometheus's `time=`.
fn unix(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// The window's length as a PromQL range, in milliseconds, at least 1 s.
#[must_use]
pub fn range(window: (SystemTime, SystemTime)) -> String {
    let ms = window
        .1
        .duration_since(window.0)
        .unwrap_or_default()
        .as_millis()
        .max(1000);
    format!("{ms}ms")
}

/// `{node=~"a|b",host=~"x\\.example\\.com|…"}`: names matched literally.
#[must_use]
pub fn selector(nodes: &[String], hosts: &[String]) -> String {
    let alt = |names: &[String]| {
        names
            .iter()
            .map(|n| regex_escape(n))
            .collect::<Vec<_>>()
            .join("|")
    };
    format!(
        "{{node=~{},host=~{}}}",
        promql_string(&alt(nodes)),
        promql_string(&alt(hosts))
    )
}

/// `name` as an RE2 regex matching exactly it.
#[must_use]
pub fn regex_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `text` as a double-quoted PromQL string.
#[must_use]
pub fn promql_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Read an instant query's answer (`{"status":"success","data":
/// {"resultType":"vector","result":[{"metric":{…},"value":[t,"v"]}]}}`).
///
/// # Errors
/// Anything else: `BadAnswer`, with Prometheus's own error when it gave
/// one.
pub fn parse_answer(body: &[u8]) -> Result<Vec<Sample>, PromError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        status: String,
        #[serde(default)]
        data: Option<Data>,
        #[serde(default, rename = "errorType")]
        error_type: Option<String>,
        #[serde(default)]
        error: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        #[serde(rename = "resultType")]
        result_type: String,
        result: Vec<Series>,
    }
    #[derive(serde::Deserialize)]
    struct Series {
        metric: BTreeMap<String, String>,
        value: (f64, String),
    }
    let a: Answer = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "not a query result ({e}): {}",
            edgestate::untrusted::preview(body, 300)
        ))
    })?;
    if a.status != "success" {
        return Err(bad(format!(
            "query refused: {}: {}",
            edgestate::untrusted::escape(&a.error_type.unwrap_or_default()),
            edgestate::untrusted::escape(&a.error.unwrap_or_default())
        )));
    }
    let data = a
        .data
        .ok_or_else(|| bad("no data in a successful answer"))?;
    if data.result_type != "vector" {
        return Err(bad(format!(
            "a {} where an instant vector was expected",
            edgestate::untrusted::escape(&data.result_type)
        )));
    }
    data.result
        .into_iter()
        .map(|s| {
            let value: f64 = s.value.1.parse().map_err(|_| {
                bad(format!(
                    "value {} is not a number",
                    edgestate::untrusted::escape(&s.value.1)
                ))
            })?;
            if !value.is_finite() || value < 0.0 {
                return Err(bad(format!("value {value} is not a count")));
            }
            Ok(Sample {
                labels: s.metric,
                value,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_matched_literally() {
        assert_eq!(regex_escape("*.example.com"), r"\*\.example\.com");
        assert_eq!(
            selector(&["edge-1".into()], &["a.b".into(), "c".into()]),
            r#"{node=~"edge-1",host=~"a\\.b|c"}"#
        );
        assert_eq!(promql_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn a_window_is_a_range_in_milliseconds_of_at_least_a_second() {
        let t = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(range((t(1_000), t(6_500))), "5500ms");
        assert_eq!(range((t(1_000), t(1_000))), "1000ms");
        assert_eq!(range((t(9_000), t(1_000))), "1000ms");
    }

    #[test]
    fn an_instant_vector_is_read() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"host":"a.example.com","class":"5xx"},"value":[1700000000.5,"12.5"]}]}}"#;
        let s = parse_answer(body).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].labels["class"], "5xx");
        assert!((s[0].value - 12.5).abs() < 1e-9);
    }

    #[test]
    fn anything_else_is_a_bad_answer_of_its_own_kind() {
        for body in [
            &b"<html>proxy error</html>"[..],
            br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
            br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"-3"]}]}}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#,
            br#"{"status":"success"}"#,
        ] {
            let e = parse_answer(body).unwrap_err();
            assert_eq!(e.kind, PromErrorKind::BadAnswer, "{e}");
        }
    }

    #[test]
    fn only_http_urls_are_taken() {
        assert!(Prometheus::new("http://127.0.0.1:9090").is_ok());
        assert!(Prometheus::new("https://prom.example/prom/").is_ok());
        for bad in ["not a url", "ftp://x", "unix:/run/p.sock"] {
            let e = Prometheus::new(bad).unwrap_err();
            assert_eq!(e.kind, PromErrorKind::Unreachable, "{bad}");
        }
    }
}
