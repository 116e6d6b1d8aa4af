//! The process harness shared by the integration tests (`tests/`) and
//! `prefix-bench`: free loopback ports, `envoy/*.yaml` rendered onto them,
//! Envoy / podsim / Redis child processes that are killed when dropped (and
//! when this process ends, see [`spawn_owned`]),
//! scripts run as a [`Service`], small HTTP and admin-stats clients, the one
//! launcher of Envoys started together and a [`fleet::Fleet`] of them sharing
//! pods and Redis ([`fleet`]), an independent RESP client ([`redis`]), a
//! local Redis Cluster ([`cluster`]) and the AIBrix oracle ([`aibrix`]).
//!
//! Binaries are found, in order, through an environment variable
//! (`ENVOY_BIN`, `PODSIM_BIN`, `PREFIX_ROUTER_WASM`, `REFERENCE_FILTER_WASM`,
//! `REDIS_SERVER_BIN`), then in the repository (`.venv/bin/envoy`,
//! `<target>/{release,debug}/podsim`, `<target>/wasm32-wasip1/release/*.wasm`),
//! then on `PATH`.
//! Building them is the Makefile's job (`make build`), not the tests'.
//!
//! One module per concern; everything the tests and the bench name is
//! re-exported here, so they write `harness::Setup`, `harness::free_port`.

// Test tooling: a setup that fails (a process that does not start, a file
// that cannot be written) can only stop, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod aibrix;
pub mod cluster;
mod envoy;
mod fault_proxy;
pub mod fleet;
mod http;
mod paths;
mod pod;
mod ports;
mod process;
mod prompts;
pub mod redis;
mod render;
mod setup;
mod test_dir;

pub use envoy::{inflight_stat_name, Envoy, EnvoyOptions, EnvoyStartError, STATS_FLUSH};
pub use fault_proxy::FaultProxy;
pub use http::{get, send, Reply, CLIENT_TIMEOUT};
pub use paths::{
    envoy_bin, podsim_bin, python_bin, redis_server_bin, reference_wasm_module, repo_root,
    target_dir, wasm_module, with_module_paths, REFERENCE_WASM_REL_PATH, WASM_REL_PATH,
};
pub use pod::Pod;
pub use ports::{
    free_port, Ports, PLACEHOLDER_ADMIN, PLACEHOLDER_LISTENER, PLACEHOLDER_PODS, PLACEHOLDER_REDIS,
    PLACEHOLDER_REDIS_BRIDGE,
};
pub use process::{
    child_with_args, children, run_ok, spawn_owned, stat_fields, tail, wait_until, Service,
};
pub use prompts::{
    assert_one_pod, chat_body, completion_body, shared_prefix_prompts, text, token_ids,
};
pub use redis::Redis;
pub use render::{
    envoy_template, lds_listener, patch_plugin_json, render_config, render_lds, render_text,
    substitute_ports, write_eds, write_lds_listeners, EdsHost,
};
pub use setup::{PluginPatch, Running, Setup};
pub use test_dir::TestDir;
