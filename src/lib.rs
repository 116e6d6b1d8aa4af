//! envoy-prefix-router: prefix-cache-aware routing of OpenAI-compatible LLM
//! requests, as an Envoy proxy-wasm filter, with cross-replica sync of the
//! prefix table through Redis.
//!
//! The tree follows the design. Everything but `host` is pure logic that
//! never names `proxy_wasm`; it builds and tests on the host and on
//! `wasm32-unknown-unknown`.
//!
//! - [`shared`]: the foundations: VM shared data behind the `SharedStore`
//!   trait, and the registries that name pods and models by slots in it.
//! - [`route`]: the request path. A body becomes prompt bytes, then chained
//!   block hashes; the prefix table in shared data answers which pods hold
//!   how much of the chain; the policy picks a pod under the load guard; the
//!   router ties the steps together over the `SharedStore` trait.
//! - [`sync`]: cross-replica sync through Redis: the sans-IO engine, its
//!   RESP codec, the synced namespaces (`syncables`), the worker ->
//!   singleton hand-off queue and the singleton's heartbeat.
//! - [`fleet`]: the live fleet (members, health, passive cooldowns),
//!   [`signals`]: what the pods report of their own load (their `/metrics`),
//!   and [`config`]: the plugin configuration.
//! - `inspect`: the prefix table as an operator's debug route shows it.
//! - `stream` (one HTTP stream's callbacks) and `worker` (one worker VM's
//!   shared state and tick): the filter over the `hostcalls::Host` trait, so
//!   all of it runs under a host double in unit tests.
//! - `deployment`: whether this Envoy was put together as documented (the
//!   build, a missing singleton, a singleton configured unlike the filter).
//! - `host` (compiled only for `wasm32-wasip1`, Envoy's target): the thin
//!   layer that talks to Envoy, forwarding its callbacks to `stream` and
//!   `worker`, and the singleton's to the sync loop (`sync::supervisor`) and
//!   the `singleton` services (membership refresher, signal collector).

// The host layer is compiled for Envoy's target only, so on any other target
// what only it calls looks unused: dead code is judged on wasm32-wasip1
// (`make lint`), where the whole filter is built.
// These docs are for the crate's maintainers (its API is what the tests and
// the bench use): build them with `cargo doc --document-private-items`, where
// public items' links to crate-private ones resolve.
#![allow(rustdoc::private_intra_doc_links)]
#![cfg_attr(not(all(target_arch = "wasm32", target_os = "wasi")), allow(dead_code))]

pub mod config;
pub(crate) mod deployment;
pub mod fleet;
pub(crate) mod hostcalls;
pub(crate) mod inspect;
pub(crate) mod placer;
pub mod rng;
pub mod route;
pub mod shared;
pub mod signals;
pub(crate) mod singleton;
pub(crate) mod stream;
pub mod sync;
#[cfg(test)]
mod testhost;
pub(crate) mod worker;

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod host;
