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
mod tests;
