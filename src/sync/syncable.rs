//! The contract between the sync engine and the state it shares: the Rust
//! analogue of AIBrix's Go `Syncable` interface and its optional capability
//! interfaces. The engine only ever sees ids and bytes.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

/// A remote entity the component refused to merge (counted as `rejected`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected(pub String);

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "remote entity rejected: {}", self.0)
    }
}

impl std::error::Error for Rejected {}

/// What changed since the last successful push.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Entities added or changed, with their current payload.
    pub(crate) updated: Vec<(String, Vec<u8>)>,
    /// Entities deleted locally.
    pub(crate) deleted: Vec<String>,
}

/// Optional capabilities, the equivalent of Go's interface type assertions.
/// The engine calls a capability's methods only when its flag is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `delta` / `clear_dirty`: push only what changed.
    pub(crate) delta: bool,
    /// `on_sync_start` / `on_sync_end` around each pull.
    pub(crate) hooks: bool,
    /// `is_stale`: stale remote entities are deleted from Redis, not applied.
    pub(crate) stale: bool,
    /// `make_tombstone` / `is_tombstone` / `delete_local`: deletions travel
    /// as tombstone payloads instead of `DEL`.
    pub(crate) tombstones: bool,
}

/// State that takes part in cross-replica sync.
pub trait Syncable {
    /// Stable, non-empty namespace (part of every Redis key).
    fn namespace(&self) -> String;

    /// Every entity as `(id, payload)`; pushed when `delta` is not supported.
    fn snapshot(&self) -> Vec<(String, Vec<u8>)>;

    /// Merges one remote entity into local state.
    fn apply_remote(&mut self, id: &str, payload: &[u8]) -> Result<(), Rejected>;

    /// Which optional methods below are meaningful.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Changes since the last `clear_dirty`. Must not clear anything itself:
    /// a failed push has to find the same changes again.
    fn delta(&self) -> Delta {
        Delta::default()
    }

    /// Called only after every write of a push succeeded, with the ids that
    /// push carried (updated and deleted). A component whose entities can
    /// change while a push is in flight may keep those dirty.
    fn clear_dirty(&mut self, _pushed_ids: &[String]) {}

    /// Before a pull of this namespace starts.
    fn on_sync_start(&mut self) {}

    /// After a pull of this namespace ends (also when it failed).
    fn on_sync_end(&mut self) {}

    /// True when a remote entity is too old to keep: the pull `DEL`s it.
    fn is_stale(&self, _id: &str, _payload: &[u8]) -> bool {
        false
    }

    /// Payload that tells peers `id` was deleted.
    fn make_tombstone(&self, _id: &str) -> Vec<u8> {
        Vec::new()
    }

    /// True when a remote payload is a tombstone.
    fn is_tombstone(&self, _id: &str, _payload: &[u8]) -> bool {
        false
    }

    /// Removes `id` locally after a peer's tombstone arrived.
    fn delete_local(&mut self, _id: &str) {}
}

/// Lets a host keep its own handle on a component the engine also drives.
/// A component busy elsewhere (already borrowed) is treated as empty or as
/// rejecting, never as a panic: the next cycle tries again.
impl<T: Syncable + ?Sized> Syncable for Rc<RefCell<T>> {
    fn namespace(&self) -> String {
        self.try_borrow().map(|c| c.namespace()).unwrap_or_default()
    }
    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        self.try_borrow().map(|c| c.snapshot()).unwrap_or_default()
    }
    fn apply_remote(&mut self, id: &str, payload: &[u8]) -> Result<(), Rejected> {
        match self.try_borrow_mut() {
            Ok(mut c) => c.apply_remote(id, payload),
            Err(_) => Err(Rejected("component busy".into())),
        }
    }
    fn capabilities(&self) -> Capabilities {
        self.try_borrow()
            .map(|c| c.capabilities())
            .unwrap_or_default()
    }
    fn delta(&self) -> Delta {
        self.try_borrow().map(|c| c.delta()).unwrap_or_default()
    }
    fn clear_dirty(&mut self, pushed_ids: &[String]) {
        if let Ok(mut c) = self.try_borrow_mut() {
            c.clear_dirty(pushed_ids);
        }
    }
    fn on_sync_start(&mut self) {
        if let Ok(mut c) = self.try_borrow_mut() {
            c.on_sync_start();
        }
    }
    fn on_sync_end(&mut self) {
        if let Ok(mut c) = self.try_borrow_mut() {
            c.on_sync_end();
        }
    }
    fn is_stale(&self, id: &str, payload: &[u8]) -> bool {
        self.try_borrow()
            .map(|c| c.is_stale(id, payload))
            .unwrap_or(false)
    }
    fn make_tombstone(&self, id: &str) -> Vec<u8> {
        self.try_borrow()
            .map(|c| c.make_tombstone(id))
            .unwrap_or_default()
    }
    fn is_tombstone(&self, id: &str, payload: &[u8]) -> bool {
        self.try_borrow()
            .map(|c| c.is_tombstone(id, payload))
            .unwrap_or(false)
    }
    fn delete_local(&mut self, id: &str) {
        if let Ok(mut c) = self.try_borrow_mut() {
            c.delete_local(id);
        }
    }
}
