//! The HTTP filter context: buffers an OpenAI-compatible request body, asks
//! the [`Router`](crate::router::Router) for a pod, and names it in the
//! `x-gateway-destination-endpoint` header (and `x-envoy-original-dst-host`
//! for ORIGINAL_DST clusters). Every failure passes the request on untouched.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use super::abi;
use super::shared::FilterShared;
use super::store::HostStore;
use crate::request::{classify, parse_body_as, ApiKind, PassReason};

/// Header read by Envoy's `override_host` LB policy (Gateway API Inference
/// Extension endpoint-picker protocol).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Header read by an `ORIGINAL_DST` cluster with `use_http_header: true`.
pub const ORIGINAL_DST_HEADER: &str = "x-envoy-original-dst-host";

pub struct PrefixFilter {
    shared: Rc<FilterShared>,
    kind: Option<ApiKind>,
    /// Pod counted in flight for this stream (slot and the address it was
    /// sent to), released exactly once.
    inflight_pod: Option<(u16, String)>,
    /// Where the request was sent, for the passive health check in `on_log`.
    sent_to: Option<(u16, String)>,
    match_percent: Option<u8>,
}

impl PrefixFilter {
    pub fn new(shared: Rc<FilterShared>) -> Self {
        Self {
            shared,
            kind: None,
            inflight_pod: None,
            sent_to: None,
            match_percent: None,
        }
    }

    fn pass(&mut self, reason: PassReason) -> Action {
        self.kind = None;
        self.count_pass(reason);
        Action::Continue
    }

    /// Counts a pass-through and gives ORIGINAL_DST clusters a destination,
    /// so a request we do not route still reaches a pod.
    fn count_pass(&self, reason: PassReason) {
        self.shared.metrics.passthrough(reason);
        if let Some(endpoint) = self.shared.fallback_endpoint() {
            let _ = hostcalls::set_map_value(
                MapType::HttpRequestHeaders,
                ORIGINAL_DST_HEADER,
                Some(&endpoint),
            );
        }
    }

    /// Routes a complete body, or passes the request through counting why.
    fn finish(&mut self, kind: ApiKind, body: &[u8]) {
        if let Err(reason) = self.route_body(kind, body) {
            self.count_pass(reason);
        }
    }

    fn route_body(&mut self, kind: ApiKind, body: &[u8]) -> Result<(), PassReason> {
        let req = parse_body_as(kind, body, self.shared.router.settings().render())?;
        let started = hostcalls::get_current_time().ok();
        let routed = self.shared.route(&HostStore, &req).map_err(|e| {
            log::warn!("prefix_router: routing failed, passing through: {e}");
            match e {
                crate::router::RouteError::NoEndpoints => PassReason::NoEndpoints,
                crate::router::RouteError::Store(_) => PassReason::InternalError,
            }
        })?;
        let pod = routed.choice.pod;
        let endpoint = self
            .shared
            .router
            .fleet()
            .address(pod)
            .unwrap_or_default()
            .to_string();
        // Counted in flight from here: release on stream end whatever happens next.
        self.inflight_pod = Some((pod, endpoint.clone()));
        self.sent_to = Some((pod, endpoint.clone()));
        self.match_percent = Some(routed.choice.match_percent);
        if endpoint.is_empty() {
            return Err(PassReason::InternalError);
        }
        hostcalls::set_map_value(
            MapType::HttpRequestHeaders,
            DESTINATION_HEADER,
            Some(&endpoint),
        )
        .map_err(|_| PassReason::InternalError)?;
        hostcalls::set_map_value(
            MapType::HttpRequestHeaders,
            ORIGINAL_DST_HEADER,
            Some(&endpoint),
        )
        .map_err(|_| PassReason::InternalError)?;
        if let (Some(start), Ok(end)) = (started, hostcalls::get_current_time()) {
            if let Ok(d) = end.duration_since(start) {
                let m = &self.shared.metrics;
                m.record(
                    m.route_time_us,
                    u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
                );
            }
        }
        Ok(())
    }

    /// Releases the in-flight count (on_done or on_log, whichever comes first).
    fn release(&mut self) {
        if let Some((pod, address)) = self.inflight_pod.take() {
            match self.shared.router.release(&HostStore, pod) {
                Ok(v) => self.shared.metrics.inflight(&address, v),
                Err(e) => log::warn!("prefix_router: in-flight release failed: {e}"),
            }
        }
    }
}

impl Context for PrefixFilter {
    fn on_done(&mut self) -> bool {
        self.release();
        true
    }
}

impl HttpContext for PrefixFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let m = &self.shared.metrics;
        m.inc(m.requests);
        // A client must never pick the upstream itself (with ORIGINAL_DST that
        // would let it reach any host): drop both headers before anything else.
        let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, DESTINATION_HEADER);
        let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, ORIGINAL_DST_HEADER);
        // Raw reads: a header value that is not UTF-8 reads as empty
        // instead of trapping the VM (the SDK's getter unwraps it).
        let header = |name: &str| abi::header_text(MapType::HttpRequestHeaders, name);
        let kind = match classify(&header(":method"), &header(":path")) {
            Ok(kind) => kind,
            Err(reason) => return self.pass(reason),
        };
        if end_of_stream {
            return self.pass(PassReason::NoPrompt);
        }
        let max = self.shared.router.settings().max_body_bytes;
        if header("content-length")
            .parse::<usize>()
            .is_ok_and(|n| n > max)
        {
            return self.pass(PassReason::BodyTooLarge);
        }
        self.kind = Some(kind);
        // Hold the headers until the body is read (needs
        // allow_on_headers_stop_iteration: true in the plugin config).
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(kind) = self.kind else {
            return Action::Continue;
        };
        if body_size > self.shared.router.settings().max_body_bytes {
            return self.pass(PassReason::BodyTooLarge);
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.kind = None;
        let body = match abi::buffer(BufferType::HttpRequestBody, 0, body_size) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(_) => return self.pass(PassReason::InternalError),
        };
        self.finish(kind, &body);
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // Body ended with trailers (no end_of_stream on the last data frame).
        if let Some(kind) = self.kind.take() {
            let body = abi::buffer(BufferType::HttpRequestBody, 0, usize::MAX)
                .ok()
                .flatten()
                .unwrap_or_default();
            self.finish(kind, &body);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let (Some(name), Some(pct)) = (
            &self.shared.router.settings().match_header,
            self.match_percent,
        ) {
            let _ = hostcalls::set_map_value(
                MapType::HttpResponseHeaders,
                name,
                Some(&pct.to_string()),
            );
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
        // Passive health: did the pod fail this request? Needs the stream's
        // final properties, which on_log has.
        if let Some((pod, address)) = self.sent_to.take() {
            if !address.is_empty() {
                self.shared.observe_outcome(pod, &address);
            }
        }
    }
}
