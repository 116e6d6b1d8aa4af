//! One routing decision's reads of the prefix table ([`RequestReads`]): a
//! bucket is read from shared data at most once per request, and the
//! write that follows the probe reuses that read (and its cas), so a
//! request costs one get per bucket it touches and one set per bucket it
//! writes. Nothing is kept between requests: every request sees the table
//! as shared data holds it. (A per-VM copy of the buckets across requests
//! was measured and removed: docs/decisions/051-bucket-copies.md.)

use std::cell::RefCell;

use crate::route::table::{bucket_key, bucket_of_key, Record, TableConfig};
use crate::shared::store::{SharedStore, StoreError, Versioned};

/// A bucket as shared data returned it during a request.
struct Read {
    bucket: u32,
    value: Option<Vec<u8>>,
    cas: Option<u32>,
}

/// A request's view of the table over `store`.
pub(crate) struct RequestReads<'a, S: SharedStore + ?Sized> {
    store: &'a S,
    cfg: TableConfig,
    now: u32,
    /// Buckets read during this request.
    read: RefCell<Vec<Read>>,
}

impl<'a, S: SharedStore + ?Sized> RequestReads<'a, S> {
    pub(crate) fn new(store: &'a S, cfg: TableConfig, now: u32) -> Self {
        Self {
            store,
            cfg,
            now,
            read: RefCell::new(Vec::new()),
        }
    }

    /// Live records of `anchor` for `model`.
    pub(crate) fn segment(&self, anchor: u32, model: u16) -> Result<Vec<Record>, StoreError> {
        let bucket = self.cfg.bucket_of(anchor);
        self.with_bucket(bucket, &bucket_key(bucket), |value, _| {
            self.cfg
                .segment_in(value.unwrap_or(&[]), anchor, model, self.now)
        })
    }

    /// `f` over `bucket` (shared-data key `key`) as read during this
    /// request, or as read now (then kept for the rest of the request).
    fn with_bucket<T>(
        &self,
        bucket: u32,
        key: &str,
        f: impl FnOnce(Option<&[u8]>, Option<u32>) -> T,
    ) -> Result<T, StoreError> {
        if let Some(r) = self.read.borrow().iter().find(|r| r.bucket == bucket) {
            return Ok(f(r.value.as_deref(), r.cas));
        }
        let (value, cas) = self.store.get(key)?;
        let out = f(value.as_deref(), cas);
        self.read.borrow_mut().push(Read { bucket, value, cas });
        Ok(out)
    }
}

impl<S: SharedStore + ?Sized> SharedStore for RequestReads<'_, S> {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        match bucket_of_key(key) {
            Some(bucket) => self.with_bucket(bucket, key, |v, cas| (v.map(<[u8]>::to_vec), cas)),
            None => self.store.get(key),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        if let Some(bucket) = bucket_of_key(key) {
            // The next read in this request goes to shared data: on success
            // the cas is unknown, on failure the read is old.
            self.read.borrow_mut().retain(|r| r.bucket != bucket);
        }
        self.store.set(key, value, cas)
    }
}

#[cfg(test)]
mod tests;
