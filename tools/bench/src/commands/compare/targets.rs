//! The targets, from the results of one comparison: hit rate and
//! TTFT against round robin and the peers, per workload.

use super::live_fleet::live_targets;
use super::results::{WorkloadKind, WorkloadResult};
use super::target::{target, Target};
use crate::metrics::{spread_label, Stats};
use crate::percentiles::Summary;
use crate::report::num;
use crate::scenario::Router;

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

fn pair(a: Option<Summary>, b: Option<Summary>) -> String {
    let f = |s: Option<Summary>| {
        s.map_or("-".into(), |s| {
            format!("{}/{}", num(s.p50, 0), num(s.p90, 0))
        })
    };
    format!("p50/p90 {} ms vs {} ms", f(a), f(b))
}

#[cfg(test)]
mod tests {
    use super::super::results::RunResult;
    use super::*;
    use crate::runner::Outcome;

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
            stats: Some(s),
            ..RunResult::new(router, String::new())
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
}
