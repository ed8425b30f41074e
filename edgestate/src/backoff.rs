//! Reconnect backoff with jitter.
//!
//! Hundreds of agents lose the broker (or their Redis) at the same moment
//! when it restarts; with a plain doubling backoff they all come back in
//! the same instant, again and again. Every retry delay here is "equal
//! jitter": half the current step fixed, the other half random, so delays
//! of different processes spread over `[step/2, step]` while each one still
//! backs off.
//!
//! Pure: the randomness is a seed the caller passes ([`Backoff::new`]) or
//! one drawn from the standard library's per-process random hasher keys
//! ([`random_seed`]); no I/O, no extra crate.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A doubling backoff from `initial` up to `max`, each delay jittered.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
    state: u64,
}

impl Backoff {
    /// A backoff whose jitter comes from `seed`.
    #[must_use]
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            step: initial,
            // splitmix64 below never gets stuck on 0, but a fixed odd
            // offset keeps seed 0 and 1 apart too.
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// A backoff seeded from [`random_seed`].
    #[must_use]
    pub fn random(initial: Duration, max: Duration) -> Backoff {
        Backoff::new(initial, max, random_seed())
    }

    /// The next delay: in `[step/2, step]`, then the step doubles (up to
    /// `max`).
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let span = u64::try_from((step - half).as_nanos()).unwrap_or(u64::MAX);
        let r = self.next_u64();
        let extra = if span == 0 { 0 } else { r % (span + 1) };
        half + Duration::from_nanos(extra)
    }

    /// Back to the initial step (after a success).
    pub fn reset(&mut self) {
        self.step = self.initial;
    }

    /// The step the next delay is drawn under (without jitter).
    #[must_use]
    pub fn step(&self) -> Duration {
        self.step
    }

    /// splitmix64: small, fast and well mixed; not for secrets.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A seed that differs between processes (and between calls): the
/// standard library's `RandomState` keys come from the OS's randomness.
#[must_use]
pub fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Many agents do not reconnect in lock-step.
    #[test]
    fn delays_of_many_agents_differ() {
        let initial = Duration::from_millis(250);
        let max = Duration::from_secs(10);
        // 500 agents, each with its own random seed, as after a broker
        // restart: their first and fifth delays spread out.
        let mut agents: Vec<Backoff> = (0..500).map(|_| Backoff::random(initial, max)).collect();
        let first: Vec<Duration> = agents.iter_mut().map(Backoff::next_delay).collect();
        let mut distinct = first.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 490, "{} distinct of 500", distinct.len());
        for d in &first {
            assert!(*d >= initial / 2 && *d <= initial, "{d:?}");
        }
        // Spread over the window, not bunched: both halves are used.
        let low = first.iter().filter(|d| **d < initial * 3 / 4).count();
        assert!((150..350).contains(&low), "{low} of 500 in the lower half");
        for a in &mut agents {
            for _ in 0..3 {
                a.next_delay();
            }
        }
        let fifth: Vec<Duration> = agents.iter_mut().map(Backoff::next_delay).collect();
        let mut distinct = fifth.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 490);
        for d in &fifth {
            assert!(*d >= Duration::from_secs(2) && *d <= Duration::from_secs(4));
        }
    }

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 7);
        let mut steps = Vec::new();
        for _ in 0..6 {
            steps.push(b.step());
            let d = b.next_delay();
            assert!(d <= *steps.last().unwrap() && d >= *steps.last().unwrap() / 2);
        }
        assert_eq!(
            steps,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(100));
        // The same seed gives the same delays (the function is pure).
        let mut x = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 42);
        let mut y = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 42);
        for _ in 0..5 {
            assert_eq!(x.next_delay(), y.next_delay());
        }
    }
}
