//! The filter's Envoy stats, defined once per VM with `define_metric`. Envoy
//! keys stats by name, so every worker VM increments the same counters.
//! Stat writes are best effort: a failing stat must never fail a request.

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use crate::config::Settings;
use crate::policy::Reason;
use crate::request::PassReason;

/// Metric ids of one VM.
pub struct Metrics {
    pub requests: u32,
    routed_prefix: u32,
    routed_no_match: u32,
    routed_load_guard: u32,
    passthrough: [u32; PassReason::ALL.len()],
    pub cas_retries: u32,
    pub cas_exhausted: u32,
    pub slots_used: u32,
    pub route_time_us: u32,
    pub table_evictions: u32,
    pub dirty_dropped: u32,
    /// Liveness of the sync singleton, recorded by the workers (see
    /// [`crate::liveness`]); defined only with sync on.
    pub sync_success_age_s: u32,
    pub sync_singleton_age_s: u32,
    pub passive_cooldowns: u32,
    /// In-flight gauge per pod address, defined when first routed to.
    inflight: RefCell<HashMap<String, u32>>,
}

fn define(kind: MetricType, name: &str) -> u32 {
    // 0 is never a valid id from Envoy; writes to it fail and are ignored.
    hostcalls::define_metric(kind, name).unwrap_or(0)
}

impl Metrics {
    pub fn define(settings: &Settings) -> Self {
        let c = |n: &str| define(MetricType::Counter, &format!("prefix_router.{n}"));
        let sync = settings.sync.enabled;
        let g = |n: &str| {
            if sync {
                define(MetricType::Gauge, &format!("prefix_router.{n}"))
            } else {
                0
            }
        };
        let mut passthrough = [0; PassReason::ALL.len()];
        for (slot, reason) in passthrough.iter_mut().zip(PassReason::ALL) {
            *slot = c(&format!("passthrough.{}", reason.as_str()));
        }
        Self {
            requests: c("requests_total"),
            routed_prefix: c("routed.prefix_match"),
            routed_no_match: c("routed.no_match"),
            routed_load_guard: c("routed.load_guard"),
            passthrough,
            cas_retries: c("table.cas_retries"),
            cas_exhausted: c("table.cas_exhausted"),
            table_evictions: c("table.evictions"),
            dirty_dropped: c("sync.handoff_dropped"),
            slots_used: define(MetricType::Gauge, "prefix_router.table.slots_used"),
            sync_success_age_s: g("sync.last_success_age_s"),
            sync_singleton_age_s: g("sync.singleton_age_s"),
            route_time_us: define(MetricType::Histogram, "prefix_router.route_time_us"),
            passive_cooldowns: c("fleet.passive_cooldowns"),
            inflight: RefCell::new(HashMap::new()),
        }
    }

    pub fn add(&self, id: u32, n: u64) {
        if n > 0 {
            let _ = hostcalls::increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn inc(&self, id: u32) {
        self.add(id, 1);
    }

    pub fn record(&self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }

    pub fn routed(&self, reason: Reason) {
        self.inc(match reason {
            Reason::PrefixMatch => self.routed_prefix,
            Reason::NoMatch => self.routed_no_match,
            Reason::LoadGuard => self.routed_load_guard,
        });
    }

    pub fn passthrough(&self, reason: PassReason) {
        if let Some(i) = PassReason::ALL.iter().position(|r| *r == reason) {
            self.inc(self.passthrough[i]);
        }
    }

    /// Publishes a pod's in-flight count (the shared-data value is the
    /// truth) under its address, `prefix_router.inflight.<host>_<port>`.
    pub fn inflight(&self, address: &str, value: u32) {
        let mut ids = self.inflight.borrow_mut();
        if !ids.contains_key(address) {
            let id = define(
                MetricType::Gauge,
                &format!("prefix_router.inflight.{}", stat_safe(address)),
            );
            ids.insert(address.to_string(), id);
        }
        let id = ids.get(address).copied().unwrap_or(0);
        drop(ids);
        self.record(id, u64::from(value));
    }
}

/// Stat names split on `.`; endpoint names become one segment.
fn stat_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
