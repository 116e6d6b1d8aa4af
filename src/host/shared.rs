//! State shared by every stream of one worker VM: the router, the metrics,
//! and what a request needs from the VM (the hand-off queue to the sync
//! singleton, the fleet view's refresh, the passive health check).

use std::cell::RefCell;

use proxy_wasm::hostcalls;

use super::abi;
use super::metrics::Metrics;
use super::store::HostStore;
use super::{now_nanos, now_secs};
use crate::config::Settings;
use crate::handoff::{self, Touched};
use crate::request::PromptRequest;
use crate::rng::SplitMix64;
use crate::router::{RouteError, Routed, Router};
use crate::store::SharedStore;

/// Ticks between rebuilds of static pools (they change only with the
/// config; this keeps their registry names marked in use).
const STATIC_REFRESH_TICKS: u64 = 40;

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
    /// CAS of the published members last applied (cluster pools).
    members_cas: RefCell<Option<u32>>,
}

impl FilterShared {
    pub fn new(settings: Settings, vm_id: String, seed: u64) -> Self {
        Self {
            metrics: Metrics::define(&settings),
            router: Router::new(settings),
            rng: RefCell::new(SplitMix64::new(seed)),
            queue: RefCell::new(QueueState::default()),
            vm_id,
            members_cas: RefCell::new(None),
        }
    }

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
        let routed = self
            .router
            .route(store, req, now, &mut self.rng.borrow_mut());
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
            if let Some(address) = self.router.fleet().address(r.choice.pod) {
                m.inflight(address, r.inflight);
            }
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
    /// at random among the default pool's routable members. Only the
    /// ORIGINAL_DST header gets it: that cluster type has no fallback of its
    /// own, while `override_host` falls back to round robin without a header.
    pub fn fallback_endpoint(&self) -> Option<String> {
        let fleet = self.router.fleet();
        let pool = fleet.routable(crate::fleet::DEFAULT_POOL, now_nanos() / 1_000_000);
        let i = self.rng.borrow_mut().below(pool.len());
        pool.get(i)
            .and_then(|slot| fleet.address(*slot))
            .map(str::to_string)
    }

    /// After a request ends: if the pod it was sent to failed it (Envoy sent
    /// it elsewhere on retry or could not reach it, or it answered 502/503),
    /// every VM skips that pod for `passive_cooldown_ms`. It comes back by
    /// itself when the cooldown ends.
    pub fn observe_outcome(&self, pod: u16, chosen: &str) {
        let cooldown = u64::from(self.router.settings().passive_cooldown_ms);
        if cooldown == 0 {
            return;
        }
        let upstream = abi::property(&["upstream", "address"]).ok().flatten();
        let failed = match upstream.as_deref() {
            Some(addr) if addr != chosen.as_bytes() => true,
            // Envoy gives integer properties as 8 little-endian bytes.
            _ => abi::property(&["response", "code"])
                .ok()
                .flatten()
                .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                .map(i64::from_le_bytes)
                .is_some_and(|code| code == 502 || code == 503),
        };
        if !failed {
            return;
        }
        let now = now_nanos() / 1_000_000;
        match crate::fleet::mark_down(&HostStore, pod, now + cooldown, now) {
            Ok(down) => {
                self.router.set_down(down);
                self.metrics.inc(self.metrics.passive_cooldowns);
                log::info!(
                    "prefix_router: pod {chosen} failed a request; skipped for {cooldown} ms"
                );
            }
            Err(e) => log::warn!("prefix_router: passive cooldown of {chosen} not shared: {e}"),
        }
    }

    /// The worker's periodic refresh of its fleet view: static pools from
    /// the config (registering their names), cluster pools as the singleton
    /// published them, and every VM's cooldowns.
    pub(super) fn refresh_fleet(&self, tick: u64) {
        let now = now_secs();
        if self.router.all_static() {
            if tick % STATIC_REFRESH_TICKS == 0 {
                if let Err(e) = self.router.refresh_static(&HostStore, now) {
                    log::warn!("prefix_router: pod registry: {e}");
                }
            }
        } else if let Ok((Some(bytes), cas)) = hostcalls::get_shared_data(crate::fleet::MEMBERS_KEY)
        {
            let mut seen = self.members_cas.borrow_mut();
            if *seen != cas {
                if let Some(members) = crate::fleet::Members::decode(&bytes) {
                    self.router.set_members(members);
                    *seen = cas;
                }
            }
        }
        if self.router.settings().passive_cooldown_ms > 0 {
            if let Ok((v, _)) = hostcalls::get_shared_data(crate::fleet::DOWN_KEY) {
                self.router
                    .set_down(crate::fleet::decode_down(v.as_deref().unwrap_or(&[])));
            }
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
