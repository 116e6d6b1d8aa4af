//! The reference filter of `prefix-bench overhead`: the least a proxy-wasm
//! filter that routes on the request body can do in this Envoy. It pauses at
//! the request headers, reads the whole body once the stream ends, names one
//! fixed pod (the plugin configuration, e.g. `127.0.0.1:8001`) in
//! `x-gateway-destination-endpoint` and continues. Nothing else: no parsing,
//! no shared data, no metrics, no logging on the request path.
//!
//! The prefix router's cost is reported as *it minus this*, so what the
//! benchmark charges to the router is only what it does beyond the floor
//! every body-routing wasm filter pays (V8 context per stream, the paused
//! headers, the body copy into the VM, one header set).
//!
//! Built for `wasm32-wasip1` by `make build`:
//! `target/wasm32-wasip1/release/reference_filter.wasm` (`envoy/reference.yaml`).

#![cfg(all(target_arch = "wasm32", target_os = "wasi"))]

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

/// Header read by Envoy's `override_host` LB policy (as in the main filter).
const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(ReferenceRoot { endpoint: Rc::from("") })
    });
}}

/// Holds the configured pod for the streams it creates.
struct ReferenceRoot {
    endpoint: Rc<str>,
}

impl Context for ReferenceRoot {}

impl RootContext for ReferenceRoot {
    /// The whole plugin configuration is the pod, `host:port`; an empty or
    /// non-UTF-8 one is refused (Envoy will not start with it).
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match std::str::from_utf8(&bytes).map(str::trim) {
            Ok(endpoint) if !endpoint.is_empty() => {
                self.endpoint = Rc::from(endpoint);
                true
            }
            _ => {
                hostcalls::log(
                    LogLevel::Error,
                    "reference filter: the plugin configuration must be one host:port",
                )
                .ok();
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ReferenceFilter {
            endpoint: self.endpoint.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct ReferenceFilter {
    endpoint: Rc<str>,
}

impl Context for ReferenceFilter {}

impl HttpContext for ReferenceFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // No body to wait for: nothing to route on.
        if end_of_stream {
            return Action::Continue;
        }
        // Needs allow_on_headers_stop_iteration: true (envoy/reference.yaml).
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        // The whole body into the VM, as any body-routing filter must; what
        // it says does not matter here.
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size);
        std::hint::black_box(&body);
        let _ = hostcalls::set_map_value(
            MapType::HttpRequestHeaders,
            DESTINATION_HEADER,
            Some(&self.endpoint),
        );
        Action::Continue
    }
}
