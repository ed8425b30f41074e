//! The gate's comparison, pure: a changed site's figures on the applied
//! wave during its bake window against the same site before the change
//! and against the waves not yet applied (the control group), under the
//! gate's thresholds. No I/O: the counts come from [`super::prom`].
//!
//! The figures, per site (docs/operations.md, "The gate"):
//! - `5xx_ratio`: answers of class 5xx over requests;
//! - `refusal_ratio:<reason>`: refusals with that `X-Edgeform-Reason`
//!   over requests, per reason;
//! - `hit_ratio`: `HIT` over every cache status the edge reported.
//!
//! The rules, in order, per site:
//! 1. Fewer than `min_requests` on the applied wave in the bake window:
//!    the site passes on bake time alone, with a note.
//! 2. The references: the same site on the applied nodes before the first
//!    wave (*before*) and, in the bake window, on the pending nodes
//!    (*control*); each counts only with at least `min_requests`.
//!    Neither: the site passes on bake time alone, with a note.
//! 3. A figure regresses when it is worse than *before* by more than its
//!    threshold **and**, when the control group counts, worse than the
//!    control group by more than the threshold too. A change that is
//!    not to blame — the origin down for every edge, a flood of refused
//!    requests everywhere — makes the pending waves as bad, so a good
//!    change is not halted by it. Without *before* (a site with too
//!    little traffic before the change), the control group alone is the
//!    reference.
//! 4. The first regression halts: sites in name order, figures in the
//!    order above (5xx, refusals by reason name, hit ratio).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The gate's thresholds for one site: the cluster's `apply.gate` with
/// the site's own `rollout:` override on top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Fewer requests than this in the bake window: pass on bake time
    /// alone (also the least traffic a reference needs).
    pub min_requests: u64,
    /// The largest increase of the 5xx ratio.
    pub max_5xx_ratio_increase: f64,
    /// The largest increase of a refusal ratio, per reason.
    pub max_refusal_ratio_increase: f64,
    /// The largest drop of the hit ratio.
    pub max_hit_ratio_drop: f64,
}

/// One site's counts over one window, summed over a group of nodes (from
/// `increase()` over counters: not whole numbers).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Every request (every status class).
    pub requests: f64,
    /// Requests answered 5xx.
    pub errors_5xx: f64,
    /// Refusals by `X-Edgeform-Reason`.
    pub refusals: BTreeMap<String, f64>,
    /// Requests by cache status (`HIT`, `MISS`, ...).
    pub cache: BTreeMap<String, f64>,
}

impl Counts {
    /// 5xx over requests (0 without requests).
    #[must_use]
    pub fn ratio_5xx(&self) -> f64 {
        ratio(self.errors_5xx, self.requests)
    }

    /// Refusals for `reason` over requests (0 without requests).
    #[must_use]
    pub fn refusal_ratio(&self, reason: &str) -> f64 {
        ratio(
            self.refusals.get(reason).copied().unwrap_or(0.0),
            self.requests,
        )
    }

    /// `HIT` over every cache status; `None` when the edge reported no
    /// cache status at all (a site not cached, or nothing reached the
    /// cache).
    #[must_use]
    pub fn hit_ratio(&self) -> Option<f64> {
        let total: f64 = self.cache.values().sum();
        (total > 0.0).then(|| self.cache.get("HIT").copied().unwrap_or(0.0) / total)
    }
}

fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        (part / whole).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The three windows' counts, by host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Windows {
    /// The applied nodes before the first wave.
    pub before: BTreeMap<String, Counts>,
    /// The applied nodes during the bake window.
    pub applied: BTreeMap<String, Counts>,
    /// The pending nodes during the bake window (the control group).
    pub pending: BTreeMap<String, Counts>,
}

/// A figure past its threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Regression {
    pub host: String,
    /// `5xx_ratio`, `refusal_ratio:<reason>` or `hit_ratio`.
    pub figure: String,
    /// The reference's value: before the change, or the control group's
    /// when there was too little traffic before.
    pub before: f64,
    /// The applied wave's value.
    pub after: f64,
    /// The largest increase (or, for `hit_ratio`, drop) allowed.
    pub threshold: f64,
}

impl fmt::Display for Regression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} went from {:.4} to {:.4} (threshold {})",
            self.host, self.figure, self.before, self.after, self.threshold
        )
    }
}

/// The comparison's answer for every changed site.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// No regression; `notes` name the sites that passed on bake time
    /// alone and why.
    Pass { notes: Vec<String> },
    /// The first regression found.
    Halt(Regression),
}

/// Compare every host of `hosts` (rules in the module doc), each with
/// its thresholds from `thresholds`.
#[must_use]
pub fn compare(
    hosts: &[String],
    windows: &Windows,
    thresholds: impl Fn(&str) -> Thresholds,
) -> Outcome {
    let none = Counts::default();
    let mut notes = Vec::new();
    let sorted: BTreeSet<&String> = hosts.iter().collect();
    for host in sorted {
        let t = thresholds(host);
        let get = |m: &BTreeMap<String, Counts>| m.get(host).unwrap_or(&none).clone();
        match compare_site(
            host,
            &t,
            &get(&windows.before),
            &get(&windows.applied),
            &get(&windows.pending),
        ) {
            Ok(None) => {}
            Ok(Some(note)) => notes.push(note),
            Err(r) => return Outcome::Halt(r),
        }
    }
    Outcome::Pass { notes }
}

/// One site: `Ok(None)` compared and passed, `Ok(Some(note))` passed on
/// bake time alone, `Err` the first regression.
///
/// # Errors
/// The first figure past its threshold.
#[allow(clippy::cast_precision_loss)] // request counts far below 2^52
pub fn compare_site(
    host: &str,
    t: &Thresholds,
    before: &Counts,
    applied: &Counts,
    pending: &Counts,
) -> Result<Option<String>, Regression> {
    let min = t.min_requests as f64;
    if applied.requests < min {
        return Ok(Some(format!(
            "{host}: {:.0} requests in the bake window (fewer than min_requests {}): \
             passed on bake time alone",
            applied.requests, t.min_requests
        )));
    }
    let before = (before.requests >= min).then_some(before);
    let control = (pending.requests >= min).then_some(pending);
    let Some(reference) = before.or(control) else {
        return Ok(Some(format!(
            "{host}: too little traffic to compare with (before the change and on the \
             pending waves, fewer than min_requests {}): passed on bake time alone",
            t.min_requests
        )));
    };
    let refs: Vec<&Counts> = before.into_iter().chain(control).collect();
    let regression = |figure: String, value: &dyn Fn(&Counts) -> f64, threshold: f64| {
        let after = value(applied);
        refs.iter()
            .all(|r| after - value(r) > threshold)
            .then(|| Regression {
                host: host.to_owned(),
                figure,
                before: value(reference),
                after,
                threshold,
            })
    };
    if let Some(r) = regression(
        "5xx_ratio".into(),
        &Counts::ratio_5xx,
        t.max_5xx_ratio_increase,
    ) {
        return Err(r);
    }
    for reason in applied.refusals.keys() {
        if let Some(r) = regression(
            format!("refusal_ratio:{reason}"),
            &|c: &Counts| c.refusal_ratio(reason),
            t.max_refusal_ratio_increase,
        ) {
            return Err(r);
        }
    }
    // The hit ratio, compared where the references reported cache
    // statuses: a drop is "reference minus applied"; the applied wave
    // reporting none while serving `min_requests` (caching turned off)
    // counts as 0.
    let cached_refs: Vec<(&Counts, f64)> = refs
        .iter()
        .filter_map(|r| Some((*r, r.hit_ratio()?)))
        .collect();
    if cached_refs.len() == refs.len() {
        let after = applied.hit_ratio().unwrap_or(0.0);
        let threshold = t.max_hit_ratio_drop;
        if cached_refs.iter().all(|(_, b)| b - after > threshold) {
            return Err(Regression {
                host: host.to_owned(),
                figure: "hit_ratio".into(),
                before: reference.hit_ratio().unwrap_or(0.0),
                after,
                threshold,
            });
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
