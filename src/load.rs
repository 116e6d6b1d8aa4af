//! In-flight requests per endpoint, in shared data so every worker sees the
//! load that all workers put on a pod.
//!
//! One key holds a `u32` per pod slot (little endian, index = the pod's
//! registry slot, see [`crate::fleet::registry`]); VMs whose views of the
//! fleet differ never truncate each other's counts. A request is counted when its endpoint is picked and released exactly
//! once when its stream ends, however it ends. A second key, written only by
//! the sync singleton, holds the in-flight counts other replicas report, so
//! routing can weigh the fleet's load and not only its own.

use crate::registry::MAX_SLOTS;
use crate::store::{cas_update, SharedStore, StoreError};

const LOCAL_KEY: &str = "load/local";
const REMOTE_KEY: &str = "load/remote";
const MAX_ATTEMPTS: u32 = 32;

/// In-flight counters per pod slot.
pub struct InflightCounters<'s, S: SharedStore + ?Sized> {
    store: &'s S,
    /// Reads return at least this many counts (missing ones are 0).
    min_len: usize,
}

impl<'s, S: SharedStore + ?Sized> InflightCounters<'s, S> {
    pub fn new(store: &'s S, min_len: usize) -> Self {
        Self {
            store,
            min_len: min_len.min(MAX_SLOTS),
        }
    }

    /// Adds `delta` to `pod`'s local count (saturating at 0) and returns the
    /// new value and the CAS retries it took.
    pub fn add(&self, pod: u16, delta: i32) -> Result<(u32, u32), StoreError> {
        let idx = usize::from(pod);
        if idx >= MAX_SLOTS {
            return Err(StoreError::Host {
                key: LOCAL_KEY.into(),
                status: format!("pod id {pod} out of range"),
            });
        }
        let mut value = 0;
        let outcome = cas_update(self.store, LOCAL_KEY, MAX_ATTEMPTS, |cur| {
            let mut counts = decode(cur.unwrap_or(&[]), idx + 1);
            counts[idx] = counts[idx].saturating_add_signed(delta);
            value = counts[idx];
            Some(encode(&counts))
        })?;
        Ok((value, outcome.retries))
    }

    /// This replica's in-flight count per pod id.
    pub fn local(&self) -> Result<Vec<u32>, StoreError> {
        self.read(LOCAL_KEY)
    }

    /// Local plus other replicas' reported in-flight count per pod id.
    pub fn fleet(&self) -> Result<Vec<u32>, StoreError> {
        let mut counts = self.local()?;
        for (c, r) in counts.iter_mut().zip(self.read(REMOTE_KEY)?) {
            *c = c.saturating_add(r);
        }
        Ok(counts)
    }

    /// Replaces the other replicas' total per pod id (sync singleton only).
    pub fn set_remote(&self, counts: &[u32]) -> Result<(), StoreError> {
        let n = counts.len().min(MAX_SLOTS);
        self.store.set(REMOTE_KEY, &encode(&counts[..n]), None)
    }

    fn read(&self, key: &str) -> Result<Vec<u32>, StoreError> {
        let (value, _) = self.store.get(key)?;
        Ok(decode(value.as_deref().unwrap_or(&[]), self.min_len))
    }
}

/// The counts stored, at least `n` long (never truncated: slots past what
/// one VM knows belong to pods another VM routes to).
fn decode(bytes: &[u8], n: usize) -> Vec<u32> {
    let mut counts: Vec<u32> = bytes
        .chunks_exact(4)
        .take(MAX_SLOTS)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if counts.len() < n {
        counts.resize(n, 0);
    }
    counts
}

fn encode(counts: &[u32]) -> Vec<u8> {
    counts.iter().flat_map(|c| c.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn add_and_release_return_to_zero() {
        let s = MemStore::new();
        let c = InflightCounters::new(&s, 3);
        assert_eq!(c.add(1, 1).unwrap().0, 1);
        assert_eq!(c.add(1, 1).unwrap().0, 2);
        assert_eq!(c.add(2, 1).unwrap().0, 1);
        assert_eq!(c.local().unwrap(), vec![0, 2, 1]);
        c.add(1, -1).unwrap();
        c.add(1, -1).unwrap();
        c.add(2, -1).unwrap();
        assert_eq!(c.local().unwrap(), vec![0, 0, 0]);
    }

    #[test]
    fn release_saturates_at_zero() {
        let s = MemStore::new();
        let c = InflightCounters::new(&s, 1);
        assert_eq!(c.add(0, -1).unwrap().0, 0);
    }

    #[test]
    fn out_of_range_pod_is_an_error() {
        let s = MemStore::new();
        let slot = u16::try_from(MAX_SLOTS).unwrap();
        assert!(InflightCounters::new(&s, 1).add(slot, 1).is_err());
    }

    #[test]
    fn a_vm_knowing_fewer_pods_keeps_the_counts_of_the_others() {
        let s = MemStore::new();
        InflightCounters::new(&s, 8).add(7, 3).unwrap();
        let small = InflightCounters::new(&s, 2);
        small.add(0, 1).unwrap();
        assert_eq!(small.local().unwrap()[7], 3);
    }

    #[test]
    fn fleet_adds_remote_counts() {
        let s = MemStore::new();
        let c = InflightCounters::new(&s, 2);
        c.add(0, 1).unwrap();
        c.set_remote(&[4, 5]).unwrap();
        assert_eq!(c.fleet().unwrap(), vec![5, 5]);
    }

    #[test]
    fn conflicting_writers_do_not_lose_counts() {
        let s = MemStore::new();
        let c = InflightCounters::new(&s, 1);
        c.add(0, 1).unwrap();
        s.interfere_next(5);
        let (v, retries) = c.add(0, 1).unwrap();
        assert_eq!((v, retries), (2, 5));
    }
}
