//! How the singleton reaches Redis: a RESP pipeline POSTed to the Redis
//! bridge listener (`sync.bridge_cluster`), one call per pipeline. The host
//! implements [`BridgeCalls`] over `dispatch_http_call`; tests answer the
//! calls from an in-memory Redis.

use super::SyncSettings;

/// Sends pipelines to the bridge of `sync`.
pub(crate) trait BridgeCalls {
    /// POSTs `body` (a Redis pipeline) to the bridge of `sync`, to Redis
    /// Cluster master `node` when named (in `sync.node_header`), answered
    /// within `timeout_ms`; the call's token, or Envoy's refusal (its status
    /// in words).
    fn post_bridge(
        &self,
        sync: &SyncSettings,
        node: Option<&str>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, String>;
}
