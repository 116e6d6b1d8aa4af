//! This VM's copies of the table buckets its requests read and wrote, so
//! a prefix it routed in the last second is probed without a shared-data
//! call for what it already knows.
//!
//! Every shared-data call on the request path costs a few microseconds in
//! Envoy (see the README's filter overhead), against well under one for the
//! work done with what it returns. The rules that keep the table one table:
//! - A copy is a bucket as this VM last read or wrote it in shared data.
//!   It is kept [`COPY_TICKS`] worker ticks (1 s), then read again.
//! - A probe believes a copy when it says a pod holds a block. Where its
//!   "not held" decides the route, the bucket is read from shared data (at
//!   most once per request) before that answer counts: when no pod holds
//!   the first block (a prefix another worker, the sync singleton or a
//!   replica recorded since is never missed for a copy, and a burst of one
//!   new prefix over several workers lands on one pod), and where the
//!   longest match ends (more of the prompt recorded since on that pod is
//!   followed). See [`crate::route::router`]'s probe.
//! - Writes go to shared data at once, as before, under CAS, reusing a read
//!   of the same request; the copy becomes what was written.
//!
//! What a copy can hide for up to a second: a record removed since (a
//! pod's answer showed the prefix evicted on another VM; this VM's own
//! removals drop its copies), a pod that also holds the prefix when the
//! copy already names one (the match then uses the pods the copy names),
//! and a longer match recorded since on a pod other than the best one.
//! Idle expiry is applied to copies as to shared data.
//!
//! Bounded: at most [`MAX_COPIES`] copies (~1.3 KB each, ~330 KB in all).

use std::cell::RefCell;
use std::collections::HashMap;

use crate::route::store::{SharedStore, StoreError, Versioned};
use crate::route::table::{bucket_key, bucket_of_key, Record, TableConfig};

/// Most bucket copies one VM keeps.
pub(crate) const MAX_COPIES: usize = 256;
/// Worker ticks a copy is kept (4 x 250 ms).
pub(crate) const COPY_TICKS: u64 = 4;

/// One bucket as this VM last saw it.
#[derive(Debug, Clone)]
struct Copy {
    value: Vec<u8>,
    /// The cas shared data gave with `value`; None once this VM wrote it
    /// (a set does not return the new cas).
    cas: Option<u32>,
    /// The tick it was read or written in.
    tick: u64,
}

/// A VM's bucket copies (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    copies: HashMap<u32, Copy>,
    /// Worker ticks so far.
    tick: u64,
}

impl Mirror {
    /// The worker's tick: drops the copies [`COPY_TICKS`] old.
    pub(crate) fn tick(&mut self) {
        self.tick += 1;
        let tick = self.tick;
        self.copies.retain(|_, c| tick - c.tick < COPY_TICKS);
    }

    /// Copies kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.copies.len()
    }

    /// Keeps a copy of `bucket` as shared data returned or took it.
    fn keep(&mut self, bucket: u32, value: &[u8], cas: Option<u32>) {
        if self.copies.len() >= MAX_COPIES && !self.copies.contains_key(&bucket) {
            // Full: start over (once per MAX_COPIES new copies at most).
            self.copies.clear();
        }
        let copy = Copy {
            value: value.to_vec(),
            cas,
            tick: self.tick,
        };
        self.copies.insert(bucket, copy);
    }
}

/// One request's view of the table through its VM's [`Mirror`]: reads a
/// bucket from shared data at most once per request (a write after a read
/// reuses it) and keeps copies of what it read and wrote.
pub(crate) struct Mirrored<'a, S: SharedStore + ?Sized> {
    mirror: &'a RefCell<Mirror>,
    store: &'a S,
    cfg: TableConfig,
    now: u32,
    /// Buckets read from shared data during this request, whose copies are
    /// as current as a read (and hold the cas of that read).
    read: RefCell<Vec<u32>>,
}

impl<'a, S: SharedStore + ?Sized> Mirrored<'a, S> {
    pub(crate) fn new(
        mirror: &'a RefCell<Mirror>,
        store: &'a S,
        cfg: TableConfig,
        now: u32,
    ) -> Self {
        Self {
            mirror,
            store,
            cfg,
            now,
            read: RefCell::new(Vec::new()),
        }
    }

    /// Live records of `anchor` for `model`, and whether they were read
    /// from shared data during this request. With `copy_ok`, this VM's copy
    /// answers when there is one (no shared-data call).
    pub(crate) fn segment(
        &self,
        anchor: u32,
        model: u16,
        copy_ok: bool,
    ) -> Result<(Vec<Record>, bool), StoreError> {
        let bucket = self.cfg.bucket_of(anchor);
        if copy_ok {
            let current = self.read.borrow().contains(&bucket);
            if let Some(copy) = self.mirror.borrow().copies.get(&bucket) {
                let records = self.cfg.segment_in(&copy.value, anchor, model, self.now);
                return Ok((records, current));
            }
        }
        let (value, _) = self.read_bucket(bucket, &bucket_key(bucket))?;
        let records = self
            .cfg
            .segment_in(value.as_deref().unwrap_or(&[]), anchor, model, self.now);
        Ok((records, true))
    }

    /// `bucket` (shared-data key `key`) as read during this request, or
    /// read now from shared data and kept as a copy.
    fn read_bucket(&self, bucket: u32, key: &str) -> Result<Versioned, StoreError> {
        if self.read.borrow().contains(&bucket) {
            if let Some(copy) = self.mirror.borrow().copies.get(&bucket) {
                return Ok((Some(copy.value.clone()), copy.cas));
            }
        }
        let (value, cas) = self.store.get(key)?;
        self.mirror
            .borrow_mut()
            .keep(bucket, value.as_deref().unwrap_or(&[]), cas);
        let mut read = self.read.borrow_mut();
        if !read.contains(&bucket) {
            read.push(bucket);
        }
        Ok((value, cas))
    }
}

impl<S: SharedStore + ?Sized> SharedStore for Mirrored<'_, S> {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        match bucket_of_key(key) {
            Some(bucket) => self.read_bucket(bucket, key),
            None => self.store.get(key),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let Some(bucket) = bucket_of_key(key) else {
            return self.store.set(key, value, cas);
        };
        // Whatever happens, the next read in this request goes to shared
        // data: on success the cas is unknown, on failure the copy is old.
        self.read.borrow_mut().retain(|b| *b != bucket);
        let res = self.store.set(key, value, cas);
        let mut mirror = self.mirror.borrow_mut();
        match res {
            Ok(()) => mirror.keep(bucket, value, None),
            Err(_) => {
                mirror.copies.remove(&bucket);
            }
        }
        res
    }
}

#[cfg(test)]
mod tests;
