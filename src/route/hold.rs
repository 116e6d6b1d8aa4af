//! Holding a request for a prefix its pod is still computing.
//!
//! The table records a prompt's blocks for its pod when the request is
//! routed, but the pod caches them only once its prefill is done (vLLM
//! caches a block when it is computed; podsim at the first token). A second
//! request of the same prefix routed to that pod meanwhile is predicted a
//! hit and computes the whole prefix again: a miss, and a slot busy for a
//! full prefill (the `pending-same` misses of `scripts/bench/analysis/misses.py`,
//! 5-9 a run on the benchmark's shared-prefix workloads, for every router
//! measured).
//!
//! With `hold.enabled`, such a request waits in Envoy until the earlier
//! request's first answer bytes pass (its prefill is done, so the prefix is
//! cached), then goes to the same pod and hits. It waits at most
//! `hold.max_ms` (checked on the worker's tick, so up to a tick more); it
//! never waits for a request that already answered, nor for one another
//! Envoy routed unless a family claim says so (below). Its time to the first
//! token is then the rest of the earlier prefill plus its own uncached
//! tail, never more than the full prefill it would have computed, and the
//! pod computes the prefix once.
//!
//! Only a streamed request is waited for (its first answer chunk comes when
//! its prefill is done; a non-streamed answer only after the whole decode),
//! and only one that computes at least [`MIN_BLOCKS`] blocks (a smaller
//! prefill costs its pod little).
//!
//! Worker VMs of one Envoy share what is in prefill through one shared-data
//! key, [`SHARED_KEY`]: while other worker VMs are live, a VM lists there
//! each prefill it remembers (a CAS update at routing and one at its first
//! answer bytes), and
//! a request whose match on its pod was first recorded within the last
//! [`young_secs`] reads it (one get) when its own VM computes none of it.
//! A request held for another VM's prefill is resumed by its own VM's tick
//! (every [`crate::worker::FAST_TICK_MS`] while other VMs are live) once
//! the entry is gone. An entry carries its end (`hold.max_ms` after it was
//! listed), so a VM that dies leaves nothing behind for longer.
//!
//! Across replicas, with `sync.place_claim_ms`: a new prompt that Redis
//! placed on its family's claimed pod ([`Owner::Claim`]) learns from the
//! claim how long ago the family's first prompt was placed there and, by
//! its record, how many blocks the two share and how long that prompt is
//! (see [`crate::route::router::shared_with_claim`]). It waits until that
//! prompt's prefill should be done, by this VM's prefill timing of the
//! pod plus a sixteenth, when that wait and a fast tick are shorter than
//! computing the shared blocks itself would take and within `hold.max_ms`;
//! nothing tells it when the other replica's request answers, so only its
//! deadline resumes it. A VM that has timed no prefill tells Redis it
//! cannot wait, and is not sent to a claimed pod that is busy (see
//! [`crate::sync::place`]).
//!
//! Everything is bounded: [`MAX_COMPUTING`] prefixes in prefill are
//! remembered per VM and [`MAX_SHARED`] in the shared key (oldest forgotten
//! first; the requests held for one forgotten go on at once), and at most
//! `hold.max_waiting` requests wait at once per VM (a request past that
//! goes on at once, counted).

use crate::shared::registry::PodSlot;
use crate::shared::store::{cas_update, SharedStore, StoreError};

/// Most prefixes in prefill one VM remembers.
pub(crate) const MAX_COMPUTING: usize = 64;

/// A request whose prefill has not answered yet: from block `at` on, its
/// pod is computing the prompt's blocks (`hash` is the block hash at `at`,
/// which by the chain names the whole prefix up to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Computing {
    owner: u32,
    /// Also listed in [`SHARED_KEY`].
    shared: bool,
    pod: PodSlot,
    model: u16,
    at: u32,
    hash: u64,
}

/// Whose prefill a held request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A stream of this VM.
    Local(u32),
    /// A stream of another worker VM (its token), listed in [`SHARED_KEY`].
    Shared { token: u64, stream: u32 },
    /// The request that set the family claim this one followed, on another
    /// replica (`sync.place_claim_ms`): nothing tells when it answers, so
    /// the wait ends at its deadline, the prefill's expected end.
    Claim,
}

/// A held request and whom it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiting {
    stream: u32,
    owner: Owner,
    deadline_ms: u64,
}

/// Whether [`Holds::computing`] remembered a prefill, and what it forgot
/// to make room.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Remembered {
    No,
    Yes(Option<Forgotten>),
}

/// A prefill forgotten before it answered (see [`Holds::computing`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Forgotten {
    pub(crate) owner: u32,
    /// Listed in [`SHARED_KEY`]: to withdraw.
    pub(crate) shared: bool,
    /// Streams held for it: to resume.
    pub(crate) waiters: Vec<u32>,
}

/// One VM's prefixes in prefill and the requests held for them.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    computing: Vec<Computing>,
    waiting: Vec<Waiting>,
}

impl Holds {
    /// Stream `owner` was routed to `pod` and computes the prompt's blocks
    /// from `at` on (`hashes` are the prompt's block hashes). Remembered
    /// when that is at least [`MIN_BLOCKS`] blocks (a smaller prefill is
    /// not worth a wait); when [`MAX_COMPUTING`] are remembered already,
    /// the oldest is forgotten and returned with the streams held for it,
    /// which must go on now (and its listing, if shared, be withdrawn).
    pub(crate) fn computing(
        &mut self,
        owner: u32,
        pod: PodSlot,
        model: u16,
        hashes: &[u64],
        at: usize,
    ) -> Remembered {
        let Some(&hash) = hashes.get(at) else {
            return Remembered::No;
        };
        if hashes.len() - at < MIN_BLOCKS {
            return Remembered::No;
        }
        let mut forgot = None;
        if self.computing.len() >= MAX_COMPUTING {
            let old = self.computing.remove(0);
            let waiters = self.take_where(|w| w.owner == Owner::Local(old.owner));
            forgot = Some(Forgotten {
                owner: old.owner,
                shared: old.shared,
                waiters,
            });
        }
        self.computing.push(Computing {
            owner,
            shared: false,
            pod,
            model,
            at: u32::try_from(at).unwrap_or(u32::MAX),
            hash,
        });
        Remembered::Yes(forgot)
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
                reaches_into(
                    (c.pod, c.model, c.at, c.hash),
                    (pod, model, hashes, matched),
                )
            })
            .map(|c| c.owner)
    }

    /// Marks stream `owner`'s prefill as listed in [`SHARED_KEY`].
    pub(crate) fn mark_shared(&mut self, owner: u32) {
        if let Some(c) = self.computing.iter_mut().rev().find(|c| c.owner == owner) {
            c.shared = true;
        }
    }

    /// Holds `stream` until `owner` answers or `deadline_ms`; false (not
    /// held) when `max_waiting` requests already wait.
    pub(crate) fn wait(
        &mut self,
        stream: u32,
        owner: Owner,
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
    /// prefill. Returns the streams held for it, to resume, and whether
    /// its prefill was listed in [`SHARED_KEY`] (to withdraw).
    pub(crate) fn answered(&mut self, owner: u32) -> (Vec<u32>, bool) {
        let shared = self.computing.iter().any(|c| c.owner == owner && c.shared);
        self.computing.retain(|c| c.owner != owner);
        (self.take_where(|w| w.owner == Owner::Local(owner)), shared)
    }

    /// Whether a held request waits for another VM's prefill.
    pub(crate) fn waits_on_shared(&self) -> bool {
        self.waiting
            .iter()
            .any(|w| matches!(w.owner, Owner::Shared { .. }))
    }

    /// Held streams whose other-VM prefill is no longer listed (`listed`
    /// is the shared key's entries as read now), to resume.
    pub(crate) fn shared_done(&mut self, listed: &[SharedEntry]) -> Vec<u32> {
        self.take_where(|w| match w.owner {
            Owner::Shared { token, stream } => !listed
                .iter()
                .any(|e| e.token == token && e.stream == stream),
            Owner::Local(_) | Owner::Claim => false,
        })
    }

    /// Whether a held request waits for a claim's prefill (its deadline
    /// wants the fast tick).
    pub(crate) fn waits_on_claim(&self) -> bool {
        self.waiting.iter().any(|w| w.owner == Owner::Claim)
    }

    /// Held streams whose deadline has passed, to resume, and how many of
    /// them waited for a claim's prefill (whose deadline is its expected
    /// end, not a timeout).
    pub(crate) fn expired(&mut self, now_ms: u64) -> (Vec<u32>, usize) {
        let claims = self
            .waiting
            .iter()
            .filter(|w| w.deadline_ms <= now_ms && w.owner == Owner::Claim)
            .count();
        (self.take_where(|w| w.deadline_ms <= now_ms), claims)
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

/// Shared-data key listing the prefixes in prefill of every worker VM of
/// this Envoy.
pub(crate) const SHARED_KEY: &str = "hold/computing";
/// Most entries in [`SHARED_KEY`] (36 bytes each: 2,304 bytes at most).
pub(crate) const MAX_SHARED: usize = 64;
/// Least blocks a prefill must compute to be waited for (and listed for
/// other VMs): a smaller one (a new question after a known system prompt)
/// costs its pod little, and is not worth a wait or two CAS updates.
pub(crate) const MIN_BLOCKS: usize = 8;
/// CAS attempts of one update of [`SHARED_KEY`].
const CAS_ATTEMPTS: u32 = 4;
const ENTRY_BYTES: usize = 36;

/// How recently (seconds) a match must have been first recorded for a
/// request to look for it in another VM's prefill: a prefill lasts at most
/// about `hold.max_ms`, and the table keeps whole seconds.
pub(crate) fn young_secs(max_ms: u32) -> u32 {
    max_ms.div_ceil(1_000) + 1
}

/// One prefill listed in [`SHARED_KEY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SharedEntry {
    /// The listing VM's token (unique per VM of the Envoy).
    pub(crate) token: u64,
    pub(crate) stream: u32,
    pub(crate) pod: PodSlot,
    pub(crate) model: u16,
    pub(crate) at: u32,
    pub(crate) hash: u64,
    /// Void from then on (the owner's VM may have died).
    pub(crate) until_ms: u64,
}

impl SharedEntry {
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.stream.to_le_bytes());
        out.extend_from_slice(&self.pod.to_le_bytes());
        out.extend_from_slice(&self.model.to_le_bytes());
        out.extend_from_slice(&self.at.to_le_bytes());
        out.extend_from_slice(&self.hash.to_le_bytes());
        out.extend_from_slice(&self.until_ms.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<SharedEntry> {
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u16_at = |i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?));
        Some(SharedEntry {
            token: u64_at(0)?,
            stream: u32_at(8)?,
            pod: PodSlot::new(u16_at(12)?),
            model: u16_at(14)?,
            at: u32_at(16)?,
            hash: u64_at(20)?,
            until_ms: u64_at(28)?,
        })
    }

    /// Whether a request of `model` matching `matched` blocks of `hashes`
    /// on `pod` reaches into this prefill.
    fn covers(&self, pod: PodSlot, model: u16, hashes: &[u64], matched: usize) -> bool {
        reaches_into(
            (self.pod, self.model, self.at, self.hash),
            (pod, model, hashes, matched),
        )
    }
}

/// Whether a request of `model` matching the first `matched` blocks of
/// `hashes` on `pod` reaches into a prefill computing that pod's blocks of
/// `model` from block `at` on, whose block there hashes to `hash` (by the
/// chain, that names the whole prefix up to it).
fn reaches_into(
    (pod, model, at, hash): (PodSlot, u16, u32, u64),
    (req_pod, req_model, hashes, matched): (PodSlot, u16, &[u64], usize),
) -> bool {
    pod == req_pod
        && model == req_model
        && (at as usize) < matched
        && hashes.get(at as usize) == Some(&hash)
}

/// The live entries of a [`SHARED_KEY`] value (at most [`MAX_SHARED`];
/// a malformed tail is ignored).
pub(crate) fn decode_shared(bytes: &[u8], now_ms: u64) -> Vec<SharedEntry> {
    bytes
        .chunks_exact(ENTRY_BYTES)
        .take(MAX_SHARED)
        .filter_map(SharedEntry::decode)
        .filter(|e| e.until_ms > now_ms)
        .collect()
}

fn encode_shared(entries: &[SharedEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for e in entries {
        e.encode_into(&mut out);
    }
    out
}

/// Lists `entry` (dropping void entries, and the one ending first when
/// full). One get and one set, more on CAS contention.
pub(crate) fn list_shared<S: SharedStore + ?Sized>(
    store: &S,
    entry: SharedEntry,
    now_ms: u64,
) -> Result<(), StoreError> {
    cas_update(store, SHARED_KEY, CAS_ATTEMPTS, |cur| {
        let mut entries = decode_shared(cur.unwrap_or_default(), now_ms);
        entries.retain(|e| !(e.token == entry.token && e.stream == entry.stream));
        if entries.len() >= MAX_SHARED {
            if let Some(first) = (0..entries.len()).min_by_key(|&i| entries[i].until_ms) {
                entries.remove(first);
            }
        }
        entries.push(entry);
        Some(encode_shared(&entries))
    })
    .map(|_| ())
}

/// Withdraws stream `stream` of VM `token` (and void entries). One get,
/// and one set when something changed.
pub(crate) fn withdraw_shared<S: SharedStore + ?Sized>(
    store: &S,
    token: u64,
    stream: u32,
    now_ms: u64,
) -> Result<(), StoreError> {
    cas_update(store, SHARED_KEY, CAS_ATTEMPTS, |cur| {
        let cur = cur.unwrap_or_default();
        let mut entries = decode_shared(cur, now_ms);
        entries.retain(|e| !(e.token == token && e.stream == stream));
        let value = encode_shared(&entries);
        (value.as_slice() != cur).then_some(value)
    })
    .map(|_| ())
}

/// The other VM's prefill (not `own_token`'s) that a request of `model`
/// matching `matched` blocks of `hashes` on `pod` reaches into, if one is
/// listed: the most recently listed.
pub(crate) fn find_shared(
    entries: &[SharedEntry],
    own_token: u64,
    pod: PodSlot,
    model: u16,
    hashes: &[u64],
    matched: usize,
) -> Option<Owner> {
    entries
        .iter()
        .rev()
        .find(|e| e.token != own_token && e.covers(pod, model, hashes, matched))
        .map(|e| Owner::Shared {
            token: e.token,
            stream: e.stream,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const POD: PodSlot = PodSlot::new(1);
    const OTHER: PodSlot = PodSlot::new(2);

    /// A prompt of `n` blocks whose hashes start at `first`.
    fn chain(first: u64, n: u64) -> Vec<u64> {
        (first..first + n).collect()
    }

    fn remembered(r: Remembered) -> bool {
        matches!(r, Remembered::Yes(_))
    }

    #[test]
    fn a_match_reaching_past_where_a_prefill_started_waits_for_it() {
        let mut h = Holds::default();
        // Stream 7 holds nothing of its prompt yet: it computes from block 0.
        assert!(remembered(h.computing(7, POD, 3, &chain(10, 12), 0)));
        let mut second = chain(10, 12);
        second[11] = 99;
        assert_eq!(h.computing_for(POD, 3, &second, 11), Some(7));
        // Another pod, model or prompt is not held back by it.
        assert_eq!(h.computing_for(OTHER, 3, &second, 11), None);
        assert_eq!(h.computing_for(POD, 4, &second, 11), None);
        assert_eq!(h.computing_for(POD, 3, &chain(20, 12), 11), None);
        // A match that ends where a prefill starts is cached already.
        assert!(remembered(h.computing(8, POD, 3, &chain(10, 20), 11)));
        assert_eq!(h.computing_for(POD, 3, &chain(10, 20), 11), Some(7));
        assert_eq!(h.answered(7), (Vec::<u32>::new(), false));
        assert_eq!(h.computing_for(POD, 3, &chain(10, 20), 11), None);
        assert_eq!(h.computing_for(POD, 3, &chain(10, 20), 12), Some(8));
    }

    #[test]
    fn a_short_or_empty_prefill_is_not_remembered() {
        let mut h = Holds::default();
        assert_eq!(h.computing(1, POD, 0, &[5, 6], 2), Remembered::No);
        let tail = MIN_BLOCKS as u64 - 1;
        assert_eq!(
            h.computing(1, POD, 0, &chain(5, 4 + tail), 4),
            Remembered::No
        );
        assert_eq!(h.computing_for(POD, 0, &chain(5, 4 + tail), 5), None);
        assert!(remembered(h.computing(1, POD, 0, &chain(5, 5 + tail), 4)));
    }

    #[test]
    fn a_claims_wait_ends_only_at_its_deadline_and_is_no_timeout() {
        let mut h = Holds::default();
        assert!(remembered(h.computing(1, POD, 0, &chain(5, 10), 0)));
        assert!(h.wait(5, Owner::Claim, 700, 8));
        assert!(h.wait(6, Owner::Local(1), 700, 8));
        assert!(h.waits_on_claim() && !h.waits_on_shared());
        // No answer or listing of this Envoy ends it.
        assert_eq!(h.answered(1), (vec![6], false));
        assert_eq!(h.shared_done(&[]), Vec::<u32>::new());
        assert_eq!(h.expired(699), (Vec::<u32>::new(), 0));
        assert_eq!(h.expired(700), (vec![5], 1));
        assert!(!h.waits_on_claim());
    }

    #[test]
    fn held_streams_resume_when_their_owner_answers_or_their_time_is_up() {
        let mut h = Holds::default();
        assert!(remembered(h.computing(1, POD, 0, &chain(5, 10), 0)));
        assert!(h.wait(2, Owner::Local(1), 1_000, 8));
        assert!(h.wait(3, Owner::Local(1), 500, 8));
        assert!(h.wait(4, Owner::Local(9), 2_000, 8));
        assert_eq!(h.held(), 3);
        assert_eq!(h.expired(499), (Vec::<u32>::new(), 0));
        assert_eq!(h.expired(500), (vec![3], 0));
        assert_eq!(h.answered(1), (vec![2], false));
        h.left(4);
        assert_eq!(h.held(), 0);
        assert_eq!(h.expired(u64::MAX), (Vec::<u32>::new(), 0));
    }

    #[test]
    fn both_lists_are_bounded_and_a_forgotten_prefill_releases_its_waiters() {
        let mut h = Holds::default();
        let prompt = |owner: u32| chain(1_000 * u64::from(owner), 10);
        assert!(remembered(h.computing(0, POD, 0, &prompt(0), 0)));
        h.mark_shared(0);
        assert!(h.wait(500, Owner::Local(0), 9_000, 8));
        let mut forgotten = Vec::new();
        for owner in 1..(MAX_COMPUTING as u32 + 10) {
            match h.computing(owner, POD, 0, &prompt(owner), 0) {
                Remembered::Yes(Some(f)) => forgotten.push(f),
                Remembered::Yes(None) => {}
                Remembered::No => panic!("{owner} not remembered"),
            }
        }
        assert_eq!(h.computing.len(), MAX_COMPUTING);
        // The oldest were forgotten first; the first one's waiter goes on.
        assert_eq!(forgotten.len(), 10);
        assert_eq!(
            forgotten[0],
            Forgotten {
                owner: 0,
                shared: true,
                waiters: vec![500]
            }
        );
        assert_eq!(h.computing_for(POD, 0, &prompt(0), 1), None);
        assert_eq!(h.computing_for(POD, 0, &prompt(70), 1), Some(70));
        assert_eq!(h.held(), 0);
        assert!(h.wait(1, Owner::Local(70), 0, 2));
        assert!(h.wait(2, Owner::Local(70), 0, 2));
        assert!(!h.wait(3, Owner::Local(70), 0, 2));
        assert_eq!(h.held(), 2);
    }

    fn entry(token: u64, stream: u32, hash: u64, until_ms: u64) -> SharedEntry {
        SharedEntry {
            token,
            stream,
            pod: POD,
            model: 3,
            at: 0,
            hash,
            until_ms,
        }
    }

    #[test]
    fn the_shared_list_round_trips_and_drops_void_entries() {
        let store = MemStore::default();
        list_shared(&store, entry(1, 10, 100, 5_000), 0).unwrap();
        list_shared(&store, entry(2, 20, 200, 1_000), 0).unwrap();
        // Listing again replaces the stream's entry.
        list_shared(&store, entry(1, 10, 101, 6_000), 0).unwrap();
        let bytes = store.get(SHARED_KEY).unwrap().0.unwrap();
        assert_eq!(
            decode_shared(&bytes, 0),
            vec![entry(2, 20, 200, 1_000), entry(1, 10, 101, 6_000)]
        );
        // Past its end an entry is void, and the next update drops it.
        assert_eq!(decode_shared(&bytes, 1_000), vec![entry(1, 10, 101, 6_000)]);
        withdraw_shared(&store, 1, 10, 2_000).unwrap();
        let bytes = store.get(SHARED_KEY).unwrap().0.unwrap();
        assert!(bytes.is_empty(), "{bytes:?}");
        // A malformed tail is ignored.
        let mut junk = encode_shared(&[entry(3, 1, 7, 9_000)]);
        junk.extend_from_slice(&[1, 2, 3]);
        assert_eq!(decode_shared(&junk, 0), vec![entry(3, 1, 7, 9_000)]);
    }

    #[test]
    fn the_shared_list_is_bounded_and_drops_the_first_to_end() {
        let store = MemStore::default();
        for i in 0..MAX_SHARED as u64 + 5 {
            list_shared(&store, entry(1, i as u32, i, 10_000 + i), 0).unwrap();
        }
        let bytes = store.get(SHARED_KEY).unwrap().0.unwrap();
        let listed = decode_shared(&bytes, 0);
        assert_eq!(listed.len(), MAX_SHARED);
        assert_eq!(listed[0].stream, 5, "the five ending first were dropped");
        assert!(bytes.len() <= MAX_SHARED * ENTRY_BYTES);
    }

    #[test]
    fn another_vms_prefill_is_found_only_where_the_match_reaches_into_it() {
        let hashes = [100, 101, 102, 103];
        let mut far = entry(2, 20, 102, 9_000);
        far.at = 2;
        let listed = [entry(7, 70, 100, 9_000), far];
        let found =
            |own, pod, model, matched| find_shared(&listed, own, pod, model, &hashes, matched);
        assert_eq!(
            found(1, POD, 3, 3),
            Some(Owner::Shared {
                token: 2,
                stream: 20
            })
        );
        // Its own VM's entries are not looked at here.
        assert_eq!(
            found(2, POD, 3, 3),
            Some(Owner::Shared {
                token: 7,
                stream: 70
            })
        );
        // A match ending where that prefill starts reaches the older one only.
        assert_eq!(
            found(1, POD, 3, 2),
            Some(Owner::Shared {
                token: 7,
                stream: 70
            })
        );
        assert_eq!(found(1, OTHER, 3, 3), None);
        assert_eq!(found(1, POD, 4, 3), None);
        assert_eq!(found(1, POD, 3, 0), None);
    }

    #[test]
    fn a_held_stream_waiting_on_another_vm_goes_on_when_it_is_no_longer_listed() {
        let mut h = Holds::default();
        let owner = Owner::Shared {
            token: 2,
            stream: 20,
        };
        assert!(h.wait(5, owner, 9_000, 8));
        assert!(h.wait(6, Owner::Local(1), 9_000, 8));
        assert!(h.waits_on_shared());
        assert_eq!(h.shared_done(&[entry(2, 20, 1, 9_000)]), Vec::<u32>::new());
        assert_eq!(h.shared_done(&[entry(2, 21, 1, 9_000)]), vec![5]);
        assert!(!h.waits_on_shared());
        assert_eq!(h.answered(1), (vec![6], false));
    }
}
