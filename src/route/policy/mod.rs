//! The routing policies. Pure: loads and matches come in, a choice comes
//! out; randomness only breaks ties.
//!
//! - [`PolicyMode::LoadAware`] ([`choose_load_aware`]): the longest match
//!   unless its pod's load is clearly above the least loaded pod's, or the
//!   queueing that extra load costs exceeds the prefill the match saves.
//!   Loads are in-flight counts, or with pod signals the requests a pod is
//!   estimated to have queued ([`effective_load`]).
//! - [`PolicyMode::Aibrix`] ([`choose`]): AIBrix `prefix-cache`, exactly: a
//!   load guard first, then the longest cached prefix among pods within
//!   mean + k·σ of in-flight, else the least loaded pod.

use serde::Deserialize;

use crate::rng::SplitMix64;
use crate::shared::registry::PodSlot;
use crate::signals::Seen;

mod load_aware;
pub(crate) use load_aware::placement_candidates;
pub(crate) use load_aware::{choose_load_aware, LoadAwareConfig, PodView, PoolView, SLOW_PREFILL};

/// Which rules choose the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PolicyMode {
    /// [`choose_load_aware`].
    #[default]
    LoadAware,
    /// [`choose`]: AIBrix's rules (mixed fleets with AIBrix gateways).
    Aibrix,
}

/// A pod's load for [`choose_load_aware`]: the requests it is estimated to
/// have queued. Without a report, `E` is `fleet`, the in-flight count
/// this VM knows of (this replica's, plus the other replicas' with sync).
/// With one, `E` is `replica`, this replica's in-flight count now, plus
/// what the pod reported beyond this replica's own requests
/// ([`Seen::foreign`]): its own requests fresh, everyone else's as of the
/// report. (Taking the report whole would count this replica's requests
/// as they were up to an interval and a tick ago: a pod that has just
/// finished a burst would look busy, and one that has just been sent one
/// idle.) The estimate is `E` less `capacity`, the most requests the pod
/// was seen running at once.
pub(crate) fn effective_load(replica: u32, fleet: u32, seen: Option<Seen>, capacity: u32) -> u32 {
    let Some(seen) = seen else {
        return fleet;
    };
    replica
        .saturating_add(seen.foreign)
        .saturating_sub(capacity)
}

/// The policy's two knobs (AIBrix ships 16 and 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PolicyConfig {
    /// Max - min in-flight spread above which only the least loaded pods count.
    pub(crate) imbalance_abs_count: u32,
    /// A matched pod is taken only if its in-flight count is within
    /// mean + factor x standard deviation of the pool's counts.
    pub(crate) stddev_factor: f64,
}

/// Why a pod was chosen; each maps to a stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The pod with the longest cached prefix within load bounds.
    PrefixMatch,
    /// No pod holds the first block: least loaded pod.
    NoMatch,
    /// Load imbalance, or every matching pod above the load bound: least loaded pod.
    LoadGuard,
    /// A hot prefix copied to a less busy pod (load-aware rule 4).
    Spread,
    /// A new prompt (no pod held any of it) on the pod Redis chose over
    /// every replica's placed requests (`sync.place_new`).
    Placed,
}

/// The policy's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    pub(crate) pod: PodSlot,
    pub(crate) reason: Reason,
    /// Share of the request's blocks the chosen pod already holds, 0..=100.
    pub(crate) match_percent: u8,
}

/// Picks a pod from `pool`.
///
/// - `load[pod]`: in-flight requests per pod id (missing ids count as 0);
/// - `matches`: `(pod, matched leading blocks)` for pods holding a prefix;
/// - `total_blocks`: the request's full block count;
/// - `turn`: a counter the caller advances after each least-loaded pick.
///   Ties among the least loaded pods rotate with it instead of being drawn
///   at random: at concurrency 1 every pod is idle, and a random (or
///   first-pod) draw places new prefixes unevenly; a rotation spreads them
///   one per pod. Ties among matched pods are still shuffled (`rng`).
///
/// Returns None only for an empty pool.
pub(crate) fn choose(
    cfg: &PolicyConfig,
    pool: &[PodSlot],
    load: &[u32],
    matches: &[(PodSlot, u32)],
    total_blocks: usize,
    turn: usize,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    let load_of = |pod: PodSlot| load.get(pod.index()).copied().unwrap_or(0);
    let percent_of = |pod: PodSlot| -> u8 {
        let matched = matches
            .iter()
            .find(|(p, _)| *p == pod)
            .map_or(0, |(_, m)| *m);
        if total_blocks == 0 {
            0
        } else {
            ((u64::from(matched) * 100) / total_blocks as u64).min(100) as u8
        }
    };
    let (min, max) = pool
        .iter()
        .map(|&p| load_of(p))
        .fold((u32::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
    if pool.is_empty() {
        return None;
    }
    let least_loaded = || -> PodSlot {
        let mins: Vec<PodSlot> = pool
            .iter()
            .copied()
            .filter(|&p| load_of(p) == min)
            .collect();
        mins[turn % mins.len()]
    };
    let pick = |pod: PodSlot, reason: Reason| Choice {
        pod,
        reason,
        match_percent: percent_of(pod),
    };

    // 1. Load guard: with a wide spread, only the least loaded pods count.
    if pool.len() > 1 && max - min > cfg.imbalance_abs_count {
        return Some(pick(least_loaded(), Reason::LoadGuard));
    }

    // 2-3. Longest match first, then fewer in flight, ties shuffled; take the
    // first within mean + factor x stddev.
    let mut matched: Vec<(PodSlot, u32)> = matches
        .iter()
        .copied()
        .filter(|(p, m)| *m > 0 && pool.contains(p))
        .collect();
    if matched.is_empty() {
        return Some(pick(least_loaded(), Reason::NoMatch));
    }
    rng.shuffle(&mut matched);
    matched.sort_by(|a, b| b.1.cmp(&a.1).then(load_of(a.0).cmp(&load_of(b.0))));
    let n = pool.len() as f64;
    let mean = pool.iter().map(|&p| f64::from(load_of(p))).sum::<f64>() / n;
    let var = pool
        .iter()
        .map(|&p| (f64::from(load_of(p)) - mean).powi(2))
        .sum::<f64>()
        / n;
    let bound = mean + cfg.stddev_factor * var.sqrt();
    if let Some((pod, _)) = matched
        .iter()
        .find(|(p, _)| f64::from(load_of(*p)) <= bound)
    {
        return Some(pick(*pod, Reason::PrefixMatch));
    }
    // 4. Every matching pod is too busy.
    Some(pick(least_loaded(), Reason::LoadGuard))
}

#[cfg(test)]
mod tests;
