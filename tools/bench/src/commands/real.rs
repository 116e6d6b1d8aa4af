//! `prefix-bench real`: the comparison against a real LLM. Two `llama-server`
//! processes (Gemma 3 270M Q4_K_M on CPU, `scripts/bench/start-llama.sh`:
//! 2 slots of 2048 tokens each, 1 thread, `--cache-ram 0`, `--swa-full`)
//! behind plain round-robin Envoy, the filter, sglang-router and vllm-router
//! (`cache_aware`). Cached tokens are llama.cpp's own
//! (`usage.prompt_tokens_details.cached_tokens`), TTFT is real prefill.
//!
//! llama-server does not say who answered, so each one sits behind a
//! [`TagProxy`] (`x-served-by: llama-N`), the same for every router. Fresh
//! servers (cold caches) for every router.
//!
//! Sizing: a server with `-np 2` keeps about 2 prefixes warm (one per slot),
//! so the default workload has groups = servers x 2; cold prefill is ~2.4 s
//! per 500 tokens on one thread, so prompts stay ~300 tokens.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::decide::{list, parse_setups, summary_table, Figures, Setup};
use crate::commands::compare::{
    self, table, targets, targets_table, RunResult, WorkloadKind, WorkloadResult,
};
use crate::drive::drive;
use crate::metrics::Stats;
use crate::peer::{bench_dir, peers_installed};
use crate::procstat::LoadMeter;
use crate::report::write_outputs;
use crate::runner::Pacing;
use crate::scenario::{Gateway, GatewayOptions, Router};
use crate::tagproxy::TagProxy;
use crate::workload::{
    chat_sessions, shared_prefix, zipf_prefix, ApiMix, BodyOptions, ChatOrder, ChatSessions, Order,
    SharedPrefix, Streaming, ZipfPrefix,
};
use harness::{self, Service, TestDir};

/// Gemma's tokenizer on the harness's filler text: ~4.5 bytes per token.
const BYTES_PER_GEMMA_TOKEN: f64 = 4.5;

/// The command-line flags of `prefix-bench real`.
#[derive(clap::Args, Clone, Debug)]
pub struct RealCli {
    /// Routers: round-robin, filter, sglang, vllm (comma-separated) or all.
    #[arg(long, default_value = "round-robin,filter,sglang,vllm")]
    pub routers: String,
    /// llama-server processes (each -np 2, 1 thread).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Shared-prefix groups (keep <= servers x 2: a server keeps ~2 warm).
    #[arg(long, default_value_t = 4)]
    pub groups: usize,
    #[arg(long, default_value_t = 8)]
    pub prompts_per_group: usize,
    /// System prompt, Gemma tokens (approximate: 4.5 bytes each).
    #[arg(long, default_value_t = 300)]
    pub system_tokens: usize,
    #[arg(long, default_value_t = 32)]
    pub question_tokens: usize,
    #[arg(long, default_value_t = 16)]
    pub output_tokens: u32,
    /// Closed loop with this many in flight.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Poisson arrivals at this rate instead of the closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// LLAMA_CACHE_RAM for start-llama.sh (MiB of host-RAM prompt cache; 0 = off).
    #[arg(long, default_value_t = 0)]
    pub cache_ram_mib: u32,
    /// Seeds, comma-separated: the whole run once per seed, setups
    /// alternating (order rotated per seed); with more than one, it ends
    /// with medians and ranges.
    #[arg(long, default_value = "7")]
    pub seeds: String,
    /// shared-prefix (groups x prompts, shuffled), tenants (each request a
    /// question to one of `groups` system prompts drawn uniformly) or
    /// sessions (`groups` chat conversations of `prompts-per-group` turns,
    /// interleaved at random).
    #[arg(long, default_value = "shared-prefix")]
    pub workload: String,
    /// More filter setups being tried, as `decide --variant`:
    /// `name[@router]=JSON` or `name[@router]=module.wasm`.
    #[arg(long)]
    pub variant: Vec<String>,
    /// Output directory (default results/).
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
}

/// One llama-server child, stopped by PID on drop.
pub struct LlamaServer {
    _service: Service,
    pub port: u16,
    pub log: PathBuf,
}

impl LlamaServer {
    /// Starts `start-llama.sh PORT gemma-270m` and waits for `GET /health` 200.
    pub fn start(dir: &TestDir, name: &str, cache_ram_mib: u32) -> Result<LlamaServer, String> {
        let port = harness::free_port();
        let log = dir.join(&format!("{name}.log"));
        let script = harness::repo_root().join("scripts/bench/start-llama.sh");
        let mut cmd = Command::new(&script);
        cmd.arg(port.to_string())
            .arg("gemma-270m")
            .env("LLAMA_CACHE_RAM", cache_ram_mib.to_string())
            .current_dir(harness::repo_root());
        let url = format!("http://127.0.0.1:{port}/health");
        let ready = || harness::get(&url).is_ok_and(|r| r.status == 200);
        let service = Service::start(name, &mut cmd, log.clone(), Duration::from_secs(120), ready)?;
        Ok(LlamaServer {
            _service: service,
            port,
            log,
        })
    }

    /// `llamacpp:*` counters of `/metrics`.
    pub fn metrics(&self) -> Vec<(String, f64)> {
        let Ok(r) = harness::get(&format!("http://127.0.0.1:{}/metrics", self.port)) else {
            return Vec::new();
        };
        r.body
            .lines()
            .filter(|l| l.starts_with("llamacpp:"))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }
}

/// Is the real-LLM setup there (`scripts/bench/setup-real-llm.sh` ran)?
pub fn llama_installed() -> bool {
    bench_dir().join("bin/llama-server").exists()
        && bench_dir().join("models/gemma3-270m-q4_k_m.gguf").is_file()
}

/// Per-server counters after a run.
#[derive(Clone, Debug, Serialize)]
struct ServerMetrics {
    name: String,
    metrics: Vec<(String, f64)>,
}

pub fn main(rt: &tokio::runtime::Runtime, cli: RealCli) {
    if !llama_installed() {
        eprintln!("prefix-bench real: llama-server or the model is missing: run scripts/bench/setup-real-llm.sh");
        std::process::exit(1);
    }
    let setups = match parse_setups(&cli.routers, &cli.variant) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("prefix-bench real: {e}");
            std::process::exit(2);
        }
    };
    let seeds = match list(&cli.seeds, "seed", |p| p.parse::<u64>().ok()) {
        Ok(v) if !v.is_empty() => v,
        Ok(_) => {
            eprintln!("prefix-bench real: --seeds: none given");
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("prefix-bench real: --seeds: {e}");
            std::process::exit(2);
        }
    };
    if !["shared-prefix", "tenants", "sessions"].contains(&cli.workload.as_str()) {
        eprintln!("prefix-bench real: --workload: one of shared-prefix, tenants, sessions");
        std::process::exit(2);
    }
    let mut all: std::collections::BTreeMap<String, Vec<Figures>> = Default::default();
    for (i, &seed) in seeds.iter().enumerate() {
        let mut order = setups.clone();
        let n = order.len().max(1);
        order.rotate_left(i % n);
        run_seed(rt, &cli, &order, seed, &mut all);
    }
    if seeds.len() > 1 {
        let t = summary_table(
            &format!(
                "real, {}: median [range] over seeds {:?}",
                cli.workload, seeds
            ),
            &setups,
            &all,
        );
        print!("{}", t.render());
        let json = json!({"command": "real --seeds", "workload": cli.workload, "seeds": seeds, "runs": all});
        write_outputs(
            cli.results_dir.as_ref(),
            "real-seeds",
            &json,
            None,
            &t.render(),
        )
        .print(0.0);
    }
}

/// The requests of `cli.workload` for `seed`.
fn real_requests(cli: &RealCli, seed: u64) -> (Vec<crate::workload::Request>, String) {
    let tokens = |t: usize| (t as f64 * BYTES_PER_GEMMA_TOKEN) as usize;
    let body = BodyOptions {
        model: "gemma-270m".into(),
        max_tokens: cli.output_tokens,
        streaming: Streaming::Always,
    };
    match cli.workload.as_str() {
        "tenants" => {
            let count = cli.groups * cli.prompts_per_group;
            let r = zipf_prefix(&ZipfPrefix {
                groups: cli.groups,
                requests: count,
                exponent: 0.0,
                system_prompt_len: tokens(cli.system_tokens),
                question_len: tokens(cli.question_tokens),
                api: ApiMix::Only(crate::workload::Api::Completions),
                body,
                seed,
            });
            let d = format!(
                "{count} requests, {} tenants drawn uniformly, ~{}-token system prompt + ~{}-token \
                 question (Gemma tokens), {} output tokens, streaming completions",
                cli.groups, cli.system_tokens, cli.question_tokens, cli.output_tokens
            );
            (r, d)
        }
        "sessions" => {
            let r = chat_sessions(&ChatSessions {
                sessions: cli.groups,
                turns: cli.prompts_per_group,
                system_len: tokens(cli.system_tokens / 2),
                user_len: tokens(cli.question_tokens),
                assistant_len: tokens(cli.question_tokens * 2),
                body,
                order: ChatOrder::Interleaved,
                seed,
            });
            let d = format!(
                "{} chat conversations x {} turns interleaved at random, ~{}-token system prompt, \
                 ~{}-token user turns, ~{}-token replies in the history, {} output tokens, streaming",
                cli.groups,
                cli.prompts_per_group,
                cli.system_tokens / 2,
                cli.question_tokens,
                cli.question_tokens * 2,
                cli.output_tokens
            );
            (r, d)
        }
        _ => {
            let r = shared_prefix(&SharedPrefix {
                groups: cli.groups,
                prompts_per_group: cli.prompts_per_group,
                system_prompt_len: tokens(cli.system_tokens),
                question_len: tokens(cli.question_tokens),
                api: ApiMix::Only(crate::workload::Api::Completions),
                order: Order::Shuffled,
                body,
                seed,
            });
            let d = format!(
                "{} groups x {} prompts, ~{}-token system prompt + ~{}-token question (Gemma tokens), {} output \
                 tokens, shuffled, streaming completions",
                cli.groups, cli.prompts_per_group, cli.system_tokens, cli.question_tokens, cli.output_tokens
            );
            (r, d)
        }
    }
}

/// One seed: every setup in `setups`' order over fresh servers.
fn run_seed(
    rt: &tokio::runtime::Runtime,
    cli: &RealCli,
    setups: &[Setup],
    seed: u64,
    all: &mut std::collections::BTreeMap<String, Vec<Figures>>,
) {
    let wall = Instant::now();
    let (requests, what) = real_requests(cli, seed);
    let (pacing, how) = match cli.rate {
        Some(rate) => (
            Pacing::Poisson {
                rate_per_sec: rate,
                seed,
            },
            format!("Poisson {rate} req/s"),
        ),
        None => (
            Pacing::Closed {
                concurrency: cli.concurrency,
            },
            format!("closed loop, {} in flight", cli.concurrency),
        ),
    };
    let description = format!("{what}; {how}; seed {seed}");
    let mut text = String::from("prefix-bench real\n");
    let _ = writeln!(
        text,
        "  backends: {} x llama-server (Gemma 3 270M Q4_K_M, CPU, -np 2 -c 4096 -t 1, --cache-ram {}, \
         --swa-full), each behind a tagging relay (x-served-by: llama-N); fresh servers per router",
        cli.servers, cli.cache_ram_mib
    );
    let _ = writeln!(text, "  workload: {description}");
    print!("{text}");
    let names: Vec<String> = (1..=cli.servers).map(|i| format!("llama-{i}")).collect();
    let base = GatewayOptions::default();
    let mut w = WorkloadResult {
        workload: WorkloadKind::SharedPrefix,
        description: description.clone(),
        requests: requests.len(),
        mean_prompt_tokens: 0.0,
        results: Vec::new(),
    };
    let mut server_metrics: Vec<(Router, Vec<ServerMetrics>)> = Vec::new();
    for setup in setups {
        let router = setup.router;
        let opts = setup.options(base.clone());
        let started = Instant::now();
        let mut result = RunResult::new(
            router,
            format!("{}: {}", setup.name, router.describe(opts.sync_period_ms)),
        );
        if router.is_peer() && !peers_installed() {
            result.skipped = Some("peers venv missing: run scripts/bench/setup-peers.sh".into());
            w.results.push(result);
            continue;
        }
        let dir = TestDir::new(&format!("real-{}", router.key()));
        let servers: Result<Vec<LlamaServer>, String> = names
            .iter()
            .map(|n| LlamaServer::start(&dir, n, cli.cache_ram_mib))
            .collect();
        let servers = match servers {
            Ok(s) => s,
            Err(e) => {
                eprintln!("  [{}] {e}", router.key());
                result.skipped = Some(format!("llama-server: {}", e.lines().next().unwrap_or("")));
                w.results.push(result);
                continue;
            }
        };
        let proxies: Vec<TagProxy> = servers
            .iter()
            .zip(&names)
            .map(|(s, n)| TagProxy::start(n, s.port).expect("start tagging relay"))
            .collect();
        let ports: Vec<u16> = proxies.iter().map(|p| p.port).collect();
        let gateway = match Gateway::start(router, &ports, &dir, &opts) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("  [{}] could not start: {e}", router.key());
                result.skipped = Some(format!(
                    "could not start: {}",
                    e.lines().next().unwrap_or("")
                ));
                w.results.push(result);
                continue;
            }
        };
        let urls = gateway.urls();
        let meter = LoadMeter::start();
        let label = format!("real/{}", router.key());
        let outcomes = rt.block_on(drive(&urls, &requests, pacing, &label, false));
        result.load = Some(meter.finish());
        if router.is_filter() {
            let fs = gateway.filter_stats();
            let sum = |n: &str| crate::scenario::sum_stat(&fs, &format!("prefix_router.{n}"));
            result.filter = Some(compare::FilterCounters {
                prefix_match: sum("routed.prefix_match"),
                no_match: sum("routed.no_match"),
                load_guard: sum("routed.load_guard"),
                spread: sum("routed.spread"),
                placed: sum("routed.placed"),
                place_failed: sum("place.failed"),
                ..Default::default()
            });
        }
        server_metrics.push((
            router,
            servers
                .iter()
                .zip(&names)
                .map(|(s, n)| ServerMetrics {
                    name: n.clone(),
                    metrics: s.metrics(),
                })
                .collect(),
        ));
        drop(gateway);
        drop(proxies);
        drop(servers);
        let stats = Stats::of(&outcomes, &names);
        let f = Figures::of(&stats);
        eprintln!(
            "  real {} seed {seed} {:<12} hit {:.3} p50 {:.0} p90 {:.0} ms",
            cli.workload, setup.name, f.hit, f.p50, f.p90
        );
        all.entry(setup.name.clone()).or_default().push(f);
        result.stats = Some(stats);
        result.outcomes = outcomes;
        result.wall_s = started.elapsed().as_secs_f64();
        w.results.push(result);
    }
    let t = table(&w, &names).render();
    print!("{t}");
    text.push_str(&t);
    let checks: Vec<_> = targets(std::slice::from_ref(&w))
        .into_iter()
        .filter(|t| t.verdict != "n/a" && t.verdict != "INFO")
        .collect();
    if !checks.is_empty() {
        let t = targets_table(&checks).render();
        print!("{t}");
        text.push_str(&t);
    }
    for r in &w.results {
        if let Some(why) = &r.skipped {
            let line = format!("note: {}: skipped: {why}\n", r.router.key());
            print!("{line}");
            text.push_str(&line);
        }
        if let Some(s) = &r.stats {
            if s.errors > 0 {
                let line = format!(
                    "note: {}: {} errors, e.g. {:?}\n",
                    r.router.key(),
                    s.errors,
                    s.error_samples
                );
                print!("{line}");
                text.push_str(&line);
            }
        }
    }
    let wall_s = wall.elapsed().as_secs_f64();
    let _ = writeln!(text, "wall time: {wall_s:.0} s");
    let json = json!({
        "command": "real",
        "servers": cli.servers,
        "cache_ram_mib": cli.cache_ram_mib,
        "seed": seed,
        "workload": w,
        "targets": checks,
        "server_metrics": server_metrics
            .iter()
            .map(|(r, m)| json!({"router": r, "servers": m}))
            .collect::<Vec<_>>(),
        "wall_s": wall_s,
    });
    let svg = compare::svg(
        std::slice::from_ref(&w),
        &names,
        "prefix-bench real: 2 llama-servers (Gemma 3 270M, CPU)",
    );
    write_outputs(cli.results_dir.as_ref(), "real", &json, Some(&svg), &text).print(wall_s);
}
