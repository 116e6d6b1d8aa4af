//! When cycles run: a random startup delay, a jittered period and
//! exponential backoff after failures. Randomness comes from a tiny seeded
//! PRNG so tests are deterministic and the wasm module needs no RNG crate.

/// Longest wait after repeated failures (unless the period itself is longer).
pub(crate) const MAX_BACKOFF_MS: u64 = 60_000;

use crate::rng::SplitMix64;

/// Uniform in `[0, n)` for the millisecond spans here (below 2^32 even on
/// wasm32, where `usize` is 32 bits: periods are capped at an hour).
fn below(rng: &mut SplitMix64, n: u64) -> u64 {
    rng.below(usize::try_from(n).unwrap_or(usize::MAX)) as u64
}

/// Cycle timing state.
#[derive(Clone, Debug)]
pub(crate) struct Schedule {
    period_ms: u64,
    backoff_ms: u64,
    rng: SplitMix64,
}

impl Schedule {
    /// Timing for `period_ms`, randomised by `seed`.
    pub(crate) fn new(period_ms: u64, seed: u64) -> Self {
        Self {
            period_ms,
            backoff_ms: period_ms,
            rng: SplitMix64::new(seed),
        }
    }

    /// Delay before the first cycle, in `[0, period/2)`, so replicas started
    /// together do not reach Redis together.
    pub(crate) fn startup_delay(&mut self) -> u64 {
        below(&mut self.rng, self.period_ms / 2)
    }

    /// Wait after a successful cycle: period +-10 %, never below period/2.
    /// Resets the backoff.
    pub(crate) fn after_success(&mut self) -> u64 {
        self.backoff_ms = self.period_ms;
        let span = self.period_ms / 10;
        let wait = self.period_ms - span + below(&mut self.rng, 2 * span + 1);
        wait.max(self.period_ms / 2)
    }

    /// Wait after a failed cycle: doubles each time, capped at 60 s (or at
    /// the period, when that is longer).
    pub(crate) fn after_failure(&mut self) -> u64 {
        let cap = MAX_BACKOFF_MS.max(self.period_ms);
        self.backoff_ms = self.backoff_ms.saturating_mul(2).min(cap);
        self.backoff_ms
    }

    /// Current base wait (period when healthy, larger while backing off).
    pub(crate) fn backoff_ms(&self) -> u64 {
        self.backoff_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn startup_delay_within_half_period() {
        for seed in 0..500 {
            let d = Schedule::new(10_000, seed).startup_delay();
            assert!(d < 5_000, "{d}");
        }
        // Spread, not a constant.
        let distinct: std::collections::BTreeSet<u64> = (0..50)
            .map(|s| Schedule::new(10_000, s).startup_delay())
            .collect();
        assert!(distinct.len() > 40);
    }

    #[test]
    fn jitter_within_ten_percent_and_never_below_half_period() {
        let mut s = Schedule::new(10_000, 7);
        let waits: Vec<u64> = (0..2000).map(|_| s.after_success()).collect();
        assert!(waits.iter().all(|w| (9_000..=11_000).contains(w)));
        assert!(waits.iter().any(|w| *w < 9_500) && waits.iter().any(|w| *w > 10_500));
        let mut tiny = Schedule::new(100, 3);
        assert!((0..500).all(|_| tiny.after_success() >= 50));
    }

    #[test]
    fn backoff_doubles_to_sixty_seconds_and_resets() {
        let mut s = Schedule::new(10_000, 1);
        let waits: Vec<u64> = (0..5).map(|_| s.after_failure()).collect();
        assert_eq!(waits, vec![20_000, 40_000, 60_000, 60_000, 60_000]);
        let w = s.after_success();
        assert_eq!(s.backoff_ms(), 10_000);
        assert!((9_000..=11_000).contains(&w));
        assert_eq!(s.after_failure(), 20_000);
    }
}
