//! The routing policy (AIBrix `prefix-cache`, the baseline we match):
//! a load guard first, then the longest cached prefix among pods that are not
//! overloaded, else the least loaded pod. Pure: loads and matches come in,
//! a choice comes out; randomness only breaks ties.

use crate::rng::SplitMix64;

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
}

/// The policy's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub pod: u16,
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
    pool: &[u16],
    load: &[u32],
    matches: &[(u16, u32)],
    total_blocks: usize,
    turn: usize,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    let load_of = |pod: u16| load.get(usize::from(pod)).copied().unwrap_or(0);
    let percent_of = |pod: u16| -> u8 {
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
    let least_loaded = || -> u16 {
        let mins: Vec<u16> = pool
            .iter()
            .copied()
            .filter(|&p| load_of(p) == min)
            .collect();
        mins[turn % mins.len()]
    };
    let pick = |pod: u16, reason: Reason| Choice {
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
    let mut matched: Vec<(u16, u32)> = matches
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
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const CFG: PolicyConfig = PolicyConfig {
        imbalance_abs_count: 16,
        stddev_factor: 2.0,
    };

    fn run(pool: &[u16], load: &[u32], matches: &[(u16, u32)], total: usize, seed: u64) -> Choice {
        choose(
            &CFG,
            pool,
            load,
            matches,
            total,
            seed as usize,
            &mut SplitMix64::new(seed),
        )
        .unwrap()
    }

    #[test]
    fn empty_pool_has_no_choice() {
        assert_eq!(
            choose(&CFG, &[], &[], &[], 0, 0, &mut SplitMix64::new(1)),
            None
        );
    }

    #[test]
    fn longest_match_wins() {
        let c = run(&[0, 1, 2], &[0, 0, 0], &[(0, 2), (1, 5)], 10, 1);
        assert_eq!(
            c,
            Choice {
                pod: 1,
                reason: Reason::PrefixMatch,
                match_percent: 50
            }
        );
    }

    #[test]
    fn equal_match_prefers_fewer_in_flight() {
        let c = run(&[0, 1, 2], &[3, 1, 0], &[(0, 4), (1, 4)], 4, 1);
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (1, Reason::PrefixMatch, 100)
        );
    }

    #[test]
    fn equal_match_and_load_ties_are_shuffled() {
        let mut seen = [false; 2];
        for seed in 0..32 {
            let c = run(&[0, 1], &[0, 0], &[(0, 4), (1, 4)], 4, seed);
            seen[usize::from(c.pod)] = true;
        }
        assert_eq!(seen, [true, true]);
    }

    #[test]
    fn no_match_goes_to_least_loaded_and_ties_rotate_evenly() {
        let c = run(&[0, 1, 2], &[2, 0, 1], &[], 4, 1);
        assert_eq!((c.pod, c.reason, c.match_percent), (1, Reason::NoMatch, 0));
        // Concurrency 1: every pod idle; consecutive turns place one per pod.
        let mut seen = [0u32; 3];
        for turn in 0..60 {
            seen[usize::from(run(&[0, 1, 2], &[0, 0, 0], &[], 4, turn).pod)] += 1;
        }
        assert_eq!(seen, [20, 20, 20]);
    }

    #[test]
    fn imbalance_sends_to_least_loaded_even_with_a_match() {
        let c = run(&[0, 1, 2], &[20, 3, 4], &[(0, 8)], 8, 1);
        assert_eq!((c.pod, c.reason), (1, Reason::LoadGuard));
    }

    #[test]
    fn spread_at_threshold_is_not_imbalance() {
        let c = run(&[0, 1], &[16, 0], &[(0, 8)], 8, 1);
        // spread 16 is not > 16; but pod 0 is above mean + 2 sd? mean 8, sd 8 -> bound 24: taken.
        assert_eq!((c.pod, c.reason), (0, Reason::PrefixMatch));
    }

    #[test]
    fn matched_pod_above_stddev_bound_is_skipped_for_next_match() {
        let cfg = PolicyConfig {
            imbalance_abs_count: 100,
            stddev_factor: 0.5,
        };
        // loads 10,0,0,0: mean 2.5, sd 4.33, bound 4.67 -> pod 0 too busy, pod 1 (shorter match) ok.
        let c = choose(
            &cfg,
            &[0, 1, 2, 3],
            &[10, 0, 0, 0],
            &[(0, 8), (1, 4)],
            8,
            0,
            &mut SplitMix64::new(3),
        )
        .unwrap();
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (1, Reason::PrefixMatch, 50)
        );
    }

    #[test]
    fn all_matched_pods_too_busy_falls_back_to_least_loaded() {
        let cfg = PolicyConfig {
            imbalance_abs_count: 100,
            stddev_factor: 0.5,
        };
        let c = choose(
            &cfg,
            &[0, 1, 2, 3],
            &[10, 0, 1, 1],
            &[(0, 8)],
            8,
            0,
            &mut SplitMix64::new(3),
        )
        .unwrap();
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (1, Reason::LoadGuard, 0)
        );
    }

    #[test]
    fn matches_outside_the_pool_are_ignored() {
        let c = run(&[1, 2], &[0, 0, 0], &[(0, 8)], 8, 1);
        assert_eq!(c.reason, Reason::NoMatch);
        assert_ne!(c.pod, 0);
    }

    #[test]
    fn single_pod_pool_ignores_imbalance() {
        let c = run(&[0], &[100], &[], 1, 1);
        assert_eq!((c.pod, c.reason), (0, Reason::NoMatch));
    }

    #[test]
    fn zero_blocks_reports_zero_percent() {
        let c = run(&[0], &[0], &[(0, 0)], 0, 1);
        assert_eq!(c.match_percent, 0);
    }
}
