//! Cross-replica state sync through Redis (the AIBrix `statesync` design,
//! see `docs`/spec `statesync.md`), as a sans-IO engine the host drives:
//!
//! ```text
//! host on_tick          -> engine.tick(now)            -> [Call] -> dispatch_http_call(bridge, body)
//! host on_http_response -> engine.on_response(id, now, Ok(body) | Err(CallFailed)) -> [Call] -> dispatch
//! ```
//!
//! - [`settings`]: the `"sync"` config object.
//! - [`syncable`]: the trait components implement (+ optional capabilities).
//! - [`keys`]: the Redis key layout shared with AIBrix.
//! - [`schedule`]: startup delay, jitter, backoff.
//! - [`engine`]: the state machine.
//! - [`memredis`], [`testkit`]: an in-memory Redis and drivers for tests and
//!   benchmarks.
//!
//! Beyond AIBrix, pushes also append the changed ids to a per-namespace
//! change-log stream so that most pulls read only what changed; a full SCAN
//! still runs every `full_scan_every` cycles (see [`SyncSettings`]).

pub mod engine;
pub mod keys;
pub mod memredis;
pub mod schedule;
pub mod settings;
pub mod syncable;
pub mod testkit;

#[cfg(test)]
mod tests;

pub use engine::{Call, CallFailed, CallId, SyncEngine, SyncError, SyncStats};
pub use keys::KeyLayout;
pub use settings::{SettingsError, SyncNamespaces, SyncSettings};
pub use syncable::{Capabilities, Delta, Rejected, Syncable};
