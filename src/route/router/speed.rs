//! How much slower each pod is than the others, as the load-aware policy
//! weighs it ([`slowness`]): from this VM's timing of its hits and of its
//! new prefixes' prefills, and from the pods' reported time per output
//! token.

use crate::route::latency::PodLatency;
use crate::route::policy::SLOW_PREFILL;
use crate::shared::registry::PodSlot;
use crate::signals::SignalView;

/// Most a pod's queue cost is scaled by its slowness (thousandths).
const MAX_SLOWNESS: u64 = 8_000;

/// Per slot: how much slower `pool`'s pods are than the fastest one (the
/// [`reference()`]; thousandths, 1000..=[`MAX_SLOWNESS`]; 0 = 1x, nothing
/// known), and whether a pod of the pool reads slow by what it does, not
/// by this VM's hits: its time per output token or its prefill time at
/// least [`SLOW_PREFILL`] / 1000 times the reference.
///
/// Three measures, each against its own reference; the highest counts:
/// - this VM's own timing of its hits ([`PodLatency::mean_hit_ms`], once a
///   pod has enough of them completed): hits, not all requests, as a pod's
///   mean over all of them grows with its share of misses (their prefill),
///   which says nothing of its speed; it includes queueing;
/// - where at least two pods report their time per output token (pod
///   signals, [`crate::signals::PodSignals::token_us`]): every VM and
///   replica reads it as soon as a pod has made a few tokens, long before
///   this VM has timed enough hits there;
/// - `prefill`, this VM's timing of long uncached prefills
///   ([`crate::route::prefill::PrefillTiming::slowness`], per slot, only
///   where at least [`SLOW_PREFILL`]): a slow pod's first new prefix shows
///   it once overdue, before the pod has made a token.
pub(super) fn slowness(
    latency: &PodLatency,
    signals: &SignalView,
    prefill: &[u32],
    pool: &[PodSlot],
) -> (Vec<u32>, bool) {
    let bound = pool.iter().map(|&p| p.index() + 1).max().unwrap_or(0);
    let mut out = vec![0; bound];
    let ratio = |value: u64, reference: u64| {
        (value.saturating_mul(1000) / reference.max(1)).clamp(1000, MAX_SLOWNESS) as u32
    };
    let means: Vec<(PodSlot, u64)> = pool
        .iter()
        .filter_map(|&p| Some((p, latency.mean_hit_ms(p)?)))
        .collect();
    // 0 ms: requests shorter than a tick were never sampled yet.
    let timed = reference(means.iter().map(|&(_, m)| m).collect());
    if let Some(reference) = timed.filter(|&m| m > 0) {
        for &(pod, mean) in &means {
            out[pod.index()] = ratio(mean, reference);
        }
    }
    let reported = || {
        pool.iter()
            .filter_map(|&p| Some((p, u64::from(signals.get(p)?.token_us?))))
            .filter(|&(_, us)| us > 0)
    };
    let mut reported_slow = false;
    let times: Vec<u64> = reported().map(|(_, us)| us).collect();
    let enough = times.len() >= 2;
    if let Some(reference) = reference(times).filter(|_| enough) {
        for (pod, us) in reported() {
            let r = ratio(us, reference);
            reported_slow |= i128::from(r) >= SLOW_PREFILL;
            out[pod.index()] = out[pod.index()].max(r);
        }
    }
    for &pod in pool {
        let s = prefill.get(pod.index()).copied().unwrap_or(0);
        if s > 0 {
            reported_slow |= i128::from(s) >= SLOW_PREFILL;
            out[pod.index()] = out[pod.index()].max(s.min(MAX_SLOWNESS as u32));
        }
    }
    if out.iter().all(|&s| s == 0) {
        out.clear();
    }
    (out, reported_slow)
}

/// What pods' times are compared with: the fastest, or from three pods on
/// the second fastest. The fastest of several figures reads low by chance
/// (a pod with few tokens, or its hits sampled on the tick), and would make
/// pods alike read slow.
fn reference(mut times: Vec<u64>) -> Option<u64> {
    let rank = usize::from(times.len() >= 3);
    (rank < times.len()).then(|| *times.select_nth_unstable(rank).1)
}
