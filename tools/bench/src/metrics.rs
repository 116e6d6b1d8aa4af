//! The numbers of one scenario of a router comparison, from per-request
//! outcomes: token-weighted cache hit rate, TTFT and latency percentiles,
//! throughput, requests per pod and their spread, errors.
//!
//! Everything is pure arithmetic over [`Outcome`]s (unit-tested below); the
//! commands decide what to run and print.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::percentiles::Summary;
use crate::runner::Outcome;

/// Sum of cached over sum of prompt tokens, over the requests that reported
/// usage (a request without usage counts in neither sum). None when no
/// request reported prompt tokens.
///
/// Token-weighted, not a mean of per-request ratios: a long prompt that
/// misses costs more prefill than a short one, and so weighs more.
pub fn hit_rate<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Option<f64> {
    let (mut prompt, mut cached) = (0u64, 0u64);
    for o in outcomes {
        if let Some(p) = o.prompt_tokens {
            prompt += p;
            // A server may report more cached tokens than prompt tokens only
            // by a bug; never let one request count above 100 %.
            cached += o.cached_tokens.unwrap_or(0).min(p);
        }
    }
    (prompt > 0).then(|| cached as f64 / prompt as f64)
}

/// Max over min of per-pod request counts: 1.0 is perfectly even; None when
/// a pod got nothing (the ratio is infinite) or there are no pods.
pub fn spread(counts: &[usize]) -> Option<f64> {
    let max = *counts.iter().max()?;
    let min = *counts.iter().min()?;
    if min == 0 {
        return None;
    }
    Some(max as f64 / min as f64)
}

/// `1.23`, or `inf` for a spread with an idle pod.
pub fn spread_label(s: Option<f64>) -> String {
    match s {
        Some(v) => format!("{v:.2}"),
        None => "inf".into(),
    }
}

/// Requests each pod served, every pod of `pods` listed (0 if none), plus
/// `(unknown)` for ok replies that named no pod or a pod not in the list.
pub fn per_pod(outcomes: &[Outcome], pods: &[String]) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = pods.iter().map(|p| (p.clone(), 0)).collect();
    for o in outcomes.iter().filter(|o| o.ok()) {
        let key = match &o.pod {
            Some(p) if counts.contains_key(p) => p.clone(),
            _ => "(unknown)".to_string(),
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// Requests per second between the first send and the last reply, counting
/// ok requests only; 0 when nothing finished.
pub fn throughput(outcomes: &[Outcome]) -> f64 {
    let start = outcomes
        .iter()
        .map(|o| o.start_ms)
        .fold(f64::INFINITY, f64::min);
    let end = outcomes
        .iter()
        .map(|o| o.start_ms + o.latency_ms)
        .fold(f64::NEG_INFINITY, f64::max);
    let ok = outcomes.iter().filter(|o| o.ok()).count();
    let span_s = (end - start) / 1000.0;
    if ok == 0 || !span_s.is_finite() || span_s <= 0.0 {
        return 0.0;
    }
    ok as f64 / span_s
}

/// Everything the comparison reports about one scenario run.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    pub sent: usize,
    pub ok: usize,
    pub errors: usize,
    /// The first few failures, `#index status error`.
    pub error_samples: Vec<String>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Ok replies without `usage` (they count in no token sum).
    pub without_usage: usize,
    pub hit_rate: Option<f64>,
    /// Time to first token, ms, of ok streaming requests.
    pub ttft_ms: Option<Summary>,
    /// Whole-request latency, ms, of ok requests.
    pub latency_ms: Option<Summary>,
    pub throughput_rps: f64,
    /// From the first send to the last reply, s.
    pub span_s: f64,
    pub per_pod: BTreeMap<String, usize>,
    /// Max/min over the listed pods (not `(unknown)`); None = a pod got none.
    pub spread: Option<f64>,
}

impl Stats {
    /// The statistics of `outcomes` over the pods named `pods`.
    pub fn of(outcomes: &[Outcome], pods: &[String]) -> Stats {
        let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok()).collect();
        let per_pod = per_pod(outcomes, pods);
        let counts: Vec<usize> = pods
            .iter()
            .map(|p| per_pod.get(p).copied().unwrap_or(0))
            .collect();
        let start = outcomes
            .iter()
            .map(|o| o.start_ms)
            .fold(f64::INFINITY, f64::min);
        let end = outcomes
            .iter()
            .map(|o| o.start_ms + o.latency_ms)
            .fold(f64::NEG_INFINITY, f64::max);
        Stats {
            sent: outcomes.len(),
            ok: ok.len(),
            errors: outcomes.len() - ok.len(),
            error_samples: outcomes
                .iter()
                .filter(|o| !o.ok())
                .take(5)
                .map(|o| {
                    format!(
                        "#{} status {} {}",
                        o.index,
                        o.status,
                        o.error.clone().unwrap_or_default()
                    )
                })
                .collect(),
            prompt_tokens: ok.iter().filter_map(|o| o.prompt_tokens).sum(),
            cached_tokens: ok
                .iter()
                .filter_map(|o| Some(o.cached_tokens.unwrap_or(0).min(o.prompt_tokens?)))
                .sum(),
            without_usage: ok.iter().filter(|o| o.prompt_tokens.is_none()).count(),
            hit_rate: hit_rate(ok.iter().copied()),
            ttft_ms: Summary::of(&ok.iter().filter_map(|o| o.ttft_ms).collect::<Vec<_>>()),
            latency_ms: Summary::of(&ok.iter().map(|o| o.latency_ms).collect::<Vec<_>>()),
            throughput_rps: throughput(outcomes),
            span_s: if end > start {
                (end - start) / 1000.0
            } else {
                0.0
            },
            per_pod,
            spread: spread(&counts),
        }
    }

    /// Requests per pod in pod order, e.g. `31/29/40/28`.
    pub fn pod_counts_label(&self, pods: &[String]) -> String {
        let mut parts: Vec<String> = pods
            .iter()
            .map(|p| self.per_pod.get(p).copied().unwrap_or(0).to_string())
            .collect();
        if let Some(n) = self.per_pod.get("(unknown)") {
            parts.push(format!("?{n}"));
        }
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(i: usize, pod: &str, prompt: u64, cached: u64, ttft: f64) -> Outcome {
        Outcome {
            index: i,
            status: 200,
            start_ms: i as f64 * 100.0,
            latency_ms: 50.0,
            ttft_ms: Some(ttft),
            pod: Some(pod.into()),
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            ..Outcome::default()
        }
    }

    fn pods(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("pod-{i}")).collect()
    }

    #[test]
    fn hit_rate_is_token_weighted() {
        // Per-request ratios 1.0 and 0.0 average to 0.5; token-weighted the
        // 900-token miss dominates: 100 / 1000.
        let o = [
            outcome(0, "pod-1", 100, 100, 1.0),
            outcome(1, "pod-1", 900, 0, 1.0),
        ];
        assert!((hit_rate(&o).unwrap() - 0.1).abs() < 1e-12);
    }

    #[test]
    fn hit_rate_edges() {
        assert_eq!(hit_rate(&[]), None);
        let mut no_usage = outcome(0, "pod-1", 0, 0, 1.0);
        no_usage.prompt_tokens = None;
        no_usage.cached_tokens = None;
        assert_eq!(hit_rate([&no_usage]), None);
        // Cached above prompt is clamped; missing cached counts as 0.
        let mut a = outcome(0, "pod-1", 10, 50, 1.0);
        let mut b = outcome(1, "pod-1", 10, 0, 1.0);
        b.cached_tokens = None;
        assert_eq!(hit_rate([&a, &b]), Some(0.5));
        a.cached_tokens = Some(10);
        assert_eq!(hit_rate([&a]), Some(1.0));
    }

    #[test]
    fn spread_is_max_over_min_and_infinite_with_an_idle_pod() {
        assert_eq!(spread(&[10, 10, 10]), Some(1.0));
        assert_eq!(spread(&[20, 10, 15]), Some(2.0));
        assert_eq!(spread(&[5, 0, 5]), None);
        assert_eq!(spread(&[]), None);
        assert_eq!(spread_label(Some(1.5)), "1.50");
        assert_eq!(spread_label(None), "inf");
    }

    #[test]
    fn per_pod_lists_idle_pods_and_unknown_replies() {
        let mut o = vec![
            outcome(0, "pod-1", 10, 0, 1.0),
            outcome(1, "pod-1", 10, 0, 1.0),
            outcome(2, "pod-9", 10, 0, 1.0),
        ];
        let mut failed = outcome(3, "pod-2", 10, 0, 1.0);
        failed.status = 503;
        o.push(failed);
        let counts = per_pod(&o, &pods(3));
        assert_eq!(counts["pod-1"], 2);
        assert_eq!(counts["pod-2"], 0, "failures do not count");
        assert_eq!(counts["pod-3"], 0);
        assert_eq!(counts["(unknown)"], 1);
    }

    #[test]
    fn stats_of_a_run() {
        let mut o: Vec<Outcome> = (0..10)
            .map(|i| outcome(i, &format!("pod-{}", i % 2 + 1), 100, 50, i as f64))
            .collect();
        o[9].status = 0;
        o[9].error = Some("reset".into());
        let s = Stats::of(&o, &pods(2));
        assert_eq!((s.sent, s.ok, s.errors), (10, 9, 1));
        assert_eq!(s.error_samples.len(), 1);
        assert!(s.error_samples[0].starts_with("#9 status 0 reset"));
        assert_eq!((s.prompt_tokens, s.cached_tokens), (900, 450));
        assert_eq!(s.hit_rate, Some(0.5));
        // TTFT of the 9 ok requests: 0..=8 ms; p50 = 4, p90 = 7.2.
        let t = s.ttft_ms.unwrap();
        assert_eq!(t.count, 9);
        assert!((t.p50 - 4.0).abs() < 1e-9 && (t.p90 - 7.2).abs() < 1e-9);
        // pod-1 got 0,2,4,6,8; pod-2 got 1,3,5,7 (9 failed).
        assert_eq!(s.per_pod["pod-1"], 5);
        assert_eq!(s.per_pod["pod-2"], 4);
        assert_eq!(s.spread, Some(1.25));
        assert_eq!(s.pod_counts_label(&pods(2)), "5/4");
        // Sends at 0..900 ms, the last reply at 950 ms: 9 ok in 0.95 s.
        assert!((s.span_s - 0.95).abs() < 1e-9);
        assert!((s.throughput_rps - 9.0 / 0.95).abs() < 1e-9);
    }

    #[test]
    fn throughput_without_successes_is_zero() {
        assert_eq!(throughput(&[]), 0.0);
        let mut o = outcome(0, "pod-1", 1, 0, 1.0);
        o.status = 500;
        assert_eq!(throughput(&[o]), 0.0);
    }
}
