//! Plugin configuration: the JSON given to the filter in Envoy's
//! `plugin_config.configuration`, parsed with serde into typed settings.
//!
//! Unknown fields and invalid values are refused with a [`ConfigError`] that
//! names the field, so `on_configure` can log it and return false (Envoy then
//! refuses the config instead of running with a surprise).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::fleet::membership::PodNaming;
use crate::fleet::DEFAULT_POOL;
use crate::route::policy::{LoadAwareConfig, PolicyMode};
use crate::shared::registry::{MAX_MODEL_POOLS, MAX_NAME, MAX_SLOTS, SEEN_EVERY_SECS};
use crate::sync::SyncSettings;

mod fields;
pub(crate) mod mismatch;
mod sections;
use fields::{bad_field, given_fields};
pub(crate) use sections::{
    HoldSettings, InspectSettings, MembershipSettings, PolicySettings, SignalSettings,
};

/// Raw configuration as written by the operator; every field has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawConfig {
    pub(crate) compat: Compat,
    pub(crate) endpoints: Vec<String>,
    pub(crate) model_endpoints: BTreeMap<String, Vec<String>>,
    pub(crate) cluster: String,
    pub(crate) model_clusters: BTreeMap<String, String>,
    pub(crate) membership: MembershipSettings,
    pub(crate) passive_cooldown_ms: u32,
    pub(crate) block_size: usize,
    pub(crate) hash_seed: u64,
    pub(crate) table_capacity_blocks: u32,
    pub(crate) table_idle_expiry_secs: u32,
    pub(crate) dense_prefix_blocks: u32,
    pub(crate) imbalance_abs_count: u32,
    pub(crate) stddev_factor: f64,
    pub(crate) match_header: String,
    pub(crate) original_dst_header: bool,
    pub(crate) max_body_bytes: usize,
    pub(crate) policy: PolicySettings,
    pub(crate) signals: SignalSettings,
    pub(crate) hold: HoldSettings,
    pub(crate) inspect: InspectSettings,
    pub(crate) sync: SyncSettings,
}

impl Default for RawConfig {
    fn default() -> Self {
        Self {
            compat: Compat::None,
            endpoints: Vec::new(),
            model_endpoints: BTreeMap::new(),
            cluster: String::new(),
            model_clusters: BTreeMap::new(),
            membership: MembershipSettings::default(),
            passive_cooldown_ms: 3_000,
            block_size: 128,
            hash_seed: 0,
            table_capacity_blocks: 200_000,
            table_idle_expiry_secs: 20 * 60,
            dense_prefix_blocks: 32,
            imbalance_abs_count: 16,
            stddev_factor: 2.0,
            match_header: String::new(),
            original_dst_header: false,
            // Envoy answers 413 to a buffered body above its buffer limit
            // (1 MiB by default), where plain Envoy would stream it: stay a
            // frame's worth below that unless the operator raises both.
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            policy: PolicySettings::default(),
            signals: SignalSettings::default(),
            hold: HoldSettings::default(),
            inspect: InspectSettings::default(),
            sync: SyncSettings::default(),
        }
    }
}

/// Interoperation with another gateway sharing the Redis namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Compat {
    /// This filter's own prompt layout and sync (change log, sampled blocks).
    #[default]
    None,
    /// A fleet mixed with AIBrix's Go gateways: prompts rendered as AIBrix
    /// renders them, every block of the first `dense_prefix_blocks` recorded
    /// (AIBrix's lookup stops at the first missing block), pods named by EDS
    /// hostname (the Kubernetes pod name), a full scan every cycle (AIBrix
    /// writes no change log), `block_size` 4 unless stated.
    Aibrix,
}

/// Blocks recorded one by one in AIBrix mode unless `dense_prefix_blocks`
/// is stated: 16 KiB of prompt at AIBrix's default 4-byte blocks.
pub const AIBRIX_DENSE_BLOCKS: u32 = 4096;
/// Table records in AIBrix mode unless `table_capacity_blocks` is stated:
/// a prompt records up to 4096 blocks there, so the native default (200,000)
/// holds under 50 prompts and a burst leaves holes that stop AIBrix's
/// in-order walk. 2,000,000 records are 250,000 shared-data keys, ~40 MB (20-byte records).
pub(crate) const AIBRIX_TABLE_CAPACITY: u32 = 2_000_000;
/// AIBrix's default block size (`AIBRIX_PREFIX_CACHE_BLOCK_SIZE`).
pub const AIBRIX_BLOCK_SIZE: usize = 4;

/// Where one pool's members come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolSource {
    /// A fixed `host:port` list (each address is the pod's name).
    Static(Vec<String>),
    /// The hosts of this Envoy upstream cluster, with Envoy's health.
    Cluster(String),
}

/// Why a configuration was refused: the offending field and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid plugin configuration: field `{}`: {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Validated settings. Pools name where their members come from; which
/// pods they are at a given moment is the [`FleetView`](crate::fleet::FleetView)'s
/// job, and pods are named by stable names, never by a position in a list.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Interoperation mode (see [`Compat`]).
    pub(crate) compat: Compat,
    /// Pool key (`""` = default pool, else a model) -> source.
    pub pools: BTreeMap<String, PoolSource>,
    pub(crate) membership: MembershipSettings,
    /// A pod that failed a request is skipped this long (0 = off).
    pub(crate) passive_cooldown_ms: u32,
    pub block_size: usize,
    pub hash_seed: u64,
    pub(crate) table_capacity_blocks: u32,
    pub(crate) table_idle_expiry_secs: u32,
    pub(crate) dense_prefix_blocks: u32,
    pub(crate) imbalance_abs_count: u32,
    pub(crate) stddev_factor: f64,
    pub(crate) match_header: Option<String>,
    /// Also name the pod in `x-envoy-original-dst-host` (for an
    /// `ORIGINAL_DST` cluster with `use_http_header`), and give requests the
    /// filter does not route a random pod there (that cluster has no
    /// fallback of its own). Off: one header call less per request.
    pub(crate) original_dst_header: bool,
    pub(crate) max_body_bytes: usize,
    /// Which policy, with its knobs.
    pub(crate) policy: PolicyMode,
    pub(crate) load_aware: LoadAwareConfig,
    pub(crate) signals: SignalSettings,
    pub(crate) hold: HoldSettings,
    pub(crate) inspect: InspectSettings,
    pub(crate) sync: SyncSettings,
}

/// Most buckets one inspection may read: 4,096 hostcalls and ~5 MB of
/// values at 64 records per bucket, on the worker thread that answers.
const MAX_INSPECT_BUCKETS: u32 = 4096;
/// Longest `inspect.path` and `inspect.filter_chain` accepted.
const MAX_INSPECT_NAME: usize = 256;

fn validate_inspect(i: &InspectSettings) -> Result<(), ConfigError> {
    if i.path.is_empty() {
        if !i.filter_chain.is_empty() {
            return Err(err(
                "inspect.path",
                "must be given with `inspect.filter_chain` (empty: inspection off)",
            ));
        }
    } else {
        let printable = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
        if !i.path.starts_with('/')
            || i.path.len() > MAX_INSPECT_NAME
            || !printable(&i.path)
            || i.path.contains(['?', '#'])
        {
            return Err(err(
                "inspect.path",
                "must start with / and be at most 256 printable bytes without ? or #",
            ));
        }
        if i.filter_chain.is_empty() || i.filter_chain.len() > MAX_INSPECT_NAME {
            return Err(err(
                "inspect.filter_chain",
                "must name the listener filter chain (1 to 256 bytes) the inspection is answered on",
            ));
        }
    }
    if !(1..=MAX_INSPECT_BUCKETS).contains(&i.max_buckets) {
        return Err(err("inspect.max_buckets", "must be in 1..=4096"));
    }
    Ok(())
}

/// Most endpoints one configuration may name (pod slots are `u16` in the
/// table and the in-flight counters live in one shared-data value).
pub(crate) const MAX_ENDPOINTS: usize = MAX_SLOTS;
/// Default `max_body_bytes`: Envoy's default buffer limit (1 MiB) less 64 KiB,
/// so a body the filter passes through is never one Envoy already refused.
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024 - 64 * 1024;
/// Largest block size accepted; blocks are hashed on the request path.
pub(crate) const MAX_BLOCK_SIZE: usize = 1 << 20;

impl Settings {
    /// Parses and validates the plugin configuration. An empty configuration
    /// is refused because a router without endpoints cannot route.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let mut raw: RawConfig =
            serde_json::from_slice(bytes).map_err(|e| err(bad_field(bytes, &e), e.to_string()))?;
        if raw.compat == Compat::Aibrix {
            let given = given_fields(bytes);
            apply_aibrix(&mut raw, &|f: &str| given.iter().any(|g| g == f))?;
            if !given.iter().any(|g| g == "policy.mode") {
                raw.policy.mode = PolicyMode::Aibrix;
            }
        }
        Self::from_raw(raw)
    }

    pub(crate) fn from_raw(mut raw: RawConfig) -> Result<Self, ConfigError> {
        if raw.block_size == 0 || raw.block_size > MAX_BLOCK_SIZE {
            return Err(err(
                "block_size",
                format!("must be in 1..={MAX_BLOCK_SIZE}"),
            ));
        }
        if raw.table_capacity_blocks < 64 || raw.table_capacity_blocks > 50_000_000 {
            return Err(err("table_capacity_blocks", "must be in 64..=50000000"));
        }
        if raw.table_idle_expiry_secs == 0 {
            return Err(err("table_idle_expiry_secs", "must be > 0"));
        }
        if !(raw.stddev_factor.is_finite() && raw.stddev_factor >= 0.0) {
            return Err(err("stddev_factor", "must be a finite number >= 0"));
        }
        if !raw.match_header.is_empty() && !is_header_name(&raw.match_header) {
            return Err(err(
                "match_header",
                "must be a lowercase HTTP header name or empty",
            ));
        }
        if raw.max_body_bytes == 0 {
            return Err(err("max_body_bytes", "must be > 0"));
        }
        let pools = pools_of(&raw)?;
        let m = &raw.membership;
        if !(50..=60_000).contains(&m.refresh_ms) {
            return Err(err("membership.refresh_ms", "must be in 50..=60000"));
        }
        let clustered = pools.values().any(|p| matches!(p, PoolSource::Cluster(_)));
        if clustered && m.admin_cluster.is_empty() {
            return Err(err(
                "membership.admin_cluster",
                "must name the Envoy cluster of the admin listener when a pool is a cluster",
            ));
        }
        let p = &raw.policy;
        if !(p.slack_rel.is_finite() && (0.0..=100.0).contains(&p.slack_rel)) {
            return Err(err("policy.slack_rel", "must be a number in 0..=100"));
        }
        if p.slack_abs > 1_000_000 {
            return Err(err("policy.slack_abs", "must be <= 1000000"));
        }
        let g = &raw.signals;
        if g.enabled {
            if !(50..=60_000).contains(&g.interval_ms) {
                return Err(err("signals.interval_ms", "must be in 50..=60000"));
            }
            if !(10..=60_000).contains(&g.timeout_ms) {
                return Err(err("signals.timeout_ms", "must be in 10..=60000"));
            }
            if !(1024..=16 * 1024 * 1024).contains(&g.max_body_bytes) {
                return Err(err("signals.max_body_bytes", "must be in 1024..=16777216"));
            }
            if !g.path.starts_with('/') {
                return Err(err("signals.path", "must start with /"));
            }
            if g.host_header.is_empty() || !is_header_name(&g.host_header) {
                return Err(err(
                    "signals.host_header",
                    "must be a lowercase HTTP header name",
                ));
            }
            let n = &g.names;
            for (field, list) in [
                ("waiting", &n.waiting),
                ("running", &n.running),
                ("token_latency", &n.token_latency),
            ] {
                if list.len() > 8 || list.iter().any(|name| name.is_empty() || name.len() > 200) {
                    return Err(err(
                        format!("signals.names.{field}"),
                        "at most 8 non-empty names of at most 200 bytes",
                    ));
                }
            }
            if n.waiting.is_empty() || n.running.is_empty() {
                return Err(err(
                    "signals.names",
                    "`waiting` and `running` need at least one name",
                ));
            }
            if g.share && !raw.sync.enabled {
                return Err(err(
                    "signals.share",
                    "shares scrapes through Redis: needs `sync.enabled`",
                ));
            }
            if g.share && raw.sync.cluster {
                return Err(err(
                    "signals.share",
                    "not supported with `sync.cluster` (Redis Cluster) yet",
                ));
            }
            let static_pools = pools.values().any(|p| matches!(p, PoolSource::Static(_)));
            if g.cluster.is_empty() && static_pools {
                return Err(err(
                    "signals.cluster",
                    "must name the cluster to scrape through when a pool is a static `endpoints` list",
                ));
            }
        }
        if !(1..=60_000).contains(&raw.hold.max_ms) {
            return Err(err("hold.max_ms", "must be in 1..=60000"));
        }
        if !(1..=4096).contains(&raw.hold.max_waiting) {
            return Err(err("hold.max_waiting", "must be in 1..=4096"));
        }
        validate_inspect(&raw.inspect)?;
        raw.sync
            .validate()
            .map_err(|e| err(format!("sync.{}", e.field), e.reason))?;
        // Placement applies to a synced load-aware fleet; unset, it follows
        // that (on where it applies, off elsewhere), and only an explicit
        // `true` elsewhere is refused.
        let placement_applies = raw.sync.enabled && raw.policy.mode == PolicyMode::LoadAware;
        match raw.sync.place_new {
            Some(true) if !placement_applies => {
                return Err(err(
                    "sync.place_new",
                    "needs `sync.enabled` and `policy.mode: load_aware` (AIBrix's policy keeps its own rules)",
                ));
            }
            None => raw.sync.place_new = Some(placement_applies),
            Some(_) => {}
        }
        Ok(Self {
            compat: raw.compat,
            block_size: raw.block_size,
            hash_seed: raw.hash_seed,
            table_capacity_blocks: raw.table_capacity_blocks,
            table_idle_expiry_secs: raw.table_idle_expiry_secs,
            dense_prefix_blocks: raw.dense_prefix_blocks,
            imbalance_abs_count: raw.imbalance_abs_count,
            stddev_factor: raw.stddev_factor,
            match_header: (!raw.match_header.is_empty()).then_some(raw.match_header),
            original_dst_header: raw.original_dst_header,
            max_body_bytes: raw.max_body_bytes,
            policy: raw.policy.mode,
            load_aware: LoadAwareConfig {
                slack_abs: raw.policy.slack_abs,
                slack_rel: raw.policy.slack_rel,
                queue_cost_blocks: raw.policy.queue_cost_blocks,
            },
            signals: raw.signals,
            hold: raw.hold,
            inspect: raw.inspect,
            sync: raw.sync,
            pools,
            membership: raw.membership,
            passive_cooldown_ms: raw.passive_cooldown_ms,
        })
    }

    /// How prompts become hashed bytes in this mode.
    pub(crate) fn render(&self) -> crate::route::request::Render {
        match self.compat {
            Compat::None => crate::route::request::Render::Native,
            Compat::Aibrix => crate::route::request::Render::Aibrix,
        }
    }

    /// How the prefix table spreads records over buckets: per block where
    /// AIBrix gateways write the namespace (they know only block hashes),
    /// by segment otherwise.
    pub(crate) fn table_layout(&self) -> crate::route::table::Layout {
        match self.compat {
            Compat::None => crate::route::table::Layout::Segments,
            Compat::Aibrix => crate::route::table::Layout::PerBlock,
        }
    }

    /// The table's sizing for these settings.
    pub fn table_config(&self) -> crate::route::table::TableConfig {
        crate::route::table::TableConfig::new(
            self.table_capacity_blocks,
            self.table_idle_expiry_secs,
            self.table_layout(),
        )
    }

    /// The pool serving `model`: its own if it has one, else the default.
    pub(crate) fn pool_key<'a>(&self, model: &'a str) -> &'a str {
        if !model.is_empty() && self.pools.contains_key(model) {
            model
        } else {
            DEFAULT_POOL
        }
    }

    /// The static pools (`host:port` lists), by pool key.
    pub fn static_pools(&self) -> BTreeMap<String, Vec<String>> {
        self.pools
            .iter()
            .filter_map(|(k, p)| match p {
                PoolSource::Static(list) => Some((k.clone(), list.clone())),
                PoolSource::Cluster(_) => None,
            })
            .collect()
    }

    /// The cluster pools: pool key -> Envoy cluster name.
    pub fn cluster_pools(&self) -> BTreeMap<String, String> {
        self.pools
            .iter()
            .filter_map(|(k, p)| match p {
                PoolSource::Cluster(c) => Some((k.clone(), c.clone())),
                PoolSource::Static(_) => None,
            })
            .collect()
    }

    /// How long a pod must have been gone before its registry slot may name
    /// another pod: past every record that could still name it (idle
    /// expiry, the Redis TTL of synced facts) plus the registry's coarse
    /// `last_seen`.
    pub fn retire_secs(&self) -> u32 {
        let ttl = if self.sync.enabled {
            u32::try_from(self.sync.effective_ttl_secs()).unwrap_or(u32::MAX)
        } else {
            0
        };
        self.table_idle_expiry_secs
            .max(ttl)
            .saturating_add(2 * SEEN_EVERY_SECS)
    }
}

/// AIBrix mode: its defaults where the operator stated nothing, and a refusal
/// naming the field where a stated value cannot interoperate.
fn apply_aibrix(raw: &mut RawConfig, given: &dyn Fn(&str) -> bool) -> Result<(), ConfigError> {
    const WHY: &str = "with `compat: aibrix`";
    if !given("block_size") {
        raw.block_size = AIBRIX_BLOCK_SIZE;
    }
    if !given("dense_prefix_blocks") {
        raw.dense_prefix_blocks = AIBRIX_DENSE_BLOCKS;
    }
    if !given("table_capacity_blocks") {
        raw.table_capacity_blocks = AIBRIX_TABLE_CAPACITY;
    }
    if raw.sync.full_scan_every > 1 && given("sync.full_scan_every") {
        return Err(err(
            "sync.full_scan_every",
            format!(
                "must be 0 or 1 {WHY}: AIBrix gateways write no change log, every pull must scan"
            ),
        ));
    }
    raw.sync.full_scan_every = 1;
    if raw.sync.hash_tags > 1 {
        return Err(err(
            "sync.hash_tags",
            format!("must be 1 {WHY}: AIBrix gateways read and write one hash tag per namespace"),
        ));
    }
    if given("membership.pod_name") && raw.membership.pod_name != PodNaming::Hostname {
        return Err(err(
            "membership.pod_name",
            format!("must be `hostname` {WHY}: AIBrix names pods by their Kubernetes pod name"),
        ));
    }
    raw.membership.pod_name = PodNaming::Hostname;
    if !raw.endpoints.is_empty() || !raw.model_endpoints.is_empty() {
        let field = if raw.endpoints.is_empty() {
            "model_endpoints"
        } else {
            "endpoints"
        };
        return Err(err(
            field,
            format!("static `host:port` pools cannot be used {WHY}: AIBrix names pods by their Kubernetes pod name; use `cluster` (EDS endpoints with `hostname`)"),
        ));
    }
    Ok(())
}

/// Each pool's source; a pool names either a list or a cluster, never both,
/// and at least one pool exists.
fn pools_of(raw: &RawConfig) -> Result<BTreeMap<String, PoolSource>, ConfigError> {
    let mut pools = BTreeMap::new();
    match (raw.endpoints.is_empty(), raw.cluster.is_empty()) {
        (false, false) => {
            return Err(err(
                "cluster",
                "name either `endpoints` or `cluster` for the default pool, not both",
            ))
        }
        (false, true) => {
            pools.insert(
                DEFAULT_POOL.to_string(),
                static_pool("endpoints", &raw.endpoints)?,
            );
        }
        (true, false) => {
            pools.insert(
                DEFAULT_POOL.to_string(),
                PoolSource::Cluster(raw.cluster.clone()),
            );
        }
        (true, true) => {}
    }
    // Every configured model must find a slot in the model registry.
    let models = raw.model_endpoints.len() + raw.model_clusters.len();
    if models > MAX_MODEL_POOLS {
        let field = if raw.model_clusters.is_empty() {
            "model_endpoints"
        } else {
            "model_clusters"
        };
        return Err(err(
            field,
            format!(
                "{models} per-model pools (model_endpoints and model_clusters); at most {MAX_MODEL_POOLS}"
            ),
        ));
    }
    for model in raw.model_endpoints.keys().chain(raw.model_clusters.keys()) {
        if model.len() > MAX_NAME {
            let field = if raw.model_endpoints.contains_key(model) {
                "model_endpoints"
            } else {
                "model_clusters"
            };
            return Err(err(
                field,
                format!("model name longer than {MAX_NAME} bytes"),
            ));
        }
    }
    for (model, list) in &raw.model_endpoints {
        if model.is_empty() {
            return Err(err("model_endpoints", "model name must not be empty"));
        }
        let field = format!("model_endpoints.{model}");
        if list.is_empty() {
            return Err(err(field, "must list at least one endpoint"));
        }
        if raw.model_clusters.contains_key(model) {
            return Err(err(
                format!("model_clusters.{model}"),
                "model also has `model_endpoints`: name a list or a cluster, not both",
            ));
        }
        pools.insert(model.clone(), static_pool(&field, list)?);
    }
    for (model, cluster) in &raw.model_clusters {
        if model.is_empty() || cluster.is_empty() {
            return Err(err(
                "model_clusters",
                "model and cluster names must not be empty",
            ));
        }
        pools.insert(model.clone(), PoolSource::Cluster(cluster.clone()));
    }
    if pools.is_empty() {
        return Err(err(
            "endpoints",
            "at least one endpoint is required (or name a `cluster`)",
        ));
    }
    let mut all: Vec<&String> = pools
        .values()
        .filter_map(|p| match p {
            PoolSource::Static(l) => Some(l),
            PoolSource::Cluster(_) => None,
        })
        .flatten()
        .collect();
    all.sort();
    all.dedup();
    if all.len() > MAX_ENDPOINTS {
        return Err(err(
            "endpoints",
            format!("at most {MAX_ENDPOINTS} distinct endpoints"),
        ));
    }
    Ok(pools)
}

fn static_pool(field: &str, list: &[String]) -> Result<PoolSource, ConfigError> {
    for ep in list {
        if !is_host_port(ep) {
            return Err(err(field, format!("`{ep}` is not host:port")));
        }
    }
    let mut list = list.to_vec();
    list.sort();
    list.dedup();
    Ok(PoolSource::Static(list))
}

fn is_header_name(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(',')
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests;
