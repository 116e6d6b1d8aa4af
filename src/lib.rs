//! envoy-prefix-router: prefix-cache-aware routing of OpenAI-compatible LLM
//! requests, as an Envoy proxy-wasm filter, with cross-replica sync of the
//! prefix table through Redis.
//!
//! Pure logic lives in the top-level modules and never names `proxy_wasm`; it
//! builds and tests on the host and on `wasm32-unknown-unknown`. The thin host
//! layer in [`host`] (compiled only for `wasm32-wasip1`, Envoy's target) is the
//! one place that talks to Envoy.
//!
//! Request path: [`request`] turns a body into prompt bytes, [`hashing`] cuts
//! them into chained block hashes, [`table`] answers which pods hold how much of
//! the chain, [`policy`] picks a pod under the load guard, and [`router`] ties
//! the steps together over the [`store::SharedStore`] trait. [`stream`] is
//! one HTTP stream's callbacks and [`worker`] one worker VM's shared state
//! and tick, both over the [`worker::Host`] trait; [`meter`] keeps their
//! stats in VM memory until the tick flushes them.

// The host layer is compiled for Envoy's target only, so on any other target
// what only it calls looks unused: dead code is judged on wasm32-wasip1
// (`make lint`), where the whole filter is built.
#![cfg_attr(not(all(target_arch = "wasm32", target_os = "wasi")), allow(dead_code))]

pub mod config;
pub mod fleet;
pub mod rng;
pub mod route;
pub(crate) mod stream;
pub mod sync;
pub(crate) mod worker;

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod host;
