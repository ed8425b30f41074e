//! Prometheus metrics, served as text on the HTTP listener's `/metrics`.
//!
//! Counters are bumped where the work happens (purge worker, `/route`,
//! commands, reporter); gauges are set from the last health report, so
//! `/metrics` and `<prefix>/health/<node>` tell the same story.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
    pub node: String,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    pub purge_jobs: Family<StatusLabel, Counter>,
    pub purge_files_removed: Counter,
    pub purge_queue: Gauge,
    pub route_requests: Family<StatusLabel, Counter>,
    /// `route_requests`' series for 302, 403, 404 and 503, once resolved.
    route_counters: [std::sync::OnceLock<Counter>; 4],
    pub commands: Family<StatusLabel, Counter>,
    pub health_reports: Counter,
    pub mqtt_connected: Gauge,
    pub cluster_nodes_reporting: Gauge,
    pub health_messages: Counter,
    pub health_ignored: Counter,
    pub http_connections: Gauge,
    pub http_evicted: Counter,
    pub routing_generation: Gauge,
    pub play_sessions: Gauge,
    pub out_kbit: Gauge,
    /// `build_info{version,node}` 1.
    pub build_info: Family<BuildLabels, Gauge>,
    /// Seconds to run one purge job.
    pub purge_duration: Histogram,
    /// 1 while the purge worker holds a connection to the node's Redis.
    pub redis_up: Gauge,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("edgeform_agent");
        let m = Metrics {
            registry: Registry::default(),
            purge_jobs: Family::default(),
            purge_files_removed: Counter::default(),
            purge_queue: Gauge::default(),
            route_requests: Family::default(),
            route_counters: Default::default(),
            commands: Family::default(),
            health_reports: Counter::default(),
            mqtt_connected: Gauge::default(),
            cluster_nodes_reporting: Gauge::default(),
            health_messages: Counter::default(),
            health_ignored: Counter::default(),
            http_connections: Gauge::default(),
            http_evicted: Counter::default(),
            routing_generation: Gauge::default(),
            play_sessions: Gauge::default(),
            out_kbit: Gauge::default(),
            build_info: Family::default(),
            // 1 ms … ~16 s.
            purge_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            redis_up: Gauge::default(),
        };
        registry.register(
            "purge_jobs",
            "Purge jobs finished, by status (done, failed)",
            m.purge_jobs.clone(),
        );
        registry.register(
            "purge_files_removed",
            "Cache files removed by purges",
            m.purge_files_removed.clone(),
        );
        registry.register(
            "purge_queue_depth",
            "Jobs waiting in this node's purge queue (at the last report)",
            m.purge_queue.clone(),
        );
        registry.register(
            "route_requests",
            "GET /route answers, by HTTP status",
            m.route_requests.clone(),
        );
        registry.register(
            "commands",
            "MQTT commands handled, by result status",
            m.commands.clone(),
        );
        registry.register(
            "health_reports",
            "Health reports published",
            m.health_reports.clone(),
        );
        registry.register(
            "mqtt_connected",
            "1 while connected to the broker",
            m.mqtt_connected.clone(),
        );
        registry.register(
            "cluster_nodes_reporting",
            "Nodes whose health this agent knows (routing input)",
            m.cluster_nodes_reporting.clone(),
        );
        registry.register(
            "health_messages",
            "Health and status messages received from the broker",
            m.health_messages.clone(),
        );
        registry.register(
            "health_ignored",
            "Health and status messages ignored: for a node not in the routing table, or unreadable",
            m.health_ignored.clone(),
        );
        registry.register(
            "http_connections",
            "Open HTTP connections",
            m.http_connections.clone(),
        );
        registry.register(
            "http_evicted",
            "HTTP connections closed because the connection cap was reached (the oldest goes)",
            m.http_evicted.clone(),
        );
        registry.register(
            "routing_generation",
            "edgeform:meta generation of the routing table in use",
            m.routing_generation.clone(),
        );
        registry.register(
            "play_sessions",
            "Play sessions at the last report (absent metric: not set)",
            m.play_sessions.clone(),
        );
        registry.register(
            "out_kbit",
            "Outgoing kbit/s of the host at the last report",
            m.out_kbit.clone(),
        );
        registry.register(
            "build_info",
            "The agent's version and node (value 1)",
            m.build_info.clone(),
        );
        registry.register(
            "purge_duration_seconds",
            "Time to run one purge job",
            m.purge_duration.clone(),
        );
        registry.register(
            "redis_up",
            "1 while the purge worker is connected to the node's Redis, 0 while it cannot reach it",
            m.redis_up.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Set `build_info` for this agent's node.
    pub fn set_build(&self, node: &str) {
        self.build_info
            .get_or_create(&BuildLabels {
                version: crate::health::VERSION.to_owned(),
                node: node.to_owned(),
            })
            .set(1);
    }

    /// The text exposition format.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Count one `/route` answer. The statuses `/route` gives (302, 403,
    /// 404, 503) resolve their series once, at first use; the redirect
    /// path then counts without building a label.
    pub fn count_route(&self, status: u16) {
        let slot = match status {
            302 => &self.route_counters[0],
            403 => &self.route_counters[1],
            404 => &self.route_counters[2],
            503 => &self.route_counters[3],
            _ => return Self::count(&self.route_requests, &status.to_string()),
        };
        slot.get_or_init(|| {
            self.route_requests
                .get_or_create(&StatusLabel {
                    status: status.to_string(),
                })
                .clone()
        })
        .inc();
    }

    /// Count one event with a status label.
    pub fn count(family: &Family<StatusLabel, Counter>, status: &str) {
        family
            .get_or_create(&StatusLabel {
                status: status.to_owned(),
            })
            .inc();
    }
}

/// Clamp a u64 into a gauge's i64.
#[must_use]
pub fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_text() {
        let m = Metrics::default();
        Metrics::count(&m.purge_jobs, "done");
        m.purge_files_removed.inc_by(3);
        let text = m.encode();
        assert!(
            text.contains("edgeform_agent_purge_jobs_total{status=\"done\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("edgeform_agent_purge_files_removed_total 3"),
            "{text}"
        );
        assert!(text.contains("# EOF"));
    }
}
