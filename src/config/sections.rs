//! The plugin configuration's sections that are plain settings (`hold`,
//! `policy`, `signals`, `membership`): their fields and
//! defaults. Validation across sections is [`super::Settings::from_json`]'s.

use serde::Deserialize;

use crate::fleet::membership::PodNaming;
use crate::route::policy::{LoadAwareConfig, PolicyMode};
use crate::signals::MetricNames;

/// Holding a request whose matched prefix its pod is still computing
/// (`"hold": {...}`; see [`crate::route::hold`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct HoldSettings {
    /// Hold such a request until the earlier request of this VM computing
    /// the prefix answers, then send it to the same pod.
    pub(crate) enabled: bool,
    /// Longest hold (the worker's tick checks it: up to 250 ms more).
    pub(crate) max_ms: u32,
    /// Most requests one worker VM holds at once; past that they go on.
    pub(crate) max_waiting: u32,
}

impl Default for HoldSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_ms: 1_000,
            max_waiting: 256,
        }
    }
}

/// Table inspection (`"inspect": {...}`; see [`crate::inspect`]): the
/// filter answers `GET <path>` itself, with the prefix table as JSON, on
/// the listener whose filter chain is named `filter_chain` only. Off while
/// `path` is empty.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct InspectSettings {
    /// The path answered (query aside), e.g. `/debug/prefix-table`.
    pub(crate) path: String,
    /// The `name` of the listener filter chain it is answered on (Envoy's
    /// `xds.filter_chain_name` attribute: a filter cannot read the
    /// listener's own name); on every other chain the path is an ordinary
    /// request.
    pub(crate) filter_chain: String,
    /// Most table buckets one answer reads (each up to 64 records);
    /// `?from=<bucket>` reads the next page.
    pub(crate) max_buckets: u32,
}

impl Default for InspectSettings {
    fn default() -> Self {
        Self {
            path: String::new(),
            filter_chain: String::new(),
            max_buckets: 1024,
        }
    }
}

/// The routing policy (`"policy": {...}`): which rules, and the knobs of
/// the load-aware rule (AIBrix's knobs are the top-level
/// `imbalance_abs_count` and `stddev_factor`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct PolicySettings {
    /// `load_aware` or `aibrix`; with `compat: aibrix`, `aibrix` unless stated.
    pub(crate) mode: PolicyMode,
    /// A matched pod is never chosen with a load above the least loaded
    /// pod's + max(`slack_abs`, `slack_rel` x that load).
    pub(crate) slack_abs: u32,
    pub(crate) slack_rel: f64,
    /// Prefill blocks one request of load above the least loaded pod is
    /// taken to cost: a match must save more blocks than its pod's extra
    /// load costs.
    pub(crate) queue_cost_blocks: u32,
}

impl Default for PolicySettings {
    fn default() -> Self {
        let d = LoadAwareConfig::default();
        Self {
            mode: PolicyMode::LoadAware,
            slack_abs: d.slack_abs,
            slack_rel: d.slack_rel,
            queue_cost_blocks: d.queue_cost_blocks,
        }
    }
}

/// Pod signals (`"signals": {...}`): the sync singleton reads each live
/// pod's Prometheus metrics through an Envoy cluster, naming the pod in a
/// header (`override_host` or `ORIGINAL_DST` with `use_http_header`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SignalSettings {
    pub(crate) enabled: bool,
    /// The cluster the scrapes go through; empty = each cluster pool's own
    /// cluster (static pools then need one named here).
    pub(crate) cluster: String,
    /// Header naming the pod (`host:port`) on each scrape.
    pub(crate) host_header: String,
    pub(crate) path: String,
    /// `:authority` of scrapes; empty = the pod's `host:port`.
    pub(crate) authority: String,
    /// How often each pod is read.
    pub(crate) interval_ms: u32,
    /// A scrape unanswered after this long counts as failed.
    pub(crate) timeout_ms: u32,
    /// Bytes of a `/metrics` reply read at most (the rest is ignored).
    pub(crate) max_body_bytes: usize,
    /// Metric names, each a list tried in order.
    pub(crate) names: MetricNames,
    /// Share scrapes through Redis (needs `sync`): each pod is scraped by
    /// one replica, every replica reads the others' (see
    /// [`crate::signals::share`]).
    pub(crate) share: bool,
}

impl Default for SignalSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            cluster: String::new(),
            host_header: "x-gateway-destination-endpoint".into(),
            path: "/metrics".into(),
            authority: String::new(),
            interval_ms: 250,
            timeout_ms: 1000,
            max_body_bytes: 256 * 1024,
            names: MetricNames::default(),
            share: false,
        }
    }
}

impl SignalSettings {
    /// How old a published record may be and still count: three intervals
    /// plus the timeout (a pod is read once per interval; a slow reply is
    /// not yet a failed one).
    pub(crate) fn stale_ms(&self) -> u64 {
        3 * u64::from(self.interval_ms) + u64::from(self.timeout_ms)
    }
}

/// Where cluster pools' members come from: Envoy's admin `/clusters`,
/// fetched by the singleton through a cluster that points at the admin
/// listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct MembershipSettings {
    /// Envoy cluster of the admin listener.
    pub(crate) admin_cluster: String,
    /// `:authority` of admin calls.
    pub(crate) admin_authority: String,
    /// How often the singleton refreshes members and health.
    pub(crate) refresh_ms: u32,
    /// How pods are named: `address` (`ip:port`) or `hostname`.
    pub(crate) pod_name: PodNaming,
}

impl Default for MembershipSettings {
    fn default() -> Self {
        Self {
            admin_cluster: "envoy_admin".into(),
            admin_authority: "envoy-admin".into(),
            refresh_ms: 500,
            pod_name: PodNaming::Address,
        }
    }
}
