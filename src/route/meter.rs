//! The request path's stats, counted in the worker VM and flushed to Envoy on
//! the worker's tick.
//!
//! Every Envoy stat write is a hostcall (about 1 µs each), and a routed
//! request used to make four or five. Here a request only bumps plain
//! counters in VM memory; [`Meter::flush`] hands the sums to Envoy, one call
//! per stat that moved, every tick (250 ms). Envoy keys stats by name, so all
//! worker VMs still add into the same counters. The price: a stat lags the
//! traffic by at most one tick, and a VM that is torn down loses at most one
//! tick of counts.
//!
//! `route_time_us` is sampled (one request in [`SAMPLE_EVERY`]): timing a
//! request costs a second clock read. `place.wait_us` times every placement
//! (`sync.place_new`): two reads of the host's clock per placement, against
//! a wait of some hundreds of µs.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::config::Settings;
use crate::route::policy::Reason;
use crate::route::request::PassReason;
use crate::shared::registry::MAX_SLOTS;

/// One routed request in this many is timed for `route_time_us`.
pub const SAMPLE_EVERY: u32 = 8;
/// Timings kept between flushes; more are dropped (a tick is 250 ms).
const MAX_SAMPLES: usize = 256;

use crate::shared::metrics::{MetricKind, MetricSink};

/// The counters a request moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    Requests,
    Routed(Reason),
    Pass(PassReason),
    CasRetries,
    CasExhausted,
    TableEvictions,
    /// Blocks the sync singleton never got (no hand-off queue).
    HandoffDropped,
    PassiveCooldowns,
    /// New table slots taken (an Envoy gauge, added to).
    SlotsUsed,
    /// Blocks the table could not store (see `WriteOutcome::refused`).
    TableRefused,
    /// Requests held for a prefix their pod was still computing.
    Held,
    /// Held requests resumed when the earlier request answered.
    HoldAnswered,
    /// Held requests resumed at `hold.max_ms`.
    HoldTimedOut,
    /// Requests not held because `hold.max_waiting` were held already.
    HoldRefused,
    /// Held requests that waited for another worker VM's prefill.
    HeldForOtherVm,
    /// Updates of the shared list of prefills that failed (CAS contention
    /// or a store error; the entry then ends by its deadline).
    HoldShareFailed,
    /// New prompts that asked Redis for a pod (`sync.place_new`).
    PlaceAsked,
    /// Placements that failed (timeout, error or unreadable reply, a pod
    /// that was not a candidate): the request took the VM's own pick.
    PlaceFailed,
    /// New prompts that did not ask (backing off after a failure, too many
    /// waiting, the call refused, in cluster mode the master not known yet).
    PlaceSkipped,
    /// Streams that ended while Redis placed them.
    PlaceAbandoned,
    /// Release calls that failed (sent again with the next tick's).
    PlaceReleaseFailed,
    /// Releases dropped over the bound (their requests stay counted in
    /// Redis until the VM is reaped, or its keys go an hour unwritten).
    PlaceReleaseDropped,
    /// Held requests that waited for the prefill of their family's claim
    /// on another replica (`sync.place_claim_ms`).
    HeldForClaim,
    /// Table buckets of another layout version written anew (an upgrade
    /// across a layout change: see `WriteOutcome::layout_resets`).
    TableLayoutResets,
}

const ROUTED: [Reason; 5] = [
    Reason::PrefixMatch,
    Reason::NoMatch,
    Reason::LoadGuard,
    Reason::Spread,
    Reason::Placed,
];
const FIXED: usize = 22;
const N: usize = FIXED + ROUTED.len() + PassReason::ALL.len();

impl Count {
    fn index(self) -> usize {
        match self {
            Count::Requests => 0,
            Count::CasRetries => 1,
            Count::CasExhausted => 2,
            Count::TableEvictions => 3,
            Count::HandoffDropped => 4,
            Count::PassiveCooldowns => 5,
            Count::SlotsUsed => 6,
            Count::TableRefused => 7,
            Count::Held => 8,
            Count::HoldAnswered => 9,
            Count::HoldTimedOut => 10,
            Count::HoldRefused => 11,
            Count::HeldForOtherVm => 12,
            Count::HoldShareFailed => 13,
            Count::PlaceAsked => 14,
            Count::PlaceFailed => 15,
            Count::PlaceSkipped => 16,
            Count::PlaceAbandoned => 17,
            Count::PlaceReleaseFailed => 18,
            Count::PlaceReleaseDropped => 19,
            Count::HeldForClaim => 20,
            Count::TableLayoutResets => 21,
            Count::Routed(r) => FIXED + ROUTED.iter().position(|x| *x == r).unwrap_or(0),
            Count::Pass(p) => {
                FIXED + ROUTED.len() + PassReason::ALL.iter().position(|x| *x == p).unwrap_or(0)
            }
        }
    }

    fn name(i: usize) -> String {
        let n = match i {
            0 => "requests_total",
            1 => "table.cas_retries",
            2 => "table.cas_exhausted",
            3 => "table.evictions",
            4 => "sync.handoff_dropped",
            5 => "fleet.passive_cooldowns",
            6 => "table.slots_used",
            7 => "table.refused",
            8 => "hold.held",
            9 => "hold.answered",
            10 => "hold.timed_out",
            11 => "hold.refused",
            12 => "hold.held_other_vm",
            13 => "hold.share_failed",
            14 => "place.asked",
            15 => "place.failed",
            16 => "place.skipped",
            17 => "place.abandoned",
            18 => "place.release_failed",
            19 => "place.release_dropped",
            20 => "hold.held_claim",
            21 => "table.layout_resets",
            i if i < FIXED + ROUTED.len() => match ROUTED[i - FIXED] {
                Reason::PrefixMatch => "routed.prefix_match",
                Reason::NoMatch => "routed.no_match",
                Reason::LoadGuard => "routed.load_guard",
                Reason::Spread => "routed.spread",
                Reason::Placed => "routed.placed",
            },
            i => {
                return format!(
                    "prefix_router.passthrough.{}",
                    PassReason::ALL[i - FIXED - ROUTED.len()].as_str()
                )
            }
        };
        format!("prefix_router.{n}")
    }
}

/// Stats of one worker VM.
pub(crate) struct Meter {
    ids: [u32; N],
    pending: [Cell<u64>; N],
    route_time_us: u32,
    samples: RefCell<Vec<u64>>,
    sample_turn: Cell<u32>,
    /// `place.wait_us`, defined with placement on only.
    place_wait_us: Option<u32>,
    place_waits: RefCell<Vec<u64>>,
    /// Liveness of the sync singleton, recorded on tick (see
    /// [`crate::sync::liveness`]); defined only with sync on.
    pub(crate) sync_success_age_s: u32,
    pub(crate) sync_singleton_age_s: u32,
    /// Per-pod gauges (in flight, slowness, trust horizon) by family and
    /// pod address. At most [`MAX_POD_GAUGES`].
    pod_gauges: RefCell<PodGauges>,
}

impl Meter {
    /// Defines every stat of the request path.
    pub(crate) fn define(settings: &Settings, sink: &impl MetricSink) -> Self {
        let ids = std::array::from_fn(|i| {
            let kind = if i == Count::SlotsUsed.index() {
                MetricKind::Gauge
            } else {
                MetricKind::Counter
            };
            sink.define_metric(kind, &Count::name(i))
        });
        let gauge = |n: &str| {
            if settings.sync.enabled {
                sink.define_metric(MetricKind::Gauge, &format!("prefix_router.{n}"))
            } else {
                0
            }
        };
        Self {
            ids,
            pending: std::array::from_fn(|_| Cell::new(0)),
            route_time_us: sink.define_metric(MetricKind::Histogram, "prefix_router.route_time_us"),
            samples: RefCell::new(Vec::new()),
            sample_turn: Cell::new(0),
            place_wait_us: settings
                .sync
                .places_new()
                .then(|| sink.define_metric(MetricKind::Histogram, "prefix_router.place.wait_us")),
            place_waits: RefCell::new(Vec::new()),
            sync_success_age_s: gauge("sync.last_success_age_s"),
            sync_singleton_age_s: gauge("sync.singleton_age_s"),
            pod_gauges: RefCell::new(PodGauges::default()),
        }
    }

    pub(crate) fn add(&self, c: Count, n: u64) {
        let cell = &self.pending[c.index()];
        cell.set(cell.get().saturating_add(n));
    }

    pub(crate) fn inc(&self, c: Count) {
        self.add(c, 1);
    }

    /// This request's place in the cycle of [`SAMPLE_EVERY`]: 0 is the one
    /// timed (`route_time_us`); other places can sample other dear checks
    /// without adding to the timed request's hostcalls.
    pub(crate) fn next_turn(&self) -> u32 {
        let t = self.sample_turn.get();
        self.sample_turn.set(t.wrapping_add(1));
        t % SAMPLE_EVERY
    }

    /// Keeps one `route_time_us` sample for the next flush.
    pub(crate) fn route_time(&self, us: u64) {
        let mut s = self.samples.borrow_mut();
        if s.len() < MAX_SAMPLES {
            s.push(us);
        }
    }

    /// Counted but not yet handed to Envoy.
    #[cfg(test)]
    pub(crate) fn pending(&self, c: Count) -> u64 {
        self.pending[c.index()].get()
    }

    /// Keeps how long one placement waited, from its call to Redis's answer
    /// (or the failure, or the timeout), for `place.wait_us`. Nothing without
    /// placement.
    pub(crate) fn place_wait(&self, us: u64) {
        let mut s = self.place_waits.borrow_mut();
        if self.place_wait_us.is_some() && s.len() < MAX_SAMPLES {
            s.push(us);
        }
    }

    /// Hands what moved since the last flush to Envoy: one call per counter
    /// that moved and one per timing sample.
    pub(crate) fn flush(&self, sink: &impl MetricSink) {
        for (id, cell) in self.ids.iter().zip(&self.pending) {
            let n = cell.replace(0);
            if n > 0 {
                sink.increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        for us in self.samples.borrow_mut().drain(..) {
            sink.record_metric(self.route_time_us, us);
        }
        // Only kept with the histogram defined (`place_wait`).
        if let Some(id) = self.place_wait_us {
            for us in self.place_waits.borrow_mut().drain(..) {
                sink.record_metric(id, us);
            }
        }
    }

    /// Sets a pod's in-flight gauge, `prefix_router.inflight.<host>_<port>`,
    /// when its value changed (defined on first use).
    pub(crate) fn inflight(&self, sink: &impl MetricSink, address: &str, value: u32) {
        self.pod_gauge(sink, "inflight", address, value);
    }

    /// Sets a pod's slowness gauge, `prefix_router.slowness.<host>_<port>`:
    /// what the load-aware policy takes as its speed, in thousandths of the
    /// fastest member's time (for the reported time per output token, from
    /// three members reporting on, the second fastest's); 1000 = as fast,
    /// 0 = nothing measured yet.
    pub(crate) fn slowness(&self, sink: &impl MetricSink, address: &str, value: u32) {
        self.pod_gauge(sink, "slowness", address, value);
    }

    /// A per-pod gauge, defined on first use. Pods that left keep theirs
    /// (Envoy cannot drop a stat), so past [`MAX_POD_GAUGES`] a new pod
    /// gets none: a fleet that churns through addresses stays bounded.
    fn pod_gauge(&self, sink: &impl MetricSink, family: &'static str, address: &str, value: u32) {
        let mut gauges = self.pod_gauges.borrow_mut();
        let PodGauges { by_family, defined } = &mut *gauges;
        let pods = by_family.entry(family).or_default();
        let (id, last) = match pods.get_mut(address) {
            Some(g) => g,
            None if *defined >= MAX_POD_GAUGES => return,
            None => {
                let name = format!("prefix_router.{family}.{}", stat_safe(address));
                let id = sink.define_metric(MetricKind::Gauge, &name);
                *defined += 1;
                // u32::MAX: never recorded yet, so the first value is.
                pods.entry(address.to_string()).or_insert((id, u32::MAX))
            }
        };
        if *last != value {
            *last = value;
            sink.record_metric(*id, u64::from(value));
        }
    }
}

/// Per-pod gauges by family, then pod address: (id, value last recorded).
/// A lookup per member and family every tick, so a map, not a scan.
#[derive(Default)]
struct PodGauges {
    by_family: HashMap<&'static str, HashMap<String, (u32, u32)>>,
    /// Gauges defined in all families (at most [`MAX_POD_GAUGES`]).
    defined: usize,
}

/// Per-pod gauges defined at most (three families of 2 x [`MAX_SLOTS`]
/// addresses).
pub(crate) const MAX_POD_GAUGES: usize = 6 * MAX_SLOTS;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[derive(Default)]
    struct Sink {
        names: RefCell<Vec<(MetricKind, String)>>,
        values: RefCell<HashMap<u32, i64>>,
        /// Every histogram sample, in order.
        samples: RefCell<Vec<(u32, u64)>>,
        calls: Cell<u32>,
    }

    impl MetricSink for Sink {
        fn define_metric(&self, kind: MetricKind, name: &str) -> u32 {
            let mut n = self.names.borrow_mut();
            n.push((kind, name.to_string()));
            n.len() as u32
        }
        fn increment_metric(&self, id: u32, by: i64) {
            self.calls.set(self.calls.get() + 1);
            *self.values.borrow_mut().entry(id).or_default() += by;
        }
        fn record_metric(&self, id: u32, value: u64) {
            self.calls.set(self.calls.get() + 1);
            self.values.borrow_mut().insert(id, value as i64);
            self.samples.borrow_mut().push((id, value));
        }
    }

    impl Sink {
        fn id(&self, name: &str) -> u32 {
            self.names
                .borrow()
                .iter()
                .position(|(_, n)| n == name)
                .unwrap() as u32
                + 1
        }

        fn value(&self, name: &str) -> i64 {
            self.values
                .borrow()
                .get(&self.id(name))
                .copied()
                .unwrap_or(0)
        }

        /// The samples recorded into histogram `name`, in order.
        fn recorded(&self, name: &str) -> Vec<u64> {
            let id = self.id(name);
            self.samples
                .borrow()
                .iter()
                .filter(|(i, _)| *i == id)
                .map(|(_, v)| *v)
                .collect()
        }
    }

    fn settings() -> Settings {
        Settings::from_json(br#"{"endpoints":["a:1"]}"#).unwrap()
    }

    #[test]
    fn every_stat_has_its_contract_name_once() {
        let sink = Sink::default();
        Meter::define(&settings(), &sink);
        let names = sink.names.borrow();
        let mut seen: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), names.len(), "{names:?}");
        for n in [
            "prefix_router.requests_total",
            "prefix_router.routed.load_guard",
            "prefix_router.passthrough.body_too_large",
            "prefix_router.passthrough.internal_error",
            "prefix_router.sync.handoff_dropped",
            "prefix_router.route_time_us",
        ] {
            assert!(seen.contains(&n), "{n} missing from {seen:?}");
        }
        assert!(names
            .iter()
            .any(|(k, n)| *k == MetricKind::Gauge && n == "prefix_router.table.slots_used"));
    }

    #[test]
    fn counts_reach_envoy_on_flush_with_one_call_per_moved_stat() {
        let sink = Sink::default();
        let m = Meter::define(&settings(), &sink);
        for _ in 0..5 {
            m.inc(Count::Requests);
            m.inc(Count::Routed(Reason::LoadGuard));
        }
        m.inc(Count::Pass(PassReason::NotJson));
        assert_eq!(sink.calls.get(), 0, "nothing reaches Envoy before a flush");
        m.flush(&sink);
        assert_eq!(sink.calls.get(), 3);
        assert_eq!(sink.value("prefix_router.requests_total"), 5);
        assert_eq!(sink.value("prefix_router.routed.load_guard"), 5);
        assert_eq!(sink.value("prefix_router.passthrough.not_json"), 1);
        m.flush(&sink);
        assert_eq!(sink.calls.get(), 3, "an idle flush makes no call");
    }

    #[test]
    fn one_request_in_eight_is_timed_and_samples_are_bounded() {
        let sink = Sink::default();
        let m = Meter::define(&settings(), &sink);
        let timed = (0..80).filter(|_| m.next_turn() == 0).count();
        assert_eq!(timed, 10);
        for us in 0..1000 {
            m.route_time(us);
        }
        m.flush(&sink);
        assert_eq!(sink.calls.get() as usize, MAX_SAMPLES);
    }

    #[test]
    fn placement_waits_are_recorded_with_placement_on_only() {
        let off = Sink::default();
        let m = Meter::define(&settings(), &off);
        assert!(!off
            .names
            .borrow()
            .iter()
            .any(|(_, n)| n == "prefix_router.place.wait_us"));
        m.place_wait(700);
        m.flush(&off);
        assert_eq!(off.calls.get(), 0, "no placement, no histogram");

        let on = Sink::default();
        let placing =
            Settings::from_json(br#"{"endpoints":["a:1"],"sync":{"enabled":true}}"#).unwrap();
        assert!(placing.sync.places_new());
        let m = Meter::define(&placing, &on);
        for us in [650, 900] {
            m.place_wait(us);
        }
        for _ in 0..1000 {
            m.place_wait(1);
        }
        m.flush(&on);
        let recorded = on.recorded("prefix_router.place.wait_us");
        assert_eq!(recorded.len(), MAX_SAMPLES, "bounded between flushes");
        assert_eq!(recorded[..2], [650, 900]);
        m.flush(&on);
        assert_eq!(
            on.recorded("prefix_router.place.wait_us").len(),
            MAX_SAMPLES
        );
    }

    #[test]
    fn inflight_gauges_are_written_only_when_they_change() {
        let sink = Sink::default();
        let m = Meter::define(&settings(), &sink);
        m.inflight(&sink, "10.0.0.1:8000", 0);
        m.inflight(&sink, "10.0.0.1:8000", 0);
        m.inflight(&sink, "10.0.0.1:8000", 2);
        assert_eq!(sink.calls.get(), 2);
        assert_eq!(sink.value("prefix_router.inflight.10_0_0_1_8000"), 2);
        // Another family for the same pod is a gauge of its own.
        m.slowness(&sink, "10.0.0.1:8000", 3000);
        m.slowness(&sink, "10.0.0.1:8000", 3000);
        assert_eq!(sink.calls.get(), 3);
        assert_eq!(sink.value("prefix_router.slowness.10_0_0_1_8000"), 3000);
        assert_eq!(sink.value("prefix_router.inflight.10_0_0_1_8000"), 2);
    }

    #[test]
    fn pod_gauges_stop_at_their_bound() {
        let sink = Sink::default();
        let m = Meter::define(&settings(), &sink);
        for i in 0..MAX_POD_GAUGES + 10 {
            m.inflight(&sink, &format!("10.1.{}.{}:8000", i / 256, i % 256), 1);
        }
        assert_eq!(m.pod_gauges.borrow().defined, MAX_POD_GAUGES);
        assert_eq!(sink.value("prefix_router.inflight.10_1_0_0_8000"), 1);
        let defined = sink
            .names
            .borrow()
            .iter()
            .filter(|(_, n)| n.starts_with("prefix_router.inflight."))
            .count();
        assert_eq!(defined, MAX_POD_GAUGES, "past the bound: no gauge");
    }
}
