use super::*;
use crate::route::table::{encode_bucket, Layout, PrefixTable};
use crate::shared::registry::PodSlot;
use crate::shared::store::MemStore;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn on(path: &str, filter_chain: &str, max_buckets: u32) -> InspectSettings {
    InspectSettings {
        path: path.into(),
        filter_chain: filter_chain.into(),
        max_buckets,
    }
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A store whose registries name pods `pod-0..` and models `m-0..`.
fn store_with_names(pods: usize, models: usize) -> MemStore {
    let s = MemStore::new();
    let pod_names: Vec<String> = (0..pods).map(|i| format!("pod-{i}")).collect();
    let model_names: Vec<String> = (0..models).map(|i| format!("m-{i}")).collect();
    NameRegistry::pods(&s)
        .intern(&refs(&pod_names), 1, 3600)
        .unwrap();
    NameRegistry::models(&s)
        .intern(&refs(&model_names), 1, 3600)
        .unwrap();
    s
}

#[test]
fn only_the_configured_path_asks_and_its_query_names_the_page() {
    let s = on("/debug/prefix-table", "admin_debug", 8);
    assert_eq!(ask(&s, "GET", "/v1/completions"), Ask::Pass);
    assert_eq!(ask(&s, "GET", "/debug/prefix-table/x"), Ask::Pass);
    assert_eq!(
        ask(&s, "GET", "/debug/prefix-table"),
        Ask::Inspect { get: true, from: 0 }
    );
    assert_eq!(
        ask(&s, "GET", "/debug/prefix-table?x=1&from=17"),
        Ask::Inspect {
            get: true,
            from: 17
        }
    );
    assert_eq!(
        ask(&s, "POST", "/debug/prefix-table?from=nope"),
        Ask::Inspect {
            get: false,
            from: 0
        }
    );
    // Off by default: nothing asks.
    assert_eq!(
        ask(&InspectSettings::default(), "GET", "/debug/prefix-table"),
        Ask::Pass
    );
    assert_eq!(ask(&InspectSettings::default(), "GET", ""), Ask::Pass);
}

#[test]
fn counts_records_per_pod_and_model_with_oldest_newest_and_top_anchors() {
    let s = store_with_names(3, 2);
    let cfg = TableConfig::new(64 * 16, 600, Layout::Segments);
    let t = PrefixTable::new(&s, cfg);
    // Anchor 7: 4 blocks on pod 0 and the same 4 on pod 1 (model 0).
    let seg: Vec<(u64, u32)> = (0..4u64).map(|b| (100 + b, 7)).collect();
    t.record(&seg, 0, PodSlot::new(0), 1_000);
    t.record(&seg, 0, PodSlot::new(1), 1_010);
    // Anchor 9: 2 blocks on pod 2, model 1, older.
    t.record(&[(200, 9), (201, 9)], 1, PodSlot::new(2), 990);
    // A record past idle expiry by the time of the view: shown apart.
    t.record(&[(300, 11)], 0, PodSlot::new(2), 100);
    let v = view(&s, &cfg, 1024, 0, 1_020).unwrap();
    assert_eq!(v.occupancy.live_records, 10);
    assert_eq!(v.occupancy.expired_records, 1);
    assert_eq!(v.occupancy.slots_read, cfg.capacity());
    assert!(v.read.complete);
    assert_eq!(v.read.next_from, None);
    assert_eq!(
        v.per_pod,
        vec![
            Count {
                name: "pod-0".into(),
                records: 4
            },
            Count {
                name: "pod-1".into(),
                records: 4
            },
            Count {
                name: "pod-2".into(),
                records: 2
            },
        ]
    );
    assert_eq!(
        v.per_model,
        vec![
            Count {
                name: "m-0".into(),
                records: 8
            },
            Count {
                name: "m-1".into(),
                records: 2
            },
        ]
    );
    let oldest = v.oldest.unwrap();
    assert_eq!((oldest.pod.as_str(), oldest.age_secs), ("pod-2", 30));
    assert_eq!(oldest.model, "m-1");
    let newest = v.newest.unwrap();
    assert_eq!((newest.pod.as_str(), newest.last_access), ("pod-1", 1_010));
    assert_eq!(v.top_anchors[0].anchor, "00000007");
    assert_eq!((v.top_anchors[0].records, v.top_anchors[0].blocks), (8, 4));
    assert_eq!(v.top_anchors[0].pods, vec!["pod-0", "pod-1"]);
    assert_eq!(v.top_anchors[0].newest_age_secs, 10);
    assert_eq!(v.top_anchors[1].anchor, "00000009");
    assert_eq!(v.hits, HITS_NOTE);
}

#[test]
fn records_past_idle_expiry_are_shown_apart() {
    let s = store_with_names(1, 1);
    let cfg = TableConfig::new(64, 60, Layout::Segments);
    PrefixTable::new(&s, cfg).record(&[(1, 1), (2, 1)], 0, PodSlot::new(0), 1_000);
    let v = view(&s, &cfg, 8, 0, 1_100).unwrap();
    assert_eq!(
        (v.occupancy.live_records, v.occupancy.expired_records),
        (0, 2)
    );
    assert!(v.per_pod.is_empty() && v.oldest.is_none() && v.top_anchors.is_empty());
}

#[test]
fn one_answer_reads_at_most_max_buckets_and_names_the_next_page() {
    let s = store_with_names(1, 1);
    let cfg = TableConfig::new(64 * 10, 600, Layout::Segments); // 10 buckets
    let t = PrefixTable::new(&s, cfg);
    for anchor in 0..10u32 {
        t.record(
            &[(u64::from(anchor) + 1, anchor)],
            0,
            PodSlot::new(0),
            1_000,
        );
    }
    let (gets0, _) = s.op_counts();
    let v = view(&s, &cfg, 4, 0, 1_000).unwrap();
    let (gets1, _) = s.op_counts();
    assert_eq!(gets1 - gets0, 4 + 2, "4 buckets and the two registries");
    assert_eq!((v.read.buckets_read, v.read.next_from), (4, Some(4)));
    assert!(!v.read.complete);
    assert_eq!(v.read.max_records_per_request, 4 * 64);
    assert_eq!(v.occupancy.live_records, 4);
    let last = view(&s, &cfg, 4, 8, 1_000).unwrap();
    assert_eq!((last.read.buckets_read, last.read.next_from), (2, None));
    assert!(!last.read.complete, "a later page is not the whole table");
    let past = view(&s, &cfg, 4, u32::MAX, 1_000).unwrap();
    assert_eq!((past.read.from, past.read.buckets_read), (10, 0));
}

#[test]
fn buckets_of_another_layout_are_counted_not_read() {
    let s = store_with_names(1, 1);
    let cfg = TableConfig::new(64 * 4, 600, Layout::Segments);
    PrefixTable::new(&s, cfg).record(&[(5, 0)], 0, PodSlot::new(0), 1_000);
    let mut other = encode_bucket(&[], cfg.slots);
    other[0] = LAYOUT_VERSION.wrapping_add(1);
    other.extend_from_slice(&[0xff; 20]);
    s.set(&bucket_key(1), &other, None).unwrap();
    let v = view(&s, &cfg, 16, 0, 1_000).unwrap();
    assert_eq!(v.occupancy.other_layout_buckets, 1);
    assert_eq!(v.occupancy.empty_buckets, 2);
    assert_eq!(v.occupancy.live_records, 1);
}

#[test]
fn a_slot_no_longer_named_shows_its_number() {
    let s = MemStore::new();
    let cfg = TableConfig::new(64, 600, Layout::Segments);
    PrefixTable::new(&s, cfg).record(&[(5, 0)], 3, PodSlot::new(4), 1_000);
    let v = view(&s, &cfg, 1, 0, 1_000).unwrap();
    assert_eq!(v.per_pod[0].name, "pod#4");
    assert_eq!(v.per_model[0].name, "model#3");
}

#[test]
fn the_body_is_json_with_every_section() {
    let s = store_with_names(1, 1);
    let cfg = TableConfig::new(64, 600, Layout::Segments);
    PrefixTable::new(&s, cfg).record(&[(5, 0)], 0, PodSlot::new(0), 1_000);
    let body = body(&view(&s, &cfg, 1, 0, 1_000));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    for key in [
        "bounds",
        "read",
        "occupancy",
        "per_pod",
        "per_model",
        "oldest",
        "newest",
        "top_anchors",
        "hits",
    ] {
        assert!(v.get(key).is_some(), "no {key} in {v}");
    }
    assert_eq!(v["bounds"]["layout_version"], LAYOUT_VERSION);
}

#[test]
fn top_anchors_keeps_the_ten_holding_most_records() {
    let s = store_with_names(1, 1);
    let cfg = TableConfig::new(64 * 64, 600, Layout::Segments);
    let t = PrefixTable::new(&s, cfg);
    // Anchor a holds a % 20 + 1 blocks, each anchor in its own bucket.
    for anchor in 0..60u32 {
        let blocks: Vec<(u64, u32)> = (0..=u64::from(anchor) % 20)
            .map(|b| (u64::from(anchor) * 100 + b, anchor))
            .collect();
        t.record(&blocks, 0, PodSlot::new(0), 1_000);
    }
    let v = view(&s, &cfg, 64, 0, 1_000).unwrap();
    assert_eq!(v.occupancy.live_records, 3 * 210);
    assert_eq!(v.top_anchors.len(), TOP_ANCHORS);
    let records: Vec<u64> = v.top_anchors.iter().map(|a| a.records).collect();
    assert_eq!(records, vec![20, 20, 20, 19, 19, 19, 18, 18, 18, 17]);
    // Ties go to the lower anchor: 19, 39, 59 hold 20 each.
    assert_eq!(v.top_anchors[0].anchor, "00000013");
    assert_eq!(v.top_anchors[2].anchor, "0000003b");
}

#[test]
fn the_record_cap_follows_the_layout() {
    let s = MemStore::new();
    let cfg = TableConfig::new(64, 600, Layout::PerBlock);
    let v = view(&s, &cfg, 3, 0, 1_000).unwrap();
    assert_eq!(v.read.max_records_per_request, 3 * 8);
}
