//! The reference filter of `prefix-bench overhead`: the least a proxy-wasm
//! filter that routes on the request body can do in this Envoy. It pauses at
//! the request headers, reads the whole body once the stream ends, names a
//! pod in `x-gateway-destination-endpoint` and continues. Nothing else: no
//! parsing, no shared data, no metrics, no logging on the request path.
//!
//! The pod is drawn pseudo-randomly from the plugin configuration's list
//! (`127.0.0.1:8001,127.0.0.1:8002`, commas or spaces between), without
//! looking at the body. A router spreads requests over the pods, and Envoy
//! pays for that whatever the filter does: measured in `prefix-bench
//! overhead`, a filter that names one fixed pod read ~30 us less Envoy CPU
//! and ~50 us lower p50 per 8 KB request than the same filter naming a pod
//! at random among four. So a one-pod reference would charge Envoy's
//! multi-upstream cost to the router.
//!
//! The prefix router's cost is reported as *it minus this*, so what the
//! benchmark charges to the router is only what it does beyond the floor
//! every body-routing wasm filter pays (V8 context per stream, the paused
//! headers, the body copy into the VM, one header set naming one of the
//! pods).
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
        Box::new(ReferenceRoot { pods: Rc::new(Pods::default()) })
    });
}}

/// The configured pods and the draw that picks one per request.
#[derive(Default)]
struct Pods {
    list: Vec<String>,
    /// xorshift64 state (one VM per worker thread: no sharing).
    state: std::cell::Cell<u64>,
}

impl Pods {
    fn pick(&self) -> &str {
        let mut x = self.state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.set(x);
        // `list` is never empty once configured (on_configure refuses that).
        let i = usize::try_from(x % self.list.len().max(1) as u64).unwrap_or(0);
        self.list.get(i).map_or("", String::as_str)
    }
}

/// Holds the configured pods for the streams it creates.
struct ReferenceRoot {
    pods: Rc<Pods>,
}

impl Context for ReferenceRoot {}

impl RootContext for ReferenceRoot {
    /// The whole plugin configuration is the pod list, `host:port` entries
    /// separated by commas or spaces; an empty or non-UTF-8 one is refused
    /// (Envoy will not start with it).
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let list: Vec<String> = std::str::from_utf8(&bytes)
            .unwrap_or("")
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        if list.is_empty() {
            hostcalls::log(
                LogLevel::Error,
                "reference filter: the plugin configuration must list one or more host:port",
            )
            .ok();
            return false;
        }
        self.pods = Rc::new(Pods {
            list,
            state: std::cell::Cell::new(0x9E37_79B9_7F4A_7C15),
        });
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ReferenceFilter {
            pods: self.pods.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct ReferenceFilter {
    pods: Rc<Pods>,
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
            Some(self.pods.pick()),
        );
        Action::Continue
    }
}
