//! The shared store: Envoy VM shared data seen through a narrow trait, so the
//! prefix table and the load counters are tested on the host with
//! `MemStore` (built for tests and the `testkit` feature only) and run in
//! Envoy over the real hostcalls.
//!
//! Envoy's shared data is a map `key -> (bytes, cas)` shared by every VM with
//! the same `vm_id` (all worker threads and the sync singleton). Keys cannot be
//! deleted, so callers must use a fixed, bounded key space.

#[cfg(any(test, feature = "testkit"))]
use std::cell::RefCell;
#[cfg(any(test, feature = "testkit"))]
use std::collections::HashMap;
use std::fmt;

/// Errors of the shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The value changed since the cas we passed was read.
    CasMismatch,
    /// Any other host failure, with the key and the host's status.
    Host { key: String, status: String },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::CasMismatch => write!(f, "shared data cas mismatch"),
            StoreError::Host { key, status } => write!(f, "shared data key `{key}`: {status}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A value and the cas token to write it back conditionally.
pub(crate) type Versioned = (Option<Vec<u8>>, Option<u32>);

/// Key-value store with compare-and-swap, shaped like proxy-wasm shared data.
pub trait SharedStore {
    /// Current value and cas; `(None, None)` for a key never written.
    fn get(&self, key: &str) -> Result<Versioned, StoreError>;
    /// Writes `value`; with `Some(cas)` only if the value is unchanged since
    /// that cas was read. `None` writes unconditionally.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

impl<T: SharedStore + ?Sized> SharedStore for std::rc::Rc<T> {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        (**self).get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        (**self).set(key, value, cas)
    }
}

/// Outcome of a [`cas_update`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CasOutcome {
    /// Conditional writes that lost a race and were retried.
    pub(crate) retries: u32,
    /// Whether a write happened (the closure may decline).
    pub(crate) written: bool,
}

/// The cas a write passes for a key that was absent when read. Envoy's
/// shared data ignores the cas of a write to a missing key (it creates it),
/// and checks it against an existing one: so a creator that lost a race to
/// another creator gets a mismatch and merges on retry, instead of
/// overwriting. Envoy hands out cas values 1, 2, ... wrapping past
/// `u32::MAX`; the one way to lose an update is a concurrent creation
/// landing exactly on this value (about 1 in 4 billion such races).
pub(crate) const CREATE_CAS: u32 = u32::MAX;

/// Read-modify-write of one key under CAS with at most `max_attempts` tries.
///
/// `modify` gets the current bytes (None if absent or empty) and returns the
/// new value, or None to leave the key alone. An absent key is created with
/// the new value in one write, conditional on [`CREATE_CAS`]: one get and one
/// set per key, created or not.
pub(crate) fn cas_update<S, F>(
    store: &S,
    key: &str,
    max_attempts: u32,
    mut modify: F,
) -> Result<CasOutcome, StoreError>
where
    S: SharedStore + ?Sized,
    F: FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
{
    let mut outcome = CasOutcome::default();
    for _ in 0..max_attempts.max(1) {
        let (value, cas) = store.get(key)?;
        let cas = cas.unwrap_or(CREATE_CAS);
        let current = value.as_deref().filter(|v| !v.is_empty());
        let Some(new_value) = modify(current) else {
            return Ok(outcome);
        };
        match store.set(key, &new_value, Some(cas)) {
            Ok(()) => {
                outcome.written = true;
                return Ok(outcome);
            }
            Err(StoreError::CasMismatch) => outcome.retries += 1,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::CasMismatch)
}

/// In-memory [`SharedStore`] with Envoy's cas semantics, for tests and
/// host-side tools (the `testkit` feature). `interfere` lets a test slip a
/// concurrent write in between a reader's get and its conditional set.
#[cfg(any(test, feature = "testkit"))]
#[derive(Default)]
pub struct MemStore {
    inner: RefCell<MemInner>,
}

#[cfg(any(test, feature = "testkit"))]
#[derive(Default)]
struct MemInner {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    /// Number of upcoming conditional sets that will find the value changed.
    interfere: u32,
    sets: u64,
    gets: u64,
}

#[cfg(any(test, feature = "testkit"))]
impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `n` conditional writes fail as if another writer got there first.
    pub(crate) fn interfere_next(&self, n: u32) {
        self.inner.borrow_mut().interfere = n;
    }

    pub fn key_count(&self) -> usize {
        self.inner.borrow().map.len()
    }

    /// Total bytes of all values, a proxy for shared-data memory.
    pub fn value_bytes(&self) -> usize {
        self.inner.borrow().map.values().map(|(v, _)| v.len()).sum()
    }

    /// (gets, sets) performed so far.
    pub fn op_counts(&self) -> (u64, u64) {
        let i = self.inner.borrow();
        (i.gets, i.sets)
    }
}

#[cfg(any(test, feature = "testkit"))]
impl SharedStore for MemStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        let mut i = self.inner.borrow_mut();
        i.gets += 1;
        Ok(match i.map.get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut i = self.inner.borrow_mut();
        i.sets += 1;
        i.next_cas = i.next_cas.wrapping_add(1).max(1);
        let next = i.next_cas;
        if let Some(expected) = cas {
            if i.interfere > 0 {
                i.interfere -= 1;
                if let Some(entry) = i.map.get_mut(key) {
                    entry.1 = next;
                }
                return Err(StoreError::CasMismatch);
            }
            if let Some((_, current)) = i.map.get(key) {
                if *current != expected {
                    return Err(StoreError::CasMismatch);
                }
            }
        }
        i.map.insert(key.to_string(), (value.to_vec(), next));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn cas_update_creates_then_writes() {
        let s = MemStore::new();
        let o = cas_update(&s, "k", 3, |cur| {
            assert!(cur.is_none());
            Some(b"v".to_vec())
        })
        .unwrap();
        assert!(o.written);
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn cas_update_retries_on_mismatch_then_succeeds() {
        let s = MemStore::new();
        s.set("k", b"1", None).unwrap();
        s.interfere_next(2);
        let mut calls = 0;
        let o = cas_update(&s, "k", 5, |_| {
            calls += 1;
            Some(b"2".to_vec())
        })
        .unwrap();
        assert_eq!(o.retries, 2);
        assert_eq!(calls, 3);
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn cas_update_gives_up_after_bounded_attempts() {
        let s = MemStore::new();
        s.set("k", b"1", None).unwrap();
        s.interfere_next(10);
        assert_eq!(
            cas_update(&s, "k", 4, |_| Some(vec![9])),
            Err(StoreError::CasMismatch)
        );
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"1"[..]));
    }

    #[test]
    fn a_creator_that_loses_the_race_merges_instead_of_overwriting() {
        let s = MemStore::new();
        let mut raced = false;
        let o = cas_update(&s, "k", 3, |cur| {
            if !raced {
                // Another worker creates the key between our read and write.
                raced = true;
                cas_update(&s, "k", 3, |_| Some(b"B".to_vec())).unwrap();
            }
            let mut v = cur.map(<[u8]>::to_vec).unwrap_or_default();
            v.extend_from_slice(b"A");
            Some(v)
        })
        .unwrap();
        assert_eq!(o.retries, 1);
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"BA"[..]));
        assert_eq!(
            s.op_counts(),
            (3 + 1, 2 + 1),
            "a create is one get and one set"
        );
    }

    #[test]
    fn stale_cas_is_refused() {
        let s = MemStore::new();
        s.set("k", b"1", None).unwrap();
        let (_, cas) = s.get("k").unwrap();
        s.set("k", b"2", None).unwrap();
        assert_eq!(s.set("k", b"3", cas), Err(StoreError::CasMismatch));
    }
}
