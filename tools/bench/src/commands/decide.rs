//! `prefix-bench decide`: the runs a policy decision rests on.
//!
//! Every scenario (a `compare` workload on one pod model, and for the bursts
//! one cache size) runs once per seed through every router; within a seed
//! the routers alternate, their order rotating from seed to seed, so a slow
//! minute of the machine does not fall on one router. The tables give each
//! router's median over the seeds and the range, and the subject's verdicts
//! against the targets stated before the runs:
//!
//! - TTFT p50 and p90 (medians) at most [`TTFT_TOLERANCE`] x the best
//!   median of the set, in every scenario;
//! - where load is free, hit rate (median) within [`HIT_TOLERANCE`] of the
//!   best; elsewhere it is reported with what the difference bought.
//!
//! Pod models: `free` runs podsim with at least as many slots as the
//! client keeps in flight (a pod's prefill does not slow with concurrency),
//! `queueing` with one slot (requests queue behind each other).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use super::compare::{build, parse_workloads, run_one, CompareArgs, WorkloadKind};
use crate::report::{num, verdict, write_outputs, Table};
use crate::scenario::{GatewayOptions, Router};

/// TTFT medians may be this much above the best of the set.
pub const TTFT_TOLERANCE: f64 = 1.05;
/// Where load is free, hit rate (median) may be this much below the best.
pub const HIT_TOLERANCE: f64 = 0.01;

#[derive(clap::Args, Clone, Debug)]
pub struct DecideCli {
    /// Workloads (`compare`'s names), comma-separated.
    #[arg(long, default_value = "tenants-burst,sessions-burst")]
    pub workloads: String,
    /// Pod models: free, queueing.
    #[arg(long, default_value = "free,queueing")]
    pub pod_models: String,
    /// The bursts' caches (`--burst-cache` values), comma-separated.
    #[arg(long, default_value = "0.67,1.5")]
    pub burst_caches: String,
    /// Seeds, comma-separated: one repeat each.
    #[arg(long, default_value = "1,2,3")]
    pub seeds: String,
    /// Routers (`compare`'s names), comma-separated.
    #[arg(long, default_value = "filter,filter-aibrix,sglang,vllm")]
    pub routers: String,
    /// More filter setups being tried: `name[@router]=JSON` (the JSON merged
    /// into the plugin configuration), e.g. `old='{"policy":{"mode":"load_aware"}}'`,
    /// or `name[@router]=path/to/module.wasm` (another build of the filter);
    /// on `filter` unless `@router` names another filter router, e.g.
    /// `noclaim@filter-3x-place={"sync":{"place_claim_ms":0}}`.
    #[arg(long)]
    pub variant: Vec<String>,
    /// Whose verdicts are printed (a router or variant name).
    #[arg(long, default_value = "filter")]
    pub subject: String,
    /// Multiplies request counts.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Output directory (default results/).
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
}

/// One router setup: a compare router, or a variant being tried: a filter
/// router with a patch or another build of the module.
#[derive(Clone, Debug)]
pub struct Setup {
    pub name: String,
    pub router: Router,
    pub patch: Option<serde_json::Value>,
    pub module: Option<PathBuf>,
}

impl Setup {
    /// A variant being tried, not a router of the comparison set.
    pub fn is_variant(&self) -> bool {
        self.patch.is_some() || self.module.is_some()
    }

    /// The gateway options of this setup, on top of `base`.
    pub fn options(&self, base: GatewayOptions) -> GatewayOptions {
        GatewayOptions {
            filter_patch: self.patch.clone(),
            filter_module: self.module.clone(),
            ..base
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum PodModelKind {
    Free,
    Queueing,
}

/// One scenario: a workload on a pod model (and cache, for the bursts).
#[derive(Clone, Debug, Serialize)]
struct Scenario {
    workload: WorkloadKind,
    pods: PodModelKind,
    burst_cache: Option<f64>,
}

impl Scenario {
    fn label(&self) -> String {
        let pods = match self.pods {
            PodModelKind::Free => "free",
            PodModelKind::Queueing => "queueing",
        };
        match self.burst_cache {
            Some(c) => format!("{}, {pods}, cache {c}", self.workload.key()),
            None => format!("{}, {pods}", self.workload.key()),
        }
    }
}

/// One run's figures.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Figures {
    pub hit: f64,
    pub p50: f64,
    pub p90: f64,
    /// Requests per pod, max/min (0 when a pod got none).
    pub spread: f64,
    pub errors: usize,
}

impl Figures {
    /// A run's figures from its statistics.
    pub fn of(st: &crate::metrics::Stats) -> Figures {
        Figures {
            hit: st.hit_rate.unwrap_or(f64::NAN),
            p50: st.ttft_ms.map_or(f64::NAN, |t| t.p50),
            p90: st.ttft_ms.map_or(f64::NAN, |t| t.p90),
            spread: st.spread.unwrap_or(0.0),
            errors: st.errors,
        }
    }
}

/// Each setup's median \[range\] over its runs.
pub fn summary_table(
    title: &str,
    setups: &[Setup],
    runs: &BTreeMap<String, Vec<Figures>>,
) -> Table {
    let mut t = Table::new(
        title,
        &[
            "router",
            "runs",
            "hit rate",
            "TTFT p50 ms",
            "TTFT p90 ms",
            "max/min",
            "errors",
        ],
    );
    for s in setups {
        let Some(r) = runs.get(&s.name) else { continue };
        let col = |f: fn(&Figures) -> f64, d: usize| {
            let v: Vec<f64> = r.iter().map(f).collect();
            format!("{} [{}]", num(median(&v), d), range(&v, d))
        };
        t.row(&[
            s.name.clone(),
            r.len().to_string(),
            col(|x| x.hit, 3),
            col(|x| x.p50, 1),
            col(|x| x.p90, 1),
            col(|x| x.spread, 2),
            r.iter().map(|x| x.errors).sum::<usize>().to_string(),
        ]);
    }
    t
}

fn is_burst(w: WorkloadKind) -> bool {
    matches!(w, WorkloadKind::TenantsBurst | WorkloadKind::SessionsBurst)
}

/// A comma-separated list, each item parsed by `parse` (`what` names an
/// item in the error).
pub fn list<T>(s: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| parse(p).ok_or_else(|| format!("bad {what} {p:?}")))
        .collect()
}

fn setups(cli: &DecideCli) -> Result<Vec<Setup>, String> {
    let out = parse_setups(&cli.routers, &cli.variant)?;
    if !out.iter().any(|s| s.name == cli.subject) {
        return Err(format!(
            "--subject {:?} is not among the setups",
            cli.subject
        ));
    }
    Ok(out)
}

/// Routers (`compare`'s names, comma-separated) and filter variants,
/// `name[@router]=JSON` or `name[@router]=module.wasm`.
pub fn parse_setups(routers: &str, variants: &[String]) -> Result<Vec<Setup>, String> {
    let mut out: Vec<Setup> = crate::scenario::parse_routers(routers)?
        .into_iter()
        .map(|router| Setup {
            name: router.key().to_string(),
            router,
            patch: None,
            module: None,
        })
        .collect();
    for v in variants {
        let (head, value) = v
            .split_once('=')
            .ok_or_else(|| format!("--variant {v:?}: want name[@router]=JSON or =module.wasm"))?;
        let (name, router) = match head.split_once('@') {
            Some((name, r)) => (
                name,
                Router::parse(r)
                    .ok_or_else(|| format!("--variant {name}: unknown router {r:?}"))?,
            ),
            None => (head, Router::Filter),
        };
        if !router.takes_variants() {
            return Err(format!(
                "--variant {name}: {} takes no variants (one of the filter's own routers does)",
                router.key()
            ));
        }
        if name.is_empty() || out.iter().any(|s| s.name == name) {
            return Err(format!("--variant {v:?}: the name is empty or taken"));
        }
        let (patch, module) = if value.trim_end().ends_with(".wasm") {
            let module = PathBuf::from(value.trim());
            if !module.is_file() {
                return Err(format!(
                    "--variant {name}: no module at {}",
                    module.display()
                ));
            }
            (None, Some(module))
        } else {
            let patch: serde_json::Value =
                serde_json::from_str(value).map_err(|e| format!("--variant {name}: {e}"))?;
            (Some(patch), None)
        };
        out.push(Setup {
            name: name.to_string(),
            router,
            patch,
            module,
        });
    }
    Ok(out)
}

fn scenarios(cli: &DecideCli) -> Result<Vec<Scenario>, String> {
    let workloads = parse_workloads(&cli.workloads)?;
    let models = list(&cli.pod_models, "pod model", |p| match p {
        "free" => Some(PodModelKind::Free),
        "queueing" => Some(PodModelKind::Queueing),
        _ => None,
    })?;
    let caches = list(&cli.burst_caches, "burst cache", |p| p.parse::<f64>().ok())?;
    let mut out = Vec::new();
    for &workload in &workloads {
        for &pods in &models {
            if is_burst(workload) {
                for &c in &caches {
                    out.push(Scenario {
                        workload,
                        pods,
                        burst_cache: Some(c),
                    });
                }
            } else {
                out.push(Scenario {
                    workload,
                    pods,
                    burst_cache: None,
                });
            }
        }
    }
    Ok(out)
}

fn args_for(sc: &Scenario, seed: u64, scale: f64) -> CompareArgs {
    let mut a = CompareArgs::defaults();
    a.seed = seed;
    a.scale = scale;
    a.workloads = vec![sc.workload];
    if let Some(c) = sc.burst_cache {
        a.burst_cache = c;
    }
    a.pod.slots = match sc.pods {
        PodModelKind::Free => a.pod.slots.max(a.pods as u32),
        PodModelKind::Queueing => 1,
    };
    a
}

fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn range(v: &[f64], decimals: usize) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{}-{}", num(lo, decimals), num(hi, decimals))
}

/// The verdicts of `subject` in one scenario, from each setup's runs,
/// against the best of `set` (the comparison set: the routers, not the
/// filter variants being tried) and the subject itself.
fn verdicts(
    sc: &Scenario,
    runs: &BTreeMap<String, Vec<Figures>>,
    subject: &str,
    set: &[&str],
) -> Vec<(String, String, bool)> {
    let med = |name: &str, f: fn(&Figures) -> f64| {
        runs.get(name)
            .map(|r| median(&r.iter().map(f).collect::<Vec<_>>()))
            .unwrap_or(f64::NAN)
    };
    let best = |f: fn(&Figures) -> f64, lower: bool| {
        runs.keys()
            .filter(|n| n.as_str() == subject || set.contains(&n.as_str()))
            .map(|n| med(n, f))
            .filter(|x| x.is_finite())
            .fold(if lower { f64::INFINITY } else { 0.0 }, |a, b| {
                if lower {
                    a.min(b)
                } else {
                    a.max(b)
                }
            })
    };
    let mut out = Vec::new();
    for (what, f) in [
        ("TTFT p50", (|x: &Figures| x.p50) as fn(&Figures) -> f64),
        ("TTFT p90", |x: &Figures| x.p90),
    ] {
        let (s, b) = (med(subject, f), best(f, true));
        out.push((
            format!(
                "{}: {subject} {what} <= {TTFT_TOLERANCE} x best",
                sc.label()
            ),
            format!("{} vs {} ms ({}x)", num(s, 1), num(b, 1), num(s / b, 3)),
            s <= b * TTFT_TOLERANCE,
        ));
    }
    let (s, b) = (med(subject, |x| x.hit), best(|x| x.hit, false));
    let detail = format!("{} vs {}", num(s, 3), num(b, 3));
    if sc.pods == PodModelKind::Free {
        out.push((
            format!(
                "{}: {subject} hit rate within {HIT_TOLERANCE} of best",
                sc.label()
            ),
            detail,
            s >= b - HIT_TOLERANCE,
        ));
    }
    out
}

/// Entry point from the command line.
pub fn main(rt: &tokio::runtime::Runtime, cli: DecideCli) {
    let parsed = setups(&cli).and_then(|s| {
        let sc = scenarios(&cli)?;
        let seeds = list(&cli.seeds, "seed", |p| p.parse::<u64>().ok())?;
        Ok((s, sc, seeds))
    });
    let (setups, scenarios, seeds) = match parsed {
        Ok(x) => x,
        Err(e) => {
            eprintln!("prefix-bench decide: {e}");
            std::process::exit(2);
        }
    };
    let wall = Instant::now();
    // scenario label -> setup name -> figures per seed
    let mut all: BTreeMap<String, BTreeMap<String, Vec<Figures>>> = BTreeMap::new();
    for (i, &seed) in seeds.iter().enumerate() {
        for sc in &scenarios {
            let args = args_for(sc, seed, cli.scale);
            let built = build(sc.workload, &args);
            eprintln!(
                "decide: seed {seed}, {}: {} requests; {}",
                sc.label(),
                built.requests.len(),
                built.description
            );
            let mut order = setups.clone();
            let n = order.len();
            order.rotate_left(i % n.max(1));
            for s in &order {
                let opts = s.options(GatewayOptions {
                    sync_period_ms: args.sync_period_ms,
                    warm_sync: args.warm_sync,
                    single_concurrency: args.single_concurrency,
                    replica_concurrency: args.replica_concurrency,
                    ..GatewayOptions::default()
                });
                let r = run_one(rt, &built, s.router, &args, &opts);
                let fig = r.stats.as_ref().map(Figures::of);
                match (fig, &r.skipped) {
                    (Some(f), _) => {
                        eprintln!(
                            "  {:<16} hit {} p50 {} p90 {} max/min {}",
                            s.name,
                            num(f.hit, 3),
                            num(f.p50, 1),
                            num(f.p90, 1),
                            num(f.spread, 2)
                        );
                        all.entry(sc.label())
                            .or_default()
                            .entry(s.name.clone())
                            .or_default()
                            .push(f);
                    }
                    (None, why) => eprintln!("  {:<16} skipped: {why:?}", s.name),
                }
            }
        }
    }
    let mut text = format!(
        "prefix-bench decide: seeds {}, routers alternating (order rotated per seed); \
         median [range] over the seeds\n",
        cli.seeds
    );
    let mut checks = Table::new(
        &format!(
            "Targets of {} (tolerances stated before the runs)",
            cli.subject
        ),
        &["target", "measured (medians)", "verdict"],
    );
    let (mut met, mut total) = (0, 0);
    for sc in &scenarios {
        let Some(runs) = all.get(&sc.label()) else {
            continue;
        };
        text.push_str(&summary_table(&sc.label(), &setups, runs).render());
        if runs.contains_key(&cli.subject) {
            let set: Vec<&str> = setups
                .iter()
                .filter(|s| !s.is_variant())
                .map(|s| s.name.as_str())
                .collect();
            for (name, detail, ok) in verdicts(sc, runs, &cli.subject, &set) {
                total += 1;
                met += usize::from(ok);
                checks.row(&[name, detail, verdict(ok).to_string()]);
            }
        }
    }
    text.push_str(&checks.render());
    let _ = writeln!(text, "{met} of {total} targets met");
    print!("{text}");
    let json = json!({
        "command": "decide",
        "seeds": seeds,
        "setups": setups.iter().map(|s| json!({"name": s.name, "router": s.router.key(), "patch": s.patch, "module": s.module})).collect::<Vec<_>>(),
        "scenarios": scenarios,
        "runs": all,
    });
    write_outputs(cli.results_dir.as_ref(), "decide", &json, None, &text)
        .print(wall.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(hit: f64, p50: f64, p90: f64) -> Figures {
        Figures {
            hit,
            p50,
            p90,
            ..Figures::default()
        }
    }

    #[test]
    fn verdicts_take_medians_and_the_tolerances() {
        let sc = Scenario {
            workload: WorkloadKind::TenantsBurst,
            pods: PodModelKind::Free,
            burst_cache: Some(0.67),
        };
        let mut runs = BTreeMap::new();
        // The subject's medians: hit 0.90, p50 52, p90 100; the peer's
        // medians 0.905 / 50 / 100: p50 is 1.04x (met), hit 0.005 below (met).
        runs.insert(
            "filter".to_string(),
            vec![
                fig(0.90, 52.0, 100.0),
                fig(0.2, 500.0, 90.0),
                fig(0.95, 40.0, 130.0),
            ],
        );
        runs.insert(
            "sglang".to_string(),
            vec![
                fig(0.905, 50.0, 100.0),
                fig(0.9, 50.0, 100.0),
                fig(0.91, 49.0, 99.0),
            ],
        );
        let v = verdicts(&sc, &runs, "filter", &["sglang"]);
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|(_, _, ok)| *ok), "{v:?}");
        // 1.06x misses.
        runs.get_mut("filter").unwrap()[0].p50 = 53.1;
        let v = verdicts(&sc, &runs, "filter", &["sglang"]);
        assert!(!v[0].2, "{v:?}");
        // No hit target where load queues.
        let q = Scenario {
            pods: PodModelKind::Queueing,
            ..sc
        };
        assert_eq!(verdicts(&q, &runs, "filter", &["sglang"]).len(), 2);
        // A variant being tried is not in the comparison set.
        runs.insert("faster".to_string(), vec![fig(0.95, 1.0, 1.0)]);
        runs.get_mut("filter").unwrap()[0].p50 = 52.0;
        assert!(verdicts(&sc, &runs, "filter", &["sglang"])
            .iter()
            .all(|(_, _, ok)| *ok));
    }

    #[test]
    fn variants_name_a_patch_or_a_module_on_a_filter_router() {
        let dir = std::env::temp_dir().join(format!("decide-variants-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let module = dir.join("other.wasm");
        std::fs::write(&module, b"\0asm").unwrap();
        let v = vec![
            r#"nohold={"hold":{"enabled":false}}"#.to_string(),
            format!("noclaim@filter-3x-place={}", module.display()),
        ];
        let s = parse_setups("filter,sglang", &v).unwrap();
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["filter", "sglang", "nohold", "noclaim"]);
        assert!(!s[0].is_variant() && !s[1].is_variant());
        assert_eq!(s[2].router, Router::Filter);
        assert!(s[2].patch.is_some() && s[2].module.is_none());
        assert_eq!(s[3].router, Router::Filter3Place);
        assert_eq!(s[3].module.as_deref(), Some(module.as_path()));
        let opts = s[3].options(GatewayOptions::default());
        assert_eq!(opts.filter_module.as_deref(), Some(module.as_path()));
        assert!(opts.filter_patch.is_none());
        // Refused: a router that takes no variants, a missing module, a
        // taken name.
        assert!(parse_setups("filter", &[r#"x@filter-aibrix={}"#.into()]).is_err());
        assert!(parse_setups("filter", &[r#"x@sglang={}"#.into()]).is_err());
        assert!(parse_setups("filter", &["x=/nonexistent/m.wasm".into()]).is_err());
        assert!(parse_setups("filter", &[r#"filter={}"#.into()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scenarios_cross_workloads_pod_models_and_burst_caches() {
        let cli = DecideCli {
            workloads: "tenants-burst,chat".into(),
            pod_models: "free,queueing".into(),
            burst_caches: "0.67,1.5".into(),
            seeds: "1".into(),
            routers: "filter".into(),
            variant: vec![],
            subject: "filter".into(),
            scale: 1.0,
            results_dir: None,
        };
        let s = scenarios(&cli).unwrap();
        assert_eq!(s.len(), 2 * 2 + 2);
        let q = args_for(&s[2], 5, 1.0);
        assert_eq!(q.pod.slots, 1);
        assert_eq!(q.seed, 5);
        assert!(args_for(&s[0], 5, 1.0).pod.slots >= 4);
    }
}
