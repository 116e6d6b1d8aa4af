//! The filter's root context (one per worker VM): parses the plugin
//! configuration, defines the stats and hands every HTTP stream a filter
//! context sharing one [`FilterShared`].

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use super::filter::PrefixFilter;
use super::metrics::Metrics;
use super::{now_nanos, now_secs};
use crate::handoff::{self, Touched};
use crate::liveness::{self, Heartbeat};
use crate::request::PromptRequest;
use crate::rng::SplitMix64;
use crate::router::{Recording, RouteError, Routed, Router};
use crate::store::SharedStore;

/// State shared by every stream of one worker VM.
pub struct FilterShared {
    pub router: Router,
    pub metrics: Metrics,
    rng: RefCell<SplitMix64>,
    /// The singleton's hand-off queue: Some once resolved, and when and
    /// whether it was last looked for (retried at most once a second so a
    /// deployment without the singleton pays no hostcall per request).
    queue: RefCell<QueueState>,
    vm_id: String,
}

impl FilterShared {
    /// Routes one request (writing the table inline), records stats and,
    /// with sync on, hands the recorded blocks to the sync singleton.
    pub fn route<S: SharedStore>(
        &self,
        store: &S,
        req: &PromptRequest,
    ) -> Result<Routed, RouteError> {
        let now = now_secs();
        // Tables are written inline, under CAS, on the request path: a
        // deferred single writer let a burst of requests with one new prefix
        // split across pods before the first write landed (measured: 11 of 40
        // bursts of 8). The singleton only needs the blocks to push them.
        let queue = if self.router.settings().sync.enabled {
            self.queue(now)
        } else {
            None
        };
        let routed = self.router.route_with(
            store,
            req,
            now,
            &mut self.rng.borrow_mut(),
            Recording::Inline,
        );
        if let Ok(r) = &routed {
            let m = &self.metrics;
            m.routed(r.choice.reason);
            m.add(
                m.cas_retries,
                u64::from(r.write.cas_retries + r.load_retries),
            );
            m.add(m.cas_exhausted, u64::from(r.write.failed_buckets));
            m.add(m.table_evictions, u64::from(r.write.evictions));
            m.add(m.slots_used, u64::from(r.write.new_slots));
            m.inflight(r.choice.pod, r.inflight);
            if let (Some(model), false) = (r.model, r.recorded.is_empty()) {
                let touched = Touched {
                    model,
                    pod: r.choice.pod,
                    time: now,
                    blocks: r.recorded.clone(),
                };
                self.hand_off(queue, &touched);
            }
        }
        routed
    }

    /// A pod for a request the filter does not route (pass-through), chosen
    /// at random from the default pool (else from all endpoints). Only the
    /// ORIGINAL_DST header gets it: that cluster type has no fallback of its
    /// own, while `override_host` falls back to round robin without a header.
    pub fn fallback_endpoint(&self) -> Option<&str> {
        let s = self.router.settings();
        let n = if s.default_pool.is_empty() {
            s.all_endpoints.len()
        } else {
            s.default_pool.len()
        };
        let i = self.rng.borrow_mut().below(n);
        match s.default_pool.get(i) {
            Some(pod) => s.endpoint_name(*pod),
            None => s.all_endpoints.get(i).map(String::as_str),
        }
    }

    /// The hand-off queue, if the singleton registered it.
    fn queue(&self, now: u32) -> Option<u32> {
        let mut q = self.queue.borrow_mut();
        if q.id.is_none() && q.looked_at != Some(now) {
            q.looked_at = Some(now);
            q.id = hostcalls::resolve_shared_queue(&self.vm_id, handoff::QUEUE_NAME)
                .ok()
                .flatten();
        }
        q.id
    }

    /// Hands recorded blocks to the sync singleton (sync only).
    fn hand_off(&self, queue: Option<u32>, touched: &Touched) {
        if !self.router.settings().sync.enabled {
            return;
        }
        let sent = queue
            .map(|q| hostcalls::enqueue_shared_queue(q, Some(&handoff::encode(touched))).is_ok())
            .unwrap_or(false);
        if !sent {
            // No singleton (yet): written to the table, but nothing will push
            // it. Counted so an operator sees a missing singleton.
            self.queue.borrow_mut().id = None;
            self.metrics.inc(self.metrics.dirty_dropped);
        }
    }
}

/// Where the hand-off queue stands for one worker VM.
#[derive(Default)]
struct QueueState {
    id: Option<u32>,
    looked_at: Option<u32>,
}

/// How often a worker turns the singleton's heartbeat into gauges.
const LIVENESS_TICK: Duration = Duration::from_secs(1);

/// Root context of the HTTP filter.
#[derive(Default)]
pub struct FilterRoot {
    shared: Option<Rc<FilterShared>>,
    /// Whether this VM logged the singleton as dead (once per outage).
    singleton_dead_logged: bool,
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
        if settings.sync.enabled {
            if let Err(status) = hostcalls::set_tick_period(LIVENESS_TICK) {
                log::warn!("prefix_router: no tick ({status:?}): sync liveness gauges stay unset");
            }
        }
        // Per-VM seed: the clock plus this context's address (std::process::id panics on WASI).
        let seed = now_nanos() ^ (self as *const Self as u64).rotate_left(32);
        self.shared = Some(Rc::new(FilterShared {
            metrics: Metrics::define(&settings),
            router: Router::new(settings),
            rng: RefCell::new(SplitMix64::new(seed)),
            queue: RefCell::new(QueueState::default()),
            vm_id,
        }));
        true
    }

    fn on_tick(&mut self) {
        self.report_liveness();
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
