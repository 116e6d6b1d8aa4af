//! The HTTP filter context: forwards Envoy's stream callbacks to
//! [`Stream`], which buffers an OpenAI-compatible request body, asks the
//! router for a pod and names it in `x-gateway-destination-endpoint`. Every
//! failure passes the request on untouched. A request the stream answers
//! itself (table inspection) is answered here and never forwarded.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::envoy::EnvoyHost;
use crate::stream::{Stream, Verdict};
use crate::worker::Worker;

pub(crate) struct PrefixFilter {
    worker: Rc<Worker>,
    stream: Stream,
}

impl PrefixFilter {
    pub(crate) fn new(worker: Rc<Worker>, context_id: u32) -> Self {
        Self {
            worker,
            stream: Stream::new(context_id),
        }
    }
}

fn action(v: Verdict) -> Action {
    match v {
        Verdict::Continue => Action::Continue,
        Verdict::Pause => Action::Pause,
    }
}

impl Context for PrefixFilter {
    /// Redis's placement of this stream's new prompt (`sync.place_new`).
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let reply = super::abi::call_reply(num_headers, body_size).ok();
        let verdict = self
            .stream
            .on_place_reply(&self.worker, &EnvoyHost, token, reply.as_deref());
        if verdict == Some(Verdict::Continue) {
            let _ = proxy_wasm::hostcalls::resume_http_request();
        }
    }

    fn on_done(&mut self) -> bool {
        self.stream.on_done(&self.worker, &EnvoyHost);
        true
    }
}

impl HttpContext for PrefixFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "fault-injection")]
        if super::abi::map_value(
            proxy_wasm::types::MapType::HttpRequestHeaders,
            "x-prefix-router-fault",
        )
        .ok()
        .flatten()
        .as_deref()
            == Some(b"trap".as_slice())
        {
            // The fault-injection test build only: trap as a bug would.
            core::arch::wasm32::unreachable();
        }
        let verdict = self
            .stream
            .on_request_headers(&self.worker, &EnvoyHost, end_of_stream);
        if let Some(answer) = self.stream.take_answer() {
            let headers = vec![("content-type", "application/json")];
            let _ = hostcalls::send_http_response(answer.status, headers, Some(&answer.body));
            return Action::Pause;
        }
        action(verdict)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        action(
            self.stream
                .on_request_body(&self.worker, &EnvoyHost, body_size, end_of_stream),
        )
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        action(self.stream.on_request_trailers(&self.worker, &EnvoyHost))
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.stream.on_response_headers(&self.worker, &EnvoyHost);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        self.stream
            .on_response_body(&self.worker, &EnvoyHost, body_size);
        // Never held: the answer streams through as it comes.
        Action::Continue
    }

    fn on_log(&mut self) {
        self.stream.on_log(&self.worker, &EnvoyHost);
    }
}
