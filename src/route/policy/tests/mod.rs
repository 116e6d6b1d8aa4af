//! AIBrix's rules, one test each (the load-aware policy's: `load_aware`).

use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Pods by number: test pools and matches are written as bare slots.
pub(super) fn p(n: u16) -> PodSlot {
    PodSlot::new(n)
}

pub(super) fn pods(ns: &[u16]) -> Vec<PodSlot> {
    ns.iter().copied().map(p).collect()
}

pub(super) fn ms(matches: &[(u16, u32)]) -> Vec<(PodSlot, u32)> {
    matches.iter().map(|&(n, m)| (p(n), m)).collect()
}

const CFG: PolicyConfig = PolicyConfig {
    imbalance_abs_count: 16,
    stddev_factor: 2.0,
};

pub(super) fn run(
    pool: &[u16],
    load: &[u32],
    matches: &[(u16, u32)],
    total: usize,
    seed: u64,
) -> Choice {
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

#[test]
fn zero_blocks_reports_zero_percent() {
    let c = run(&[0], &[0], &[(0, 0)], 0, 1);
    assert_eq!(c.match_percent, 0);
}

mod load_aware;
