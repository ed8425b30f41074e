//! A real Prometheus (Debian's `prometheus`, `/usr/bin/prometheus`) on a
//! free loopback port: a temporary data folder, a configuration scraping
//! the given targets every `scrape_interval`, up when `/-/ready` answers
//! 200, killed by pid on drop. The rollout gate's tests point
//! `apply.prometheus` at it. Never a mock.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::{Process, free_port, spawn, wait_ready};

/// A running Prometheus.
pub struct Prometheus {
    pub process: Process,
}

impl Prometheus {
    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.process.port)
    }

    /// `GET path` on its HTTP API: (status, body).
    ///
    /// # Errors
    /// Connection or I/O failures.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http_get(self.process.port, path)
    }

    /// Wait until every scrape target reports `up` (one successful
    /// scrape each), so a query over the next seconds sees them.
    ///
    /// # Panics
    /// When they are not all up within `timeout` (the targets' state and
    /// the log are shown).
    pub fn wait_targets_up(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok((200, body)) = self.get("/api/v1/targets?state=active")
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&body)
                && let Some(targets) = v["data"]["activeTargets"].as_array()
            {
                if !targets.is_empty() && targets.iter().all(|t| t["health"] == "up") {
                    return;
                }
                last = body;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "prometheus targets not all up:\n{last}\n{}",
            self.process.log()
        );
    }
}

/// Start Prometheus scraping `targets` (`host:port` each, path
/// `/metrics`) every `scrape_interval`, with `--web.enable-lifecycle`.
///
/// # Panics
/// When it does not come up after a few attempts (its log is shown).
#[must_use]
pub fn prometheus(targets: &[String], scrape_interval: Duration) -> Prometheus {
    let interval = format!("{}ms", scrape_interval.as_millis().max(100));
    let list = targets
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let conf = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n\
             scrape_configs:\n  - job_name: edges\n    metrics_path: /metrics\n\
             \x20   static_configs:\n      - targets: [{list}]\n"
        );
        let conf_path = dir.path().join("prometheus.yml");
        std::fs::write(&conf_path, conf).expect("write prometheus.yml");
        let args = vec![
            format!("--config.file={}", conf_path.display()),
            format!("--storage.tsdb.path={}", dir.path().join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--web.enable-lifecycle".to_owned(),
            "--log.level=warn".to_owned(),
        ];
        let child = spawn("prometheus", &args, dir.path(), &log).expect("spawn prometheus");
        let mut p = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "prometheus".into(),
            args,
            addr: std::net::Ipv4Addr::LOCALHOST,
        };
        if wait_ready_long(&mut p) {
            return Prometheus { process: p };
        }
        last = p.log();
        p.kill();
    }
    panic!("prometheus did not start:\n{last}");
}

/// Prometheus opens its storage before it is ready: up to 30 s.
fn wait_ready_long(p: &mut Process) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if wait_ready(p, |port| {
            http_get(port, "/-/ready").is_ok_and(|(s, _)| s == 200)
        }) {
            return true;
        }
        if p.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
        {
            return false;
        }
    }
    false
}

/// One HTTP/1.0 GET on 127.0.0.1:`port` (the body read to the end).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// It scrapes a real nginx serving a metrics text file, and the
    /// series is queryable.
    #[test]
    fn scrapes_a_target_and_answers_a_query() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("metrics"),
            "# TYPE harness_probe_total counter\nharness_probe_total 7\n",
        )
        .unwrap();
        let target = crate::nginx::static_origin(root.path());
        let prom = prometheus(
            &[format!("127.0.0.1:{}", target.process.port)],
            Duration::from_millis(500),
        );
        prom.wait_targets_up(Duration::from_secs(20));
        let (status, body) = prom.get("/api/v1/query?query=harness_probe_total").unwrap();
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"]["result"][0]["value"][1], "7", "{body}");
    }
}
