//! The gate between two waves: whether the wave just applied may be
//! followed by the next one.
//!
//! [`judge`] is the one entry point (the reconcile daemon's sync job and
//! `rollout status` call it). Without a gate source (`apply.prometheus`
//! absent) a wave passes on its bake time alone, and says so in a note;
//! with one, the changed sites' live figures on the applied wave during
//! the bake window are compared with the same sites before the change
//! and with the pending waves ([`super::figures`], the rules), the
//! figures read from that Prometheus ([`super::prom`]); an unreachable
//! Prometheus or a nonsense answer is a [`GateError`], on which the
//! caller halts (docs/operations.md, "Rollouts in waves").

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

pub use compiler::model::resolved::{GateConfig, SiteGate};

use super::figures::{self, Outcome, Thresholds};
use super::prom::{PromError, PromErrorKind, Prometheus};

/// The note of a wave passed without a gate source.
pub const NO_SOURCE_NOTE: &str = "no gate source: passed on bake time alone";

/// What the gate is asked about one wave.
#[derive(Debug, Clone, PartialEq)]
pub struct GateRequest {
    /// The commit rolling out.
    pub commit: String,
    /// The commit the applied wave held before (the rollout's previous
    /// commit).
    pub previous: String,
    /// The hosts of the sites whose compiled document differs between
    /// `previous` and `commit` (empty: a routing-only change, which
    /// passes on bake time alone).
    pub changed_hosts: Vec<String>,
    /// The targets already at `commit` (every applied wave).
    pub applied_nodes: Vec<String>,
    /// The targets not yet at `commit` (the control group).
    pub pending_nodes: Vec<String>,
    /// The window before the first wave: the "before" figures.
    pub before: (SystemTime, SystemTime),
    /// The applied wave's bake window: the "after" figures.
    pub bake: (SystemTime, SystemTime),
    /// The changed sites' own thresholds (`rollout:` in a site's file),
    /// by host and alias ([`site_gates`]); a host not here takes `cfg`'s.
    pub site_gates: BTreeMap<String, SiteGate>,
}

/// Every host and alias of the sites with their own thresholds
/// (`rollout:`), for [`GateRequest::site_gates`].
#[must_use]
pub fn site_gates(config: &compiler::Config) -> BTreeMap<String, SiteGate> {
    config
        .sites
        .iter()
        .filter_map(|s| Some((s, s.rollout.as_deref()?)))
        .flat_map(|(s, g)| s.hosts().map(move |h| (h.to_owned(), g.clone())))
        .collect()
}

/// The gate's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The next wave may go; `notes` say why (e.g. [`NO_SOURCE_NOTE`], a
    /// site under `min_requests`).
    Pass { notes: Vec<String> },
    /// A changed site regressed: `figure` (e.g. `5xx_ratio`) went from
    /// `before` to `after`, past `threshold`.
    Halt {
        host: String,
        figure: String,
        before: f64,
        after: f64,
        threshold: f64,
    },
}

/// Why the gate could not judge (the caller halts the rollout with it:
/// an unjudged wave never passes silently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateError {
    pub kind: GateErrorKind,
    /// What went wrong, for the operator (never decided on).
    pub detail: String,
}

/// The kinds of [`GateError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateErrorKind {
    /// The gate source did not answer.
    Unreachable,
    /// It answered something that is not a query result.
    BadAnswer,
    /// This build cannot compare figures from the configured source.
    Unsupported,
}

impl GateErrorKind {
    /// The word logs, the history and metrics use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            GateErrorKind::Unreachable => "gate-unreachable",
            GateErrorKind::BadAnswer => "gate-bad-answer",
            GateErrorKind::Unsupported => "gate-unsupported",
        }
    }
}

impl fmt::Display for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.detail)
    }
}

impl std::error::Error for GateError {}

/// Judge the wave `req` describes.
///
/// # Errors
/// The gate source unreachable or answering nonsense ([`GateError`]).
pub async fn judge(cfg: &GateConfig, req: &GateRequest) -> Result<Verdict, GateError> {
    let Some(source) = cfg.prometheus.as_deref() else {
        return Ok(Verdict::Pass {
            notes: vec![NO_SOURCE_NOTE.to_owned()],
        });
    };
    if req.changed_hosts.is_empty() {
        return Ok(Verdict::Pass {
            notes: vec!["no site's document changed: passed on bake time alone".to_owned()],
        });
    }
    let prom = Prometheus::new(source).map_err(gate_error)?;
    let windows = prom
        .windows(
            &req.changed_hosts,
            &req.applied_nodes,
            &req.pending_nodes,
            req.before,
            req.bake,
        )
        .await
        .map_err(gate_error)?;
    let outcome = figures::compare(&req.changed_hosts, &windows, |host| {
        let t = cfg.for_site(req.site_gates.get(host));
        Thresholds {
            min_requests: t.min_requests,
            max_5xx_ratio_increase: t.max_5xx_ratio_increase,
            max_refusal_ratio_increase: t.max_refusal_ratio_increase,
            max_hit_ratio_drop: t.max_hit_ratio_drop,
        }
    });
    Ok(match outcome {
        Outcome::Pass { notes } => Verdict::Pass { notes },
        Outcome::Halt(r) => Verdict::Halt {
            host: r.host,
            figure: r.figure,
            before: r.before,
            after: r.after,
            threshold: r.threshold,
        },
    })
}

fn gate_error(e: PromError) -> GateError {
    GateError {
        kind: match e.kind {
            PromErrorKind::Unreachable => GateErrorKind::Unreachable,
            PromErrorKind::BadAnswer => GateErrorKind::BadAnswer,
        },
        detail: e.detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn request(changed: &[&str]) -> GateRequest {
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        GateRequest {
            commit: "b".repeat(40),
            previous: "a".repeat(40),
            changed_hosts: changed.iter().map(|h| (*h).to_owned()).collect(),
            applied_nodes: vec!["edge-1".into()],
            pending_nodes: vec!["edge-2".into()],
            before: (t(100), t(200)),
            bake: (t(200), t(300)),
            site_gates: BTreeMap::new(),
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn without_a_gate_source_a_wave_passes_on_bake_time_alone_with_a_note() {
        let verdict = block_on(judge(&GateConfig::default(), &request(&["a.example.com"])));
        assert_eq!(
            verdict,
            Ok(Verdict::Pass {
                notes: vec![NO_SOURCE_NOTE.to_owned()]
            })
        );
    }

    #[test]
    fn a_change_to_no_site_passes_on_bake_time_alone() {
        let cfg = GateConfig {
            prometheus: Some("http://127.0.0.1:9".into()),
            ..GateConfig::default()
        };
        let Ok(Verdict::Pass { notes }) = block_on(judge(&cfg, &request(&[]))) else {
            panic!("a routing-only change passes");
        };
        assert!(notes[0].contains("bake time alone"), "{notes:?}");
    }
}
