//! The filter's root context (one per worker VM): parses the plugin
//! configuration, defines the stats, refreshes the fleet view and reports
//! sync liveness on its tick, and hands every HTTP stream a filter context
//! sharing one [`FilterShared`].

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use super::filter::PrefixFilter;
use super::now_nanos;
use super::shared::FilterShared;
use crate::liveness::{self, Heartbeat};

/// A worker's tick: how often it refreshes its fleet view (membership,
/// health and cooldowns published by others).
const TICK: Duration = Duration::from_millis(250);
/// Ticks between liveness reports (one a second).
const LIVENESS_TICKS: u64 = 4;

/// Root context of the HTTP filter.
#[derive(Default)]
pub struct FilterRoot {
    shared: Option<Rc<FilterShared>>,
    /// Whether this VM logged the singleton as dead (once per outage).
    singleton_dead_logged: bool,
    ticks: u64,
}

impl Context for FilterRoot {}

impl FilterRoot {
    /// Records the sync liveness gauges from the singleton's heartbeat; they
    /// keep moving when the singleton is dead, which its own stats cannot.
    fn report_liveness(&mut self) {
        let Some(shared) = self.shared.as_ref() else {
            return;
        };
        let now = now_nanos() / 1_000_000;
        let beat = hostcalls::get_shared_data(liveness::KEY)
            .ok()
            .and_then(|(v, _)| Heartbeat::decode(&v?))
            .unwrap_or_default();
        let m = &shared.metrics;
        if beat.started_ms == 0 {
            // The singleton never started: nothing to report yet.
            return;
        }
        m.record(m.sync_success_age_s, beat.success_age_s(now));
        m.record(m.sync_singleton_age_s, beat.tick_age_s(now));
        let dead = beat.singleton_dead(now);
        if dead && !self.singleton_dead_logged {
            log::error!(
                "prefix_router: the sync singleton has not run for {} s (its VM may have died); sync is stopped, routing goes on",
                beat.tick_age_s(now)
            );
        }
        self.singleton_dead_logged = dead;
    }
}

impl RootContext for FilterRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let Some(settings) = super::load_settings() else {
            return false;
        };
        let vm_id = super::vm_id();
        if let Err(status) = hostcalls::set_tick_period(TICK) {
            log::error!("prefix_router: no tick ({status:?}): the fleet view will not refresh");
        }
        // Per-VM seed: the clock plus this context's address (std::process::id panics on WASI).
        let seed = now_nanos() ^ (self as *const Self as u64).rotate_left(32);
        self.shared = Some(Rc::new(FilterShared::new(settings, vm_id, seed)));
        true
    }

    fn on_tick(&mut self) {
        let tick = self.ticks;
        self.ticks = self.ticks.wrapping_add(1);
        if let Some(shared) = self.shared.as_ref() {
            shared.refresh_fleet(tick);
        }
        if tick % LIVENESS_TICKS == 0
            && self
                .shared
                .as_ref()
                .is_some_and(|s| s.router.settings().sync.enabled)
        {
            self.report_liveness();
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Without a valid configuration Envoy does not start the listener, but
        // stay defensive: no context means the stream passes untouched.
        let shared = self.shared.clone()?;
        Some(Box::new(PrefixFilter::new(shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
