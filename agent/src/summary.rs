//! Regional health summaries (docs/operations.md, "Health summaries"): the
//! election of one summarizer per region, pure (no I/O, no clock of its
//! own: every decision takes `now`).
//!
//! The summarizer of a region reads the region's `health/<node>` topics
//! and publishes, each of its health intervals, one retained summary on
//! `<prefix>/summary/<region>` ([`crate::book::Book::summary_at`]); every
//! agent reads `summary/+` and `status/+` instead of `health/+`
//! ([`crate::book::Book::take_summary_at`]), and reads a region's health
//! topics directly while no fresh summary of it comes.
//!
//! The election: a retained claim `{node, epoch, ts}` on
//! `<prefix>/summary-lock/<region>`. The holder's summaries are its
//! re-assertion (no claim traffic while it lives); its claim heard again,
//! or again at a higher epoch, is not. A node of the region
//! claims, with the next epoch, when there is no claim one interval after
//! it connected, when the holder's status is `offline` (its last will),
//! when the holder is not a node of the region, or when no summary of the
//! holder came for [`TAKEOVER_INTERVALS`] intervals. Of two claims the
//! highest epoch wins, then the smaller node name
//! ([`edgestate::mqtt::LockClaim::beats`]); a holder that hears a claim it
//! beats publishes its own again (the retained claim ends up the winner's),
//! one that hears a claim beating its own stops summarizing. At a tie with
//! a silent holder (no summary for [`TAKEOVER_INTERVALS`] intervals) the
//! challenger wins: a take-over at the top of the believed epochs cannot
//! claim higher, and a forged claim there in a smaller name would
//! otherwise hold the region without summaries for good.

use std::time::{Duration, Instant};

use edgestate::mqtt::LockClaim;

/// A holder silent (no summary) for this many intervals is replaced.
pub const TAKEOVER_INTERVALS: u32 = 3;

/// What the agent must do after an election step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Publish this claim (retained, QoS 1).
    Claim(LockClaim),
}

/// The election of the summarizer of this agent's own region.
#[derive(Debug, Clone)]
pub struct Election {
    node: String,
    interval: Duration,
    /// The winning claim heard (or made).
    claim: Option<LockClaim>,
    /// Whether this node holds the region.
    holding: bool,
    /// Since when the current claim's holder is watched (the claim, or
    /// its last summary).
    holder_seen: Option<Instant>,
    /// When the agent (re)connected: a retained claim arrives at once, so
    /// with none after an interval, there is none.
    since: Option<Instant>,
}

impl Election {
    #[must_use]
    pub fn new(node: &str, interval: Duration) -> Election {
        Election {
            node: node.to_owned(),
            interval,
            claim: None,
            holding: false,
            holder_seen: None,
            since: None,
        }
    }

    /// Whether this node summarizes its region now.
    #[must_use]
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// The epoch of the winning claim (the summaries carry it).
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.claim.as_ref().map_or(0, |c| c.epoch)
    }

    /// The current holder, as far as this node knows.
    #[must_use]
    pub fn holder(&self) -> Option<&str> {
        self.claim.as_ref().map(|c| c.node.as_str())
    }

    /// Connected to the broker at `now` (the retained claim follows).
    pub fn connected(&mut self, now: Instant) {
        self.since = Some(now);
    }

    /// The broker went away: the claim may change meanwhile; start over.
    /// A holder stops summarizing (it could not publish anyway).
    pub fn disconnected(&mut self) {
        self.since = None;
        self.holding = false;
        self.claim = None;
        self.holder_seen = None;
    }

    /// A claim heard on the region's lock topic (`None`: cleared).
    pub fn on_claim(&mut self, claim: Option<LockClaim>, now: Instant) -> Step {
        let Some(c) = claim else {
            // Cleared: a holder claims again, the others wait for one.
            if self.holding
                && let Some(mine) = &self.claim
            {
                return Step::Claim(mine.clone());
            }
            self.claim = None;
            self.holder_seen = Some(now);
            return Step::Nothing;
        };
        match &self.claim {
            // The same claim again (re-published, retained again after a
            // reconnect of the bridge, or repeated by a forger): not a sign
            // of life. Only the holder's summaries are.
            Some(current) if current.node == c.node && current.epoch == c.epoch => Step::Nothing,
            Some(current) if current.beats(&c) => {
                // A tie with a holder none of whose summaries came for
                // TAKEOVER_INTERVALS: the challenger's claim is taken,
                // by the holder too. Only reachable at the top of the
                // believed epochs (a take-over otherwise claims a higher
                // one), where a forged claim in a smaller name would
                // otherwise win every tie against the take-over.
                if c.epoch == current.epoch && self.holder_silent(now) {
                    self.holding = false;
                    self.claim = Some(c);
                    self.holder_seen = Some(now);
                    return Step::Nothing;
                }
                // A losing claim (a tie, or a late one): the holder says
                // it again so the retained claim is the winner's.
                if self.holding {
                    Step::Claim(current.clone())
                } else {
                    Step::Nothing
                }
            }
            _ => {
                if c.node == self.node && !self.holding {
                    // This node's claim from before a restart: take it
                    // again with the next epoch.
                    return self.claim_next(Some(c.epoch), now);
                }
                self.holding = c.node == self.node;
                // A holder claiming again at a higher epoch is watched
                // from its last summary, not afresh: claims alone, however
                // high, do not keep a holder that never summarizes.
                let same_holder = self.claim.as_ref().is_some_and(|p| p.node == c.node);
                self.claim = Some(c);
                if !same_holder {
                    self.holder_seen = Some(now);
                }
                Step::Nothing
            }
        }
    }

    /// A summary of the region heard from `by` at `epoch`.
    pub fn on_summary(&mut self, by: &str, epoch: u64, now: Instant) {
        if self
            .claim
            .as_ref()
            .is_some_and(|c| c.node == by && c.epoch == epoch)
        {
            self.holder_seen = Some(now);
        }
    }

    /// Look at the time: claim the region when there is no live holder.
    /// `holder_online`: the holder's status (`Some(false)`: its last will);
    /// `holder_in_region`: whether the holder is a node of this region in
    /// the routing table.
    pub fn tick(
        &mut self,
        now: Instant,
        holder_online: Option<bool>,
        holder_in_region: bool,
    ) -> Step {
        let Some(since) = self.since else {
            return Step::Nothing;
        };
        if self.holding {
            return Step::Nothing;
        }
        match &self.claim {
            None => {
                if now.saturating_duration_since(since) >= self.interval {
                    self.claim_next(None, now)
                } else {
                    Step::Nothing
                }
            }
            Some(c) => {
                let silent = self.holder_silent(now);
                if holder_online == Some(false) || !holder_in_region || silent {
                    self.claim_next(Some(c.epoch), now)
                } else {
                    Step::Nothing
                }
            }
        }
    }

    /// Whether no summary of the current holder (this node's own, as the
    /// broker sent them back, when it holds) came for [`TAKEOVER_INTERVALS`]
    /// intervals since the claim or the (re)connection.
    fn holder_silent(&self, now: Instant) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        let seen = self.holder_seen.unwrap_or(since).max(since);
        now.saturating_duration_since(seen) > self.interval * TAKEOVER_INTERVALS
    }

    fn claim_next(&mut self, after: Option<u64>, now: Instant) -> Step {
        let c = LockClaim {
            node: self.node.clone(),
            // Never a claim the others refuse (a forged one at the top
            // of the believed epochs is met, not passed).
            epoch: after.map_or(1, |e| {
                e.saturating_add(1)
                    .min(edgestate::mqtt::CLAIM_EPOCH_MAX - 1)
            }),
            ts: 0,
        };
        self.claim = Some(c.clone());
        self.holding = true;
        self.holder_seen = Some(now);
        Step::Claim(c)
    }
}

#[cfg(test)]
mod differential;

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_secs(1);

    fn claim(node: &str, epoch: u64) -> LockClaim {
        LockClaim {
            node: node.into(),
            epoch,
            ts: 0,
        }
    }

    fn claimed(s: &Step) -> LockClaim {
        match s {
            Step::Claim(c) => c.clone(),
            Step::Nothing => panic!("no claim"),
        }
    }

    #[test]
    fn the_first_claims_after_an_interval_without_a_retained_claim() {
        let t0 = Instant::now();
        let mut e = Election::new("a", I);
        assert_eq!(e.tick(t0, None, true), Step::Nothing, "not connected");
        e.connected(t0);
        assert_eq!(e.tick(t0 + I / 2, None, true), Step::Nothing);
        let c = claimed(&e.tick(t0 + I, None, true));
        assert_eq!((c.node.as_str(), c.epoch), ("a", 1));
        assert!(e.holding());
        // Its own claim comes back from the broker: nothing more.
        assert_eq!(e.on_claim(Some(c), t0 + I), Step::Nothing);
        assert!(e.holding());
    }

    #[test]
    fn a_tie_is_won_by_the_smaller_name_everywhere() {
        let t0 = Instant::now();
        let mut a = Election::new("a", I);
        let mut b = Election::new("b", I);
        let mut c = Election::new("c", I);
        for e in [&mut a, &mut b, &mut c] {
            e.connected(t0);
        }
        let ca = claimed(&a.tick(t0 + I, None, true));
        let cb = claimed(&b.tick(t0 + I, None, true));
        // The broker delivers b's claim, then a's, to everyone.
        assert_eq!(
            a.on_claim(Some(cb.clone()), t0 + I),
            Step::Claim(ca.clone())
        );
        assert_eq!(b.on_claim(Some(cb.clone()), t0 + I), Step::Nothing);
        assert_eq!(c.on_claim(Some(cb.clone()), t0 + I), Step::Nothing);
        for e in [&mut a, &mut b, &mut c] {
            let _ = e.on_claim(Some(ca.clone()), t0 + I);
        }
        assert!(a.holding() && !b.holding() && !c.holding());
        assert_eq!(c.holder(), Some("a"));
        // In the other order too.
        let mut b2 = Election::new("b", I);
        b2.connected(t0);
        let _ = b2.tick(t0 + I, None, true);
        assert_eq!(b2.on_claim(Some(claim("a", 1)), t0 + I), Step::Nothing);
        assert!(!b2.holding());
        assert_eq!(b2.on_claim(Some(claim("b", 1)), t0 + I), Step::Nothing);
        assert!(!b2.holding(), "its own late echo loses");
    }

    #[test]
    fn a_silent_holder_yields_at_a_tie_on_the_top_epoch_a_summarizing_one_does_not() {
        let top = edgestate::mqtt::CLAIM_EPOCH_MAX - 1;
        let t0 = Instant::now();
        let later = t0 + I * (TAKEOVER_INTERVALS + 1);
        let start = |node: &str| {
            let mut e = Election::new(node, I);
            e.connected(t0);
            e
        };
        // A forged claim at the top in a's name: a takes it (it cannot
        // claim higher), then none of its summaries come back.
        let mut a = start("a");
        let ca = claimed(&a.on_claim(Some(claim("a", top)), t0));
        assert_eq!((ca.node.as_str(), ca.epoch), ("a", top));
        let (mut b, mut c) = (start("b"), start("c"));
        assert_eq!(b.on_claim(Some(ca.clone()), t0), Step::Nothing);
        assert_eq!(c.on_claim(Some(ca.clone()), t0), Step::Nothing);
        // b takes over at the same epoch: a tie a would win by name.
        let cb = claimed(&b.tick(later, Some(true), true));
        assert_eq!((cb.node.as_str(), cb.epoch), ("b", top));
        // a, silent, yields; c takes b's claim without one of its own.
        assert_eq!(a.on_claim(Some(cb.clone()), later), Step::Nothing);
        assert!(!a.holding());
        assert_eq!(a.holder(), Some("b"));
        assert_eq!(c.on_claim(Some(cb.clone()), later), Step::Nothing);
        assert_eq!(c.holder(), Some("b"));
        assert_eq!(c.tick(later, Some(true), true), Step::Nothing);
        assert!(b.holding());
        // A holder whose summaries come back keeps a tie, as before.
        let mut a2 = start("a");
        let ca2 = claimed(&a2.on_claim(Some(claim("a", top)), t0));
        a2.on_summary("a", top, later);
        assert_eq!(a2.on_claim(Some(cb), later), Step::Claim(ca2));
        assert!(a2.holding());
    }

    #[test]
    fn a_holder_offline_or_silent_is_replaced_with_the_next_epoch() {
        let t0 = Instant::now();
        let mut b = Election::new("b", I);
        b.connected(t0);
        assert_eq!(b.on_claim(Some(claim("a", 4)), t0), Step::Nothing);
        // Summaries keep the holder alive.
        for s in 1..10 {
            b.on_summary("a", 4, t0 + I * s);
            assert_eq!(b.tick(t0 + I * s, Some(true), true), Step::Nothing);
        }
        // Its last will: at once.
        let c = claimed(&b.tick(t0 + I * 10, Some(false), true));
        assert_eq!((c.node.as_str(), c.epoch), ("b", 5));
        // Silent: after TAKEOVER_INTERVALS.
        let mut d = Election::new("d", I);
        d.connected(t0);
        let _ = d.on_claim(Some(claim("a", 4)), t0);
        d.on_summary("a", 3, t0 + I * 2);
        assert_eq!(d.tick(t0 + I * 3, Some(true), true), Step::Nothing);
        let c = claimed(&d.tick(t0 + I * 3 + Duration::from_millis(1), Some(true), true));
        assert_eq!(c.epoch, 5, "a summary of an older epoch keeps nobody alive");
        // A holder that left the region (a new routing table).
        let mut e = Election::new("e", I);
        e.connected(t0);
        let _ = e.on_claim(Some(claim("gone", 2)), t0);
        assert_eq!(claimed(&e.tick(t0, None, false)).epoch, 3);
    }

    #[test]
    fn a_claim_repeated_or_raised_without_summaries_keeps_nobody_alive() {
        let t0 = Instant::now();
        let mut b = Election::new("b", I);
        b.connected(t0);
        assert_eq!(b.on_claim(Some(claim("c", 1000)), t0), Step::Nothing);
        // The same claim every half interval, then again one epoch higher:
        // no summary of `c` came, so it is silent all the same.
        for k in 1..=6 {
            let epoch = if k > 3 { 1001 } else { 1000 };
            let at = t0 + I / 2 * k;
            assert_eq!(b.on_claim(Some(claim("c", epoch)), at), Step::Nothing);
            assert_eq!(b.tick(at, Some(true), true), Step::Nothing);
        }
        let c = claimed(&b.tick(t0 + I * 3 + Duration::from_millis(1), Some(true), true));
        assert_eq!((c.node.as_str(), c.epoch), ("b", 1002));
        // A holder whose summaries come is kept, its claim heard again or not.
        let mut d = Election::new("d", I);
        d.connected(t0);
        let _ = d.on_claim(Some(claim("c", 7)), t0);
        for s in 1..10 {
            d.on_summary("c", 7, t0 + I * s);
            let _ = d.on_claim(Some(claim("c", 7)), t0 + I * s);
            assert_eq!(d.tick(t0 + I * s, Some(true), true), Step::Nothing);
        }
    }

    #[test]
    fn a_holder_yields_to_a_higher_epoch_and_reclaims_after_a_restart() {
        let t0 = Instant::now();
        let mut a = Election::new("a", I);
        a.connected(t0);
        // Its own claim from before a restart: taken again, next epoch.
        assert_eq!(
            a.on_claim(Some(claim("a", 1)), t0),
            Step::Claim(claim("a", 2))
        );
        assert!(a.holding() && a.epoch() == 2);
        let mut a = Election::new("a", I);
        a.connected(t0);
        let c = claimed(&a.tick(t0 + I, None, true));
        assert_eq!(
            a.on_claim(Some(claim("z", c.epoch + 1)), t0 + I),
            Step::Nothing
        );
        assert!(!a.holding());
        assert_eq!(a.holder(), Some("z"));
        // A stale lower claim re-published: ignored by a non-holder.
        assert_eq!(a.on_claim(Some(claim("a", 1)), t0 + I), Step::Nothing);
        a.disconnected();
        assert!(!a.holding() && a.holder().is_none());
    }
}
