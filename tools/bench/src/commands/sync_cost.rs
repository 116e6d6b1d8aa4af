//! `prefix-bench sync-cost`: Redis work per sync period of one replica (its
//! cycle plus its change-log polls in between) for a large namespace with a
//! small churn, incremental (change log, full scan every `full_scan_every`
//! cycles) vs AIBrix's full scan every cycle.
//!
//! 1. The cost model: `sync::testkit::steady_state_cost_with` drives two
//!    sync engines over an in-memory Redis on a fake clock (exact command and
//!    byte counts).
//! 2. The real thing (unless `--model-only`): redis-server preloaded with the
//!    namespace, a peer writing the churn the way a replica's push does, and
//!    one real Envoy replica (envoy/sync.yaml) whose
//!    `prefix_router.sync.{calls,commands,bytes}_sent` deltas are read after
//!    every cycle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_prefix_router::rng::SplitMix64;
use envoy_prefix_router::sync::testkit::{steady_state_cost_with, CostModel, CycleCost};
use serde::Serialize;
use serde_json::json;

use crate::procstat::cpu_sample;
use crate::redis_writer::{push_like_a_peer, setex_all, Namespace};
use crate::report::{num, verdict, write_json, Table};
use harness::fleet::{sync_patch, Fleet, Replica};
use harness::redis::Conn;

/// Target of issue 3: incremental at least this many times cheaper.
const TARGET_RATIO: f64 = 20.0;

#[derive(Clone, Debug)]
pub struct SyncCostArgs {
    pub entities: usize,
    pub churn_per_mille: usize,
    pub full_scan_every: u32,
    /// Cycles measured in incremental mode (a multiple of `full_scan_every`
    /// gives the exact amortised cost).
    pub cycles: usize,
    /// Cycles measured in full-scan mode (real Redis).
    pub full_cycles: usize,
    /// Sync period, ms (model and real replica).
    pub period_ms: u64,
    /// Change-log poll interval between cycles, ms; 0 = no polls.
    pub poll_ms: u64,
    pub model_only: bool,
    pub seed: u64,
    /// `sync.scan_keys_per_cycle` of incremental mode (0: full scan every
    /// `full_scan_every` cycles), model and real replica.
    pub scan_keys_per_cycle: usize,
}

/// Redis work of one observed cycle of the real replica.
#[derive(Clone, Debug, Default, Serialize)]
struct Cycle {
    /// A namespace pulled by full SCAN in this cycle.
    full_scan: bool,
    /// Change-log polls since the previous cycle.
    polls: f64,
    calls: f64,
    commands: f64,
    bytes_sent: f64,
    applied: f64,
    envoy_cpu_ms: f64,
}

pub fn run(args: &SyncCostArgs) {
    let wall = Instant::now();
    let anti_entropy = if args.scan_keys_per_cycle > 0 {
        format!(
            "rotating scan of {} keys per cycle",
            args.scan_keys_per_cycle
        )
    } else {
        format!("full scan every {}", args.full_scan_every)
    };
    println!(
        "prefix-bench sync-cost: {} entities, {} per mille churn per period, incremental \
         ({anti_entropy}, change-log polls every {} ms) vs full scan every cycle (AIBrix); \
         period {} ms",
        args.entities, args.churn_per_mille, args.poll_ms, args.period_ms
    );
    let meter = crate::procstat::LoadMeter::start();
    let model = model_costs(args);
    print_model(args, &model);
    let real = (!args.model_only).then(|| real_costs(args));
    if let Some(real) = &real {
        print_real(args, real);
    }
    let load = meter.finish();
    println!("{load}");
    let path = write_json(
        "sync-cost",
        &json!({
            "load": load,
            "entities": args.entities,
            "churn_per_mille": args.churn_per_mille,
            "full_scan_every": args.full_scan_every,
            "period_ms": args.period_ms,
            "poll_ms": args.poll_ms,
            "scan_keys_per_cycle": args.scan_keys_per_cycle,
            "target_ratio": TARGET_RATIO,
            "model": {
                "incremental_cycle": cost_json(&model.incremental_cycle),
                "incremental_amortised": cost_json(&model.amortised),
                "full_scan": cost_json(&model.full),
                "cycles_amortised": model.cycles,
            },
            "real": real.as_ref().map(|r| json!({
                "period_ms": args.period_ms,
                "incremental_mode_cycles": r.incremental,
                "full_scan_mode_cycles": r.full,
                "preload_s": r.preload_s,
            })),
        }),
    );
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

struct ModelCosts {
    incremental_cycle: CycleCost,
    amortised: CycleCost,
    full: CycleCost,
    cycles: usize,
}

fn model_costs(args: &SyncCostArgs) -> ModelCosts {
    let every = args.full_scan_every.max(2);
    let cycles = (every as usize).max(args.cycles / every as usize * every as usize);
    let model = |full_scan_every: u32, cycles: usize| {
        steady_state_cost_with(&CostModel {
            entities: args.entities,
            churn_per_mille: args.churn_per_mille,
            full_scan_every,
            cycles,
            period_ms: args.period_ms,
            poll_ms: args.poll_ms,
            scan_keys_per_cycle: if full_scan_every > 1 {
                args.scan_keys_per_cycle
            } else {
                0
            },
            hash_tags: 1,
        })
    };
    ModelCosts {
        // The first measured period (cycle index 1) is an incremental one.
        incremental_cycle: model(every, 1),
        // Whole windows: the full scans are amortised exactly.
        amortised: model(every, cycles),
        full: model(1, 2),
        cycles,
    }
}

fn cost_json(c: &CycleCost) -> serde_json::Value {
    json!({
        "calls": c.calls, "commands": c.commands,
        "bytes_sent": c.bytes_sent, "bytes_received": c.bytes_received,
        "polls": c.polls, "idle_polls": c.idle_polls,
        "poll_commands": c.poll_commands, "idle_poll_commands": c.idle_poll_commands,
    })
}

fn ratio(full: f64, x: f64) -> f64 {
    full / x.max(f64::MIN_POSITIVE)
}

fn print_model(args: &SyncCostArgs, m: &ModelCosts) {
    let mut t = Table::new(
        &format!(
            "Cost model (sync::testkit, in-memory Redis, fake clock): per reader period of {} ms \
             (cycle + polls every {} ms), {} entities, {} per mille churn",
            args.period_ms, args.poll_ms, args.entities, args.churn_per_mille
        ),
        &[
            "mode",
            "calls",
            "commands",
            "polls (idle)",
            "poll commands",
            "bytes sent",
            "bytes received",
            "fewer commands",
            "fewer bytes",
            ">= 20x",
        ],
    );
    let every = args.full_scan_every.max(2);
    let amortised_beyond = m.amortised.beyond_idle_polls();
    let rows = [
        (
            "incremental, a change-log period".to_string(),
            &m.incremental_cycle,
            true,
        ),
        (
            format!(
                "incremental, average over {} periods ({})",
                m.cycles,
                if args.scan_keys_per_cycle > 0 {
                    format!("rotating scan, {} keys/cycle", args.scan_keys_per_cycle)
                } else {
                    format!("full scan every {every}")
                }
            ),
            &m.amortised,
            true,
        ),
        (
            "  same, without the idle-poll floor".to_string(),
            &amortised_beyond,
            false,
        ),
        ("full scan every cycle (AIBrix)".to_string(), &m.full, false),
    ];
    for (name, c, check) in rows {
        let r = ratio(m.full.commands, c.commands);
        let rb = ratio(
            m.full.bytes_sent + m.full.bytes_received,
            c.bytes_sent + c.bytes_received,
        );
        t.row(&[
            name,
            num(c.calls, 1),
            num(c.commands, 1),
            format!("{} ({})", num(c.polls, 1), num(c.idle_polls, 1)),
            num(c.poll_commands, 1),
            num(c.bytes_sent, 0),
            num(c.bytes_received, 0),
            format!("{}x", num(r, 1)),
            format!("{}x", num(rb, 1)),
            if check {
                verdict(r >= TARGET_RATIO).to_string()
            } else {
                String::new()
            },
        ]);
    }
    t.print();
}

struct RealCosts {
    incremental: Vec<Cycle>,
    full: Vec<Cycle>,
    preload_s: f64,
}

fn real_costs(args: &SyncCostArgs) -> RealCosts {
    let mut fleet = Fleet::new("bench-sync-cost");
    fleet.start_redis();
    let ns = Namespace {
        prefix: "aibrix".into(),
        ns: "prefixcache".into(),
    };
    let pods: Vec<String> = fleet
        .pod_ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let mut rng = SplitMix64::new(args.seed);
    let ids: Vec<String> = (0..args.entities)
        .map(|_| rng.next_u64().to_string())
        .collect();
    let payload = move |i: usize| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        format!(
            r#"{{"model_to_pods":{{"sim-model":{{"{}":{nanos}}}}}}}"#,
            pods[i % pods.len()]
        )
        .into_bytes()
    };

    let t = Instant::now();
    let mut conn = Conn::connect(fleet.redis_port);
    let all: Vec<(String, Vec<u8>)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), payload(i)))
        .collect();
    setex_all(&mut conn, &ns, &all, 3600);
    // One change-log entry, so the replica's first full scan finds a log
    // head to continue from.
    push_like_a_peer(&mut conn, &ns, &all[..1], 3600, "bench-peer", 25);
    let preload_s = t.elapsed().as_secs_f64();
    drop(all);
    println!(
        "real Redis: preloaded {} keys in {:.1} s; a peer rewrites {} of them every {} ms",
        args.entities,
        preload_s,
        (args.entities * args.churn_per_mille).div_ceil(1000),
        args.period_ms
    );

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, ns, port) = (stop.clone(), ns.clone(), fleet.redis_port);
        let churn = (args.entities * args.churn_per_mille).div_ceil(1000);
        let period = Duration::from_millis(args.period_ms);
        std::thread::spawn(move || {
            let mut conn = Conn::connect(port);
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let batch: Vec<(String, Vec<u8>)> = (0..churn)
                    .map(|k| {
                        let i = (round * 7919 + k * 104_729) % ids.len();
                        (ids[i].clone(), payload(i))
                    })
                    .collect();
                push_like_a_peer(&mut conn, &ns, &batch, 3600, "bench-peer", 25);
                let until = Instant::now() + period;
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })
    };

    let timeout = Duration::from_millis(args.period_ms * 3 + 60_000);
    let mut modes = Vec::new();
    for (every, cycles) in [(args.full_scan_every, args.cycles), (1, args.full_cycles)] {
        let name = format!("reader-every-{every}");
        let rotating =
            (every > 1 && args.scan_keys_per_cycle > 0).then_some(args.scan_keys_per_cycle);
        // The table's sync alone: placement (one call per new prompt) is off.
        let mut more = json!({"write_through": false, "full_scan_every": every,
            "poll_ms": args.poll_ms, "place_new": false});
        if let Some(n) = rotating {
            more["scan_keys_per_cycle"] = json!(n);
        }
        let spec = fleet
            .spec(&name, "sync.yaml")
            .merge(sync_patch(args.period_ms, more));
        let i = fleet.launch(spec);
        let replica = &fleet.replicas[i];
        // Cycle 0 is the startup full scan that loads the namespace; in
        // incremental mode, cycle 1 still scans the podload namespace, whose
        // change log did not exist at cycle 0. Steady state starts after.
        let warmup = observe(replica, if every > 1 { 2 } else { 1 }, timeout);
        let measured = observe(replica, cycles, timeout);
        println!(
            "  {name}: warm-up cycles {:?} commands; measured {} cycles",
            warmup.iter().map(|c| c.commands).collect::<Vec<_>>(),
            measured.len()
        );
        modes.push(measured);
        fleet.stop_envoy(i);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    let full = modes.pop().unwrap_or_default();
    let incremental = modes.pop().unwrap_or_default();
    RealCosts {
        incremental,
        full,
        preload_s,
    }
}

/// Waits for `n` more completed cycles of `replica`; returns each one's work.
fn observe(replica: &Replica, n: usize, timeout: Duration) -> Vec<Cycle> {
    let mut last = replica.stats();
    let mut last_done = replica.cycles_done();
    let mut last_cpu = cpu_sample(replica.pid);
    let deadline = Instant::now() + timeout * n.max(1) as u32;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let done = replica.cycles_done();
        if done == last_done {
            continue;
        }
        last_done = done;
        let cpu = cpu_sample(replica.pid);
        let now = replica.stats();
        let d = |k: &str| {
            let key = format!("prefix_router.sync.{k}");
            (now.get(&key).copied().unwrap_or(0) - last.get(&key).copied().unwrap_or(0)) as f64
        };
        out.push(Cycle {
            full_scan: d("full_scans") > 0.0,
            polls: d("polls_ok"),
            calls: d("calls_sent"),
            commands: d("commands_sent"),
            bytes_sent: d("bytes_sent"),
            applied: d("applied"),
            envoy_cpu_ms: cpu.sched.saturating_sub(last_cpu.sched).as_secs_f64() * 1000.0,
        });
        last = now;
        last_cpu = cpu;
    }
    out
}

fn mean_of(cycles: &[&Cycle]) -> Cycle {
    let n = cycles.len().max(1) as f64;
    let sum = |f: fn(&Cycle) -> f64| cycles.iter().map(|c| f(c)).sum::<f64>() / n;
    Cycle {
        full_scan: cycles.iter().any(|c| c.full_scan),
        polls: sum(|c| c.polls),
        calls: sum(|c| c.calls),
        commands: sum(|c| c.commands),
        bytes_sent: sum(|c| c.bytes_sent),
        applied: sum(|c| c.applied),
        envoy_cpu_ms: sum(|c| c.envoy_cpu_ms),
    }
}

fn print_real(args: &SyncCostArgs, r: &RealCosts) {
    let inc: Vec<&Cycle> = r.incremental.iter().filter(|c| !c.full_scan).collect();
    let inc_full: Vec<&Cycle> = r.incremental.iter().filter(|c| c.full_scan).collect();
    let all: Vec<&Cycle> = r.incremental.iter().collect();
    let full: Vec<&Cycle> = r.full.iter().collect();
    let base = mean_of(&full);
    let mut t = Table::new(
        &format!(
            "Real redis-server + Envoy replica (envoy/sync.yaml, period {} ms, polls every {} ms): \
             per period (cycle + polls), from prefix_router.sync.* stats (both namespaces: \
             prefixcache and podload)",
            args.period_ms, args.poll_ms
        ),
        &[
            "mode",
            "periods",
            "polls",
            "calls",
            "commands",
            "bytes sent",
            "entities applied",
            "Envoy CPU ms/period",
            "fewer commands",
            ">= 20x",
        ],
    );
    let rows = [
        ("incremental, change-log periods", &inc, true),
        ("incremental mode, its full-scan periods", &inc_full, false),
        ("incremental mode, average of all periods", &all, true),
        ("full scan every cycle (AIBrix)", &full, false),
    ];
    for (name, cycles, check) in rows {
        if cycles.is_empty() {
            continue;
        }
        let m = mean_of(cycles);
        let rt = ratio(base.commands, m.commands);
        t.row(&[
            name.to_string(),
            cycles.len().to_string(),
            num(m.polls, 1),
            num(m.calls, 1),
            num(m.commands, 1),
            num(m.bytes_sent, 0),
            num(m.applied, 0),
            num(m.envoy_cpu_ms, 1),
            format!("{}x", num(rt, 1)),
            if check {
                verdict(rt >= TARGET_RATIO).to_string()
            } else {
                String::new()
            },
        ]);
    }
    t.print();
}
