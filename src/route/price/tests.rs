use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

use crate::rng::SplitMix64;

/// Feeds `count` requests to pod 0 with `t(u, n)` ms to first bytes, `u`
/// and `n` drawn at random (u in 0..64 blocks, n in 0..4).
fn learn(prices: &mut PodPrices, count: u32, t_ms: impl Fn(u32, u32) -> u64) {
    let mut rng = SplitMix64::new(9);
    let pod = PodSlot::new(0);
    let mut now = 1_000;
    for stream in 0..count {
        let u = rng.below(64) as u32;
        let n = rng.below(4) as u32;
        assert!(prices.start(stream, pod, n, u, now));
        now += t_ms(u, n);
        prices.answered(stream, now);
        now += 1;
    }
}

#[test]
fn a_pod_whose_time_does_not_grow_with_load_prices_a_request_at_about_nothing() {
    let mut p = PodPrices::default();
    // 4 ms fixed + 1.6 ms per uncached block, whatever is in flight.
    learn(&mut p, 60, |u, _| 4 + u64::from(u) * 16 / 10);
    let price = p.price(PodSlot::new(0));
    assert!(
        (1_400.0..=1_800.0).contains(&price.per_block_us),
        "{price:?}"
    );
    // Under a block's prefill per request: the longest match wins.
    assert!(price.per_request_us < price.per_block_us, "{price:?}");
}

#[test]
fn a_pod_where_requests_queue_prices_a_request_at_its_service_time() {
    let mut p = PodPrices::default();
    // Each request in flight ahead adds 100 ms.
    learn(&mut p, 60, |u, n| {
        4 + u64::from(u) * 16 / 10 + u64::from(n) * 100
    });
    let price = p.price(PodSlot::new(0));
    assert!(
        (90_000.0..=110_000.0).contains(&price.per_request_us),
        "{price:?}"
    );
    assert!(
        (1_200.0..=2_000.0).contains(&price.per_block_us),
        "{price:?}"
    );
}

#[test]
fn a_pod_without_answers_starts_cautious_from_what_the_others_read() {
    let mut p = PodPrices::default();
    let fresh = p.price(PodSlot::new(3));
    assert_eq!(fresh.per_block_us, PRIOR_US_PER_BLOCK);
    assert_eq!(
        fresh.per_request_us,
        PRIOR_BLOCKS_PER_REQUEST * PRIOR_US_PER_BLOCK
    );
    learn(&mut p, 60, |u, _| 4 + u64::from(u) * 3);
    let b = p.price(PodSlot::new(0)).per_block_us;
    let fresh = p.price(PodSlot::new(3));
    assert_eq!(fresh.per_block_us, b);
    assert_eq!(fresh.per_request_us, PRIOR_BLOCKS_PER_REQUEST * b);
}

#[test]
fn a_few_answers_move_the_price_most_of_the_way() {
    let mut p = PodPrices::default();
    learn(&mut p, 8, |u, _| 4 + u64::from(u) * 16 / 10);
    let price = p.price(PodSlot::new(0));
    // From the prior's 16 ms per request to a few ms after 8 answers.
    assert!(price.per_request_us < 5_000.0, "{price:?}");
}

#[test]
fn open_requests_are_bounded_and_forgotten() {
    let mut p = PodPrices::default();
    let pod = PodSlot::new(1);
    for s in 0..MAX_OPEN as u32 {
        assert!(p.start(s, pod, 0, 1, 0));
    }
    assert!(!p.start(999, pod, 0, 1, 0));
    p.ended(0);
    assert_eq!(p.open(), MAX_OPEN - 1);
    p.tick(OPEN_TTL_MS + 1);
    assert_eq!(p.open(), 0);
    // An answer for a stream not timed changes nothing.
    p.answered(5, 10);
    assert_eq!(p.price(pod).per_block_us, PRIOR_US_PER_BLOCK);
    assert!(!p.start(1, PodSlot::new(MAX_SLOTS as u16), 0, 1, 0));
}

#[test]
fn hostile_times_and_counts_give_finite_bounded_prices() {
    let mut p = PodPrices::default();
    let pod = PodSlot::new(0);
    for (s, (n, u, t)) in [
        (u32::MAX, u32::MAX, u64::MAX),
        (0, 0, 0),
        (u32::MAX, 0, 1),
        (0, u32::MAX, u64::MAX / 2),
    ]
    .into_iter()
    .enumerate()
    {
        p.start(s as u32, pod, n, u, 0);
        p.answered(s as u32, t);
        let price = p.price(pod);
        assert!(price.per_block_us.is_finite() && price.per_request_us.is_finite());
        assert!((0.0..=MAX_PRICE_US).contains(&price.per_block_us));
        assert!((0.0..=MAX_PRICE_US).contains(&price.per_request_us));
    }
}
