//! In-flight requests per pod: what the load guard weighs.
//!
//! Each worker VM counts its own streams in memory ([`VmLoad`]). On its
//! tick (250 ms) the VM publishes its counts to a key of its own,
//! `load/worker/<i>`, and reads the other VMs' keys and the other replicas'
//! total (`load/remote`, written by the sync singleton).
//!
//! While other VMs of the replica are live, each request also exchanges at
//! once: routing reads the keys of the other VMs that were live at the last
//! tick (at most [`FRESH_READS`]), and the VM writes its own counts when it
//! routes a request and when one ends. With two workers that is one get and
//! two sets per request. Counts as of the last tick were not enough: with
//! two workers and nothing cached, both VMs sent new requests to the pod
//! that had looked idle a tick ago (TTFT p99 362-393 ms against 284-302 ms
//! with one worker, whose counts are all its own). A lone worker VM makes
//! no such call. Routing thus weighs this replica's in-flight counts as of
//! now, and the other replicas' as of the last sync.
//!
//! A published value carries the VM's token and the time it was written. A
//! VM that dies or is reloaded stops writing; once its value is older than
//! [`VM_STALE_MS`] nobody counts it any more, and its key can be claimed by
//! a new VM, so its pods never look loaded for good. Keys are claimed lowest
//! index first (at most [`MAX_VMS`]); a reader stops at the first key never
//! written.
//!
//! Each VM also counts, per pod, the requests it sent and the new prefixes
//! it placed recently (halved whenever one reaches [`HALVE_AT`]), and the
//! sum of the send times of its requests in flight. They travel with the
//! counts, so that the load-aware ties (sent, placed, age) weigh the
//! replica's traffic, not one worker's share of it.
//!
//! A published value is `token u64 | at_ms u64 | version u8 (1)`, then per
//! pod slot (index = the pod's registry slot, see
//! [`crate::route::registry`]) `count u32 | sent u32 | placed u32 | sent_ms
//! u64`, little endian. A value of another version counts nothing but
//! keeps its key taken while live, so VMs of two builds never claim one
//! key.

use crate::route::registry::{PodSlot, MAX_SLOTS};
use crate::route::store::{SharedStore, StoreError};

/// Key holding the other replicas' total, per slot (sync singleton only).
const REMOTE_KEY: &str = "load/remote";
/// The VMs' keys. (Builds before the version byte wrote counts alone to
/// `load/vm/<i>`; a new key keeps them from misreading the rest as counts.)
const VM_KEY_PREFIX: &str = "load/worker/";
/// Most worker VMs whose counts are kept (keys `load/worker/0..MAX_VMS`).
pub(crate) const MAX_VMS: usize = 64;
/// A VM's counts stop counting this long after its last publish (20 ticks).
pub const VM_STALE_MS: u64 = 5_000;
/// Token, time and version before the counts.
const HEADER: usize = 17;
/// The layout of a published value this build writes and reads.
const VERSION: u8 = 1;
/// Bytes per pod slot in a published value.
const SLOT_BYTES: usize = 20;
/// Most other VMs' keys read per routed request ([`VmLoad::read_others`]);
/// the counts of any beyond are those read on the tick.
pub(crate) const FRESH_READS: usize = 7;
/// Ticks of this replica's peak in-flight counts a VM remembers (2 s at
/// 250 ms): how far back a pod's report can be set against what this
/// replica had sent it (see [`VmLoad::peak_since`]).
const PEAK_TICKS: usize = 8;
/// Sent and placed counts halve, every slot, when one reaches this: they
/// follow recent traffic.
pub(crate) const HALVE_AT: u32 = 256;

fn vm_key(i: usize) -> String {
    format!("{VM_KEY_PREFIX}{i}")
}

/// Per pod slot, what one VM, or several summed, has in flight and sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Tally {
    /// Requests in flight.
    counts: Vec<u32>,
    /// Requests sent recently.
    sent: Vec<u32>,
    /// New prefixes placed recently.
    placed: Vec<u32>,
    /// The sum of the send times (ms) of the requests in flight.
    sent_ms: Vec<u64>,
}

impl Tally {
    /// Slots with anything recorded.
    fn len(&self) -> usize {
        self.counts
            .len()
            .max(self.sent.len())
            .max(self.placed.len())
            .max(self.sent_ms.len())
    }

    /// Adds `other`, slot by slot (saturating).
    fn add(&mut self, other: &Tally) {
        add_into(&mut self.counts, &other.counts);
        add_into(&mut self.sent, &other.sent);
        add_into(&mut self.placed, &other.placed);
        add_sums_into(&mut self.sent_ms, &other.sent_ms);
    }
}

/// One VM's published value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    token: u64,
    at_ms: u64,
    tally: Tally,
}

impl Published {
    /// The value a VM with `token` writes at `at_ms` for its `tally`.
    fn encode(token: u64, at_ms: u64, tally: &Tally) -> Vec<u8> {
        let n = tally.len().min(MAX_SLOTS);
        let mut out = Vec::with_capacity(HEADER + SLOT_BYTES * n);
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&at_ms.to_le_bytes());
        out.push(VERSION);
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        for i in 0..n {
            out.extend_from_slice(&at(&tally.counts, i).to_le_bytes());
            out.extend_from_slice(&at(&tally.sent, i).to_le_bytes());
            out.extend_from_slice(&at(&tally.placed, i).to_le_bytes());
            let sum = tally.sent_ms.get(i).copied().unwrap_or(0);
            out.extend_from_slice(&sum.to_le_bytes());
        }
        out
    }

    /// None for an empty or malformed value; nothing counted for a value
    /// of another version.
    fn decode(bytes: &[u8]) -> Option<Published> {
        let token = u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
        let at_ms = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        let version = *bytes.get(16)?;
        let slots = if version == VERSION {
            &bytes[HEADER..]
        } else {
            &[]
        };
        let mut tally = Tally::default();
        for slot in slots.chunks_exact(SLOT_BYTES).take(MAX_SLOTS) {
            let u32_at = |at: usize| u32::from_le_bytes([slot[at], slot[at + 1], slot[at + 2], slot[at + 3]]);
            tally.counts.push(u32_at(0));
            tally.sent.push(u32_at(4));
            tally.placed.push(u32_at(8));
            let mut sum = [0; 8];
            sum.copy_from_slice(&slot[12..20]);
            tally.sent_ms.push(u64::from_le_bytes(sum));
        }
        Some(Published {
            token,
            at_ms,
            tally,
        })
    }

    fn live(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) <= VM_STALE_MS
    }
}

/// A request [`VmLoad`] counts in flight: its number among this VM's
/// requests and when it was sent (ms). [`VmLoad::end`] takes it back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ticket {
    pub seq: u64,
    pub sent_ms: u64,
}

/// One worker VM's in-flight counts and its picture of everyone else's.
#[derive(Debug)]
pub(crate) struct VmLoad {
    token: u64,
    /// The `load/worker/<i>` key this VM holds, once claimed.
    key: Option<usize>,
    /// This VM's own, exact.
    own: Tally,
    /// Other live VMs of this replica, as of the last refresh or read.
    others: Tally,
    /// The keys of the other VMs live at the last refresh, read again
    /// per request (at most [`FRESH_READS`]).
    other_keys: Vec<usize>,
    /// What the refresh read of the live VMs past [`FRESH_READS`].
    others_rest: Tally,
    /// Other replicas (sync), as of the last refresh.
    remote: Vec<u32>,
    /// The most requests this VM had in flight per slot since the last
    /// refresh.
    own_peak: Vec<u32>,
    /// Per tick (ending at the time given), this replica's peak in-flight
    /// counts: this VM's peak plus the other VMs' published counts. At
    /// most [`PEAK_TICKS`], oldest first.
    peaks: std::collections::VecDeque<(u64, Vec<u32>)>,
    /// The next request's number: this VM numbers the requests it routes.
    next_seq: u64,
    /// Per slot, the sum of the numbers of this VM's requests in flight.
    seq_sum: Vec<u64>,
}

impl VmLoad {
    /// `token` tells this VM's key from another's: it must be unique among
    /// the VMs sharing the store (see [`crate::worker::vm_number`]).
    pub(crate) fn new(token: u64) -> Self {
        Self {
            token,
            key: None,
            own: Tally::default(),
            others: Tally::default(),
            other_keys: Vec::new(),
            others_rest: Tally::default(),
            remote: Vec::new(),
            own_peak: Vec::new(),
            peaks: std::collections::VecDeque::new(),
            next_seq: 0,
            seq_sum: Vec::new(),
        }
    }

    /// Counts a request routed to `pod` at `now_ms` in flight and sent
    /// there (and, when it places a `new_prefix`, placed there); returns
    /// its ticket, for [`Self::end`].
    pub(crate) fn start(&mut self, pod: PodSlot, now_ms: u64, new_prefix: bool) -> Ticket {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.add(pod, 1);
        let i = pod.index();
        if i < MAX_SLOTS {
            add_at(&mut self.seq_sum, i, seq);
            add_at(&mut self.own.sent_ms, i, now_ms);
            bump(&mut self.own.sent, i);
            if new_prefix {
                bump(&mut self.own.placed, i);
            }
        }
        Ticket {
            seq,
            sent_ms: now_ms,
        }
    }

    /// Ends the request of `ticket` on `pod`; returns this VM's new count
    /// there.
    pub(crate) fn end(&mut self, pod: PodSlot, ticket: Ticket) -> u32 {
        let i = pod.index();
        if let Some(s) = self.seq_sum.get_mut(i) {
            *s = s.saturating_sub(ticket.seq);
        }
        if let Some(s) = self.own.sent_ms.get_mut(i) {
            *s = s.saturating_sub(ticket.sent_ms);
        }
        self.add(pod, -1)
    }

    /// Per slot, the requests this replica sent recently: this VM's, plus
    /// the other VMs' as of their last publish (at least `n` long).
    pub(crate) fn sent(&self, n: usize) -> Vec<u32> {
        sum(&[&self.own.sent, &self.others.sent], n)
    }

    /// Per slot, the new prefixes this replica placed recently, like
    /// [`Self::sent`].
    pub(crate) fn placed(&self, n: usize) -> Vec<u32> {
        sum(&[&self.own.placed, &self.others.placed], n)
    }

    /// Per slot, how long ago the requests in flight there were sent, on
    /// average (0 with none; slots past the vector: none): the last tie of
    /// the load-aware policy. While other worker VMs of the replica are
    /// live, the replica's requests (theirs as of their last publish), in
    /// ms of the router's clock (the tick's: 20 ms while `hold` is on);
    /// else this VM's own, counted in requests it routed since, which
    /// needs no clock.
    pub(crate) fn age(&self, now_ms: u64) -> Vec<u64> {
        if !self.others_live() {
            return self.own_age();
        }
        let mut replica = self.others.clone();
        replica.add(&self.own);
        replica
            .counts
            .iter()
            .zip(replica.sent_ms.iter().chain(std::iter::repeat(&0)))
            .map(|(&count, &sum)| {
                sum.checked_div(u64::from(count))
                    .map_or(0, |mean| now_ms.saturating_sub(mean))
            })
            .collect()
    }

    /// Per slot, how long ago this VM sent its requests in flight there, on
    /// average, counted in requests it routed since (0 with none; slots
    /// past the vector: none).
    fn own_age(&self) -> Vec<u64> {
        self.own
            .counts
            .iter()
            .zip(self.seq_sum.iter().chain(std::iter::repeat(&0)))
            .map(|(&count, &sum)| {
                sum.checked_div(u64::from(count))
                    .map_or(0, |mean| self.next_seq.saturating_sub(mean))
            })
            .collect()
    }

    /// Adds `delta` to `pod`'s count of this VM (saturating at 0); returns
    /// the new count. Pods past [`MAX_SLOTS`] are not counted.
    pub(crate) fn add(&mut self, pod: PodSlot, delta: i32) -> u32 {
        let i = pod.index();
        if i >= MAX_SLOTS {
            return 0;
        }
        let own = &mut self.own.counts;
        if own.len() <= i {
            own.resize(i + 1, 0);
        }
        own[i] = own[i].saturating_add_signed(delta);
        if self.own_peak.len() <= i {
            self.own_peak.resize(i + 1, 0);
        }
        self.own_peak[i] = self.own_peak[i].max(own[i]);
        own[i]
    }

    /// The most requests this replica had in flight on `pod` at any time
    /// since `since_ms`, as far as this VM can tell: its own peak per tick
    /// plus the other VMs' counts as published, over the ticks that
    /// overlap `since_ms..now` (all that are remembered, [`PEAK_TICKS`],
    /// when `since_ms` is older). A pod's report taken at `since_ms` counts
    /// at most this many of this replica's requests; the rest were sent by
    /// someone else.
    pub(crate) fn peak_since(&self, pod: PodSlot, since_ms: u64) -> u32 {
        let i = pod.index();
        let at = |v: &[u32]| v.get(i).copied().unwrap_or(0);
        let current = at(&self.own_peak).saturating_add(at(&self.others.counts));
        // A tick's peak covers the time since the previous tick (its own
        // count at the start included): the ticks ending at or after
        // `since_ms` cover it.
        self.peaks
            .iter()
            .filter(|(end, _)| *end >= since_ms)
            .map(|(_, v)| at(v))
            .fold(current, u32::max)
    }

    /// This replica's in-flight count per slot (this VM exactly, the other
    /// VMs as of their last publish), at least `n` long.
    pub(crate) fn replica(&self, n: usize) -> Vec<u32> {
        sum(&[&self.own.counts, &self.others.counts], n)
    }

    /// [`Self::replica`] for one slot, without building the vector.
    pub(crate) fn replica_at(&self, slot: usize) -> u32 {
        let at = |v: &[u32]| v.get(slot).copied().unwrap_or(0);
        at(&self.own.counts).saturating_add(at(&self.others.counts))
    }

    /// [`Self::replica`] plus the other replicas' counts.
    pub(crate) fn fleet(&self, n: usize) -> Vec<u32> {
        sum(&[&self.own.counts, &self.others.counts, &self.remote], n)
    }

    /// The tick's exchange: publishes this VM's counts and reads the other
    /// VMs' (and, with `with_remote`, the other replicas' total). Costs one
    /// get per VM key ever written, one set, and one get for the remote.
    pub(crate) fn refresh<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        now_ms: u64,
        with_remote: bool,
    ) -> Result<(), StoreError> {
        // The tick that ends: this VM's peak and the other VMs' counts, the
        // higher of their last two reads.
        let mut tick_peak = self.own_peak.clone();
        let mut others = Tally::default();
        let mut other_keys = Vec::new();
        let mut rest = Tally::default();
        let mut mine: Option<(usize, Option<u32>)> = None;
        let mut free: Option<(usize, Option<u32>)> = None;
        for i in 0..MAX_VMS {
            let (value, cas) = store.get(&vm_key(i))?;
            let Some(bytes) = value else {
                free = free.or(Some((i, cas)));
                break;
            };
            match Published::decode(&bytes) {
                Some(p) if p.token == self.token => mine = Some((i, cas)),
                Some(p) if p.live(now_ms) => {
                    others.add(&p.tally);
                    if other_keys.len() < FRESH_READS {
                        other_keys.push(i);
                    } else {
                        rest.add(&p.tally);
                    }
                }
                _ => free = free.or(Some((i, cas))),
            }
        }
        let mut others_high = others.counts.clone();
        max_into(&mut others_high, &self.others.counts);
        add_into(&mut tick_peak, &others_high);
        if self.peaks.len() >= PEAK_TICKS {
            self.peaks.pop_front();
        }
        self.peaks.push_back((now_ms, tick_peak));
        self.own_peak.clone_from(&self.own.counts);
        self.others = others;
        self.other_keys = other_keys;
        self.others_rest = rest;
        self.remote = if with_remote {
            read_counts(store, REMOTE_KEY)?
        } else {
            Vec::new()
        };
        let value = Published::encode(self.token, now_ms, &self.own);
        // Our key, or (first tick, or it was taken while we stalled) the
        // first free one: written under the CAS just read, so two VMs never
        // hold one key; the loser tries again next tick.
        let Some((i, cas)) = mine.or(free) else {
            self.key = None;
            return Ok(());
        };
        let cas = match cas {
            Some(cas) => Some(cas),
            None => {
                // Envoy accepts any CAS for a key never written: create it
                // empty, then claim it under the CAS that gives.
                store.set(&vm_key(i), &[], None)?;
                store.get(&vm_key(i))?.1
            }
        };
        match store.set(&vm_key(i), &value, cas) {
            Ok(()) => {
                self.key = Some(i);
                Ok(())
            }
            Err(StoreError::CasMismatch) => {
                self.key = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the keys of the other VMs that were live at the last refresh
    /// (one get each, at most [`FRESH_READS`]), so that routing weighs
    /// their counts as of now. No call while this VM is the only one. On a
    /// store error the counts read before stand.
    pub(crate) fn read_others<S: SharedStore + ?Sized>(&mut self, store: &S, now_ms: u64) {
        if self.other_keys.is_empty() {
            return;
        }
        let mut others = self.others_rest.clone();
        for &i in &self.other_keys {
            let Ok((value, _)) = store.get(&vm_key(i)) else {
                return;
            };
            let published = value.as_deref().and_then(Published::decode);
            if let Some(p) = published.filter(|p| p.token != self.token && p.live(now_ms)) {
                others.add(&p.tally);
            }
        }
        self.others = others;
    }

    /// Writes this VM's counts to its key at once (one set, no CAS: the
    /// key is this VM's since its last refresh claimed it), for the other
    /// VMs' next reads. No call while this VM is the only one or before
    /// it has claimed a key. Returns whether it wrote.
    ///
    /// Without the CAS, a VM stalled for over [`VM_STALE_MS`] whose key
    /// was claimed by a new VM meanwhile overwrites that VM's counts once;
    /// the new VM's next tick claims another key.
    pub(crate) fn publish<S: SharedStore + ?Sized>(&self, store: &S, now_ms: u64) -> bool {
        let Some(i) = self.key.filter(|_| !self.other_keys.is_empty()) else {
            return false;
        };
        let value = Published::encode(self.token, now_ms, &self.own);
        store.set(&vm_key(i), &value, None).is_ok()
    }

    /// Whether other worker VMs of this replica were live at the last
    /// refresh.
    pub(crate) fn others_live(&self) -> bool {
        !self.other_keys.is_empty()
    }

    /// The token naming this VM (see [`VmLoad::new`]).
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// This VM's own in-flight count per slot.
    pub fn own(&self) -> &[u32] {
        &self.own.counts
    }

    /// The key index this VM publishes to (None before its first claim).
    #[cfg(test)]
    pub(crate) fn key(&self) -> Option<usize> {
        self.key
    }
}

/// Every live VM's published counts summed: the replica's in-flight load
/// as the sync singleton reports it to the others.
pub(crate) fn replica_total<S: SharedStore + ?Sized>(
    store: &S,
    now_ms: u64,
) -> Result<Vec<u32>, StoreError> {
    let mut total = Vec::new();
    for i in 0..MAX_VMS {
        let (Some(bytes), _) = store.get(&vm_key(i))? else {
            break;
        };
        if let Some(p) = Published::decode(&bytes).filter(|p| p.live(now_ms)) {
            add_into(&mut total, &p.tally.counts);
        }
    }
    Ok(total)
}

/// Replaces the other replicas' total per slot (sync singleton only).
pub(crate) fn set_remote<S: SharedStore + ?Sized>(
    store: &S,
    counts: &[u32],
) -> Result<(), StoreError> {
    let n = counts.len().min(MAX_SLOTS);
    store.set(REMOTE_KEY, &encode_counts(&counts[..n]), None)
}

#[cfg(any(test, feature = "testkit"))]
/// The other replicas' total per slot, as the singleton last wrote it.
pub fn remote<S: SharedStore + ?Sized>(store: &S) -> Result<Vec<u32>, StoreError> {
    read_counts(store, REMOTE_KEY)
}

fn read_counts<S: SharedStore + ?Sized>(store: &S, key: &str) -> Result<Vec<u32>, StoreError> {
    let (value, _) = store.get(key)?;
    Ok(decode_counts(value.as_deref().unwrap_or(&[])))
}

fn add_into(total: &mut Vec<u32>, counts: &[u32]) {
    if total.len() < counts.len() {
        total.resize(counts.len(), 0);
    }
    for (t, c) in total.iter_mut().zip(counts) {
        *t = t.saturating_add(*c);
    }
}

fn add_sums_into(total: &mut Vec<u64>, sums: &[u64]) {
    if total.len() < sums.len() {
        total.resize(sums.len(), 0);
    }
    for (t, s) in total.iter_mut().zip(sums) {
        *t = t.saturating_add(*s);
    }
}

/// Counts one in slot `i` of `counts` (grown to it); every slot halves
/// when one reaches [`HALVE_AT`].
fn bump(counts: &mut Vec<u32>, i: usize) {
    if counts.len() <= i {
        counts.resize(i + 1, 0);
    }
    counts[i] += 1;
    if counts[i] >= HALVE_AT {
        counts.iter_mut().for_each(|n| *n /= 2);
    }
}

/// Adds `value` to slot `i` of `sums` (grown to it).
fn add_at(sums: &mut Vec<u64>, i: usize, value: u64) {
    if sums.len() <= i {
        sums.resize(i + 1, 0);
    }
    sums[i] = sums[i].saturating_add(value);
}

fn max_into(high: &mut Vec<u32>, counts: &[u32]) {
    if high.len() < counts.len() {
        high.resize(counts.len(), 0);
    }
    for (h, c) in high.iter_mut().zip(counts) {
        *h = (*h).max(*c);
    }
}

fn sum(parts: &[&[u32]], n: usize) -> Vec<u32> {
    let mut total = vec![0; n.min(MAX_SLOTS)];
    for p in parts {
        add_into(&mut total, p);
    }
    total
}

fn decode_counts(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .take(MAX_SLOTS)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn encode_counts(counts: &[u32]) -> Vec<u8> {
    counts.iter().flat_map(|c| c.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn p(n: u16) -> PodSlot {
        PodSlot::new(n)
    }

    #[test]
    fn the_replica_peak_since_a_time_covers_every_tick_after_it() {
        let store = MemStore::default();
        let mut a = VmLoad::new(1);
        let mut b = VmLoad::new(2);
        // Tick ending at 250: a had 3 in flight at once, then 1.
        for _ in 0..3 {
            a.add(p(0), 1);
        }
        a.add(p(0), -2);
        b.add(p(0), 2);
        b.refresh(&store, 250, false).unwrap();
        a.refresh(&store, 250, false).unwrap();
        // Tick ending at 500: a ends its last one; b's 2 are published.
        a.add(p(0), -1);
        a.refresh(&store, 500, false).unwrap();
        // Now (after 500): nothing of a's.
        assert_eq!(a.replica(1), vec![2]);
        // Since 600: this tick only (a 0, b 2).
        assert_eq!(a.peak_since(p(0), 600), 2);
        // Since 400: the tick ending at 500 (a's 1 at its start, b's 2).
        assert_eq!(a.peak_since(p(0), 400), 3);
        // Since 100: the tick ending at 250 too (a's 3, b's 2).
        assert_eq!(a.peak_since(p(0), 100), 5);
        assert_eq!(a.peak_since(p(1), 100), 0);
        // Only PEAK_TICKS ticks are remembered.
        for t in 1..=PEAK_TICKS as u64 {
            a.refresh(&store, 500 + t * 250, false).unwrap();
        }
        assert_eq!(a.peak_since(p(0), 0), 2, "b's 2 only");
    }

    #[test]
    fn own_counts_are_exact_and_saturate_at_zero() {
        let mut vm = VmLoad::new(1);
        assert_eq!(vm.add(p(1), 1), 1);
        assert_eq!(vm.add(p(1), 1), 2);
        assert_eq!(vm.add(p(2), 1), 1);
        assert_eq!(vm.replica(3), vec![0, 2, 1]);
        assert_eq!(vm.add(p(0), -1), 0);
        let past = PodSlot::new(u16::try_from(MAX_SLOTS).unwrap());
        assert_eq!(vm.add(past, 1), 0, "out of range is not counted");
    }

    #[test]
    fn a_lone_vms_age_reads_how_many_requests_ago_its_requests_were_sent() {
        let mut vm = VmLoad::new(1);
        // The clock does not move: a lone VM counts requests, not time.
        let a = vm.start(p(0), 1000, true);
        let b = vm.start(p(1), 1000, true);
        let c = vm.start(p(1), 1000, true);
        // Three routed: pod 0's request is 3 old, pod 1's 2 and 1 (mean 1.5,
        // in whole requests 2), pod 2 has none.
        assert_eq!(vm.age(1000), vec![3, 2]);
        assert_eq!(vm.replica(3), vec![1, 2, 0]);
        assert_eq!(vm.end(p(0), a), 0);
        assert_eq!(vm.end(p(1), b), 1);
        assert_eq!(vm.age(1000), vec![0, 1]);
        assert_eq!(vm.end(p(1), c), 0);
        // Ending more than started, or a ticket never given, saturates.
        let never = Ticket {
            seq: u64::MAX,
            sent_ms: u64::MAX,
        };
        assert_eq!(vm.end(p(1), never), 0);
        assert_eq!(vm.age(1000), vec![0, 0]);
        let past = PodSlot::new(u16::try_from(MAX_SLOTS).unwrap());
        let d = vm.start(past, 1000, true);
        assert_eq!(vm.end(past, d), 0, "out of range is not counted");
        assert_eq!(vm.age(1000).len(), 2);
    }

    #[test]
    fn with_other_vms_live_the_age_is_the_replicas_in_ms() {
        let s = MemStore::new();
        let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
        a.refresh(&s, 1000, false).unwrap();
        b.refresh(&s, 1000, false).unwrap();
        a.refresh(&s, 1000, false).unwrap();
        assert!(a.others_live() && b.others_live());
        // A sends to pod 0 at 1000 and 1100; B to pod 1 at 1200, then to
        // pod 0 at 1300.
        let a1 = a.start(p(0), 1000, true);
        assert!(a.publish(&s, 1000));
        a.start(p(0), 1100, true);
        assert!(a.publish(&s, 1100));
        b.start(p(1), 1200, true);
        assert!(b.publish(&s, 1200));
        b.read_others(&s, 1300);
        b.start(p(0), 1300, true);
        // At 1400, for B: pod 0 holds the replica's 1000, 1100 and 1300
        // (mean 1133, 267 ms ago), pod 1 its own 1200. By B's own requests
        // alone pod 1's would be the older.
        assert_eq!(b.age(1400), vec![267, 200]);
        // A reads B's requests after B publishes; A's own end at once.
        assert!(b.publish(&s, 1300));
        a.read_others(&s, 1400);
        a.end(p(0), a1);
        assert_eq!(a.age(1400), vec![200, 200]);
        // A VM gone quiet past the stale bound: its requests age nothing.
        let late = 1401 + VM_STALE_MS;
        a.read_others(&s, late);
        assert_eq!(a.age(late), vec![late - 1100]);
    }

    #[test]
    fn sent_and_placed_counts_are_the_replicas_and_follow_recent_traffic() {
        let s = MemStore::new();
        let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
        // A lone VM: its own counts.
        a.start(p(0), 1000, true);
        a.start(p(0), 1000, false);
        assert_eq!((a.sent(2), a.placed(2)), (vec![2, 0], vec![1, 0]));
        a.refresh(&s, 1000, false).unwrap();
        b.refresh(&s, 1000, false).unwrap();
        a.refresh(&s, 1000, false).unwrap();
        // B sends to pod 1, new prefixes; A reads it per request.
        b.start(p(1), 1100, true);
        assert!(b.publish(&s, 1100));
        a.read_others(&s, 1200);
        assert_eq!((a.sent(2), a.placed(2)), (vec![2, 1], vec![1, 1]));
        assert_eq!((b.sent(2), b.placed(2)), (vec![2, 1], vec![1, 1]), "read on B's tick");
        // Ending a request leaves what was sent.
        let t = a.start(p(1), 1200, false);
        a.end(p(1), t);
        assert_eq!(a.sent(2), vec![2, 2]);
        // Every count halves when one reaches HALVE_AT.
        for _ in 0..HALVE_AT - 2 {
            a.start(p(0), 1300, false);
        }
        // A's [256, 1] halved to [128, 0], plus B's [0, 1].
        assert_eq!(a.sent(2), vec![HALVE_AT / 2, 1]);
        assert_eq!(a.placed(2), vec![1, 1], "placed counts halve on their own");
    }

    #[test]
    fn a_value_of_another_version_counts_nothing_but_keeps_its_key() {
        let s = MemStore::new();
        let tally = Tally {
            counts: vec![5, 0],
            sent: vec![9, 1],
            placed: vec![2],
            sent_ms: vec![5000],
        };
        let mut value = Published::encode(7, 1000, &tally);
        let read = Published::decode(&value).unwrap();
        assert_eq!((read.token, read.at_ms), (7, 1000));
        assert_eq!(
            read.tally,
            Tally {
                placed: vec![2, 0],
                sent_ms: vec![5000, 0],
                ..tally
            }
        );
        value[16] = VERSION + 1;
        s.set(&vm_key(0), &value, None).unwrap();
        let mut vm = VmLoad::new(9);
        vm.add(p(0), 1);
        vm.refresh(&s, 1000, false).unwrap();
        assert_eq!(vm.key(), Some(1), "the other build's key stays its own");
        assert_eq!(vm.replica(1), vec![1]);
        assert_eq!(replica_total(&s, 1000).unwrap(), vec![1]);
    }

    #[test]
    fn each_vm_sees_the_others_after_a_tick() {
        let s = MemStore::new();
        let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
        a.add(p(0), 3);
        b.add(p(1), 2);
        a.refresh(&s, 1000, false).unwrap();
        b.refresh(&s, 1000, false).unwrap();
        a.refresh(&s, 1250, false).unwrap();
        assert_eq!((a.key(), b.key()), (Some(0), Some(1)));
        assert_eq!(a.replica(2), vec![3, 2]);
        assert_eq!(b.replica(2), vec![3, 2]);
        assert_eq!(
            (b.replica_at(0), b.replica_at(1), b.replica_at(9)),
            (3, 2, 0)
        );
        assert_eq!(replica_total(&s, 1250).unwrap(), vec![3, 2]);
        // Released on A: exact on A at once, on B after A's next tick.
        a.add(p(0), -3);
        assert_eq!(a.replica(2), vec![0, 2]);
        a.refresh(&s, 1500, false).unwrap();
        b.refresh(&s, 1500, false).unwrap();
        assert_eq!(b.replica(2), vec![0, 2]);
    }

    #[test]
    fn vms_exchange_counts_per_request_between_ticks() {
        let s = MemStore::new();
        let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
        // A lone VM: no call per request, before and after its tick.
        a.read_others(&s, 1000);
        assert!(!a.publish(&s, 1000));
        a.refresh(&s, 1000, false).unwrap();
        let before = s.op_counts();
        a.add(p(0), 1);
        a.read_others(&s, 1000);
        assert!(!a.publish(&s, 1000), "nobody to tell");
        assert_eq!(s.op_counts(), before);
        // Once each has seen the other on a tick: one get per other VM to
        // read, one set to publish.
        b.refresh(&s, 1000, false).unwrap();
        a.refresh(&s, 1250, false).unwrap();
        assert_eq!(b.replica(1), vec![0], "A's 1 came after B's tick read");
        b.read_others(&s, 1260);
        assert_eq!(b.replica(1), vec![1]);
        let before = s.op_counts();
        a.add(p(0), 2);
        assert!(a.publish(&s, 1300));
        b.read_others(&s, 1300);
        assert_eq!(s.op_counts(), (before.0 + 1, before.1 + 1));
        assert_eq!(
            b.replica(1),
            vec![3],
            "A's requests as of now, not its tick"
        );
        a.add(p(0), -3);
        assert!(a.publish(&s, 1400));
        b.read_others(&s, 1400);
        assert_eq!(b.replica(1), vec![0]);
        // A VM gone quiet past the stale bound stops counting here too.
        a.add(p(0), 4);
        assert!(a.publish(&s, 1500));
        b.read_others(&s, 1501 + VM_STALE_MS);
        assert_eq!(b.replica(1), vec![0]);
    }

    #[test]
    fn fresh_reads_are_bounded_and_the_rest_count_as_of_the_tick() {
        let s = MemStore::new();
        let mut vms: Vec<VmLoad> = (1..=FRESH_READS as u64 + 3).map(VmLoad::new).collect();
        for vm in &mut vms {
            vm.add(p(0), 1);
            vm.refresh(&s, 1000, false).unwrap();
        }
        let (first, rest) = vms.split_first_mut().unwrap();
        first.refresh(&s, 1250, false).unwrap();
        assert_eq!(first.replica(1), vec![FRESH_READS as u32 + 3]);
        // Every other VM ends its request; the first reads as many as it may.
        for vm in rest.iter_mut() {
            vm.add(p(0), -1);
            assert!(vm.publish(&s, 1300));
        }
        let before = s.op_counts();
        first.read_others(&s, 1300);
        assert_eq!(s.op_counts().0 - before.0, FRESH_READS as u64);
        assert_eq!(
            first.replica(1),
            vec![1 + 2],
            "two VMs past the bound, as of the tick"
        );
    }

    #[test]
    fn a_vm_that_stops_ticking_stops_counting_and_its_key_is_reused() {
        let s = MemStore::new();
        let (mut dead, mut live) = (VmLoad::new(1), VmLoad::new(2));
        dead.add(p(0), 5);
        dead.refresh(&s, 1000, false).unwrap();
        live.refresh(&s, 1000, false).unwrap();
        assert_eq!(live.replica(1), vec![5]);
        // The dead VM never ticks again.
        live.refresh(&s, 1000 + VM_STALE_MS, false).unwrap();
        assert_eq!(live.replica(1), vec![5], "still within the stale bound");
        live.refresh(&s, 1001 + VM_STALE_MS, false).unwrap();
        assert_eq!(
            live.replica(1),
            vec![0],
            "a dead VM's pods are not loaded for good"
        );
        assert!(replica_total(&s, 1001 + VM_STALE_MS)
            .unwrap()
            .iter()
            .all(|&c| c == 0));
        // A reloaded VM takes the dead one's key; the key space stays put.
        let mut new = VmLoad::new(3);
        new.add(p(0), 1);
        new.refresh(&s, 7000, false).unwrap();
        assert_eq!(new.key(), Some(0));
        assert_eq!(s.key_count(), 2);
        // The old VM wakes up: its key is gone, it claims a free one.
        dead.refresh(&s, 7100, false).unwrap();
        assert_eq!(dead.key(), Some(2));
        live.refresh(&s, 7200, false).unwrap();
        assert_eq!(live.replica(1), vec![6]);
    }

    #[test]
    fn two_vms_racing_for_one_key_never_share_it() {
        let s = MemStore::new();
        let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
        // B writes between A's read and A's claim.
        s.interfere_next(1);
        a.refresh(&s, 1000, false).unwrap();
        b.refresh(&s, 1000, false).unwrap();
        a.refresh(&s, 1250, false).unwrap();
        assert_ne!(a.key(), b.key());
        assert!(a.key().is_some() && b.key().is_some());
    }

    #[test]
    fn fleet_adds_the_other_replicas() {
        let s = MemStore::new();
        let mut vm = VmLoad::new(1);
        vm.add(p(0), 1);
        set_remote(&s, &[4, 5]).unwrap();
        vm.refresh(&s, 1000, true).unwrap();
        assert_eq!(vm.fleet(2), vec![5, 5]);
        assert_eq!(vm.replica(2), vec![1, 0]);
        assert_eq!(remote(&s).unwrap(), vec![4, 5]);
    }

    #[test]
    fn malformed_values_count_as_free_keys() {
        let s = MemStore::new();
        s.set(&vm_key(0), b"junk", None).unwrap();
        let mut vm = VmLoad::new(9);
        vm.add(p(0), 1);
        vm.refresh(&s, 1000, false).unwrap();
        assert_eq!(vm.key(), Some(0));
        assert_eq!(replica_total(&s, 1000).unwrap(), vec![1]);
    }
}
