//! Whether this Envoy was put together as documented (docs/install.md), said
//! once in the log and kept in a gauge, so an operator needs neither a
//! debugger nor our source:
//! - which build runs: version and commit at VM start, gauge
//!   `prefix_router.build.<version>.<commit>` = 1;
//! - [`SingletonWatch`]: the filter needs the sync singleton (for sync,
//!   pod signals or cluster membership) and none shares its `vm_id`: gauge
//!   `prefix_router.singleton_missing`;
//! - [`ConfigWatch`]: the singleton was given another plugin configuration
//!   than the filter: gauge `prefix_router.config_mismatch`, naming the
//!   fields.
//!
//! Pure over the host traits; the host's root contexts forward their
//! start, configure and tick here.

use std::collections::BTreeSet;

use crate::config::mismatch::differing_fields;
use crate::config::{PoolSource, Settings};
use crate::shared::metrics::{MetricKind, MetricSink};
use crate::shared::store::{cas_update, SharedStore};
use crate::sync::handoff;

/// Root id that selects the sync singleton; any other root id is the filter.
pub(crate) const SYNC_ROOT_ID: &str = "prefix_router_sync";

/// What the checks ask of Envoy: shared data, stats, and whether a VM of
/// `vm_id` registered a shared queue (one hostcall).
pub(crate) trait DeploymentHost: SharedStore + MetricSink {
    fn queue_registered(&self, vm_id: &str, name: &str) -> bool;
}

/// Cargo's version of this build.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Shared-data key of the filter's plugin configuration as given (raw
/// bytes), written by the worker VMs for the singleton to compare.
const FILTER_CONFIG_KEY: &str = "deploy/filter-config";
/// Shared-data key set by the first worker VM that logs a missing
/// singleton (so one Envoy logs it once, not once per worker).
const MISSING_LOGGED_KEY: &str = "deploy/singleton-missing-logged";

/// Time the singleton gets to register its queue after a worker VM starts
/// (a remote module may still be downloading) before it is called missing.
const SINGLETON_GRACE_MS: u64 = 3_000;
/// How often a missing singleton is looked for again, and the singleton
/// rereads the filter's configuration.
const CHECK_EVERY_MS: u64 = 1_000;

/// The commit `make release` built from (`PREFIX_ROUTER_COMMIT`), else
/// `unknown` (a `cargo build` of a checkout).
fn commit() -> &'static str {
    option_env!("PREFIX_ROUTER_COMMIT").unwrap_or("unknown")
}

/// `s` as one segment of a stat name: `.` (Envoy's separator) and anything
/// unusual become `_`.
fn stat_segment(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Logs which build this VM runs and sets its build gauge (at VM start).
pub(crate) fn announce_build(sink: &impl MetricSink, role: &str) {
    log::info!(
        "prefix_router {VERSION} (commit {}) starting: {role}",
        commit()
    );
    let name = format!(
        "prefix_router.build.{}.{}",
        stat_segment(VERSION),
        stat_segment(commit())
    );
    let id = sink.define_metric(MetricKind::Gauge, &name);
    sink.record_metric(id, 1);
}

/// What in `settings` needs the singleton, in words (empty: nothing).
fn needs_singleton(settings: &Settings) -> Vec<&'static str> {
    let mut needs = Vec::new();
    if settings.sync.enabled {
        needs.push("sync (sync.enabled)");
    }
    if settings.signals.enabled {
        needs.push("pod signals (signals.enabled)");
    }
    if settings
        .pools
        .values()
        .any(|p| matches!(p, PoolSource::Cluster(_)))
    {
        needs.push("cluster membership (cluster / model_clusters)");
    }
    needs
}

/// A worker VM's look-out for the sync singleton: it registers the
/// hand-off queue in its `on_configure`, under the `vm_id` it shares with
/// the filter, so a queue that does not resolve means no singleton of that
/// `vm_id` runs (none configured, another `vm_id`, or another root id).
pub(crate) struct SingletonWatch {
    gauge: u32,
    started_ms: u64,
    last_check_ms: u64,
    found: bool,
    /// Whether this VM saw it missing (so its arrival is logged).
    missing: bool,
}

impl SingletonWatch {
    pub(crate) fn new(sink: &impl MetricSink, now_ms: u64) -> Self {
        Self {
            gauge: sink.define_metric(MetricKind::Gauge, "prefix_router.singleton_missing"),
            started_ms: now_ms,
            last_check_ms: 0,
            found: false,
            missing: false,
        }
    }

    /// Called on the worker's tick; at most two hostcalls a second, none
    /// once the singleton was found or when nothing needs it.
    pub(crate) fn on_tick(
        &mut self,
        host: &impl DeploymentHost,
        settings: &Settings,
        vm_id: impl FnOnce() -> String,
        now_ms: u64,
    ) {
        if self.found || now_ms.saturating_sub(self.last_check_ms) < CHECK_EVERY_MS {
            return;
        }
        self.last_check_ms = now_ms;
        let vm_id = vm_id();
        let vm_id = vm_id.as_str();
        let needs = needs_singleton(settings);
        if needs.is_empty() {
            self.found = true;
            host.record_metric(self.gauge, 0);
            return;
        }
        if host.queue_registered(vm_id, handoff::QUEUE_NAME) {
            self.found = true;
            host.record_metric(self.gauge, 0);
            if self.missing {
                log::info!("prefix_router: the sync singleton is running now (vm_id {vm_id:?})");
            }
            return;
        }
        if now_ms.saturating_sub(self.started_ms) < SINGLETON_GRACE_MS {
            return;
        }
        host.record_metric(self.gauge, 1);
        if self.missing {
            return;
        }
        self.missing = true;
        let first = cas_update(host, MISSING_LOGGED_KEY, 3, |cur| {
            cur.is_none().then(|| b"1".to_vec())
        })
        .is_ok_and(|o| o.written);
        if first {
            log::error!(
                "prefix_router: no sync singleton runs with vm_id {vm_id:?}, and this configuration needs it for {}: \
                 until one does, those features do nothing (with cluster membership every request passes \
                 through as no_endpoints). Fix: add to the bootstrap an envoy.bootstrap.wasm service with \
                 singleton: true, root_id \"{}\", vm_config.vm_id {vm_id:?} and the filter's plugin \
                 configuration (docs/install.md)",
                needs.join(", "),
                SYNC_ROOT_ID,
            );
        }
    }
}

/// Publishes the filter's plugin configuration for the singleton (once per
/// configuration: the worker VMs of one filter write the same bytes).
pub(crate) fn publish_filter_config(store: &impl SharedStore, raw: &[u8]) {
    let _ = cas_update(store, FILTER_CONFIG_KEY, 3, |cur| {
        (cur != Some(raw)).then(|| raw.to_vec())
    });
}

/// The singleton's comparison of its plugin configuration with the
/// filter's (as the worker VMs published it).
pub(crate) struct ConfigWatch {
    gauge: u32,
    own: Vec<u8>,
    last_check_ms: u64,
    /// The cas of the filter's configuration last compared.
    seen_cas: Option<u32>,
    /// Filter configurations already logged (hashes), so each is logged once.
    logged: BTreeSet<u64>,
}

impl ConfigWatch {
    pub(crate) fn new(sink: &impl MetricSink, own: Vec<u8>) -> Self {
        Self {
            gauge: sink.define_metric(MetricKind::Gauge, "prefix_router.config_mismatch"),
            own,
            last_check_ms: 0,
            seen_cas: None,
            logged: BTreeSet::new(),
        }
    }

    /// Called on the singleton's tick; one get a second, a comparison only
    /// when the filter's configuration changed.
    pub(crate) fn on_tick<H: SharedStore + MetricSink>(
        &mut self,
        host: &H,
        vm_id: impl FnOnce() -> String,
        now_ms: u64,
    ) {
        if now_ms.saturating_sub(self.last_check_ms) < CHECK_EVERY_MS {
            return;
        }
        self.last_check_ms = now_ms;
        let Ok((Some(filter), cas)) = host.get(FILTER_CONFIG_KEY) else {
            // No filter configured yet (or none on this vm_id).
            return;
        };
        if cas.is_some() && cas == self.seen_cas {
            return;
        }
        self.seen_cas = cas;
        let fields = if filter == self.own {
            Vec::new()
        } else {
            differing_fields(&filter, &self.own)
        };
        host.record_metric(self.gauge, u64::from(!fields.is_empty()));
        if fields.is_empty() || !self.logged.insert(xxhash_rust::xxh64::xxh64(&filter, 0)) {
            return;
        }
        let vm_id = vm_id();
        log::error!(
            "prefix_router singleton: its plugin configuration differs from the filter's (vm_id {vm_id:?}) in: {}. \
             The singleton syncs, scrapes and publishes by its own copy, so the filter and it disagree on those \
             fields. Fix: give the envoy.bootstrap.wasm service (root_id \"{}\") the filter's configuration",
            fields.join(", "),
            SYNC_ROOT_ID,
        );
    }
}

#[cfg(test)]
mod tests;
