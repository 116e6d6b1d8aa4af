//! What a comparison is made of and what it produced: the workloads, each
//! router's result on one workload, and all routers' on one workload. Below
//! everything else of `compare` (and of the league, which reads them).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::metrics::Stats;
use crate::outage::OutageFacts;
use crate::procstat::Load;
use crate::runner::Outcome;
use crate::scenario::Router;

/// The workloads of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    SharedPrefix,
    Concurrency1,
    Chat,
    NoSharing,
    LiveFleet,
    HighLoad,
    CachePressure,
    HeteroFleet,
    Tenants,
    TenantsBurst,
    SessionsBurst,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 11] = [
        WorkloadKind::SharedPrefix,
        WorkloadKind::Concurrency1,
        WorkloadKind::Chat,
        WorkloadKind::NoSharing,
        WorkloadKind::LiveFleet,
        WorkloadKind::HighLoad,
        WorkloadKind::CachePressure,
        WorkloadKind::HeteroFleet,
        WorkloadKind::Tenants,
        WorkloadKind::TenantsBurst,
        WorkloadKind::SessionsBurst,
    ];

    pub fn key(self) -> &'static str {
        match self {
            WorkloadKind::SharedPrefix => "shared-prefix",
            WorkloadKind::Concurrency1 => "concurrency-1",
            WorkloadKind::Chat => "chat",
            WorkloadKind::NoSharing => "no-sharing",
            WorkloadKind::LiveFleet => "live-fleet",
            WorkloadKind::HighLoad => "high-load",
            WorkloadKind::CachePressure => "cache-pressure",
            WorkloadKind::HeteroFleet => "hetero-fleet",
            WorkloadKind::Tenants => "tenants",
            WorkloadKind::TenantsBurst => "tenants-burst",
            WorkloadKind::SessionsBurst => "sessions-burst",
        }
    }
}

/// Parses a comma-separated workload list; `all` = every workload.
pub fn parse_workloads(s: &str) -> Result<Vec<WorkloadKind>, String> {
    if s == "all" {
        return Ok(WorkloadKind::ALL.to_vec());
    }
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            WorkloadKind::ALL
                .into_iter()
                .find(|w| w.key() == p.trim())
                .ok_or_else(|| {
                    format!(
                        "unknown workload {p:?}; one of: all, shared-prefix, concurrency-1, chat, no-sharing, live-fleet, high-load, cache-pressure, hetero-fleet, tenants, tenants-burst, sessions-burst"
                    )
                })
        })
        .collect()
}

/// The filter's routing and sync counters, summed over replicas.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FilterCounters {
    pub prefix_match: i64,
    pub no_match: i64,
    pub load_guard: i64,
    /// Hot prefixes copied to another pod (`routed.spread`).
    pub spread: i64,
    /// New prompts placed through Redis (`routed.placed`), and placements
    /// that failed and took the replica's own pick (`place.failed`).
    pub placed: i64,
    pub place_failed: i64,
    pub passthrough: i64,
    pub sync_applied: i64,
    pub sync_poll_applied: i64,
    pub sync_cycles_failed: i64,
    pub cas_exhausted: i64,
    /// Pods taken out after a failed request (`fleet.passive_cooldowns`).
    pub passive_cooldowns: i64,
    /// `passthrough` by reason (`no_endpoints`, ...), the non-zero ones.
    pub passthrough_reasons: BTreeMap<String, i64>,
    /// Requests held for a prefix in prefill (`hold.held`), those of them
    /// held for a family claim's prefill on another replica
    /// (`hold.held_claim`), and those resumed at `hold.max_ms`
    /// (`hold.timed_out`).
    pub held: i64,
    pub held_claim: i64,
    pub hold_timed_out: i64,
}

/// One router on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub router: Router,
    pub description: String,
    /// Why it did not run (e.g. peers not installed).
    pub skipped: Option<String>,
    pub stats: Option<Stats>,
    pub filter: Option<FilterCounters>,
    /// The pods' own counters after the run: prefix-cache hit and query
    /// tokens, evicted blocks.
    pub pod_hit_tokens: f64,
    pub pod_query_tokens: f64,
    pub pod_evicted_blocks: f64,
    pub load: Option<Load>,
    pub wall_s: f64,
    /// live-fleet: what the run shows about the pod that left and returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<OutageFacts>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<Outcome>,
}

impl RunResult {
    /// `router` on a workload, `description` saying how it ran; nothing
    /// measured yet.
    pub fn new(router: Router, description: String) -> RunResult {
        RunResult {
            router,
            description,
            skipped: None,
            stats: None,
            filter: None,
            pod_hit_tokens: 0.0,
            pod_query_tokens: 0.0,
            pod_evicted_blocks: 0.0,
            load: None,
            wall_s: 0.0,
            live: None,
            outcomes: Vec::new(),
        }
    }
}

/// All routers on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub workload: WorkloadKind,
    pub description: String,
    pub requests: usize,
    pub mean_prompt_tokens: f64,
    pub results: Vec<RunResult>,
}

impl WorkloadResult {
    pub(super) fn get(&self, r: Router) -> Option<&Stats> {
        self.results
            .iter()
            .find(|x| x.router == r)
            .and_then(|x| x.stats.as_ref())
    }
}
