//! Holding a request for a prefix its pod is still computing.
//!
//! The table records a prompt's blocks for its pod when the request is
//! routed, but the pod caches them only once its prefill is done (vLLM
//! caches a block when it is computed; podsim at the first token). A second
//! request of the same prefix routed to that pod meanwhile is predicted a
//! hit and computes the whole prefix again: a miss, and a slot busy for a
//! full prefill (the `pending-same` misses of `scripts/bench/misses.py`,
//! 7-9 per shared-prefix scenario for every router measured).
//!
//! With `hold.enabled`, such a request waits in Envoy until the earlier
//! request's first answer bytes pass (its prefill is done, so the prefix is
//! cached), then goes to the same pod and hits. It waits at most
//! `hold.max_ms` (checked on the worker's tick, so up to a tick more); it
//! never waits for a request that already answered. Its time to the first
//! token is then the rest of the earlier prefill plus its own uncached
//! tail, never more than the full prefill it would have computed, and the
//! pod computes the prefix once.
//!
//! One VM knows only the requests it routed itself: a request waits only
//! for one routed by the same worker VM. Everything is bounded:
//! [`MAX_COMPUTING`] prefixes in prefill are remembered (oldest forgotten
//! first), and at most `hold.max_waiting` requests wait at once (a request
//! past that goes on at once, counted).

use crate::route::registry::PodSlot;

/// Most prefixes in prefill one VM remembers.
pub(crate) const MAX_COMPUTING: usize = 64;

/// A request whose prefill has not answered yet: from block `at` on, its
/// pod is computing the prompt's blocks (`hash` is the block hash at `at`,
/// which by the chain names the whole prefix up to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Computing {
    owner: u32,
    pod: PodSlot,
    model: u16,
    at: u32,
    hash: u64,
}

/// A held request and whom it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiting {
    stream: u32,
    owner: u32,
    deadline_ms: u64,
}

/// One VM's prefixes in prefill and the requests held for them.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    computing: Vec<Computing>,
    waiting: Vec<Waiting>,
}

impl Holds {
    /// Stream `owner` was routed to `pod` and computes the prompt's blocks
    /// from `at` on (`hashes` are the prompt's block hashes). False (not
    /// remembered) when it computes nothing (`at` past the last block).
    pub(crate) fn computing(
        &mut self,
        owner: u32,
        pod: PodSlot,
        model: u16,
        hashes: &[u64],
        at: usize,
    ) -> bool {
        let Some(&hash) = hashes.get(at) else {
            return false;
        };
        if self.computing.len() >= MAX_COMPUTING {
            self.computing.remove(0);
        }
        self.computing.push(Computing {
            owner,
            pod,
            model,
            at: u32::try_from(at).unwrap_or(u32::MAX),
            hash,
        });
        true
    }

    /// The stream computing a part of this prompt's first `matched` blocks
    /// on `pod`, if one is: the request routed there on that match would
    /// find them not yet cached. The most recent such stream.
    pub(crate) fn computing_for(
        &self,
        pod: PodSlot,
        model: u16,
        hashes: &[u64],
        matched: usize,
    ) -> Option<u32> {
        self.computing
            .iter()
            .rev()
            .find(|c| {
                c.pod == pod
                    && c.model == model
                    && (c.at as usize) < matched
                    && hashes.get(c.at as usize) == Some(&c.hash)
            })
            .map(|c| c.owner)
    }

    /// Holds `stream` until `owner` answers or `deadline_ms`; false (not
    /// held) when `max_waiting` requests already wait.
    pub(crate) fn wait(
        &mut self,
        stream: u32,
        owner: u32,
        deadline_ms: u64,
        max_waiting: usize,
    ) -> bool {
        if self.waiting.len() >= max_waiting {
            return false;
        }
        self.waiting.push(Waiting {
            stream,
            owner,
            deadline_ms,
        });
        true
    }

    /// Stream `owner` answered (or ended): its prefix is no longer in
    /// prefill. Returns the streams held for it, to resume.
    pub(crate) fn answered(&mut self, owner: u32) -> Vec<u32> {
        self.computing.retain(|c| c.owner != owner);
        self.take_where(|w| w.owner == owner)
    }

    /// Held streams whose deadline has passed, to resume.
    pub(crate) fn expired(&mut self, now_ms: u64) -> Vec<u32> {
        self.take_where(|w| w.deadline_ms <= now_ms)
    }

    /// A held stream ended before it was resumed (client reset).
    pub(crate) fn left(&mut self, stream: u32) {
        self.waiting.retain(|w| w.stream != stream);
    }

    /// Requests held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.waiting.len()
    }

    fn take_where(&mut self, pick: impl Fn(&Waiting) -> bool) -> Vec<u32> {
        let mut out = Vec::new();
        self.waiting.retain(|w| {
            if pick(w) {
                out.push(w.stream);
                false
            } else {
                true
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: PodSlot = PodSlot::new(1);
    const OTHER: PodSlot = PodSlot::new(2);

    #[test]
    fn a_match_reaching_past_where_a_prefill_started_waits_for_it() {
        let mut h = Holds::default();
        let first = [10, 11, 12, 13];
        // Stream 7 holds nothing of it yet: it computes from block 0.
        assert!(h.computing(7, POD, 3, &first, 0));
        let second = [10, 11, 12, 99];
        assert_eq!(h.computing_for(POD, 3, &second, 3), Some(7));
        // Another pod, model or prompt is not held back by it.
        assert_eq!(h.computing_for(OTHER, 3, &second, 3), None);
        assert_eq!(h.computing_for(POD, 4, &second, 3), None);
        assert_eq!(h.computing_for(POD, 3, &[20, 11, 12], 3), None);
        // A match that ends where the prefill starts is cached already.
        h.computing(8, POD, 3, &[10, 11, 12, 13, 14], 3);
        assert_eq!(h.computing_for(POD, 3, &[10, 11, 12, 13], 3), Some(7));
        assert_eq!(h.answered(7), Vec::<u32>::new());
        assert_eq!(h.computing_for(POD, 3, &[10, 11, 12, 13], 3), None);
        assert_eq!(h.computing_for(POD, 3, &[10, 11, 12, 13, 14], 4), Some(8));
    }

    #[test]
    fn a_prompt_computing_nothing_is_not_remembered() {
        let mut h = Holds::default();
        assert!(!h.computing(1, POD, 0, &[5, 6], 2));
        assert_eq!(h.computing_for(POD, 0, &[5, 6], 2), None);
    }

    #[test]
    fn held_streams_resume_when_their_owner_answers_or_their_time_is_up() {
        let mut h = Holds::default();
        h.computing(1, POD, 0, &[5, 6], 0);
        assert!(h.wait(2, 1, 1_000, 8));
        assert!(h.wait(3, 1, 500, 8));
        assert!(h.wait(4, 9, 2_000, 8));
        assert_eq!(h.held(), 3);
        assert_eq!(h.expired(499), Vec::<u32>::new());
        assert_eq!(h.expired(500), vec![3]);
        assert_eq!(h.answered(1), vec![2]);
        h.left(4);
        assert_eq!(h.held(), 0);
        assert_eq!(h.expired(u64::MAX), Vec::<u32>::new());
    }

    #[test]
    fn both_lists_are_bounded() {
        let mut h = Holds::default();
        for owner in 0..(MAX_COMPUTING as u32 + 10) {
            h.computing(owner, POD, 0, &[u64::from(owner)], 0);
        }
        assert_eq!(h.computing.len(), MAX_COMPUTING);
        // The oldest were forgotten first.
        assert_eq!(h.computing_for(POD, 0, &[0], 1), None);
        assert_eq!(h.computing_for(POD, 0, &[70], 1), Some(70));
        assert!(h.wait(1, 0, 0, 2));
        assert!(h.wait(2, 0, 0, 2));
        assert!(!h.wait(3, 0, 0, 2));
        assert_eq!(h.held(), 2);
    }
}
