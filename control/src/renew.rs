//! When an ACME certificate is renewed, and how a failing one is retried:
//! pure rules and pure data, no I/O. The reconcile job that runs them is
//! [`job`].
//!
//! A certificate is due for renewal once a third of its lifetime is left
//! ([`renew_at`]); a renewal may break an open freeze window only when the
//! certificate would otherwise expire within [`URGENT_SECS`] (72 hours).
//! After a failure the next attempt waits a jittered, doubling delay
//! ([`backoff_secs`]: 1 minute doubling, at most 1 hour, so a failing
//! certificate is still tried at least once an hour) and never less than
//! the CA's `Retry-After`; a success forgets the failures ([`State`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod job;

/// A renewal inside an open freeze window is allowed (and recorded as
/// such) when the certificate expires within this many seconds.
pub const URGENT_SECS: i64 = 72 * 3600;

/// The first retry delay after a failure (its step: the delay is drawn in
/// `[step/2, step]`), doubling with each further failure.
pub const BACKOFF_FIRST_SECS: i64 = 60;

/// The largest retry step: a failing certificate is tried at least once
/// an hour (the "failing for 24 h" alert counts on it), unless the CA's
/// `Retry-After` asks for longer.
pub const BACKOFF_CAP_SECS: i64 = 3600;

/// When a certificate valid from `not_before` to `not_after` (Unix
/// seconds) is due: a third of its lifetime before its end.
#[must_use]
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    let life = not_after.saturating_sub(not_before).max(0);
    not_after.saturating_sub(life / 3)
}

/// Whether a certificate expiring at `not_after` may be renewed at `now`
/// while a freeze window is open.
#[must_use]
pub fn urgent(not_after: i64, now: i64) -> bool {
    not_after.saturating_sub(now) < URGENT_SECS
}

/// The delay (seconds) before the next attempt after `failures` failures
/// in a row (at least 1): equal jitter over the step — the step is
/// [`BACKOFF_FIRST_SECS`] doubling per failure, capped at
/// [`BACKOFF_CAP_SECS`], and the delay is half the step plus `random`
/// spread over the other half.
#[must_use]
pub fn backoff_secs(failures: u32, random: u64) -> i64 {
    let shift = failures.saturating_sub(1).min(20);
    let step = BACKOFF_FIRST_SECS
        .saturating_mul(1_i64 << shift)
        .min(BACKOFF_CAP_SECS);
    let half = step / 2;
    let span = u64::try_from(step - half).unwrap_or(0) + 1;
    half + i64::try_from(random % span).unwrap_or(0)
}

/// One certificate's failed attempts since its last success.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempts {
    /// Failures in a row.
    pub failures: u32,
    /// When the first of them happened (Unix seconds).
    pub first_failure: i64,
    /// Not tried again before this (Unix seconds).
    pub next_attempt: i64,
    /// The last problem: each failed host and the CA's problem document
    /// (or this side's), one line.
    pub last_problem: String,
}

/// The renewal state of every ACME certificate that failed since its last
/// success, by certificate name (`acme.<host>`); kept in the state store
/// between runs (`<state>/acme/renewal.json`, or shared:
/// `Store::renewal_state`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    #[serde(default)]
    pub certificates: BTreeMap<String, Attempts>,
}

impl State {
    /// Read from its JSON text.
    ///
    /// # Errors
    /// Not this state's JSON (the serde message).
    pub fn parse(text: &str) -> Result<State, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// Its JSON text (sorted by name).
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// `name` failed at `now` with `problem`: one more failure, and the
    /// next attempt after the backoff ([`backoff_secs`] with `random`) or
    /// the CA's `retry_after` (seconds), whichever is later.
    pub fn failed(
        &mut self,
        name: &str,
        now: i64,
        problem: &str,
        retry_after: Option<u64>,
        random: u64,
    ) {
        let a = self.certificates.entry(name.to_owned()).or_default();
        if a.failures == 0 {
            a.first_failure = now;
        }
        a.failures = a.failures.saturating_add(1);
        let wait = backoff_secs(a.failures, random)
            .max(retry_after.map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX)));
        a.next_attempt = now.saturating_add(wait);
        a.last_problem = problem.to_owned();
    }

    /// `name` was issued: its failures are forgotten.
    pub fn succeeded(&mut self, name: &str) {
        self.certificates.remove(name);
    }

    /// Forget the certificates not in `names` (no ACME site uses them).
    pub fn retain(&mut self, names: &[&str]) {
        self.certificates.retain(|n, _| names.contains(&n.as_str()));
    }
}

/// What is known of a kept certificate: its validity, and whether it
/// covers every name of its site (an alias added since it was issued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub not_before: i64,
    pub not_after: i64,
    pub covers: bool,
}

/// What to do with one ACME certificate now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// None kept (or one that does not cover the site's names): order it.
    Issue,
    /// Due: renew it. `urgent`: it expires within 72 hours (a freeze
    /// window does not hold it back).
    Renew { urgent: bool },
    /// Not due before `at`.
    NotDue { at: i64 },
    /// Due or missing, but a failure's backoff (or the CA's
    /// `Retry-After`) runs until `until`.
    Wait { until: i64 },
    /// Due, but a freeze window is open and it does not expire within 72
    /// hours: it waits for the window to close.
    Frozen,
}

impl Decision {
    /// Whether an order is made now.
    #[must_use]
    pub fn orders(self) -> bool {
        matches!(self, Decision::Issue | Decision::Renew { .. })
    }
}

/// The decision for a certificate `kept` (or none), after `attempts`
/// (failures since its last success), at `now`, with a freeze window open
/// or not (`frozen`).
///
/// Missing comes first (nothing to serve: a freeze does not hold it back),
/// then due; either waits for a failure's backoff; a due renewal waits
/// for a freeze window unless urgent.
#[must_use]
pub fn decide(kept: Option<Kept>, attempts: Option<&Attempts>, now: i64, frozen: bool) -> Decision {
    let want = match kept {
        None => Decision::Issue,
        Some(k) if !k.covers => Decision::Issue,
        Some(k) => {
            let at = renew_at(k.not_before, k.not_after);
            if now < at {
                return Decision::NotDue { at };
            }
            Decision::Renew {
                urgent: urgent(k.not_after, now),
            }
        }
    };
    if let Some(a) = attempts
        && a.failures > 0
        && now < a.next_attempt
    {
        return Decision::Wait {
            until: a.next_attempt,
        };
    }
    match want {
        Decision::Renew { urgent: false } if frozen => Decision::Frozen,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_due_with_a_third_of_its_life_left() {
        // 90 days: due at day 60.
        assert_eq!(renew_at(0, 90 * 86_400), 60 * 86_400);
        // Short-lived (pebble's 30 s in tests): due after 20 s.
        assert_eq!(renew_at(1_000, 1_030), 1_020);
        // Malformed (ends before it starts): due at its end.
        assert_eq!(renew_at(10, 5), 5);
    }

    #[test]
    fn only_a_certificate_expiring_within_72_hours_is_urgent() {
        assert!(urgent(1_000 + URGENT_SECS - 1, 1_000));
        assert!(!urgent(1_000 + URGENT_SECS, 1_000));
        assert!(urgent(0, 1_000));
    }

    #[test]
    fn backoff_doubles_from_a_minute_with_jitter_within_its_step_and_is_capped_at_an_hour() {
        let mut seed = 0x1234_5678_u64;
        let mut next = || {
            // splitmix64
            seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for failures in 1..=40 {
            let step = (60_i64 << (failures - 1).min(20)).min(3600);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..500 {
                let d = backoff_secs(failures, next());
                assert!(
                    d >= step / 2 && d <= step,
                    "{failures}: {d} not in its step {step}"
                );
                seen.insert(d);
            }
            // Jittered: not one value.
            assert!(seen.len() > 10, "{failures}: {seen:?}");
        }
        // The bounds themselves are reachable.
        assert_eq!(backoff_secs(1, 0), 30);
        assert_eq!(backoff_secs(1, 30), 60);
        assert_eq!(backoff_secs(7, 1800), 3600);
        assert_eq!(
            backoff_secs(u32::MAX, u64::MAX),
            1800 + (u64::MAX % 1801) as i64
        );
        assert!(
            backoff_secs(0, 0) == 30,
            "no failure yet counts as the first"
        );
    }

    #[test]
    fn a_failure_backs_off_the_ca_retry_after_wins_and_a_success_resets() {
        let mut s = State::default();
        s.failed("acme.shop.test", 1_000, "shop.test: boom", None, 0);
        let a = &s.certificates["acme.shop.test"];
        assert_eq!(
            (a.failures, a.first_failure, a.next_attempt),
            (1, 1_000, 1_030)
        );
        assert_eq!(a.last_problem, "shop.test: boom");
        // The second failure: its step is 2 minutes; the first failure kept.
        s.failed("acme.shop.test", 1_100, "shop.test: again", None, 60);
        let a = &s.certificates["acme.shop.test"];
        assert_eq!(
            (a.failures, a.first_failure, a.next_attempt),
            (2, 1_000, 1_220)
        );
        // The CA's Retry-After is later than the backoff: it wins.
        s.failed("acme.shop.test", 2_000, "rateLimited", Some(7_200), 0);
        assert_eq!(s.certificates["acme.shop.test"].next_attempt, 9_200);
        // Earlier than the backoff: the backoff holds.
        s.failed("acme.shop.test", 10_000, "rateLimited", Some(1), 0);
        assert_eq!(s.certificates["acme.shop.test"].next_attempt, 10_000 + 240);
        // Many failures: never more than an hour between attempts.
        for i in 0..50 {
            s.failed("acme.shop.test", 20_000 + i, "x", None, u64::MAX);
            let a = &s.certificates["acme.shop.test"];
            assert!(a.next_attempt - (20_000 + i) <= BACKOFF_CAP_SECS);
        }
        s.failed("acme.blog.test", 5, "y", None, 0);
        s.succeeded("acme.shop.test");
        assert!(!s.certificates.contains_key("acme.shop.test"));
        // A later failure starts again from the first step.
        s.failed("acme.shop.test", 50_000, "z", None, 0);
        assert_eq!(
            s.certificates["acme.shop.test"].next_attempt,
            50_000 + BACKOFF_FIRST_SECS / 2
        );
        s.retain(&["acme.shop.test"]);
        assert_eq!(s.certificates.len(), 1);
        // The state as kept reads back the same; older text without the
        // field reads as empty.
        assert_eq!(State::parse(&s.to_json()), Ok(s.clone()));
        assert_eq!(State::parse("{}"), Ok(State::default()));
        assert!(State::parse("[1]").is_err());
        assert!(State::parse("{\"certificates\": {\"a\": {\"failures\": -1}}}").is_err());
    }

    fn kept(not_before: i64, not_after: i64) -> Option<Kept> {
        Some(Kept {
            not_before,
            not_after,
            covers: true,
        })
    }

    #[test]
    fn missing_is_issued_due_is_renewed_and_backoff_waits() {
        let day = 86_400;
        let (nb, na) = (0, 90 * day);
        assert_eq!(decide(None, None, 5, false), Decision::Issue);
        assert_eq!(
            decide(
                Some(Kept {
                    not_before: nb,
                    not_after: na,
                    covers: false
                }),
                None,
                5,
                false
            ),
            Decision::Issue
        );
        assert_eq!(
            decide(kept(nb, na), None, 10 * day, false),
            Decision::NotDue { at: 60 * day }
        );
        assert_eq!(
            decide(kept(nb, na), None, 60 * day, false),
            Decision::Renew { urgent: false }
        );
        assert_eq!(
            decide(kept(nb, na), None, 88 * day, false),
            Decision::Renew { urgent: true }
        );
        let failing = Attempts {
            failures: 2,
            first_failure: 60 * day,
            next_attempt: 60 * day + 120,
            last_problem: "x".into(),
        };
        assert_eq!(
            decide(kept(nb, na), Some(&failing), 60 * day + 119, false),
            Decision::Wait {
                until: 60 * day + 120
            }
        );
        assert_eq!(
            decide(None, Some(&failing), 60 * day + 119, false),
            Decision::Wait {
                until: 60 * day + 120
            }
        );
        assert_eq!(
            decide(kept(nb, na), Some(&failing), 60 * day + 120, false),
            Decision::Renew { urgent: false }
        );
        // Not due: the backoff does not matter.
        assert_eq!(
            decide(kept(nb, na), Some(&failing), day, false),
            Decision::NotDue { at: 60 * day }
        );
        assert!(Decision::Issue.orders() && Decision::Renew { urgent: true }.orders());
        assert!(!Decision::Frozen.orders() && !Decision::Wait { until: 0 }.orders());
    }

    #[test]
    fn a_freeze_holds_back_a_due_renewal_unless_it_expires_within_72_hours() {
        let day = 86_400;
        // 90 days, due at day 60, 30 days left: waits for the window.
        assert_eq!(
            decide(kept(0, 90 * day), None, 60 * day, true),
            Decision::Frozen
        );
        // Exactly 72 hours left: not yet urgent.
        assert_eq!(
            decide(kept(0, 90 * day), None, 87 * day, true),
            Decision::Frozen
        );
        // Less than 72 hours left: renewed through the window.
        assert_eq!(
            decide(kept(0, 90 * day), None, 87 * day + 1, true),
            Decision::Renew { urgent: true }
        );
        // Expired already: urgent.
        assert_eq!(
            decide(kept(0, 90 * day), None, 91 * day, true),
            Decision::Renew { urgent: true }
        );
        // Nothing to serve: ordered whatever the window.
        assert_eq!(decide(None, None, 0, true), Decision::Issue);
        // Not due: not frozen either, just not due.
        assert_eq!(
            decide(kept(0, 90 * day), None, day, true),
            Decision::NotDue { at: 60 * day }
        );
        // Short-lived test certificates are always within 72 hours.
        assert_eq!(
            decide(kept(1_000, 1_030), None, 1_021, true),
            Decision::Renew { urgent: true }
        );
    }
}
