use super::super::testutil::{clock, settings, view};
use super::*;
use crate::shared::registry::{PodSlot, MAX_SLOTS};
use crate::shared::store::MemStore;
use std::cell::Cell;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn p(n: u16) -> PodSlot {
    PodSlot::new(n)
}

/// A replica's prefixcache sync over a fresh store, its clock at `secs`.
fn sync_at(secs: u64) -> (Rc<MemStore>, Rc<Settings>, PrefixCacheSync<Rc<MemStore>>) {
    let store = Rc::new(MemStore::new());
    let s = settings();
    let sync = PrefixCacheSync::new(store.clone(), s.clone(), view(&store, &s), clock(secs), 100);
    (store, s, sync)
}

/// Registers `model` (seen at second 1) and returns its slot.
fn model_slot(store: &MemStore, model: &str) -> u16 {
    NameRegistry::models(store)
        .intern(&[model], 1, 100)
        .unwrap()
        .0[0]
        .unwrap()
}

/// Blocks that are their own anchors.
fn own(blocks: &[u64]) -> Vec<(u64, u32)> {
    blocks.iter().map(|&b| (b, anchor_of(b))).collect()
}

/// Blocks a worker recorded for model 0 on pod 0.
fn touched(blocks: &[u64]) -> Touched {
    Touched {
        model: 0,
        pod: p(0),
        time: 1,
        blocks: own(blocks),
    }
}

#[test]
fn payload_is_aibrix_shaped_and_merges_newer_time() {
    let (store, s, mut sync) = sync_at(1000);
    let model = model_slot(&store, "llama");
    let table = PrefixTable::new(
        &*store,
        TableConfig::new(s.table_capacity_blocks, 1200, Layout::Segments),
    );
    table.record(&own(&[77]), model, p(0), 990);
    sync.mark(&Touched {
        model,
        pod: p(0),
        time: 990,
        blocks: own(&[77]),
    });
    let delta = sync.delta();
    assert_eq!(delta.updated.len(), 1);
    assert_eq!(delta.updated[0].0, "77");
    assert_eq!(
        String::from_utf8(delta.updated[0].1.clone()).unwrap(),
        r#"{"model_to_pods":{"llama":{"a:1":990000000000}}}"#
    );
    // A peer says b:1 holds it later and a:1 earlier: newer wins per pod.
    sync.apply_remote("77", br#"{"model_to_pods":{"llama":{"a:1":100000000000,"b:1":995000000000},"other":{"zz:9":1}}}"#)
        .unwrap();
    let mut pods = Vec::new();
    table.pods_holding(77, 77, model, 1000, &mut pods).unwrap();
    pods.sort_unstable();
    assert_eq!(pods, vec![(p(0), 990), (p(1), 995)]);
    let recs = table.block_records(77, 77, 1000).unwrap();
    assert!(recs.iter().any(|r| r.pod == p(0) && r.last_access == 990));
}

#[test]
fn a_segment_anchor_travels_with_its_block_and_only_then() {
    let (store, s, mut sync) = sync_at(1000);
    let model = model_slot(&store, "llama");
    let table = PrefixTable::new(&*store, s.table_config());
    // Block 77 anchored at 5 (the start of its segment).
    table.record(&[(77, 5)], model, p(0), 990);
    sync.mark(&Touched {
        model,
        pod: p(0),
        time: 990,
        blocks: vec![(77, 5)],
    });
    let delta = sync.delta();
    assert_eq!(
        String::from_utf8(delta.updated[0].1.clone()).unwrap(),
        r#"{"model_to_pods":{"llama":{"a:1":990000000000}},"anchor":5}"#
    );
    // A peer's value with an anchor lands in that anchor's bucket; one
    // without (an older writer) in the block's own.
    sync.apply_remote(
        "88",
        br#"{"model_to_pods":{"llama":{"b:1":995000000000}},"anchor":5}"#,
    )
    .unwrap();
    sync.apply_remote("99", br#"{"model_to_pods":{"llama":{"b:1":995000000000}}}"#)
        .unwrap();
    let mut pods = Vec::new();
    table.pods_holding(88, 5, model, 1000, &mut pods).unwrap();
    assert_eq!(pods, vec![(p(1), 995)]);
    table.pods_holding(99, 99, model, 1000, &mut pods).unwrap();
    assert_eq!(pods, vec![(p(1), 995)]);
    // Per block (AIBrix's namespace), a block is its own anchor.
    let store = Rc::new(MemStore::new());
    let compat = Rc::new(Settings::from_json(br#"{"compat":"aibrix","cluster":"pods"}"#).unwrap());
    assert_eq!(compat.table_layout(), Layout::PerBlock);
    let fleet = view(&store, &s);
    let mut sync = PrefixCacheSync::new(store.clone(), compat.clone(), fleet, clock(1000), 100);
    let model = model_slot(&store, "llama");
    sync.apply_remote(
        "88",
        br#"{"model_to_pods":{"llama":{"b:1":995000000000}},"anchor":5}"#,
    )
    .unwrap();
    let table = PrefixTable::new(&*store, compat.table_config());
    table.pods_holding(88, 88, model, 1000, &mut pods).unwrap();
    assert_eq!(pods, vec![(p(1), 995)]);
}

/// Records block 77 for `llama` on a:1 at 990 and marks it dirty.
fn local_fact(store: &Rc<MemStore>, s: &Settings, sync: &mut PrefixCacheSync<Rc<MemStore>>) {
    let model = NameRegistry::models(&**store)
        .intern(&["llama"], 1, 100)
        .unwrap()
        .0[0]
        .unwrap();
    let table = PrefixTable::new(
        &**store,
        TableConfig::new(s.table_capacity_blocks, 1200, Layout::Segments),
    );
    table.record(&own(&[77]), model, p(0), 990);
    sync.mark(&Touched {
        model,
        pod: p(0),
        time: 990,
        blocks: own(&[77]),
    });
}

#[test]
fn other_writers_pods_and_models_are_carried_in_what_it_pushes() {
    let (store, s, mut sync) = sync_at(1000);
    local_fact(&store, &s, &mut sync);
    // Another gateway's pod on our model, one on a model we never saw,
    // and an older time for our own pod (ours, newer, wins).
    sync.apply_remote(
        "77",
        br#"{"model_to_pods":{"llama":{"a:1":5000000000,"vllm-x":980123456789},"qwen":{"vllm-y":970000000001}}}"#,
    )
    .unwrap();
    // An older time for vllm-x from a later pull does not win.
    sync.apply_remote("77", br#"{"model_to_pods":{"llama":{"vllm-x":1}}}"#)
        .unwrap();
    let delta = sync.delta();
    assert_eq!(
        String::from_utf8(delta.updated[0].1.clone()).unwrap(),
        r#"{"model_to_pods":{"llama":{"a:1":990000000000,"vllm-x":980123456789},"qwen":{"vllm-y":970000000001}}}"#
    );
    assert_eq!(sync.foreign_stats(), (2, 0));
    // Full re-push (snapshot) carries them too.
    let snap = sync.snapshot();
    assert!(String::from_utf8(snap[0].1.clone())
        .unwrap()
        .contains("vllm-y"));
}

#[test]
fn foreign_entries_idle_out_and_are_bounded() {
    let store = Rc::new(MemStore::new());
    let s = Rc::new(
        Settings::from_json(br#"{"endpoints":["a:1","b:1"],"sync":{"foreign_max_entries":100}}"#)
            .unwrap(),
    );
    let now = Rc::new(Cell::new(1000u64));
    let n = now.clone();
    let mut sync = PrefixCacheSync::new(
        store.clone(),
        s.clone(),
        view(&store, &s),
        Rc::new(move || n.get()),
        100,
    );
    // One value naming 5,000 pods: kept to the per-block cap, counted.
    let pods: BTreeMap<String, u64> = (0..5000)
        .map(|i| (format!("vllm-{i}"), 999 * NANOS))
        .collect();
    let payload = serde_json::to_vec(&BlockPayload {
        model_to_pods: BTreeMap::from([("llama".to_string(), pods)]),
        anchor: None,
    })
    .unwrap();
    sync.apply_remote("1", &payload).unwrap();
    let (held, dropped) = sync.foreign_stats();
    assert_eq!(held, crate::sync::foreign::MAX_PER_BLOCK);
    assert_eq!(dropped, 5000 - crate::sync::foreign::MAX_PER_BLOCK as u64);
    // Many blocks: the store's cap holds.
    for b in 2..50u64 {
        sync.apply_remote(&b.to_string(), &payload).unwrap();
    }
    assert_eq!(sync.foreign_stats().0, 100);
    // Past the idle expiry they are swept.
    now.set(1000 + 1200 + 1);
    let _ = sync.delta();
    assert_eq!(sync.foreign_stats().0, 0);
}

#[test]
fn a_key_naming_a_pod_it_does_not_know_is_never_stale() {
    let store = Rc::new(MemStore::new());
    let s = settings();
    let sync = PrefixCacheSync::new(
        store.clone(),
        s.clone(),
        view(&store, &s),
        clock(100_000),
        100,
    );
    // Old, and only our pods: stale.
    assert!(sync.is_stale("1", br#"{"model_to_pods":{"m":{"a:1":1000000000}}}"#));
    // Old, but another writer's pod: it leaves by TTL, not by us.
    assert!(!sync.is_stale("1", br#"{"model_to_pods":{"m":{"vllm-a":1000000000}}}"#));
    assert!(!sync.is_stale(
        "1",
        br#"{"model_to_pods":{"m":{"a:1":1000000000,"vllm-a":1000000000}}}"#
    ));
    // Fresh: never stale.
    assert!(!sync.is_stale("1", br#"{"model_to_pods":{"m":{"a:1":99999000000000}}}"#));
}

#[test]
fn remote_times_from_the_future_are_clamped_to_now() {
    let (store, s, mut sync) = sync_at(1000);
    let model = model_slot(&store, "m");
    let forever = format!(r#"{{"model_to_pods":{{"m":{{"a:1":{}}}}}}}"#, u64::MAX);
    sync.apply_remote("9", forever.as_bytes()).unwrap();
    let table = PrefixTable::new(
        &*store,
        TableConfig::new(s.table_capacity_blocks, 1200, Layout::Segments),
    );
    let mut pods = Vec::new();
    table.pods_holding(9, 9, model, 1000, &mut pods).unwrap();
    assert_eq!(pods, vec![(p(0), 1000)]);
    // So it idles out like any other fact, and a newer local one wins.
    pods.clear();
    table
        .pods_holding(9, 9, model, 1000 + 1200, &mut pods)
        .unwrap();
    assert!(pods.is_empty());
}

#[test]
fn hostile_values_naming_many_models_leave_room_for_real_ones() {
    let (store, s, mut sync) = sync_at(1000);
    for batch in 0..8 {
        let models: BTreeMap<String, BTreeMap<String, u64>> = (0..300)
            .map(|i| {
                (
                    format!("junk-{batch}-{i}"),
                    BTreeMap::from([("zz:1".to_string(), 1)]),
                )
            })
            .collect();
        let payload = serde_json::to_vec(&BlockPayload {
            model_to_pods: models,
            anchor: None,
        })
        .unwrap();
        sync.apply_remote(&batch.to_string(), &payload).unwrap();
    }
    // Facts for a pod that is not a member are counted, not applied.
    assert_eq!(sync.facts_ignored(), 8 * 300);
    let reg = NameRegistry::models(&*store).load().unwrap();
    assert_eq!(reg.slots.iter().flatten().count(), REMOTE_SLOTS);
    // A client's model still gets a registry slot (so it syncs).
    let router = crate::route::router::Router::new((*s).clone());
    let id = router.model_id(&*store, "llama", 1000).unwrap();
    assert!(id.is_some_and(|id| usize::from(id) < MAX_SLOTS), "{id:?}");
}

#[test]
fn records_under_a_local_model_id_are_not_synced() {
    let (store, s, sync) = sync_at(1000);
    let table = PrefixTable::new(
        &*store,
        TableConfig::new(s.table_capacity_blocks, 1200, Layout::Segments),
    );
    let local = crate::shared::registry::local_model_id("m");
    table.record(&own(&[1, 2]), local, p(0), 990);
    assert!(sync.snapshot().is_empty());
    // The same facts under the model's slot are.
    table.record(&own(&[1, 2]), model_slot(&store, "m"), p(0), 990);
    assert_eq!(sync.snapshot().len(), 2);
}

#[test]
fn mark_all_queues_every_live_block_for_the_next_push() {
    let (store, s, mut sync) = sync_at(1000);
    let model = model_slot(&store, "m");
    let table = PrefixTable::new(
        &*store,
        TableConfig::new(s.table_capacity_blocks, 1200, Layout::Segments),
    );
    table.record(&own(&[1, 2, 3]), model, p(0), 990);
    table.record(&own(&[3]), model, p(1), 990);
    assert_eq!(sync.mark_all(), 3);
    let ids: Vec<String> = sync.delta().updated.into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 3);
}

#[test]
fn clear_dirty_only_clears_what_delta_saw() {
    let (_, _, mut sync) = sync_at(1000);
    sync.mark(&touched(&[1, 2]));
    let _ = sync.delta();
    sync.mark(&touched(&[3]));
    sync.clear_dirty(&[]);
    assert_eq!(sync.dirty_len(), 1);
}

#[test]
fn evicted_dirty_block_is_skipped() {
    let (_, _, mut sync) = sync_at(1000);
    sync.mark(&touched(&[5]));
    assert!(sync.delta().updated.is_empty());
}

#[test]
fn bad_remote_payloads_are_rejected() {
    let (_, _, mut sync) = sync_at(1000);
    assert!(sync.apply_remote("x", b"{}").is_err());
    assert!(sync.apply_remote("1", b"nope").is_err());
}

#[test]
fn stale_when_every_pod_is_past_idle_expiry() {
    let store = Rc::new(MemStore::new());
    let sync = PrefixCacheSync::new(
        store.clone(),
        settings(),
        view(&store, &settings()),
        clock(10_000),
        100,
    );
    assert!(sync.is_stale("1", br#"{"model_to_pods":{"m":{"a:1":1000000000000}}}"#));
    assert!(!sync.is_stale(
        "1",
        br#"{"model_to_pods":{"m":{"a:1":1000000000000,"b:1":9500000000000}}}"#
    ));
}

#[test]
fn snapshot_lists_every_live_block() {
    let store = Rc::new(MemStore::new());
    let s = Rc::new(
        Settings::from_json(br#"{"endpoints":["a:1"],"table_capacity_blocks":64}"#).unwrap(),
    );
    let fleet = view(&store, &s);
    let sync = PrefixCacheSync::new(store.clone(), s, fleet, clock(100), 100);
    NameRegistry::models(&*store)
        .intern(&["m"], 1, 100)
        .unwrap();
    PrefixTable::new(&*store, TableConfig::new(64, 1200, Layout::Segments)).record(
        &own(&[1, 2, 3]),
        0,
        p(0),
        100,
    );
    let ids: Vec<String> = sync.snapshot().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, vec!["1", "2", "3"]);
}
