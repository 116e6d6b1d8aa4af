//! A comparison as a table per workload and as a chart.

use super::results::{RunResult, WorkloadResult};
use crate::chart::{self, Panel};
use crate::metrics::{spread_label, Stats};
use crate::percentiles::Summary;
use crate::report::{num, Table};

pub(super) fn ms(s: &Option<Summary>, f: impl Fn(&Summary) -> f64) -> String {
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
