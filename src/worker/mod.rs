//! One worker VM of the filter: what its streams share (the router, the
//! stats, the hand-off queue to the sync singleton) and what it does on its
//! tick (refresh the fleet view, flush stats, report sync liveness), over
//! the [`Host`] trait so that all of it runs and is tested on the host. The
//! `host` module implements [`Host`] over Envoy's hostcalls. `holding`
//! holds its side of `hold`; [`crate::placer`] its side of `sync.place_new`.

use std::cell::{Cell, RefCell};

use crate::config::Settings;
use crate::fleet::{self, Members};
use crate::hostcalls::Host;
use crate::placer::Placer;
use crate::rng::SplitMix64;
use crate::route::hold::{self, Holds, Owner, Remembered, SharedEntry};
use crate::route::load::Ticket;
use crate::route::meter::{Count, Meter};
use crate::route::policy::PolicyMode;
use crate::route::prefill;
use crate::route::request::PromptRequest;
use crate::route::router::{Outcome, Pending, Place, RouteError, Routed, Router};
use crate::shared::registry::PodSlot;
use crate::shared::store::SharedStore;
use crate::sync::handoff::{self, Touched};
use crate::sync::liveness::{self, Heartbeat};

/// The worker's tick (stats flush, fleet view, in-flight exchange, pod
/// signals): every 250 ms.
pub(crate) const TICK_MS: u32 = 250;
/// The tick period while `hold` may wait for another worker VM's prefill:
/// the tick's other work still runs every [`TICK_MS`].
pub(crate) const FAST_TICK_MS: u32 = 20;

/// Ticks between rebuilds of static pools (they change only with the
/// config; this keeps their registry names marked in use).
const STATIC_REFRESH_TICKS: u64 = 40;
/// Ticks between liveness reports (one a second at a 250 ms tick).
const LIVENESS_TICKS: u64 = 4;

mod holding;

/// Key of the VM counter ([`vm_number`]).
const VM_COUNTER_KEY: &str = "vm/next";

/// A number (from 1) that no other VM sharing this store got: a counter in
/// shared data, incremented under CAS. None if the store fails.
pub(crate) fn vm_number<S: SharedStore + ?Sized>(store: &S) -> Option<u64> {
    let mut got = None;
    crate::shared::store::cas_update(store, VM_COUNTER_KEY, 64, |cur| {
        let n = cur
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_le_bytes)
            .wrapping_add(1);
        got = Some(n);
        Some(n.to_le_bytes().to_vec())
    })
    .ok()?;
    got
}

/// An integer stream property (Envoy gives them as 8 little-endian bytes).
fn int_property<H: Host>(host: &H, path: &[&str]) -> Option<i64> {
    host.property(path)
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map(i64::from_le_bytes)
}

/// Whether the pod named `chosen` failed the stream that just ended (see
/// [`Worker::observe_outcome`]).
fn failed_at<H: Host>(host: &H, chosen: &str, check_address: bool) -> bool {
    if int_property(host, &["response", "code"]).is_some_and(|c| c == 502 || c == 503) {
        return true;
    }
    let retried = int_property(host, &["upstream", "request_attempt_count"]).is_some_and(|n| n > 1);
    if !retried && !check_address {
        return false;
    }
    host.property(&["upstream", "address"])
        .is_some_and(|addr| addr != chosen.as_bytes())
}

/// Seconds of a unix-nanos time, as the table keeps them.
pub(crate) fn secs(nanos: u64) -> u32 {
    u32::try_from(nanos / 1_000_000_000).unwrap_or(u32::MAX)
}

/// State shared by every stream of one worker VM.
pub(crate) struct Worker {
    pub(crate) router: Router,
    pub(crate) meter: Meter,
    rng: RefCell<SplitMix64>,
    /// The singleton's hand-off queue: Some once resolved, and when it was
    /// last looked for (retried at most once a second so a deployment
    /// without the singleton pays no hostcall per request).
    queue: Cell<Option<u32>>,
    queue_looked_at: Cell<Option<u32>>,
    vm_id: String,
    /// CAS of the published members last applied (cluster pools).
    members_cas: Cell<Option<u32>>,
    ticks: Cell<u64>,
    /// The clock as of the last tick (unix nanos; 0 before the first).
    tick_nanos: Cell<u64>,
    /// The clock at the last tick that did all of the tick's work.
    full_tick_nanos: Cell<u64>,
    /// Whether this VM logged the singleton as dead (once per outage).
    singleton_dead_logged: Cell<bool>,
    /// Prefixes in prefill and the requests held for them (`hold`).
    holds: RefCell<Holds>,
    /// The root context's id: the tick's hostcalls act on it.
    root_context: Cell<u32>,
    /// Fleet-wide placement of new prompts (`sync.place_new`).
    pub(crate) placer: Placer,
}

/// What [`Worker::hold`] decided for a routed stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldOutcome {
    /// The stream waits for an earlier prefill of its prefix.
    pub(crate) held: bool,
    /// Its own prefill is remembered: others may wait for its answer.
    pub(crate) computing: bool,
}

impl Worker {
    /// `seed` is mixed with a number no other VM of this Envoy got (see
    /// [`vm_number`]): every worker VM is the same module with the same
    /// memory layout, and they may be configured within one clock tick.
    pub(crate) fn new<H: Host>(settings: Settings, host: &H, vm_id: String, seed: u64) -> Self {
        let number = vm_number(host).unwrap_or_else(|| SplitMix64::new(seed).next_u64());
        let mut mix = SplitMix64::new(seed ^ number.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Self {
            meter: Meter::define(&settings, host),
            router: Router::new(settings).with_vm_token(number),
            rng: RefCell::new(SplitMix64::new(mix.next_u64())),
            queue: Cell::new(None),
            queue_looked_at: Cell::new(None),
            vm_id,
            members_cas: Cell::new(None),
            ticks: Cell::new(0),
            tick_nanos: Cell::new(0),
            full_tick_nanos: Cell::new(0),
            singleton_dead_logged: Cell::new(false),
            holds: RefCell::new(Holds::default()),
            root_context: Cell::new(0),
            placer: Placer::new(mix.next_u64()),
        }
    }

    /// Names the root context whose tick this is (see [`Host::resume_request`]).
    pub(crate) fn set_root_context(&self, id: u32) {
        self.root_context.set(id);
    }

    /// The clock as the request path needs it: the last tick's, read from
    /// the host only before the first tick. Saves a hostcall per request.
    /// At most a tick old: the router already works in whole seconds; a
    /// pass-through's fallback pod may see a cooldown end up to a tick
    /// late.
    pub(crate) fn clock_nanos<H: Host>(&self, host: &H) -> u64 {
        match self.tick_nanos.get() {
            0 => host.now_nanos(),
            t => t,
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        self.router.settings()
    }

    /// Routes one request (writing the table inline), counts it and, with
    /// sync on, hands the recorded blocks to the sync singleton. With
    /// [`Place::Ask`], a new prompt comes back as [`Outcome::Ask`] instead,
    /// neither recorded nor counted (see [`Router::route_placed`]).
    pub(crate) fn route_placed<H: Host>(
        &self,
        host: &H,
        req: &PromptRequest,
        now_nanos: u64,
        place: Place,
    ) -> Result<Outcome, RouteError> {
        let routed = self.router.route_placed(
            host,
            req,
            now_nanos / 1_000_000,
            &mut self.rng.borrow_mut(),
            place,
        );
        if let Ok(Outcome::Routed(r)) = &routed {
            self.routed(host, r, now_nanos);
        }
        routed
    }

    /// Finishes a decision that asked Redis for a pod (see
    /// [`Router::resume`]), counted and handed to the singleton as
    /// [`Self::route_placed`]'s.
    pub(crate) fn resume<H: Host>(
        &self,
        host: &H,
        pending: Pending,
        forced: Option<PodSlot>,
        now_nanos: u64,
    ) -> Routed {
        let r = self
            .router
            .resume(host, pending, forced, now_nanos / 1_000_000);
        self.routed(host, &r, now_nanos);
        r
    }

    /// Counts a routed request and, with sync on, hands its recorded blocks
    /// to the sync singleton. Tables are written inline, under CAS, on the
    /// request path: a deferred single writer let a burst of requests with
    /// one new prefix split across pods before the first write landed. The
    /// singleton only needs the blocks to push them.
    fn routed<H: Host>(&self, host: &H, r: &Routed, now_nanos: u64) {
        let m = &self.meter;
        m.inc(Count::Routed(r.choice.reason));
        m.add(Count::CasRetries, u64::from(r.write.cas_retries));
        m.add(Count::CasExhausted, u64::from(r.write.failed_buckets));
        m.add(Count::TableEvictions, u64::from(r.write.evictions));
        m.add(Count::SlotsUsed, u64::from(r.write.new_slots));
        m.add(Count::TableRefused, u64::from(r.write.refused));
        m.add(Count::TableLayoutResets, u64::from(r.write.layout_resets));
        let Some(model) = r.model.filter(|_| !r.recorded.is_empty()) else {
            return;
        };
        if !self.settings().sync.enabled {
            return;
        }
        let now = secs(now_nanos);
        let touched = Touched {
            model,
            pod: r.choice.pod,
            time: now,
            blocks: r.recorded.clone(),
        };
        let queue = self.queue(host, now);
        if !queue.is_some_and(|q| host.enqueue(q, &handoff::encode(&touched))) {
            // No singleton (yet): written to the table, but nothing will
            // push it. Counted so an operator sees a missing singleton.
            self.queue.set(None);
            m.inc(Count::HandoffDropped);
        }
    }

    /// The tick period the root context should run this worker at: fast
    /// while `hold` may wait for another worker VM's prefill (their ends
    /// are seen only by polling), and while this VM times a prefill (an
    /// overdue one reads slow within a fast tick; see
    /// [`crate::route::prefill`]), else [`TICK_MS`].
    pub(crate) fn tick_ms(&self) -> u32 {
        if (self.settings().hold.enabled && self.router.other_vms_live())
            || self.router.prefills_open()
            || self.holds.borrow().waits_on_claim()
            || (self.settings().sync.places_new() && self.placer.busy())
        {
            FAST_TICK_MS
        } else {
            TICK_MS
        }
    }

    /// Releases in-flight request `ticket` ([`Routed::ticket`]): in VM
    /// memory, plus one set while other worker VMs are live (see
    /// [`crate::route::load`]).
    pub(crate) fn release<H: Host>(&self, host: &H, ticket: Ticket, timed_hit: bool) {
        let now_ms = self.clock_nanos(host) / 1_000_000;
        self.router.release(host, ticket, timed_hit, now_ms);
    }

    /// A pod for a request the filter does not route (pass-through), chosen
    /// at random among the default pool's routable members. Only the
    /// ORIGINAL_DST header gets it: that cluster type has no fallback of its
    /// own, while `override_host` falls back to round robin without a header.
    pub(crate) fn fallback_endpoint(&self, now_ms: u64) -> Option<String> {
        let fleet = self.router.fleet();
        let pool = fleet.routable(fleet::DEFAULT_POOL, now_ms);
        let i = self.rng.borrow_mut().below(pool.len());
        pool.get(i)
            .and_then(|slot| fleet.address(*slot))
            .map(str::to_string)
    }

    /// After a request ends: if the pod it was sent to failed it (it
    /// answered 502/503, or Envoy could not reach it, or Envoy retried the
    /// request and another host answered), every VM skips that pod for
    /// `passive_cooldown_ms`. It comes back by itself when the cooldown ends.
    ///
    /// Two integer properties decide (about 3 us each in Envoy 1.40):
    /// `response.code`, then `upstream.request_attempt_count`.
    /// `upstream.address` (about 8 us: Envoy formats it) is read after a
    /// retry, to tell a retry on another host from one on the same host,
    /// and with `check_address` (the caller's sample of requests) also
    /// without one: that finds a pod `override_host` keeps sending
    /// elsewhere because Envoy does not know it (a static list that does
    /// not match the cluster), within a few requests instead of at once.
    pub(crate) fn observe_outcome<H: Host>(
        &self,
        host: &H,
        pod: PodSlot,
        chosen: &str,
        check_address: bool,
    ) {
        let cooldown = u64::from(self.settings().passive_cooldown_ms);
        if cooldown == 0 {
            return;
        }
        if !failed_at(host, chosen, check_address) {
            return;
        }
        let now = host.now_nanos() / 1_000_000;
        match fleet::mark_down(host, pod, now + cooldown, now) {
            Ok(down) => {
                self.router.set_down(down);
                self.meter.inc(Count::PassiveCooldowns);
                log::info!(
                    "prefix_router: pod {chosen} failed a request; skipped for {cooldown} ms"
                );
            }
            Err(e) => log::warn!("prefix_router: passive cooldown of {chosen} not shared: {e}"),
        }
    }

    /// The worker's tick. Every tick: holds past their time go on, this
    /// VM's requests in flight are timed (pod slowness), and, while other
    /// worker VMs are live, the pods their prefill timing reads slow are
    /// exchanged with them (one get; one set when this VM's reading is
    /// new). Every
    /// [`TICK_MS`]: refreshes the fleet view, exchanges in-flight
    /// counts with the other VMs (and sets the in-flight gauges), flushes
    /// the stats; with sync on, reports the singleton's liveness once a
    /// second.
    pub(crate) fn on_tick<H: Host>(&self, host: &H) {
        let now_nanos = host.now_nanos();
        self.tick_nanos.set(now_nanos);
        if self.settings().sync.places_new() {
            self.placer
                .tick(host, &self.settings().sync, now_nanos / 1_000_000);
        }
        self.tick_holds(host, now_nanos / 1_000_000);
        self.router.tick_latency(now_nanos / 1_000_000);
        if self.settings().policy == PolicyMode::LoadAware && self.router.other_vms_live() {
            if let Err(e) = self.router.share_prefill(host, now_nanos / 1_000_000) {
                log::debug!("prefix_router: prefill timing not shared: {e}");
            }
        }
        // At the fast tick, the rest runs every TICK_MS (a few ms early
        // rather than a whole fast tick late).
        let last = self.full_tick_nanos.get();
        let due = u64::from(TICK_MS - FAST_TICK_MS / 2) * 1_000_000;
        if last != 0 && now_nanos.saturating_sub(last) < due && self.tick_ms() == FAST_TICK_MS {
            return;
        }
        self.full_tick_nanos.set(now_nanos);
        let tick = self.ticks.get();
        self.ticks.set(tick.wrapping_add(1));
        self.refresh_fleet(host, tick, secs(now_nanos));
        self.exchange_load(host, now_nanos / 1_000_000);
        if self.settings().signals.enabled {
            self.read_signals(host, now_nanos / 1_000_000);
        }
        if self.settings().policy == PolicyMode::LoadAware {
            self.report_slowness(host);
        }
        if tick % LIVENESS_TICKS == 0 && self.settings().sync.enabled {
            self.report_liveness(host, now_nanos / 1_000_000);
        }
        self.meter.flush(host);
    }

    /// Refreshes the fleet view: static pools from the config (registering
    /// their names), cluster pools as the singleton published them, and
    /// every VM's cooldowns.
    fn refresh_fleet<H: Host>(&self, host: &H, tick: u64, now: u32) {
        if self.router.all_static() {
            if tick % STATIC_REFRESH_TICKS == 0 {
                if let Err(e) = self.router.refresh_static(host, now) {
                    log::warn!("prefix_router: pod registry: {e}");
                }
            }
        } else if let Ok((Some(bytes), cas)) = host.get(fleet::MEMBERS_KEY) {
            if self.members_cas.get() != cas {
                if let Some(members) = Members::decode(&bytes) {
                    self.router.set_members(members);
                    self.members_cas.set(cas);
                }
            }
        }
        if self.settings().passive_cooldown_ms > 0 {
            if let Ok((v, _)) = host.get(fleet::DOWN_KEY) {
                self.router
                    .set_down(fleet::decode_down(v.as_deref().unwrap_or(&[])));
            }
        }
    }

    /// Publishes this VM's in-flight counts and reads the others' (see
    /// [`crate::route::load`]); sets `prefix_router.inflight.<pod>` for every
    /// member to this replica's count (a write only when it changed).
    fn exchange_load<H: Host>(&self, host: &H, now_ms: u64) {
        let counts = match self.router.refresh_load(host, now_ms) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("prefix_router: in-flight exchange failed: {e}");
                return;
            }
        };
        for (slot, _, address) in self.router.fleet().all() {
            let n = counts.get(slot.index()).copied().unwrap_or(0);
            self.meter.inflight(host, address, n);
        }
    }

    /// Reads the pods' signals the singleton published (one get per tick);
    /// records older than `signals.stale_ms()` are dropped, and those pods
    /// are weighed by in-flight counts alone.
    fn read_signals<H: Host>(&self, host: &H, now_ms: u64) {
        let bytes = match host.get(crate::signals::KEY) {
            Ok((v, _)) => v.unwrap_or_default(),
            Err(e) => {
                log::warn!("prefix_router: pod signals unreadable: {e}");
                Vec::new()
            }
        };
        let stale = self.settings().signals.stale_ms();
        self.router.set_signals(&bytes, now_ms, stale);
    }

    /// Sets `prefix_router.slowness.<pod>` for every member (a write only
    /// when it changed): how much slower the load-aware policy takes each
    /// pod to be than the fastest (the second fastest, for the reported
    /// time per output token of three pods or more), from its own hit
    /// timing and the pods' reported time per output token.
    fn report_slowness<H: Host>(&self, host: &H) {
        let slow = self.router.member_slowness();
        for (slot, _, address) in self.router.fleet().all() {
            let value = slow.get(slot.index()).copied().unwrap_or(0);
            self.meter.slowness(host, address, value);
        }
    }

    /// Records the sync liveness gauges from the singleton's heartbeat; they
    /// keep moving when the singleton is dead, which its own stats cannot.
    fn report_liveness<H: Host>(&self, host: &H, now_ms: u64) {
        let beat = host
            .get(liveness::KEY)
            .ok()
            .and_then(|(v, _)| Heartbeat::decode(&v?))
            .unwrap_or_default();
        if beat.started_ms == 0 {
            // The singleton never started: nothing to report yet.
            return;
        }
        let m = &self.meter;
        host.record_metric(m.sync_success_age_s, beat.success_age_s(now_ms));
        host.record_metric(m.sync_singleton_age_s, beat.tick_age_s(now_ms));
        let dead = beat.singleton_dead(now_ms);
        if dead && !self.singleton_dead_logged.get() {
            log::error!(
                "prefix_router: the sync singleton has not run for {} s (its VM may have died); sync is stopped, routing goes on",
                beat.tick_age_s(now_ms)
            );
        }
        self.singleton_dead_logged.set(dead);
    }

    /// The hand-off queue, if the singleton registered it.
    fn queue<H: Host>(&self, host: &H, now: u32) -> Option<u32> {
        if self.queue.get().is_none() && self.queue_looked_at.get() != Some(now) {
            self.queue_looked_at.set(Some(now));
            self.queue
                .set(host.resolve_queue(&self.vm_id, handoff::QUEUE_NAME));
        }
        self.queue.get()
    }
}
