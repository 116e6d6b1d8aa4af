//! The prefix table: block hash -> model -> pod -> last access, kept in Envoy
//! VM shared data so every worker thread (and the sync singleton) sees one
//! table.
//!
//! Layout. Envoy cannot delete shared-data keys, so the key space is fixed:
//! `capacity / 8` bucket keys `ptab/<i>`, each a compact binary value of at
//! most [`SLOTS_PER_BUCKET`] records of 16 bytes
//! (`block u64 | model u16 | pod u16 | last_access u32`, little endian, after a
//! one-byte layout version). A block lives in bucket `block % buckets`. A full
//! bucket reuses its expired or least recently used slot, so memory stays flat
//! however many distinct prompts arrive. Writes are read-modify-write under
//! CAS with bounded retries (see [`crate::route::store::cas_update`]).
//!
//! A record names its model and pod by `u16` slots of the model and pod
//! registries ([`crate::route::registry`]): stable names, bounded, reused only long
//! after a name was last seen.

use crate::route::store::{cas_update, SharedStore, StoreError};

/// Records per bucket: 8 x 16 bytes keeps one value at 129 bytes, so a
/// read-modify-write copies little while collisions still have room.
pub const SLOTS_PER_BUCKET: usize = 8;
const RECORD_LEN: usize = 16;
const LAYOUT_VERSION: u8 = 1;
/// One (block, model, pod) fact with the time it was last seen, unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub(crate) block: u64,
    pub(crate) model: u16,
    pub pod: u16,
    pub last_access: u32,
}

/// Sizing and retry knobs of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableConfig {
    pub buckets: u32,
    pub(crate) idle_expiry_secs: u32,
    pub(crate) max_cas_attempts: u32,
}

impl TableConfig {
    pub fn new(capacity_blocks: u32, idle_expiry_secs: u32) -> Self {
        Self {
            buckets: capacity_blocks.div_ceil(SLOTS_PER_BUCKET as u32).max(1),
            idle_expiry_secs,
            max_cas_attempts: 8,
        }
    }

    #[cfg(any(test, feature = "testkit"))]
    /// Total records the table can hold.
    pub fn capacity(&self) -> u64 {
        u64::from(self.buckets) * SLOTS_PER_BUCKET as u64
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

    fn bucket_of(&self, block: u64) -> u32 {
        (block % u64::from(self.cfg.buckets)) as u32
    }

    fn is_live(&self, r: &Record, now: u32) -> bool {
        r.last_access != 0 && now.saturating_sub(r.last_access) < self.cfg.idle_expiry_secs
    }

    /// Live records of the bucket that holds `block` (any block in it).
    fn live_bucket(&self, block: u64, now: u32) -> Result<Vec<Record>, StoreError> {
        let (value, _) = self.store.get(&bucket_key(self.bucket_of(block)))?;
        let mut records = decode_bucket(value.as_deref().unwrap_or(&[]));
        records.retain(|r| self.is_live(r, now));
        Ok(records)
    }

    /// Pods that hold `block` for `model`, with their last access, written
    /// into `out` (cleared first).
    pub(crate) fn pods_holding(
        &self,
        block: u64,
        model: u16,
        now: u32,
        out: &mut Vec<(u16, u32)>,
    ) -> Result<(), StoreError> {
        out.clear();
        for r in self.live_bucket(block, now)? {
            if r.block == block && r.model == model && !out.iter().any(|(p, _)| *p == r.pod) {
                out.push((r.pod, r.last_access));
            }
        }
        Ok(())
    }

    /// Every live record of one block (all models and pods): the sync export.
    pub(crate) fn block_records(&self, block: u64, now: u32) -> Result<Vec<Record>, StoreError> {
        let mut records = self.live_bucket(block, now)?;
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
                decode_bucket(value.as_deref().unwrap_or(&[]))
                    .into_iter()
                    .filter(|r| self.is_live(r, now)),
            );
        }
        Ok(out)
    }

    /// Records that `pod` served `blocks` for `model` at `now`.
    pub(crate) fn record(&self, blocks: &[u64], model: u16, pod: u16, now: u32) -> WriteOutcome {
        let facts: Vec<Record> = blocks
            .iter()
            .map(|&block| Record {
                block,
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
            .map(|f| (self.bucket_of(f.block), *f))
            .collect();
        by_bucket.sort_unstable_by_key(|(b, _)| *b);
        for group in by_bucket.chunk_by(|a, b| a.0 == b.0) {
            let bucket = group[0].0;
            let mut new_slots = 0;
            let mut evictions = 0;
            let mut refused = 0;
            let res = cas_update(
                self.store,
                &bucket_key(bucket),
                self.cfg.max_cas_attempts,
                |cur| {
                    let mut records = decode_bucket(cur.unwrap_or(&[]));
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
                    changed.then(|| encode_bucket(&records))
                },
            );
            match res {
                Ok(o) => {
                    out.cas_retries += o.retries;
                    out.refused += refused;
                    if o.written {
                        out.new_slots += new_slots;
                        out.evictions += evictions;
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
        if records.len() < SLOTS_PER_BUCKET {
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

fn bucket_key(bucket: u32) -> String {
    format!("ptab/{bucket}")
}

/// Decodes a bucket value; unknown versions or torn lengths read as empty
/// rather than failing the request.
pub(crate) fn decode_bucket(bytes: &[u8]) -> Vec<Record> {
    match bytes.split_first() {
        Some((&LAYOUT_VERSION, rest)) => rest
            .chunks_exact(RECORD_LEN)
            .take(SLOTS_PER_BUCKET)
            .map(|c| Record {
                block: u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                model: u16::from_le_bytes([c[8], c[9]]),
                pod: u16::from_le_bytes([c[10], c[11]]),
                last_access: u32::from_le_bytes([c[12], c[13], c[14], c[15]]),
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub(crate) fn encode_bucket(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + records.len() * RECORD_LEN);
    out.push(LAYOUT_VERSION);
    for r in records.iter().take(SLOTS_PER_BUCKET) {
        out.extend_from_slice(&r.block.to_le_bytes());
        out.extend_from_slice(&r.model.to_le_bytes());
        out.extend_from_slice(&r.pod.to_le_bytes());
        out.extend_from_slice(&r.last_access.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn holders(t: &PrefixTable<'_, MemStore>, block: u64, model: u16, now: u32) -> Vec<u16> {
        let mut v = Vec::new();
        t.pods_holding(block, model, now, &mut v).unwrap();
        let mut pods: Vec<u16> = v.into_iter().map(|(p, _)| p).collect();
        pods.sort_unstable();
        pods
    }

    #[test]
    fn record_then_lookup_per_model_and_pod() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(1024, 60));
        t.record(&[1, 2, 3], 0, 5, 100);
        t.record(&[1], 0, 6, 100);
        t.record(&[1], 1, 7, 100);
        assert_eq!(holders(&t, 1, 0, 101), vec![5, 6]);
        assert_eq!(holders(&t, 3, 0, 101), vec![5]);
        assert_eq!(holders(&t, 1, 1, 101), vec![7]);
        assert_eq!(holders(&t, 9, 0, 101), Vec::<u16>::new());
    }

    #[test]
    fn idle_records_expire_and_slots_are_reused() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(64, 60));
        t.record(&[42], 0, 1, 1000);
        assert_eq!(holders(&t, 42, 0, 1059), vec![1]);
        assert!(holders(&t, 42, 0, 1060).is_empty());
        // An expired slot is reused rather than counted as new occupancy.
        let fill: Vec<u64> = (0..8).map(|i| 42 + i * 8).collect();
        let o = t.record(&fill, 0, 2, 2000);
        assert_eq!(o.evictions, 0);
        assert_eq!(t.block_records(42, 2000).unwrap().len(), 1);
    }

    #[test]
    fn capacity_bounds_keys_and_bytes_under_a_flood() {
        let s = MemStore::new();
        let cfg = TableConfig::new(800, 3600);
        let t = PrefixTable::new(&s, cfg);
        let mut x = 0x1234_5678_u64;
        for round in 0..200u32 {
            let blocks: Vec<u64> = (0..50)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    x
                })
                .collect();
            t.record(&blocks, 0, (round % 4) as u16, 10 + round);
        }
        assert_eq!(s.key_count(), 100, "one key per bucket, never more");
        assert!(s.value_bytes() <= 100 * (1 + SLOTS_PER_BUCKET * RECORD_LEN));
    }

    #[test]
    fn full_bucket_evicts_least_recently_used() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(8, 3600)); // one bucket
        for i in 0..8u64 {
            t.record(&[i], 0, 0, 100 + i as u32);
        }
        let o = t.record(&[99], 0, 0, 200);
        assert_eq!(o.evictions, 1);
        assert!(holders(&t, 0, 0, 201).is_empty(), "oldest evicted");
        assert_eq!(holders(&t, 1, 0, 201), vec![0]);
        assert_eq!(holders(&t, 99, 0, 201), vec![0]);
        assert_eq!(o.refused, 0);
    }

    #[test]
    fn a_bucket_full_of_this_seconds_records_refuses_and_counts() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(8, 3600)); // one bucket
        let o = t.record(&(0..8).collect::<Vec<u64>>(), 0, 0, 100);
        assert_eq!((o.evictions, o.refused), (0, 0));
        // A burst within the same second: nothing older to evict.
        let o = t.record(&[50, 51], 0, 0, 100);
        assert_eq!((o.evictions, o.refused), (0, 2));
        assert!(holders(&t, 50, 0, 100).is_empty());
        // A pulled fact older than everything held is refused too.
        let o = t.upsert(
            &[Record {
                block: 60,
                model: 0,
                pod: 1,
                last_access: 90,
            }],
            100,
        );
        assert_eq!(o.refused, 1);
        // The next second evicts the least recently used.
        let o = t.record(&[50], 0, 0, 101);
        assert_eq!((o.evictions, o.refused), (1, 0));
    }

    #[test]
    fn upsert_keeps_newer_time() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(64, 3600));
        let f = |ts| Record {
            block: 7,
            model: 0,
            pod: 1,
            last_access: ts,
        };
        t.upsert(&[f(500)], 600);
        t.upsert(&[f(400)], 600);
        assert_eq!(t.block_records(7, 600).unwrap()[0].last_access, 500);
        t.upsert(&[f(550)], 600);
        assert_eq!(t.block_records(7, 600).unwrap()[0].last_access, 550);
        // Already expired facts are not written.
        t.upsert(&[Record { block: 8, ..f(1) }], 600_000);
        assert!(t.block_records(8, 600_000).unwrap().is_empty());
    }

    #[test]
    fn cas_conflict_is_retried_without_losing_the_write() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(64, 3600));
        t.record(&[1], 0, 1, 10);
        s.interfere_next(3);
        let o = t.record(&[1], 0, 2, 11);
        assert_eq!(o.cas_retries, 3);
        assert_eq!(o.failed_buckets, 0);
        assert_eq!(holders(&t, 1, 0, 12), vec![1, 2]);
    }

    #[test]
    fn cas_exhaustion_is_reported_not_panicked() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(64, 3600));
        t.record(&[1], 0, 1, 10);
        s.interfere_next(100);
        let o = t.record(&[1], 0, 2, 11);
        assert_eq!(o.failed_buckets, 1);
    }

    #[test]
    fn new_slots_count_occupancy_growth() {
        let s = MemStore::new();
        let t = PrefixTable::new(&s, TableConfig::new(1024, 3600));
        assert_eq!(t.record(&[1, 2, 3], 0, 1, 10).new_slots, 3);
        assert_eq!(t.record(&[1, 2, 3], 0, 1, 11).new_slots, 0);
    }

    #[test]
    fn garbage_bucket_values_read_as_empty() {
        assert!(decode_bucket(&[]).is_empty());
        assert!(decode_bucket(&[9, 1, 2, 3]).is_empty());
        assert_eq!(decode_bucket(&[LAYOUT_VERSION, 1, 2, 3]).len(), 0);
        let r = Record {
            block: u64::MAX,
            model: 3,
            pod: 9,
            last_access: 77,
        };
        assert_eq!(decode_bucket(&encode_bucket(&[r])), vec![r]);
    }
}
