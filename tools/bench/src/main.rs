//! `prefix-bench`: the demo (`run`) and the benchmarks (`overhead`,
//! `sync-cost`, `compat-cost`, `convergence`, `memory`, `place-wait`,
//! `compare`, `real`, `iperf`) of the Envoy prefix-router filter, on real Envoy, podsim pods and
//! redis-server processes on loopback. Every command prints tables; all but
//! `run` and `memory` also write JSON under `results/`; see README.md.

// A failed setup can only stop the tool, with the reason.
#![allow(clippy::expect_used)]

use prefix_bench::{commands, procstat};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "prefix-bench",
    about = "Demo and benchmarks of the Envoy prefix-router filter"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Demo: 4 pods behind 1 Envoy, or 2 Envoy replicas syncing through Redis;
    /// a short shared-prefix workload; where requests went and why.
    Run {
        /// Envoy replicas (2 = Redis sync, the client alternates replicas).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
        replicas: u8,
        /// Workload and arrival seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Sync period of the replicas, ms.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        /// Poisson arrival rate, requests per second.
        #[arg(long, default_value_t = 2.5)]
        rate: f64,
    },
    /// Benchmark: latency and CPU the filter adds above the reference filter
    /// (reference.yaml: pause, read the body, name a pod drawn at random) and
    /// plain Envoy.
    Overhead {
        /// 8 KB requests per side, each of the matched and new-prefix
        /// workloads (after warmup).
        #[arg(long, default_value_t = 5000)]
        requests: usize,
        /// Rotating rounds of each 8 KB workload (short rounds cancel drift).
        #[arg(long, default_value_t = 250)]
        rounds: usize,
        /// 8 KB warmup requests per side and workload.
        #[arg(long, default_value_t = 200)]
        warmup: usize,
        /// Large requests per side, for the CPU measurement.
        #[arg(long, default_value_t = 200)]
        big_requests: usize,
        /// Rotating rounds of the large requests.
        #[arg(long, default_value_t = 10)]
        big_rounds: usize,
        /// Size of the large prompts, KiB.
        #[arg(long, default_value_t = 400)]
        big_kib: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Another build of the filter (a .wasm), run in place of the
        /// passing-at-headers diagnostic with the same configuration: an
        /// A/B of two builds in one run.
        #[arg(long)]
        variant: Option<std::path::PathBuf>,
        /// A JSON object merged into the variant's plugin configuration
        /// (e.g. '{"signals":{"enabled":false}}'); the variant is this
        /// build unless --variant names another.
        #[arg(long, value_parser = parse_json_object)]
        variant_patch: Option<serde_json::Value>,
    },
    /// Model: fleet-wide Redis load of sync (commands/s, keys/s, bytes/s)
    /// for many replicas and large tables, from the engine's own cost model.
    Scale {
        /// Replica counts to report, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "3,10,100")]
        replicas: Vec<usize>,
        /// Table sizes (entities) to model, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "200000,1000000")]
        entities: Vec<usize>,
        /// Entities changed per period, per mille (fleet-wide).
        #[arg(long, default_value_t = 10)]
        churn_per_mille: usize,
        /// Sync period, ms.
        #[arg(long, default_value_t = 10_000)]
        period_ms: u64,
        /// Periodic mode: a full scan every N cycles.
        #[arg(long, default_value_t = 6)]
        full_scan_every: u32,
        /// Rotating mode: `sync.scan_keys_per_cycle`.
        #[arg(long, default_value_t = 2_000)]
        scan_keys_per_cycle: usize,
        /// Per-shard budget the report checks against, keys/s.
        #[arg(long, default_value_t = 20_000.0)]
        shard_keys_per_s: f64,
        /// Per-shard table: `sync.hash_tags` (K) modelled (rotating mode);
        /// 0 = no per-shard table.
        #[arg(long, default_value_t = 16)]
        hash_tags: usize,
        /// Per-shard table: Redis Cluster masters (N), comma-separated, each
        /// owning an equal contiguous slot range.
        #[arg(long, value_delimiter = ',', default_value = "3,8,16")]
        shards: Vec<usize>,
    },
    /// Benchmark: Redis work per sync cycle, incremental vs full scan.
    SyncCost {
        /// Entities in the namespace.
        #[arg(long, default_value_t = 200_000)]
        entities: usize,
        /// Entities changed per cycle, per mille.
        #[arg(long, default_value_t = 10)]
        churn_per_mille: usize,
        /// Incremental mode: a full scan every N cycles.
        #[arg(long, default_value_t = 6)]
        full_scan_every: u32,
        /// Periods measured in incremental mode (a multiple of
        /// --full-scan-every amortises the full scans exactly).
        #[arg(long, default_value_t = 6)]
        cycles: usize,
        /// Periods measured in full-scan mode (real Redis only).
        #[arg(long, default_value_t = 2)]
        full_cycles: usize,
        /// Sync period, ms (cost model and real replica; the default is the
        /// filter's).
        #[arg(long, default_value_t = 10_000)]
        period_ms: u64,
        /// Incremental mode: `sync.scan_keys_per_cycle` (rotating
        /// anti-entropy scan) instead of the periodic full scan; 0 = off.
        #[arg(long, default_value_t = 0)]
        scan_keys_per_cycle: usize,
        /// Change-log poll interval between cycles, ms (the filter's default).
        #[arg(long, default_value_t = 175)]
        poll_ms: u64,
        /// Only the in-memory cost model, no real Redis and Envoy.
        #[arg(long)]
        model_only: bool,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Benchmark: Redis cost of `"compat": "aibrix"` (4-byte blocks, every
    /// block recorded, full scan every cycle) vs native mode: keys, commands
    /// and bytes per new prompt, and per cycle to hold the namespace.
    CompatCost {
        /// Distinct new chat prompts per size and mode.
        #[arg(long, default_value_t = 20)]
        prompts: usize,
        /// Prompt sizes, KiB (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "2,8,16,64")]
        sizes_kib: Vec<usize>,
        /// Prompts loaded before the steady-state cycles are observed.
        #[arg(long, default_value_t = 100)]
        steady_prompts: usize,
        /// Size of those prompts, KiB.
        #[arg(long, default_value_t = 8)]
        steady_kib: usize,
        /// Idle cycles observed in steady state (6 = native's full-scan
        /// interval, so its anti-entropy scan is in the mean).
        #[arg(long, default_value_t = 6)]
        steady_cycles: usize,
        /// Sync period of both modes, ms (envoy/aibrix.yaml's).
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        /// `table_capacity_blocks` of both modes (default: the filter's).
        #[arg(long)]
        table_capacity_blocks: Option<u32>,
        /// Output directory (default results/).
        #[arg(long)]
        results_dir: Option<std::path::PathBuf>,
    },
    /// Measurement: what placing a new prompt through Redis
    /// (`sync.place_new`) adds to its request, and where the time goes.
    PlaceWait {
        /// New prompts per side (placement on, then off).
        #[arg(long, default_value_t = 300)]
        requests: usize,
        /// Pause between two requests, ms.
        #[arg(long, default_value_t = 20)]
        gap_ms: u64,
    },
    /// Measurement: Envoy's resident memory with the filter under large
    /// bodies (beside plain Envoy) and under hostile Redis values.
    Memory {
        /// Large chat requests per Envoy.
        #[arg(long, default_value_t = 40)]
        bodies: usize,
        /// Size of each, MiB (single.yaml buffers up to 8 MiB).
        #[arg(long, default_value_t = 3)]
        body_mib: usize,
        /// Hostile values per flood (one of unknown pods, one of models).
        #[arg(long, default_value_t = 1000)]
        hostile_values: usize,
        /// Distinct names in each hostile value.
        #[arg(long, default_value_t = 100)]
        names_per_value: usize,
    },
    /// Benchmark: delay until replica B can route a prompt replica A saw.
    Convergence {
        /// Trials per mode (periodic, write-through).
        #[arg(long, default_value_t = 30)]
        trials: usize,
        /// Sync period of both replicas, ms.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        /// Full 128-byte blocks of each prompt (at most 25).
        #[arg(long, default_value_t = 24)]
        prompt_blocks: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Sync through a local Redis Cluster of 3 masters (envoy/cluster.yaml:
        /// 16 hash tags, cluster mode) instead of one Redis; needs redis-cli.
        #[arg(long)]
        redis_cluster: bool,
    },
    /// Routers side by side on simulated pods: round robin, the filter (1 and
    /// 3 Envoys, with and without sync), sglang-router and vllm-router (1 and
    /// 3 processes).
    Compare(Box<commands::compare::CompareCli>),
    /// The runs a policy decision rests on: scenarios x pod models (free,
    /// queueing) x seeds, routers alternating, medians and ranges, and the
    /// subject's verdicts against stated tolerances.
    Decide(commands::decide::DecideCli),
    /// Who was best, figure by figure, over saved `compare` runs (their
    /// results JSON files): each router's median and how often it was at
    /// least as good as each of the others.
    League {
        /// `results/compare-<time>.json` files, one per run.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// The comparison on 2 real llama-servers (Gemma 3 270M on CPU).
    Real(commands::real::RealCli),
    /// kubernetes-sigs inference-perf against the filter and round robin.
    Iperf(commands::iperf::IperfCli),
}

fn main() {
    procstat::kill_children_on_panic();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match cli.command {
        Command::Run {
            replicas,
            seed,
            period_ms,
            rate,
        } => commands::demo::run(
            &rt,
            &commands::demo::DemoArgs {
                replicas,
                seed,
                period_ms,
                rate,
            },
        ),
        Command::Overhead {
            requests,
            rounds,
            warmup,
            big_requests,
            big_rounds,
            big_kib,
            seed,
            variant,
            variant_patch,
        } => commands::overhead::run(
            &rt,
            &commands::overhead::OverheadArgs {
                requests,
                rounds,
                warmup,
                big_requests,
                big_rounds,
                big_kib,
                seed,
                variant,
                variant_patch,
            },
        ),
        Command::Scale {
            replicas,
            entities,
            churn_per_mille,
            period_ms,
            full_scan_every,
            scan_keys_per_cycle,
            shard_keys_per_s,
            hash_tags,
            shards,
        } => commands::scale::run(&commands::scale::ScaleArgs {
            replicas,
            entities,
            churn_per_mille,
            period_ms,
            full_scan_every,
            scan_keys_per_cycle,
            shard_keys_per_s,
            hash_tags,
            shards,
        }),
        Command::SyncCost {
            entities,
            churn_per_mille,
            full_scan_every,
            cycles,
            full_cycles,
            period_ms,
            poll_ms,
            scan_keys_per_cycle,
            model_only,
            seed,
        } => commands::sync_cost::run(&commands::sync_cost::SyncCostArgs {
            entities,
            churn_per_mille,
            full_scan_every,
            cycles,
            full_cycles,
            period_ms,
            poll_ms,
            model_only,
            seed,
            scan_keys_per_cycle,
        }),
        Command::PlaceWait { requests, gap_ms } => {
            commands::place_wait::run(&commands::place_wait::PlaceWaitArgs { requests, gap_ms })
        }
        Command::Memory {
            bodies,
            body_mib,
            hostile_values,
            names_per_value,
        } => commands::memory::run(&commands::memory::MemoryArgs {
            bodies,
            body_mib,
            hostile_values,
            names_per_value,
        }),
        Command::CompatCost {
            prompts,
            sizes_kib,
            steady_prompts,
            steady_kib,
            steady_cycles,
            period_ms,
            table_capacity_blocks,
            results_dir,
        } => commands::compat_cost::run(&commands::compat_cost::CompatCostArgs {
            prompts,
            sizes_kib,
            steady_prompts,
            steady_kib,
            steady_cycles,
            period_ms,
            table_capacity_blocks,
            results_dir,
        }),
        Command::Convergence {
            trials,
            period_ms,
            prompt_blocks,
            seed,
            redis_cluster,
        } => commands::convergence::run(
            &rt,
            &commands::convergence::ConvergenceArgs {
                trials,
                period_ms,
                prompt_blocks,
                seed,
                redis_cluster,
            },
        ),
        Command::Compare(c) => commands::compare::main(&rt, *c),
        Command::Decide(c) => commands::decide::main(&rt, c),
        Command::League { files } => commands::compare::league::main(&files),
        Command::Real(c) => commands::real::main(&rt, c),
        Command::Iperf(c) => commands::iperf::main(c),
    }
}

/// A command-line JSON object.
fn parse_json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("expected a JSON object".to_string()),
        Err(e) => Err(e.to_string()),
    }
}
