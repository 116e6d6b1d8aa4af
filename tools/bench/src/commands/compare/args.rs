//! The options of `compare` and its command-line flags.

use std::path::PathBuf;

use super::results::{parse_workloads, WorkloadKind};
use crate::scenario::{PodModel, Router};

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
    /// Warm the synced fleets up before traffic (see [`crate::scenario::GatewayOptions`]).
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

    pub(super) fn pod_model(&self) -> PodModel {
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
    /// '{"hold":{"enabled":false}}' (the other routers unchanged).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_kv_capacity_is_one_and_a_half_fair_shares() {
        let args = CompareArgs::defaults();
        // 32 x 4096 tokens / 4 pods x 1.5 / 16 tokens per block.
        assert_eq!(args.kv_blocks(), 3072);
    }
}
