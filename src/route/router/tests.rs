//! Routing decisions end to end over an in-memory store.

use super::*;
use crate::route::policy::Reason;
use crate::route::request::PromptRequest;
use crate::shared::store::MemStore;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A router over pods p:1..p:3, 4-byte blocks, and `extra` settings.
pub(crate) fn router(extra: &str) -> Router {
    let cfg = format!(r#"{{"endpoints":["p:1","p:2","p:3"],"block_size":4{extra}}}"#);
    Router::new(Settings::from_json(cfg.as_bytes()).unwrap())
}

/// A request for model `m`.
pub(crate) fn req(prompt: &str) -> PromptRequest {
    PromptRequest {
        model: "m".into(),
        prompt: prompt.as_bytes().to_vec(),
        stream: false,
    }
}

#[test]
fn sampled_positions_dense_then_sparse_then_last() {
    assert_eq!(sampled_positions(0, 32), Vec::<usize>::new());
    assert_eq!(sampled_positions(5, 32), vec![0, 1, 2, 3, 4]);
    let p = sampled_positions(3200, 32);
    assert!(p.len() < 100, "{}", p.len());
    assert_eq!(&p[..32], &(0..32).collect::<Vec<_>>()[..]);
    assert_eq!(*p.last().unwrap(), 3199);
    assert!(p.windows(2).all(|w| w[0] < w[1]));
    // Positions do not depend on prompt length, apart from the last one:
    // a longer prompt probes the positions a shorter one recorded.
    let short = sampled_positions(1000, 32);
    assert!(short[..short.len() - 1].iter().all(|i| p.contains(i)));
    assert_eq!(sampled_positions(10, usize::MAX).len(), 10);
}

#[test]
fn repeat_request_matches_fully_on_same_pod() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(1);
    let p = "abcd".repeat(300);
    let first = r.route(&s, &req(&p), 100, &mut rng).unwrap();
    assert_eq!(first.choice.reason, Reason::NoMatch);
    r.release(&s, first.ticket, first.is_hit(), 0);
    let second = r.route(&s, &req(&p), 101, &mut rng).unwrap();
    assert_eq!(second.choice.reason, Reason::PrefixMatch);
    assert_eq!(second.choice.pod, first.choice.pod);
    assert_eq!(second.choice.match_percent, 100);
}

#[test]
fn fresh_matched_prefix_is_not_rewritten_until_touch_interval() {
    let s = MemStore::new();
    let r = router(r#","table_idle_expiry_secs":400"#); // touch interval 60 s
    let mut rng = SplitMix64::new(1);
    let prefix = "p".repeat(4 * 100);
    let a = r
        .route(&s, &req(&format!("{prefix}aaaa")), 1000, &mut rng)
        .unwrap();
    r.release(&s, a.ticket, a.is_hit(), 0);
    assert_eq!(a.recorded.len(), sampled_positions(101, 32).len());
    // Same prefix, new tail, 30 s later: only the new last block is new;
    // the held blocks of its segment (positions 63..=100) are written with
    // it, in the same bucket, and nothing before them.
    let b = r
        .route(&s, &req(&format!("{prefix}bbbb")), 1030, &mut rng)
        .unwrap();
    r.release(&s, b.ticket, b.is_hit(), 0);
    assert_eq!(b.choice.pod, a.choice.pod);
    let hashes = r.hasher.hash(format!("{prefix}bbbb").as_bytes());
    let segment = crate::route::table::Layout::Segments.anchor_position(100, 32);
    assert_eq!(segment, 63);
    let want: Vec<u64> = sampled_positions(101, 32)
        .into_iter()
        .filter(|&i| i >= segment)
        .map(|i| hashes[i])
        .collect();
    assert_eq!(want.len(), 6);
    assert_eq!(b.recorded.iter().map(|(h, _)| *h).collect::<Vec<_>>(), want);
    assert!(
        b.recorded.iter().all(|(_, a)| *a == b.recorded[0].1),
        "one bucket"
    );
    // Past the touch interval the whole prefix is refreshed.
    let c = r
        .route(&s, &req(&format!("{prefix}cccc")), 1100, &mut rng)
        .unwrap();
    assert_eq!(c.recorded.len(), a.recorded.len());
    // 96 of 101 blocks: the match is known to the sampled position below its end.
    assert_eq!(c.choice.match_percent, 95);
}

#[test]
fn unique_tails_do_not_evict_the_shared_prefix_they_follow() {
    let s = MemStore::new();
    // One pod: a single hot group would otherwise be copied to every pod.
    let cfg = r#"{"endpoints":["p:1"],"block_size":4}"#;
    let r = Router::new(Settings::from_json(cfg.as_bytes()).unwrap());
    let mut rng = SplitMix64::new(1);
    let prefix = "p".repeat(4 * 100);
    // 400 questions over 40 s, within the touch interval: each adds its
    // tail's blocks to the bucket of the prefix's last segment (positions
    // 63.., 64 records). Were the prefix's records there older than the
    // tails, the bucket's LRU would evict them and the match would fall
    // back to position 62 until a request wrote them again.
    let mut short = Vec::new();
    for q in 0..400 {
        let x = r
            .route(
                &s,
                &req(&format!("{prefix}{q:08}")),
                1000 + q / 10,
                &mut rng,
            )
            .unwrap();
        r.release(&s, x.ticket, x.is_hit(), 0);
        if q > 0 && x.choice.match_percent < 90 {
            short.push((q, x.choice.match_percent));
        }
    }
    assert!(short.is_empty(), "matches cut short: {short:?}");
}

#[test]
fn shared_prefix_matches_partially_and_sticks() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(7);
    let prefix = "x".repeat(4 * 200);
    let a = r
        .route(
            &s,
            &req(&format!("{prefix}{}", "a".repeat(800))),
            100,
            &mut rng,
        )
        .unwrap();
    r.release(&s, a.ticket, a.is_hit(), 0);
    let b = r
        .route(
            &s,
            &req(&format!("{prefix}{}", "b".repeat(800))),
            101,
            &mut rng,
        )
        .unwrap();
    assert_eq!(b.choice.pod, a.choice.pod);
    assert_eq!(b.choice.reason, Reason::PrefixMatch);
    // True match is 50 %; sampling may undercount by at most 1/8 of the length.
    assert!(
        (43..=50).contains(&b.choice.match_percent),
        "{}",
        b.choice.match_percent
    );
}

#[test]
fn reads_grow_logarithmically_with_prompt_length() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(1);
    for blocks in [100usize, 10_000] {
        let p = "q".repeat(4 * blocks);
        let a = r.route(&s, &req(&p), 100, &mut rng).unwrap();
        r.release(&s, a.ticket, a.is_hit(), 0);
        let b = r.route(&s, &req(&p), 100, &mut rng).unwrap();
        assert!(b.probes <= 20, "{blocks} blocks took {} probes", b.probes);
        assert!(
            b.recorded.len() <= 120,
            "{blocks} blocks recorded {}",
            b.recorded.len()
        );
    }
}

#[test]
fn in_flight_is_counted_and_released() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(1);
    let a = r.route(&s, &req("hello world!"), 100, &mut rng).unwrap();
    assert_eq!(r.refresh_load(&s, 1000).unwrap().iter().sum::<u32>(), 1);
    assert_eq!(r.release(&s, a.ticket, a.is_hit(), 0), 0);
    assert_eq!(r.refresh_load(&s, 1250).unwrap().iter().sum::<u32>(), 0);
}

#[test]
fn different_models_do_not_share_prefixes() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(1);
    let p = "z".repeat(400);
    r.route(&s, &req(&p), 100, &mut rng).unwrap();
    let other = PromptRequest {
        model: "other".into(),
        prompt: p.into_bytes(),
        stream: false,
    };
    assert_eq!(
        r.route(&s, &other, 100, &mut rng).unwrap().choice.reason,
        Reason::NoMatch
    );
}

#[test]
fn model_pool_restricts_choice() {
    let cfg = r#"{"endpoints":["p:1"],"model_endpoints":{"m":["p:2","p:3"]}}"#;
    let r = Router::new(Settings::from_json(cfg.as_bytes()).unwrap());
    let s = MemStore::new();
    let mut rng = SplitMix64::new(1);
    for _ in 0..20 {
        let a = r.route(&s, &req("abc"), 100, &mut rng).unwrap();
        assert_ne!(r.fleet().address(a.choice.pod), Some("p:1"));
    }
}

#[test]
fn cluster_pools_route_over_published_members_before_the_first_tick() {
    let r = Router::new(Settings::from_json(br#"{"cluster":"pods"}"#).unwrap());
    let s = MemStore::new();
    let mut rng = SplitMix64::new(1);
    // Nothing published yet: pass through (no endpoints), never a panic.
    assert_eq!(
        r.route(&s, &req("abcd"), 100, &mut rng),
        Err(RouteError::NoEndpoints)
    );
    let hosts = std::collections::BTreeMap::from([(
        String::new(),
        vec![crate::fleet::membership::Host {
            name: "pod-a".into(),
            address: "10.0.0.1:80".into(),
            healthy: true,
        }],
    )]);
    let members = crate::fleet::cluster_members(&s, &hosts, 100, 1000).unwrap();
    s.set(fleet::MEMBERS_KEY, &members.encode(), None).unwrap();
    let a = r.route(&s, &req("abcd"), 100, &mut rng).unwrap();
    assert_eq!(r.fleet().address(a.choice.pod), Some("10.0.0.1:80"));
}

#[test]
fn store_failure_is_an_error_not_a_panic() {
    struct Broken;
    impl SharedStore for Broken {
        fn get(&self, key: &str) -> Result<crate::shared::store::Versioned, StoreError> {
            Err(StoreError::Host {
                key: key.into(),
                status: "down".into(),
            })
        }
        fn set(&self, key: &str, _: &[u8], _: Option<u32>) -> Result<(), StoreError> {
            Err(StoreError::Host {
                key: key.into(),
                status: "down".into(),
            })
        }
    }
    let r = router("");
    assert!(matches!(
        r.route(&Broken, &req("abcdefgh"), 1, &mut SplitMix64::new(1)),
        Err(RouteError::Store(_))
    ));
}

#[test]
fn demand_is_a_groups_share_of_two_windows_and_forgets_older_ones() {
    let mut d = Demand::default();
    let (hot, cold) = ((0, 1), (0, 2));
    let mut last = None;
    for i in 0..DEMAND_WINDOW * 2 {
        let g = if i % 10 < 3 { hot } else { cold };
        let share = d.count(g);
        if i + 1 < DEMAND_MIN {
            assert_eq!(share, None, "too few requests at {i}");
        }
        if g == hot {
            last = share;
        }
    }
    let share = last.unwrap();
    assert!((share - 0.3).abs() < 0.02, "{share}");
    // Two windows without it: the group is forgotten.
    for _ in 0..DEMAND_WINDOW * 2 {
        d.count(cold);
    }
    let share = d.count(hot).unwrap();
    assert!(share < 0.01, "{share}");
}

#[test]
fn a_prefix_with_more_traffic_than_one_pod_is_copied_to_a_second_pod() {
    let s = MemStore::new();
    let cfg = r#"{"endpoints":["p:1","p:2","p:3","p:4"],"block_size":4}"#;
    let r = Router::new(Settings::from_json(cfg.as_bytes()).unwrap());
    let mut rng = SplitMix64::new(5);
    let hot = format!("{}{}", "h".repeat(4 * 60), "q");
    let mut hot_on = std::collections::BTreeSet::new();
    let mut per_pod = [0u32; 4];
    let mut in_flight = std::collections::VecDeque::new();
    let mut spread = 0;
    for i in 0..400u32 {
        // 40 % hot, the rest spread over 60 cold tenants.
        let prompt = if i % 5 < 2 {
            hot.clone()
        } else {
            format!("{:04}{}", i % 60, "c".repeat(4 * 20))
        };
        let x = r.route(&s, &req(&prompt), 1000 + i / 50, &mut rng).unwrap();
        // Under load: the last 8 requests are still in flight.
        in_flight.push_back(x.ticket);
        if in_flight.len() > 8 {
            let ticket = in_flight.pop_front().unwrap();
            r.release(&s, ticket, false, 0);
        }
        per_pod[x.choice.pod.index()] += 1;
        if prompt == hot {
            hot_on.insert(x.choice.pod);
            spread += u32::from(x.choice.reason == Reason::Spread);
        }
    }
    // 40 % of 4 pods' traffic needs 2 of them (ceil(0.9 x 1.6)): copied
    // once; the holders then take it by their traffic. Without the copy
    // its pod would carry 160 + 60 of 400 requests (max/min 3.7).
    assert_eq!((hot_on.len(), spread), (2, 1), "{hot_on:?} {per_pod:?}");
    let (lo, hi) = (per_pod.iter().min().unwrap(), per_pod.iter().max().unwrap());
    assert!(f64::from(*hi) / f64::from(*lo) <= 1.5, "{per_pod:?}");
}

/// A new tail rewrites the held blocks of the segment it starts in, and
/// none of the dense segments before it (each would cost a read of its
/// bucket): 48 held blocks, 16 new ones; the tail starts in the segment
/// of positions 32..=62 (anchored at block 15), the last block is its own.
#[test]
fn a_new_tail_rewrites_only_its_own_segments_held_blocks() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(1);
    let prefix = "p".repeat(4 * 48);
    let a = r
        .route(
            &s,
            &req(&format!("{prefix}{}", "a".repeat(64))),
            100,
            &mut rng,
        )
        .unwrap();
    r.release(&s, a.ticket, a.is_hit(), 0);
    let prompt = format!("{prefix}{}", "b".repeat(64));
    let b = r.route(&s, &req(&prompt), 101, &mut rng).unwrap();
    assert_eq!(b.choice.pod, a.choice.pod);
    let hashes = r.hasher.hash(prompt.as_bytes());
    let want: Vec<u64> = sampled_positions(64, 32)
        .into_iter()
        .filter(|&i| i >= 32)
        .map(|i| hashes[i])
        .collect();
    assert_eq!(want.len(), 8);
    assert_eq!(b.recorded.iter().map(|(h, _)| *h).collect::<Vec<_>>(), want);
}

/// Other replicas' in-flight counts from the last sync (up to a period
/// old) break ties only for pods without a fresh report: a reported pod's
/// other-replica load is already in its queue, as of the report.
#[test]
fn a_fresh_report_replaces_the_other_replicas_synced_counts_in_ties() {
    let chosen = |signals: bool| -> Vec<usize> {
        let r = router(r#","sync":{"enabled":true},"signals":{"enabled":true,"cluster":"pods"}"#);
        let s = MemStore::new();
        let mut rng = SplitMix64::new(3);
        let warm = r.route(&s, &req("warm-up!"), 1, &mut rng).unwrap();
        r.release(&s, warm.ticket, warm.is_hit(), 1_000);
        // The other replicas had 6 in flight on the second pod at the last
        // sync; with `signals`, every pod reported idle since.
        crate::route::load::set_remote(&s, &[0, 6, 0]).unwrap();
        r.refresh_load(&s, 1_000).unwrap();
        let records: Vec<crate::signals::Record> = (0..3)
            .map(|i| crate::signals::Record {
                slot: PodSlot::new(i),
                at_ms: 1_000,
                signals: crate::signals::PodSignals {
                    waiting: 0,
                    running: 0,
                    token_us: None,
                },
            })
            .collect();
        if signals {
            r.set_signals(&crate::signals::encode(&records), 1_000, 10_000);
        }
        (0..6)
            .map(|i| {
                let x = r
                    .route(&s, &req(&format!("{i}{i}{i}{i} new prefix")), 1, &mut rng)
                    .unwrap();
                r.release(&s, x.ticket, x.is_hit(), 1_000);
                x.choice.pod.index()
            })
            .collect()
    };
    let reported = chosen(true);
    assert!(reported.contains(&1), "{reported:?}");
    let unreported = chosen(false);
    assert!(!unreported.contains(&1), "{unreported:?}");
}

/// Pods' own time per output token gives their slowness to every VM at
/// once; it raises, never lowers, what this VM timed of its hits, and
/// needs two pods reporting; from three, the reference is the second
/// fastest.
/// This VM's hit timing where each `(pod, ms)` started
/// [`PodLatency::MIN_SAMPLES`] hits at 0 that all ended at `ms` (on a
/// tick: a multiple of 250 ms).
fn hits_ending(ends: &[(u16, u64)]) -> PodLatency {
    let mut hits = PodLatency::default();
    hits.tick(&[], 0);
    for _ in 0..PodLatency::MIN_SAMPLES {
        ends.iter()
            .for_each(|&(pod, _)| hits.started_hit(PodSlot::new(pod)));
    }
    let mut times: Vec<u64> = ends.iter().map(|&(_, ms)| ms).collect();
    times.sort_unstable();
    times.dedup();
    for t in times {
        hits.tick(&[], t);
        for &(pod, _) in ends.iter().filter(|&&(_, ms)| ms == t) {
            for _ in 0..PodLatency::MIN_SAMPLES {
                hits.completed(PodSlot::new(pod), true);
            }
        }
    }
    hits
}

#[test]
fn reported_token_latency_sets_slowness_and_flags_a_slow_pod() {
    use crate::signals::{encode, PodSignals, Record, SignalView};
    let view = |us: &[Option<u32>]| {
        let records: Vec<Record> = us
            .iter()
            .enumerate()
            .map(|(i, &token_us)| Record {
                slot: PodSlot::new(i as u16),
                at_ms: 1_000,
                signals: PodSignals {
                    token_us,
                    ..PodSignals::default()
                },
            })
            .collect();
        SignalView::from_published(&encode(&records), 1_000, 10_000)
    };
    let pool: Vec<PodSlot> = (0..3).map(PodSlot::new).collect();
    let none = PodLatency::default();
    let reported = |us: &[Option<u32>]| super::speed::slowness(&none, &view(us), &[], &pool);
    assert_eq!(reported(&[None, None, None]), (vec![], false));
    // One pod reporting: nothing to compare with.
    assert_eq!(reported(&[Some(9_000), None, None]), (vec![], false));
    assert_eq!(
        reported(&[Some(3_000), Some(9_000), Some(3_300)]),
        (vec![1000, 2727, 1000], true)
    );
    // From three pods on, each is compared with the second fastest: one
    // pod read far too fast does not make the others slow.
    assert_eq!(
        reported(&[Some(1_000), Some(3_000), Some(3_300)]),
        (vec![1000, 1000, 1100], false)
    );
    // Within 1.5x: slower, not slow.
    assert_eq!(
        reported(&[Some(3_000), Some(4_000), None]),
        (vec![1000, 1333, 0], false)
    );
    // This VM's hits say pod 0 is twice as slow as pod 2: the higher wins.
    let hits = hits_ending(&[(0, 500), (2, 250)]);
    assert_eq!(
        super::speed::slowness(
            &hits,
            &view(&[Some(3_000), Some(9_000), Some(3_000)]),
            &[],
            &pool
        ),
        (vec![2000, 3000, 1000], true)
    );
    // Pod 2's prefill timing says 2.5x: it reads slow too (the prefill
    // figure only comes where it is at least 1.5x).
    assert_eq!(
        super::speed::slowness(
            &hits,
            &view(&[Some(3_000), Some(9_000), Some(3_000)]),
            &[0, 0, 2500],
            &pool
        ),
        (vec![2000, 3000, 2500], true)
    );
    // Alone it counts as slow as a report does.
    assert_eq!(
        super::speed::slowness(&none, &view(&[None, None, None]), &[0, 2500], &pool),
        (vec![0, 2500, 0], true)
    );
    // Three pods timed: against the second fastest too. Pod 0's hits read
    // half the others' (by chance, on the tick): the others are not slow.
    let hits = hits_ending(&[(0, 250), (1, 500), (2, 500)]);
    assert_eq!(
        super::speed::slowness(&hits, &view(&[None, None, None]), &[], &pool),
        (vec![1000, 1000, 1000], false)
    );
}

/// Among pods with as many of this VM's requests in flight, a new prompt
/// goes to the one whose requests were sent longest ago: it frees a slot
/// first (three independent replicas balancing by their own counts read
/// a TTFT p99 1.14-1.37x one Envoy's with the rotation deciding instead,
/// see policy-notes).
#[test]
fn a_new_prompt_goes_where_the_requests_in_flight_are_oldest() {
    for seed in 0..12 {
        let s = MemStore::new();
        let r = router("");
        let mut rng = SplitMix64::new(seed);
        let mut go = |i: u32| {
            let prompt = format!("{i:04}{}", "x".repeat(40));
            r.route(&s, &req(&prompt), 100, &mut rng).unwrap()
        };
        // One on each pod, then a fourth: a's pod has the oldest.
        let a = go(0);
        let b = go(1);
        let c = go(2);
        let d = go(3);
        assert_eq!(d.choice.pod, a.choice.pod, "seed {seed}");
        // a ends: its pod holds d, the youngest; b's is now the oldest.
        r.release(&s, a.ticket, false, 100_000);
        let e = go(4);
        assert_eq!(e.choice.pod, b.choice.pod, "seed {seed}");
        assert_ne!(c.choice.pod, b.choice.pod);
    }
}

/// Two worker VMs of one replica on `s`, each having seen the other on a
/// tick at 1,000 ms.
fn two_vms(s: &MemStore) -> (Router, Router) {
    let a = router("").with_vm_token(1);
    let b = router("").with_vm_token(2);
    for vm in [&a, &b, &a] {
        vm.refresh_load(s, 1_000).unwrap();
    }
    assert!(a.other_vms_live() && b.other_vms_live());
    (a, b)
}

/// The `i`-th of distinct new prompts.
fn new_prompt(i: u32) -> PromptRequest {
    req(&format!("{i:04}{}", "x".repeat(40)))
}

#[test]
fn with_two_worker_vms_a_new_prompt_goes_where_the_replicas_requests_are_oldest() {
    for seed in 0..12 {
        let s = MemStore::new();
        let (a, b) = two_vms(&s);
        let mut rng = SplitMix64::new(seed);
        // A sends one new prompt to each pod, 100 ms apart.
        let sent: Vec<PodSlot> = (0..3)
            .map(|i| {
                let t = 1_000 + 100 * u64::from(i);
                a.route_at(&s, &new_prompt(i), t, &mut rng)
                    .unwrap()
                    .choice
                    .pod
            })
            .collect();
        // B has sent nothing: in flight, sent and placed counts tie, and A's
        // first pod holds the replica's oldest request.
        let next = b.route_at(&s, &new_prompt(3), 1_400, &mut rng).unwrap();
        assert_eq!(next.choice.pod, sent[0], "seed {seed}");
    }
}

#[test]
fn with_two_worker_vms_a_new_prompt_goes_where_the_replica_sent_fewest() {
    for seed in 0..12 {
        let s = MemStore::new();
        let (a, b) = two_vms(&s);
        let mut rng = SplitMix64::new(seed);
        // A sends two new prompts, each done at once: nothing in flight.
        let mut used = Vec::new();
        for i in 0..2 {
            let x = a.route_at(&s, &new_prompt(i), 1_000, &mut rng).unwrap();
            a.release(&s, x.ticket, false, 1_000);
            used.push(x.choice.pod);
        }
        assert_ne!(used[0], used[1], "seed {seed}");
        // B has sent nothing itself; the replica sent nothing to the third.
        let next = b.route_at(&s, &new_prompt(2), 1_100, &mut rng).unwrap();
        assert!(!used.contains(&next.choice.pod), "seed {seed}");
    }
}

#[test]
fn only_a_new_prompt_asks_and_a_forced_pod_is_recorded_and_counted() {
    let s = MemStore::new();
    let r = router("");
    let mut rng = SplitMix64::new(3);
    // 34 blocks: long enough to make a family.
    let p = "wxyz".repeat(1100);
    let Outcome::Ask {
        pods,
        family,
        pending,
    } = r
        .route_placed(&s, &req(&p), 100_000, &mut rng, Place::Ask)
        .unwrap()
    else {
        panic!("a new prompt asks");
    };
    assert_eq!(pods.len(), 3, "every pod within the bound: {pods:?}");
    // Idle pods alike: the prompt's whole prefill each, 0 queue.
    let blocks = r.hasher.hash(p.as_bytes()).len() as i64;
    assert!(pods.iter().all(|&(_, cost, _)| cost == blocks), "{pods:?}");
    let hashes = r.hasher.hash(p.as_bytes());
    let (f, record) = family.expect("a family");
    assert_eq!(Some(f), family_of("m", &hashes));
    assert_eq!(record, claim_record(&hashes));
    // Nothing recorded, nothing counted: asking again asks again.
    assert!(matches!(
        r.route_placed(&s, &req(&p), 100_000, &mut rng, Place::Ask),
        Ok(Outcome::Ask { .. })
    ));
    // Forced to the pod the worker would not pick first: the decision
    // resumes from its probe (it keeps no prompt to hash again).
    let target = pods[2].0;
    let placed = r.resume(&s, *pending, Some(target), 100_000);
    assert_eq!(placed.choice.pod, target);
    assert_eq!(placed.choice.reason, Reason::Placed);
    assert_eq!(r.load.borrow().fleet(3)[target.index()], 1, "counted there");
    // Recorded there: the prompt now matches locally, and never asks.
    let Outcome::Routed(next) = r
        .route_placed(&s, &req(&p), 100_000, &mut rng, Place::Ask)
        .unwrap()
    else {
        panic!("a matched prompt routes locally");
    };
    assert_eq!(next.choice.reason, Reason::PrefixMatch);
    assert_eq!(next.choice.pod, target);
    // A forced pod that left the pool: the worker's own pick.
    let gone = PodSlot::new(200);
    let Outcome::Ask { pending, .. } = r
        .route_placed(&s, &req(&"qqqq".repeat(50)), 100_000, &mut rng, Place::Ask)
        .unwrap()
    else {
        panic!("a new prompt asks");
    };
    let own = r.resume(&s, *pending, Some(gone), 100_000);
    assert_ne!(own.choice.pod, gone);
    assert_eq!(own.choice.reason, Reason::NoMatch);
}

#[test]
fn a_family_is_the_model_and_the_first_32_blocks() {
    let h: Vec<u64> = (0..40).collect();
    assert_eq!(family_of("m", &h[..31]), None, "too short for a family");
    assert_eq!(family_of("m", &h[..32]), family_of("m", &h));
    assert_ne!(family_of("m", &h), family_of("n", &h));
    // By the chain, block 31's hash names the first 32 blocks.
    let mut other = h.clone();
    other[31] = 99;
    assert_ne!(family_of("m", &h), family_of("m", &other));
    other[31] = 31;
    other[35] = 99;
    assert_eq!(
        family_of("m", &h),
        family_of("m", &other),
        "later blocks differ"
    );
}

#[test]
fn a_claim_record_tells_a_follower_what_it_shares_and_is_bounded() {
    let a: Vec<u64> = (1000..1200).collect();
    let record = claim_record(&a);
    assert_eq!(
        record,
        "31:407,39:40f,47:417,55:41f,63:427,79:437,95:447,111:457,127:467,159:487,191:4a7,199:4af"
    );
    assert_eq!(shared_with_claim(&record, &a), Some((200, 200)));
    // B shares the first 100 blocks only: its deepest shared position is 95.
    let mut b = a[..100].to_vec();
    b.extend(5000..5300);
    assert_eq!(shared_with_claim(&record, &b), Some((96, 200)));
    // Shorter than the family, or nothing shared: nothing.
    assert_eq!(claim_record(&a[..31]), "");
    assert_eq!(shared_with_claim(&record, &[1, 2, 3]), None);
    assert_eq!(claim_record(&a[..32]), "31:407");
    // Hostile or garbled records read as nothing, and no panic.
    for bad in [
        "",
        "x",
        "31:zz",
        "63:437,31:417",
        "31:417,",
        ":",
        "99999999999999999999:1",
    ] {
        assert_eq!(shared_with_claim(bad, &a), None, "{bad:?}");
    }
    // A position of u32::MAX or usize::MAX is garbage, not a length of
    // u32::MAX + 1 or an overflow.
    for max in [format!("{}", usize::MAX), format!("{}", u32::MAX)] {
        let bad = format!("31:407,{max}:1");
        assert_eq!(shared_with_claim(&bad, &a), None, "{bad:?}");
    }
    let long = (0..40)
        .map(|i| format!("{}:1", i + 31))
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(shared_with_claim(&long, &a), None, "over the bound");
    // A huge prompt's record stays small.
    let huge: Vec<u64> = (0..1_000_000).collect();
    assert!(
        claim_record(&huge).len() < 400,
        "{}",
        claim_record(&huge).len()
    );
}

/// A request for model `model`.
fn req_for(model: &str, prompt: &str) -> PromptRequest {
    PromptRequest {
        model: model.into(),
        prompt: prompt.as_bytes().to_vec(),
        stream: false,
    }
}

#[test]
fn a_flood_of_model_names_leaves_a_new_model_routed_by_prefix() {
    use crate::shared::registry::MAX_SLOTS;
    let s = MemStore::new();
    let r = router(r#","model_endpoints":{"configured":["p:1","p:2"]}"#);
    let mut rng = SplitMix64::new(1);
    for i in 0..MAX_SLOTS + 100 {
        let x = r
            .route(
                &s,
                &req_for(&format!("flood-{i}"), "abcdefgh"),
                100,
                &mut rng,
            )
            .unwrap();
        r.release(&s, x.ticket, x.is_hit(), 0);
    }
    // A model the clients bring after it routes under its local id...
    let p = "wxyz".repeat(300);
    let first = r.route(&s, &req_for("new", &p), 101, &mut rng).unwrap();
    assert!(first.model.is_some_and(|m| usize::from(m) >= MAX_SLOTS));
    r.release(&s, first.ticket, first.is_hit(), 0);
    // ... and by prefix: its second request finds the first one's pod.
    let second = r.route(&s, &req_for("new", &p), 102, &mut rng).unwrap();
    assert_eq!(second.choice.reason, Reason::PrefixMatch);
    assert_eq!(second.choice.pod, first.choice.pod);
    assert_eq!(second.choice.match_percent, 100);
    r.release(&s, second.ticket, second.is_hit(), 0);
    // A configured model still gets a registry slot (it syncs).
    let configured = r.model_id(&s, "configured", 103).unwrap();
    assert!(configured.is_some_and(|m| usize::from(m) < MAX_SLOTS));
    // Once the flood's names retire, the new model takes a slot (looked up
    // again a minute after the last time).
    let later = 100 + r.settings.retire_secs() + 61;
    let id = r.model_id(&s, "new", later).unwrap();
    assert!(id.is_some_and(|m| usize::from(m) < MAX_SLOTS), "{id:?}");
    // A request that names no model is not matched by prefix, as before.
    assert_eq!(r.model_id(&s, "", later).unwrap(), None);
}
