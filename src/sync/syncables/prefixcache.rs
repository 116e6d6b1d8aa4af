//! The `prefixcache` namespace: the prefix table as a [`Syncable`], byte
//! compatible with AIBrix's Go gateways (see the module docs of
//! [`crate::sync::syncables`]).

use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use super::{Clock, NANOS};
use crate::config::Settings;
use crate::fleet::SharedView;
use crate::route::table::{anchor_of, Layout, PrefixTable, Record, TableConfig};
use crate::shared::registry::{NameRegistry, REMOTE_SLOTS};
use crate::shared::store::SharedStore;
use crate::sync::foreign::ForeignFacts;
use crate::sync::handoff::{DirtySet, Touched};
use crate::sync::{Capabilities, Delta, Rejected, Syncable};

/// AIBrix's payload of one block, plus the block's anchor in the segment
/// layout (see [`crate::route::table::Layout`]), written only when it is not
/// the block's own: per-block payloads stay byte for byte AIBrix's.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockPayload {
    pub model_to_pods: BTreeMap<String, BTreeMap<String, u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) anchor: Option<u32>,
}

/// The prefix table as a syncable.
pub struct PrefixCacheSync<S: SharedStore> {
    namespace: String,
    store: S,
    settings: Rc<Settings>,
    fleet: SharedView,
    table: TableConfig,
    clock: Clock,
    dirty: DirtySet,
    /// Dirty blocks the last `delta()` skipped because they were evicted
    /// locally (per spec their Redis keys just expire): cleared with the push.
    skipped: std::cell::RefCell<Vec<u64>>,
    /// Model names by id, and when they were read (re-read every second:
    /// an id can name another model once its model retired).
    models: std::cell::RefCell<(Vec<Option<String>>, u32)>,
    /// Remote facts not applied to routing because their pod is not a
    /// member here or their model has no id (counted, exported as
    /// `sync.facts_ignored`); they are kept in `foreign` when it has room.
    ignored: std::cell::Cell<u64>,
    /// Other writers' entries, carried in what this replica pushes.
    foreign: std::cell::RefCell<ForeignFacts>,
}

impl<S: SharedStore> PrefixCacheSync<S> {
    pub fn new(
        store: S,
        settings: Rc<Settings>,
        fleet: SharedView,
        clock: Clock,
        max_dirty: usize,
    ) -> Self {
        let foreign_cap = settings.sync.foreign_max_entries;
        Self {
            fleet,
            namespace: settings.sync.namespaces.prefixcache.clone(),
            table: settings.table_config(),
            store,
            settings,
            clock,
            dirty: DirtySet::new(max_dirty),
            skipped: std::cell::RefCell::new(Vec::new()),
            models: std::cell::RefCell::new((Vec::new(), 0)),
            ignored: std::cell::Cell::new(0),
            foreign: std::cell::RefCell::new(ForeignFacts::new(foreign_cap)),
        }
    }

    /// Other writers' entries held, and how many were dropped at the caps.
    pub(crate) fn foreign_stats(&self) -> (usize, u64) {
        let f = self.foreign.borrow();
        (f.len(), f.dropped())
    }

    /// Marks blocks a worker recorded, for the next push.
    pub(crate) fn mark(&mut self, touched: &Touched) {
        for &(b, a) in &touched.blocks {
            self.dirty.mark(b, a);
        }
    }

    /// Marks every live block of the table for the next push (Redis
    /// restarted and may have lost every key). Bounded by the dirty set's
    /// capacity; returns how many blocks were marked.
    pub(crate) fn mark_all(&mut self) -> usize {
        let table = PrefixTable::new(&self.store, self.table);
        let mut blocks: Vec<(u64, u32)> = table
            .all_records(self.now())
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.block, r.anchor))
            .collect();
        blocks.sort_unstable();
        blocks.dedup_by_key(|(b, _)| *b);
        for &(b, a) in &blocks {
            self.dirty.mark(b, a);
        }
        blocks.len()
    }

    #[cfg(test)]
    pub(crate) fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    pub(crate) fn dirty_dropped(&self) -> u64 {
        self.dirty.dropped()
    }

    fn now(&self) -> u32 {
        u32::try_from((self.clock)()).unwrap_or(u32::MAX)
    }

    /// Remote facts ignored so far (unknown pod or model).
    pub fn facts_ignored(&self) -> u64 {
        self.ignored.get()
    }

    fn model_name(&self, id: u16) -> Option<String> {
        let now = self.now();
        let mut models = self.models.borrow_mut();
        if models.1 != now || models.0.is_empty() {
            if let Ok(reg) = NameRegistry::models(&self.store).load() {
                models.0 = reg.slots.into_iter().map(|s| s.map(|s| s.name)).collect();
                models.1 = now;
            }
        }
        models.0.get(usize::from(id)).cloned().flatten()
    }

    /// The payload of `block` (anchored at `anchor`) as this replica knows
    /// it, None if not held.
    pub(crate) fn payload(&self, block: u64, anchor: u32) -> Option<Vec<u8>> {
        let table = PrefixTable::new(&self.store, self.table);
        let records = table.block_records(block, anchor, self.now()).ok()?;
        self.encode(block, anchor, &records)
    }

    /// The value of `block`: this replica's records plus the other writers'
    /// entries it pulled. None when this replica holds nothing of it.
    fn encode(&self, block: u64, anchor: u32, records: &[Record]) -> Option<Vec<u8>> {
        let mut p = BlockPayload {
            anchor: (anchor != anchor_of(block)).then_some(anchor),
            ..BlockPayload::default()
        };
        let fleet = self.fleet.borrow();
        for r in records {
            let (Some(model), Some(pod)) = (self.model_name(r.model), fleet.name(r.pod)) else {
                continue;
            };
            p.model_to_pods
                .entry(model)
                .or_default()
                .insert(pod.to_string(), u64::from(r.last_access) * NANOS);
        }
        if p.model_to_pods.is_empty() {
            return None;
        }
        for e in self.foreign.borrow().of(block) {
            let t = p
                .model_to_pods
                .entry(e.model.to_string())
                .or_default()
                .entry(e.pod.to_string())
                .or_insert(0);
            *t = (*t).max(e.nanos);
        }
        serde_json::to_vec(&p).ok()
    }
}

impl<S: SharedStore> Syncable for PrefixCacheSync<S> {
    fn namespace(&self) -> String {
        self.namespace.clone()
    }

    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let table = PrefixTable::new(&self.store, self.table);
        let mut by_block: BTreeMap<u64, Vec<Record>> = BTreeMap::new();
        for r in table.all_records(self.now()).unwrap_or_default() {
            by_block.entry(r.block).or_default().push(r);
        }
        by_block
            .into_iter()
            .filter_map(|(b, rs)| {
                let anchor = rs.first()?.anchor;
                Some((b.to_string(), self.encode(b, anchor, &rs)?))
            })
            .collect()
    }

    fn apply_remote(&mut self, id: &str, payload: &[u8]) -> Result<(), Rejected> {
        let block: u64 = id
            .parse()
            .map_err(|_| Rejected(format!("id `{id}` is not a u64")))?;
        let p: BlockPayload =
            serde_json::from_slice(payload).map_err(|e| Rejected(format!("block {id}: {e}")))?;
        // Per block, a block is its own anchor whatever a value says; a
        // wrong anchor only files the facts where no probe looks.
        let anchor = match self.settings.table_layout() {
            Layout::PerBlock => anchor_of(block),
            Layout::Segments => p.anchor.unwrap_or_else(|| anchor_of(block)),
        };
        let now = self.now();
        let retire = self.settings.retire_secs();
        let fleet = self.fleet.borrow();
        let mut facts = Vec::new();
        let mut ignored = 0u64;
        let mut foreign = self.foreign.borrow_mut();
        let now_nanos = u64::from(now) * NANOS;
        for (model, pods) in &p.model_to_pods {
            // A model named only in Redis may take at most half the registry:
            // one hostile value cannot fill it for the models clients use.
            let id = NameRegistry::models(&self.store)
                .intern_within(&[model], now, retire, REMOTE_SLOTS)
                .ok()
                .and_then(|(ids, _)| ids.first().copied().flatten());
            let Some(model_id) = id else {
                ignored += pods.len() as u64;
                for (pod, nanos) in pods {
                    foreign.merge(block, model, pod, (*nanos).min(now_nanos));
                }
                continue;
            };
            for (pod_name, nanos) in pods {
                // Only pods that are members here now can be routed to;
                // the others' entries are kept to be carried back.
                let Some(pod) = fleet.slot_of(pod_name) else {
                    ignored += 1;
                    foreign.merge(block, model, pod_name, (*nanos).min(now_nanos));
                    continue;
                };
                facts.push(Record {
                    block,
                    anchor,
                    model: model_id,
                    pod,
                    // A time from the future would never idle out and win
                    // every merge: nobody saw the pod later than now.
                    last_access: u32::try_from(nanos / NANOS).unwrap_or(u32::MAX).min(now),
                });
            }
        }
        drop(fleet);
        drop(foreign);
        self.ignored.set(self.ignored.get() + ignored);
        PrefixTable::new(&self.store, self.table).upsert(&facts, now);
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delta: true,
            stale: true,
            ..Capabilities::default()
        }
    }

    fn delta(&self) -> Delta {
        // Other writers' entries idle past the table's expiry are dropped
        // (AIBrix's own gateways forget theirs after 20 minutes).
        let horizon = u64::from(
            self.now()
                .saturating_sub(self.settings.table_idle_expiry_secs),
        ) * NANOS;
        self.foreign.borrow_mut().sweep(horizon);
        let mut updated = Vec::new();
        let mut skipped = Vec::new();
        for (b, a) in self.dirty.blocks() {
            match self.payload(b, a) {
                Some(p) => updated.push((b.to_string(), p)),
                None => skipped.push(b),
            }
        }
        *self.skipped.borrow_mut() = skipped;
        Delta {
            updated,
            deleted: Vec::new(),
        }
    }

    /// Clears what was written (a push or a write-through), plus the evicted
    /// blocks the last delta skipped. Blocks marked again while a push was in
    /// flight stay dirty only if they were not in it: their newer time is in
    /// the table and the next touch marks them again.
    fn clear_dirty(&mut self, pushed_ids: &[String]) {
        let mut done: Vec<u64> = pushed_ids.iter().filter_map(|id| id.parse().ok()).collect();
        done.append(&mut self.skipped.borrow_mut());
        self.dirty.clear(&done);
    }

    /// Stale: every pod is one of this replica's members and its last
    /// access is past the idle expiry; such a key could only resurrect dead
    /// facts, so the pull deletes it. A key naming any pod this replica does
    /// not know is another writer's too: it is never deleted, it leaves by
    /// TTL.
    fn is_stale(&self, _id: &str, payload: &[u8]) -> bool {
        let Ok(p) = serde_json::from_slice::<BlockPayload>(payload) else {
            return false;
        };
        let horizon =
            (self.clock)().saturating_sub(u64::from(self.settings.table_idle_expiry_secs));
        let fleet = self.fleet.borrow();
        p.model_to_pods
            .values()
            .flat_map(|pods| pods.iter())
            .all(|(pod, nanos)| nanos / NANOS < horizon && fleet.slot_of(pod).is_some())
    }
}

#[cfg(test)]
mod tests {
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
        let sync =
            PrefixCacheSync::new(store.clone(), s.clone(), view(&store, &s), clock(secs), 100);
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
        let compat =
            Rc::new(Settings::from_json(br#"{"compat":"aibrix","cluster":"pods"}"#).unwrap());
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
            Settings::from_json(
                br#"{"endpoints":["a:1","b:1"],"sync":{"foreign_max_entries":100}}"#,
            )
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
}
