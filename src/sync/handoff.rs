//! How workers hand table changes to the sync singleton: after each routing
//! decision a worker enqueues one small binary message on a shared queue
//! (`model u16 | pod u16 | time u32 | (block u64 | anchor u32) ...`, little
//! endian); the singleton drains the queue into a bounded [`DirtySet`] of
//! blocks that the next push exports. Pulls write the table directly and never enqueue,
//! so remote facts are not echoed back.

use std::collections::{HashSet, VecDeque};

use crate::shared::registry::PodSlot;

/// Name of the shared queue (registered by the singleton, resolved by workers).
pub(crate) const QUEUE_NAME: &str = "prefix_router.dirty";

/// Blocks recorded for one (model, pod) at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touched {
    pub(crate) model: u16,
    pub(crate) pod: PodSlot,
    pub(crate) time: u32,
    /// (block hash, anchor): the anchor names the block's table bucket
    /// (see [`crate::route::table::Layout`]).
    pub blocks: Vec<(u64, u32)>,
}

const ENTRY_LEN: usize = 12;

pub fn encode(t: &Touched) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + t.blocks.len() * ENTRY_LEN);
    out.extend_from_slice(&t.model.to_le_bytes());
    out.extend_from_slice(&t.pod.to_le_bytes());
    out.extend_from_slice(&t.time.to_le_bytes());
    for (b, a) in &t.blocks {
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
    }
    out
}

/// None for a message too short to carry the header.
pub fn decode(bytes: &[u8]) -> Option<Touched> {
    let head = bytes.get(..8)?;
    Some(Touched {
        model: u16::from_le_bytes([head[0], head[1]]),
        pod: PodSlot::from_le_bytes([head[2], head[3]]),
        time: u32::from_le_bytes([head[4], head[5], head[6], head[7]]),
        blocks: bytes[8..]
            .chunks_exact(ENTRY_LEN)
            .map(|c| {
                (
                    u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                    u32::from_le_bytes([c[8], c[9], c[10], c[11]]),
                )
            })
            .collect(),
    })
}

/// Blocks (hash, anchor) changed since the last successful push, oldest
/// first, at most `capacity` of them: when full, the oldest is dropped (its
/// Redis key keeps its TTL; peers may miss that one refresh) and counted.
#[derive(Debug)]
pub struct DirtySet {
    order: VecDeque<(u64, u32)>,
    members: HashSet<u64>,
    capacity: usize,
    dropped: u64,
}

impl DirtySet {
    pub fn new(capacity: usize) -> Self {
        Self {
            order: VecDeque::new(),
            members: HashSet::new(),
            capacity: capacity.max(1),
            dropped: 0,
        }
    }

    pub fn mark(&mut self, block: u64, anchor: u32) {
        if !self.members.insert(block) {
            return;
        }
        self.order.push_back((block, anchor));
        while self.order.len() > self.capacity {
            if let Some((old, _)) = self.order.pop_front() {
                self.members.remove(&old);
                self.dropped += 1;
            }
        }
    }

    #[cfg(any(test, feature = "testkit"))]
    pub fn len(&self) -> usize {
        self.order.len()
    }

    #[cfg(any(test, feature = "testkit"))]
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The dirty blocks, (hash, anchor), oldest first (does not clear).
    pub fn blocks(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.order.iter().copied()
    }

    /// Forgets the given blocks after they were pushed; blocks marked again
    /// since the snapshot was taken stay dirty only if not in `pushed`.
    pub fn clear(&mut self, pushed: &[u64]) {
        for b in pushed {
            self.members.remove(b);
        }
        let members = &self.members;
        self.order.retain(|(b, _)| members.contains(b));
    }

    /// Blocks dropped because the set was full, since creation.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn message_round_trips() {
        let t = Touched {
            model: 3,
            pod: PodSlot::new(9),
            time: 1_700_000_000,
            blocks: vec![(1, 1), (u64::MAX, u32::MAX)],
        };
        assert_eq!(decode(&encode(&t)), Some(t));
        assert_eq!(decode(&[1, 2, 3]), None);
    }

    #[test]
    fn dirty_set_is_bounded_and_dedups() {
        let mut d = DirtySet::new(3);
        for b in [1, 2, 2, 3, 4] {
            d.mark(b, b as u32 + 10);
        }
        assert_eq!(
            d.blocks().collect::<Vec<_>>(),
            vec![(2, 12), (3, 13), (4, 14)]
        );
        assert_eq!(d.dropped(), 1);
        d.clear(&[2, 4]);
        assert_eq!(d.blocks().collect::<Vec<_>>(), vec![(3, 13)]);
        assert_eq!(d.len(), 1);
    }
}
