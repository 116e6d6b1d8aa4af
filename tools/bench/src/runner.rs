//! Load generation: sends a workload over keep-alive HTTP/1.1 connections and
//! records, per request, what a router comparison needs: status, time to
//! first token (streaming), total latency, the pod that served it
//! (`x-served-by`), the filter's match percent (`x-prefix-match`, when
//! present) and the cached prompt tokens the pod reported
//! (`usage.prompt_tokens_details.cached_tokens`).
//!
//! Two pacings: closed loop (N workers, each sends its next request when the
//! previous one ends) and open loop (Poisson arrivals at a fixed rate, sent
//! whatever the backlog). Request `i` goes to target `i % targets.len()`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_prefix_router::rng::SplitMix64;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::Value;

use crate::workload::Request;

/// How requests are released.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pacing {
    /// `concurrency` workers, each with one request in flight.
    Closed { concurrency: usize },
    /// Poisson arrivals: exponential gaps with mean `1 / rate_per_sec`,
    /// drawn from `seed`.
    Poisson { rate_per_sec: f64, seed: u64 },
}

/// What one request saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// Position in the workload.
    pub index: usize,
    /// The request's prefix group or session ([`Request::family`]; set by
    /// `drive::drive`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<usize>,
    /// Index of the target (base URL) it was sent to.
    pub target: usize,
    /// When it was sent, ms after the run started.
    pub start_ms: f64,
    /// HTTP status; 0 when the transport failed (see `error`).
    pub status: u16,
    pub error: Option<String>,
    /// Streaming only: ms from sending to the first body chunk.
    pub ttft_ms: Option<f64>,
    /// ms from sending to the end of the body.
    pub latency_ms: f64,
    /// `x-served-by`.
    pub pod: Option<String>,
    /// `x-prefix-match`.
    pub match_percent: Option<u8>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl Outcome {
    /// A 2xx reply with a complete body.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status) && self.error.is_none()
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Sends requests to one or more base URLs (`http://127.0.0.1:PORT`).
#[derive(Clone)]
pub struct Runner {
    client: HttpClient,
    targets: Arc<Vec<String>>,
    timeout: Duration,
}

/// A request ready to send many times.
#[derive(Clone)]
struct Prepared {
    path: &'static str,
    body: Bytes,
    stream: bool,
}

impl Runner {
    /// A runner over `targets`; connections are pooled and kept alive. Must be
    /// created and used inside a tokio runtime.
    pub fn new(targets: Vec<String>) -> Runner {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build_http();
        Runner {
            client,
            targets: Arc::new(targets),
            timeout: Duration::from_secs(120),
        }
    }

    /// Sends one request to target `target` (index `index` in the outcome).
    pub async fn send(&self, target: usize, index: usize, request: &Request) -> Outcome {
        let prepared = prepare(request);
        let t0 = Instant::now();
        let mut out = self.send_prepared(target, &prepared).await;
        out.index = index;
        out.start_ms = 0.0;
        out.latency_ms = ms(t0.elapsed());
        out
    }

    /// Sends every request with `pacing`; outcomes in workload order.
    pub async fn run(&self, requests: &[Request], pacing: Pacing) -> Vec<Outcome> {
        let prepared: Arc<Vec<Prepared>> = Arc::new(requests.iter().map(prepare).collect());
        let started = Instant::now();
        let mut outcomes = match pacing {
            Pacing::Closed { concurrency } => self.closed(prepared, started, concurrency).await,
            Pacing::Poisson { rate_per_sec, seed } => {
                let offsets = poisson_offsets(requests.len(), rate_per_sec, seed);
                self.open(prepared, started, &offsets).await
            }
        };
        outcomes.sort_by_key(|o| o.index);
        outcomes
    }

    async fn closed(
        &self,
        prepared: Arc<Vec<Prepared>>,
        started: Instant,
        concurrency: usize,
    ) -> Vec<Outcome> {
        let next = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..concurrency.max(1) {
            let (runner, prepared, next) = (self.clone(), prepared.clone(), next.clone());
            workers.push(tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = prepared.get(i) else { break };
                    done.push(runner.timed(i, p, started).await);
                }
                done
            }));
        }
        let mut all = Vec::with_capacity(prepared.len());
        for w in workers {
            all.extend(w.await.unwrap_or_default());
        }
        all
    }

    async fn open(
        &self,
        prepared: Arc<Vec<Prepared>>,
        started: Instant,
        offsets: &[Duration],
    ) -> Vec<Outcome> {
        let start = tokio::time::Instant::from_std(started);
        let mut tasks = Vec::with_capacity(prepared.len());
        for (i, offset) in offsets.iter().enumerate() {
            let (runner, prepared, at) = (self.clone(), prepared.clone(), start + *offset);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                runner.timed(i, &prepared[i], started).await
            }));
        }
        let mut all = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(o) = t.await {
                all.push(o);
            }
        }
        all
    }

    async fn timed(&self, index: usize, p: &Prepared, started: Instant) -> Outcome {
        let target = index % self.targets.len().max(1);
        let t0 = Instant::now();
        let mut out = self.send_prepared(target, p).await;
        out.index = index;
        out.start_ms = ms(t0.duration_since(started));
        out.latency_ms = ms(t0.elapsed());
        out
    }

    async fn send_prepared(&self, target: usize, p: &Prepared) -> Outcome {
        let mut out = Outcome {
            target,
            ..Outcome::default()
        };
        let t0 = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.exchange(target, p, t0, &mut out));
        match result.await {
            Ok(Ok(body)) => read_usage(&body, p.stream, &mut out),
            Ok(Err(e)) => out.error = Some(e),
            Err(_) => out.error = Some(format!("timed out after {:?}", self.timeout)),
        }
        out
    }

    /// One request/response; fills status, headers and TTFT, returns the body.
    async fn exchange(
        &self,
        target: usize,
        p: &Prepared,
        t0: Instant,
        out: &mut Outcome,
    ) -> Result<Vec<u8>, String> {
        let base = self.targets.get(target).ok_or("no such target")?;
        let request = hyper::Request::post(format!("{base}{}", p.path))
            .header("content-type", "application/json")
            .body(Full::new(p.body.clone()))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        out.status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        out.pod = header("x-served-by");
        out.match_percent = header("x-prefix-match").and_then(|v| v.trim().parse().ok());
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body: {e}"))?;
            if let Some(data) = frame.data_ref() {
                if p.stream && out.ttft_ms.is_none() && !data.is_empty() {
                    out.ttft_ms = Some(ms(t0.elapsed()));
                }
                bytes.extend_from_slice(data);
            }
        }
        Ok(bytes)
    }
}

fn prepare(r: &Request) -> Prepared {
    Prepared {
        path: r.api.path(),
        body: Bytes::from(r.body.clone()),
        stream: r.stream,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Arrival offsets of a Poisson process with `rate_per_sec`, the first at 0.
pub fn poisson_offsets(n: usize, rate_per_sec: f64, seed: u64) -> Vec<Duration> {
    let mut rng = SplitMix64::new(seed);
    let mut t = 0.0f64;
    (0..n)
        .map(|i| {
            if i > 0 && rate_per_sec > 0.0 {
                // Inverse CDF of the exponential; 1 - u is in (0, 1].
                t += -(1.0 - rng.unit_f64()).ln() / rate_per_sec;
            }
            Duration::from_secs_f64(t)
        })
        .collect()
}

/// Prompt and cached tokens from a JSON reply or, streaming, from the last
/// SSE chunk that carries `usage`.
fn read_usage(body: &[u8], stream: bool, out: &mut Outcome) {
    let usage = if stream {
        String::from_utf8_lossy(body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| d.contains("\"usage\""))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .next_back()
            .map(|v| v["usage"].clone())
    } else {
        serde_json::from_slice::<Value>(body)
            .ok()
            .map(|v| v["usage"].clone())
    };
    if let Some(u) = usage {
        out.prompt_tokens = u["prompt_tokens"].as_u64();
        out.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].as_u64();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_offsets_are_deterministic_increasing_and_at_rate() {
        let a = poisson_offsets(20_000, 50.0, 3);
        assert_eq!(a, poisson_offsets(20_000, 50.0, 3));
        assert_ne!(a, poisson_offsets(20_000, 50.0, 4));
        assert_eq!(a[0], Duration::ZERO);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // 19 999 gaps of mean 20 ms: within a few percent of 400 s.
        let total = a.last().unwrap().as_secs_f64();
        assert!((total - 400.0).abs() < 12.0, "total {total}");
    }

    #[test]
    fn usage_from_json_and_from_stream() {
        let mut o = Outcome::default();
        read_usage(
            br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}}"#,
            false,
            &mut o,
        );
        assert_eq!((o.prompt_tokens, o.cached_tokens), (Some(10), Some(8)));
        let sse = "data: {\"choices\":[{\"delta\":{\"content\":\" the\"}}]}\n\n\
                   data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n\
                   data: [DONE]\n\n";
        let mut o = Outcome::default();
        read_usage(sse.as_bytes(), true, &mut o);
        assert_eq!((o.prompt_tokens, o.cached_tokens), (Some(7), Some(4)));
    }
}
