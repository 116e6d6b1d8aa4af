//! Who is best, figure by figure, over repeated `compare` runs.
//!
//! The targets ask the filter to match "the best peer" figure by
//! figure in one run. A TTFT tail sits on a cliff (one more 4,096-token miss
//! moves p99 by hundreds of ms), so the best of three noisy peers is a low
//! bar to meet in any single run, for any router. This table asks the same
//! question of every router in turn: in how many runs was its figure at
//! least as good as every other router's (the filter and the three peers;
//! each router faces the other three, so the contest is the same for all).
//! A 3-Envoy fleet faces the three peers. Figures are compared as printed
//! (hit rate to 3 decimals, ms and max/min as shown), so equal counts as
//! best for both.

use serde::Serialize;
use serde_json::Value;

use super::results::{WorkloadKind, WorkloadResult};
use crate::percentiles::percentile;
use crate::report::{num, Table};
use crate::scenario::Router;

/// One router's figures in one run of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub workload: WorkloadKind,
    pub router: Router,
    pub hit_rate: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Requests per pod, max/min (None: a pod got none).
    pub spread: Option<f64>,
}

/// The routers every row is weighed against.
const FIELD: [Router; 4] = [
    Router::Filter,
    Router::Sglang,
    Router::Vllm,
    Router::RoundRobin,
];

/// Every router's figures of one run (live-fleet is judged apart).
pub fn entries(results: &[WorkloadResult]) -> Vec<Entry> {
    results
        .iter()
        .filter(|w| w.workload != WorkloadKind::LiveFleet)
        .flat_map(|w| {
            w.results.iter().filter_map(move |r| {
                let s = r.stats.as_ref()?;
                Some(Entry {
                    workload: w.workload,
                    router: r.router,
                    hit_rate: s.hit_rate,
                    p90_ms: s.ttft_ms.as_ref().map(|t| t.p90),
                    p99_ms: s.ttft_ms.as_ref().map(|t| t.p99),
                    spread: s.spread,
                })
            })
        })
        .collect()
}

/// The figures of one saved `compare` run (its results JSON), as
/// [`entries`] made them; rows it cannot read are left out.
pub fn entries_from_json(run: &Value) -> Vec<Entry> {
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let mut out = Vec::new();
    for w in run["workloads"].as_array().into_iter().flatten() {
        let Some(workload) = w["workload"]
            .as_str()
            .and_then(|k| WorkloadKind::ALL.into_iter().find(|x| x.key() == k))
            .filter(|&k| k != WorkloadKind::LiveFleet)
        else {
            continue;
        };
        for r in w["results"].as_array().into_iter().flatten() {
            let (Some(router), Some(s)) = (
                r["router"].as_str().and_then(Router::parse),
                r.get("stats").filter(|s| s.is_object()),
            ) else {
                continue;
            };
            out.push(Entry {
                workload,
                router,
                hit_rate: f(s, "hit_rate"),
                p90_ms: f(&s["ttft_ms"], "p90"),
                p99_ms: f(&s["ttft_ms"], "p99"),
                spread: f(s, "spread"),
            });
        }
    }
    out
}

/// `prefix-bench league FILE...`: the table over saved `compare` runs.
pub fn main(files: &[std::path::PathBuf]) {
    let mut runs = Vec::new();
    for path in files {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("prefix-bench league: {}: {e}", path.display());
                std::process::exit(2);
            }
        };
        match serde_json::from_str::<Value>(&text) {
            Ok(v) if v["command"] == "compare" => runs.push(entries_from_json(&v)),
            Ok(_) => {
                eprintln!(
                    "prefix-bench league: {}: not the results of one `compare` run",
                    path.display()
                );
                std::process::exit(2);
            }
            Err(e) => {
                eprintln!("prefix-bench league: {}: {e}", path.display());
                std::process::exit(2);
            }
        }
    }
    print!("{}", table(&runs).render());
}

/// A figure: its name, how it is printed, and whether higher is better.
struct Figure {
    name: &'static str,
    get: fn(&Entry) -> Option<f64>,
    decimals: usize,
    higher_better: bool,
}

const FIGURES: [Figure; 4] = [
    Figure {
        name: "hit rate",
        get: |e| e.hit_rate,
        decimals: 3,
        higher_better: true,
    },
    Figure {
        name: "TTFT p90 ms",
        get: |e| e.p90_ms,
        decimals: 0,
        higher_better: false,
    },
    Figure {
        name: "TTFT p99 ms",
        get: |e| e.p99_ms,
        decimals: 0,
        higher_better: false,
    },
    Figure {
        name: "max/min per pod",
        // A pod that got nothing is the worst balance there is.
        get: |e| Some(e.spread.unwrap_or(f64::INFINITY)),
        decimals: 2,
        higher_better: false,
    },
];

/// The figure as printed, so that what reads equal compares equal.
fn printed(f: &Figure, v: f64) -> f64 {
    if !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(f.decimals as i32);
    (v * scale).round() / scale
}

/// Whether `router`'s figure in `run` is at least as good as each of its
/// opponents' there (those of [`FIELD`] that ran). None when it lacks the
/// figure, an opponent that ran lacks it, or no opponent ran.
fn best_in_run(f: &Figure, run: &[Entry], workload: WorkloadKind, router: Router) -> Option<bool> {
    let entry = |r: Router| run.iter().find(|e| e.workload == workload && e.router == r);
    let get = |e: &Entry| (f.get)(e).map(|v| printed(f, v));
    let mine = get(entry(router)?)?;
    // The field's routers that ran: one without this figure voids the run.
    let opponents = FIELD
        .iter()
        .filter(|&&o| o != router && !(router.is_filter() && o.is_filter()))
        .filter_map(|&o| entry(o));
    let mut any = false;
    for o in opponents {
        let theirs = get(o)?;
        any = true;
        let ok = if f.higher_better {
            mine >= theirs
        } else {
            mine <= theirs
        };
        if !ok {
            return Some(false);
        }
    }
    any.then_some(true)
}

/// The median of `v` (infinite values included: a pod left empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

/// Per workload and figure: each router's median over the runs and in how
/// many runs it was the best of its field (`0.891, best 3/5`).
pub fn table(runs: &[Vec<Entry>]) -> Table {
    let mut workloads: Vec<WorkloadKind> = Vec::new();
    let mut routers: Vec<Router> = Vec::new();
    for e in runs.iter().flatten() {
        if !workloads.contains(&e.workload) {
            workloads.push(e.workload);
        }
        if !routers.contains(&e.router) {
            routers.push(e.router);
        }
    }
    let title = format!(
        "Best of the field, figure by figure, over {} runs (median, runs in which it was at least as good as each of the others)",
        runs.len()
    );
    let mut header = vec!["workload".to_string(), "figure".to_string()];
    header.extend(routers.iter().map(|r| r.key().to_string()));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&title, &header);
    for &w in &workloads {
        for f in &FIGURES {
            let mut row = vec![w.key().to_string(), f.name.to_string()];
            for &r in &routers {
                let values: Vec<f64> = runs
                    .iter()
                    .flatten()
                    .filter(|e| e.workload == w && e.router == r)
                    .filter_map(|e| (f.get)(e))
                    .collect();
                let judged: Vec<bool> = runs
                    .iter()
                    .filter_map(|run| best_in_run(f, run, w, r))
                    .collect();
                let cell = match median(values) {
                    None => "-".to_string(),
                    Some(m) if judged.is_empty() => num(m, f.decimals),
                    Some(m) => format!(
                        "{}, best {}/{}",
                        if m.is_finite() {
                            num(m, f.decimals)
                        } else {
                            "inf".into()
                        },
                        judged.iter().filter(|&&b| b).count(),
                        judged.len()
                    ),
                };
                row.push(cell);
            }
            t.row(&row);
        }
    }
    t
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn e(router: Router, hit: f64, p90: f64, p99: f64, spread: Option<f64>) -> Entry {
        Entry {
            workload: WorkloadKind::HeteroFleet,
            router,
            hit_rate: Some(hit),
            p90_ms: Some(p90),
            p99_ms: Some(p99),
            spread,
        }
    }

    fn cell(out: &str, figure: &str, column: usize) -> String {
        let line = out
            .lines()
            .find(|l| l.starts_with("hetero-fleet") && l.contains(figure))
            .unwrap_or_default();
        line.split("  ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .nth(column)
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn each_router_faces_the_other_three() {
        let runs = vec![
            vec![
                e(Router::Filter, 0.890, 60.0, 636.0, Some(2.0)),
                e(Router::Sglang, 0.895, 40.0, 276.0, Some(1.3)),
                e(Router::Vllm, 0.893, 59.0, 591.0, Some(2.0)),
                e(Router::RoundRobin, 0.3, 6000.0, 10000.0, Some(1.0)),
                e(Router::Filter3Sync, 0.896, 50.0, 600.0, None),
            ],
            vec![
                e(Router::Filter, 0.8954, 40.0, 276.0, Some(1.5)),
                e(Router::Sglang, 0.895, 213.0, 636.0, Some(1.29)),
                e(Router::Vllm, 0.893, 59.0, 591.0, Some(2.0)),
                e(Router::RoundRobin, 0.3, 6000.0, 10000.0, Some(1.0)),
                e(Router::Filter3Sync, 0.85, 30.0, 300.0, Some(1.1)),
            ],
        ];
        let out = table(&runs).render();
        // Columns: workload, figure, filter, sglang, vllm, round-robin, 3x.
        // 0.8954 prints as 0.895: equal to sglang's, best for both.
        assert_eq!(cell(&out, "hit rate", 2), "0.893, best 1/2", "{out}");
        assert_eq!(cell(&out, "hit rate", 3), "0.895, best 2/2", "{out}");
        assert_eq!(cell(&out, "TTFT p99", 2), "456, best 1/2", "{out}");
        assert_eq!(cell(&out, "TTFT p99", 3), "456, best 1/2", "{out}");
        assert_eq!(cell(&out, "TTFT p99", 4), "591, best 0/2", "{out}");
        // Round robin balances best; a pod left empty is the worst.
        assert_eq!(cell(&out, "max/min", 5), "1.00, best 2/2", "{out}");
        // The 3-Envoy fleet faces the peers only, not the one-Envoy filter
        // (whose 276 ms in run 2 is below its 300).
        assert_eq!(cell(&out, "hit rate", 6), "0.873, best 1/2", "{out}");
        assert_eq!(cell(&out, "TTFT p99", 6), "450, best 1/2", "{out}");
        assert_eq!(cell(&out, "max/min", 6), "inf, best 0/2", "{out}");
    }

    #[test]
    fn saved_runs_read_back_as_they_were_made() {
        let run = serde_json::json!({
            "command": "compare",
            "workloads": [{
                "workload": "hetero-fleet",
                "results": [
                    {"router": "filter", "stats": {"hit_rate": 0.89, "spread": 2.5,
                        "ttft_ms": {"p90": 58.0, "p99": 608.0}}},
                    {"router": "sglang", "stats": {"hit_rate": 0.9, "spread": null,
                        "ttft_ms": null}},
                    {"router": "vllm", "skipped": "peers not installed", "stats": null},
                    {"router": "no-such-router", "stats": {"hit_rate": 1.0}}
                ]
            }, {"workload": "live-fleet", "results": [{"router": "filter", "stats": {}}]}]
        });
        let e = entries_from_json(&run);
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!(e[0].workload, WorkloadKind::HeteroFleet);
        assert_eq!(e[0].router, Router::Filter);
        assert_eq!(
            (e[0].hit_rate, e[0].p90_ms, e[0].p99_ms, e[0].spread),
            (Some(0.89), Some(58.0), Some(608.0), Some(2.5))
        );
        assert_eq!(e[1].router, Router::Sglang);
        assert_eq!((e[1].p90_ms, e[1].spread), (None, None));
    }

    #[test]
    fn a_router_missing_from_a_run_is_not_judged_there() {
        let runs = vec![
            vec![
                e(Router::Filter, 0.9, 10.0, 20.0, Some(1.0)),
                e(Router::Sglang, 0.8, 20.0, 30.0, Some(2.0)),
            ],
            vec![e(Router::Filter, 0.9, 10.0, 20.0, Some(1.0))],
        ];
        let out = table(&runs).render();
        assert_eq!(cell(&out, "hit rate", 2), "0.900, best 1/1", "{out}");
        assert_eq!(cell(&out, "hit rate", 3), "0.800, best 0/1", "{out}");
    }
}
