//! The two measurements: per (mode, size), what pushing new prompts costs
//! per prompt; per mode, what holding the namespace costs per idle cycle.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::replica::{
    aibrix_lookups, counter_deltas, info_deltas, next_cycle, route_time, send_prompts, snapshot,
    start_replica, wait_quiet,
};
use super::setup::{CompatCostArgs, Mode, PUSH};
use crate::redis_meter::{Counts, RedisMeter, Traffic};
use harness::fleet::Fleet;
use harness::redis::Conn;

/// Per prompt, one (mode, size) cell.
#[derive(Clone, Debug, Serialize)]
pub(super) struct PushCell {
    pub(super) mode: Mode,
    pub(super) kib: usize,
    pub(super) prompts: usize,
    pub(super) keys_per_prompt: f64,
    /// Blocks the mode records for one prompt: the keys expected.
    pub(super) expected_keys: usize,
    /// Calls of class `write prefixcache`, per prompt.
    pub(super) push: PerPrompt,
    /// Every call of the replica in the window, per prompt.
    pub(super) window: PerPrompt,
    pub(super) window_cycles: i64,
    pub(super) window_s: f64,
    pub(super) used_memory_per_prompt: f64,
    pub(super) route_time_us_mean: Option<f64>,
    /// Compat only: per prompt, the percent of its blocks an AIBrix
    /// gateway's lookup matches in Redis after the push.
    pub(super) aibrix_match_percent: Option<Vec<f64>>,
    /// `sync.pushed` per prompt (entities written).
    pub(super) pushed_per_prompt: f64,
    pub(super) quiet: bool,
    /// Meter deltas of the window, by class and command.
    pub(super) meter: Counts,
    /// The filter's `prefix_router.*` counter deltas that moved.
    pub(super) stats: BTreeMap<String, i64>,
    /// Redis `INFO` deltas (our own INFO and DBSIZE probes included).
    pub(super) redis: BTreeMap<String, f64>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct PerPrompt {
    pub(super) calls: f64,
    pub(super) commands: f64,
    pub(super) bytes_in: f64,
    pub(super) bytes_out: f64,
}

impl PerPrompt {
    pub(super) fn of(t: &Traffic, n: f64) -> PerPrompt {
        PerPrompt {
            calls: t.calls as f64 / n,
            commands: t.commands as f64 / n,
            bytes_in: t.bytes_in as f64 / n,
            bytes_out: t.bytes_out as f64 / n,
        }
    }
}

/// Steady state of one mode.
#[derive(Clone, Debug, Serialize)]
pub(super) struct SteadyCell {
    pub(super) mode: Mode,
    pub(super) prompts: usize,
    pub(super) kib: usize,
    pub(super) keys: i64,
    /// Redis `used_memory` above that of the empty server.
    pub(super) used_memory: f64,
    pub(super) quiet: bool,
    /// Mean per cycle (the cycle and the polls since the previous one).
    pub(super) per_cycle: PerPrompt,
    pub(super) envoy_cpu_ms_per_cycle: f64,
    pub(super) seconds_per_cycle: f64,
    pub(super) cycles: Vec<Counts>,
    /// The filter's counter deltas over the observed cycles.
    pub(super) stats: BTreeMap<String, i64>,
    /// The filter's counter deltas while the prompts were sent and pushed.
    pub(super) load_stats: BTreeMap<String, i64>,
    /// Blocks the prompts asked to record (all distinct).
    pub(super) blocks: usize,
    /// Redis `INFO` deltas over the observed cycles (our probes included).
    pub(super) redis: BTreeMap<String, f64>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn push_cell(
    fleet: &mut Fleet,
    meter: &RedisMeter,
    redis: &mut Conn,
    mode: Mode,
    kib: usize,
    args: &CompatCostArgs,
    next_id: &mut u64,
) -> PushCell {
    start_replica(fleet, meter, redis, mode, args);
    let r = &fleet.replicas[0];
    next_cycle(r);
    let (sum0, count0) = route_time(r);
    let s0 = snapshot(r, meter, redis);
    let c0 = r.cycles_done();
    let t0 = Instant::now();
    let bodies = send_prompts(r, args.prompts, kib, next_id);
    let quiet = wait_quiet(r, meter);
    let s1 = snapshot(r, meter, redis);
    let window_s = t0.elapsed().as_secs_f64();
    let aibrix = (mode == Mode::Compat).then(|| aibrix_lookups(fleet.redis_port, &bodies));
    let window_cycles = r.cycles_done() - c0;
    // Histograms reach the admin after a stats flush (every 5 s); the
    // filter times one routed request in SAMPLE_EVERY per worker.
    let n = args.prompts as f64;
    let sampled = (n / f64::from(envoy_prefix_router::route::meter::SAMPLE_EVERY)).floor();
    let mut rt = route_time(r);
    harness::wait_until(Duration::from_secs(15), || {
        rt = route_time(r);
        rt.1 - count0 >= sampled.max(1.0)
    });
    let routed = rt.1 - count0;
    let d = s1.meter.since(&s0.meter);
    let redis_d = info_deltas(&s1.redis, &s0.redis);
    let stats = counter_deltas(&s1.stats, &s0.stats);
    PushCell {
        mode,
        kib,
        prompts: args.prompts,
        keys_per_prompt: (s1.dbsize - s0.dbsize) as f64 / n,
        expected_keys: mode.recorded(kib * 1024),
        push: PerPrompt::of(&d.class(PUSH), n),
        window: PerPrompt::of(&d.total(), n),
        window_cycles,
        window_s,
        used_memory_per_prompt: redis_d["used_memory"] / n,
        route_time_us_mean: (routed > 0.0).then(|| (rt.0 - sum0) / routed),
        aibrix_match_percent: aibrix,
        pushed_per_prompt: stats.get("prefix_router.sync.pushed").copied().unwrap_or(0) as f64 / n,
        quiet,
        meter: d,
        stats,
        redis: redis_d,
    }
}

pub(super) fn steady_cell(
    fleet: &mut Fleet,
    meter: &RedisMeter,
    redis: &mut Conn,
    mode: Mode,
    args: &CompatCostArgs,
    next_id: &mut u64,
) -> SteadyCell {
    let empty = start_replica(fleet, meter, redis, mode, args);
    let r = &fleet.replicas[0];
    let before = r.stats();
    send_prompts(r, args.steady_prompts, args.steady_kib, next_id);
    let quiet = wait_quiet(r, meter);
    let mut last = snapshot(r, meter, redis);
    let load_stats = counter_deltas(&last.stats, &before);
    let first = last.clone();
    let t0 = Instant::now();
    let mut cycles = Vec::new();
    for _ in 0..args.steady_cycles.max(1) {
        next_cycle(r);
        let now = snapshot(r, meter, redis);
        cycles.push(now.meter.since(&last.meter));
        last = now;
    }
    let n = cycles.len() as f64;
    let total = last.meter.since(&first.meter).total();
    SteadyCell {
        mode,
        prompts: args.steady_prompts,
        kib: args.steady_kib,
        keys: last.dbsize,
        used_memory: last.redis.get("used_memory").copied().unwrap_or(0.0) - empty,
        quiet,
        per_cycle: PerPrompt::of(&total, n),
        envoy_cpu_ms_per_cycle: last.cpu.saturating_sub(first.cpu).as_secs_f64() * 1000.0 / n,
        seconds_per_cycle: t0.elapsed().as_secs_f64() / n,
        cycles,
        stats: counter_deltas(&last.stats, &first.stats),
        load_stats,
        blocks: args.steady_prompts * mode.recorded(args.steady_kib * 1024),
        redis: info_deltas(&last.redis, &first.redis),
    }
}
