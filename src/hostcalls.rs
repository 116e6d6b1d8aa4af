//! What the filter asks of Envoy, as one narrow trait: the worker, its
//! streams and the placer run over [`Host`], so all of them are tested on the
//! host under a double, and `host::envoy` implements it over the hostcalls.

use crate::shared::metrics::MetricSink;
use crate::shared::store::SharedStore;

/// What the request path asks of Envoy, besides shared data and stats.
/// Every method is one hostcall; none fails a request: a failure reads as
/// absent, empty or `false`.
pub trait Host: SharedStore + MetricSink {
    /// Wall clock, unix nanoseconds (0 if unreadable).
    fn now_nanos(&self) -> u64;
    /// Every request header, in the proxy-wasm map encoding (see
    /// [`crate::stream::RequestHead::decode`]); None if unreadable.
    fn request_headers(&self) -> Option<Vec<u8>>;
    /// Sets a request header; false if the host refused.
    fn set_request_header(&self, name: &str, value: &str) -> bool;
    fn remove_request_header(&self, name: &str);
    fn set_response_header(&self, name: &str, value: &str);
    /// The buffered request body, up to `max` bytes: `Some(empty)` when
    /// there is none, None when the host failed.
    fn request_body(&self, max: usize) -> Option<Vec<u8>>;
    /// A stream property (`["upstream", "address"]`) as bytes.
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// The id of a shared queue another VM registered.
    fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32>;
    /// Enqueues a message; false if the queue is gone or refused it.
    fn enqueue(&self, queue: u32, message: &[u8]) -> bool;
    /// Resumes the held request of stream `stream` (Envoy continues it
    /// after the current callback), then makes `current`, the context of
    /// the callback running now, the one hostcalls act on again. False if
    /// the stream is gone.
    fn resume_request(&self, stream: u32, current: u32) -> bool;
    /// POSTs `body` (a Redis pipeline) to the bridge of `sync`, to Redis
    /// Cluster master `node` when named (in `sync.node_header`), answered
    /// to the current context within `timeout_ms`; the call's token, None
    /// if Envoy refused it.
    fn call_bridge(
        &self,
        sync: &crate::sync::SyncSettings,
        node: Option<&str>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32>;
}
