//! `prefix-bench compat-cost`: what `"compat": "aibrix"` costs in Redis
//! against the filter's native mode, measured on real processes: one Envoy
//! replica on `envoy/aibrix.yaml` (EDS pods named by hostname, the Redis
//! bridge), podsim pods and redis-server.
//!
//! - native: the same YAML with `compat` and `block_size` removed from the
//!   plugin JSON, so the defaults hold: 128-byte blocks, 32 dense blocks then
//!   8 per doubling, change log with a full scan every 6 cycles, polls.
//! - compat: the YAML as shipped: 4-byte blocks, every block up to 4096
//!   recorded, a full SCAN+MGET of the namespace every cycle.
//!
//! Both run with the same sync period. Envoy's Redis cluster points at a
//! [`RedisMeter`], which relays to redis-server and counts every bridge call
//! by class (`write prefixcache` = the push of prompt blocks; `read ...` =
//! pulls; `... podload` = the replica's load entity) and direction.
//!
//! 1. New prompts: per (mode, size) a fresh replica on a flushed Redis; after
//!    one cycle, N distinct chat prompts (one user message of the size) are
//!    sent, then the run waits until the push is over (two cycles since the
//!    last prompt, no prompt-block write over the last one). Per prompt:
//!    keys created (DBSIZE), the push's calls, commands and bytes, Redis
//!    `used_memory`, the filter's mean `route_time_us`, and (compat) how much
//!    of each prompt an AIBrix gateway's lookup finds in Redis; then
//!    everything the replica exchanged with Redis during that window (pulls
//!    included), beside Redis's own `INFO` count.
//! 2. Holding the namespace: a fresh replica on a flushed Redis gets P prompts
//!    of K KiB; once their push is over, C idle cycles are observed: what one
//!    replica sends and receives per cycle just to keep the namespace in view.
//!
//! No timing is asserted; waits are deadlines.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use envoy_prefix_router::config::{AIBRIX_BLOCK_SIZE, AIBRIX_DENSE_BLOCKS};
use envoy_prefix_router::route::router::sampled_positions;

use crate::procstat::cpu_sample;
use crate::redis_meter::{Counts, RedisMeter, Traffic};
use crate::report::{num, write_json_in, Table};
use harness::aibrix::{prefix_text, AibrixReader};
use harness::fleet::{Fleet, Replica};
use harness::redis::{Conn, Resp};

/// The model every request names.
const MODEL: &str = "llama-3-8b-instruct";
/// Pods in the EDS file (`envoy/eds/aibrix-pods.yaml`), by hostname.
const AIBRIX_PODS: [&str; 4] = [
    "vllm-llama-a",
    "vllm-llama-b",
    "vllm-llama-c",
    "vllm-llama-d",
];
const PODS: i64 = AIBRIX_PODS.len() as i64;
const CHAT_PATH: &str = "/v1/chat/completions";
/// Deadline for anything that takes a few sync periods.
const DEADLINE: Duration = Duration::from_secs(60);
/// Longest wait for a push to be over.
const QUIET_DEADLINE: Duration = Duration::from_secs(90);
/// The meter's class of the calls that write prompt blocks.
const PUSH: &str = "write prefixcache";

#[derive(Clone, Debug)]
pub struct CompatCostArgs {
    /// Distinct prompts per size.
    pub prompts: usize,
    /// Prompt sizes, KiB.
    pub sizes_kib: Vec<usize>,
    /// Prompts loaded before the steady-state cycles.
    pub steady_prompts: usize,
    /// Their size, KiB.
    pub steady_kib: usize,
    /// Idle cycles observed in steady state.
    pub steady_cycles: usize,
    /// Sync period of both modes, ms.
    pub period_ms: u64,
    /// `table_capacity_blocks` of both modes; None keeps the default.
    pub table_capacity_blocks: Option<u32>,
    /// Where the JSON goes; None = `results/`.
    pub results_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Native,
    Compat,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Compat => "compat",
        }
    }

    /// Block size and dense prefix of this mode (the defaults).
    fn blocks(self) -> (usize, usize) {
        match self {
            Mode::Native => (128, 32),
            Mode::Compat => (AIBRIX_BLOCK_SIZE, AIBRIX_DENSE_BLOCKS as usize),
        }
    }

    /// Blocks recorded (so keys written) for a prompt of `len` bytes.
    fn recorded(self, len: usize) -> usize {
        let (size, dense) = self.blocks();
        sampled_positions(len / size, dense).len()
    }

    /// The plugin JSON of this mode, from envoy/aibrix.yaml's.
    fn patch(self, args: &CompatCostArgs, config: &mut Value) {
        if let Some(sync) = config.get_mut("sync").filter(|s| s.is_object()) {
            sync["period_ms"] = json!(args.period_ms);
            // The table's sync alone: placement's calls (one per new prompt)
            // are not part of what this counts.
            sync["place_new"] = json!(false);
        }
        if let Some(capacity) = args.table_capacity_blocks {
            config["table_capacity_blocks"] = json!(capacity);
        }
        if self == Mode::Native {
            if let Some(obj) = config.as_object_mut() {
                obj.remove("compat");
                obj.remove("block_size");
            }
        }
    }
}

/// Everything read at one instant.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    meter: Counts,
    redis: BTreeMap<String, f64>,
    dbsize: i64,
    stats: BTreeMap<String, i64>,
    cpu: Duration,
}

/// Per prompt, one (mode, size) cell.
#[derive(Clone, Debug, Serialize)]
struct PushCell {
    mode: Mode,
    kib: usize,
    prompts: usize,
    keys_per_prompt: f64,
    /// Blocks the mode records for one prompt: the keys expected.
    expected_keys: usize,
    /// Calls of class `write prefixcache`, per prompt.
    push: PerPrompt,
    /// Every call of the replica in the window, per prompt.
    window: PerPrompt,
    window_cycles: i64,
    window_s: f64,
    used_memory_per_prompt: f64,
    route_time_us_mean: Option<f64>,
    /// Compat only: per prompt, the percent of its blocks an AIBrix
    /// gateway's lookup matches in Redis after the push.
    aibrix_match_percent: Option<Vec<f64>>,
    /// `sync.pushed` per prompt (entities written).
    pushed_per_prompt: f64,
    quiet: bool,
    /// Meter deltas of the window, by class and command.
    meter: Counts,
    /// The filter's `prefix_router.*` counter deltas that moved.
    stats: BTreeMap<String, i64>,
    /// Redis `INFO` deltas (our own INFO and DBSIZE probes included).
    redis: BTreeMap<String, f64>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
struct PerPrompt {
    calls: f64,
    commands: f64,
    bytes_in: f64,
    bytes_out: f64,
}

impl PerPrompt {
    fn of(t: &Traffic, n: f64) -> PerPrompt {
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
struct SteadyCell {
    mode: Mode,
    prompts: usize,
    kib: usize,
    keys: i64,
    /// Redis `used_memory` above that of the empty server.
    used_memory: f64,
    quiet: bool,
    /// Mean per cycle (the cycle and the polls since the previous one).
    per_cycle: PerPrompt,
    envoy_cpu_ms_per_cycle: f64,
    seconds_per_cycle: f64,
    cycles: Vec<Counts>,
    /// The filter's counter deltas over the observed cycles.
    stats: BTreeMap<String, i64>,
    /// The filter's counter deltas while the prompts were sent and pushed.
    load_stats: BTreeMap<String, i64>,
    /// Blocks the prompts asked to record (all distinct).
    blocks: usize,
    /// Redis `INFO` deltas over the observed cycles (our probes included).
    redis: BTreeMap<String, f64>,
}

pub fn run(args: &CompatCostArgs) {
    let wall = Instant::now();
    println!(
        "prefix-bench compat-cost: native vs compat aibrix on envoy/aibrix.yaml, 1 replica, \
         {PODS} podsim pods, redis-server, sync period {} ms; {} chat prompts at each of {:?} \
         KiB; steady state after {} x {} KiB, {} cycles; table_capacity_blocks {}",
        args.period_ms,
        args.prompts,
        args.sizes_kib,
        args.steady_prompts,
        args.steady_kib,
        args.steady_cycles,
        args.table_capacity_blocks
            .map_or("default (200000 native, 2000000 compat)".into(), |c| c
                .to_string())
    );
    let load = crate::procstat::LoadMeter::start();
    let mut fleet = Fleet::new("bench-compat-cost");
    fleet.start_redis();
    fleet.start_pods(&["--time-scale", "0"]);
    let meter = RedisMeter::start(fleet.redis_port).expect("start the Redis meter");
    let mut redis = Conn::connect(fleet.redis_port);
    let mut next_id = 0u64;
    let mut pushes = Vec::new();
    let mut steady = Vec::new();
    for mode in [Mode::Native, Mode::Compat] {
        for &kib in &args.sizes_kib {
            let cell = push_cell(
                &mut fleet,
                &meter,
                &mut redis,
                mode,
                kib,
                args,
                &mut next_id,
            );
            println!(
                "  {} {kib} KiB: {:.1} keys/prompt, window {:.1} s, {} cycles{}",
                mode.name(),
                cell.keys_per_prompt,
                cell.window_s,
                cell.window_cycles,
                if cell.quiet { "" } else { " (NOT QUIET)" }
            );
            pushes.push(cell);
        }
        let cell = steady_cell(&mut fleet, &meter, &mut redis, mode, args, &mut next_id);
        println!(
            "  {} steady: {} keys, {:.0} commands/cycle{}",
            mode.name(),
            cell.keys,
            cell.per_cycle.commands,
            if cell.quiet { "" } else { " (NOT QUIET)" }
        );
        steady.push(cell);
    }
    drop(meter);
    drop(fleet);
    print_push(args, &pushes);
    print_steady(args, &steady);
    let load = load.finish();
    println!("{load}");
    let path = write_json_in(
        args.results_dir.as_deref(),
        "compat-cost",
        &json!({
            "load": load,
            "period_ms": args.period_ms,
            "table_capacity_blocks": args.table_capacity_blocks,
            "prompts": args.prompts,
            "sizes_kib": args.sizes_kib,
            "push": pushes,
            "steady": steady,
        }),
    );
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

/// A fresh replica of `mode` on a flushed Redis, ready: all pods healthy and
/// one good cycle done. Returns Redis's `used_memory` when empty.
fn start_replica(
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

fn snapshot(replica: &Replica, meter: &RedisMeter, redis: &mut Conn) -> Snapshot {
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
fn redis_info(redis: &mut Conn) -> BTreeMap<String, f64> {
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
fn next_cycle(replica: &Replica) -> i64 {
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
fn wait_quiet(replica: &Replica, meter: &RedisMeter) -> bool {
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
fn chat(id: u64, len: usize) -> String {
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
fn send_prompts(replica: &Replica, n: usize, kib: usize, next_id: &mut u64) -> Vec<String> {
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
/// oracle of tools/harness/src/aibrix.rs): the share of its blocks matched on
/// the pod found, in percent.
fn aibrix_lookups(redis_port: u16, bodies: &[String]) -> Vec<f64> {
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
fn route_time(replica: &Replica) -> (f64, f64) {
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

fn counter_deltas(
    now: &BTreeMap<String, i64>,
    then: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    now.iter()
        .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
        .filter(|(k, d)| *d != 0 && !k.contains("inflight") && !k.ends_with("_age_s"))
        .collect()
}

fn info_deltas(now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
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

#[allow(clippy::too_many_arguments)]
fn push_cell(
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

fn steady_cell(
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

/// `12,345`.
fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.round());
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    format!("{sign}{out}")
}

fn print_push(args: &CompatCostArgs, cells: &[PushCell]) {
    let mut t = Table::new(
        &format!(
            "New prompts: cost per prompt ({} distinct chat prompts per row; fresh replica and \
             Redis per row). push = the replica's calls that write prompt blocks (SETEX; + XADD \
             and EXPIRE of the change log in native). AIBrix lookup = the share of each prompt \
             an AIBrix gateway's in-order walk matches in Redis afterwards \
             (tools/harness/src/aibrix.rs), and how many prompts it finds whole",
            args.prompts
        ),
        &[
            "mode",
            "prompt",
            "keys (blocks to record)",
            "push calls",
            "push commands",
            "push bytes in",
            "push bytes out",
            "Redis memory",
            "route_time_us mean",
            "AIBrix lookup: mean % (whole)",
        ],
    );
    for c in cells {
        t.row(&[
            c.mode.name().to_string(),
            format!("{} KiB", c.kib),
            format!("{} ({})", num(c.keys_per_prompt, 1), c.expected_keys),
            num(c.push.calls, 1),
            thousands(c.push.commands),
            thousands(c.push.bytes_in),
            thousands(c.push.bytes_out),
            thousands(c.used_memory_per_prompt),
            c.route_time_us_mean.map_or("-".into(), |v| num(v, 0)),
            c.aibrix_match_percent.as_ref().map_or("-".into(), |m| {
                let mean = m.iter().sum::<f64>() / m.len().max(1) as f64;
                let whole = m.iter().filter(|&&p| p >= 100.0).count();
                format!("{} ({whole}/{})", num(mean, 1), m.len())
            }),
        ]);
    }
    t.print();
    let mut w = Table::new(
        "Same rows, everything the replica exchanged with Redis from the first prompt until the \
         push was over (pushes, pulls, polls, podload), per prompt; Redis INFO = \
         total_commands_processed over the same window (+2 commands of ours)",
        &[
            "mode",
            "prompt",
            "window s",
            "cycles",
            "calls",
            "commands",
            "bytes in",
            "bytes out",
            "Redis INFO commands",
        ],
    );
    for c in cells {
        w.row(&[
            c.mode.name().to_string(),
            format!("{} KiB", c.kib),
            num(c.window_s, 1),
            c.window_cycles.to_string(),
            num(c.window.calls, 1),
            thousands(c.window.commands),
            thousands(c.window.bytes_in),
            thousands(c.window.bytes_out),
            thousands(
                c.redis
                    .get("total_commands_processed")
                    .copied()
                    .unwrap_or(0.0)
                    / c.prompts.max(1) as f64,
            ),
        ]);
    }
    w.print();
}

fn print_steady(args: &CompatCostArgs, cells: &[SteadyCell]) {
    let mut t = Table::new(
        &format!(
            "Holding the namespace: per sync cycle of one idle replica (period {} ms; the cycle \
             plus the polls since the previous one), after {} prompts of {} KiB; mean of {} cycles. \
             Envoy CPU: the whole process (sync singleton, health checks, admin reads)",
            args.period_ms, args.steady_prompts, args.steady_kib, args.steady_cycles
        ),
        &[
            "mode",
            "keys in Redis (blocks to record)",
            "Redis memory (above empty)",
            "calls",
            "commands",
            "bytes in",
            "bytes out",
            "bytes/s in+out",
            "bytes in+out per key",
            "Envoy CPU ms",
            "s per cycle",
        ],
    );
    for c in cells {
        t.row(&[
            c.mode.name().to_string(),
            format!(
                "{} ({})",
                thousands(c.keys as f64),
                thousands(c.blocks as f64)
            ),
            thousands(c.used_memory),
            num(c.per_cycle.calls, 1),
            thousands(c.per_cycle.commands),
            thousands(c.per_cycle.bytes_in),
            thousands(c.per_cycle.bytes_out),
            thousands(
                (c.per_cycle.bytes_in + c.per_cycle.bytes_out) / c.seconds_per_cycle.max(1e-3),
            ),
            num(
                (c.per_cycle.bytes_in + c.per_cycle.bytes_out) / c.keys.max(1) as f64,
                1,
            ),
            num(c.envoy_cpu_ms_per_cycle, 1),
            num(c.seconds_per_cycle, 2),
        ]);
    }
    t.print();
}
