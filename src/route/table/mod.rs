//! The prefix table: block hash -> model -> pod -> last access, kept in Envoy
//! VM shared data so every worker thread (and the sync singleton) sees one
//! table.
//!
//! Layout. Envoy cannot delete shared-data keys, so the key space is fixed:
//! `capacity / slots` bucket keys `ptab/<i>`, each a compact binary value of
//! at most `slots` records of 20 bytes
//! (`block u64 | anchor u32 | model u16 | pod u16 | last_access u32`, little
//! endian, after a one-byte layout version). A record lives in bucket
//! `anchor % buckets`. A full bucket reuses its expired or least recently
//! used slot, so memory stays flat however many distinct prompts arrive.
//! Writes are read-modify-write under CAS with bounded retries (see
//! [`crate::shared::store::cas_update`]).
//!
//! The anchor chooses the bucket ([`Layout`]). In the per-block layout it is
//! the block's own hash, so any writer that knows only a block hash (an
//! AIBrix gateway) can place it. In the segment layout it is the hash of the
//! first block of the block's *segment* (a run of positions: 16 below the
//! dense prefix, then one per doubling of the position), so the blocks one
//! request records share a handful of buckets: a new 8 KB prefix is written
//! in ~4 read-modify-writes instead of ~40, and probing it reads the same
//! few buckets. The chain hash makes the anchor a function of the block: a
//! block hash names its whole prefix, hence its position and its segment.
//!
//! A record names its model and pod by slots (`u16`, [`PodSlot`]) of the model and pod
//! registries ([`crate::shared::registry`]): stable names, bounded, reused only long
//! after a name was last seen.

use crate::shared::registry::PodSlot;
use crate::shared::store::{cas_update, SharedStore, StoreError};

/// Most records one bucket value holds (the segment layout's).
pub const MAX_SLOTS_PER_BUCKET: usize = 64;
/// Bytes of one record in a bucket value.
pub const RECORD_LEN: usize = 20;
/// Version byte of a bucket value: a value of another version (an older
/// module's, after a hot reload) reads as empty, and the next write of its
/// bucket starts it anew in this version, counted
/// ([`WriteOutcome::layout_resets`]). Raise it with any change to the
/// record or bucket encoding. The `next-layout` feature (test builds only)
/// stands for such a release.
#[cfg(not(feature = "next-layout"))]
pub(crate) const LAYOUT_VERSION: u8 = 2;
#[cfg(feature = "next-layout")]
pub(crate) const LAYOUT_VERSION: u8 = 3;
/// Dense positions per segment in the segment layout.
const DENSE_SEGMENT: usize = 16;

/// How records are spread over buckets (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Bucket by the block's own hash, 8 records per bucket (129-byte
    /// values): required where other writers know only block hashes.
    PerBlock,
    /// Bucket by the segment's first block, 64 records per bucket
    /// (1,281-byte values): one bucket holds a segment for several pods.
    Segments,
}

impl Layout {
    /// Records per bucket.
    pub(crate) fn slots(self) -> usize {
        match self {
            Layout::PerBlock => 8,
            Layout::Segments => MAX_SLOTS_PER_BUCKET,
        }
    }

    /// Position of the block whose hash anchors the block at position `i`
    /// (always `<= i`): `i` itself per block; else the start of its segment:
    /// 16 positions wide below `dense`, then two doublings of the position
    /// wide (`[4^k - 1, 4^(k+1) - 1)`), 16 sampled positions either way
    /// (see [`crate::route::router::sampled_positions`]).
    pub fn anchor_position(self, i: usize, dense: usize) -> usize {
        match self {
            Layout::PerBlock => i,
            Layout::Segments if i < dense => i - i % DENSE_SEGMENT,
            Layout::Segments => {
                let octave = usize::BITS - 1 - (i + 1).leading_zeros();
                (1usize << (octave - octave % 2)) - 1
            }
        }
    }
}

/// The anchor of a block: the low 32 bits of its anchor block's hash.
pub fn anchor_of(hash: u64) -> u32 {
    hash as u32
}

/// One (block, model, pod) fact with the time it was last seen, unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub(crate) block: u64,
    /// Chooses the bucket: [`anchor_of`] the block's anchor (see [`Layout`]).
    pub(crate) anchor: u32,
    pub(crate) model: u16,
    pub pod: PodSlot,
    pub last_access: u32,
}

/// Sizing and retry knobs of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableConfig {
    pub buckets: u32,
    /// Records per bucket ([`Layout::slots`]).
    pub(crate) slots: usize,
    pub(crate) idle_expiry_secs: u32,
    pub(crate) max_cas_attempts: u32,
}

impl TableConfig {
    pub(crate) fn new(capacity_blocks: u32, idle_expiry_secs: u32, layout: Layout) -> Self {
        let slots = layout.slots();
        Self {
            buckets: capacity_blocks.div_ceil(slots as u32).max(1),
            slots,
            idle_expiry_secs,
            max_cas_attempts: 8,
        }
    }

    #[cfg(any(test, feature = "testkit"))]
    /// Total records the table can hold.
    pub fn capacity(&self) -> u64 {
        u64::from(self.buckets) * self.slots as u64
    }

    /// The bucket that holds the records of `anchor`.
    pub(crate) fn bucket_of(&self, anchor: u32) -> u32 {
        anchor % self.buckets
    }

    /// Whether a record is in use and not past idle expiry at `now`.
    pub(crate) fn is_live(&self, r: &Record, now: u32) -> bool {
        r.last_access != 0 && now.saturating_sub(r.last_access) < self.idle_expiry_secs
    }

    /// Live records of `anchor` for `model` in a bucket value.
    pub(crate) fn segment_in(
        &self,
        value: &[u8],
        anchor: u32,
        model: u16,
        now: u32,
    ) -> Vec<Record> {
        let mut records = decode_bucket(value, self.slots);
        records.retain(|r| self.is_live(r, now) && r.anchor == anchor && r.model == model);
        records
    }
}

/// What one write did, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WriteOutcome {
    pub(crate) cas_retries: u32,
    /// Never-used slots that now hold a record (table occupancy growth).
    pub(crate) new_slots: u32,
    /// Buckets whose update gave up after `max_cas_attempts`.
    pub(crate) failed_buckets: u32,
    /// Live records replaced because their bucket was full.
    pub(crate) evictions: u32,
    /// Facts not stored: their bucket was full of live records at least as
    /// recent (a burst filling a bucket within one second, or an old
    /// pulled fact). Lost for this table; counted, never silent.
    pub(crate) refused: u32,
    /// Buckets that held another layout version's value (a module of
    /// another layout shared this `vm_id`'s data) and were written anew.
    pub(crate) layout_resets: u32,
}

/// The shared prefix table over a [`SharedStore`].
pub struct PrefixTable<'s, S: SharedStore + ?Sized> {
    store: &'s S,
    cfg: TableConfig,
}

impl<'s, S: SharedStore + ?Sized> PrefixTable<'s, S> {
    pub fn new(store: &'s S, cfg: TableConfig) -> Self {
        Self { store, cfg }
    }

    fn bucket_of(&self, anchor: u32) -> u32 {
        self.cfg.bucket_of(anchor)
    }

    fn is_live(&self, r: &Record, now: u32) -> bool {
        self.cfg.is_live(r, now)
    }

    /// Live records of the bucket that holds `anchor` (any anchor in it).
    fn live_bucket(&self, anchor: u32, now: u32) -> Result<Vec<Record>, StoreError> {
        let (value, _) = self.store.get(&bucket_key(self.bucket_of(anchor)))?;
        let mut records = decode_bucket(value.as_deref().unwrap_or(&[]), self.cfg.slots);
        records.retain(|r| self.is_live(r, now));
        Ok(records)
    }

    /// Live records of one anchor for `model` (one read).
    #[cfg(test)]
    pub(crate) fn segment(
        &self,
        anchor: u32,
        model: u16,
        now: u32,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records = self.live_bucket(anchor, now)?;
        records.retain(|r| r.anchor == anchor && r.model == model);
        Ok(records)
    }

    /// Pods that hold `block` (anchored at `anchor`) for `model`, with their
    /// last access, written into `out` (cleared first).
    #[cfg(test)]
    pub(crate) fn pods_holding(
        &self,
        block: u64,
        anchor: u32,
        model: u16,
        now: u32,
        out: &mut Vec<(PodSlot, u32)>,
    ) -> Result<(), StoreError> {
        out.clear();
        for r in self.segment(anchor, model, now)? {
            if r.block == block && !out.iter().any(|(p, _)| *p == r.pod) {
                out.push((r.pod, r.last_access));
            }
        }
        Ok(())
    }

    /// Every live record of one block (all models and pods): the sync export.
    pub(crate) fn block_records(
        &self,
        block: u64,
        anchor: u32,
        now: u32,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records = self.live_bucket(anchor, now)?;
        records.retain(|r| r.block == block);
        Ok(records)
    }

    /// Every live record of the table (reads every bucket: for full
    /// snapshots only, never on the request path).
    pub fn all_records(&self, now: u32) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        for bucket in 0..self.cfg.buckets {
            let (value, _) = self.store.get(&bucket_key(bucket))?;
            out.extend(
                decode_bucket(value.as_deref().unwrap_or(&[]), self.cfg.slots)
                    .into_iter()
                    .filter(|r| self.is_live(r, now)),
            );
        }
        Ok(out)
    }

    /// Records that `pod` served `blocks` (hash, anchor) for `model` at `now`.
    pub(crate) fn record(
        &self,
        blocks: &[(u64, u32)],
        model: u16,
        pod: PodSlot,
        now: u32,
    ) -> WriteOutcome {
        let facts: Vec<Record> = blocks
            .iter()
            .map(|&(block, anchor)| Record {
                block,
                anchor,
                model,
                pod,
                last_access: now,
            })
            .collect();
        self.upsert(&facts, now)
    }

    /// Merges facts (e.g. from a peer replica): per (block, model, pod) the
    /// newer time wins; facts already past idle expiry are dropped.
    pub(crate) fn upsert(&self, facts: &[Record], now: u32) -> WriteOutcome {
        let mut out = WriteOutcome::default();
        let mut by_bucket: Vec<(u32, Record)> = facts
            .iter()
            .filter(|f| self.is_live(f, now))
            .map(|f| (self.bucket_of(f.anchor), *f))
            .collect();
        by_bucket.sort_unstable_by_key(|(b, _)| *b);
        for group in by_bucket.chunk_by(|a, b| a.0 == b.0) {
            let bucket = group[0].0;
            let mut new_slots = 0;
            let mut evictions = 0;
            let mut refused = 0;
            let mut reset = false;
            let res = cas_update(
                self.store,
                &bucket_key(bucket),
                self.cfg.max_cas_attempts,
                |cur| {
                    reset = cur.is_some_and(is_other_layout);
                    let mut records = decode_bucket(cur.unwrap_or(&[]), self.cfg.slots);
                    let used_before = records.iter().filter(|r| r.last_access != 0).count();
                    evictions = 0;
                    refused = 0;
                    let mut changed = false;
                    for (_, fact) in group {
                        match self.place(&mut records, fact, now) {
                            Placed::Kept => {}
                            Placed::Stored => changed = true,
                            Placed::Evicted => {
                                changed = true;
                                evictions += 1;
                            }
                            Placed::Refused => refused += 1,
                        }
                    }
                    let used_after = records.iter().filter(|r| r.last_access != 0).count();
                    new_slots = used_after.saturating_sub(used_before) as u32;
                    changed.then(|| encode_bucket(&records, self.cfg.slots))
                },
            );
            match res {
                Ok(o) => {
                    out.cas_retries += o.retries;
                    out.refused += refused;
                    if o.written {
                        out.new_slots += new_slots;
                        out.evictions += evictions;
                        out.layout_resets += u32::from(reset);
                    }
                }
                Err(StoreError::CasMismatch) => {
                    out.cas_retries += self.cfg.max_cas_attempts;
                    out.failed_buckets += 1;
                }
                Err(_) => out.failed_buckets += 1,
            }
        }
        out
    }

    /// Puts one fact into a decoded bucket.
    fn place(&self, records: &mut Vec<Record>, fact: &Record, now: u32) -> Placed {
        if let Some(r) = records.iter_mut().find(|r| {
            r.block == fact.block
                && r.model == fact.model
                && r.pod == fact.pod
                && r.last_access != 0
        }) {
            if fact.last_access > r.last_access {
                r.last_access = fact.last_access;
                return Placed::Stored;
            }
            return Placed::Kept;
        }
        if records.len() < self.cfg.slots {
            records.push(*fact);
            return Placed::Stored;
        }
        // Full: reuse an expired slot, else the least recently used one.
        let victim = records
            .iter()
            .enumerate()
            .min_by_key(|(_, r)| {
                if self.is_live(r, now) {
                    u64::from(r.last_access) + 1
                } else {
                    0
                }
            })
            .map(|(i, r)| (i, self.is_live(r, now)));
        match victim {
            Some((i, live)) => {
                if live && records[i].last_access >= fact.last_access {
                    // Everything here is at least as recent as the fact.
                    return Placed::Refused;
                }
                records[i] = *fact;
                if live {
                    Placed::Evicted
                } else {
                    Placed::Stored
                }
            }
            None => Placed::Refused,
        }
    }
}

/// What [`PrefixTable::place`] did with one fact.
enum Placed {
    /// Already held at least as recently.
    Kept,
    Stored,
    /// Stored in place of a live record.
    Evicted,
    /// Not stored (see [`WriteOutcome::refused`]).
    Refused,
}

/// The shared-data key of a bucket.
pub(crate) fn bucket_key(bucket: u32) -> String {
    format!("ptab/{bucket}")
}

/// The bucket a shared-data key names; None for any other key.
pub(crate) fn bucket_of_key(key: &str) -> Option<u32> {
    key.strip_prefix("ptab/")?.parse().ok()
}

/// Whether a bucket value was written by a module of another layout
/// version (it then reads as empty here).
pub(crate) fn is_other_layout(bytes: &[u8]) -> bool {
    bytes.first().is_some_and(|v| *v != LAYOUT_VERSION)
}

/// Decodes a bucket value of at most `slots` records; unknown versions or
/// torn lengths read as empty rather than failing the request.
pub(crate) fn decode_bucket(bytes: &[u8], slots: usize) -> Vec<Record> {
    match bytes.split_first() {
        Some((&LAYOUT_VERSION, rest)) => rest
            .chunks_exact(RECORD_LEN)
            .take(slots)
            .map(|c| Record {
                block: u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                anchor: u32::from_le_bytes([c[8], c[9], c[10], c[11]]),
                model: u16::from_le_bytes([c[12], c[13]]),
                pod: PodSlot::from_le_bytes([c[14], c[15]]),
                last_access: u32::from_le_bytes([c[16], c[17], c[18], c[19]]),
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub(crate) fn encode_bucket(records: &[Record], slots: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + records.len().min(slots) * RECORD_LEN);
    out.push(LAYOUT_VERSION);
    for r in records.iter().take(slots) {
        out.extend_from_slice(&r.block.to_le_bytes());
        out.extend_from_slice(&r.anchor.to_le_bytes());
        out.extend_from_slice(&r.model.to_le_bytes());
        out.extend_from_slice(&r.pod.to_le_bytes());
        out.extend_from_slice(&r.last_access.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests;
