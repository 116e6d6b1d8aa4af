//! Cross-replica state sync through Redis (the AIBrix `statesync` design;
//! semantics in `docs/statesync.md`), as a sans-IO engine that the
//! singleton's [`supervisor`] drives (the host forwards its callbacks there):
//!
//! ```text
//! host on_tick          -> supervisor.on_tick(now)    -> engine.tick(now) -> [Call] -> post_bridge(body)
//! host on_http_response -> supervisor.on_reply(token, now, Ok(body) | Err(CallFailed))
//!                       -> engine.on_response(id, ..) -> [Call] -> post_bridge
//! ```
//!
//! - [`settings`]: the `"sync"` config object.
//! - [`syncable`]: the trait components implement (+ optional capabilities).
//! - [`keys`]: the Redis key layout shared with AIBrix, and its split over
//!   hash tags (`hash_tags`).
//! - [`topology`]: Redis Cluster slot owners (`cluster` mode).
//! - [`schedule`]: startup delay, jitter, backoff.
//! - [`probe`]: the Redis health probe (`INFO server`, restart detection).
//! - [`engine`]: the state machine; [`error`], [`stats`] its error and
//!   counters; `cmd` builds the Redis commands it sends and `reply`
//!   decodes what Redis answers.
//! - [`bridge`]: how pipelines reach Redis (a POST to the bridge listener).
//! - [`resp`]: the RESP2 codec under `cmd` and `reply`.
//! - [`syncables`]: what the filter syncs (the `prefixcache` and `podload`
//!   namespaces), with `foreign` keeping other writers' entries.
//! - [`handoff`]: how workers hand recorded blocks to the singleton.
//! - [`liveness`]: the singleton's heartbeat, turned into gauges by workers.
//! - [`place`]: fleet-wide placement of new prompts (`place_new`).
//! - [`supervisor`]: the singleton's loop around the engine: bridge calls,
//!   the Redis probe and restart detection, the heartbeat, the placement
//!   node, the sync stats. The host only forwards its callbacks to it.
//! - `memredis`, `testkit`: an in-memory Redis and drivers for tests and
//!   benchmarks, built only for tests and the `testkit` feature.
//!
//! Beyond AIBrix, pushes also append the changed ids to a per-namespace
//! change-log stream so that most pulls read only what changed; a full SCAN
//! still runs every `full_scan_every` cycles (see [`SyncSettings`]). Between
//! cycles the engine polls that log every `poll_ms` and pushes deltas at
//! most every `push_ms`, so a change reaches peers in about `push_ms` + two
//! polls (rules in [`engine::SyncEngine::tick`]).

pub(crate) mod bridge;
pub(crate) mod cmd;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod foreign;
pub mod handoff;
pub(crate) mod keys;
pub mod liveness;
#[cfg(any(test, feature = "testkit"))]
pub(crate) mod memredis;
pub mod place;
pub(crate) mod probe;
pub mod reply;
pub mod resp;
pub(crate) mod schedule;
pub(crate) mod settings;
pub(crate) mod stats;
pub(crate) mod supervisor;
pub(crate) mod syncable;
pub mod syncables;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod topology;

#[cfg(test)]
mod tests;

pub use settings::SyncSettings;
pub use syncable::{Capabilities, Delta, Rejected, Syncable};

// The engine's tests name these through `super::*`.
#[cfg(test)]
use {
    engine::{Call, SyncEngine},
    error::CallFailed,
};
