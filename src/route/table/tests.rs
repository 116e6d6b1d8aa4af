use super::*;
use crate::shared::store::MemStore;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn p(n: u16) -> PodSlot {
    PodSlot::new(n)
}

/// Blocks in the per-block layout: each its own anchor.
fn own(blocks: &[u64]) -> Vec<(u64, u32)> {
    blocks.iter().map(|&b| (b, b as u32)).collect()
}

fn holders(t: &PrefixTable<'_, MemStore>, block: u64, model: u16, now: u32) -> Vec<PodSlot> {
    let mut v = Vec::new();
    t.pods_holding(block, block as u32, model, now, &mut v)
        .unwrap();
    let mut pods: Vec<PodSlot> = v.into_iter().map(|(p, _)| p).collect();
    pods.sort_unstable();
    pods
}

#[test]
fn record_then_lookup_per_model_and_pod() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(1024, 60, Layout::PerBlock));
    t.record(&own(&[1, 2, 3]), 0, p(5), 100);
    t.record(&own(&[1]), 0, p(6), 100);
    t.record(&own(&[1]), 1, p(7), 100);
    assert_eq!(holders(&t, 1, 0, 101), vec![p(5), p(6)]);
    assert_eq!(holders(&t, 3, 0, 101), vec![p(5)]);
    assert_eq!(holders(&t, 1, 1, 101), vec![p(7)]);
    assert_eq!(holders(&t, 9, 0, 101), Vec::<PodSlot>::new());
}

#[test]
fn idle_records_expire_and_slots_are_reused() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(64, 60, Layout::PerBlock));
    t.record(&own(&[42]), 0, p(1), 1000);
    assert_eq!(holders(&t, 42, 0, 1059), vec![p(1)]);
    assert!(holders(&t, 42, 0, 1060).is_empty());
    // An expired slot is reused rather than counted as new occupancy.
    let fill: Vec<u64> = (0..8).map(|i| 42 + i * 8).collect();
    let o = t.record(&own(&fill), 0, p(2), 2000);
    assert_eq!(o.evictions, 0);
    assert_eq!(t.block_records(42, 42, 2000).unwrap().len(), 1);
}

#[test]
fn capacity_bounds_keys_and_bytes_under_a_flood() {
    let s = MemStore::new();
    let cfg = TableConfig::new(800, 3600, Layout::PerBlock);
    let t = PrefixTable::new(&s, cfg);
    let mut x = 0x1234_5678_u64;
    for round in 0..200u32 {
        let blocks: Vec<u64> = (0..50)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                x
            })
            .collect();
        t.record(&own(&blocks), 0, p((round % 4) as u16), 10 + round);
    }
    assert_eq!(s.key_count(), 100, "one key per bucket, never more");
    assert!(s.value_bytes() <= 100 * (1 + 8 * RECORD_LEN));
}

#[test]
fn full_bucket_evicts_least_recently_used() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(8, 3600, Layout::PerBlock)); // one bucket
    for i in 0..8u64 {
        t.record(&own(&[i]), 0, p(0), 100 + i as u32);
    }
    let o = t.record(&own(&[99]), 0, p(0), 200);
    assert_eq!(o.evictions, 1);
    assert!(holders(&t, 0, 0, 201).is_empty(), "oldest evicted");
    assert_eq!(holders(&t, 1, 0, 201), vec![p(0)]);
    assert_eq!(holders(&t, 99, 0, 201), vec![p(0)]);
    assert_eq!(o.refused, 0);
}

#[test]
fn a_bucket_full_of_this_seconds_records_refuses_and_counts() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(8, 3600, Layout::PerBlock)); // one bucket
    let o = t.record(&own(&(0..8).collect::<Vec<u64>>()), 0, p(0), 100);
    assert_eq!((o.evictions, o.refused), (0, 0));
    // A burst within the same second: nothing older to evict.
    let o = t.record(&own(&[50, 51]), 0, p(0), 100);
    assert_eq!((o.evictions, o.refused), (0, 2));
    assert!(holders(&t, 50, 0, 100).is_empty());
    // A pulled fact older than everything held is refused too.
    let o = t.upsert(
        &[Record {
            block: 60,
            anchor: 60,
            model: 0,
            pod: p(1),
            last_access: 90,
        }],
        100,
    );
    assert_eq!(o.refused, 1);
    // The next second evicts the least recently used.
    let o = t.record(&own(&[50]), 0, p(0), 101);
    assert_eq!((o.evictions, o.refused), (1, 0));
}

#[test]
fn upsert_keeps_newer_time() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(64, 3600, Layout::PerBlock));
    let f = |ts| Record {
        block: 7,
        anchor: 7,
        model: 0,
        pod: p(1),
        last_access: ts,
    };
    t.upsert(&[f(500)], 600);
    t.upsert(&[f(400)], 600);
    assert_eq!(t.block_records(7, 7, 600).unwrap()[0].last_access, 500);
    t.upsert(&[f(550)], 600);
    assert_eq!(t.block_records(7, 7, 600).unwrap()[0].last_access, 550);
    // Already expired facts are not written.
    t.upsert(
        &[Record {
            block: 8,
            anchor: 8,
            ..f(1)
        }],
        600_000,
    );
    assert!(t.block_records(8, 8, 600_000).unwrap().is_empty());
}

#[test]
fn cas_conflict_is_retried_without_losing_the_write() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(64, 3600, Layout::PerBlock));
    t.record(&own(&[1]), 0, p(1), 10);
    s.interfere_next(3);
    let o = t.record(&own(&[1]), 0, p(2), 11);
    assert_eq!(o.cas_retries, 3);
    assert_eq!(o.failed_buckets, 0);
    assert_eq!(holders(&t, 1, 0, 12), vec![p(1), p(2)]);
}

#[test]
fn cas_exhaustion_is_reported_not_panicked() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(64, 3600, Layout::PerBlock));
    t.record(&own(&[1]), 0, p(1), 10);
    s.interfere_next(100);
    let o = t.record(&own(&[1]), 0, p(2), 11);
    assert_eq!(o.failed_buckets, 1);
}

#[test]
fn new_slots_count_occupancy_growth() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(1024, 3600, Layout::PerBlock));
    assert_eq!(t.record(&own(&[1, 2, 3]), 0, p(1), 10).new_slots, 3);
    assert_eq!(t.record(&own(&[1, 2, 3]), 0, p(1), 11).new_slots, 0);
}

#[test]
fn anchors_start_segments_and_never_lie_past_the_block() {
    let seg = Layout::Segments;
    // Dense: runs of 16.
    assert_eq!(seg.anchor_position(0, 32), 0);
    assert_eq!(seg.anchor_position(15, 32), 0);
    assert_eq!(seg.anchor_position(16, 32), 16);
    assert_eq!(seg.anchor_position(31, 32), 16);
    // Past the dense prefix: one segment per two doublings.
    assert_eq!(seg.anchor_position(32, 32), 15);
    assert_eq!(seg.anchor_position(62, 32), 15);
    assert_eq!(seg.anchor_position(63, 32), 63);
    assert_eq!(seg.anchor_position(254, 32), 63);
    assert_eq!(seg.anchor_position(255, 32), 255);
    assert_eq!(seg.anchor_position(3199, 32), 1023);
    for dense in [0, 1, 7, 32, 100, usize::MAX] {
        for i in 0..5000 {
            let a = seg.anchor_position(i, dense);
            assert!(a <= i, "{i} {dense}");
            assert_eq!(Layout::PerBlock.anchor_position(i, dense), i);
        }
    }
    // A segment's sampled positions fit one bucket several times over.
    let sampled = crate::route::router::sampled_positions(4096, 32);
    let mut per_anchor = std::collections::HashMap::<usize, usize>::new();
    for &i in &sampled {
        *per_anchor.entry(seg.anchor_position(i, 32)).or_default() += 1;
    }
    assert!(per_anchor.values().all(|&n| n <= 16), "{per_anchor:?}");
    // Two dense segments, four sparse ones, and the last block (4095),
    // which starts the next pair of doublings.
    assert_eq!(per_anchor.len(), 2 + 4 + 1, "{per_anchor:?}");
}

#[test]
fn a_segment_is_written_and_read_in_one_bucket_each() {
    let s = MemStore::new();
    let t = PrefixTable::new(&s, TableConfig::new(64 * 1000, 3600, Layout::Segments));
    // 16 blocks of one segment and 8 of another, as one request records.
    let blocks: Vec<(u64, u32)> = (0..16u64)
        .map(|b| (1000 + b, 77))
        .chain((0..8u64).map(|b| (2000 + b, 78)))
        .collect();
    let (_, sets) = s.op_counts();
    let o = t.record(&blocks, 0, p(3), 100);
    assert_eq!(
        s.op_counts().1 - sets,
        2,
        "one write per segment, created or not"
    );
    assert_eq!(o.new_slots, 24);
    let seg = t.segment(77, 0, 101).unwrap();
    assert_eq!(seg.len(), 16);
    assert!(seg.iter().all(|r| r.pod == p(3) && r.anchor == 77));
    assert_eq!(t.segment(77, 1, 101).unwrap().len(), 0, "other model");
    assert_eq!(t.block_records(2003, 78, 101).unwrap().len(), 1);
    // Four pods holding one dense segment still fit a bucket.
    for pod in 4..7 {
        let o = t.record(&blocks[..16], 0, p(pod), 102);
        assert_eq!((o.evictions, o.refused), (0, 0));
    }
    assert_eq!(t.segment(77, 0, 103).unwrap().len(), 64);
}

#[test]
fn garbage_bucket_values_read_as_empty() {
    assert!(decode_bucket(&[], 8).is_empty());
    assert!(decode_bucket(&[9, 1, 2, 3], 8).is_empty());
    assert_eq!(decode_bucket(&[LAYOUT_VERSION, 1, 2, 3], 8).len(), 0);
    let r = Record {
        block: u64::MAX,
        anchor: 5,
        model: 3,
        pod: p(9),
        last_access: 77,
    };
    assert_eq!(decode_bucket(&encode_bucket(&[r], 8), 8), vec![r]);
}

#[test]
fn a_bucket_of_another_layout_reads_empty_and_its_reset_is_counted_once() {
    let s = MemStore::new();
    let cfg = TableConfig::new(8, 3600, Layout::PerBlock); // one bucket
    let r = Record {
        block: 42,
        anchor: 42,
        model: 0,
        pod: p(1),
        last_access: 100,
    };
    // The value an older (or newer) module wrote: same records, other version.
    let mut old = encode_bucket(&[r], 8);
    old[0] = LAYOUT_VERSION.wrapping_sub(1);
    s.set(&bucket_key(0), &old, None).unwrap();
    let t = PrefixTable::new(&s, cfg);
    assert!(is_other_layout(&old));
    assert!(t.all_records(101).unwrap().is_empty(), "read as empty");
    let o = t.record(&own(&[7]), 0, p(2), 101);
    assert_eq!((o.layout_resets, o.new_slots), (1, 1));
    let o = t.record(&own(&[8]), 0, p(2), 102);
    assert_eq!(o.layout_resets, 0, "written anew in this layout");
    let (value, _) = s.get(&bucket_key(0)).unwrap();
    assert!(!is_other_layout(&value.unwrap()));
    assert_eq!(holders(&t, 42, 0, 103), Vec::<PodSlot>::new());
    assert_eq!(holders(&t, 7, 0, 103), vec![p(2)]);
}
