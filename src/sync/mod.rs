//! Cross-replica state sync through Redis (the AIBrix `statesync` design;
//! semantics in `docs/statesync.md`), as a sans-IO engine the host drives:
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
//! - [`probe`]: the host's Redis health probe (`INFO server`, restart detection).
//! - [`engine`]: the state machine; [`error`], [`stats`] its error and
//!   counters; `cmd` builds the Redis commands it sends and `reply`
//!   decodes what Redis answers.
//! - `memredis`, `testkit`: an in-memory Redis and drivers for tests and
//!   benchmarks, built only for tests and the `testkit` feature.
//!
//! Beyond AIBrix, pushes also append the changed ids to a per-namespace
//! change-log stream so that most pulls read only what changed; a full SCAN
//! still runs every `full_scan_every` cycles (see [`SyncSettings`]). Between
//! cycles the engine polls that log every `poll_ms` and pushes deltas every
//! half period, so a change reaches peers in about period/2 + `poll_ms`
//! (rules in [`SyncEngine::tick`]).

mod cmd;
pub mod engine;
pub mod error;
pub mod keys;
#[cfg(any(test, feature = "testkit"))]
pub mod memredis;
pub mod probe;
mod reply;
pub mod schedule;
pub mod settings;
pub mod stats;
pub mod syncable;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

#[cfg(test)]
mod tests;

pub use engine::{Call, CallId, SyncEngine};
pub use error::{CallFailed, SyncError};
pub use keys::KeyLayout;
pub use settings::{SettingsError, SyncNamespaces, SyncSettings};
pub use stats::SyncStats;
pub use syncable::{Capabilities, Delta, Rejected, Syncable};
