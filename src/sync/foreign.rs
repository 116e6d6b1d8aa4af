//! Other writers' facts: entries of pulled prefix-cache values for pods this
//! replica does not route to (another gateway's pods, e.g. an AIBrix
//! gateway's Kubernetes pod names) or for models it has no registry slot for.
//!
//! The filter never routes by them (only members of its own pools are ever
//! chosen), but it must not erase them: when it pushes a block it writes the
//! whole value, so what it pulled from others is carried in what it pushes
//! back. Bounded: at most [`MAX_PER_BLOCK`] entries per block (the newest
//! win) and `capacity` entries in all (further ones are dropped and
//! counted); empty names and names longer than [`MAX_NAME_LEN`] are
//! dropped; entries idle
//! past `horizon_secs` are swept. Lives in the sync singleton's VM memory
//! only: workers never read it.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Most foreign (model, pod) entries kept for one block; the newest win.
pub(crate) const MAX_PER_BLOCK: usize = 32;
/// Longest model or pod name kept (a Kubernetes name is at most 253 bytes).
pub(crate) const MAX_NAME_LEN: usize = 253;

/// One foreign fact of a block: model, pod and the writer's time (unix nanos,
/// clamped to now when it was pulled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForeignEntry {
    pub(crate) model: Rc<str>,
    pub(crate) pod: Rc<str>,
    pub(crate) nanos: u64,
}

/// Bounded store of other writers' facts, by block.
#[derive(Debug)]
pub(crate) struct ForeignFacts {
    by_block: HashMap<u64, Vec<ForeignEntry>>,
    names: HashSet<Rc<str>>,
    len: usize,
    capacity: usize,
    dropped: u64,
}

impl ForeignFacts {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            by_block: HashMap::new(),
            names: HashSet::new(),
            len: 0,
            capacity,
            dropped: 0,
        }
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entries dropped so far (a full store, a full block, an empty or too long
    /// name).
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// This block's foreign entries.
    pub(crate) fn of(&self, block: u64) -> &[ForeignEntry] {
        self.by_block.get(&block).map_or(&[], Vec::as_slice)
    }

    fn intern(&mut self, s: &str) -> Rc<str> {
        if let Some(r) = self.names.get(s) {
            return r.clone();
        }
        let r: Rc<str> = Rc::from(s);
        self.names.insert(r.clone());
        r
    }

    /// Merges one pulled entry: the newer time per (model, pod) wins.
    pub(crate) fn merge(&mut self, block: u64, model: &str, pod: &str, nanos: u64) {
        let bad = |n: &str| n.is_empty() || n.len() > MAX_NAME_LEN;
        if bad(model) || bad(pod) {
            self.dropped += 1;
            return;
        }
        if let Some(e) = self
            .by_block
            .get_mut(&block)
            .and_then(|es| es.iter_mut().find(|e| &*e.model == model && &*e.pod == pod))
        {
            e.nanos = e.nanos.max(nanos);
            return;
        }
        let full_block = self.of(block).len() >= MAX_PER_BLOCK;
        if !full_block && self.len >= self.capacity {
            self.dropped += 1;
            return;
        }
        let entry = ForeignEntry {
            model: self.intern(model),
            pod: self.intern(pod),
            nanos,
        };
        let es = self.by_block.entry(block).or_default();
        if full_block {
            // Replace the oldest if this one is newer.
            self.dropped += 1;
            if let Some(oldest) = es.iter_mut().min_by_key(|e| e.nanos) {
                if oldest.nanos < nanos {
                    *oldest = entry;
                }
            }
            return;
        }
        es.push(entry);
        self.len += 1;
    }

    /// Drops entries last seen before `horizon_nanos`, and names no entry uses.
    pub(crate) fn sweep(&mut self, horizon_nanos: u64) {
        let mut len = 0;
        self.by_block.retain(|_, es| {
            es.retain(|e| e.nanos >= horizon_nanos);
            len += es.len();
            !es.is_empty()
        });
        self.len = len;
        self.names.retain(|n| Rc::strong_count(n) > 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn newer_time_wins_per_model_and_pod() {
        let mut f = ForeignFacts::new(10);
        f.merge(1, "m", "p", 5);
        f.merge(1, "m", "p", 3);
        f.merge(1, "m", "q", 4);
        assert_eq!(f.len(), 2);
        let times: Vec<u64> = f.of(1).iter().map(|e| e.nanos).collect();
        assert_eq!(times, vec![5, 4]);
        f.merge(1, "m", "p", 9);
        assert_eq!(f.of(1)[0].nanos, 9);
    }

    #[test]
    fn bounded_in_all_and_per_block_and_counted() {
        let mut f = ForeignFacts::new(3);
        for b in 0..5 {
            f.merge(b, "m", "p", 1);
        }
        assert_eq!(f.len(), 3);
        assert_eq!(f.dropped(), 2);

        let mut f = ForeignFacts::new(1000);
        for i in 0..(MAX_PER_BLOCK as u64 + 10) {
            f.merge(7, "m", &format!("pod-{i}"), i);
        }
        assert_eq!(f.of(7).len(), MAX_PER_BLOCK);
        assert_eq!(f.dropped(), 10);
        // The newest were kept.
        assert!(f.of(7).iter().all(|e| e.nanos >= 10));
        f.merge(7, &"x".repeat(MAX_NAME_LEN + 1), "p", 100);
        assert_eq!(f.dropped(), 11);
        f.merge(8, "m", "", 100);
        f.merge(8, "", "p", 100);
        assert_eq!(f.dropped(), 13, "empty names are junk, not a pod");
        assert!(f.of(8).is_empty());
    }

    #[test]
    fn sweep_drops_old_entries_and_unused_names() {
        let mut f = ForeignFacts::new(10);
        f.merge(1, "m", "old", 1);
        f.merge(2, "m", "new", 10);
        f.sweep(5);
        assert_eq!(f.len(), 1);
        assert!(f.of(1).is_empty());
        assert_eq!(f.names.len(), 2, "m and new remain");
    }
}
