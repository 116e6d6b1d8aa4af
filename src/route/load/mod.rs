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
//! it placed recently (halved whenever one reaches [`HALVE_AT`], and every
//! [`IDLE_HALVE_MS`] while the VM routes nothing), and the
//! sum of the send times of its requests in flight. They travel with the
//! counts, so that the load-aware ties (sent, placed, age) weigh the
//! replica's traffic, not one worker's share of it.
//!
//! A published value is `token u64 | at_ms u64 | version u8 (1)`, then for
//! `n` pod slots (index = the pod's registry slot, see
//! [`crate::shared::registry`]) `n` in-flight counts `u32`, `n` sent counts
//! `u32`, `n` placed counts `u32` and `n` send-time sums `u64` (ms), little
//! endian (see [`value`]). A value of another version counts nothing but
//! keeps its key taken while live, so VMs of two builds never claim one
//! key.

use crate::shared::registry::{PodSlot, MAX_SLOTS};
use crate::shared::store::{SharedStore, StoreError};

mod value;

pub use value::VM_STALE_MS;
use value::{add_u32s, Published, Tally, SLOT_BYTES};

/// Key holding the other replicas' total, per slot (sync singleton only).
const REMOTE_KEY: &str = "load/remote";
/// The VMs' keys. (Builds before the version byte wrote counts alone to
/// `load/vm/<i>`; a new key keeps them from misreading the rest as counts.)
const VM_KEY_PREFIX: &str = "load/worker/";
/// Most worker VMs whose counts are kept (keys `load/worker/0..MAX_VMS`).
pub(crate) const MAX_VMS: usize = 64;
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
/// A VM that routed nothing for this long halves its sent and placed
/// counts on its tick, and again each time as long after: a quiet worker's
/// old traffic fades from the replica's ties instead of tilting them for
/// good.
pub(crate) const IDLE_HALVE_MS: u64 = 2_000;

fn vm_key(i: usize) -> String {
    format!("{VM_KEY_PREFIX}{i}")
}

/// A request [`VmLoad`] counts in flight: its pod, its number among this
/// VM's requests and when it was sent (ms). [`VmLoad::end`] takes it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub(crate) pod: PodSlot,
    pub(crate) seq: u64,
    pub(crate) sent_ms: u64,
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
    /// When this VM last routed a request, or last halved its counts for
    /// being idle (ms).
    active_ms: u64,
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
            active_ms: 0,
            seq_sum: Vec::new(),
        }
    }

    /// Counts a request routed to `pod` at `now_ms` in flight and sent
    /// there (and, when it places a `new_prefix`, placed there); returns
    /// its ticket, for [`Self::end`].
    pub(crate) fn start(&mut self, pod: PodSlot, now_ms: u64, new_prefix: bool) -> Ticket {
        let seq = self.next_seq;
        self.active_ms = self.active_ms.max(now_ms);
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
            pod,
            seq,
            sent_ms: now_ms,
        }
    }

    /// Ends the request of `ticket`; returns this VM's new count on its
    /// pod.
    pub(crate) fn end(&mut self, ticket: Ticket) -> u32 {
        let i = ticket.pod.index();
        if let Some(s) = self.seq_sum.get_mut(i) {
            *s = s.saturating_sub(ticket.seq);
        }
        if let Some(s) = self.own.sent_ms.get_mut(i) {
            *s = s.saturating_sub(ticket.sent_ms);
        }
        self.add(ticket.pod, -1)
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
        let (own, others) = (&self.own, &self.others);
        let count = |i: usize| {
            let at = |v: &[u32]| u64::from(v.get(i).copied().unwrap_or(0));
            at(&own.counts) + at(&others.counts)
        };
        let sum = |i: usize| {
            let at = |v: &[u64]| v.get(i).copied().unwrap_or(0);
            at(&own.sent_ms).saturating_add(at(&others.sent_ms))
        };
        (0..own.counts.len().max(others.counts.len()))
            .map(|i| {
                sum(i)
                    .checked_div(count(i))
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
        if now_ms.saturating_sub(self.active_ms) >= IDLE_HALVE_MS {
            self.active_ms = now_ms;
            for n in self.own.sent.iter_mut().chain(self.own.placed.iter_mut()) {
                *n /= 2;
            }
        }
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
                    p.add_to(&mut others);
                    if other_keys.len() < FRESH_READS {
                        other_keys.push(i);
                    } else {
                        p.add_to(&mut rest);
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
                p.add_to(&mut others);
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
    pub(crate) fn own(&self) -> &[u32] {
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
            let n = p.slots.len() / SLOT_BYTES;
            add_u32s(&mut total, &p.slots[..4 * n]);
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
mod tests;
