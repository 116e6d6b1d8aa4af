//! [`EnvoyHost`]: the pure modules' host traits ([`SharedStore`],
//! [`MetricSink`], [`Host`], [`HttpCalls`], [`BridgeCalls`], [`DeploymentHost`]) over Envoy's hostcalls. Host statuses become
//! [`StoreError`]s, `None` or `false` here, at the adapter boundary; nothing
//! here traps (the getters go through [`super::abi`]).

use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};

use super::abi;
use crate::deployment::DeploymentHost;
use crate::hostcalls::Host;
use crate::shared::calls::HttpCalls;
use crate::shared::metrics::{MetricKind, MetricSink};
use crate::shared::store::{SharedStore, StoreError, Versioned};
use crate::sync::bridge::BridgeCalls;
use crate::sync::SyncSettings;

/// Envoy, through this VM's hostcalls (shared data is one map per `vm_id`,
/// shared by every worker and the singleton).
#[derive(Clone, Copy, Default)]
pub(crate) struct EnvoyHost;

impl SharedStore for EnvoyHost {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        hostcalls::get_shared_data(key).map_err(|s| host_error(key, s))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(s) => Err(host_error(key, s)),
        }
    }
}

fn host_error(key: &str, status: Status) -> StoreError {
    StoreError::Host {
        key: key.to_string(),
        status: format!("{status:?}"),
    }
}

impl MetricSink for EnvoyHost {
    fn define_metric(&self, kind: MetricKind, name: &str) -> u32 {
        let kind = match kind {
            MetricKind::Counter => MetricType::Counter,
            MetricKind::Gauge => MetricType::Gauge,
            MetricKind::Histogram => MetricType::Histogram,
        };
        // 0 is never a valid id from Envoy; writes to it fail and are ignored.
        hostcalls::define_metric(kind, name).unwrap_or(0)
    }

    fn increment_metric(&self, id: u32, by: i64) {
        let _ = hostcalls::increment_metric(id, by);
    }

    fn record_metric(&self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }
}

impl Host for EnvoyHost {
    fn now_nanos(&self) -> u64 {
        now_nanos()
    }

    fn request_headers(&self) -> Option<Vec<u8>> {
        abi::map_pairs(MapType::HttpRequestHeaders).ok()
    }

    fn set_request_header(&self, name: &str, value: &str) -> bool {
        hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(value)).is_ok()
    }

    fn remove_request_header(&self, name: &str) {
        let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, name);
    }

    fn set_response_header(&self, name: &str, value: &str) {
        let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(value));
    }

    fn request_body(&self, max: usize) -> Option<Vec<u8>> {
        abi::buffer(BufferType::HttpRequestBody, 0, max)
            .ok()
            .map(Option::unwrap_or_default)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        abi::property(path).ok().flatten()
    }

    fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32> {
        hostcalls::resolve_shared_queue(vm_id, name).ok().flatten()
    }

    fn enqueue(&self, queue: u32, message: &[u8]) -> bool {
        hostcalls::enqueue_shared_queue(queue, Some(message)).is_ok()
    }

    fn resume_request(&self, stream: u32, current: u32) -> bool {
        // Envoy defers the continue until this callback returns, so the
        // held stream's callbacks never run inside this one.
        let resumed = hostcalls::set_effective_context(stream).is_ok()
            && hostcalls::resume_http_request().is_ok();
        let _ = hostcalls::set_effective_context(current);
        resumed
    }

    fn call_bridge(
        &self,
        sync: &crate::sync::SyncSettings,
        node: Option<&str>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32> {
        dispatch_bridge(sync, node, body, Duration::from_millis(timeout_ms)).ok()
    }
}

impl HttpCalls for EnvoyHost {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Result<u32, String> {
        let timeout = Duration::from_millis(timeout_ms);
        hostcalls::dispatch_http_call(cluster, headers.to_vec(), body, vec![], timeout)
            .map_err(|status| format!("{status:?}"))
    }
}

impl DeploymentHost for EnvoyHost {
    fn queue_registered(&self, vm_id: &str, name: &str) -> bool {
        matches!(hostcalls::resolve_shared_queue(vm_id, name), Ok(Some(_)))
    }
}

impl BridgeCalls for EnvoyHost {
    fn post_bridge(
        &self,
        sync: &crate::sync::SyncSettings,
        node: Option<&str>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, String> {
        dispatch_bridge(sync, node, body, Duration::from_millis(timeout_ms))
            .map_err(|status| format!("{status:?}"))
    }
}

/// Wall clock, unix nanoseconds (0 if unreadable).
pub(crate) fn now_nanos() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// POSTs a raw RESP pipeline to the Redis bridge of `sync`. In cluster mode
/// `node` names the master to reach: it goes in `sync.node_header`, and the
/// bridge's ORIGINAL_DST upstream connects to it. The call's token, or the
/// status Envoy refused it with.
pub(super) fn dispatch_bridge(
    sync: &SyncSettings,
    node: Option<&str>,
    body: &[u8],
    timeout: Duration,
) -> Result<u32, Status> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", sync.bridge_path.as_str()),
        (":authority", sync.bridge_authority.as_str()),
        ("content-type", "application/octet-stream"),
    ];
    if let Some(node) = node {
        headers.push((sync.node_header.as_str(), node));
    }
    hostcalls::dispatch_http_call(&sync.bridge_cluster, headers, Some(body), vec![], timeout)
}
