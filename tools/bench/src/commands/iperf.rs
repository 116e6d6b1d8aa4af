//! `prefix-bench iperf`: a real client. kubernetes-sigs inference-perf
//! (`scripts/bench/run-inference-perf.sh`, its `shared_prefix` generator,
//! streaming completions, constant rate) against the filter's Envoy and
//! against round-robin Envoy, over the same fresh podsim pods as `compare`.
//! Its report (cached share of prompt tokens, TTFT) is printed next to the
//! pods' own counters (podsim's prefix-cache hits / queries) and, when a
//! `compare` result is in the results directory, next to our harness's
//! shared-prefix numbers for the same router.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Value};

use crate::commands::compare::CompareArgs;
use crate::peer::bench_dir;
use crate::report::{num, results_dir, write_outputs, Table};
use crate::scenario::{parse_routers, Gateway, GatewayOptions, PodModel, PodSet, Router};
use harness::{self, TestDir};

/// podsim tokens (4 bytes) per token of inference-perf's local BPE tokenizer
/// on its own generated text, measured (671 podsim tokens for 512 + 32).
const PODSIM_PER_IPERF_TOKEN: f64 = 1.23;

/// The command-line flags of `prefix-bench iperf`.
#[derive(clap::Args, Clone, Debug)]
pub struct IperfCli {
    /// Routers (comma-separated): any of compare's.
    #[arg(long, default_value = "round-robin,filter")]
    pub routers: String,
    /// inference-perf constant rate, req/s, and duration, s.
    #[arg(long, default_value_t = 32.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 16)]
    pub duration: u32,
    #[arg(long, default_value_t = 32)]
    pub groups: usize,
    #[arg(long, default_value_t = 16)]
    pub prompts_per_group: usize,
    /// System prompt in inference-perf tokens (~1.23 podsim tokens each):
    /// 3300 is about compare's 4096 podsim tokens.
    #[arg(long, default_value_t = 3300)]
    pub system_tokens: usize,
    #[arg(long, default_value_t = 100)]
    pub question_tokens: usize,
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output directory (default results/).
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
}

/// Is inference-perf installed (`scripts/bench/setup-inference-perf.sh`)?
pub fn iperf_installed() -> bool {
    bench_dir().join("iperf/bin/inference-perf").is_file()
        && bench_dir().join("tokenizer/tokenizer.json").is_file()
}

/// What one inference-perf run reported.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IperfSummary {
    pub successes: u64,
    pub failures: u64,
    pub prompt_tokens: f64,
    pub cached_tokens: f64,
    pub cached_ratio: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p90_ms: Option<f64>,
    pub requests_per_sec: Option<f64>,
}

/// Reads inference-perf's `summary_lifecycle_metrics.json`.
pub fn parse_summary(v: &Value) -> IperfSummary {
    let s = &v["successes"];
    let p = &s["prompt_tokens"];
    let total = p["total"].as_f64().unwrap_or(0.0);
    let cached = p["cached"].as_f64().unwrap_or(0.0);
    let ttft = &s["latency"]["time_to_first_token"];
    IperfSummary {
        successes: s["count"].as_u64().unwrap_or(0),
        failures: v["failures"]["count"].as_u64().unwrap_or(0),
        prompt_tokens: total,
        cached_tokens: cached,
        cached_ratio: (total > 0.0).then(|| cached / total),
        ttft_p50_ms: ttft["median"].as_f64().map(|x| x * 1000.0),
        ttft_p90_ms: ttft["p90"].as_f64().map(|x| x * 1000.0),
        requests_per_sec: s["throughput"]["requests_per_sec"].as_f64(),
    }
}

/// Our harness's shared-prefix row for `router` in the newest compare JSON
/// of `dir`: (hit rate, TTFT p50 ms).
fn ours(dir: &Path, router: Router) -> Option<(f64, f64, PathBuf)> {
    let newest = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("compare-") && n.ends_with(".json"))
        })
        .max()?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&newest).ok()?).ok()?;
    let w = v["workloads"]
        .as_array()?
        .iter()
        .find(|w| w["workload"] == "shared-prefix")?;
    let r = w["results"]
        .as_array()?
        .iter()
        .find(|r| r["router"] == router.key())?;
    let s = &r["stats"];
    Some((
        s["hit_rate"].as_f64()?,
        s["ttft_ms"]["p50"].as_f64()?,
        newest,
    ))
}

#[derive(Clone, Debug, Serialize)]
struct IperfRow {
    router: Router,
    summary: Option<IperfSummary>,
    error: Option<String>,
    pod_hit_ratio: Option<f64>,
    out_dir: PathBuf,
    wall_s: f64,
}

pub fn main(cli: IperfCli) {
    let routers = match parse_routers(&cli.routers) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("prefix-bench iperf: {e}");
            std::process::exit(2);
        }
    };
    if !iperf_installed() {
        eprintln!(
            "prefix-bench iperf: inference-perf missing: run scripts/bench/setup-inference-perf.sh"
        );
        std::process::exit(1);
    }
    let wall = Instant::now();
    // The same pods as `compare` with its defaults, KV sized for this
    // workload's distinct system prompts the same way (1.5 fair shares).
    let base = CompareArgs::defaults();
    let podsim_system = cli.system_tokens as f64 * PODSIM_PER_IPERF_TOKEN;
    let kv_blocks = (1.5 * cli.groups as f64 * podsim_system
        / base.pods as f64
        / f64::from(base.pod.kv_block_tokens))
    .ceil() as u32;
    let model = PodModel {
        kv_capacity_blocks: kv_blocks,
        ..base.pod.clone()
    };
    let out_root = cli.results_dir.clone().unwrap_or_else(results_dir);
    std::fs::create_dir_all(&out_root).expect("create results dir");
    let out_root = out_root.canonicalize().unwrap_or(out_root);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut text = String::from("prefix-bench iperf\n");
    let _ = writeln!(
        text,
        "  client: inference-perf 0.7.0, shared_prefix {} groups x {} prompts, system {} + question {} \
         tokens of its BPE tokenizer (~{:.0} + {:.0} podsim tokens), output {}, streaming completions, \
         constant {} req/s for {} s",
        cli.groups,
        cli.prompts_per_group,
        cli.system_tokens,
        cli.question_tokens,
        podsim_system,
        cli.question_tokens as f64 * PODSIM_PER_IPERF_TOKEN,
        cli.output_tokens,
        cli.rate,
        cli.duration
    );
    let _ = writeln!(
        text,
        "  pods: {} x podsim as in compare, --kv-capacity-blocks {kv_blocks}; fresh per router",
        base.pods
    );
    print!("{text}");
    let opts = GatewayOptions::default();
    let mut rows = Vec::new();
    for router in routers {
        let started = Instant::now();
        let dir = TestDir::new(&format!("iperf-{}", router.key()));
        let pods = PodSet::start(&dir, base.pods, &model);
        let out_dir = out_root.join(format!("iperf-{stamp}-{}", router.key()));
        let mut row = IperfRow {
            router,
            summary: None,
            error: None,
            pod_hit_ratio: None,
            out_dir: out_dir.clone(),
            wall_s: 0.0,
        };
        let gateway = match Gateway::start(router, &pods.ports(), &dir, &opts) {
            Ok(g) => g,
            Err(e) => {
                row.error = Some(format!(
                    "could not start: {}",
                    e.lines().next().unwrap_or("")
                ));
                rows.push(row);
                continue;
            }
        };
        let url = gateway.urls()[0].clone();
        eprintln!(
            "  [iperf/{}] inference-perf -> {url} (output in {})",
            router.key(),
            out_dir.display()
        );
        let status = Command::new(harness::repo_root().join("scripts/bench/run-inference-perf.sh"))
            .arg(&url)
            .arg("sim-model")
            .arg(&out_dir)
            .arg(cli.rate.to_string())
            .arg(cli.duration.to_string())
            .env("IP_NUM_GROUPS", cli.groups.to_string())
            .env("IP_PROMPTS_PER_GROUP", cli.prompts_per_group.to_string())
            .env("IP_SYSTEM_PROMPT_LEN", cli.system_tokens.to_string())
            .env("IP_QUESTION_LEN", cli.question_tokens.to_string())
            .env("IP_OUTPUT_LEN", cli.output_tokens.to_string())
            .env("IP_SEED", cli.seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        let hits = pods.metric_sum("vllm:prefix_cache_hits_total");
        let queries = pods.metric_sum("vllm:prefix_cache_queries_total");
        row.pod_hit_ratio = (queries > 0.0).then(|| hits / queries);
        drop(gateway);
        drop(pods);
        let summary_path = out_dir.join("summary_lifecycle_metrics.json");
        match (status, std::fs::read_to_string(&summary_path)) {
            (Ok(s), Ok(body)) if s.success() => match serde_json::from_str::<Value>(&body) {
                Ok(v) => row.summary = Some(parse_summary(&v)),
                Err(e) => row.error = Some(format!("bad summary JSON: {e}")),
            },
            (status, _) => {
                row.error = Some(format!(
                    "inference-perf failed ({status:?}); log: {}",
                    out_dir.join("inference-perf.log").display()
                ))
            }
        }
        row.wall_s = started.elapsed().as_secs_f64();
        rows.push(row);
    }
    let mut t = Table::new(
        "inference-perf (its report) next to the pods' counters and our harness",
        &[
            "router",
            "ok/fail",
            "iperf cached ratio",
            "pods' hit ratio",
            "iperf TTFT p50",
            "p90 ms",
            "req/s",
            "ours: hit rate",
            "ours: TTFT p50 ms",
        ],
    );
    let mut ours_from = None;
    for r in &rows {
        let o = ours(&out_root, r.router);
        if let Some((_, _, p)) = &o {
            ours_from = Some(p.clone());
        }
        let opt = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| num(v, d));
        match &r.summary {
            Some(s) => t.row(&[
                r.router.key().to_string(),
                format!("{}/{}", s.successes, s.failures),
                opt(s.cached_ratio, 3),
                opt(r.pod_hit_ratio, 3),
                opt(s.ttft_p50_ms, 1),
                opt(s.ttft_p90_ms, 1),
                opt(s.requests_per_sec, 1),
                opt(o.as_ref().map(|x| x.0), 3),
                opt(o.as_ref().map(|x| x.1), 0),
            ]),
            None => t.row(&[
                r.router.key().to_string(),
                format!("failed: {}", r.error.clone().unwrap_or_default()),
            ]),
        }
    }
    let rendered = t.render();
    print!("{rendered}");
    text.push_str(&rendered);
    let note = match &ours_from {
        Some(p) => format!(
            "ours = the shared-prefix workload of {} (same pod model; our own prompts, Poisson arrivals)\n",
            p.display()
        ),
        None => "ours: no compare-*.json in the results directory yet (run prefix-bench compare)\n".into(),
    };
    print!("{note}");
    text.push_str(&note);
    let wall_s = wall.elapsed().as_secs_f64();
    let _ = writeln!(text, "wall time: {wall_s:.0} s");
    let json = json!({
        "command": "iperf",
        "rate": cli.rate,
        "duration_s": cli.duration,
        "groups": cli.groups,
        "prompts_per_group": cli.prompts_per_group,
        "system_tokens": cli.system_tokens,
        "question_tokens": cli.question_tokens,
        "output_tokens": cli.output_tokens,
        "pod_model": model,
        "rows": rows,
        "wall_s": wall_s,
    });
    write_outputs(cli.results_dir.as_ref(), "iperf", &json, None, &text).print(wall_s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_inference_perf_summary() {
        let v = json!({
            "successes": {
                "count": 25,
                "prompt_tokens": {"total": 1000.0, "cached": 750.0},
                "latency": {"time_to_first_token": {"median": 0.0048, "p90": 0.036}},
                "throughput": {"requests_per_sec": 5.0}
            },
            "failures": {"count": 1}
        });
        let s = parse_summary(&v);
        assert_eq!((s.successes, s.failures), (25, 1));
        assert_eq!(s.cached_ratio, Some(0.75));
        assert!((s.ttft_p50_ms.unwrap() - 4.8).abs() < 1e-9);
        assert!((s.ttft_p90_ms.unwrap() - 36.0).abs() < 1e-9);
        assert_eq!(s.requests_per_sec, Some(5.0));
        assert_eq!(parse_summary(&json!({})).cached_ratio, None);
    }
}
