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
use crate::route::registry::PodSlot;
use crate::signals::PodSignals;

/// Which rules choose the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// [`choose_load_aware`].
    #[default]
    LoadAware,
    /// [`choose`]: AIBrix's rules (mixed fleets with AIBrix gateways).
    Aibrix,
}

/// Knobs of [`choose_load_aware`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAwareConfig {
    /// A pod above the least loaded pod's load `min` + max(`slack_abs`,
    /// `slack_rel` x `min`) is never chosen.
    pub slack_abs: u32,
    pub slack_rel: f64,
    /// Prefill blocks one request of load above `min` costs in queueing.
    pub queue_cost_blocks: u32,
    /// KV-cache usage (thousandths) at which a pod counts `slack_abs + 1`
    /// busier.
    pub kv_high_permille: u16,
}

impl Default for LoadAwareConfig {
    fn default() -> Self {
        Self {
            slack_abs: 8,
            slack_rel: 1.0,
            queue_cost_blocks: 16,
            kv_high_permille: 950,
        }
    }
}

/// A pod's load for [`choose_load_aware`]: the requests it is estimated to
/// have queued. `E` = its in-flight count, or what it reports (running +
/// waiting, which includes other replicas' traffic) when that is higher;
/// the estimate is `E` less `capacity`, the most requests it was seen
/// running at once (0 without signals: every in-flight request counts). A
/// pod whose KV cache is at or above `kv_high` counts `slack_abs + 1` more.
pub fn effective_load(
    inflight: u32,
    signals: Option<PodSignals>,
    capacity: u32,
    cfg: &LoadAwareConfig,
) -> u32 {
    let Some(s) = signals else {
        return inflight;
    };
    let hot = s.kv_permille.is_some_and(|kv| kv >= cfg.kv_high_permille);
    let penalty = if hot {
        cfg.slack_abs.saturating_add(1)
    } else {
        0
    };
    busy_load(inflight, signals)
        .saturating_sub(capacity)
        .saturating_add(penalty)
}

/// `E` of [`effective_load`]: the in-flight count, or running + waiting
/// as the pod reports them when that is higher.
pub fn busy_load(inflight: u32, signals: Option<PodSignals>) -> u32 {
    signals.map_or(inflight, |s| {
        inflight.max(s.running.saturating_add(s.waiting))
    })
}

/// The load-aware rule. Over the pool's loads (`load[pod]`, missing = 0),
/// `min` the lowest:
/// 1. a pod above `min + max(slack_abs, ceil(slack_rel x min))` is out;
/// 2. every other pod scores `matched blocks - (load - min) x
///    queue_cost_blocks x slowness`: the prefill a match saves, less the
///    queueing its extra load costs (`slowness`: how much longer this pod's
///    requests take than the fastest pod's);
/// 3. the highest score wins; ties go to the longer match, then the lower
///    load, then fewer in flight (fresh, where reports lag), then the pod
///    this VM sent fewer requests to recently (`sent`, times `slowness`: a
///    prefix placed now draws its later requests there), then the pod it
///    placed fewer new prefixes on (`placed`, so no pod's cache holds more
///    than its share); remaining
///    ties among unmatched pods rotate with `turn` (as in [`choose`]),
///    among matched pods they are shuffled;
/// 4. a hot prefix is copied. The prompt's prefix group (`share`: its
///    part of this VM's recent requests) needs `ceil(0.9 x share x pods)`
///    pods, and two when it is big (at least half a pod's share) and its
///    one holder carries over 1.15x its share of the traffic (`sent`).
///    When fewer pods of the pool hold at least half the best match, the
///    eligible non-holder with the lowest (load, sent) takes the request
///    if it has fewer requests in flight than the winner (no copies
///    between idle pods), and carried less traffic than the winner and
///    less than its share. Later requests of the group tie on the match
///    and go to the holder with less traffic.
///
/// Reason: `PrefixMatch` when the chosen pod holds part of the prompt,
/// `Spread` when a hot prefix is copied (rule 4), `LoadGuard` when another
/// pod held some and was passed over, else `NoMatch`. None only for an
/// empty pool.
#[allow(clippy::too_many_arguments)]
pub fn choose_load_aware(
    cfg: &LoadAwareConfig,
    pool: &[PodSlot],
    loads: &PodLoads<'_>,
    matches: &[(PodSlot, u32)],
    total_blocks: usize,
    share: f64,
    turn: usize,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    let at = |v: &[u32], pod: PodSlot| v.get(pod.index()).copied().unwrap_or(0);
    let load_of = |pod: PodSlot| at(loads.queue, pod);
    let matched_of = |pod: PodSlot| -> u32 {
        matches
            .iter()
            .filter(|(p, _)| *p == pod)
            .map(|(_, m)| *m)
            .max()
            .unwrap_or(0)
    };
    // Recent requests weighted by slowness: a pod 3x slower carries a
    // request's traffic three times over.
    let sent_of = |pod: PodSlot| -> u64 {
        let slow = match at(loads.slowness, pod) {
            0 => 1000,
            s => u64::from(s),
        };
        u64::from(at(loads.sent, pod)) * slow / 1000
    };
    let min = pool.iter().map(|&p| load_of(p)).min()?;
    let rel = (cfg.slack_rel * f64::from(min))
        .ceil()
        .min(f64::from(u32::MAX)) as u32;
    let bound = min.saturating_add(cfg.slack_abs.max(rel));
    let score = |pod: PodSlot| -> i64 {
        let extra = i64::from(load_of(pod) - min);
        let slow = match at(loads.slowness, pod) {
            0 => 1000,
            s => i64::from(s),
        };
        let cost = extra
            .saturating_mul(i64::from(cfg.queue_cost_blocks))
            .saturating_mul(slow)
            / 1000;
        i64::from(matched_of(pod)) - cost
    };
    // (score, match, -load, -in flight, -sent, -placed) decides; equal
    // keys tie.
    let key = |pod: PodSlot| {
        (
            score(pod),
            matched_of(pod),
            std::cmp::Reverse(load_of(pod)),
            std::cmp::Reverse(at(loads.inflight, pod)),
            std::cmp::Reverse(sent_of(pod)),
            std::cmp::Reverse(at(loads.placed, pod)),
        )
    };
    let eligible = pool.iter().copied().filter(|&p| load_of(p) <= bound);
    let best = eligible.clone().map(key).max()?;
    let mut tied: Vec<PodSlot> = eligible.clone().filter(|&p| key(p) == best).collect();
    let mut pod = if best.1 == 0 {
        tied[turn % tied.len()]
    } else {
        rng.shuffle(&mut tied);
        tied[0]
    };
    let mut matched = best.1;
    let mut spread_now = false;
    let n = pool.len();
    let fair = share * n as f64;
    if matched > 0 && fair >= 0.5 {
        let holds = |p: PodSlot| u64::from(matched_of(p)) * 2 >= u64::from(matched);
        // Holders over the whole pool: one briefly above the bound still
        // holds the prefix, and copying past it would make a third copy.
        let holders = pool.iter().filter(|&&p| holds(p)).count();
        let sent = |p: PodSlot| sent_of(p) * n as u64;
        let total: u64 = pool.iter().map(|&p| sent_of(p)).sum();
        let mut wanted = ((fair * 0.9).ceil() as usize).clamp(1, n);
        if holders == 1 && sent(pod) * 20 > total * 23 {
            wanted = wanted.max(2);
        }
        let copy_to = eligible
            .filter(|&p| !holds(p))
            .min_by_key(|&p| (load_of(p), sent_of(p), at(loads.placed, p)));
        // Only under load: on idle pods a copy is a miss that buys nothing.
        let busier = |c: PodSlot| at(loads.inflight, pod) > at(loads.inflight, c);
        if let Some(c) = copy_to
            .filter(|&c| holders < wanted && busier(c) && sent(c) < sent(pod) && sent(c) < total)
        {
            pod = c;
            matched = matched_of(c);
            spread_now = true;
        }
    }
    let any_match = pool.iter().any(|&p| matched_of(p) > 0);
    let reason = match (matched > 0, any_match) {
        _ if spread_now => Reason::Spread,
        (true, _) => Reason::PrefixMatch,
        (false, true) => Reason::LoadGuard,
        (false, false) => Reason::NoMatch,
    };
    let match_percent = if total_blocks == 0 {
        0
    } else {
        ((u64::from(matched) * 100) / total_blocks as u64).min(100) as u8
    };
    Some(Choice {
        pod,
        reason,
        match_percent,
    })
}

/// Per-pod figures [`choose_load_aware`] weighs, indexed by pod slot
/// (missing = 0).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodLoads<'a> {
    /// Estimated queue ([`effective_load`]).
    pub queue: &'a [u32],
    /// In-flight requests (this VM exact, the others as last exchanged).
    pub inflight: &'a [u32],
    /// New prefixes this VM placed on the pod (recently).
    pub placed: &'a [u32],
    /// Requests this VM sent to the pod (recently).
    pub sent: &'a [u32],
    /// How much one queued request costs on this pod relative to the
    /// fastest pod, in thousandths (missing or 0 = 1000): a pod whose
    /// requests take 3x as long makes each one queued ahead cost 3x.
    pub slowness: &'a [u32],
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
}

/// The policy's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub pod: PodSlot,
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
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Pods by number: test pools and matches are written as bare slots.
    fn p(n: u16) -> PodSlot {
        PodSlot::new(n)
    }

    fn pods(ns: &[u16]) -> Vec<PodSlot> {
        ns.iter().copied().map(p).collect()
    }

    fn ms(matches: &[(u16, u32)]) -> Vec<(PodSlot, u32)> {
        matches.iter().map(|&(n, m)| (p(n), m)).collect()
    }

    const CFG: PolicyConfig = PolicyConfig {
        imbalance_abs_count: 16,
        stddev_factor: 2.0,
    };

    fn run(pool: &[u16], load: &[u32], matches: &[(u16, u32)], total: usize, seed: u64) -> Choice {
        choose(
            &CFG,
            &pods(pool),
            load,
            &ms(matches),
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
                pod: p(1),
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
            (p(1), Reason::PrefixMatch, 100)
        );
    }

    #[test]
    fn equal_match_and_load_ties_are_shuffled() {
        let mut seen = [false; 2];
        for seed in 0..32 {
            let c = run(&[0, 1], &[0, 0], &[(0, 4), (1, 4)], 4, seed);
            seen[c.pod.index()] = true;
        }
        assert_eq!(seen, [true, true]);
    }

    #[test]
    fn no_match_goes_to_least_loaded_and_ties_rotate_evenly() {
        let c = run(&[0, 1, 2], &[2, 0, 1], &[], 4, 1);
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (p(1), Reason::NoMatch, 0)
        );
        // Concurrency 1: every pod idle; consecutive turns place one per pod.
        let mut seen = [0u32; 3];
        for turn in 0..60 {
            seen[run(&[0, 1, 2], &[0, 0, 0], &[], 4, turn).pod.index()] += 1;
        }
        assert_eq!(seen, [20, 20, 20]);
    }

    #[test]
    fn imbalance_sends_to_least_loaded_even_with_a_match() {
        let c = run(&[0, 1, 2], &[20, 3, 4], &[(0, 8)], 8, 1);
        assert_eq!((c.pod, c.reason), (p(1), Reason::LoadGuard));
    }

    #[test]
    fn spread_at_threshold_is_not_imbalance() {
        let c = run(&[0, 1], &[16, 0], &[(0, 8)], 8, 1);
        // spread 16 is not > 16; but pod 0 is above mean + 2 sd? mean 8, sd 8 -> bound 24: taken.
        assert_eq!((c.pod, c.reason), (p(0), Reason::PrefixMatch));
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
            &pods(&[0, 1, 2, 3]),
            &[10, 0, 0, 0],
            &ms(&[(0, 8), (1, 4)]),
            8,
            0,
            &mut SplitMix64::new(3),
        )
        .unwrap();
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (p(1), Reason::PrefixMatch, 50)
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
            &pods(&[0, 1, 2, 3]),
            &[10, 0, 1, 1],
            &ms(&[(0, 8)]),
            8,
            0,
            &mut SplitMix64::new(3),
        )
        .unwrap();
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (p(1), Reason::LoadGuard, 0)
        );
    }

    #[test]
    fn matches_outside_the_pool_are_ignored() {
        let c = run(&[1, 2], &[0, 0, 0], &[(0, 8)], 8, 1);
        assert_eq!(c.reason, Reason::NoMatch);
        assert_ne!(c.pod, p(0));
    }

    #[test]
    fn single_pod_pool_ignores_imbalance() {
        let c = run(&[0], &[100], &[], 1, 1);
        assert_eq!((c.pod, c.reason), (p(0), Reason::NoMatch));
    }

    const LA: LoadAwareConfig = LoadAwareConfig {
        slack_abs: 2,
        slack_rel: 0.5,
        queue_cost_blocks: 4,
        kv_high_permille: 900,
    };

    fn la(pool: &[u16], load: &[u32], matches: &[(u16, u32)], total: usize, turn: usize) -> Choice {
        let loads = PodLoads {
            queue: load,
            inflight: load,
            placed: &[],
            sent: &[],
            slowness: &[],
        };
        choose_load_aware(
            &LA,
            &pods(pool),
            &loads,
            &ms(matches),
            total,
            0.0,
            turn,
            &mut SplitMix64::new(turn as u64),
        )
        .unwrap()
    }

    /// [`choose_load_aware`] with `LA`, turn 0 and a fixed seed.
    fn la_with(
        loads: &PodLoads<'_>,
        pool: &[u16],
        matches: &[(u16, u32)],
        total: usize,
        share: f64,
    ) -> Choice {
        choose_load_aware(
            &LA,
            &pods(pool),
            loads,
            &ms(matches),
            total,
            share,
            0,
            &mut SplitMix64::new(1),
        )
        .unwrap()
    }

    #[test]
    fn load_aware_empty_pool_has_no_choice() {
        let none = choose_load_aware(
            &LA,
            &[],
            &PodLoads::default(),
            &[],
            0,
            0.0,
            0,
            &mut SplitMix64::new(1),
        );
        assert_eq!(none, None);
    }

    #[test]
    fn load_aware_longest_match_wins_among_equally_loaded_pods() {
        let c = la(&[0, 1, 2], &[1, 1, 1], &[(0, 20), (1, 50)], 100, 0);
        assert_eq!(
            c,
            Choice {
                pod: p(1),
                reason: Reason::PrefixMatch,
                match_percent: 50
            }
        );
    }

    #[test]
    fn load_aware_single_hot_pod_of_four_is_excluded_where_mean_plus_2_sigma_keeps_it() {
        // Loads k,0,0,0: AIBrix's bound is mean + 2 sigma ~ 1.12k, so the hot
        // pod always passes it (and k = 12 is under its imbalance guard).
        let load = [12, 0, 0, 0];
        let aibrix = run(&[0, 1, 2, 3], &load, &[(0, 100)], 100, 1);
        assert_eq!((aibrix.pod, aibrix.reason), (p(0), Reason::PrefixMatch));
        // Load-aware: 12 > 0 + max(2, 0) -> out, whatever the match.
        let c = la(&[0, 1, 2, 3], &load, &[(0, 1000)], 1000, 0);
        assert_ne!(c.pod, p(0));
        assert_eq!((c.reason, c.match_percent), (Reason::LoadGuard, 0));
    }

    #[test]
    fn load_aware_works_with_two_pods() {
        // 3 > 0 + 2: out. 2 is within the slack and the match pays for it.
        let out = la(&[0, 1], &[3, 0], &[(0, 100)], 100, 0);
        assert_eq!((out.pod, out.reason), (p(1), Reason::LoadGuard));
        let kept = la(&[0, 1], &[2, 0], &[(0, 100)], 100, 0);
        assert_eq!((kept.pod, kept.reason), (p(0), Reason::PrefixMatch));
    }

    #[test]
    fn load_aware_slack_grows_with_the_least_loaded_pods_load() {
        // min 10: bound 10 + max(2, 5) = 15. 15 stays, 16 is out.
        let pool = [0, 1];
        assert_eq!(la(&pool, &[15, 10], &[(0, 100)], 100, 0).pod, p(0));
        assert_eq!(la(&pool, &[16, 10], &[(0, 100)], 100, 0).pod, p(1));
    }

    #[test]
    fn load_aware_match_worth_less_than_its_queue_cost_goes_to_least_loaded() {
        // 2 extra requests cost 8 blocks: a 6-block match does not pay, a
        // 9-block one does; an 8-block one ties with the idle pod and wins
        // on its match.
        let pool = [0, 1];
        let c = la(&pool, &[2, 0], &[(0, 6)], 100, 0);
        assert_eq!((c.pod, c.reason), (p(1), Reason::LoadGuard));
        assert_eq!(la(&pool, &[2, 0], &[(0, 9)], 100, 0).pod, p(0));
        assert_eq!(la(&pool, &[2, 0], &[(0, 8)], 100, 0).pod, p(0));
    }

    #[test]
    fn load_aware_shorter_match_on_an_idle_pod_beats_a_longer_one_on_a_busy_pod() {
        // Pod 0: 40 blocks at +2 load (score 32); pod 1: 36 blocks at min (36).
        let c = la(&[0, 1, 2], &[2, 0, 0], &[(0, 40), (1, 36)], 40, 0);
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (p(1), Reason::PrefixMatch, 90)
        );
    }

    #[test]
    fn load_aware_no_match_goes_to_least_loaded_and_ties_rotate() {
        let c = la(&[0, 1, 2], &[2, 0, 1], &[], 4, 0);
        assert_eq!((c.pod, c.reason), (p(1), Reason::NoMatch));
        let mut seen = [0u32; 3];
        for turn in 0..30 {
            seen[la(&[0, 1, 2], &[0, 0, 0], &[], 4, turn).pod.index()] += 1;
        }
        assert_eq!(seen, [10, 10, 10]);
    }

    #[test]
    fn load_aware_equal_queues_go_to_fewer_in_flight_before_rotating() {
        // Both pods queue nothing (under capacity); pod 0 has 3 in flight, pod 1 one.
        let loads = PodLoads {
            queue: &[0, 0],
            inflight: &[3, 1],
            placed: &[],
            sent: &[],
            slowness: &[],
        };
        for turn in 0..8 {
            let c = choose_load_aware(
                &LA,
                &pods(&[0, 1]),
                &loads,
                &[],
                4,
                0.0,
                turn,
                &mut SplitMix64::new(1),
            )
            .unwrap();
            assert_eq!(c.pod, p(1));
        }
    }

    #[test]
    fn load_aware_new_prefixes_among_equally_loaded_pods_go_to_the_pod_given_fewest() {
        let loads = PodLoads {
            queue: &[0, 0, 0],
            inflight: &[1, 1, 1],
            placed: &[5, 2, 3],
            sent: &[],
            slowness: &[],
        };
        let c = la_with(&loads, &[0, 1, 2], &[], 4, 0.0);
        assert_eq!((c.pod, c.reason), (p(1), Reason::NoMatch));
    }

    #[test]
    fn load_aware_queue_on_a_slow_pod_costs_in_proportion() {
        // 2 queued on pod 0 cost 8 blocks at 1x: a 10-block match pays. At
        // 1.5x they cost 12 blocks: it does not.
        let mut loads = PodLoads {
            queue: &[2, 0],
            inflight: &[6, 4],
            placed: &[],
            sent: &[],
            slowness: &[1000, 1000],
        };
        let pick = |l: &PodLoads<'_>| la_with(l, &[0, 1], &[(0, 10)], 10, 0.0).pod;
        assert_eq!(pick(&loads), p(0));
        loads.slowness = &[1500, 1000];
        assert_eq!(pick(&loads), p(1));
    }

    #[test]
    fn load_aware_equal_matches_and_loads_are_shuffled() {
        let mut seen = [false; 2];
        for turn in 0..32 {
            seen[la(&[0, 1], &[0, 0], &[(0, 4), (1, 4)], 4, turn).pod.index()] = true;
        }
        assert_eq!(seen, [true, true]);
    }

    #[test]
    fn load_aware_traffic_decides_between_equal_pods_before_placements() {
        let loads = PodLoads {
            queue: &[0, 0, 0],
            inflight: &[0, 0, 0],
            placed: &[1, 9, 9],
            sent: &[40, 10, 30],
            slowness: &[],
        };
        assert_eq!(la_with(&loads, &[0, 1, 2], &[], 4, 0.0).pod, p(1));
    }

    #[test]
    fn load_aware_copies_a_hot_prefix_to_the_least_busy_pod_until_enough_hold_it() {
        let loads = PodLoads {
            queue: &[0, 0, 0],
            inflight: &[2, 1, 1],
            placed: &[],
            sent: &[50, 20, 10],
            slowness: &[],
        };
        let pick = |loads: &PodLoads<'_>, matches: &[(u16, u32)], share| {
            la_with(loads, &[0, 1, 2], matches, 40, share)
        };
        // A small group stays on its holder, busy or not.
        assert_eq!(pick(&loads, &[(0, 40)], 0.1).pod, p(0));
        // More than two pods' worth of traffic on one holder: copied to the
        // least busy pod.
        let c = pick(&loads, &[(0, 40), (1, 4)], 0.7);
        assert_eq!(
            (c.pod, c.reason, c.match_percent),
            (p(2), Reason::Spread, 0)
        );
        // Two holders (at least half the best match each) are enough.
        let c = pick(&loads, &[(0, 40), (2, 20)], 0.7);
        assert_eq!((c.pod, c.reason), (p(0), Reason::PrefixMatch));
        // A big group (a fifth of 3 pods' traffic) on a pod carrying over
        // 1.15x its share is copied once; on an even pod it is not.
        let c = pick(&loads, &[(0, 40)], 0.2);
        assert_eq!((c.pod, c.reason), (p(2), Reason::Spread));
        let even = PodLoads {
            sent: &[30, 25, 25],
            ..loads
        };
        assert_eq!(pick(&even, &[(0, 40)], 0.2).reason, Reason::PrefixMatch);
        // Idle pods: no copy.
        let idle = PodLoads {
            inflight: &[0, 0, 0],
            ..loads
        };
        assert_eq!(pick(&idle, &[(0, 40)], 0.7).reason, Reason::PrefixMatch);
        // A copy only goes to a pod that carried less traffic than the winner.
        let quiet = PodLoads {
            sent: &[5, 20, 10],
            ..loads
        };
        let c = pick(&quiet, &[(0, 40)], 0.9);
        assert_eq!((c.pod, c.reason), (p(0), Reason::PrefixMatch));
    }

    #[test]
    fn load_aware_ignores_matches_outside_the_pool() {
        let c = la(&[1, 2], &[0, 0, 0], &[(0, 8)], 8, 0);
        assert_eq!(c.reason, Reason::NoMatch);
        assert_ne!(c.pod, p(0));
    }

    #[test]
    fn load_aware_never_overflows_on_extreme_loads() {
        let c = la(&[0, 1], &[u32::MAX, u32::MAX - 1], &[(0, u32::MAX)], 1, 0);
        assert_eq!(c.match_percent, 100);
        let cfg = LoadAwareConfig {
            slack_abs: u32::MAX,
            slack_rel: 100.0,
            queue_cost_blocks: u32::MAX,
            kv_high_permille: 0,
        };
        let loads = PodLoads {
            queue: &[u32::MAX, 0],
            inflight: &[u32::MAX, 0],
            placed: &[u32::MAX, 0],
            sent: &[u32::MAX, 0],
            slowness: &[u32::MAX, 0],
        };
        let c = choose_load_aware(
            &cfg,
            &pods(&[0, 1]),
            &loads,
            &ms(&[(0, 1)]),
            1,
            0.0,
            0,
            &mut SplitMix64::new(1),
        )
        .unwrap();
        assert_eq!(c.pod, p(1));
    }

    #[test]
    fn effective_load_is_the_queue_beyond_what_the_pod_runs_at_once() {
        // No signals: every in-flight request counts, capacity unknown.
        assert_eq!(effective_load(3, None, 4, &LA), 3);
        let s = |waiting, running, kv| PodSignals {
            waiting,
            running,
            kv_permille: kv,
        };
        // Other replicas' requests show in what the pod reports: 4 run, 2 wait.
        assert_eq!(effective_load(1, Some(s(2, 4, None)), 4, &LA), 2);
        // Requests sent since the scrape show in the in-flight count.
        assert_eq!(effective_load(7, Some(s(0, 2, Some(100))), 4, &LA), 3);
        // Under its capacity a pod queues nothing.
        assert_eq!(effective_load(3, Some(s(0, 3, None)), 4, &LA), 0);
        // KV at kv_high: slack_abs + 1 more, so it leaves the slack.
        assert_eq!(effective_load(1, Some(s(0, 1, Some(900))), 4, &LA), 3);
        assert_eq!(effective_load(1, Some(s(0, 1, Some(899))), 4, &LA), 0);
    }

    #[test]
    fn zero_blocks_reports_zero_percent() {
        let c = run(&[0], &[0], &[(0, 0)], 0, 1);
        assert_eq!(c.match_percent, 0);
    }
}
