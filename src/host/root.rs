//! The filter's root context (one per worker VM): parses the plugin
//! configuration, builds the VM's [`Worker`] and forwards its tick; hands
//! every HTTP stream a filter context sharing that worker.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use super::envoy::{now_nanos, EnvoyHost};
use super::filter::PrefixFilter;
use crate::deployment::{self, SingletonWatch};
use crate::worker::{Worker, TICK_MS};

/// Root context of the HTTP filter.
pub(crate) struct FilterRoot {
    context_id: u32,
    worker: Option<Rc<Worker>>,
    /// The tick period set last (the worker asks for a faster one while
    /// `hold` may wait for another worker VM's prefill).
    tick_ms: u32,
    /// The plugin configuration as given, until published for the
    /// singleton's comparison on the first tick after each configure.
    unpublished_config: Option<Vec<u8>>,
    /// Looks for the sync singleton this configuration needs.
    singleton: Option<SingletonWatch>,
}

impl FilterRoot {
    pub(crate) fn new(context_id: u32) -> Self {
        Self {
            context_id,
            worker: None,
            tick_ms: TICK_MS,
            unpublished_config: None,
            singleton: None,
        }
    }
}

fn tick(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

impl Context for FilterRoot {
    /// The tick's placement releases (`sync.place_new`).
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(worker) = &self.worker {
            let reply = super::abi::call_reply(num_headers, body_size).ok();
            worker
                .placer
                .on_reply(token, reply.as_deref(), &worker.meter);
        }
    }
}

impl RootContext for FilterRoot {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        deployment::announce_build(&EnvoyHost, "filter worker VM");
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        super::follow_log_level();
        let Some((settings, raw)) = super::load_plugin_config() else {
            return false;
        };
        self.unpublished_config = Some(raw);
        // What needs the singleton may have changed: look again.
        self.singleton = None;
        // A worker's tick: how often it refreshes its fleet view (membership,
        // health and cooldowns published by others) and flushes its stats.
        if let Err(status) = hostcalls::set_tick_period(tick(TICK_MS)) {
            log::error!(
                "prefix_router: no tick ({status:?}): the fleet view will not refresh and stats will not be flushed"
            );
        }
        // Per-VM seed: the clock plus this context's address (std::process::id
        // panics on WASI); the worker mixes in a number unique per VM.
        let seed = now_nanos() ^ (self as *const Self as u64).rotate_left(32);
        let worker = Worker::new(settings, &EnvoyHost, super::vm_id(), seed);
        worker.set_root_context(self.context_id);
        self.worker = Some(Rc::new(worker));
        true
    }

    fn on_tick(&mut self) {
        super::follow_log_level();
        if let Some(raw) = self.unpublished_config.take() {
            deployment::publish_filter_config(&EnvoyHost, &raw);
        }
        if let Some(worker) = &self.worker {
            let now_ms = now_nanos() / 1_000_000;
            self.singleton
                .get_or_insert_with(|| SingletonWatch::new(&EnvoyHost, now_ms))
                .on_tick(&EnvoyHost, worker.settings(), super::vm_id, now_ms);
            worker.on_tick(&EnvoyHost);
            let want = worker.tick_ms();
            if want != self.tick_ms && hostcalls::set_tick_period(tick(want)).is_ok() {
                self.tick_ms = want;
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Without a valid configuration Envoy does not start the listener, but
        // stay defensive: no context means the stream passes untouched.
        let worker = self.worker.clone()?;
        Some(Box::new(PrefixFilter::new(worker, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
