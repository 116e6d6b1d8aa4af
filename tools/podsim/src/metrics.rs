//! Counters and gauges, rendered as Prometheus text (format 0.0.4) with
//! vLLM's metric names, so that routers scraping vLLM can scrape podsim.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// All of a pod's live numbers. Gauges are kept by RAII guards in `scheduler`.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Inference requests received (completions and chat, any outcome).
    pub requests: AtomicU64,
    /// Requests holding a slot.
    pub running: AtomicU64,
    /// Requests queued for a slot.
    pub waiting: AtomicU64,
    /// KV blocks sized for the running requests (prompt + output tokens).
    pub blocks_in_use: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: AtomicU64,
    /// Prompt tokens found in the prefix cache.
    pub prefix_hits: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Time between consecutive output tokens of a request, as vLLM's
    /// `vllm:inter_token_latency_seconds`.
    pub inter_token: Histogram,
}

/// Upper bounds (seconds) of vLLM's inter-token latency buckets.
const ITL_BUCKETS: [f64; 18] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0,
];

/// A Prometheus histogram over [`ITL_BUCKETS`], its sum kept in microseconds.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; rendered so).
    buckets: [AtomicU64; ITL_BUCKETS.len()],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Counts `n` observations of `secs` each.
    pub fn observe(&self, secs: f64, n: u64) {
        if n == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        if let Some(i) = ITL_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(n, Ordering::Relaxed);
        }
        let us = (secs * 1e6).round() as u64;
        self.sum_us
            .fetch_add(us.saturating_mul(n), Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, model: &str) {
        let mut below = 0;
        for (bound, n) in ITL_BUCKETS.iter().zip(&self.buckets) {
            below += n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{model_name=\"{model}\",le=\"{bound}\"}} {below}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{model_name=\"{model}\",le=\"+Inf\"}} {count}"
        );
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{model_name=\"{model}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{model_name=\"{model}\"}} {count}");
    }
}

/// What the KV cache adds to a scrape.
#[derive(Debug, Clone, Copy)]
pub struct KvSnapshot {
    pub cached_blocks: usize,
    pub capacity_blocks: usize,
    pub evicted_blocks: u64,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// The `/metrics` page. vLLM metrics carry a `model_name` label (the
    /// first `--model`); podsim's own metrics have no labels.
    pub fn render(&self, model_name: &str, kv: KvSnapshot) -> String {
        let label = format!("{{model_name=\"{}\"}}", escape_label(model_name));
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let usage = if kv.capacity_blocks == 0 {
            0.0
        } else {
            (get(&self.blocks_in_use) as f64 / kv.capacity_blocks as f64).min(1.0)
        };
        let mut out = String::new();
        let mut vllm = |name: &str, kind: &str, help: &str, value: String| {
            family(&mut out, name, kind, help);
            let _ = writeln!(out, "{name}{label} {value}");
        };
        vllm(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            get(&self.running).to_string(),
        );
        vllm(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            get(&self.waiting).to_string(),
        );
        vllm(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            format!("{usage}"),
        );
        vllm(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            get(&self.prefix_queries).to_string(),
        );
        vllm(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            get(&self.prefix_hits).to_string(),
        );
        vllm(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            get(&self.prompt_tokens).to_string(),
        );
        vllm(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            get(&self.generation_tokens).to_string(),
        );
        let itl = "vllm:inter_token_latency_seconds";
        family(
            &mut out,
            itl,
            "histogram",
            "Histogram of inter-token latency in seconds.",
        );
        self.inter_token
            .render(&mut out, itl, &escape_label(model_name));
        family(
            &mut out,
            "podsim_requests_total",
            "counter",
            "Inference requests received (completions and chat).",
        );
        let _ = writeln!(out, "podsim_requests_total {}", get(&self.requests));
        family(
            &mut out,
            "podsim_kv_cached_blocks",
            "gauge",
            "Blocks held in the simulated prefix cache.",
        );
        let _ = writeln!(out, "podsim_kv_cached_blocks {}", kv.cached_blocks);
        family(
            &mut out,
            "podsim_kv_capacity_blocks",
            "gauge",
            "Capacity of the simulated prefix cache, in blocks.",
        );
        let _ = writeln!(out, "podsim_kv_capacity_blocks {}", kv.capacity_blocks);
        family(
            &mut out,
            "podsim_kv_evicted_blocks_total",
            "counter",
            "Blocks evicted from the simulated prefix cache (LRU).",
        );
        let _ = writeln!(out, "podsim_kv_evicted_blocks_total {}", kv.evicted_blocks);
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn value(page: &str, series: &str) -> String {
        page.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .unwrap_or_else(|| panic!("{series} missing from\n{page}"))
            .to_owned()
    }

    #[test]
    fn renders_vllm_names() {
        let m = Metrics::default();
        m.running.store(2, Ordering::Relaxed);
        m.waiting.store(3, Ordering::Relaxed);
        m.blocks_in_use.store(25, Ordering::Relaxed);
        m.prefix_queries.store(100, Ordering::Relaxed);
        m.prefix_hits.store(64, Ordering::Relaxed);
        m.requests.store(7, Ordering::Relaxed);
        let page = m.render(
            "sim-model",
            KvSnapshot {
                cached_blocks: 10,
                capacity_blocks: 100,
                evicted_blocks: 0,
            },
        );
        let l = "{model_name=\"sim-model\"}";
        assert_eq!(value(&page, &format!("vllm:num_requests_running{l}")), "2");
        assert_eq!(value(&page, &format!("vllm:num_requests_waiting{l}")), "3");
        assert_eq!(
            value(&page, &format!("vllm:kv_cache_usage_perc{l}")),
            "0.25"
        );
        assert_eq!(
            value(&page, &format!("vllm:prefix_cache_queries_total{l}")),
            "100"
        );
        assert_eq!(
            value(&page, &format!("vllm:prefix_cache_hits_total{l}")),
            "64"
        );
        assert_eq!(value(&page, "podsim_requests_total"), "7");
        assert_eq!(value(&page, "podsim_kv_cached_blocks"), "10");
        assert!(page.contains("# TYPE vllm:prefix_cache_hits_total counter\n"));
        let itl = "vllm:inter_token_latency_seconds";
        assert_eq!(value(&page, &format!("{itl}_count{l}")), "0");
        m.inter_token.observe(0.003, 31);
        m.inter_token.observe(0.3, 1);
        let page = m.render(
            "sim-model",
            KvSnapshot {
                cached_blocks: 0,
                capacity_blocks: 1,
                evicted_blocks: 0,
            },
        );
        assert_eq!(value(&page, &format!("{itl}_count{l}")), "32");
        assert_eq!(value(&page, &format!("{itl}_sum{l}")), "0.393");
        let le = |b: &str| format!("{itl}_bucket{{model_name=\"sim-model\",le=\"{b}\"}}");
        assert_eq!(value(&page, &le("0.01")), "31");
        assert_eq!(value(&page, &le("0.2")), "31");
        assert_eq!(value(&page, &le("0.3")), "32");
        assert_eq!(value(&page, &le("+Inf")), "32");
        assert!(page.contains(&format!("# TYPE {itl} histogram\n")));
        assert!(page.ends_with('\n'));
    }

    #[test]
    fn usage_is_clamped_and_safe_at_zero_capacity() {
        let m = Metrics::default();
        m.blocks_in_use.store(500, Ordering::Relaxed);
        let page = m.render(
            "x",
            KvSnapshot {
                cached_blocks: 0,
                capacity_blocks: 100,
                evicted_blocks: 0,
            },
        );
        assert_eq!(
            value(&page, "vllm:kv_cache_usage_perc{model_name=\"x\"}"),
            "1"
        );
        let page = m.render(
            "x",
            KvSnapshot {
                cached_blocks: 0,
                capacity_blocks: 0,
                evicted_blocks: 0,
            },
        );
        assert_eq!(
            value(&page, "vllm:kv_cache_usage_perc{model_name=\"x\"}"),
            "0"
        );
        let page = m.render(
            "a\"b",
            KvSnapshot {
                cached_blocks: 0,
                capacity_blocks: 0,
                evicted_blocks: 0,
            },
        );
        assert!(page.contains("{model_name=\"a\\\"b\"}"));
    }
}
