//! One replica under observation: started fresh, sent prompts, read at an
//! instant (the meter, Redis, the filter's counters, Envoy's CPU), and the
//! differences between two readings.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::setup::{
    CompatCostArgs, Mode, AIBRIX_PODS, CHAT_PATH, DEADLINE, MODEL, PODS, PUSH, QUIET_DEADLINE,
};
use crate::procstat::cpu_sample;
use crate::redis_meter::{Counts, RedisMeter};
use harness::aibrix::{prefix_text, AibrixReader};
use harness::fleet::{Fleet, Replica};
use harness::redis::{Conn, Resp};
use serde_json::json;

/// Everything read at one instant.
#[derive(Clone, Debug, Default)]
pub(super) struct Snapshot {
    pub(super) meter: Counts,
    pub(super) redis: BTreeMap<String, f64>,
    pub(super) dbsize: i64,
    pub(super) stats: BTreeMap<String, i64>,
    pub(super) cpu: Duration,
}

/// A fresh replica of `mode` on a flushed Redis, ready: all pods healthy and
/// one good cycle done. Returns Redis's `used_memory` when empty.
pub(super) fn start_replica(
    fleet: &mut Fleet,
    meter: &RedisMeter,
    redis: &mut Conn,
    mode: Mode,
    args: &CompatCostArgs,
) -> f64 {
    while !fleet.replicas.is_empty() {
        fleet.stop_envoy(0);
    }
    // Fresh pods too (same ports, so the EDS file holds): podsim exits after
    // a fixed lifetime.
    fleet.pods.clear();
    fleet.start_pods(&["--time-scale", "0"]);
    redis.command(&[b"FLUSHALL"]);
    let empty = redis_info(redis).get("used_memory").copied().unwrap_or(0.0);
    // The launcher renders envoy/eds/aibrix-pods.yaml onto the fleet's pods.
    let spec = fleet
        .spec(mode.name(), "aibrix.yaml")
        .redis(meter.port)
        .patch(move |c| mode.patch(args, c));
    let i = fleet.launch(spec);
    let r = &fleet.replicas[i];
    let ready = harness::wait_until(DEADLINE, || {
        r.stat("prefix_router.membership.healthy") == PODS && r.cycles_done() >= 1
    });
    assert!(ready, "{} replica not ready: {:?}", mode.name(), r.stats());
    empty
}

pub(super) fn snapshot(replica: &Replica, meter: &RedisMeter, redis: &mut Conn) -> Snapshot {
    Snapshot {
        meter: meter.snapshot(),
        redis: redis_info(redis),
        dbsize: match redis.command(&[b"DBSIZE"]) {
            Resp::Int(n) => n,
            other => panic!("DBSIZE: {other:?}"),
        },
        stats: replica.stats(),
        cpu: cpu_sample(replica.pid).sched,
    }
}

/// Numeric fields of Redis `INFO` (all default sections).
pub(super) fn redis_info(redis: &mut Conn) -> BTreeMap<String, f64> {
    let reply = redis.command(&[b"INFO"]);
    let text = reply
        .bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse::<f64>().ok()?)))
        .collect()
}

/// Waits for the next finished cycle; returns the count.
pub(super) fn next_cycle(replica: &Replica) -> i64 {
    let start = replica.cycles_done();
    let mut now = start;
    harness::wait_until(DEADLINE, || {
        now = replica.cycles_done();
        now > start
    });
    now
}

/// Waits until the push of what was sent is over: at least two cycles
/// finished and no prompt block was written over the last one (`sync.pushed`
/// also counts the podload entity, written every cycle: the meter tells them
/// apart). Returns whether that happened before the deadline, which stays
/// below the keys' 120 s TTL.
pub(super) fn wait_quiet(replica: &Replica, meter: &RedisMeter) -> bool {
    let deadline = Instant::now() + QUIET_DEADLINE;
    let pushed = || meter.snapshot().class(PUSH).commands;
    next_cycle(replica);
    let mut before = pushed();
    while Instant::now() < deadline {
        next_cycle(replica);
        let after = pushed();
        if after == before {
            return true;
        }
        before = after;
    }
    false
}

/// A chat body whose single user message is `len` bytes, distinct from every
/// other prompt of the run from its first 4 bytes on.
pub(super) fn chat(id: u64, len: usize) -> String {
    let lead = format!("{:04x} ", id % 0x1_0000);
    let content = format!("{lead}{}", harness::text(id, len - lead.len()));
    json!({
        "model": MODEL,
        "messages": [{ "role": "user", "content": content }],
        "max_tokens": 8,
    })
    .to_string()
}

/// Sends `n` new prompts of `kib` KiB; returns their bodies.
pub(super) fn send_prompts(
    replica: &Replica,
    n: usize,
    kib: usize,
    next_id: &mut u64,
) -> Vec<String> {
    let mut bodies = Vec::with_capacity(n);
    for _ in 0..n {
        let body = chat(*next_id, kib * 1024);
        *next_id += 1;
        let reply = harness::send(
            "POST",
            &replica.envoy.url(CHAT_PATH),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
            harness::CLIENT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("POST: {e}"));
        assert_eq!(reply.status, 200, "POST: {}", reply.body);
        bodies.push(body);
    }
    bodies
}

/// What an AIBrix gateway's lookup finds in Redis for each prompt (the
/// oracle of tools/harness/src/aibrix/): the share of its blocks matched on
/// the pod found, in percent.
pub(super) fn aibrix_lookups(redis_port: u16, bodies: &[String]) -> Vec<f64> {
    let reader = AibrixReader::new(redis_port);
    let pods: Vec<&str> = AIBRIX_PODS.to_vec();
    bodies
        .iter()
        .map(|body| {
            let text = prefix_text(CHAT_PATH, body).expect("AIBrix renders the chat body");
            match reader.lookup(MODEL, &text, &pods) {
                Some((_, matched, total)) => 100.0 * matched as f64 / total.max(1) as f64,
                None => 0.0,
            }
        })
        .collect()
}

/// `prefix_router_route_time_us` sum and count from `/stats/prometheus`
/// (cumulative as of Envoy's last stats flush).
pub(super) fn route_time(replica: &Replica) -> (f64, f64) {
    let url = replica
        .envoy
        .admin_url("/stats/prometheus?filter=route_time_us");
    let body = harness::get(&url).map(|r| r.body).unwrap_or_default();
    let field = |suffix: &str| -> f64 {
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' '))
            .filter(|(name, _)| {
                let name = name.split('{').next().unwrap_or(name);
                name.ends_with(&format!("route_time_us_{suffix}"))
            })
            .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
            .sum()
    };
    (field("sum"), field("count"))
}

pub(super) fn counter_deltas(
    now: &BTreeMap<String, i64>,
    then: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    now.iter()
        .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
        .filter(|(k, d)| *d != 0 && !k.contains("inflight") && !k.ends_with("_age_s"))
        .collect()
}

pub(super) fn info_deltas(
    now: &BTreeMap<String, f64>,
    then: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    [
        "total_commands_processed",
        "total_net_input_bytes",
        "total_net_output_bytes",
        "total_connections_received",
        "used_memory",
        "expired_keys",
        "evicted_keys",
    ]
    .iter()
    .map(|k| {
        let d = now.get(*k).copied().unwrap_or(0.0) - then.get(*k).copied().unwrap_or(0.0);
        (k.to_string(), d)
    })
    .collect()
}
