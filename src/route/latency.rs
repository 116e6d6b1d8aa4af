//! How long this VM's requests take per pod ([`PodLatency`]): what the
//! load-aware policy's slowness is measured from.

use crate::shared::registry::{PodSlot, MAX_SLOTS};

/// How long this VM's requests take per pod, by Little's law: the time
/// its requests spent in flight (sampled on the tick) over the requests
/// that ended. No clock read per request. Both sums halve once a pod has
/// [`PodLatency::WINDOW`] completions, so the figure follows recent
/// requests. At most [`MAX_SLOTS`] pods.
///
/// Hits (requests sent to a pod holding most of their prompt) are also
/// summed apart: a pod serving mostly misses spends most of their time
/// prefilling, so its mean over all requests says how much it missed as
/// much as how fast it is, while its hits' mean is its decode speed and
/// queue. [`Self::mean_hit_ms`] is what compares pods' speed.
#[derive(Debug, Default)]
pub(crate) struct PodLatency {
    /// Per slot: (in-flight ms summed over ticks, completions).
    sums: Vec<(u64, u32)>,
    /// The same for hits only.
    hit_sums: Vec<(u64, u32)>,
    /// Per slot: this VM's hits in flight.
    hits_in_flight: Vec<u32>,
    last_ms: Option<u64>,
}

impl PodLatency {
    /// Completions kept per pod before the sums halve.
    pub(crate) const WINDOW: u32 = 64;
    /// Completions a pod needs before its latency counts.
    pub(crate) const MIN_SAMPLES: u32 = 4;
    /// Longest tick gap counted (a stalled VM does not inflate latency).
    const MAX_GAP_MS: u64 = 1_000;

    /// The tick: adds `own[slot] x elapsed` to each pod's in-flight time
    /// (and its hits' to theirs).
    pub(crate) fn tick(&mut self, own: &[u32], now_ms: u64) {
        let gap = self
            .last_ms
            .map_or(0, |t| now_ms.saturating_sub(t).min(Self::MAX_GAP_MS));
        self.last_ms = Some(now_ms);
        add_time(&mut self.sums, own, gap);
        add_time(&mut self.hit_sums, &self.hits_in_flight, gap);
    }

    /// A hit was sent to `pod` (counted until [`Self::completed`]).
    pub(crate) fn started_hit(&mut self, pod: PodSlot) {
        let i = pod.index();
        if i >= MAX_SLOTS {
            return;
        }
        if self.hits_in_flight.len() <= i {
            self.hits_in_flight.resize(i + 1, 0);
        }
        self.hits_in_flight[i] = self.hits_in_flight[i].saturating_add(1);
    }

    /// A hit started on `pod` is no longer timed (it ends uncounted, as a
    /// request that was not a hit).
    pub(crate) fn cancel_hit(&mut self, pod: PodSlot) {
        if let Some(n) = self.hits_in_flight.get_mut(pod.index()) {
            *n = n.saturating_sub(1);
        }
    }

    /// A request on `pod` ended (`hit`: it was started as one).
    pub(crate) fn completed(&mut self, pod: PodSlot, hit: bool) {
        let i = pod.index();
        if i >= MAX_SLOTS {
            return;
        }
        count_completion(&mut self.sums, i);
        if hit {
            if let Some(n) = self.hits_in_flight.get_mut(i) {
                *n = n.saturating_sub(1);
            }
            count_completion(&mut self.hit_sums, i);
        }
    }

    /// Mean ms a request of this VM spent on `pod`, once it has
    /// [`Self::MIN_SAMPLES`] completions (the tests read it; the policy
    /// reads the hits' alone).
    #[cfg(test)]
    pub(crate) fn mean_ms(&self, pod: PodSlot) -> Option<u64> {
        mean(&self.sums, pod)
    }

    /// Hits on `pod` timed now, and those timed to their end (in the
    /// current window).
    #[cfg(test)]
    pub(crate) fn hits_timed(&self, pod: PodSlot) -> (u32, u32) {
        let i = pod.index();
        let now = self.hits_in_flight.get(i).copied().unwrap_or(0);
        (now, self.hit_sums.get(i).map_or(0, |s| s.1))
    }

    /// Mean ms a hit of this VM spent on `pod`, once it has enough completions.
    pub(crate) fn mean_hit_ms(&self, pod: PodSlot) -> Option<u64> {
        mean(&self.hit_sums, pod)
    }
}

fn add_time(sums: &mut Vec<(u64, u32)>, in_flight: &[u32], gap: u64) {
    let n = in_flight.len().min(MAX_SLOTS);
    if sums.len() < n {
        sums.resize(n, (0, 0));
    }
    for (sum, &c) in sums.iter_mut().zip(in_flight) {
        sum.0 = sum.0.saturating_add(u64::from(c) * gap);
    }
}

fn count_completion(sums: &mut Vec<(u64, u32)>, i: usize) {
    if sums.len() <= i {
        sums.resize(i + 1, (0, 0));
    }
    let s = &mut sums[i];
    s.1 += 1;
    if s.1 >= PodLatency::WINDOW {
        *s = (s.0 / 2, s.1 / 2);
    }
}

fn mean(sums: &[(u64, u32)], pod: PodSlot) -> Option<u64> {
    let (ms, n) = sums.get(pod.index()).copied()?;
    (n >= PodLatency::MIN_SAMPLES).then(|| ms / u64::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn p(n: u16) -> PodSlot {
        PodSlot::new(n)
    }

    #[test]
    fn pod_latency_is_in_flight_time_over_completions() {
        let mut l = PodLatency::default();
        l.tick(&[2, 0], 0);
        // Pod 0: 2 in flight for 4 ticks of 250 ms = 2000 ms of request time.
        for t in 1..=4 {
            l.tick(&[2, 0], t * 250);
        }
        assert_eq!(l.mean_ms(p(0)), None, "too few completions");
        for _ in 0..4 {
            l.completed(p(0), false);
        }
        assert_eq!(l.mean_ms(p(0)), Some(500));
        assert_eq!(l.mean_ms(p(1)), None);
        // A stalled VM counts at most a second per tick.
        l.tick(&[2, 0], 60_000);
        assert_eq!(l.mean_ms(p(0)), Some(1000));
    }

    #[test]
    fn pod_latency_halves_its_window_and_ignores_slots_out_of_range() {
        let mut l = PodLatency::default();
        l.tick(&[1], 0);
        l.tick(&[1], 1000);
        for _ in 0..PodLatency::WINDOW {
            l.completed(p(0), false);
        }
        assert_eq!(l.sums[0], (500, PodLatency::WINDOW / 2));
        let out = PodSlot::new(u16::try_from(MAX_SLOTS).unwrap());
        l.started_hit(out);
        l.completed(out, true);
        assert!(l.sums.len() <= MAX_SLOTS);
        assert!(l.hits_in_flight.len() <= MAX_SLOTS && l.hit_sums.len() <= MAX_SLOTS);
    }

    #[test]
    fn hits_are_timed_apart_from_misses() {
        let mut l = PodLatency::default();
        l.tick(&[], 0);
        // Pod 0: 4 hits and 4 misses at once for 250 ms; the misses stay
        // 500 ms more.
        for _ in 0..4 {
            l.started_hit(p(0));
        }
        l.tick(&[8], 250);
        for _ in 0..4 {
            l.completed(p(0), true);
        }
        l.tick(&[4], 500);
        l.tick(&[4], 750);
        for _ in 0..4 {
            l.completed(p(0), false);
        }
        assert_eq!(l.mean_hit_ms(p(0)), Some(250));
        assert_eq!(l.mean_ms(p(0)), Some((8 * 250 + 4 * 500) / 8));
        // A completion counted as a hit that never started as one takes
        // nothing below zero.
        l.completed(p(1), true);
        assert_eq!(l.hits_in_flight.get(1).copied().unwrap_or(0), 0);
    }
}
