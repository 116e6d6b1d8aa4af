//! `prefix-bench convergence`: how long after replica A routes a new prompt
//! replica B can route it by prefix. Two Envoy replicas (envoy/sync.yaml)
//! share Redis; each trial waits a random phase, sends a new long prompt to
//! A, then polls both replicas' sync stats every 10 ms: A's
//! `prefix_router.sync.pushed` (the prompt's blocks are in Redis) and B's
//! `prefix_router.sync.applied` (B merged them). Once B has applied them, one
//! request with the same prompt to B confirms the 100 % match.
//!
//! Why stats and not routing probes: every request B routes records its
//! prompt in B's own table, so the second probe would match 100 % whatever
//! the sync did. Why `full_scan_every` is raised: a full-scan pull re-applies
//! every key in Redis and would make B's `applied` jump without the new
//! prompt; a full-scan cycle would pick up the new keys at the same moment as
//! a change-log pull, so the delay measured is the same.
//! Before each trial both replicas finish a cycle, so nothing of the
//! previous trial is still on its way.
//! Modes: periodic push (`write_through: false`) and write-through, same
//! period; the change-log poll interval is the filter's default.
//! `--redis-cluster`: the same against a local Redis Cluster of 3 masters
//! (envoy/cluster.yaml: 16 hash tags, cluster mode) instead of one Redis.

use std::time::{Duration, Instant};

use envoy_prefix_router::rng::SplitMix64;
use envoy_prefix_router::route::router::sampled_positions;
use serde::Serialize;
use serde_json::json;

use crate::percentiles::Summary;
use crate::report::{num, verdict, write_json, Table};
use crate::runner::Runner;
use crate::workload::{completion_body, Api, BodyOptions, Request};
use harness::fleet::{sync_patch, Fleet, Replica};

/// Target of issue 3 for write-through, ms.
const TARGET_WRITE_THROUGH_MS: f64 = 250.0;
/// Block size and dense prefix of envoy/sync.yaml (the defaults).
const BLOCK_SIZE: usize = 128;
const DENSE_BLOCKS: usize = 32;

#[derive(Clone, Debug)]
pub struct ConvergenceArgs {
    pub trials: usize,
    pub period_ms: u64,
    /// Full blocks of each prompt (at most 25, so one push carries them all).
    pub prompt_blocks: usize,
    pub seed: u64,
    /// Sync through a local Redis Cluster (3 masters, envoy/cluster.yaml).
    pub redis_cluster: bool,
}

/// One trial.
#[derive(Clone, Debug, Default, Serialize)]
struct Trial {
    /// Random wait before the trial, ms.
    phase_ms: f64,
    /// A's match for the new prompt (expected 0).
    a_match: Option<u8>,
    /// From sending to A until A had pushed the blocks (None: not seen).
    pushed_ms: Option<f64>,
    /// From sending to A until B had applied them (None: timed out).
    converged_ms: Option<f64>,
    /// B's match for the prompt right after.
    b_match: Option<u8>,
}

pub fn run(rt: &tokio::runtime::Runtime, args: &ConvergenceArgs) {
    let wall = Instant::now();
    let blocks = args.prompt_blocks.clamp(1, 25);
    let recorded = sampled_positions(blocks, DENSE_BLOCKS).len() as i64;
    println!(
        "prefix-bench convergence: 2 Envoy replicas + {}, sync period {} ms, {} trials per \
         mode, prompts of {} blocks ({} bytes)",
        if args.redis_cluster {
            "a Redis Cluster of 3 masters (envoy/cluster.yaml: 16 hash tags)"
        } else {
            "Redis"
        },
        args.period_ms,
        args.trials,
        blocks,
        blocks * BLOCK_SIZE + 40
    );
    let meter = crate::procstat::LoadMeter::start();
    let mut results = Vec::new();
    for (label, write_through) in [("periodic", false), ("write-through", true)] {
        let trials = run_mode(rt, args, write_through, blocks, recorded);
        results.push((label, write_through, trials));
    }
    let mut t = Table::new(
        &format!(
            "Convergence: new prompt on replica A -> replica B has it (sync period {} ms, \
             change-log polls every {} ms: the filter's default)",
            args.period_ms,
            envoy_prefix_router::sync::SyncSettings::default().poll_ms
        ),
        &[
            "mode",
            "trials",
            "converged",
            "B matched 100%",
            "A pushed p50",
            "p50 ms",
            "p99 ms",
            "max ms",
            "target",
            "",
        ],
    );
    let mut out = Vec::new();
    for (label, write_through, trials) in &results {
        let delays: Vec<f64> = trials.iter().filter_map(|t| t.converged_ms).collect();
        let pushed: Vec<f64> = trials.iter().filter_map(|t| t.pushed_ms).collect();
        let s = Summary::of(&delays);
        let target = if *write_through {
            TARGET_WRITE_THROUGH_MS
        } else {
            args.period_ms as f64
        };
        let full = trials.iter().filter(|t| t.b_match == Some(100)).count();
        let ok = s.is_some_and(|s| s.p99 <= target) && delays.len() == trials.len();
        t.row(&[
            label.to_string(),
            trials.len().to_string(),
            delays.len().to_string(),
            full.to_string(),
            Summary::of(&pushed).map_or("-".into(), |s| num(s.p50, 0)),
            s.map_or("-".into(), |s| num(s.p50, 0)),
            s.map_or("-".into(), |s| num(s.p99, 0)),
            s.map_or("-".into(), |s| num(s.max, 0)),
            format!("<= {}", num(target, 0)),
            format!(
                "p50 {} / p99 {}",
                verdict(s.is_some_and(|s| s.p50 <= target)),
                verdict(ok)
            ),
        ]);
        out.push(json!({
            "mode": label,
            "write_through": write_through,
            "target_ms": target,
            "converged": s,
            "pushed": Summary::of(&pushed),
            "trials": trials,
        }));
    }
    t.print();
    println!(
        "(periodic target: one period; A pushed = A's blocks confirmed in Redis; \
         converged = B applied them)"
    );
    let load = meter.finish();
    println!("{load}");
    let path = write_json(
        "convergence",
        &json!({
            "load": load,
            "period_ms": args.period_ms,
            "prompt_blocks": blocks,
            "recorded_blocks": recorded,
            "modes": out,
        }),
    );
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

fn run_mode(
    rt: &tokio::runtime::Runtime,
    args: &ConvergenceArgs,
    write_through: bool,
    blocks: usize,
    recorded: i64,
) -> Vec<Trial> {
    // Declared before the fleet, so the Redis nodes outlive its Envoys.
    let cluster_nodes;
    let mut fleet = Fleet::new("bench-convergence");
    fleet.start_pods(&["--time-scale", "0"]);
    let template = if args.redis_cluster {
        cluster_nodes = harness::cluster::start_cluster(fleet.dir.path(), 3);
        fleet.redis_port = cluster_nodes[0].port;
        "cluster.yaml"
    } else {
        fleet.start_redis();
        "sync.yaml"
    };
    let sync = sync_patch(
        args.period_ms,
        // The table's sync alone, as measured before placement existed.
        json!({"write_through": write_through, "full_scan_every": 1_000_000, "place_new": false}),
    );
    let specs =
        ["replica-a", "replica-b"].map(|name| fleet.spec(name, template).merge(sync.clone()));
    fleet.launch_all(specs.into());
    for r in &fleet.replicas {
        r.wait_stat(
            "prefix_router.sync.cycles_ok",
            2,
            Duration::from_millis(args.period_ms * 5),
        );
    }
    let (a, b) = (&fleet.replicas[0], &fleet.replicas[1]);
    let mut rng = SplitMix64::new(args.seed ^ u64::from(write_through));
    let timeout = Duration::from_millis(args.period_ms * 4 + 1000);
    let body = BodyOptions {
        max_tokens: 1,
        ..BodyOptions::default()
    };
    let mut trials = Vec::new();
    rt.block_on(async {
        let to_a = Runner::new(vec![a.base_url()]);
        let to_b = Runner::new(vec![b.base_url()]);
        for _ in 0..args.trials {
            settle(a, b, args.period_ms);
            let phase = Duration::from_millis(rng.below(args.period_ms as usize) as u64);
            tokio::time::sleep(phase).await;
            let text = harness::text(rng.next_u64(), blocks * BLOCK_SIZE + 40);
            let request = Request {
                api: Api::Completions,
                body: completion_body(&text, &body, false),
                stream: false,
                family: None,
                member: 0,
                prompt_len: text.len(),
            };
            let pushed0 = sync_stat(a, "pushed");
            let applied0 = sync_stat(b, "applied");
            let t0 = Instant::now();
            let first = to_a.send(0, 0, &request).await;
            let mut trial = Trial {
                phase_ms: phase.as_secs_f64() * 1000.0,
                a_match: first.match_percent,
                ..Trial::default()
            };
            while t0.elapsed() < timeout {
                if trial.pushed_ms.is_none() && sync_stat(a, "pushed") - pushed0 >= recorded {
                    trial.pushed_ms = Some(t0.elapsed().as_secs_f64() * 1000.0);
                }
                if sync_stat(b, "applied") - applied0 >= recorded {
                    trial.converged_ms = Some(t0.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if trial.converged_ms.is_some() {
                trial.b_match = to_b.send(0, 0, &request).await.match_percent;
            }
            trials.push(trial);
        }
    });
    trials
}

/// Waits until a cycle of A and then one of B have completed, so Redis
/// writes left over from the previous trial (with write-through, A's
/// periodic push repeats the blocks it already wrote through) are pulled
/// before the next baseline is read.
fn settle(a: &Replica, b: &Replica, period_ms: u64) {
    let timeout = Duration::from_millis(period_ms * 4 + 1000);
    let ca = sync_stat(a, "cycles_ok");
    harness::wait_until(timeout, || sync_stat(a, "cycles_ok") > ca);
    let cb = sync_stat(b, "cycles_ok");
    harness::wait_until(timeout, || sync_stat(b, "cycles_ok") > cb);
}

/// One `prefix_router.sync.*` counter, read with a narrow filter (this is
/// polled every 10 ms).
fn sync_stat(r: &Replica, name: &str) -> i64 {
    r.envoy
        .stats_matching(&format!(r"^wasmcustom\.prefix_router\.sync\.{name}$"))
        .values()
        .sum()
}
