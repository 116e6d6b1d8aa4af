//! The sync singleton: one root context on Envoy's main thread (an
//! `envoy.bootstrap.wasm` service with `singleton: true`, same `vm_id` as the
//! filter, root id [`SYNC_ROOT_ID`](super::SYNC_ROOT_ID)). It drives the
//! sans-IO [`SyncEngine`] from `on_tick`, sends its RESP pipelines to the
//! Redis bridge with `dispatch_http_call`, feeds replies back, and drains the
//! workers' shared queue of touched blocks into the prefix-cache syncable.
//!
//! `on_configure` only parses, sets the tick and registers the hand-off queue
//! (idempotent): Envoy may configure two singleton VMs of which only one
//! ticks, so the engine starts on the first tick.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, RootContext};
use proxy_wasm::types::MetricType;

use super::abi;
use super::deployment::{self, ConfigWatch};
use super::envoy::{dispatch_bridge, EnvoyHost};
use super::fleet_service::FleetService;
use super::signal_service::SignalService;
use super::{now_millis, now_nanos, now_secs};
use crate::config::Settings;
use crate::fleet::SharedView;
use crate::sync::handoff::{self, Touched};
use crate::sync::liveness::{self, Heartbeat};
use crate::sync::place;
use crate::sync::stats::CounterField;
use crate::sync::syncables::{PodLoadSync, PrefixCacheSync};
use crate::sync::{probe, Call, CallFailed, CallId, SyncEngine, SyncStats};

/// How often the engine is ticked: bounds write-through push latency and
/// the granularity of change-log polls (`sync.poll_ms`).
const TICK: Duration = Duration::from_millis(25);
/// Upper bound of one bridge call.
const CALL_TIMEOUT_MS: u64 = 5_000;
/// Most dirty blocks kept between pushes (oldest dropped, counted).
const MAX_DIRTY: usize = 200_000;
/// Queue messages drained per callback, so one burst cannot stall the main thread.
const MAX_DRAIN: usize = 10_000;

#[derive(Default)]
pub struct SyncRoot {
    settings: Option<Rc<Settings>>,
    queue: Option<u32>,
    state: Option<SyncState>,
    /// Membership and health of the pools (started on the first tick).
    fleet: Option<FleetService>,
    /// The singleton's view of the fleet (the syncables name pods through it).
    view: SharedView,
    /// Pod signals (`signals.enabled`; started on the first tick).
    signals: Option<SignalService>,
    /// Compares this plugin configuration with the filter's.
    config_watch: Option<ConfigWatch>,
}

struct SyncState {
    engine: SyncEngine,
    prefix: Rc<RefCell<PrefixCacheSync<EnvoyHost>>>,
    prefix_ns: String,
    /// dispatch_http_call token -> engine call id.
    calls: HashMap<u32, CallId>,
    metrics: SyncMetrics,
    settings: Rc<Settings>,
    /// What the workers read to report the singleton's liveness.
    heartbeat: Heartbeat,
    /// Whether the "sync failing" error was logged since the last success.
    failing_logged: bool,
    /// The Redis probe in flight, if any.
    probe: Option<Probe>,
    /// When the last probe was sent (0: never; the first goes at once).
    last_probe_ms: u64,
    /// Redis's `run_id` as last probed (a change means it restarted).
    redis_run_id: Option<String>,
    probes: u32,
    redis_restarts: u32,
    /// The master named to the workers for placements (`sync.cluster` with
    /// `place_new`), as last written to [`place::NODE_KEY`].
    place_node: Option<String>,
}

/// A probe call in flight.
struct Probe {
    token: u32,
    expected: usize,
}

/// While sync backs off, Redis is probed this often (a cycle starts as soon
/// as it answers); while healthy, this rarely, to notice restarts.
const PROBE_FAILING_MS: u64 = 2_000;
const PROBE_HEALTHY_MS: u64 = 30_000;

impl Context for SyncRoot {
    /// VM shutdown (Envoy drain): end the loop cleanly.
    fn on_done(&mut self) -> bool {
        if let Some(state) = self.state.as_mut() {
            state.engine.stop();
        }
        true
    }

    fn on_http_call_response(
        &mut self,
        token_id: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(fleet) = self.fleet.as_mut() {
            if fleet.on_response(token_id, num_headers, body_size, now_millis()) {
                return;
            }
        }
        if let Some(signals) = self.signals.as_mut() {
            if signals.on_response(token_id, num_headers, body_size, now_millis()) {
                return;
            }
        }
        let Some(state) = self.state.as_mut() else {
            return;
        };
        if state.probe.as_ref().is_some_and(|p| p.token == token_id) {
            let reply = abi::call_reply(num_headers, body_size);
            state.on_probe_reply(reply.ok().as_deref(), now_millis());
            return;
        }
        let Some(call_id) = state.calls.remove(&token_id) else {
            return;
        };
        let result = abi::call_reply(num_headers, body_size);
        let next = state.engine.on_response(
            call_id,
            now_millis(),
            result.as_deref().map_err(Clone::clone),
        );
        state.dispatch(next);
        state.publish();
    }
}

impl RootContext for SyncRoot {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        deployment::announce_build("sync singleton");
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        super::follow_log_level();
        let Some((settings, raw)) = super::load_plugin_config() else {
            return false;
        };
        self.config_watch = Some(ConfigWatch::new(raw));
        if let Err(status) = hostcalls::set_tick_period(TICK) {
            log::error!(
                "prefix_router singleton: cannot set the tick ({status:?}): sync will not run"
            );
        }
        // Register the hand-off queue now, before listeners serve: workers
        // find it and hand their table writes here from their first request.
        // Registering twice (Envoy may configure two singleton VMs) returns
        // the same queue, so this is idempotent.
        self.queue = hostcalls::register_shared_queue(handoff::QUEUE_NAME).ok();
        if !settings.sync.enabled {
            log::info!("prefix_router singleton: sync disabled (sync.enabled is false)");
        }
        self.settings = Some(Rc::new(settings));
        true
    }

    fn on_tick(&mut self) {
        super::follow_log_level();
        if let Some(watch) = self.config_watch.as_mut() {
            watch.on_tick(super::vm_id, now_millis());
        }
        if self.fleet.is_none() {
            self.fleet = self
                .settings
                .clone()
                .map(|s| FleetService::new(s, self.view.clone()));
        }
        if let Some(fleet) = self.fleet.as_mut() {
            fleet.on_tick(now_millis());
        }
        // Starts the sync state on the first tick (signals share its origin).
        self.drain_queue();
        if self.signals.is_none() {
            self.signals = self
                .settings
                .clone()
                .filter(|s| s.signals.enabled)
                .map(|s| {
                    let replica = self.state.as_ref().map(|st| st.engine.origin().to_string());
                    SignalService::new(s, self.view.clone(), replica.as_deref())
                });
        }
        if let Some(signals) = self.signals.as_mut() {
            signals.on_tick(now_millis());
        }
        let Some(state) = self.state.as_mut() else {
            return;
        };
        let now = now_millis();
        let calls = state.engine.tick(now);
        state.dispatch(calls);
        state.maybe_probe(now);
        state.publish();
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        self.drain_queue();
    }
}

impl SyncRoot {
    /// Marks the blocks workers handed over for the next push (and sends
    /// them at once with write-through).
    fn drain_queue(&mut self) {
        // The engine starts with the first tick or the first hand-off,
        // whichever comes first, so no hand-off misses the dirty set.
        if self.state.is_none() {
            let view = self.view.clone();
            self.state = self
                .settings
                .clone()
                .and_then(|s| SyncState::start(s, view));
        }
        let Some(queue) = self.queue else {
            return;
        };
        for _ in 0..MAX_DRAIN {
            let msg = match hostcalls::dequeue_shared_queue(queue) {
                Ok(Some(m)) => m,
                _ => break,
            };
            let Some(touched) = handoff::decode(&msg) else {
                continue;
            };
            if let Some(state) = self.state.as_mut() {
                let write_through = state.settings.sync.write_through;
                state.on_touched(&touched, write_through);
            }
        }
    }
}

impl SyncState {
    fn start(settings: Rc<Settings>, view: SharedView) -> Option<Self> {
        if !settings.sync.enabled {
            return None;
        }
        let mut engine = SyncEngine::new(settings.sync.clone(), now_nanos());
        let secs: Rc<dyn Fn() -> u64> = Rc::new(|| u64::from(now_secs()));
        let millis: Rc<dyn Fn() -> u64> = Rc::new(now_millis);
        let prefix = Rc::new(RefCell::new(PrefixCacheSync::new(
            EnvoyHost,
            settings.clone(),
            view.clone(),
            secs,
            MAX_DIRTY,
        )));
        let prefix_ns = settings.sync.namespaces.prefixcache.clone();
        let max_age = settings.sync.period_ms.saturating_mul(3);
        let load = PodLoadSync::new(
            EnvoyHost,
            &settings,
            view,
            engine.origin().to_string(),
            millis,
            max_age,
        );
        // Registration errors are logged by the engine; a namespace that did
        // not register simply does not sync.
        let _ = engine.register(Box::new(prefix.clone()));
        let _ = engine.register(Box::new(load));
        if let Err(e) = engine.start(now_millis()) {
            log::error!("prefix_router sync: cannot start: {e}");
            return None;
        }
        log::info!(
            "prefix_router sync: started, replica {}, namespaces {:?}, bridge cluster {}",
            engine.origin(),
            engine.namespaces(),
            settings.sync.bridge_cluster
        );
        Some(Self {
            engine,
            prefix,
            prefix_ns,
            calls: HashMap::new(),
            metrics: SyncMetrics::define(),
            heartbeat: Heartbeat {
                started_ms: now_millis(),
                ..Heartbeat::default()
            },
            failing_logged: false,
            probe: None,
            last_probe_ms: 0,
            redis_run_id: None,
            probes: hostcalls::define_metric(MetricType::Counter, "prefix_router.sync.probes")
                .unwrap_or(0),
            redis_restarts: hostcalls::define_metric(
                MetricType::Counter,
                "prefix_router.sync.redis_restarts",
            )
            .unwrap_or(0),
            place_node: None,
            settings,
        })
    }

    fn on_touched(&mut self, touched: &Touched, write_through: bool) {
        let Ok(mut prefix) = self.prefix.try_borrow_mut() else {
            return;
        };
        prefix.mark(touched);
        if write_through {
            for &(block, anchor) in &touched.blocks {
                if let Some(payload) = prefix.payload(block, anchor) {
                    let _ = self
                        .engine
                        .put(&self.prefix_ns, &block.to_string(), payload);
                }
            }
        }
    }

    /// Sends the Redis probe when due: every 2 s while sync backs off, every
    /// 30 s otherwise.
    fn maybe_probe(&mut self, now: u64) {
        let every = if self.engine.failing() {
            PROBE_FAILING_MS
        } else {
            PROBE_HEALTHY_MS
        };
        if self.probe.is_some() || now < self.last_probe_ms.saturating_add(every) {
            return;
        }
        self.last_probe_ms = now;
        let s = &self.settings.sync;
        let (body, expected) = probe::body(s);
        let timeout = Duration::from_millis(PROBE_FAILING_MS);
        if let Ok(token) = dispatch_bridge(s, None, &body, timeout) {
            self.probe = Some(Probe { token, expected });
            let _ = hostcalls::increment_metric(self.probes, 1);
        }
    }

    /// A probe reply: Redis answers (cut the backoff short), and whether it
    /// restarted since the last probe (then re-push the whole table: it may
    /// have come back empty).
    fn on_probe_reply(&mut self, reply: Option<&[u8]>, now: u64) {
        let Some(probe) = self.probe.take() else {
            return;
        };
        let Some(run_id) = reply.and_then(|r| probe::run_id(r, probe.expected)) else {
            return;
        };
        // In cluster mode the probe's default route may reach any node, so
        // a different run_id says nothing: restarts are not detected there
        // (a master restarted empty is refilled by the delta pushes and TTLs).
        let cluster = self.settings.sync.cluster;
        if !cluster && self.redis_run_id.as_ref().is_some_and(|old| *old != run_id) {
            let marked = self
                .prefix
                .try_borrow_mut()
                .map(|mut p| p.mark_all())
                .unwrap_or(0);
            let _ = hostcalls::increment_metric(self.redis_restarts, 1);
            log::warn!(
                "prefix_router sync: Redis restarted (run_id changed); re-pushing {marked} blocks"
            );
        }
        self.redis_run_id = Some(run_id);
        self.engine.retry_now(now);
    }

    /// Sends calls; a failed dispatch is fed back at once, which may yield
    /// more calls (bounded by the engine's own retry limits).
    fn dispatch(&mut self, calls: Vec<Call>) {
        let mut pending = calls;
        let s = &self.settings.sync;
        // A per-call timeout makes every call end in a response; the engine also
        // abandons a whole cycle after op_timeout_ms.
        let timeout = Duration::from_millis(s.op_timeout_ms.clamp(1, CALL_TIMEOUT_MS));
        while let Some(call) = pending.pop() {
            match dispatch_bridge(s, call.node.as_deref(), &call.body, timeout) {
                Ok(token) => {
                    self.calls.insert(token, call.id);
                }
                Err(status) => {
                    let failed =
                        CallFailed::Dispatch(format!("{status:?} (cluster {})", s.bridge_cluster));
                    pending.extend(self.engine.on_response(call.id, now_millis(), Err(failed)));
                }
            }
        }
    }

    fn publish(&mut self) {
        let now = now_millis();
        let rtts = self.engine.drain_rtt_samples();
        let prefix = self
            .prefix
            .try_borrow()
            .map(|p| {
                let (held, dropped) = p.foreign_stats();
                PrefixCounts {
                    dirty_dropped: p.dirty_dropped(),
                    facts_ignored: p.facts_ignored(),
                    foreign_entries: held as u64,
                    foreign_dropped: dropped,
                }
            })
            .unwrap_or_default();
        let stats = self.engine.stats();
        self.metrics.publish(stats, &rtts, &prefix);
        self.beat(now);
        self.name_place_node();
    }

    /// Cluster mode with `place_new`: writes the master holding the
    /// placement keys' slot to [`place::NODE_KEY`] when the slot map names
    /// another one (empty while no map is known), so the workers' placement
    /// calls go there.
    fn name_place_node(&mut self) {
        let s = &self.settings.sync;
        if !(s.cluster && s.places_new()) {
            return;
        }
        let node = self
            .engine
            .owner_of_key(place::slot_key(s).as_bytes())
            .map(str::to_owned);
        if node == self.place_node {
            return;
        }
        let value = node.as_deref().unwrap_or("").as_bytes();
        if hostcalls::set_shared_data(place::NODE_KEY, Some(value), None).is_ok() {
            self.place_node = node;
        }
    }

    /// Writes the heartbeat the workers turn into liveness gauges, and logs
    /// at error level once when sync has failed for a while.
    fn beat(&mut self, now: u64) {
        let success = self.engine.stats().last_success_ms.unwrap_or(0);
        let failing_for = now.saturating_sub(success.max(self.heartbeat.started_ms));
        let alarm = self.settings.sync.period_ms.saturating_mul(3).max(30_000);
        if success > self.heartbeat.success_ms {
            self.failing_logged = false;
        } else if failing_for > alarm && !self.failing_logged {
            self.failing_logged = true;
            log::error!(
                "prefix_router sync: no successful sync for {} s (cluster {}); routing goes on with local knowledge",
                failing_for / 1000,
                self.settings.sync.bridge_cluster
            );
        }
        self.heartbeat.success_ms = success;
        if now.saturating_sub(self.heartbeat.tick_ms) >= liveness::WRITE_EVERY_MS {
            self.heartbeat.tick_ms = now;
            let _ = hostcalls::set_shared_data(liveness::KEY, Some(&self.heartbeat.encode()), None);
        }
    }
}

/// The prefix-cache syncable's own counts (not engine stats).
#[derive(Default)]
struct PrefixCounts {
    dirty_dropped: u64,
    facts_ignored: u64,
    foreign_entries: u64,
    foreign_dropped: u64,
}

/// Envoy stats of the sync singleton. Engine totals are turned into counter
/// increments against what was last published. The liveness gauges are the
/// workers' (see [`crate::sync::liveness`]): they must keep moving if this VM dies.
struct SyncMetrics {
    /// (metric id, engine total, value last published)
    counters: Vec<(u32, CounterField, u64)>,
    backoff_ms: u32,
    rtt_ms: u32,
    dirty_dropped: u32,
    last_dropped: u64,
    facts_ignored: u32,
    last_ignored: u64,
    foreign_entries: u32,
    foreign_dropped: u32,
    last_foreign_dropped: u64,
}

impl SyncMetrics {
    fn define() -> Self {
        let def = |t, n: &str| {
            hostcalls::define_metric(t, &format!("prefix_router.sync.{n}")).unwrap_or(0)
        };

        Self {
            counters: SyncStats::COUNTERS
                .iter()
                .map(|(n, f)| (def(MetricType::Counter, n), *f, 0))
                .collect(),
            backoff_ms: def(MetricType::Gauge, "backoff_ms"),
            rtt_ms: def(MetricType::Histogram, "redis_rtt_ms"),
            dirty_dropped: def(MetricType::Counter, "dirty_dropped"),
            last_dropped: 0,
            facts_ignored: def(MetricType::Counter, "facts_ignored"),
            last_ignored: 0,
            foreign_entries: def(MetricType::Gauge, "foreign_entries"),
            foreign_dropped: def(MetricType::Counter, "foreign_dropped"),
            last_foreign_dropped: 0,
        }
    }

    fn publish(&mut self, stats: &SyncStats, rtts: &[u64], prefix: &PrefixCounts) {
        let bump = |id: u32, now: u64, last: &mut u64| {
            if now > *last {
                let _ = hostcalls::increment_metric(id, i64::try_from(now - *last).unwrap_or(0));
                *last = now;
            }
        };
        bump(
            self.facts_ignored,
            prefix.facts_ignored,
            &mut self.last_ignored,
        );
        bump(
            self.dirty_dropped,
            prefix.dirty_dropped,
            &mut self.last_dropped,
        );
        bump(
            self.foreign_dropped,
            prefix.foreign_dropped,
            &mut self.last_foreign_dropped,
        );
        let _ = hostcalls::record_metric(self.foreign_entries, prefix.foreign_entries);
        for (id, field, last) in &mut self.counters {
            let v = field(stats);
            if v > *last {
                let _ =
                    hostcalls::increment_metric(*id, i64::try_from(v - *last).unwrap_or(i64::MAX));
                *last = v;
            }
        }
        let _ = hostcalls::record_metric(self.backoff_ms, stats.backoff_ms);
        for rtt in rtts {
            let _ = hostcalls::record_metric(self.rtt_ms, *rtt);
        }
    }
}
