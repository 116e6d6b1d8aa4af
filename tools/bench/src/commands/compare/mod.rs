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
//!
//! One module per part: `results` (the workloads and what a run produced,
//! below everything else), `args` (options and flags), `workloads` and
//! `live_fleet` (each scenario's requests; live-fleet's table and targets
//! too), `run_one` (one router on one workload), `output` (tables and
//! chart), `target` and `targets` (the checks) and [`league`] (who
//! is best over repeated runs). This file runs them in order.

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::json;

use crate::peer::peers_installed;
use crate::report::{write_outputs, Table};
use crate::scenario::GatewayOptions;

mod args;
pub mod league;
mod live_fleet;
mod output;
mod results;
mod run_one;
mod target;
mod targets;
mod workloads;

pub use args::{CompareArgs, CompareCli};
use live_fleet::live_table;
pub use output::{svg, table};
pub use results::{parse_workloads, FilterCounters, RunResult, WorkloadKind, WorkloadResult};
pub use run_one::run_one;
pub use target::{targets_table, Target};
pub use targets::targets;
pub use workloads::Built;

/// Builds workload `kind` with its pacing.
pub fn build(kind: WorkloadKind, args: &CompareArgs) -> Built {
    match kind {
        WorkloadKind::TenantsBurst | WorkloadKind::SessionsBurst => workloads::burst(kind, args),
        WorkloadKind::SharedPrefix => workloads::shared(args),
        WorkloadKind::HighLoad | WorkloadKind::HeteroFleet => workloads::loaded(kind, args),
        WorkloadKind::CachePressure => workloads::cache_pressure(args),
        WorkloadKind::Tenants => workloads::tenants(args),
        WorkloadKind::Concurrency1 => workloads::concurrency_1(args),
        WorkloadKind::Chat => workloads::chat(args),
        WorkloadKind::NoSharing => workloads::unshared(args),
        WorkloadKind::LiveFleet => live_fleet::build(args),
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
/// its tables; returns its targets and every router's figures (for
/// `--repeat`'s summaries).
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
    use crate::runner::Pacing;
    use crate::workload::Request;
    use live_fleet::LIVE_FLEET_POD;
    use serde_json::Value;

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
