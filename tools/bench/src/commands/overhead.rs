//! `prefix-bench overhead`: what the filter adds to a request, measured side
//! by side against the same Envoy without it (envoy/plain.yaml, round robin),
//! both in front of the same pods answering at once (`--time-scale 0`).
//!
//! (a) Latency: 8 KB chat bodies, closed loop at concurrency 1 on a
//!     keep-alive connection, the two sides in alternating rounds (which side
//!     goes first alternates too) so drift hits both alike.
//! (b) CPU: Envoy's own CPU time (`/proc`, both Envoys run with
//!     `--concurrency 1`) over many 400 KB completions prompts per side, in
//!     alternating rounds; the difference per request is the filter's cost.
//!
//! A native (host, no wasm) timing of the filter's pure logic on the same
//! bodies is printed beside, to tell compute from wasm/host-call overhead.

use std::time::{Duration, Instant};

use envoy_prefix_router::config::Settings;
use envoy_prefix_router::request::{parse_body, ApiKind};
use envoy_prefix_router::rng::SplitMix64;
use envoy_prefix_router::router::Router;
use envoy_prefix_router::store::MemStore;
use serde_json::{json, Value};

use crate::fleet::Fleet;
use crate::percentiles::Summary;
use crate::procstat::{cpu_sample, CpuSample, LoadMeter};
use crate::report::{num, verdict, write_json, Table};
use crate::runner::{Outcome, Pacing, Runner};
use crate::workload::{
    completion_body, shared_prefix, Api, ApiMix, BodyOptions, Order, Request, SharedPrefix,
};

/// Targets of issue 2.
const TARGET_P50_US: f64 = 60.0;
const TARGET_P99_US: f64 = 250.0;
const TARGET_CPU_MS: f64 = 2.0;

/// Options of the overhead benchmark.
#[derive(Clone, Debug)]
pub struct OverheadArgs {
    /// 8 KB requests per side (after warmup).
    pub requests: usize,
    /// Alternating rounds the 8 KB requests are split into.
    pub rounds: usize,
    /// 8 KB warmup requests per side.
    pub warmup: usize,
    /// 400 KB requests per side.
    pub big_requests: usize,
    /// Alternating rounds the 400 KB requests are split into.
    pub big_rounds: usize,
    /// Size of the big prompts, KiB.
    pub big_kib: usize,
    pub seed: u64,
}

/// One side's accumulated measurements.
#[derive(Default)]
struct Side {
    latencies_us: Vec<f64>,
    failures: usize,
    cpu: CpuSample,
    cpu_requests: usize,
}

impl Side {
    fn add_cpu(&mut self, before: CpuSample, after: CpuSample, requests: usize) {
        self.cpu.stat += after.stat.saturating_sub(before.stat);
        self.cpu.sched += after.sched.saturating_sub(before.sched);
        self.cpu_requests += requests;
    }

    /// Envoy CPU per request, microseconds (schedstat clock).
    fn cpu_us(&self) -> f64 {
        self.cpu.sched.as_secs_f64() * 1e6 / self.cpu_requests.max(1) as f64
    }

    fn take(&mut self, outcomes: &[Outcome]) {
        for o in outcomes {
            if o.ok() {
                self.latencies_us.push(o.latency_ms * 1000.0);
            } else {
                self.failures += 1;
            }
        }
    }
}

pub fn run(rt: &tokio::runtime::Runtime, args: &OverheadArgs) {
    let wall = Instant::now();
    let mut fleet = Fleet::new("bench-overhead");
    fleet.start_pods(&["--time-scale", "0"]);
    fleet.start_envoy("with-filter", "single.yaml", 1, &mut |_| {});
    fleet.start_envoy("plain", "plain.yaml", 1, &mut |_| {});
    // Diagnostic side: the filter loaded but passing every request at the
    // headers (content-length > max_body_bytes), so no buffering or routing.
    fleet.start_envoy("filter-passing", "single.yaml", 1, &mut |c| {
        c["max_body_bytes"] = json!(1);
    });
    let urls = fleet.base_urls();
    let pids: Vec<u32> = fleet.replicas.iter().map(|r| r.pid).collect();
    println!(
        "prefix-bench overhead: Envoy with the filter (single.yaml) vs without (plain.yaml), \
         and with the filter passing every request at the headers (diagnostic); \
         --concurrency 1 each, 4 podsim pods at --time-scale 0"
    );

    // (a) latency at 8 KB.
    let small = small_workload(args.requests + args.warmup, args.seed);
    let (warmup, measured) = small.split_at(args.warmup.min(small.len()));
    let mut lat: [Side; SIDES] = Default::default();
    let mut round_p50_diffs = Vec::new();
    let meter = LoadMeter::start();
    rt.block_on(async {
        let runners: Vec<Runner> = urls.iter().map(|u| Runner::new(vec![u.clone()])).collect();
        let closed = Pacing::Closed { concurrency: 1 };
        for r in &runners {
            r.run(warmup, closed).await;
        }
        let per_round = measured.len().div_ceil(args.rounds.max(1));
        for (round, chunk) in measured.chunks(per_round.max(1)).enumerate() {
            let mut p50 = [0.0; SIDES];
            for side in order(round) {
                let before = cpu_sample(pids[side]);
                let outcomes = runners[side].run(chunk, closed).await;
                let after = cpu_sample(pids[side]);
                lat[side].add_cpu(before, after, outcomes.len());
                lat[side].take(&outcomes);
                let us: Vec<f64> = outcomes.iter().map(|o| o.latency_ms * 1000.0).collect();
                p50[side] = Summary::of(&us).map_or(0.0, |s| s.p50);
            }
            round_p50_diffs.push(p50[0] - p50[1]);
        }
    });
    let load_a = meter.finish();
    // Envoy flushes histograms every 5 s; the filter's own routing time.
    std::thread::sleep(Duration::from_millis(5500));
    let route_time = fleet.replicas[0].histogram("prefix_router.route_time_us");

    // (b) CPU per 400 KB request.
    let big = big_workload(args.big_requests, args.big_kib, args.seed);
    let mut cpu: [Side; SIDES] = Default::default();
    let meter = LoadMeter::start();
    rt.block_on(async {
        let runners: Vec<Runner> = urls.iter().map(|u| Runner::new(vec![u.clone()])).collect();
        let closed = Pacing::Closed { concurrency: 1 };
        // One request each first: connections and buffers warmed up.
        for r in &runners {
            r.run(&big[..1], closed).await;
        }
        let per_round = big.len().div_ceil(args.big_rounds.max(1));
        for (round, chunk) in big.chunks(per_round.max(1)).enumerate() {
            for side in order(round) {
                let before = cpu_sample(pids[side]);
                let outcomes = runners[side].run(chunk, closed).await;
                let after = cpu_sample(pids[side]);
                cpu[side].add_cpu(before, after, outcomes.len());
                cpu[side].take(&outcomes);
            }
        }
    });
    let load_b = meter.finish();
    let stats = fleet.replicas[0].stats();
    drop(fleet);

    let native = native_reference(measured, &big);
    let mut result = report(
        args,
        &lat,
        &cpu,
        &round_p50_diffs,
        &route_time,
        &native,
        &stats,
    );
    println!("\n(a) {load_a}\n(b) {load_b}");
    result["load"] = json!({ "a": load_a, "b": load_b });
    let path = write_json("overhead", &result);
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

fn percentile_of(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    crate::percentiles::percentile(&v, p).unwrap_or(f64::NAN)
}

/// A table row: name, the statistic, the target of its difference.
type Row = (&'static str, fn(&Summary) -> f64, Option<f64>);

/// Sides, in start order: with the filter, plain, filter passing at headers.
const SIDES: usize = 3;

/// Side order of a round: rotated by one each round, so each side runs
/// first, second and third equally often.
fn order(round: usize) -> [usize; SIDES] {
    let mut o = [0, 1, 2];
    o.rotate_left(round % SIDES);
    o
}

/// 8 KB chat bodies: 6 KB system prompts shared by groups of 16, 2 KB questions.
fn small_workload(n: usize, seed: u64) -> Vec<Request> {
    let mut reqs = shared_prefix(&SharedPrefix {
        groups: n.div_ceil(16),
        prompts_per_group: 16,
        system_prompt_len: 6 * 1024,
        question_len: 2 * 1024 - 100,
        api: ApiMix::Only(Api::Chat),
        order: Order::Shuffled,
        body: BodyOptions {
            max_tokens: 4,
            ..BodyOptions::default()
        },
        seed,
    });
    reqs.truncate(n);
    reqs
}

/// `n` distinct completions prompts of `kib` KiB (one shared text, each with
/// its own first bytes, so none matches another).
fn big_workload(n: usize, kib: usize, seed: u64) -> Vec<Request> {
    let base = crate::support::text(seed, kib * 1024);
    let o = BodyOptions {
        max_tokens: 4,
        ..BodyOptions::default()
    };
    (0..n)
        .map(|i| {
            let prompt = format!("[big {i:06}] {base}");
            Request {
                api: Api::Completions,
                body: completion_body(&prompt, &o, false),
                stream: false,
                family: None,
                member: i,
                prompt_len: prompt.len(),
            }
        })
        .collect()
}

/// Host-native timings of the filter's pure logic (parse, hash, route on an
/// in-memory store) over the benchmark's own bodies, in microseconds, and the
/// shared-data operations a request costs (each one a hostcall in Envoy).
struct Native {
    small_parse_us: f64,
    small_hash_us: f64,
    small_route_us: f64,
    small_store_ops: f64,
    big_parse_us: f64,
    big_hash_us: f64,
    big_route_us: f64,
    big_store_ops: f64,
}

/// Mean time of parse, hash and route (+ release) per request over
/// `requests` in order on one fresh store, and shared-data gets + sets per
/// route + release.
fn native_pass(settings: &Settings, requests: &[Request]) -> (f64, f64, f64, f64) {
    let hasher =
        envoy_prefix_router::hashing::BlockHasher::new(settings.block_size, settings.hash_seed);
    let router = Router::new(settings.clone());
    let store = MemStore::new();
    let mut rng = SplitMix64::new(1);
    let (mut parse, mut hash, mut route) = (0.0, 0.0, 0.0);
    let mut ops = 0u64;
    for r in requests {
        let kind = match r.api {
            Api::Completions => ApiKind::Completions,
            Api::Chat => ApiKind::ChatCompletions,
        };
        let t = Instant::now();
        let req = parse_body(kind, r.body.as_bytes()).expect("parse body");
        parse += t.elapsed().as_secs_f64();
        let t = Instant::now();
        std::hint::black_box(hasher.hash(&req.prompt));
        hash += t.elapsed().as_secs_f64();
        let (g0, s0) = store.op_counts();
        let t = Instant::now();
        if let Ok(routed) = router.route(&store, &req, 1_000_000, &mut rng) {
            let _ = router.release(&store, routed.choice.pod);
        }
        route += t.elapsed().as_secs_f64();
        let (g1, s1) = store.op_counts();
        ops += (g1 - g0) + (s1 - s0);
    }
    let n = requests.len().max(1) as f64;
    (
        parse * 1e6 / n,
        hash * 1e6 / n,
        route * 1e6 / n,
        ops as f64 / n,
    )
}

fn native_reference(small: &[Request], big: &[Request]) -> Native {
    let yaml = crate::support::envoy_template("single.yaml");
    let mut config = None;
    crate::support::patch_plugin_json(&yaml, &mut |v: &mut Value| config = Some(v.clone()));
    let config = config.expect("plugin JSON in single.yaml");
    let settings = Settings::from_json(config.to_string().as_bytes()).expect("valid settings");
    let s = native_pass(&settings, &small[..small.len().min(1000)]);
    let b = native_pass(&settings, &big[..big.len().min(20)]);
    Native {
        small_parse_us: s.0,
        small_hash_us: s.1,
        small_route_us: s.2,
        small_store_ops: s.3,
        big_parse_us: b.0,
        big_hash_us: b.1,
        big_route_us: b.2,
        big_store_ops: b.3,
    }
}

fn report(
    args: &OverheadArgs,
    lat: &[Side; SIDES],
    cpu: &[Side; SIDES],
    round_p50_diffs: &[f64],
    route_time: &[(f64, f64)],
    native: &Native,
    stats: &std::collections::BTreeMap<String, i64>,
) -> Value {
    let s: Vec<Option<Summary>> = lat.iter().map(|l| Summary::of(&l.latencies_us)).collect();
    let field = |i: usize, f: fn(&Summary) -> f64| s[i].as_ref().map_or(f64::NAN, f);
    let header = [
        "us",
        "with filter",
        "plain",
        "added",
        "target",
        "",
        "diag: filter passing at headers",
    ];
    let mut t = Table::new(
        &format!(
            "(a) Latency, 8 KB chat bodies, concurrency 1, keep-alive: {} requests per side in {} rotating rounds (+{} warmup)",
            args.requests, args.rounds, args.warmup
        ),
        &header,
    );
    let rows: [Row; 5] = [
        ("p50", |s| s.p50, Some(TARGET_P50_US)),
        ("p90", |s| s.p90, None),
        ("p99", |s| s.p99, Some(TARGET_P99_US)),
        ("mean", |s| s.mean, None),
        ("max", |s| s.max, None),
    ];
    let mut added = serde_json::Map::new();
    for (name, f, target) in rows {
        let (a, b, c) = (field(0, f), field(1, f), field(2, f));
        let d = a - b;
        added.insert(name.into(), json!(d));
        t.row(&[
            name.to_string(),
            num(a, 1),
            num(b, 1),
            num(d, 1),
            target.map_or(String::new(), |x| format!("<= {x}")),
            target.map_or(String::new(), |x| verdict(d <= x).to_string()),
            num(c, 1),
        ]);
    }
    if let Some(d) = Summary::of(round_p50_diffs) {
        t.row(&[
            "added p50: median (p10..p90) of rounds".to_string(),
            String::new(),
            String::new(),
            format!(
                "{} ({}..{})",
                num(d.p50, 1),
                num(percentile_of(round_p50_diffs, 10.0), 1),
                num(d.p90, 1)
            ),
        ]);
    }
    let slow = |l: &Side| l.latencies_us.iter().filter(|&&v| v > 2000.0).count();
    let cpu_us: Vec<f64> = lat.iter().map(Side::cpu_us).collect();
    t.row(&[
        "Envoy CPU per request".to_string(),
        num(cpu_us[0], 1),
        num(cpu_us[1], 1),
        num(cpu_us[0] - cpu_us[1], 1),
        String::new(),
        String::new(),
        num(cpu_us[2], 1),
    ]);
    t.row(&[
        "requests over 2 ms".to_string(),
        slow(&lat[0]).to_string(),
        slow(&lat[1]).to_string(),
        String::new(),
        String::new(),
        String::new(),
        slow(&lat[2]).to_string(),
    ]);
    t.row(&[
        "failed requests".to_string(),
        lat[0].failures.to_string(),
        lat[1].failures.to_string(),
        String::new(),
        String::new(),
        String::new(),
        lat[2].failures.to_string(),
    ]);
    t.print();

    let per_req =
        |side: &Side, d: Duration| d.as_secs_f64() * 1000.0 / side.cpu_requests.max(1) as f64;
    let sched: Vec<f64> = cpu.iter().map(|c| per_req(c, c.cpu.sched)).collect();
    let stat: Vec<f64> = cpu.iter().map(|c| per_req(c, c.cpu.stat)).collect();
    let big_p50: Vec<f64> = cpu
        .iter()
        .map(|c| Summary::of(&c.latencies_us).map_or(f64::NAN, |s| s.p50 / 1000.0))
        .collect();
    let mut header = header;
    header[0] = "ms per request";
    let mut t = Table::new(
        &format!(
            "(b) Envoy CPU per request, {} KiB completions prompts: {} requests per side in {} rotating rounds",
            args.big_kib, args.big_requests, args.big_rounds
        ),
        &header,
    );
    t.row(&[
        "CPU (schedstat, ns clock)".to_string(),
        num(sched[0], 3),
        num(sched[1], 3),
        num(sched[0] - sched[1], 3),
        format!("<= {TARGET_CPU_MS}"),
        verdict(sched[0] - sched[1] <= TARGET_CPU_MS).to_string(),
        num(sched[2], 3),
    ]);
    t.row(&[
        "CPU (utime+stime, 10 ms ticks)".to_string(),
        num(stat[0], 3),
        num(stat[1], 3),
        num(stat[0] - stat[1], 3),
        String::new(),
        String::new(),
        num(stat[2], 3),
    ]);
    t.row(&[
        "latency p50 (client)".to_string(),
        num(big_p50[0], 3),
        num(big_p50[1], 3),
        num(big_p50[0] - big_p50[1], 3),
        String::new(),
        String::new(),
        num(big_p50[2], 3),
    ]);
    t.row(&[
        "failed requests".to_string(),
        cpu[0].failures.to_string(),
        cpu[1].failures.to_string(),
        String::new(),
        String::new(),
        String::new(),
        cpu[2].failures.to_string(),
    ]);
    t.print();

    let q = |p: f64| {
        route_time
            .iter()
            .find(|(x, _)| (*x - p).abs() < 1e-9)
            .map(|(_, v)| *v)
    };
    let mut t = Table::new(
        "Where the time goes: the filter's logic natively (host build, in-memory store; same bodies, in order) and in Envoy",
        &["us", "8 KB chat", "400 KB completions"],
    );
    t.row(&[
        "native parse_body".to_string(),
        num(native.small_parse_us, 1),
        num(native.big_parse_us, 1),
    ]);
    t.row(&[
        "native block hashing".to_string(),
        num(native.small_hash_us, 1),
        num(native.big_hash_us, 1),
    ]);
    t.row(&[
        "native route + release (hash, table, policy, record, in-flight)".to_string(),
        num(native.small_route_us, 1),
        num(native.big_route_us, 1),
    ]);
    t.row(&[
        "native shared-data gets + sets per request (hostcalls in Envoy)".to_string(),
        num(native.small_store_ops, 1),
        num(native.big_store_ops, 1),
    ]);
    t.row(&[
        "in Envoy: route_time_us p50 / p99 (Envoy histogram, excludes parse)".to_string(),
        format!(
            "{} / {}",
            q(50.0).map_or("-".into(), |v| num(v, 1)),
            q(99.0).map_or("-".into(), |v| num(v, 1))
        ),
        "-".to_string(),
    ]);
    t.row(&[
        "in Envoy: added CPU per request (from (a) and (b))".to_string(),
        num(cpu_us[0] - cpu_us[1], 1),
        num((sched[0] - sched[1]) * 1000.0, 1),
    ]);
    t.print();

    let side_names = ["with_filter", "plain", "filter_passing_at_headers"];
    let by_side = |f: &dyn Fn(usize) -> Value| {
        Value::Object(
            side_names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), f(i)))
                .collect(),
        )
    };
    json!({
        "args": {
            "requests": args.requests, "rounds": args.rounds, "warmup": args.warmup,
            "big_requests": args.big_requests, "big_rounds": args.big_rounds,
            "big_kib": args.big_kib, "seed": args.seed,
        },
        "targets": { "added_p50_us": TARGET_P50_US, "added_p99_us": TARGET_P99_US, "cpu_ms_per_400kb": TARGET_CPU_MS },
        "latency_8kb_us": by_side(&|i| json!(s[i])),
        "latency_8kb_added_us": added,
        "round_p50_diffs_us": round_p50_diffs,
        "cpu_8kb_us_per_request": by_side(&|i| json!(cpu_us[i])),
        "cpu_400kb_ms_per_request": by_side(&|i| json!({ "sched": sched[i], "stat": stat[i] })),
        "cpu_400kb_added_ms": { "sched": sched[0] - sched[1], "stat": stat[0] - stat[1] },
        "latency_400kb_us": by_side(&|i| json!(Summary::of(&cpu[i].latencies_us))),
        "failures": by_side(&|i| json!({ "small": lat[i].failures, "big": cpu[i].failures })),
        "route_time_us_quantiles": route_time,
        "native_us": {
            "small_parse": native.small_parse_us, "small_hash": native.small_hash_us,
            "small_route": native.small_route_us, "small_store_ops": native.small_store_ops,
            "big_store_ops": native.big_store_ops, "big_parse": native.big_parse_us,
            "big_hash": native.big_hash_us, "big_route": native.big_route_us,
        },
        "filter_stats": stats,
        "latency_series_8kb_us": by_side(&|i| json!(lat[i].latencies_us)),
    })
}
