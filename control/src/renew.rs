//! When an ACME certificate is renewed: pure rules, no I/O.
//!
//! A certificate is due for renewal once a third of its lifetime is left
//! ([`renew_at`]); a renewal may break an open freeze window only when the
//! certificate would otherwise expire within [`URGENT_SECS`] (72 hours).

/// A renewal inside an open freeze window is allowed (and recorded as
/// such) when the certificate expires within this many seconds.
pub const URGENT_SECS: i64 = 72 * 3600;

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
}
