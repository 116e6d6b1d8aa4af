//! `prefix-bench compare`: what prefix-aware routing buys, side by side.
//!
//! For every workload and every router, fresh podsim pods (cold caches) and a
//! fresh router are started, the same deterministic workload is sent through
//! it, and the pods' own usage reports give the token-weighted cache hit rate
//! (sum `cached_tokens` / sum `prompt_tokens`); streaming gives TTFT. Tables
//! go to stdout, progress to stderr, and `results/compare-<time>.{json,svg,txt}`
//! keep everything (per-request outcomes included).
//!
//! Workloads (all deterministic given `--seed`):
//! - `shared-prefix`: SGLang's generated-shared-prefix shape, groups x prompts,
//!   shuffled, completions (even groups) and chat (odd groups), Poisson
//!   arrivals;
//! - `concurrency-1`: the same groups, two prompts each in two waves (every
//!   prefix new in the first wave, reused in the second), one request at a
//!   time: where do new prefixes go when every pod is idle?
//! - `chat`: multi-turn sessions resending a growing history, Poisson;
//! - `no-sharing`: unique prompts, the control, Poisson;
//! - `high-load`: `shared-prefix` at `--high-load` (90 %) instead of `--load`;
//! - `cache-pressure`: `--pressure-groups` (256) system prompts, far more
//!   distinct prefix tokens than the pods' caches, each request's group
//!   drawn Zipf(`--zipf-exponent`), Poisson at `--load`;
//! - `hetero-fleet`: `shared-prefix` with pod-1 `--slow-factor` (3) times
//!   slower (podsim `--time-scale`), Poisson at `--load` of the nominal
//!   (all-fast) fleet;
//! - `live-fleet`: a pod leaves and returns mid-run (killed at 1/3 of the
//!   run, restarted on its port at 2/3) under a steady shared-prefix load
//!   with fresh prompts mixed in (Poisson, `--live-rate` for `--live-secs`);
//!   the Envoys run on EDS-fed pods with a health check and retries
//!   (`plain-eds.yaml`, the filter on `eds.yaml`; see [`crate::outage`]).
//!   Errors, hit rate before/during/after the outage and what the returned
//!   pod served are reported beside round robin's. The 3-Envoy fleets have no
//!   EDS variant and are skipped.
//!
//! The default Poisson rate is derived, not tuned: the rate at which a router
//! that never hits the cache keeps the pods `--load` (75 %) busy, from the pod
//! model's service time of the workload's mean prompt.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::chart::{self, Panel};
use crate::drive::drive;
use crate::league;
use crate::metrics::{spread_label, Stats};
use crate::outage::{self, Outage, OutageFacts, Timeline};
use crate::peer::peers_installed;
use crate::percentiles::Summary;
use crate::procstat::{Load, LoadMeter};
use crate::report::{num, results_dir, verdict, Table};
use crate::runner::{Outcome, Pacing};
use crate::scenario::{sum_stat, Gateway, GatewayOptions, PodModel, PodSet, Router};
use crate::workload::{
    chat_sessions, no_sharing, shared_prefix, zipf_prefix, Api, ApiMix, BodyOptions, ChatOrder,
    ChatSessions, NoSharing, Order, Request, SharedPrefix, Streaming, ZipfPrefix,
};
use harness::TestDir;

pub use crate::workload::BYTES_PER_TOKEN;
/// Tenants of the `tenants` workload, and its requests (before `--scale`).
const TENANTS: usize = 16;
const TENANT_REQUESTS: usize = 512;

/// The workloads of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    SharedPrefix,
    Concurrency1,
    Chat,
    NoSharing,
    LiveFleet,
    HighLoad,
    CachePressure,
    HeteroFleet,
    Tenants,
    TenantsBurst,
    SessionsBurst,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 11] = [
        WorkloadKind::SharedPrefix,
        WorkloadKind::Concurrency1,
        WorkloadKind::Chat,
        WorkloadKind::NoSharing,
        WorkloadKind::LiveFleet,
        WorkloadKind::HighLoad,
        WorkloadKind::CachePressure,
        WorkloadKind::HeteroFleet,
        WorkloadKind::Tenants,
        WorkloadKind::TenantsBurst,
        WorkloadKind::SessionsBurst,
    ];

    pub fn key(self) -> &'static str {
        match self {
            WorkloadKind::SharedPrefix => "shared-prefix",
            WorkloadKind::Concurrency1 => "concurrency-1",
            WorkloadKind::Chat => "chat",
            WorkloadKind::NoSharing => "no-sharing",
            WorkloadKind::LiveFleet => "live-fleet",
            WorkloadKind::HighLoad => "high-load",
            WorkloadKind::CachePressure => "cache-pressure",
            WorkloadKind::HeteroFleet => "hetero-fleet",
            WorkloadKind::Tenants => "tenants",
            WorkloadKind::TenantsBurst => "tenants-burst",
            WorkloadKind::SessionsBurst => "sessions-burst",
        }
    }
}

/// Parses a comma-separated workload list; `all` = every workload.
pub fn parse_workloads(s: &str) -> Result<Vec<WorkloadKind>, String> {
    if s == "all" {
        return Ok(WorkloadKind::ALL.to_vec());
    }
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            WorkloadKind::ALL
                .into_iter()
                .find(|w| w.key() == p.trim())
                .ok_or_else(|| {
                    format!(
                        "unknown workload {p:?}; one of: all, shared-prefix, concurrency-1, chat, no-sharing, live-fleet, high-load, cache-pressure, hetero-fleet, tenants, tenants-burst, sessions-burst"
                    )
                })
        })
        .collect()
}

/// Options of `compare`.
#[derive(Clone, Debug)]
pub struct CompareArgs {
    pub workloads: Vec<WorkloadKind>,
    pub routers: Vec<Router>,
    pub pods: usize,
    pub seed: u64,
    /// Multiplies request counts (prompts per group, sessions, unique prompts).
    pub scale: f64,
    /// Poisson rate for the open-loop workloads; None = derived from `load`.
    pub rate: Option<f64>,
    /// Closed loop with this many in flight instead of Poisson (open-loop
    /// workloads only; `concurrency-1` stays at 1).
    pub concurrency: Option<usize>,
    /// Target pod utilisation of a never-hitting router, for the derived rate.
    pub load: f64,
    pub groups: usize,
    pub prompts_per_group: usize,
    pub system_tokens: usize,
    pub question_tokens: usize,
    pub output_tokens: u32,
    pub sessions: usize,
    pub turns: usize,
    /// live-fleet: length of the run, s, its Poisson rate, req/s, and its
    /// prefix groups.
    pub live_secs: f64,
    pub live_rate: f64,
    pub live_groups: usize,
    /// high-load: utilisation of a never-hitting router.
    pub high_load: f64,
    /// cache-pressure: system prompts, requests, Zipf exponent.
    pub pressure_groups: usize,
    pub pressure_requests: usize,
    pub zipf_exponent: f64,
    /// hetero-fleet: pod-1's time scale relative to the others.
    pub slow_factor: f64,
    /// The bursts' cache, as a fraction of sessions-burst's working set.
    pub burst_cache: f64,
    pub pod: PodModel,
    pub sync_period_ms: u64,
    /// Every request on a new connection (no keep-alive).
    pub fresh_connections: bool,
    /// Warm the synced fleets up before traffic (see [`GatewayOptions`]).
    pub warm_sync: bool,
    /// Where the JSON/SVG/TXT go (default `results/`).
    pub results_dir: Option<PathBuf>,
    /// Merged into the plugin configuration of the `filter` and
    /// `filter-3x-*` routers' Envoys.
    pub filter_patch: Option<serde_json::Value>,
    /// Worker threads of a lone Envoy (plain, filter, filter-aibrix).
    pub single_concurrency: u32,
    /// Worker threads of each replica of the 3-Envoy fleets.
    pub replica_concurrency: u32,
}

impl CompareArgs {
    /// The defaults of `prefix-bench compare`: its flags' defaults
    /// ([`CompareCli`]), so they are written down once.
    pub fn defaults() -> CompareArgs {
        #[derive(clap::Parser)]
        struct NoFlags {
            #[command(flatten)]
            cli: CompareCli,
        }
        let flags = <NoFlags as clap::Parser>::try_parse_from(["compare"])
            .map_err(|e| e.to_string())
            .and_then(|f| f.cli.into_args());
        flags.unwrap_or_else(|e| panic!("compare's default flags: {e}"))
    }

    /// KV blocks per pod: as given, or (0 = auto) room for 1.5 x this pod's
    /// fair share of the shared-prefix workload's distinct system prompts:
    /// the fleet holds every prefix once with headroom, one pod holds
    /// 1.5 / pods of them, so piling every group onto one pod thrashes.
    pub fn kv_blocks(&self) -> u32 {
        if self.pod.kv_capacity_blocks > 0 {
            return self.pod.kv_capacity_blocks;
        }
        let distinct = (self.groups * self.system_tokens) as f64;
        let per_pod = 1.5 * distinct / self.pods.max(1) as f64;
        (per_pod / f64::from(self.pod.kv_block_tokens.max(1))).ceil() as u32
    }

    fn pod_model(&self) -> PodModel {
        PodModel {
            kv_capacity_blocks: self.kv_blocks(),
            ..self.pod.clone()
        }
    }

    pub(crate) fn scaled(&self, n: usize) -> usize {
        ((n as f64 * self.scale).round() as usize).max(1)
    }
}

/// The command-line flags of `prefix-bench compare` (flattened into main.rs).
#[derive(clap::Args, Clone, Debug)]
pub struct CompareCli {
    /// Workloads, comma-separated: shared-prefix, concurrency-1, chat,
    /// no-sharing, live-fleet, high-load, cache-pressure, hetero-fleet, tenants,
    /// tenants-burst, sessions-burst, or all.
    #[arg(long, default_value = "all")]
    pub workloads: String,
    /// Routers, comma-separated: round-robin, filter, filter-aibrix,
    /// filter-3x-nosync, filter-3x-sync, filter-3x-wt, filter-3x-share, filter-3x-place, sglang,
    /// vllm, sglang-3x, vllm-3x (three peer processes, nothing shared), or all.
    #[arg(long, default_value = "all")]
    pub routers: String,
    /// Simulated pods (1 to 4).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=4))]
    pub pods: u8,
    /// Workload and arrival seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Multiplies request counts (prompts per group, chat sessions, unique prompts).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Poisson arrival rate, req/s (default: derived from --load).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Closed loop with N in flight instead of Poisson arrivals.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Derived rate: pod utilisation a router that never hits would cause.
    #[arg(long, default_value_t = 0.75)]
    pub load: f64,
    /// Shared-prefix groups (also concurrency-1).
    #[arg(long, default_value_t = 32)]
    pub groups: usize,
    #[arg(long, default_value_t = 16)]
    pub prompts_per_group: usize,
    /// System prompt, tokens (podsim: 4 bytes per token); chat uses half.
    #[arg(long, default_value_t = 4096)]
    pub system_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub question_tokens: usize,
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// Chat sessions and turns per session.
    #[arg(long, default_value_t = 32)]
    pub sessions: usize,
    #[arg(long, default_value_t = 8)]
    pub turns: usize,
    /// live-fleet: seconds of traffic (pod-2 killed at 1/3, back at 2/3).
    #[arg(long, default_value_t = 45.0)]
    pub live_secs: f64,
    /// live-fleet: Poisson rate, req/s (not derived from --load).
    #[arg(long, default_value_t = 20.0)]
    pub live_rate: f64,
    /// live-fleet: prefix groups (fewer than --groups: the pods' caches hold
    /// them with the fresh prompts, so misses come from routing, not from
    /// cache pressure).
    #[arg(long, default_value_t = 16)]
    pub live_groups: usize,
    /// high-load: pod utilisation a router that never hits would cause.
    #[arg(long, default_value_t = 0.9)]
    pub high_load: f64,
    /// cache-pressure: distinct system prompts (Zipf-popular).
    #[arg(long, default_value_t = 256)]
    pub pressure_groups: usize,
    /// cache-pressure: requests (times --scale).
    #[arg(long, default_value_t = 512)]
    pub pressure_requests: usize,
    /// cache-pressure: Zipf exponent of group popularity.
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// hetero-fleet: pod-1 is this many times slower (podsim --time-scale).
    #[arg(long, default_value_t = 3.0)]
    pub slow_factor: f64,
    /// tenants-burst, sessions-burst: the pods' caches together hold this
    /// fraction of sessions-burst's working set (0.67: the conversations do
    /// not all fit, the tenants fit only with each on one pod).
    #[arg(long, default_value_t = 0.67)]
    pub burst_cache: f64,
    /// podsim --slots.
    #[arg(long, default_value_t = 4)]
    pub slots: u32,
    #[arg(long, default_value_t = 50.0)]
    pub prefill_us: f64,
    #[arg(long, default_value_t = 3000.0)]
    pub decode_us: f64,
    /// podsim --kv-capacity-blocks (16-token blocks); 0 = 1.5 x a pod's fair
    /// share of the shared-prefix system prompts.
    #[arg(long, default_value_t = 0)]
    pub kv_blocks: u32,
    /// podsim --time-scale (multiplies every modelled delay).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// podsim --prefill-stalls-decode: a prefill delays the tokens of the
    /// requests decoding on its pod (off: the pods' slots are independent).
    #[arg(long)]
    pub prefill_stalls_decode: bool,
    /// Sync period of the 3-replica fleets, ms.
    #[arg(long, default_value_t = 2000)]
    pub sync_period_ms: u64,
    /// Reuse client connections (keep-alive). Off by default: a new
    /// connection per request, because sglang-router 0.3.2 holds the first
    /// chunk of a reply on a reused client connection for ~40 ms (Nagle vs
    /// delayed ACK), a transport effect that would swamp routing in TTFT.
    #[arg(long)]
    pub keep_alive: bool,
    /// Synced fleets start cold: empty Redis, no warm-up (their replicas
    /// cannot poll the change log until the first cycle after the first
    /// write). Default: warmed up like a fleet in service.
    #[arg(long)]
    pub cold_sync: bool,
    /// Output directory (default results/).
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
    /// JSON merged into the plugin configuration of every Envoy of the
    /// `filter` and `filter-3x-*` routers, e.g.
    /// '{"feedback":{"cached_tokens":true}}' (the other routers unchanged).
    #[arg(long, value_parser = parse_json_patch)]
    pub filter_patch: Option<serde_json::Value>,
    /// Worker threads (`--concurrency`) of a lone Envoy: round robin, filter,
    /// filter-aibrix (the 3-replica fleets: `--replica-concurrency`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub envoy_concurrency: u32,
    /// Worker threads (`--concurrency`) of each Envoy of the 3-replica
    /// fleets (`filter-3x-*`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub replica_concurrency: u32,
    /// Runs the whole comparison this many times (same seed: the pods' and
    /// Envoys' timing differs from run to run) and ends with each target's
    /// passes out of the runs, with every run's figures.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
}

fn parse_json_patch(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(e.to_string()),
    }
}

impl CompareCli {
    /// The options, or why the flags are invalid.
    pub fn into_args(self) -> Result<CompareArgs, String> {
        Ok(CompareArgs {
            workloads: parse_workloads(&self.workloads)?,
            routers: crate::scenario::parse_routers(&self.routers)?,
            pods: usize::from(self.pods),
            seed: self.seed,
            scale: self.scale,
            rate: self.rate,
            concurrency: self.concurrency,
            load: self.load,
            groups: self.groups,
            prompts_per_group: self.prompts_per_group,
            system_tokens: self.system_tokens,
            question_tokens: self.question_tokens,
            output_tokens: self.output_tokens,
            sessions: self.sessions,
            turns: self.turns,
            live_secs: self.live_secs,
            live_rate: self.live_rate,
            live_groups: self.live_groups,
            high_load: self.high_load,
            pressure_groups: self.pressure_groups,
            pressure_requests: self.pressure_requests,
            zipf_exponent: self.zipf_exponent,
            slow_factor: self.slow_factor,
            burst_cache: self.burst_cache,
            pod: PodModel {
                slots: self.slots,
                prefill_us_per_token: self.prefill_us,
                decode_us_per_token: self.decode_us,
                kv_capacity_blocks: self.kv_blocks,
                time_scale: self.time_scale,
                kv_block_tokens: 16,
                prefill_stalls_decode: self.prefill_stalls_decode,
            },
            sync_period_ms: self.sync_period_ms,
            fresh_connections: !self.keep_alive,
            warm_sync: !self.cold_sync,
            filter_patch: self.filter_patch,
            single_concurrency: self.envoy_concurrency,
            replica_concurrency: self.replica_concurrency,
            results_dir: self.results_dir,
        })
    }
}

/// Entry point from the command line.
pub fn main(rt: &tokio::runtime::Runtime, cli: CompareCli) {
    let repeat = cli.repeat;
    let args = match cli.into_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("prefix-bench compare: {e}");
            std::process::exit(2);
        }
    };
    let wall = Instant::now();
    let (runs, figures): (Vec<Vec<Target>>, Vec<Vec<league::Entry>>) =
        (0..repeat).map(|_| run(rt, &args)).unzip();
    if runs.len() > 1 {
        let mut text = repeat_summary(&runs).render();
        text.push_str(&league::table(&figures).render());
        print!("{text}");
        let json = json!({
            "command": "compare --repeat",
            "seed": args.seed,
            "runs": runs,
            "figures": figures,
        });
        let wall_s = wall.elapsed().as_secs_f64();
        write_outputs(
            args.results_dir.as_ref(),
            "compare-repeat",
            &json,
            None,
            &text,
        )
        .print(wall_s);
    }
}

/// Each target's passes out of the runs (in the order they first appear),
/// and every run's figures.
fn repeat_summary(runs: &[Vec<Target>]) -> Table {
    let title = format!("Targets over {} runs", runs.len());
    let mut t = Table::new(&title, &["target", "passes", "measured, run by run"]);
    let mut names: Vec<&str> = Vec::new();
    for target in runs.iter().flatten() {
        if !names.contains(&target.name.as_str()) {
            names.push(&target.name);
        }
    }
    for name in names {
        let same: Vec<&Target> = runs
            .iter()
            .filter_map(|r| r.iter().find(|x| x.name == name))
            .collect();
        let passes = same.iter().filter(|x| x.verdict == "PASS").count();
        let judged = same
            .iter()
            .any(|x| x.verdict == "PASS" || x.verdict == "MISS");
        let details: Vec<&str> = same.iter().map(|x| x.detail.as_str()).collect();
        t.row(&[
            name.to_string(),
            if judged {
                format!("{passes}/{}", runs.len())
            } else {
                "n/a".into()
            },
            details.join(" | "),
        ]);
    }
    t
}

/// A workload ready to send.
pub struct Built {
    pub kind: WorkloadKind,
    pub requests: Vec<Request>,
    pub pacing: Pacing,
    pub description: String,
    /// Mean prompt, tokens (podsim's 4 bytes per token).
    pub mean_prompt_tokens: f64,
    /// A pod that leaves and returns during the run (live-fleet).
    pub outage: Option<Outage>,
    /// (pod index, time scale factor): one pod slower than the others.
    pub slow_pod: Option<(usize, f64)>,
    /// KV blocks per pod where the workload sizes the caches itself
    /// (the bursts); None = the pod model's.
    pub kv_blocks: Option<u32>,
}

fn body(args: &CompareArgs) -> BodyOptions {
    BodyOptions {
        model: "sim-model".into(),
        max_tokens: args.output_tokens,
        streaming: Streaming::Always,
    }
}

fn mean_tokens(requests: &[Request]) -> f64 {
    let total: usize = requests.iter().map(|r| r.prompt_len).sum();
    total as f64 / requests.len().max(1) as f64 / BYTES_PER_TOKEN as f64
}

/// The derived Poisson rate: `load` x slots of the fleet / the service time
/// of the mean prompt with nothing cached.
pub fn derived_rate(args: &CompareArgs, mean_prompt_tokens: f64) -> f64 {
    derived_rate_at(args, mean_prompt_tokens, args.load)
}

/// [`derived_rate`] at utilisation `load`.
pub fn derived_rate_at(args: &CompareArgs, mean_prompt_tokens: f64, load: f64) -> f64 {
    let service = args
        .pod
        .service_s(mean_prompt_tokens, f64::from(args.output_tokens));
    let slots = (args.pods as f64) * f64::from(args.pod.slots);
    if service <= 0.0 {
        return 50.0;
    }
    (load * slots / service * 10.0).round() / 10.0
}

/// Builds workload `kind` with its pacing.
pub fn build(kind: WorkloadKind, args: &CompareArgs) -> Built {
    let open_at = |requests: &[Request], load: f64| -> (Pacing, String) {
        if let Some(c) = args.concurrency {
            return (
                Pacing::Closed { concurrency: c },
                format!("closed loop, {c} in flight"),
            );
        }
        let rate = args
            .rate
            .unwrap_or_else(|| derived_rate_at(args, mean_tokens(requests), load));
        (
            Pacing::Poisson {
                rate_per_sec: rate,
                seed: args.seed,
            },
            format!(
                "Poisson {rate} req/s{}",
                if args.rate.is_none() {
                    format!(" (pods {:.0} % busy if nothing hit)", load * 100.0)
                } else {
                    String::new()
                }
            ),
        )
    };
    let open = |requests: &[Request]| open_at(requests, args.load);
    // Requests drawing their group's system prompt Zipf(s = --zipf-exponent).
    let zipf = |groups: usize, requests: usize| {
        zipf_prefix(&ZipfPrefix {
            groups,
            requests,
            exponent: args.zipf_exponent,
            system_prompt_len: args.system_tokens * BYTES_PER_TOKEN,
            question_len: args.question_tokens * BYTES_PER_TOKEN,
            api: ApiMix::Alternate,
            body: body(args),
            seed: args.seed,
        })
    };
    let gsp = |groups: usize, prompts: usize, order: Order| SharedPrefix {
        groups,
        prompts_per_group: prompts,
        system_prompt_len: args.system_tokens * BYTES_PER_TOKEN,
        question_len: args.question_tokens * BYTES_PER_TOKEN,
        api: ApiMix::Alternate,
        order,
        body: body(args),
        seed: args.seed,
    };
    match kind {
        WorkloadKind::TenantsBurst | WorkloadKind::SessionsBurst => {
            let b = super::bursts::build(&super::bursts::BurstSpec {
                sessions: kind == WorkloadKind::SessionsBurst,
                scale: args.scale,
                pods: args.pods,
                cache: args.burst_cache,
                kv_block_tokens: args.pod.kv_block_tokens,
                body: body(args),
                seed: args.seed,
            });
            Built {
                kind,
                description: b.description,
                mean_prompt_tokens: mean_tokens(&b.requests),
                requests: b.requests,
                pacing: Pacing::Closed {
                    concurrency: b.concurrency,
                },
                outage: None,
                slow_pod: None,
                kv_blocks: Some(b.kv_blocks),
            }
        }
        WorkloadKind::SharedPrefix => {
            let ppg = args.scaled(args.prompts_per_group);
            let requests = shared_prefix(&gsp(args.groups, ppg, Order::Shuffled));
            let (pacing, how) = open(&requests);
            Built {
                kind,
                description: format!(
                    "{} groups x {ppg} prompts, {}-token system prompt + {}-token question, {} output tokens, \
                     shuffled, completions and chat alternating by group, all streaming; {how}",
                    args.groups, args.system_tokens, args.question_tokens, args.output_tokens
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing,
                outage: None,
                slow_pod: None,
                kv_blocks: None,
            }
        }
        WorkloadKind::HighLoad | WorkloadKind::HeteroFleet => {
            let ppg = args.scaled(args.prompts_per_group);
            let requests = shared_prefix(&gsp(args.groups, ppg, Order::Shuffled));
            let hetero = kind == WorkloadKind::HeteroFleet;
            let load = if hetero { args.load } else { args.high_load };
            let (pacing, how) = open_at(&requests, load);
            let slow = if hetero {
                format!(
                    "; pod-1 {}x slower (podsim --time-scale), the rate is of the all-fast fleet",
                    args.slow_factor
                )
            } else {
                String::new()
            };
            Built {
                kind,
                description: format!(
                    "shared-prefix shape, {} groups x {ppg} prompts, {}-token system prompt + {}-token \
                     question, {} output tokens, shuffled; {how}{slow}",
                    args.groups, args.system_tokens, args.question_tokens, args.output_tokens
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing,
                outage: None,
                slow_pod: hetero.then_some((0, args.slow_factor)),
                kv_blocks: None,
            }
        }
        WorkloadKind::CachePressure => {
            let count = args.scaled(args.pressure_requests);
            let requests = zipf(args.pressure_groups, count);
            let (pacing, how) = open(&requests);
            let m = args.pod_model();
            let distinct = args.pressure_groups * args.system_tokens;
            let cache = (m.kv_capacity_blocks * m.kv_block_tokens) as usize;
            Built {
                kind,
                description: format!(
                    "{count} requests over {} system prompts of {} tokens (+ {}-token question), \
                     group drawn Zipf(s = {}); distinct prefix tokens = {:.1} x one pod's cache; {how}",
                    args.pressure_groups,
                    args.system_tokens,
                    args.question_tokens,
                    args.zipf_exponent,
                    distinct as f64 / cache.max(1) as f64
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing,
                outage: None,
                slow_pod: None,
                kv_blocks: None,
            }
        }
        WorkloadKind::Tenants => {
            // Tenants of uneven size, each with its own system prompt (all
            // of them more than one pod's cache holds, a third of the
            // fleet's): how evenly a router spreads requests over pods while
            // keeping each tenant's prefix hot.
            let count = args.scaled(TENANT_REQUESTS);
            let requests = zipf(TENANTS, count);
            let (pacing, how) = open(&requests);
            Built {
                kind,
                description: format!(
                    "{count} requests of {TENANTS} tenants, each with its own {}-token system prompt \
                     (+ {}-token question), tenant drawn Zipf(s = {}): the largest sends {:.0} %; {how}",
                    args.system_tokens,
                    args.question_tokens,
                    args.zipf_exponent,
                    100.0 / (1..=TENANTS).map(|k| 1.0 / (k as f64).powf(args.zipf_exponent)).sum::<f64>()
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing,
                outage: None,
                slow_pod: None,
                kv_blocks: None,
            }
        }
        WorkloadKind::Concurrency1 => {
            let requests = shared_prefix(&gsp(args.groups, 2, Order::Waves));
            Built {
                kind,
                description: format!(
                    "{} groups x 2 prompts in two waves (every prefix new in wave 1, reused in wave 2), \
                     same prompt shape; closed loop, 1 in flight",
                    args.groups
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing: Pacing::Closed { concurrency: 1 },
                outage: None,
                slow_pod: None,
                kv_blocks: None,
            }
        }
        WorkloadKind::Chat => {
            let sessions = args.scaled(args.sessions);
            let cfg = ChatSessions {
                sessions,
                turns: args.turns,
                system_len: args.system_tokens / 2 * BYTES_PER_TOKEN,
                user_len: 64 * BYTES_PER_TOKEN,
                assistant_len: 192 * BYTES_PER_TOKEN,
                body: body(args),
                order: ChatOrder::TurnMajor,
                seed: args.seed,
            };
            let requests = chat_sessions(&cfg);
            let (pacing, how) = open(&requests);
            Built {
                kind,
                description: format!(
                    "{sessions} chat sessions x {} turns (turn-major), {}-token system prompt, \
                     64-token user turns, 192-token assistant turns in the history, each turn resends \
                     the whole history; {how}",
                    args.turns,
                    args.system_tokens / 2
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing,
                outage: None,
                slow_pod: None,
                kv_blocks: None,
            }
        }
        WorkloadKind::NoSharing => {
            let count = args.scaled(256);
            let cfg = NoSharing {
                count,
                prompt_len: (args.system_tokens + args.question_tokens) * BYTES_PER_TOKEN,
                api: Api::Completions,
                body: body(args),
                seed: args.seed,
            };
            let requests = no_sharing(&cfg);
            let (pacing, how) = open(&requests);
            Built {
                kind,
                description: format!(
                    "{count} unique {}-token prompts (nothing to share: the control); {how}",
                    args.system_tokens + args.question_tokens
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing,
                outage: None,
                slow_pod: None,
                kv_blocks: None,
            }
        }
        WorkloadKind::LiveFleet => {
            let total = ((args.live_rate * args.live_secs).round() as usize).max(4);
            let fresh_count = total / 4;
            let shared_count = total - fresh_count;
            let groups = args.live_groups.max(1);
            let ppg = shared_count.div_ceil(groups);
            let mut shared = shared_prefix(&gsp(groups, ppg, Order::Shuffled));
            shared.truncate(shared_count);
            // Not the shared-prefix seed: its first prompt would start with
            // group 0's system prompt.
            let fresh = no_sharing(&NoSharing {
                count: fresh_count,
                prompt_len: (args.system_tokens + args.question_tokens) * BYTES_PER_TOKEN,
                api: Api::Completions,
                body: body(args),
                seed: args.seed ^ 0x11FE_F1EE_7000_0000,
            });
            let requests = interleave_every_fourth(shared, fresh);
            let secs = args.live_secs;
            let outage = Outage {
                pod: LIVE_FLEET_POD,
                kill_at: Duration::from_secs_f64(secs / 3.0),
                return_at: Duration::from_secs_f64(secs * 2.0 / 3.0),
            };
            Built {
                kind,
                description: format!(
                    "{total} requests, Poisson {} req/s (~{secs:.0} s): 3 in 4 from {} shared-prefix \
                     groups ({}-token system prompt + {}-token question, shuffled), 1 in 4 a fresh \
                     {}-token prompt; pod-{} killed at {:.0} s, restarted on its port (cold cache) \
                     at {:.0} s; Envoy on EDS-fed pods with a /health check every 1 s and one \
                     retry on connect-failure/refused-stream/reset",
                    args.live_rate,
                    groups,
                    args.system_tokens,
                    args.question_tokens,
                    args.system_tokens + args.question_tokens,
                    LIVE_FLEET_POD + 1,
                    outage.kill_at.as_secs_f64(),
                    outage.return_at.as_secs_f64(),
                ),
                mean_prompt_tokens: mean_tokens(&requests),
                requests,
                pacing: Pacing::Poisson {
                    rate_per_sec: args.live_rate,
                    seed: args.seed,
                },
                outage: Some(outage),
                slow_pod: None,
                kv_blocks: None,
            }
        }
    }
}

/// live-fleet: the pod that leaves and returns (index: `pod-2`).
pub const LIVE_FLEET_POD: usize = 1;

/// `shared` with one of `fresh` at every fourth position (3, 7, ...), the
/// rest of either appended.
fn interleave_every_fourth(shared: Vec<Request>, fresh: Vec<Request>) -> Vec<Request> {
    let mut out = Vec::with_capacity(shared.len() + fresh.len());
    let (mut shared, mut fresh) = (shared.into_iter(), fresh.into_iter());
    loop {
        let next = if out.len() % 4 == 3 {
            fresh.next().or_else(|| shared.next())
        } else {
            shared.next().or_else(|| fresh.next())
        };
        match next {
            Some(r) => out.push(r),
            None => return out,
        }
    }
}

/// The filter's routing and sync counters, summed over replicas.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FilterCounters {
    pub prefix_match: i64,
    pub no_match: i64,
    pub load_guard: i64,
    /// Hot prefixes copied to another pod (`routed.spread`).
    pub spread: i64,
    /// New prompts placed through Redis (`routed.placed`), and placements
    /// that failed and took the replica's own pick (`place.failed`).
    pub placed: i64,
    pub place_failed: i64,
    pub passthrough: i64,
    pub sync_applied: i64,
    pub sync_poll_applied: i64,
    pub sync_cycles_failed: i64,
    pub cas_exhausted: i64,
    /// Pods taken out after a failed request (`fleet.passive_cooldowns`).
    pub passive_cooldowns: i64,
    /// `passthrough` by reason (`no_endpoints`, ...), the non-zero ones.
    pub passthrough_reasons: BTreeMap<String, i64>,
    /// Answers read (`feedback.checked`) and those that showed an eviction
    /// (`feedback.evictions_learned`).
    pub feedback_checked: i64,
    pub feedback_evictions: i64,
    /// Requests held for a prefix in prefill (`hold.held`), those of them
    /// held for a family claim's prefill on another replica
    /// (`hold.held_claim`), and those resumed at `hold.max_ms`
    /// (`hold.timed_out`).
    pub held: i64,
    pub held_claim: i64,
    pub hold_timed_out: i64,
    /// Each pod's trust horizon at the end (`match_trust_s.<pod>`, whole
    /// seconds, 0 = every match trusted), per replica.
    pub match_trust_s: Vec<BTreeMap<String, i64>>,
}

/// One router on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub router: Router,
    pub description: String,
    /// Why it did not run (e.g. peers not installed).
    pub skipped: Option<String>,
    pub stats: Option<Stats>,
    pub filter: Option<FilterCounters>,
    /// The pods' own counters after the run: prefix-cache hit and query
    /// tokens, evicted blocks.
    pub pod_hit_tokens: f64,
    pub pod_query_tokens: f64,
    pub pod_evicted_blocks: f64,
    pub load: Option<Load>,
    pub wall_s: f64,
    /// live-fleet: what the run shows about the pod that left and returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<OutageFacts>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<Outcome>,
}

/// Runs `built` through `router` over fresh pods.
pub fn run_one(
    rt: &tokio::runtime::Runtime,
    built: &Built,
    router: Router,
    args: &CompareArgs,
    opts: &GatewayOptions,
) -> RunResult {
    let wall = Instant::now();
    // A live fleet runs the Envoys on EDS-fed pods.
    let opts = &GatewayOptions {
        eds: built.outage.is_some(),
        ..opts.clone()
    };
    let mut result = RunResult {
        router,
        description: router.describe_with(opts),
        skipped: None,
        stats: None,
        filter: None,
        pod_hit_tokens: 0.0,
        pod_query_tokens: 0.0,
        pod_evicted_blocks: 0.0,
        load: None,
        wall_s: 0.0,
        live: None,
        outcomes: Vec::new(),
    };
    if router.is_peer() && !peers_installed() {
        result.skipped =
            Some("peers venv missing: run scripts/bench/setup-peers.sh (make bench does)".into());
        return result;
    }
    if let Some(o) = &built.outage {
        if !router.has_eds_variant() {
            result.skipped = Some("no live-fleet variant (no EDS-fed sync config yet)".into());
            return result;
        }
        if o.pod >= args.pods {
            result.skipped = Some(format!("live-fleet needs at least {} pods", o.pod + 1));
            return result;
        }
    }
    let dir = TestDir::new(&format!("cmp-{}-{}", built.kind.key(), router.key()));
    let mut model = args.pod_model();
    if let Some(blocks) = built.kv_blocks {
        model.kv_capacity_blocks = blocks;
    }
    let mut pods = PodSet::start_with_slow(&dir, args.pods, &model, built.slow_pod);
    let gateway = match Gateway::start(router, &pods.ports(), &dir, opts) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("  [{}] could not start: {e}", router.key());
            result.skipped = Some(format!("could not start: {}", first_line(&e)));
            return result;
        }
    };
    let urls = gateway.urls();
    let label = format!("{}/{}", built.kind.key(), router.key());
    // Counters before the traffic (warm-up requests), subtracted below.
    let before = gateway.filter_stats();
    let meter = LoadMeter::start();
    // With an outage: when Envoy's health check and the filter notice it.
    let watch = built.outage.as_ref().and_then(|o| {
        gateway.envoys.first().map(|e| outage::Watch {
            admin: e.admin,
            pod_port: pods.pods[o.pod].port,
            filter_all: router.is_filter().then_some(args.pods as i64),
        })
    });
    let (outcomes, timeline) = match &built.outage {
        Some(o) => outage::drive_with_outage(
            rt,
            &urls,
            &built.requests,
            built.pacing,
            &label,
            args.fresh_connections,
            &mut pods,
            &dir,
            o,
            watch,
        ),
        None => (
            rt.block_on(drive(
                &urls,
                &built.requests,
                built.pacing,
                &label,
                args.fresh_connections,
            )),
            Timeline::default(),
        ),
    };
    result.load = Some(meter.finish());
    if let Some(o) = &built.outage {
        let pod = &pods.pods[o.pod];
        let families: Vec<Option<usize>> = built.requests.iter().map(|r| r.family).collect();
        let mut facts = OutageFacts::of(&outcomes, &families, &pod.name, timeline);
        if let Some(e) = gateway.envoys.first() {
            facts.upstream = outage::upstream_counters(e, pod.port);
        }
        result.live = Some(facts);
    }
    let fs = gateway.filter_stats();
    if router.is_filter() {
        let sum = |n: &str| {
            let name = format!("prefix_router.{n}");
            sum_stat(&fs, &name) - sum_stat(&before, &name)
        };
        result.filter = Some(FilterCounters {
            prefix_match: sum("routed.prefix_match"),
            no_match: sum("routed.no_match"),
            load_guard: sum("routed.load_guard"),
            spread: sum("routed.spread"),
            placed: sum("routed.placed"),
            place_failed: sum("place.failed"),
            passthrough: passthrough(&fs) - passthrough(&before),
            sync_applied: sum("sync.applied"),
            sync_poll_applied: sum("sync.poll_applied"),
            sync_cycles_failed: sum("sync.cycles_failed"),
            cas_exhausted: sum("table.cas_exhausted"),
            passive_cooldowns: sum("fleet.passive_cooldowns"),
            passthrough_reasons: passthrough_reasons(&fs, &before),
            feedback_checked: sum("feedback.checked"),
            feedback_evictions: sum("feedback.evictions_learned"),
            held: sum("hold.held"),
            held_claim: sum("hold.held_claim"),
            hold_timed_out: sum("hold.timed_out"),
            match_trust_s: fs
                .iter()
                .map(|replica| {
                    replica
                        .iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix("prefix_router.match_trust_s.")
                                .map(|pod| (pod.to_string(), *v))
                        })
                        .collect()
                })
                .collect(),
        });
    }
    // (A pod restarted in a live-fleet run counts only since its return.)
    result.pod_hit_tokens = pods.metric_sum("vllm:prefix_cache_hits_total");
    result.pod_query_tokens = pods.metric_sum("vllm:prefix_cache_queries_total");
    result.pod_evicted_blocks = pods.metric_sum("podsim_kv_evicted_blocks_total");
    drop(gateway);
    result.stats = Some(Stats::of(&outcomes, &pods.names()));
    drop(pods);
    result.outcomes = outcomes;
    result.wall_s = wall.elapsed().as_secs_f64();
    result
}

/// Requests the filter passed through unrouted, over replicas.
fn passthrough(stats: &[BTreeMap<String, i64>]) -> i64 {
    stats
        .iter()
        .flat_map(|s| s.iter())
        .filter(|(k, _)| k.starts_with("prefix_router.passthrough."))
        .map(|(_, v)| *v)
        .sum()
}

/// Requests passed through unrouted per reason, over replicas, `after` -
/// `before`; reasons with none left out.
fn passthrough_reasons(
    after: &[BTreeMap<String, i64>],
    before: &[BTreeMap<String, i64>],
) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for (stats, sign) in [(after, 1), (before, -1)] {
        for (k, v) in stats.iter().flat_map(|s| s.iter()) {
            if let Some(reason) = k.strip_prefix("prefix_router.passthrough.") {
                *out.entry(reason.to_string()).or_default() += sign * v;
            }
        }
    }
    out.retain(|_, v| *v != 0);
    out
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// All routers on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub workload: WorkloadKind,
    pub description: String,
    pub requests: usize,
    pub mean_prompt_tokens: f64,
    pub results: Vec<RunResult>,
}

impl WorkloadResult {
    fn get(&self, r: Router) -> Option<&Stats> {
        self.results
            .iter()
            .find(|x| x.router == r)
            .and_then(|x| x.stats.as_ref())
    }
}

fn ms(s: &Option<Summary>, f: impl Fn(&Summary) -> f64) -> String {
    s.as_ref().map_or("-".into(), |s| num(f(s), 0))
}

/// The table of one workload.
pub fn table(w: &WorkloadResult, pods: &[String]) -> Table {
    let mut t = Table::new(
        &format!("{}: {}", w.workload.key(), w.description),
        &[
            "router",
            "ok/sent",
            "err",
            "hit rate",
            "TTFT p50",
            "p90",
            "p99 ms",
            "lat p50 ms",
            "req/s",
            "requests per pod",
            "max/min",
            "match/none/guard/copy",
        ],
    );
    for r in &w.results {
        let Some(s) = &r.stats else {
            t.row(&[r.router.key(), "skipped (see notes)"]);
            continue;
        };
        t.row(&[
            r.router.key().to_string(),
            format!("{}/{}", s.ok, s.sent),
            s.errors.to_string(),
            s.hit_rate.map_or("-".into(), |h| num(h, 3)),
            ms(&s.ttft_ms, |x| x.p50),
            ms(&s.ttft_ms, |x| x.p90),
            ms(&s.ttft_ms, |x| x.p99),
            ms(&s.latency_ms, |x| x.p50),
            num(s.throughput_rps, 1),
            s.pod_counts_label(pods),
            spread_label(s.spread),
            r.filter.as_ref().map_or("-".into(), |f| {
                // New prompts placed through Redis count as "none" too.
                let none = match f.placed {
                    0 => f.no_match.to_string(),
                    p => format!("{} ({p} placed)", f.no_match + p),
                };
                format!("{}/{none}/{}/{}", f.prefix_match, f.load_guard, f.spread)
            }),
        ]);
    }
    t
}

/// The table of the live-fleet workload: errors by when they were sent,
/// hit rate by phase, when Envoy's health check and the filter noticed the
/// pod gone and back, where its groups went, what it served after its
/// return (and how much of that were its old groups, whose records in the
/// filter's table outlive its cache), and Envoy's connect failures to it and
/// retries.
pub fn live_table(w: &WorkloadResult, pods: &[String]) -> Table {
    let victim = format!("pod-{}", LIVE_FLEET_POD + 1);
    let mut t = Table::new(
        &format!("{}: {}", w.workload.key(), w.description),
        &[
            "router",
            "ok/sent",
            "err",
            "in flight at kill",
            "after kill",
            ">2 s after",
            "hit rate",
            "before/outage/after",
            "TTFT p50 ms",
            "requests per pod",
            "seen down s (Envoy/filter)",
            &format!("{victim}'s groups: pods each"),
            "seen back s (Envoy/filter)",
            &format!("{victim} after return"),
            "of its old groups (misses)",
            "first after (s)",
            &format!("{victim} connect fails"),
            "retries",
        ],
    );
    let h = |v: Option<f64>| v.map_or("-".into(), |h| num(h, 2));
    let after = |at: Option<f64>, from: f64| at.map_or("-".into(), |v| num((v - from) / 1000.0, 2));
    for r in &w.results {
        let (Some(s), Some(l)) = (&r.stats, &r.live) else {
            t.row(&[r.router.key(), "skipped (see notes)"]);
            continue;
        };
        let up = |k: &str| {
            if r.router.is_peer() {
                "-".to_string()
            } else {
                l.upstream.get(k).copied().unwrap_or(0).to_string()
            }
        };
        let tl = &l.timeline;
        let seen = |envoy: Option<f64>, filter: Option<f64>, from: f64| {
            if r.router.is_filter() {
                format!("{}/{}", after(envoy, from), after(filter, from))
            } else {
                after(envoy, from)
            }
        };
        t.row(&[
            r.router.key().to_string(),
            format!("{}/{}", s.ok, s.sent),
            s.errors.to_string(),
            l.errors_in_flight.to_string(),
            l.errors_after_kill.to_string(),
            l.errors_late.to_string(),
            s.hit_rate.map_or("-".into(), |h| num(h, 3)),
            format!(
                "{}/{}/{}",
                h(l.before.hit_rate),
                h(l.outage.hit_rate),
                h(l.after.hit_rate)
            ),
            ms(&s.ttft_ms, |x| x.p50),
            s.pod_counts_label(pods),
            seen(tl.envoy_down_ms, tl.filter_down_ms, tl.kill_ms),
            l.pods_per_moved_group.map_or("-".into(), |v| {
                format!("{} ({})", num(v, 2), l.groups_moved)
            }),
            seen(tl.envoy_up_ms, tl.filter_up_ms, tl.back_ms),
            l.served_after_return.to_string(),
            format!(
                "{} ({})",
                l.old_groups_back, l.old_group_misses_after_return
            ),
            l.first_after_return_ms
                .map_or("never".into(), |v| num(v / 1000.0, 1)),
            up("cx_connect_fail"),
            up("upstream_rq_retry"),
        ]);
    }
    t
}

/// One target check.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub name: String,
    pub detail: String,
    /// PASS, MISS or INFO; `n/a` when a needed row is missing.
    pub verdict: String,
}

fn target(name: &str, detail: String, ok: Option<bool>) -> Target {
    Target {
        name: name.into(),
        detail,
        verdict: match ok {
            Some(ok) => verdict(ok).into(),
            None => "n/a".into(),
        },
    }
}

/// "No worse than" allows this much above the peer (noise of one run).
pub const TTFT_TOLERANCE: f64 = 1.05;

/// The targets, from the shared-prefix and concurrency-1 results.
pub fn targets(results: &[WorkloadResult]) -> Vec<Target> {
    let mut out = Vec::new();
    let find = |k: WorkloadKind| results.iter().find(|w| w.workload == k);
    let hit = |w: &WorkloadResult, r: Router| w.get(r).and_then(|s| s.hit_rate);
    let f3 = |v: Option<f64>| v.map_or("-".into(), |v| num(v, 3));
    if let Some(w) = find(WorkloadKind::SharedPrefix) {
        let filter = hit(w, Router::Filter);
        let sg = hit(w, Router::Sglang);
        let rr = hit(w, Router::RoundRobin);
        out.push(target(
            "filter hit rate >= sglang cache_aware",
            format!("{} vs {}", f3(filter), f3(sg)),
            filter.zip(sg).map(|(f, s)| f >= s),
        ));
        out.push(target(
            "filter hit rate >= 3 x round robin",
            format!(
                "{} vs 3 x {} = {}",
                f3(filter),
                f3(rr),
                f3(rr.map(|r| 3.0 * r))
            ),
            filter.zip(rr).map(|(f, r)| f >= 3.0 * r),
        ));
        for (r, label) in [
            (
                Router::Filter3Sync,
                "3 Envoys, periodic sync: hit rate >= 0.95 x one Envoy",
            ),
            (
                Router::Filter3WriteThrough,
                "3 Envoys, write-through: hit rate >= 0.95 x one Envoy",
            ),
        ] {
            let v = hit(w, r);
            out.push(target(
                label,
                format!(
                    "{} vs 0.95 x {} = {}",
                    f3(v),
                    f3(filter),
                    f3(filter.map(|f| 0.95 * f))
                ),
                v.zip(filter).map(|(v, f)| v >= 0.95 * f),
            ));
        }
        let nosync = hit(w, Router::Filter3NoSync);
        let sync = hit(w, Router::Filter3Sync);
        out.push(Target {
            name: "what sync buys (3 Envoys: sync - no sync)".into(),
            detail: format!(
                "{} - {} = {}",
                f3(sync),
                f3(nosync),
                f3(sync.zip(nosync).map(|(a, b)| a - b))
            ),
            verdict: "INFO".into(),
        });
        let ttft = |r: Router| w.get(r).and_then(|s| s.ttft_ms);
        let f = ttft(Router::Filter);
        let rrt = ttft(Router::RoundRobin);
        out.push(target(
            "filter TTFT p50 and p90 better than round robin",
            pair(f, rrt),
            f.zip(rrt).map(|(f, r)| f.p50 < r.p50 && f.p90 < r.p90),
        ));
        for (r, name) in [(Router::Sglang, "sglang"), (Router::Vllm, "vllm-router")] {
            let p = ttft(r);
            out.push(target(
                &format!(
                    "filter TTFT p50 and p90 no worse than {name} (within {:.0} %)",
                    (TTFT_TOLERANCE - 1.0) * 100.0
                ),
                pair(f, p),
                f.zip(p).map(|(f, p)| {
                    f.p50 <= p.p50 * TTFT_TOLERANCE && f.p90 <= p.p90 * TTFT_TOLERANCE
                }),
            ));
        }
    }
    if let Some(w) = find(WorkloadKind::LiveFleet) {
        out.extend(live_targets(w));
    }
    for kind in [
        WorkloadKind::HighLoad,
        WorkloadKind::CachePressure,
        WorkloadKind::HeteroFleet,
    ] {
        if let Some(w) = find(kind) {
            out.extend(peer_targets(w));
            out.extend(replica_peer_targets(w));
        }
    }
    if let Some(w) = find(WorkloadKind::Tenants) {
        let best_hit = [Router::Sglang, Router::Vllm, Router::RoundRobin]
            .iter()
            .filter_map(|&r| hit(w, r))
            .fold(None, |a: Option<f64>, h| {
                Some(a.map_or(h, |a: f64| a.max(h)))
            });
        for r in [Router::Filter, Router::Filter3WriteThrough] {
            let Some(s) = w.get(r) else { continue };
            out.push(target(
                &format!(
                    "tenants: {} requests per pod max/min <= 1.5 at hit rate >= best peer",
                    r.key()
                ),
                format!(
                    "{} at {} vs {}",
                    spread_label(s.spread),
                    f3(s.hit_rate),
                    f3(best_hit)
                ),
                s.spread
                    .zip(s.hit_rate.zip(best_hit))
                    .map(|(m, (h, b))| m <= 1.5 && h >= b),
            ));
        }
    }
    if let Some(w) = find(WorkloadKind::NoSharing) {
        let p99 = |r: Router| w.get(r).and_then(|s| s.ttft_ms).map(|t| t.p99);
        let one = p99(Router::Filter);
        for r in [
            Router::Filter3Sync,
            Router::Filter3WriteThrough,
            Router::Filter3Share,
            Router::Filter3Place,
        ] {
            let three = p99(r);
            out.push(target(
                &format!("no sharing: {} TTFT p99 <= 1.1 x one Envoy's", r.key()),
                format!(
                    "{} vs 1.1 x {} ms",
                    three.map_or("-".into(), |v| num(v, 0)),
                    one.map_or("-".into(), |v| num(v, 0))
                ),
                three.zip(one).map(|(t, o)| t <= 1.1 * o),
            ));
        }
    }
    if let Some(w) = find(WorkloadKind::Concurrency1) {
        let s = w.get(Router::Filter);
        out.push(target(
            "concurrency 1: filter spreads new prefixes (requests per pod max/min <= 2)",
            s.map_or("-".into(), |s| spread_label(s.spread)),
            s.map(|s| s.spread.is_some_and(|v| v <= 2.0)),
        ));
        let others: Vec<String> = w
            .results
            .iter()
            .filter_map(|r| {
                let s = r.stats.as_ref()?;
                Some(format!("{} {}", r.router.key(), spread_label(s.spread)))
            })
            .collect();
        out.push(Target {
            name: "concurrency 1: max/min of every router".into(),
            detail: others.join(", "),
            verdict: "INFO".into(),
        });
    }
    out
}

/// The targets on one scenario, for every filter row that ran (one
/// Envoy and the 3-Envoy fleets): hit rate >= the best peer's, TTFT p90 and
/// p99 <= the best peer's (peers: sglang, vllm-router, round robin; the
/// best of each figure, whichever router has it).
fn peer_targets(w: &WorkloadResult) -> Vec<Target> {
    let judged = |r: Router| r.is_filter() && r != Router::Filter3NoSync;
    best_peer_targets(
        w,
        &[Router::Sglang, Router::Vllm, Router::RoundRobin],
        judged,
        "best peer",
    )
}

/// The same checks for the 3-Envoy fleets against the peers run as three
/// processes each (`sglang-3x`, `vllm-3x`, and round robin), as a peer is
/// deployed for high availability; only when such a peer row ran. These
/// are context: the targets are [`peer_targets`], against one peer
/// process, which sees every request.
fn replica_peer_targets(w: &WorkloadResult) -> Vec<Target> {
    if !w.results.iter().any(|r| r.router.is_peer_fleet()) {
        return Vec::new();
    }
    let judged = |r: Router| {
        r.is_filter()
            && !matches!(
                r,
                Router::Filter | Router::FilterAibrix | Router::Filter3NoSync
            )
    };
    best_peer_targets(
        w,
        &[Router::Sglang3, Router::Vllm3, Router::RoundRobin],
        judged,
        "best 3-replica peer",
    )
}

/// Hit rate >= the best of `peers`' and TTFT p90 and p99 <= theirs (the
/// best of each figure, whichever peer has it), for every row `judged`
/// picks; `label` names the peers in the target's name.
fn best_peer_targets(
    w: &WorkloadResult,
    peers: &[Router],
    judged: impl Fn(Router) -> bool,
    label: &str,
) -> Vec<Target> {
    let stats: Vec<&Stats> = peers.iter().filter_map(|&r| w.get(r)).collect();
    let best_hit = stats
        .iter()
        .filter_map(|s| s.hit_rate)
        .fold(None, |a: Option<f64>, h| Some(a.map_or(h, |a| a.max(h))));
    let best = |f: fn(&Summary) -> f64| {
        stats
            .iter()
            .filter_map(|s| s.ttft_ms.as_ref().map(f))
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.min(v))))
    };
    let (best_p90, best_p99) = (best(|t| t.p90), best(|t| t.p99));
    let f0 = |v: Option<f64>| v.map_or("-".into(), |v| num(v, 0));
    let f3 = |v: Option<f64>| v.map_or("-".into(), |v| num(v, 3));
    let mut out = Vec::new();
    for r in &w.results {
        if !judged(r.router) {
            continue;
        }
        let Some(s) = &r.stats else { continue };
        let k = format!("{}: {}", w.workload.key(), r.router.key());
        out.push(target(
            &format!("{k} hit rate >= {label}"),
            format!("{} vs {}", f3(s.hit_rate), f3(best_hit)),
            s.hit_rate.zip(best_hit).map(|(a, b)| a >= b),
        ));
        let p = |f: fn(&Summary) -> f64| s.ttft_ms.as_ref().map(f);
        out.push(target(
            &format!("{k} TTFT p90 and p99 <= {label}"),
            format!(
                "{}/{} ms vs {}/{} ms",
                f0(p(|t| t.p90)),
                f0(p(|t| t.p99)),
                f0(best_p90),
                f0(best_p99)
            ),
            p(|t| t.p90)
                .zip(best_p90)
                .zip(p(|t| t.p99).zip(best_p99))
                .map(|((a, b), (c, d))| a <= b && c <= d),
        ));
    }
    out
}

/// The live-fleet checks: the filter fails no more than round robin, hits
/// more, fails nothing once the pod could be known gone, and uses the pod
/// again soon after it returns (the 2 s and 5 s bounds).
fn live_targets(w: &WorkloadResult) -> Vec<Target> {
    let get = |r: Router| {
        w.results
            .iter()
            .find(|x| x.router == r)
            .and_then(|x| Some((x.stats.as_ref()?, x.live.as_ref()?)))
    };
    let f = get(Router::Filter);
    let rr = get(Router::RoundRobin);
    let f3 = |v: Option<f64>| v.map_or("-".into(), |v| num(v, 3));
    let errs = |x: Option<(&Stats, &OutageFacts)>| {
        x.map_or("-".into(), |(_, l)| l.errors_after_kill.to_string())
    };
    let hit = |x: Option<(&Stats, &OutageFacts)>| x.and_then(|(s, _)| s.hit_rate);
    vec![
        // Requests in flight on the pod when it dies fail under any router
        // (their replies have started): compare what was sent after.
        target(
            "live fleet: filter errors among requests sent after the kill <= round robin's",
            format!("{} vs {}", errs(f), errs(rr)),
            f.zip(rr)
                .map(|((_, a), (_, b))| a.errors_after_kill <= b.errors_after_kill),
        ),
        target(
            "live fleet: filter hit rate > round robin's",
            format!("{} vs {}", f3(hit(f)), f3(hit(rr))),
            hit(f).zip(hit(rr)).map(|(a, b)| a > b),
        ),
        target(
            "live fleet: filter, no failed request sent > 2 s after the kill",
            f.map_or("-".into(), |(_, l)| format!("{} failed", l.errors_late)),
            f.map(|(_, l)| l.errors_late == 0),
        ),
        target(
            "live fleet: filter uses the returned pod within 5 s",
            f.map_or("-".into(), |(_, l)| {
                l.first_after_return_ms.map_or("never".into(), |v| {
                    format!(
                        "after {} s, {} requests",
                        num(v / 1000.0, 1),
                        l.served_after_return
                    )
                })
            }),
            f.map(|(_, l)| l.first_after_return_ms.is_some_and(|v| v <= 5000.0)),
        ),
    ]
}

fn pair(a: Option<Summary>, b: Option<Summary>) -> String {
    let f = |s: Option<Summary>| {
        s.map_or("-".into(), |s| {
            format!("{}/{}", num(s.p50, 0), num(s.p90, 0))
        })
    };
    format!("p50/p90 {} ms vs {} ms", f(a), f(b))
}

/// The targets as a table.
pub fn targets_table(t: &[Target]) -> Table {
    let mut table = Table::new("Targets", &["target", "measured", "verdict"]);
    for x in t {
        table.row(&[x.name.clone(), x.detail.clone(), x.verdict.clone()]);
    }
    table
}

/// The chart: one row per workload, panels hit rate / TTFT / requests per pod.
pub fn svg(results: &[WorkloadResult], pods: &[String], title: &str) -> String {
    let mut rows = Vec::new();
    for w in results {
        let ran: Vec<&RunResult> = w.results.iter().filter(|r| r.stats.is_some()).collect();
        let cats: Vec<String> = ran.iter().map(|r| r.router.key().to_string()).collect();
        let stat = |f: &dyn Fn(&Stats) -> Option<f64>| -> Vec<Option<f64>> {
            ran.iter().map(|r| r.stats.as_ref().and_then(f)).collect()
        };
        let hit = Panel {
            title: "token-weighted cache hit rate".into(),
            categories: cats.clone(),
            series: vec![("hit rate".into(), stat(&|s| s.hit_rate))],
            y_max: Some(1.0),
            decimals: 2,
        };
        let ttft = Panel {
            title: "TTFT, ms".into(),
            categories: cats.clone(),
            series: vec![
                ("p50".into(), stat(&|s| s.ttft_ms.map(|t| t.p50))),
                ("p90".into(), stat(&|s| s.ttft_ms.map(|t| t.p90))),
            ],
            y_max: None,
            decimals: 0,
        };
        let per_pod = Panel {
            title: "requests per pod".into(),
            categories: cats.clone(),
            series: pods
                .iter()
                .map(|p| (p.clone(), stat(&|s| s.per_pod.get(p).map(|&n| n as f64))))
                .collect(),
            y_max: None,
            decimals: 0,
        };
        rows.push((
            format!("{}: {}", w.workload.key(), w.description),
            vec![hit, ttft, per_pod],
        ));
    }
    chart::render(title, &rows)
}

/// Output files of one run.
pub struct Written {
    pub json: PathBuf,
    pub svg: Option<PathBuf>,
    pub txt: PathBuf,
}

impl Written {
    /// Prints where the files went and the wall time.
    pub fn print(&self, wall_s: f64) {
        println!("\nresults: {}", self.json.display());
        if let Some(svg) = &self.svg {
            println!("chart:   {}", svg.display());
        }
        println!("table:   {}\nwall time: {wall_s:.0} s", self.txt.display());
    }
}

/// Writes `<dir>/<stem>-<unix secs>.{json,svg,txt}` (no SVG when None).
pub fn write_outputs(
    dir: Option<&PathBuf>,
    stem: &str,
    json: &Value,
    svg: Option<&str>,
    txt: &str,
) -> Written {
    let dir = dir.cloned().unwrap_or_else(results_dir);
    std::fs::create_dir_all(&dir).expect("create results dir");
    let dir = dir.canonicalize().unwrap_or(dir);
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = dir.join(format!("{stem}-{secs}"));
    let with = |ext: &str| base.with_extension(ext);
    let w = Written {
        json: with("json"),
        svg: svg.map(|_| with("svg")),
        txt: with("txt"),
    };
    std::fs::write(
        &w.json,
        serde_json::to_string_pretty(json).expect("serialize results"),
    )
    .expect("write JSON");
    if let (Some(path), Some(svg)) = (&w.svg, svg) {
        std::fs::write(path, svg).expect("write SVG");
    }
    std::fs::write(&w.txt, txt).expect("write table text");
    w
}

/// The setup, as printed before the run and stored in the JSON.
fn setup_lines(args: &CompareArgs, opts: &GatewayOptions) -> Vec<String> {
    let m = args.pod_model();
    let kv_tokens = m.kv_capacity_blocks * m.kv_block_tokens;
    let distinct = args.groups * args.system_tokens;
    let mut lines = vec![
        format!(
            "pods: {} x podsim --slots {} --prefill-us-per-token {} --decode-us-per-token {} \
             --kv-block-tokens {} --kv-capacity-blocks {} ({} tokens each) --time-scale {}{}; \
             fresh (cold) pods for every router and workload",
            args.pods,
            m.slots,
            m.prefill_us_per_token,
            m.decode_us_per_token,
            m.kv_block_tokens,
            m.kv_capacity_blocks,
            kv_tokens,
            m.time_scale,
            if m.prefill_stalls_decode {
                " --prefill-stalls-decode"
            } else {
                ""
            }
        ),
        format!(
            "cache pressure: {} distinct system-prompt tokens in shared-prefix = {:.2} x one pod's \
             cache, {:.2} x the fleet's",
            distinct,
            distinct as f64 / f64::from(kv_tokens.max(1)),
            distinct as f64 / (f64::from(kv_tokens.max(1)) * args.pods as f64)
        ),
        format!(
            "service time with nothing cached (mean shared-prefix prompt): {:.0} ms; with the \
             system prompt cached: {:.0} ms",
            m.service_s(
                (args.system_tokens + args.question_tokens) as f64,
                f64::from(args.output_tokens)
            ) * 1000.0,
            m.service_s(args.question_tokens as f64, f64::from(args.output_tokens)) * 1000.0
        ),
        format!(
            "Envoy: --concurrency {} alone, {} per replica of 3; sync period {} ms (poll 175 ms, \
             full scan every 6), {}; seed {}; client: {}",
            opts.single_concurrency,
            opts.replica_concurrency,
            opts.sync_period_ms,
            if opts.warm_sync {
                "synced fleets warmed up (a warm-up request per replica, every replica polling) \
                 before traffic"
            } else {
                "synced fleets cold (empty Redis, no warm-up)"
            },
            args.seed,
            if args.fresh_connections {
                "a new connection per request"
            } else {
                "keep-alive connections (pooled)"
            }
        ),
    ];
    if let Some(patch) = &opts.filter_patch {
        lines.push(format!("filter routers' plugin configuration + {patch}"));
    }
    lines
}

/// One comparison: every workload with every router; prints and writes
/// its tables, returns its target checks.
/// One comparison: prints and writes its tables; returns its targets and
/// every router's figures (for `--repeat`'s summaries).
pub fn run(rt: &tokio::runtime::Runtime, args: &CompareArgs) -> (Vec<Target>, Vec<league::Entry>) {
    let wall = Instant::now();
    let opts = GatewayOptions {
        sync_period_ms: args.sync_period_ms,
        warm_sync: args.warm_sync,
        filter_patch: args.filter_patch.clone(),
        single_concurrency: args.single_concurrency,
        replica_concurrency: args.replica_concurrency,
        ..GatewayOptions::default()
    };
    let mut text = String::from("prefix-bench compare\n");
    for l in setup_lines(args, &opts) {
        let _ = writeln!(text, "  {l}");
    }
    print!("{text}");
    if args.routers.iter().any(|r| r.is_peer()) && !peers_installed() {
        println!("  note: peers venv missing, sglang and vllm rows are skipped (scripts/bench/setup-peers.sh)");
    }
    let pod_names: Vec<String> = (1..=args.pods).map(|i| format!("pod-{i}")).collect();
    let mut results = Vec::new();
    for &kind in &args.workloads {
        let built = build(kind, args);
        eprintln!(
            "{}: {} requests; {}",
            kind.key(),
            built.requests.len(),
            built.description
        );
        let mut w = WorkloadResult {
            workload: kind,
            description: built.description.clone(),
            requests: built.requests.len(),
            mean_prompt_tokens: built.mean_prompt_tokens,
            results: Vec::new(),
        };
        for &router in &args.routers {
            w.results.push(run_one(rt, &built, router, args, &opts));
        }
        let t = if kind == WorkloadKind::LiveFleet {
            live_table(&w, &pod_names).render()
        } else {
            table(&w, &pod_names).render()
        };
        print!("{t}");
        text.push_str(&t);
        results.push(w);
    }
    let checks = targets(&results);
    if !checks.is_empty() {
        let t = targets_table(&checks).render();
        print!("{t}");
        text.push_str(&t);
    }
    let notes = notes(&results);
    for n in &notes {
        println!("note: {n}");
        let _ = writeln!(text, "note: {n}");
    }
    let wall_s = wall.elapsed().as_secs_f64();
    let m = args.pod_model();
    let json = json!({
        "command": "compare",
        "setup": setup_lines(args, &opts),
        "pods": args.pods,
        "pod_model": m,
        "seed": args.seed,
        "scale": args.scale,
        "sync_period_ms": args.sync_period_ms,
        "fresh_connections": args.fresh_connections,
        "warm_sync": args.warm_sync,
        "workloads": results,
        "targets": checks,
        "notes": notes,
        "wall_s": wall_s,
    });
    let svg = svg(
        &results,
        &pod_names,
        "prefix-bench compare: routers side by side",
    );
    let _ = writeln!(text, "wall time: {wall_s:.0} s");
    let files = write_outputs(
        args.results_dir.as_ref(),
        "compare",
        &json,
        Some(&svg),
        &text,
    );
    files.print(wall_s);
    (checks, league::entries(&results))
}

/// Facts worth a line under the tables: errors, noisy runs, pods' view.
fn notes(results: &[WorkloadResult]) -> Vec<String> {
    let mut out = Vec::new();
    for w in results {
        for r in &w.results {
            let key = format!("{}/{}", w.workload.key(), r.router.key());
            if let Some(why) = &r.skipped {
                out.push(format!("{key}: skipped: {why}"));
            }
            if let Some(s) = &r.stats {
                if s.errors > 0 {
                    out.push(format!(
                        "{key}: {} errors, e.g. {:?}",
                        s.errors, s.error_samples
                    ));
                }
                if s.without_usage > 0 {
                    out.push(format!("{key}: {} replies without usage", s.without_usage));
                }
            }
            if let Some(l) = &r.load {
                if l.others_cores + l.steal_cores > 0.3 {
                    out.push(format!(
                        "{key}: other processes used {:.2} cores during the run (latencies skewed)",
                        l.others_cores + l.steal_cores
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(hit: f64, p50: f64, p90: f64, per_pod: &[usize]) -> Stats {
        let pods: Vec<String> = (1..=per_pod.len()).map(|i| format!("pod-{i}")).collect();
        let mut outcomes = Vec::new();
        let mut i = 0;
        for (p, &n) in per_pod.iter().enumerate() {
            for _ in 0..n {
                outcomes.push(Outcome {
                    index: i,
                    status: 200,
                    pod: Some(pods[p].clone()),
                    prompt_tokens: Some(1000),
                    cached_tokens: Some((hit * 1000.0) as u64),
                    ttft_ms: Some(if i % 2 == 0 { p50 } else { p90 }),
                    ..Outcome::default()
                });
                i += 1;
            }
        }
        Stats::of(&outcomes, &pods)
    }

    fn result(router: Router, s: Stats) -> RunResult {
        RunResult {
            router,
            description: String::new(),
            skipped: None,
            stats: Some(s),
            filter: None,
            pod_hit_tokens: 0.0,
            pod_query_tokens: 0.0,
            pod_evicted_blocks: 0.0,
            load: None,
            wall_s: 0.0,
            live: None,
            outcomes: Vec::new(),
        }
    }

    fn workload(kind: WorkloadKind, results: Vec<RunResult>) -> WorkloadResult {
        WorkloadResult {
            workload: kind,
            description: String::new(),
            requests: 0,
            mean_prompt_tokens: 0.0,
            results,
        }
    }

    #[test]
    fn repeated_runs_count_each_targets_passes() {
        let t = |name: &str, detail: &str, verdict: &str| Target {
            name: name.into(),
            detail: detail.into(),
            verdict: verdict.into(),
        };
        let runs = vec![
            vec![t("a", "1 vs 2", "PASS"), t("b", "3 vs 2", "MISS")],
            vec![t("a", "2 vs 1", "MISS"), t("b", "1 vs 2", "PASS")],
            vec![t("a", "1 vs 1", "PASS"), t("c", "1 vs -", "n/a")],
        ];
        let out = repeat_summary(&runs).render();
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_default()
                .to_string()
        };
        assert!(line("a ").contains("2/3"), "{out}");
        assert!(line("a ").contains("1 vs 2 | 2 vs 1 | 1 vs 1"), "{out}");
        // A target a run lacks counts as not passed there.
        assert!(line("b ").contains("1/3"), "{out}");
        // One that no run could judge (a peer row missing) is n/a.
        assert!(line("c ").contains("n/a"), "{out}");
    }

    #[test]
    fn targets_pass_and_miss() {
        let sp = workload(
            WorkloadKind::SharedPrefix,
            vec![
                result(Router::RoundRobin, stats(0.2, 100.0, 200.0, &[5, 5])),
                result(Router::Filter, stats(0.8, 10.0, 20.0, &[5, 5])),
                result(Router::Filter3Sync, stats(0.77, 10.0, 20.0, &[5, 5])),
                result(
                    Router::Filter3WriteThrough,
                    stats(0.75, 10.0, 20.0, &[5, 5]),
                ),
                result(Router::Sglang, stats(0.7, 10.0, 19.5, &[5, 5])),
            ],
        );
        let c1 = workload(
            WorkloadKind::Concurrency1,
            vec![
                result(Router::Filter, stats(0.5, 1.0, 1.0, &[3, 2])),
                result(Router::Sglang, stats(0.5, 1.0, 1.0, &[5, 0])),
            ],
        );
        let t = targets(&[sp, c1]);
        let v = |prefix: &str| {
            t.iter()
                .find(|x| x.name.starts_with(prefix))
                .map(|x| x.verdict.clone())
                .unwrap()
        };
        assert_eq!(v("filter hit rate >= sglang"), "PASS");
        assert_eq!(v("filter hit rate >= 3 x"), "PASS", "0.8 >= 0.6");
        assert_eq!(v("3 Envoys, periodic"), "PASS", "0.77 >= 0.76");
        assert_eq!(v("3 Envoys, write-through"), "MISS", "0.75 < 0.76");
        assert_eq!(v("filter TTFT p50 and p90 better"), "PASS");
        assert_eq!(
            v("filter TTFT p50 and p90 no worse than sglang"),
            "PASS",
            "20 <= 19.5 x 1.05"
        );
        assert_eq!(v("filter TTFT p50 and p90 no worse than vllm"), "n/a");
        assert_eq!(v("what sync buys"), "INFO");
        assert_eq!(v("concurrency 1: filter"), "PASS", "3/2 = 1.5");
        let all = t.iter().find(|x| x.name.contains("every router")).unwrap();
        assert!(all.detail.contains("sglang inf"), "{}", all.detail);
    }

    #[test]
    fn three_replica_fleets_also_face_the_peers_at_three_replicas() {
        let hl = |with_fleets: bool| {
            let mut rows = vec![
                result(Router::Filter, stats(0.9, 10.0, 30.0, &[5, 5])),
                result(Router::Filter3Place, stats(0.85, 10.0, 40.0, &[5, 5])),
                result(Router::Sglang, stats(0.88, 10.0, 35.0, &[5, 5])),
            ];
            if with_fleets {
                rows.push(result(Router::Sglang3, stats(0.80, 10.0, 50.0, &[5, 5])));
                rows.push(result(Router::Vllm3, stats(0.86, 10.0, 60.0, &[5, 5])));
            }
            workload(WorkloadKind::HighLoad, rows)
        };
        let t = targets(&[hl(true)]);
        let v = |name: &str| {
            t.iter()
                .find(|x| x.name == name)
                .map(|x| (x.verdict.clone(), x.detail.clone()))
        };
        // Against one peer process: 0.85 < 0.88.
        let strict = v("high-load: filter-3x-place hit rate >= best peer").unwrap();
        assert_eq!(strict.0, "MISS", "{strict:?}");
        // Against the best of the 3-process peers (0.86, p90 50): a miss on
        // hit rate, a pass on TTFT (p90 40 <= 50, p99 alike).
        let fleet = v("high-load: filter-3x-place hit rate >= best 3-replica peer").unwrap();
        assert_eq!(fleet, ("MISS".into(), "0.850 vs 0.860".into()));
        let ttft = v("high-load: filter-3x-place TTFT p90 and p99 <= best 3-replica peer").unwrap();
        assert_eq!(ttft.0, "PASS", "{ttft:?}");
        // One Envoy is judged against one peer process only.
        assert!(v("high-load: filter hit rate >= best 3-replica peer").is_none());
        // Without a 3-process peer row, no such line.
        assert!(targets(&[hl(false)])
            .iter()
            .all(|x| !x.name.contains("3-replica")));
    }

    #[test]
    fn live_fleet_mixes_groups_and_fresh_prompts_and_schedules_the_outage() {
        let mut args = CompareArgs::defaults();
        args.live_groups = 4;
        args.system_tokens = 64;
        args.question_tokens = 8;
        args.live_secs = 6.0;
        args.live_rate = 10.0;
        let b = build(WorkloadKind::LiveFleet, &args);
        assert_eq!(b.requests.len(), 60);
        let fresh: Vec<usize> = (0..60)
            .filter(|&i| b.requests[i].family.is_none())
            .collect();
        assert_eq!(fresh.len(), 15);
        assert!(fresh.iter().all(|i| i % 4 == 3), "{fresh:?}");
        // A fresh prompt shares no block-sized prefix with any group.
        let prompt = |r: &Request| {
            let v: Value = serde_json::from_str(&r.body).unwrap();
            v["prompt"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v["messages"][0]["content"].as_str().unwrap().to_string())
        };
        for f in fresh.iter().map(|&i| prompt(&b.requests[i])) {
            for g in b.requests.iter().filter(|r| r.family.is_some()) {
                assert_ne!(f[..128], prompt(g)[..128]);
            }
        }
        let o = b.outage.unwrap();
        assert_eq!(o.pod, LIVE_FLEET_POD);
        assert_eq!((o.kill_at.as_secs(), o.return_at.as_secs()), (2, 4));
        assert!(matches!(b.pacing, Pacing::Poisson { rate_per_sec, .. } if rate_per_sec == 10.0));
        assert!(build(WorkloadKind::SharedPrefix, &args).outage.is_none());
    }

    #[test]
    fn derived_rate_follows_the_pod_model() {
        let args = CompareArgs::defaults();
        // 4224 tokens x 50 us + 31 x 3 ms = 304.2 ms; 0.75 x 16 slots / 0.3042 s.
        let r = derived_rate(&args, 4224.0);
        assert!((r - 39.4).abs() < 0.1, "{r}");
    }

    #[test]
    fn auto_kv_capacity_is_one_and_a_half_fair_shares() {
        let args = CompareArgs::defaults();
        // 32 x 4096 tokens / 4 pods x 1.5 / 16 tokens per block.
        assert_eq!(args.kv_blocks(), 3072);
    }

    #[test]
    fn workloads_are_deterministic_and_sized() {
        let mut args = CompareArgs::defaults();
        args.groups = 4;
        args.prompts_per_group = 3;
        args.sessions = 2;
        args.turns = 3;
        args.scale = 1.0;
        for kind in WorkloadKind::ALL {
            let a = build(kind, &args);
            let b = build(kind, &args);
            assert_eq!(a.requests, b.requests);
            assert!(a.requests.iter().all(|r| r.stream));
        }
        assert_eq!(build(WorkloadKind::SharedPrefix, &args).requests.len(), 12);
        assert_eq!(build(WorkloadKind::Concurrency1, &args).requests.len(), 8);
        assert_eq!(build(WorkloadKind::Chat, &args).requests.len(), 6);
        assert_eq!(
            build(WorkloadKind::Concurrency1, &args).pacing,
            Pacing::Closed { concurrency: 1 }
        );
        args.concurrency = Some(3);
        assert_eq!(
            build(WorkloadKind::SharedPrefix, &args).pacing,
            Pacing::Closed { concurrency: 3 }
        );
        assert!(parse_workloads("chat,no-sharing").is_ok());
        assert!(parse_workloads("x").is_err());
    }
}
