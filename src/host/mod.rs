//! The host layer: the only code that names `proxy_wasm`. It adapts Envoy's
//! callbacks to the pure modules: [`root::FilterRoot`] and
//! [`filter::PrefixFilter`] forward the request path to
//! [`crate::worker::Worker`] and [`crate::stream::Stream`];
//! [`sync_service::SyncRoot`] forwards the singleton's to
//! [`crate::singleton::Singleton`];
//! [`envoy::EnvoyHost`] implements the pure modules' host traits over the
//! hostcalls, and [`abi`] the getters that must not trap.

mod abi;
mod envoy;
mod filter;
mod root;
mod sync_service;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::{BufferType, LogLevel};

use crate::config::Settings;
use crate::deployment::SYNC_ROOT_ID;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        if root_id() == SYNC_ROOT_ID {
            Box::new(sync_service::SyncRoot::default())
        } else {
            Box::new(root::FilterRoot::new(context_id))
        }
    });
}}

/// Follows the level of Envoy's `wasm` log component (`-l`,
/// `--component-log-level wasm:debug`, or the admin's
/// `POST /logging?wasm=debug` at run time): lines below it are never
/// formatted, and `debug` turns on the per-request decision lines
/// ([`crate::route::router::explain`]). Called on every tick; a level the
/// host does not give keeps the one before.
fn follow_log_level() {
    let level = match abi::log_level() {
        Ok(0) => LogLevel::Trace,
        Ok(1) => LogLevel::Debug,
        Ok(2) => LogLevel::Info,
        Ok(3) => LogLevel::Warn,
        Ok(4) => LogLevel::Error,
        Ok(5) => LogLevel::Critical,
        _ => return,
    };
    proxy_wasm::set_log_level(level);
}

fn property(name: &str) -> String {
    abi::property(&[name])
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn root_id() -> String {
    property("plugin_root_id")
}

fn vm_id() -> String {
    property("plugin_vm_id")
}

/// Reads and validates the plugin configuration; logs why and returns None
/// when it is refused (the caller returns false from `on_configure`). The
/// bytes as given come too: the filter publishes them and the singleton
/// compares them with its own ([`crate::deployment`]).
fn load_plugin_config() -> Option<(Settings, Vec<u8>)> {
    let bytes = abi::buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default();
    match Settings::from_json(&bytes) {
        Ok(s) => Some((s, bytes)),
        Err(e) => {
            log::error!("prefix_router: {e}");
            None
        }
    }
}
