//! The singleton's sync loop under a fake clock: bridge calls answered by an
//! in-memory Redis (or failed), the probe answered with a chosen `run_id`,
//! Envoy's shared data and stats in the singleton's double.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::*;
use crate::route::table::{anchor_of, PrefixTable};
use crate::shared::registry::{NameRegistry, PodSlot};
use crate::sync::handoff::Touched;
use crate::sync::memredis::MemRedis;
use crate::sync::resp::{encode_command, parse, Frame};
use crate::testhost::FakeEnvoy;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// How the fake Redis behind the bridge answers.
#[derive(Clone, Copy, PartialEq)]
enum Redis {
    /// Answers everything; the probe with this run id.
    Up(&'static str),
    /// Every call times out.
    Down,
}

/// A loop under test: its host, the Redis behind the bridge and the clock.
struct Rig {
    host: FakeEnvoy,
    /// Calls answered so far.
    delivered: usize,
    redis: MemRedis,
    state: Redis,
    /// Cluster mode: the master every slot belongs to.
    owner: &'static str,
    clock: Rc<Cell<u64>>,
    settings: Rc<Settings>,
    sup: SyncSupervisor<FakeEnvoy>,
    /// When each probe was sent.
    probes_at: Vec<u64>,
}

const START_MS: u64 = 1_000_000;

fn rig(sync: &str) -> Rig {
    let json = format!(r#"{{"endpoints":["a:1","b:1"],"sync":{{"enabled":true{sync}}}}}"#);
    let settings = Rc::new(Settings::from_json(json.as_bytes()).unwrap());
    let host = FakeEnvoy::default();
    let members = crate::fleet::static_members(&host, &settings.static_pools(), 1, 100).unwrap();
    let view = Rc::new(RefCell::new(crate::fleet::FleetView::new(members)));
    let clock = Rc::new(Cell::new(START_MS));
    let c = clock.clone();
    let sup = SyncSupervisor::start(
        host.clone(),
        settings.clone(),
        view,
        Rc::new(move || c.get()),
        7,
        START_MS,
    )
    .unwrap();
    Rig {
        host,
        delivered: 0,
        redis: MemRedis::new(),
        state: Redis::Up("aaaa"),
        owner: "10.0.0.1:7000",
        clock,
        settings,
        sup,
        probes_at: Vec::new(),
    }
}

fn info_reply(run_id: &str) -> Vec<u8> {
    let info = format!("# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id}\r\n");
    format!("${}\r\n{info}\r\n+OK\r\n", info.len()).into_bytes()
}

impl Rig {
    /// One host tick at `now`, then every call answered as `state` says.
    fn tick(&mut self, now: u64) {
        self.clock.set(now);
        self.redis.set_now(now);
        self.sup.on_tick(now);
        self.deliver(now);
    }

    /// Ticks every 25 ms from the last tick up to `until` (inclusive).
    fn run_until(&mut self, until: u64) {
        let mut now = self.clock.get();
        while now + TICK_MS <= until {
            now += TICK_MS;
            self.tick(now);
        }
    }

    fn deliver(&mut self, now: u64) {
        while let Some(call) = self.host.sent().get(self.delivered).cloned() {
            self.delivered += 1;
            if call.is_probe() {
                self.probes_at.push(now);
            }
            let reply = match self.state {
                Redis::Down => Err(CallFailed::Timeout),
                Redis::Up(run_id) if call.is_probe() => Ok(info_reply(run_id)),
                Redis::Up(_) => Ok(self.execute(&call.body)),
            };
            assert!(self.sup.on_reply(call.token, now, |_| reply));
        }
    }

    /// One pipeline as Redis (or, in cluster mode, a one-master Redis
    /// Cluster owned by `owner`) answers it.
    fn execute(&mut self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        while !rest.is_empty() {
            let (frame, used) = parse(rest).unwrap();
            rest = &rest[used..];
            let Frame::Array(items) = frame else { panic!() };
            let args: Vec<&[u8]> = items.iter().map(|f| f.as_bytes().unwrap()).collect();
            if args[0].eq_ignore_ascii_case(b"CLUSTER") {
                let (host, port) = self.owner.rsplit_once(':').unwrap();
                Frame::Array(vec![Frame::Array(vec![
                    Frame::Integer(0),
                    Frame::Integer(16383),
                    Frame::Array(vec![
                        Frame::Bulk(host.as_bytes().to_vec()),
                        Frame::Integer(port.parse().unwrap()),
                        Frame::Bulk(b"id".to_vec()),
                    ]),
                ])])
                .encode(&mut out);
            } else {
                let mut one = Vec::new();
                encode_command(&mut one, &args);
                out.extend(self.redis.execute(&one));
            }
        }
        out
    }

    /// Runs until sync has succeeded once (healthy, polls allowed).
    fn until_synced(&mut self) {
        let deadline = self.clock.get() + 10 * self.settings.sync.period_ms;
        while self.sup.engine.stats().last_success_ms.is_none() {
            assert!(self.clock.get() < deadline, "sync never succeeded");
            let now = self.clock.get() + TICK_MS;
            self.tick(now);
        }
    }

    /// Runs until sync fails (backing off).
    fn until_failing(&mut self) {
        let deadline = self.clock.get() + 10 * self.settings.sync.period_ms;
        while !self.sup.engine.failing() {
            assert!(self.clock.get() < deadline, "sync never failed");
            let now = self.clock.get() + TICK_MS;
            self.tick(now);
        }
    }

    /// Probes sent after `from`.
    fn probes_since(&self, from: u64) -> Vec<u64> {
        self.probes_at
            .iter()
            .copied()
            .filter(|&t| t > from)
            .collect()
    }

    /// Records `blocks` for model "m" on pod 0 in the local table, as a
    /// worker does.
    fn record(&self, blocks: &[u64]) {
        let own: Vec<(u64, u32)> = blocks.iter().map(|&b| (b, anchor_of(b))).collect();
        let now = u32::try_from(self.clock.get() / 1000).unwrap();
        let (slots, _) = NameRegistry::models(&self.host)
            .intern(&["m"], now, 100)
            .unwrap();
        PrefixTable::new(&self.host, self.settings.table_config()).record(
            &own,
            slots[0].unwrap(),
            PodSlot::new(0),
            now,
        );
    }

    /// Blocks in Redis's prefix-cache namespace.
    fn blocks_in_redis(&self) -> usize {
        self.redis.keys("*{prefixcache}:e:*").len()
    }

    fn dirty(&self) -> usize {
        self.sup.prefix.borrow().dirty_len()
    }

    /// The value of stat `prefix_router.sync.<name>`.
    fn stat(&self, name: &str) -> i64 {
        self.host.stat(&format!("prefix_router.sync.{name}"))
    }

    fn heartbeat(&self) -> Option<Heartbeat> {
        let (value, _) = self.host.get(liveness::KEY).unwrap();
        Heartbeat::decode(&value?)
    }

    /// The placement node key: its value and cas.
    fn place_node(&self) -> (Option<String>, Option<u32>) {
        let (value, cas) = self.host.get(place::NODE_KEY).unwrap();
        (value.map(|v| String::from_utf8(v).unwrap()), cas)
    }
}

#[test]
fn the_first_probe_goes_at_once_then_every_30_s_while_healthy() {
    let mut r = rig("");
    r.tick(START_MS);
    assert_eq!(r.probes_at, vec![START_MS]);
    r.until_synced();
    let from = r.clock.get();
    r.run_until(START_MS + 95_000);
    assert!(!r.sup.engine.failing());
    assert_eq!(
        r.probes_since(from),
        vec![START_MS + 30_000, START_MS + 60_000, START_MS + 90_000]
    );
    assert_eq!(r.stat("probes"), 4);
}

#[test]
fn while_sync_backs_off_redis_is_probed_every_2_s() {
    let mut r = rig("");
    r.state = Redis::Down;
    r.tick(START_MS);
    r.until_failing();
    let from = r.clock.get();
    r.run_until(from + 10_000);
    let probes = r.probes_since(from);
    assert!(probes.len() >= 4, "{probes:?}");
    for pair in probes.windows(2) {
        assert_eq!(pair[1] - pair[0], PROBE_FAILING_MS, "{probes:?}");
    }
}

#[test]
fn a_probe_answer_while_backing_off_starts_the_next_cycle_at_once() {
    let mut r = rig("");
    r.state = Redis::Down;
    r.tick(START_MS);
    r.until_failing();
    // Two failed cycles: the backoff is now well past a probe interval.
    let failed = r.sup.engine.stats().cycles_failed;
    r.run_until(r.clock.get() + 2 * r.settings.sync.period_ms);
    assert!(r.sup.engine.stats().cycles_failed > failed);
    assert!(r.sup.engine.stats().backoff_ms > PROBE_FAILING_MS + TICK_MS);
    r.state = Redis::Up("aaaa");
    let back = r.clock.get();
    // The next probe (within 2 s) answers, and the cycle follows at the next tick.
    r.run_until(back + PROBE_FAILING_MS + 2 * TICK_MS);
    let success = r
        .sup
        .engine
        .stats()
        .last_success_ms
        .expect("a cycle succeeded");
    assert!(success <= back + PROBE_FAILING_MS + 2 * TICK_MS);
}

#[test]
fn a_changed_run_id_re_marks_the_whole_table_once() {
    let mut r = rig("");
    r.tick(START_MS);
    r.record(&[11, 12, 13]);
    r.until_synced();
    // Recorded, never handed off: not pushed.
    assert_eq!((r.dirty(), r.blocks_in_redis()), (0, 0));
    // Same run id on the next probe: nothing to re-push.
    r.run_until(START_MS + 30_000);
    assert_eq!(r.stat("redis_restarts"), 0);
    assert_eq!((r.dirty(), r.blocks_in_redis()), (0, 0));
    // Redis restarted: the whole table is marked once, and pushed.
    r.state = Redis::Up("bbbb");
    r.run_until(START_MS + 60_000);
    assert_eq!(r.stat("redis_restarts"), 1);
    assert_eq!(r.dirty(), 3);
    r.run_until(START_MS + 60_000 + 2 * r.settings.sync.period_ms);
    assert_eq!((r.dirty(), r.blocks_in_redis()), (0, 3));
    // The same new run id again: no second restart.
    r.run_until(START_MS + 90_000);
    assert_eq!(r.stat("redis_restarts"), 1);
}

#[test]
fn the_restart_marks_every_live_block_for_the_next_push() {
    let mut r = rig("");
    r.tick(START_MS);
    r.until_synced();
    r.record(&[21, 22]);
    assert_eq!(r.dirty(), 0, "recorded, not handed off");
    r.sup
        .on_probe_reply(Some(&info_reply("cccc")), 2, r.clock.get());
    assert_eq!(r.dirty(), 2);
    assert_eq!(r.stat("redis_restarts"), 1);
}

#[test]
fn restart_detection_is_off_in_cluster_mode() {
    for (cluster, restarts) in [("", 1), (r#","cluster":true"#, 0)] {
        let mut r = rig(cluster);
        r.tick(START_MS);
        r.until_synced();
        r.state = Redis::Up("bbbb");
        r.run_until(START_MS + 31_000);
        assert_eq!(r.stat("redis_restarts"), restarts, "{cluster}");
    }
    let mut w = RestartWatch::default();
    assert!(
        !w.restarted("a".into(), false),
        "the first run id is no restart"
    );
    assert!(!w.restarted("a".into(), false));
    assert!(w.restarted("b".into(), false));
    assert!(!w.restarted("c".into(), true));
    assert!(!w.restarted("c".into(), false));
}

#[test]
fn one_probe_at_a_time_and_a_refused_one_waits_out_its_interval() {
    let mut s = ProbeSchedule::default();
    let t = START_MS;
    assert!(s.due(t, false), "the first goes at once");
    s.sent(9, 2);
    // In flight: none other, however long it takes.
    assert!(!s.due(t + 100_000, true));
    assert_eq!(s.answered(8), None, "another call's token");
    assert_eq!(s.answered(9), Some(2));
    assert_eq!(s.answered(9), None, "answered once");
    assert!(!s.due(t + PROBE_HEALTHY_MS - 1, false));
    let t = t + PROBE_HEALTHY_MS;
    assert!(s.due(t, false));
    // Refused by the host (never sent): the next waits 2 s even so.
    assert!(!s.due(t + PROBE_FAILING_MS - 1, true));
    assert!(s.due(t + PROBE_FAILING_MS, true));
}

#[test]
fn refused_calls_fail_the_cycle_and_count_no_probe() {
    let mut r = rig("");
    r.host.0.refuse.set(true);
    r.tick(START_MS);
    r.run_until(START_MS + r.settings.sync.period_ms);
    assert!(r.sup.engine.failing());
    assert!(r.sup.engine.stats().cycles_failed > 0);
    assert_eq!(r.stat("probes"), 0);
    assert!(r.host.sent().is_empty());
}

#[test]
fn the_heartbeat_is_written_every_500_ms_with_start_and_last_success() {
    let mut r = rig("");
    r.tick(START_MS);
    let hb = r.heartbeat().unwrap();
    assert_eq!(
        (hb.started_ms, hb.tick_ms, hb.success_ms),
        (START_MS, START_MS, 0)
    );
    r.run_until(START_MS + liveness::WRITE_EVERY_MS - TICK_MS);
    assert_eq!(
        r.heartbeat().unwrap().tick_ms,
        START_MS,
        "not rewritten yet"
    );
    r.run_until(START_MS + liveness::WRITE_EVERY_MS);
    assert_eq!(
        r.heartbeat().unwrap().tick_ms,
        START_MS + liveness::WRITE_EVERY_MS
    );
    r.until_synced();
    let success = r.sup.engine.stats().last_success_ms.unwrap();
    r.run_until(r.clock.get() + liveness::WRITE_EVERY_MS);
    assert_eq!(r.heartbeat().unwrap().success_ms, success);
}

#[test]
fn sync_failing_is_alarmed_once_per_streak() {
    let mut a = FailingAlarm::default();
    let alarm = 30_000;
    // Started at 1000, never succeeded: alarmed past 30 s, once.
    assert_eq!(a.on_beat(31_000, 0, 0, 1_000, alarm), None);
    assert_eq!(a.on_beat(31_001, 0, 0, 1_000, alarm), Some(30_001));
    assert_eq!(a.on_beat(90_000, 0, 0, 1_000, alarm), None);
    // A success rearms it; the next streak counts from that success.
    assert_eq!(a.on_beat(91_000, 91_000, 0, 1_000, alarm), None);
    assert_eq!(a.on_beat(121_000, 91_000, 91_000, 1_000, alarm), None);
    assert_eq!(
        a.on_beat(121_001, 91_000, 91_000, 1_000, alarm),
        Some(30_001)
    );
}

#[test]
fn the_alarm_waits_three_periods_when_they_are_longer_than_30_s() {
    let mut r = rig(r#","period_ms":20000"#);
    r.state = Redis::Down;
    r.tick(START_MS);
    r.run_until(START_MS + 40_000);
    assert!(!r.sup.alarm.logged, "not before 60 s");
    r.run_until(START_MS + 60_025);
    assert!(r.sup.alarm.logged);
}

#[test]
fn the_place_node_is_written_when_the_slot_owner_changes_only() {
    let mut r = rig(r#","cluster":true"#);
    r.tick(START_MS);
    // No slot map yet: nothing to name (the key stays unwritten).
    assert_eq!(r.place_node(), (None, None));
    r.until_synced();
    let (node, cas) = r.place_node();
    assert_eq!(node.as_deref(), Some("10.0.0.1:7000"));
    // More cycles with the same owner: never rewritten.
    r.run_until(r.clock.get() + 5 * r.settings.sync.period_ms);
    assert_eq!(r.place_node(), (node, cas));
    // The slot moved: the next cycle's map names the new master.
    r.owner = "10.0.0.2:7000";
    r.run_until(r.clock.get() + 2 * r.settings.sync.period_ms);
    assert_eq!(r.place_node().0.as_deref(), Some("10.0.0.2:7000"));

    let mut p = PlaceNode::default();
    assert_eq!(p.changed(None), None, "nothing known, nothing written");
    assert_eq!(p.changed(Some("n1")).as_deref(), Some("n1"));
    assert_eq!(
        p.changed(Some("n1")).as_deref(),
        Some("n1"),
        "until written"
    );
    p.written(Some("n1"));
    assert_eq!(p.changed(Some("n1")), None);
    assert_eq!(
        p.changed(None).as_deref(),
        Some(""),
        "a lost map empties it"
    );
}

#[test]
fn no_place_node_outside_cluster_mode_or_without_place_new() {
    for sync in ["", r#","cluster":true,"place_new":false"#] {
        let mut r = rig(sync);
        r.tick(START_MS);
        r.until_synced();
        r.run_until(r.clock.get() + 2 * r.settings.sync.period_ms);
        assert_eq!(r.place_node(), (None, None), "{sync}");
    }
}

#[test]
fn handed_off_blocks_are_marked_and_garbage_is_dropped() {
    let mut r = rig("");
    r.sup.on_handoff(&handoff::encode(&Touched {
        model: 0,
        pod: PodSlot::new(0),
        time: 1,
        blocks: vec![(5, anchor_of(5)), (6, anchor_of(6))],
    }));
    assert_eq!(r.dirty(), 2);
    r.sup.on_handoff(b"short");
    assert_eq!(r.dirty(), 2);
}

#[test]
fn no_sync_no_loop_and_a_stopped_loop_sends_nothing() {
    let settings = Rc::new(Settings::from_json(br#"{"endpoints":["a:1"]}"#).unwrap());
    let host = FakeEnvoy::default();
    let view = Rc::new(RefCell::new(crate::fleet::FleetView::new(
        crate::fleet::static_members(&host, &settings.static_pools(), 1, 100).unwrap(),
    )));
    let clock: Clock = Rc::new(|| START_MS);
    assert!(SyncSupervisor::start(host, settings, view, clock, 7, START_MS).is_none());

    let mut r = rig("");
    r.tick(START_MS);
    r.sup.stop();
    r.run_until(START_MS + 5 * r.settings.sync.period_ms);
    let stats = r.sup.engine.stats();
    assert_eq!((stats.calls_sent, stats.cycles_ok), (0, 0));
}
