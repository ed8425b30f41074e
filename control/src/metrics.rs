//! Control-side metrics: what the reconciler did to each
//! target, for Prometheus.
//!
//! One [`Metrics`] per process, made by the command line and handed down
//! (an `Arc` in the push settings), bumped where the work happens
//! (the sync and heal loops in `push::many`, the apply lock wait in
//! `push::lock`), exported two ways:
//!
//! - `reconcile --metrics-listen ADDR`: `GET /metrics` over HTTP
//!   ([`serve`]): OpenMetrics, or the 0.0.4 text format when `Accept` does
//!   not ask for it (`edgestate::exposition::negotiate`);
//! - `reconcile --metrics-textfile FILE`: after every run, the same values
//!   in the Prometheus text format node_exporter's textfile collector reads
//!   ([`edgestate::exposition::to_text`]), written atomically (a temporary file in the same
//!   directory, then `rename`) so the collector never reads half a file.
//!
//! Metric names (all `edgeform_reconcile_…`): `last_success_timestamp_seconds
//! {target,job}`, `applied_commit_info{target,commit}` (1), `drift_repaired_total
//! {target,kind}`, `refusals_total{target,job,reason}`, `failures_total{target,job}`,
//! `runs_total{job,result}`, `apply_duration_seconds`, `heal_duration_seconds`
//! (histograms), `lock_waits_total`, `lock_wait_seconds_total`, `lease_held` (1 while
//! this daemon holds the reconcile lease), `build_info{version}`;
//! and the ACME certificates' `edgeform_certificate_expiry_timestamp_seconds{host}`
//! and `edgeform_certificate_renewal_failures_total{host}`; the rollouts'
//! `edgeform_rollout_halted{commit}` (1 while the gate holds a commit's
//! rollout halted, and after the gate's automatic rollback until the next
//! rollout starts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::plan::Refusal;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetJob {
    pub target: String,
    pub job: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetCommit {
    pub target: String,
    pub commit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetKind {
    pub target: String,
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetReason {
    pub target: String,
    pub job: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobResult {
    pub job: String,
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabel {
    pub host: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommitLabel {
    pub commit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Version {
    pub version: String,
}

/// Every control-side metric.
pub struct Metrics {
    registry: Registry,
    /// `edgeform_certificate_…`, encoded after `registry`.
    certificates: Registry,
    /// `edgeform_rollout_…`, encoded last.
    rollouts: Registry,
    pub last_success: Family<TargetJob, Gauge<f64, AtomicU64>>,
    pub applied_commit: Family<TargetCommit, Gauge>,
    pub drift_repaired: Family<TargetKind, Counter>,
    pub refusals: Family<TargetReason, Counter>,
    pub failures: Family<TargetJob, Counter>,
    pub runs: Family<JobResult, Counter>,
    pub apply_seconds: Histogram,
    pub heal_seconds: Histogram,
    pub lock_waits: Counter,
    pub lock_wait_seconds: Counter<f64, AtomicU64>,
    /// 1 while this daemon holds the reconcile lease (runs the jobs), 0
    /// while it stands by.
    pub lease_held: Gauge,
    /// Purge jobs kept in this host's outbox, per node.
    pub outbox_jobs: Family<NodeLabel, Gauge>,
    /// Unix time the oldest kept purge job of a node was kept.
    pub outbox_oldest: Family<NodeLabel, Gauge>,
    /// `edgeform_certificate_expiry_timestamp_seconds{host}`: the not-after
    /// of the certificate each ACME site's host is served (no prefix).
    pub cert_expiry: Family<HostLabel, Gauge>,
    /// `edgeform_certificate_renewal_failures_total{host}`.
    pub renewal_failures: Family<HostLabel, Counter>,
    /// `edgeform_rollout_halted{commit}`: 1 while the commit's rollout is
    /// halted by the gate, or rolled back by it (`auto_rollback`) until the
    /// next rollout starts.
    pub rollout_halted: Family<CommitLabel, Gauge>,
    /// The commit each target's info metric names (to drop the old one).
    commits: Mutex<BTreeMap<String, String>>,
    /// Where `--metrics-textfile` writes after each run.
    textfile: Mutex<Option<PathBuf>>,
}

/// 10 ms … ~80 s: a small target's apply to a 100k-site heal.
fn duration_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.01, 2.0, 14)
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(env!("CARGO_PKG_VERSION"))
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Every metric at zero; `build_info` names `version`.
    #[must_use]
    pub fn new(version: &str) -> Metrics {
        let mut registry = Registry::with_prefix("edgeform_reconcile");
        let m = Metrics {
            registry: Registry::default(),
            certificates: Registry::default(),
            rollouts: Registry::default(),
            last_success: Family::default(),
            applied_commit: Family::default(),
            drift_repaired: Family::default(),
            refusals: Family::default(),
            failures: Family::default(),
            runs: Family::default(),
            apply_seconds: Histogram::new(duration_buckets()),
            heal_seconds: Histogram::new(duration_buckets()),
            lock_waits: Counter::default(),
            lock_wait_seconds: Counter::default(),
            lease_held: Gauge::default(),
            outbox_jobs: Family::default(),
            outbox_oldest: Family::default(),
            cert_expiry: Family::default(),
            renewal_failures: Family::default(),
            rollout_halted: Family::default(),
            commits: Mutex::new(BTreeMap::new()),
            textfile: Mutex::new(None),
        };
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last successful sync or heal of a target",
            m.last_success.clone(),
        );
        registry.register(
            "applied_commit_info",
            "The commit a target was last synced or healed to (value 1)",
            m.applied_commit.clone(),
        );
        registry.register(
            "drift_repaired",
            "Keys repaired by heal or pushed by sync because they had drifted, by kind",
            m.drift_repaired.clone(),
        );
        registry.register(
            "refusals",
            "Pushes refused by the safety checks, by reason (rollback, unknown_live, empty, deletes, changes)",
            m.refusals.clone(),
        );
        registry.register(
            "failures",
            "Sync or heal runs that failed on a target (refusals included)",
            m.failures.clone(),
        );
        registry.register(
            "runs",
            "Reconcile runs, by job and result (ok, failed)",
            m.runs.clone(),
        );
        registry.register(
            "apply_duration_seconds",
            "Time to sync (apply) one target",
            m.apply_seconds.clone(),
        );
        registry.register(
            "heal_duration_seconds",
            "Time to heal one target",
            m.heal_seconds.clone(),
        );
        registry.register(
            "lock_waits",
            "Applies that found a target's lock held by another apply and waited",
            m.lock_waits.clone(),
        );
        registry.register(
            "lock_wait_seconds",
            "Time spent waiting for targets' apply locks",
            m.lock_wait_seconds.clone(),
        );
        registry.register(
            "lease_held",
            "1 while this daemon holds the reconcile lease of the state store and runs the jobs; 0 while it stands by",
            m.lease_held.clone(),
        );
        registry.register(
            "purge_outbox_jobs",
            "Purge jobs kept in this host's outbox for a node (not yet recorded done there)",
            m.outbox_jobs.clone(),
        );
        registry.register(
            "purge_outbox_oldest_timestamp_seconds",
            "Unix time the oldest purge job kept for a node was kept",
            m.outbox_oldest.clone(),
        );
        let build: Family<Version, Gauge> = Family::default();
        build
            .get_or_create(&Version {
                version: version.to_owned(),
            })
            .set(1);
        registry.register("build_info", "The edgeform version (value 1)", build);
        let mut certificates = Registry::with_prefix("edgeform_certificate");
        certificates.register(
            "expiry_timestamp_seconds",
            "Unix time the certificate served for an ACME site's host expires (not after)",
            m.cert_expiry.clone(),
        );
        certificates.register(
            "renewal_failures",
            "Failed renewals of the certificate of an ACME site's host",
            m.renewal_failures.clone(),
        );
        let mut rollouts = Registry::with_prefix("edgeform_rollout");
        rollouts.register(
            "halted",
            "1 while the gate holds the rollout of a commit halted (a changed site regressed on the applied wave)",
            m.rollout_halted.clone(),
        );
        Metrics {
            registry,
            certificates,
            rollouts,
            ..m
        }
    }
}

/// The metrics label of a safety refusal.
#[must_use]
pub fn refusal_reason(r: &Refusal) -> &'static str {
    r.kind().as_str()
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Metrics {
    /// A target synced or healed to `commit` (`job`: sync, heal).
    pub fn succeeded(&self, target: &str, job: &str, commit: &str) {
        self.last_success
            .get_or_create(&TargetJob {
                target: target.to_owned(),
                job: job.to_owned(),
            })
            .set(now_secs());
        let mut commits = self
            .commits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(old) = commits.insert(target.to_owned(), commit.to_owned())
            && old != commit
        {
            self.applied_commit.remove(&TargetCommit {
                target: target.to_owned(),
                commit: old,
            });
        }
        self.applied_commit
            .get_or_create(&TargetCommit {
                target: target.to_owned(),
                commit: commit.to_owned(),
            })
            .set(1);
    }

    /// A target's run failed; a safety refusal is counted by its reason.
    pub fn failed(&self, target: &str, job: &str, error: &anyhow::Error) {
        self.failures
            .get_or_create(&TargetJob {
                target: target.to_owned(),
                job: job.to_owned(),
            })
            .inc();
        if let Some(r) = error.downcast_ref::<Refusal>() {
            self.refusals
                .get_or_create(&TargetReason {
                    target: target.to_owned(),
                    job: job.to_owned(),
                    reason: refusal_reason(r).to_owned(),
                })
                .inc();
        }
    }

    /// `n` keys of `kind` drifted on a target and were repaired.
    pub fn drift(&self, target: &str, kind: &str, n: usize) {
        if n > 0 {
            self.drift_repaired
                .get_or_create(&TargetKind {
                    target: target.to_owned(),
                    kind: kind.to_owned(),
                })
                .inc_by(n as u64);
        }
    }

    /// An apply waited `waited` for a lock another apply held.
    pub fn lease_held(&self, held: bool) {
        self.lease_held.set(i64::from(held));
    }

    pub fn lock_waited(&self, waited: Duration) {
        self.lock_waits.inc();
        self.lock_wait_seconds.inc_by(waited.as_secs_f64());
    }

    /// One reconcile run ended (`failed`: a target failed or was refused); writes the textfile
    /// when one is configured.
    pub fn run_done(&self, job: &str, failed: bool) {
        self.runs
            .get_or_create(&JobResult {
                job: job.to_owned(),
                result: if failed { "failed" } else { "ok" }.to_owned(),
            })
            .inc();
        let path = self
            .textfile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(path) = path
            && let Err(e) = write_atomically(&path, &edgestate::exposition::to_text(&self.encode()))
        {
            tracing::error!(file = %path.display(), cause = %e, "metrics: cannot write the textfile");
        }
    }

    /// The purge outbox as it is now (nodes no longer in it are dropped).
    pub fn outbox(&self, depths: &BTreeMap<String, crate::outbox::Depth>) {
        self.outbox_jobs.clear();
        self.outbox_oldest.clear();
        for (node, d) in depths {
            let label = NodeLabel { node: node.clone() };
            self.outbox_jobs
                .get_or_create(&label)
                .set(i64::try_from(d.waiting + d.delivered).unwrap_or(i64::MAX));
            if let Some(t) = d.oldest {
                self.outbox_oldest
                    .get_or_create(&label)
                    .set(i64::try_from(t).unwrap_or(i64::MAX));
            }
        }
    }

    /// The certificates served for the ACME sites' hosts and aliases, as
    /// they are now: each host's not-after (Unix seconds). A host not in
    /// `expiries` (its site removed, or no longer ACME) is dropped, so no
    /// alert keeps firing for it.
    pub fn certificate_expiries(&self, expiries: &[(String, i64)]) {
        self.cert_expiry.clear();
        for (host, not_after) in expiries {
            self.cert_expiry
                .get_or_create(&HostLabel { host: host.clone() })
                .set(*not_after);
        }
    }

    /// A renewal of `host`'s certificate failed.
    pub fn renewal_failed(&self, host: &str) {
        self.renewal_failures
            .get_or_create(&HostLabel {
                host: host.to_owned(),
            })
            .inc();
    }

    /// The rollout of `commit` is halted (`true`) or not any more: only
    /// a halted commit has the series, so the alert clears.
    pub fn rollout_halted(&self, commit: &str, halted: bool) {
        let label = CommitLabel {
            commit: commit.to_owned(),
        };
        if halted {
            self.rollout_halted.get_or_create(&label).set(1);
        } else {
            self.rollout_halted.remove(&label);
        }
    }

    /// A new rollout starts: no commit is halted any more (an automatic
    /// rollback's alert clears here).
    pub fn rollouts_halted_clear(&self) {
        self.rollout_halted.clear();
    }

    /// Write the textfile to `path` after every run from now on.
    pub fn set_textfile(&self, path: Option<PathBuf>) {
        *self
            .textfile
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = path;
    }

    /// OpenMetrics text (what `/metrics` serves).
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &self.certificates);
        let _ = encode_registry(&mut out, &self.rollouts);
        let _ = encode_eof(&mut out);
        out
    }
}

/// Write `text` to `path` atomically: a temporary file next to it, then
/// `rename` over it.
///
/// # Errors
/// The directory is not writable.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "metrics".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `--metrics-listen`: bind `addr` now (an error if taken) and serve
/// `GET /metrics` in the background until the process ends.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(
    addr: std::net::SocketAddr,
    metrics: std::sync::Arc<Metrics>,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-listen {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| async move {
            let accept = headers
                .get(axum::http::header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (content_type, body) = edgestate::exposition::negotiate(accept, metrics.encode());
            ([(axum::http::header::CONTENT_TYPE, content_type)], body)
        }),
    );
    tracing::info!(addr = %local, "metrics listening");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(cause = %e, "metrics listener stopped");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_expiries_replace_the_hosts_exported_and_failures_count() {
        let m = Metrics::default();
        m.certificate_expiries(&[("a.test".into(), 100), ("b.test".into(), 200)]);
        m.renewal_failed("b.test");
        m.certificate_expiries(&[("b.test".into(), 300)]);
        let text = m.encode();
        assert!(!text.contains("host=\"a.test\""), "{text}");
        assert!(
            text.contains("edgeform_certificate_expiry_timestamp_seconds{host=\"b.test\"} 300"),
            "{text}"
        );
        assert!(
            text.contains("edgeform_certificate_renewal_failures_total{host=\"b.test\"} 1"),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }

    #[test]
    fn textfile_names_counters_by_their_samples() {
        let m = Metrics::default();
        m.drift("edge-1", "missing", 3);
        m.succeeded("edge-1", "heal", "abc");
        m.succeeded("edge-1", "sync", "def");
        m.lock_waited(Duration::from_millis(250));
        m.apply_seconds.observe(0.5);
        let text = edgestate::exposition::to_text(&m.encode());
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE edgeform_reconcile_drift_repaired_total counter\n"),
            "{text}"
        );
        assert!(text.contains(
            "edgeform_reconcile_drift_repaired_total{target=\"edge-1\",kind=\"missing\"} 3"
        ));
        // One info series per target: the old commit is gone.
        assert!(text.contains("commit=\"def\"} 1") && !text.contains("commit=\"abc\""));
        assert!(text.contains("edgeform_reconcile_lock_waits_total 1"));
        assert!(text.contains("# TYPE edgeform_reconcile_apply_duration_seconds histogram"));
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let m = Metrics::default();
        m.failed("e", "sync", &anyhow::Error::new(Refusal::Empty));
        m.failed("e", "sync", &anyhow::anyhow!("connection refused"));
        let text = m.encode();
        assert!(text.contains(
            "edgeform_reconcile_refusals_total{target=\"e\",job=\"sync\",reason=\"empty\"} 1"
        ));
        assert!(text.contains("edgeform_reconcile_failures_total{target=\"e\",job=\"sync\"} 2"));
    }

    #[test]
    fn textfile_is_replaced_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("edgeform.prom");
        write_atomically(&p, "a 1\n").unwrap();
        write_atomically(&p, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a 2\n");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp left"
        );
    }
}
