//! The sync singleton's loop around the [`SyncEngine`], over the host traits
//! so it is tested with a fake clock and doubles: it drives the engine, feeds
//! it the workers' hand-offs, probes Redis outside the cycles (cutting a
//! backoff short, noticing a restart), writes the heartbeat the workers turn
//! into liveness gauges, names the placement node in cluster mode and
//! publishes the sync stats. `host::sync_service` only forwards Envoy's
//! callbacks here.

mod metrics;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use self::metrics::{PrefixCounts, SyncMetrics};
use super::bridge::BridgeCalls;
use super::engine::{Call, CallId, SyncEngine};
use super::error::CallFailed;
use super::handoff;
use super::liveness::{self, Heartbeat};
use super::place;
use super::probe;
use super::syncables::{Clock, PodLoadSync, PrefixCacheSync};
use crate::config::Settings;
use crate::fleet::SharedView;
use crate::shared::metrics::MetricSink;
use crate::shared::store::SharedStore;

/// How often the host ticks the singleton: bounds write-through push latency
/// and the granularity of change-log polls (`sync.poll_ms`).
pub(crate) const TICK_MS: u64 = 25;
/// Upper bound of one bridge call.
const CALL_TIMEOUT_MS: u64 = 5_000;
/// Most dirty blocks kept between pushes (oldest dropped, counted).
const MAX_DIRTY: usize = 200_000;
/// While sync backs off, Redis is probed this often (a cycle starts as soon
/// as it answers); while healthy, this rarely, to notice restarts. A probe
/// call also times out after [`PROBE_FAILING_MS`].
const PROBE_FAILING_MS: u64 = 2_000;
const PROBE_HEALTHY_MS: u64 = 30_000;
/// The "no successful sync" error is logged once sync has failed this long
/// (or three periods, if longer).
const ALARM_MIN_MS: u64 = 30_000;

/// What the sync loop asks of Envoy: shared data (the table, the heartbeat,
/// the placement node), stats and bridge calls.
pub(crate) trait SyncHost: SharedStore + MetricSink + BridgeCalls + Clone + 'static {}
impl<T: SharedStore + MetricSink + BridgeCalls + Clone + 'static> SyncHost for T {}

/// The sync singleton's loop (one per Envoy, on the main thread).
pub(crate) struct SyncSupervisor<H: SyncHost> {
    host: H,
    settings: Rc<Settings>,
    engine: SyncEngine,
    prefix: Rc<RefCell<PrefixCacheSync<H>>>,
    prefix_ns: String,
    /// Bridge call token -> engine call id.
    calls: HashMap<u32, CallId>,
    metrics: SyncMetrics,
    /// What the workers read to report the singleton's liveness.
    heartbeat: Heartbeat,
    alarm: FailingAlarm,
    probe: ProbeSchedule,
    restarts: RestartWatch,
    place_node: PlaceNode,
}

impl<H: SyncHost> SyncSupervisor<H> {
    /// Starts sync at `now_ms` (None when `sync.enabled` is off, or when the
    /// engine refuses to start, logged). `clock_ms` is the syncables' clock
    /// (Unix milliseconds); `seed` the engine's (the clock in ns will do).
    pub(crate) fn start(
        host: H,
        settings: Rc<Settings>,
        view: SharedView,
        clock_ms: Clock,
        seed: u64,
        now_ms: u64,
    ) -> Option<Self> {
        if !settings.sync.enabled {
            return None;
        }
        let mut engine = SyncEngine::new(settings.sync.clone(), seed);
        let ms = clock_ms.clone();
        let secs: Clock = Rc::new(move || ms() / 1000);
        let prefix = Rc::new(RefCell::new(PrefixCacheSync::new(
            host.clone(),
            settings.clone(),
            view.clone(),
            secs,
            MAX_DIRTY,
        )));
        let prefix_ns = settings.sync.namespaces.prefixcache.clone();
        let max_age = settings.sync.period_ms.saturating_mul(3);
        let load = PodLoadSync::new(
            host.clone(),
            &settings,
            view,
            engine.origin().to_string(),
            clock_ms,
            max_age,
        );
        // Registration errors are logged by the engine; a namespace that did
        // not register simply does not sync.
        let _ = engine.register(Box::new(prefix.clone()));
        let _ = engine.register(Box::new(load));
        if let Err(e) = engine.start(now_ms) {
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
            metrics: SyncMetrics::define(&host),
            host,
            engine,
            prefix,
            prefix_ns,
            calls: HashMap::new(),
            heartbeat: Heartbeat {
                started_ms: now_ms,
                ..Heartbeat::default()
            },
            alarm: FailingAlarm::default(),
            probe: ProbeSchedule::default(),
            restarts: RestartWatch::default(),
            place_node: PlaceNode::default(),
            settings,
        })
    }

    /// This replica's origin id in the change log (pod signals share under it).
    pub(crate) fn origin(&self) -> &str {
        self.engine.origin()
    }

    /// Blocks marked for the next push.
    #[cfg(test)]
    pub(crate) fn dirty_len(&self) -> usize {
        self.prefix.borrow().dirty_len()
    }

    /// VM shutdown (Envoy drain): ends the loop cleanly.
    pub(crate) fn stop(&mut self) {
        self.engine.stop();
    }

    /// One message of the workers' hand-off queue: marks its blocks for the
    /// next push, and with `sync.write_through` queues them at once. A
    /// message that does not decode is dropped.
    pub(crate) fn on_handoff(&mut self, message: &[u8]) {
        let Some(touched) = handoff::decode(message) else {
            return;
        };
        let Ok(mut prefix) = self.prefix.try_borrow_mut() else {
            return;
        };
        prefix.mark(&touched);
        if self.settings.sync.write_through {
            for &(block, anchor) in &touched.blocks {
                if let Some(payload) = prefix.payload(block, anchor) {
                    let _ = self
                        .engine
                        .put(&self.prefix_ns, &block.to_string(), payload);
                }
            }
        }
    }

    /// The host's tick: the engine's due calls, then the probe when due,
    /// then stats, heartbeat and placement node.
    pub(crate) fn on_tick(&mut self, now_ms: u64) {
        let calls = self.engine.tick(now_ms);
        self.send(calls, now_ms);
        self.maybe_probe(now_ms);
        self.publish(now_ms);
    }

    /// The reply to bridge call `token`, read whole through `read` (or why
    /// there is none); false if the call is not one of this loop's.
    pub(crate) fn on_reply(
        &mut self,
        token: u32,
        now_ms: u64,
        read: impl FnOnce(usize) -> Result<Vec<u8>, CallFailed>,
    ) -> bool {
        if let Some(expected) = self.probe.answered(token) {
            let reply = read(usize::MAX);
            self.on_probe_reply(reply.ok().as_deref(), expected, now_ms);
            return true;
        }
        let Some(call_id) = self.calls.remove(&token) else {
            return false;
        };
        let reply = read(usize::MAX);
        let next = self
            .engine
            .on_response(call_id, now_ms, reply.as_deref().map_err(Clone::clone));
        self.send(next, now_ms);
        self.publish(now_ms);
        true
    }

    /// Sends calls; a refused dispatch is fed back at once, which may yield
    /// more calls (bounded by the engine's own retry limits).
    fn send(&mut self, calls: Vec<Call>, now_ms: u64) {
        let mut pending = calls;
        let s = &self.settings.sync;
        // A per-call timeout makes every call end in a response; the engine also
        // abandons a whole cycle after op_timeout_ms.
        let timeout_ms = s.op_timeout_ms.clamp(1, CALL_TIMEOUT_MS);
        while let Some(call) = pending.pop() {
            match self
                .host
                .post_bridge(s, call.node.as_deref(), &call.body, timeout_ms)
            {
                Ok(token) => {
                    self.calls.insert(token, call.id);
                }
                Err(status) => {
                    let failed =
                        CallFailed::Dispatch(format!("{status} (cluster {})", s.bridge_cluster));
                    pending.extend(self.engine.on_response(call.id, now_ms, Err(failed)));
                }
            }
        }
    }

    /// Sends the Redis probe when due (see [`ProbeSchedule::due`]).
    fn maybe_probe(&mut self, now_ms: u64) {
        if !self.probe.due(now_ms, self.engine.failing()) {
            return;
        }
        let s = &self.settings.sync;
        let (body, expected) = probe::body(s);
        if let Ok(token) = self.host.post_bridge(s, None, &body, PROBE_FAILING_MS) {
            self.probe.sent(token, expected);
            self.metrics.probe_sent(&self.host);
        }
    }

    /// A probe reply: Redis answers (cut the backoff short), and whether it
    /// restarted since the last probe (then re-push the whole table: it may
    /// have come back empty).
    fn on_probe_reply(&mut self, reply: Option<&[u8]>, expected: usize, now_ms: u64) {
        let Some(run_id) = reply.and_then(|r| probe::run_id(r, expected)) else {
            return;
        };
        if self.restarts.restarted(run_id, self.settings.sync.cluster) {
            let marked = self
                .prefix
                .try_borrow_mut()
                .map(|mut p| p.mark_all())
                .unwrap_or(0);
            self.metrics.redis_restarted(&self.host);
            log::warn!(
                "prefix_router sync: Redis restarted (run_id changed); re-pushing {marked} blocks"
            );
        }
        self.engine.retry_now(now_ms);
    }

    fn publish(&mut self, now_ms: u64) {
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
        self.metrics
            .publish(&self.host, self.engine.stats(), &rtts, &prefix);
        self.beat(now_ms);
        self.name_place_node();
    }

    /// Writes the heartbeat the workers turn into liveness gauges (every
    /// [`liveness::WRITE_EVERY_MS`]), and logs at error level once when sync
    /// has failed for a while.
    fn beat(&mut self, now_ms: u64) {
        let success = self.engine.stats().last_success_ms.unwrap_or(0);
        let alarm_ms = self
            .settings
            .sync
            .period_ms
            .saturating_mul(3)
            .max(ALARM_MIN_MS);
        if let Some(failing_for) = self.alarm.on_beat(
            now_ms,
            success,
            self.heartbeat.success_ms,
            self.heartbeat.started_ms,
            alarm_ms,
        ) {
            log::error!(
                "prefix_router sync: no successful sync for {} s (cluster {}); routing goes on with local knowledge",
                failing_for / 1000,
                self.settings.sync.bridge_cluster
            );
        }
        self.heartbeat.success_ms = success;
        if now_ms.saturating_sub(self.heartbeat.tick_ms) >= liveness::WRITE_EVERY_MS {
            self.heartbeat.tick_ms = now_ms;
            let _ = self.host.set(liveness::KEY, &self.heartbeat.encode(), None);
        }
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
        let node = self.engine.owner_of_key(place::slot_key(s).as_bytes());
        let Some(value) = self.place_node.changed(node) else {
            return;
        };
        if self
            .host
            .set(place::NODE_KEY, value.as_bytes(), None)
            .is_ok()
        {
            self.place_node.written(node);
        }
    }
}

/// When the Redis probe goes: at once the first time, then every
/// [`PROBE_FAILING_MS`] while sync backs off and every [`PROBE_HEALTHY_MS`]
/// otherwise, never two at a time. A probe the host refused waits out the
/// interval too.
#[derive(Debug, Default)]
struct ProbeSchedule {
    /// The probe in flight: its token and the replies it expects.
    in_flight: Option<(u32, usize)>,
    /// When the last probe was due (0: never; the first goes at once).
    last_ms: u64,
}

impl ProbeSchedule {
    /// Whether a probe goes now; if so, its interval restarts now.
    fn due(&mut self, now_ms: u64, failing: bool) -> bool {
        let every = if failing {
            PROBE_FAILING_MS
        } else {
            PROBE_HEALTHY_MS
        };
        if self.in_flight.is_some() || now_ms < self.last_ms.saturating_add(every) {
            return false;
        }
        self.last_ms = now_ms;
        true
    }

    fn sent(&mut self, token: u32, expected: usize) {
        self.in_flight = Some((token, expected));
    }

    /// The replies expected when `token` is the probe in flight (which is
    /// then over).
    fn answered(&mut self, token: u32) -> Option<usize> {
        let (t, expected) = self.in_flight?;
        if t != token {
            return None;
        }
        self.in_flight = None;
        Some(expected)
    }
}

/// Restart detection from the probes' `run_id`s.
#[derive(Debug, Default)]
struct RestartWatch {
    /// Redis's `run_id` as last probed.
    run_id: Option<String>,
}

impl RestartWatch {
    /// Records a probed `run_id`; true when it differs from the last one.
    /// Never in cluster mode: the probe's default route may reach any node,
    /// so a different `run_id` says nothing there (a master restarted empty
    /// is refilled by the delta pushes and TTLs).
    fn restarted(&mut self, run_id: String, cluster: bool) -> bool {
        let changed = !cluster && self.run_id.as_ref().is_some_and(|old| *old != run_id);
        self.run_id = Some(run_id);
        changed
    }
}

/// The "sync failing" error latch: raised once per failure streak.
#[derive(Debug, Default)]
struct FailingAlarm {
    /// Whether the error was logged since the last success.
    logged: bool,
}

impl FailingAlarm {
    /// `success_ms`: the engine's last success (0: none), `seen_ms` the one
    /// the last beat saw, `started_ms` when sync started. A new success
    /// rearms the latch; otherwise, failing longer than `alarm_ms` (counted
    /// from the last success, or the start) raises it once: returns for how
    /// long sync has failed, to log.
    fn on_beat(
        &mut self,
        now_ms: u64,
        success_ms: u64,
        seen_ms: u64,
        started_ms: u64,
        alarm_ms: u64,
    ) -> Option<u64> {
        let failing_for = now_ms.saturating_sub(success_ms.max(started_ms));
        if success_ms > seen_ms {
            self.logged = false;
        } else if failing_for > alarm_ms && !self.logged {
            self.logged = true;
            return Some(failing_for);
        }
        None
    }
}

/// The placement node as last written to [`place::NODE_KEY`].
#[derive(Debug, Default)]
struct PlaceNode {
    written: Option<String>,
}

impl PlaceNode {
    /// The value to write when `node` differs from what was written
    /// (empty for no node); None when it is the same.
    fn changed(&self, node: Option<&str>) -> Option<String> {
        (node != self.written.as_deref()).then(|| node.unwrap_or("").to_string())
    }

    fn written(&mut self, node: Option<&str>) {
        self.written = node.map(str::to_owned);
    }
}

#[cfg(test)]
mod tests;
