//! The load-aware policy's rules, one test each.

use super::{ms, p, pods, run};
use crate::route::policy::*;
use crate::signals::PodSignals;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The tests describe pods by slices indexed by slot (missing = 0), as
/// tables read; [`view`] turns them into the policy's [`PoolView`].
#[derive(Debug, Clone, Copy, Default)]
struct PodLoads<'a> {
    queue: &'a [u32],
    inflight: &'a [u32],
    placed: &'a [u32],
    sent: &'a [u32],
    slowness: &'a [u32],
    place_by_count: bool,
    age: &'a [u64],
}

fn view(
    pool: &[PodSlot],
    loads: &PodLoads<'_>,
    matches: &[(PodSlot, u32)],
    total_blocks: usize,
) -> PoolView {
    let at = |v: &[u32], p: PodSlot| v.get(p.index()).copied().unwrap_or(0);
    PoolView {
        pods: pool
            .iter()
            .map(|&pod| PodView {
                pod,
                matched: matches
                    .iter()
                    .filter(|m| m.0 == pod)
                    .map(|m| m.1)
                    .max()
                    .unwrap_or(0),
                queue: at(loads.queue, pod),
                inflight: at(loads.inflight, pod),
                placed: at(loads.placed, pod),
                sent: at(loads.sent, pod),
                slowness: at(loads.slowness, pod),
                age: loads.age.get(pod.index()).copied().unwrap_or(0),
            })
            .collect(),
        total_blocks,
        place_by_count: loads.place_by_count,
    }
}

/// [`super::placement_candidates`] over the [`view`] of slices.
fn placement_candidates(
    cfg: &LoadAwareConfig,
    pool: &[PodSlot],
    loads: &PodLoads<'_>,
    matches: &[(PodSlot, u32)],
    total: usize,
) -> Vec<(PodSlot, i64, i64)> {
    super::placement_candidates(cfg, &view(pool, loads, matches, total))
}

const LA: LoadAwareConfig = LoadAwareConfig {
    slack_abs: 2,
    slack_rel: 0.5,
    queue_cost_blocks: 4,
};

fn la(pool: &[u16], load: &[u32], matches: &[(u16, u32)], total: usize, turn: usize) -> Choice {
    let loads = PodLoads {
        queue: load,
        inflight: load,
        ..PodLoads::default()
    };
    choose_load_aware(
        &LA,
        &view(&pods(pool), &loads, &ms(matches), total),
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
        &view(&pods(pool), loads, &ms(matches), total),
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
        &view(&[], &PodLoads::default(), &[], 0),
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
        ..PodLoads::default()
    };
    for turn in 0..8 {
        let c = choose_load_aware(
            &LA,
            &view(&pods(&[0, 1]), &loads, &[], 4),
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
        ..PodLoads::default()
    };
    let c = la_with(&loads, &[0, 1, 2], &[], 4, 0.0);
    assert_eq!((c.pod, c.reason), (p(1), Reason::NoMatch));
}

/// While a pod reports itself slow, the new prefixes it does not take are
/// shared by count among the others, before their in-flight counts.
#[test]
fn place_by_count_puts_placed_before_in_flight_for_new_prefixes_only() {
    let mut loads = PodLoads {
        queue: &[0, 0, 0],
        inflight: &[0, 2, 2],
        placed: &[6, 2, 3],
        ..PodLoads::default()
    };
    assert_eq!(la_with(&loads, &[0, 1, 2], &[], 4, 0.0).pod, p(0));
    loads.place_by_count = true;
    assert_eq!(la_with(&loads, &[0, 1, 2], &[], 4, 0.0).pod, p(1));
    // A match still comes first, and among matched pods placed counts last.
    let c = la_with(&loads, &[0, 1, 2], &[(0, 3), (2, 3)], 4, 0.0);
    assert_eq!((c.pod, c.reason), (p(0), Reason::PrefixMatch));
}

/// The last tie for a new prompt: among unmatched pods alike in
/// everything else, the one whose requests in flight were sent longest
/// ago (it frees a slot first), whatever the rotation. Holders of a match
/// stay shuffled.
#[test]
fn the_last_tie_for_a_new_prompt_goes_to_the_pod_whose_requests_are_oldest() {
    let mut loads = PodLoads {
        queue: &[0, 0, 0],
        inflight: &[1, 1, 1],
        placed: &[2, 2, 2],
        sent: &[4, 4, 4],
        age: &[3, 9, 5],
        ..PodLoads::default()
    };
    let mut holders = std::collections::BTreeSet::new();
    for turn in 0..12 {
        let mut rng = SplitMix64::new(turn as u64);
        let mut pick = |l: &PodLoads<'_>, m: &[(u16, u32)]| {
            choose_load_aware(
                &LA,
                &view(&pods(&[0, 1, 2]), l, &ms(m), 4),
                0.0,
                turn,
                &mut rng,
            )
            .unwrap()
            .pod
        };
        assert_eq!(pick(&loads, &[]), p(1));
        holders.insert(pick(&loads, &[(0, 3), (2, 3)]));
    }
    assert_eq!(holders.into_iter().collect::<Vec<_>>(), vec![p(0), p(2)]);
    // It is the last: fewer in flight, sent or placed come first.
    loads.sent = &[4, 5, 4];
    assert_eq!(la_with(&loads, &[0, 1, 2], &[], 4, 0.0).pod, p(2));
}

#[test]
fn load_aware_queue_on_a_slow_pod_costs_in_proportion() {
    // 2 queued on pod 0 cost 8 blocks at 1x: a 10-block match pays. At
    // 1.5x they cost 12 blocks: it does not.
    let mut loads = PodLoads {
        queue: &[2, 0],
        inflight: &[6, 4],
        slowness: &[1000, 1000],
        ..PodLoads::default()
    };
    let pick = |l: &PodLoads<'_>| la_with(l, &[0, 1], &[(0, 10)], 10, 0.0).pod;
    assert_eq!(pick(&loads), p(0));
    loads.slowness = &[1500, 1000];
    assert_eq!(pick(&loads), p(1));
}

#[test]
fn load_aware_misses_go_to_fast_pods_and_slow_pods_keep_what_they_hold() {
    // Pod 0's hits take 3x as long. A miss there costs 3x the prefill: a
    // fast pod takes it, even one given more requests... unless the fast
    // pod's queue costs more than the difference.
    let mut loads = PodLoads {
        queue: &[0, 0],
        inflight: &[0, 0],
        placed: &[0, 5],
        sent: &[0, 5],
        slowness: &[3000, 1000],
        ..PodLoads::default()
    };
    // A slack wide enough that the bound never decides here.
    let cfg = LoadAwareConfig {
        slack_abs: 20,
        ..LA
    };
    let pick = |l: &PodLoads<'_>, m: &[(u16, u32)]| {
        let mut rng = SplitMix64::new(1);
        choose_load_aware(&cfg, &view(&pods(&[0, 1]), l, &ms(m), 20), 0.0, 0, &mut rng)
            .unwrap()
            .pod
    };
    assert_eq!(pick(&loads, &[]), p(1));
    // 20 uncached blocks: 60 on pod 0; on pod 1 20 + 4 x 4 = 36 with 4
    // queued, 20 + 11 x 4 = 64 with 11.
    loads.queue = &[0, 4];
    assert_eq!(pick(&loads, &[]), p(1));
    loads.queue = &[0, 11];
    assert_eq!(pick(&loads, &[]), p(0));
    // A prefix the slow pod holds (19 of 20 blocks: 3 to finish there
    // against 20 on an idle fast pod) stays there; a short one (10 of 20:
    // 30 against 20) does not.
    loads.queue = &[0, 0];
    assert_eq!(pick(&loads, &[(0, 19)]), p(0));
    assert_eq!(pick(&loads, &[(0, 10)]), p(1));
    // Below 1.5x, pods prefill alike: the miss goes by traffic (pod 0,
    // given fewer), not by the measured 1.4x.
    loads.slowness = &[1400, 1000];
    assert_eq!(pick(&loads, &[]), p(0));
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
        ..PodLoads::default()
    };
    assert_eq!(la_with(&loads, &[0, 1, 2], &[], 4, 0.0).pod, p(1));
}

#[test]
fn load_aware_copies_a_hot_prefix_to_the_least_busy_pod_until_enough_hold_it() {
    let loads = PodLoads {
        queue: &[0, 0, 0],
        inflight: &[2, 1, 1],
        sent: &[50, 20, 10],
        ..PodLoads::default()
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
    // Two holders (at least half the best match each) are enough while
    // the winner carries at most 1.15x its share of the traffic...
    let fair = PodLoads {
        sent: &[30, 30, 20],
        ..loads
    };
    let c = pick(&fair, &[(0, 40), (2, 20)], 0.7);
    assert_eq!((c.pod, c.reason), (p(0), Reason::PrefixMatch));
    // ... and when it carries more, one more pod takes a copy, as long as
    // the group is worth half a pod's share per holder.
    let c = pick(&loads, &[(0, 40), (2, 20)], 0.7);
    assert_eq!((c.pod, c.reason), (p(1), Reason::Spread));
    let c = pick(&loads, &[(0, 40), (2, 20)], 0.3);
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
    let all = u32::MAX as usize;
    let c = la(&[0, 1], &[u32::MAX, u32::MAX - 1], &[(0, u32::MAX)], all, 0);
    assert_eq!(c.match_percent, 100);
    let cfg = LoadAwareConfig {
        slack_abs: u32::MAX,
        slack_rel: 100.0,
        queue_cost_blocks: u32::MAX,
    };
    let loads = PodLoads {
        queue: &[u32::MAX, 0],
        inflight: &[u32::MAX, 0],
        placed: &[u32::MAX, 0],
        sent: &[u32::MAX, 0],
        slowness: &[u32::MAX, 0],
        ..PodLoads::default()
    };
    let c = choose_load_aware(
        &cfg,
        &view(&pods(&[0, 1]), &loads, &ms(&[(0, 1)]), 1),
        0.0,
        0,
        &mut SplitMix64::new(1),
    )
    .unwrap();
    assert_eq!(c.pod, p(1));
}

#[test]
fn effective_load_is_the_queue_beyond_what_the_pod_runs_at_once() {
    // No report: every in-flight request this VM knows of counts (the
    // other replicas' too), capacity unknown.
    assert_eq!(effective_load(1, 3, None, 4), 3);
    let seen = |waiting, running, foreign| Seen {
        signals: PodSignals {
            waiting,
            running,
            token_us: None,
        },
        foreign,
    };
    // Someone else's requests show in the report: 4 run, 2 wait, 5 of
    // them not this replica's.
    assert_eq!(effective_load(1, 1, Some(seen(2, 4, 5)), 4), 2);
    // Requests sent since the report show in the in-flight count.
    assert_eq!(effective_load(7, 7, Some(seen(0, 2, 0)), 4), 3);
    // This replica's requests that ended since the report do not count:
    // the pod reported 6, all ours, and we have 1 left.
    assert_eq!(effective_load(1, 1, Some(seen(2, 4, 0)), 4), 0);
    // The report replaces the other replicas' synced counts (fleet).
    assert_eq!(effective_load(2, 9, Some(seen(0, 3, 1)), 4), 0);
    // Under its capacity a pod queues nothing.
    assert_eq!(effective_load(3, 3, Some(seen(0, 3, 0)), 4), 0);
    // A full KV cache adds nothing: only the queue counts.
    assert_eq!(effective_load(1, 1, Some(seen(0, 1, 0)), 4), 0);
}

#[test]
fn placement_candidates_are_the_pods_within_the_bound_in_the_policys_order() {
    // Least load 1: bound 1 + max(2, ceil(0.5)) = 3; pod 3 (load 5) is out.
    let queue = [3, 1, 2, 5];
    let slowness = [0, 3000, 1200, 0];
    let loads = PodLoads {
        queue: &queue,
        inflight: &queue,
        slowness: &slowness,
        ..PodLoads::default()
    };
    let c = placement_candidates(&LA, &pods(&[0, 1, 2, 3]), &loads, &[], 10);
    let got: Vec<(usize, i64, i64)> = c.iter().map(|&(q, c, s)| (q.index(), c, s)).collect();
    // In the policy's order: its cost is 10 blocks of prefill (x3 on pod
    // 1, 3x slower; 1.2x counts as alike) plus 4 blocks per request above
    // the least load, times the pod's slowness: pod 2 10 + 4 x 1.2 = 14,
    // pod 0 10 + 8 = 18, pod 1 30. Each comes with its prefill alone, and
    // what a request more adds (4 blocks x slowness).
    assert_eq!(got, vec![(2, 10, 4), (0, 10, 4), (1, 30, 12)]);
    // The order is the policy's: its pick first.
    let choice = la_with(&loads, &[0, 1, 2, 3], &[], 10, 0.0);
    assert_eq!(choice.pod, c[0].0);
    assert!(placement_candidates(&LA, &[], &loads, &[], 10).is_empty());
}
