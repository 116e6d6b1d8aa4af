//! Latency model and request scheduling.
//!
//! A pod runs at most `slots` requests at once; the others wait in a FIFO
//! queue (tokio's semaphore is fair). Once a request holds a slot:
//!
//! 1. its prompts are looked up in the KV cache (`cached` tokens);
//! 2. prefill takes `uncached_tokens * prefill_us_per_token` and yields the
//!    first output token, after which all full prompt blocks are in the cache;
//! 3. each further output token takes `decode_us_per_token`.
//!
//! So with `n` output tokens, time to first token = queue + prefill and total
//! = queue + prefill + (n - 1) * decode (n = 0: queue + prefill). Every model
//! delay is multiplied by `time_scale` (0 = no delay at all). A batch of
//! prompts (a completions `prompt` list) is prefilled together (the sum of
//! their uncached tokens) and decoded in lockstep.
//!
//! With `--prefill-stalls-decode`, a prefill also holds back the tokens of
//! the requests already decoding by its own duration, as a vLLM step that
//! carries a prefill chunk delays every decode in its batch: a pod that
//! computes many misses then reports a longer inter-token latency. (Still a
//! simplification: concurrent prefills do not slow each other.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::kvcache::{block_hashes, KvCache};
use crate::metrics::{KvSnapshot, Metrics};

/// Pure latency arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyModel {
    pub prefill_us_per_token: f64,
    pub decode_us_per_token: f64,
    pub time_scale: f64,
}

impl LatencyModel {
    fn scaled(&self, us: f64) -> Duration {
        let secs = us * self.time_scale / 1_000_000.0;
        if secs.is_finite() && secs > 0.0 {
            Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
        } else {
            Duration::ZERO
        }
    }

    /// Prefill time of `uncached_tokens` tokens.
    pub fn prefill(&self, uncached_tokens: u64) -> Duration {
        self.scaled(uncached_tokens as f64 * self.prefill_us_per_token)
    }

    /// Offset from the end of prefill at which output token `index` (0-based) is ready.
    pub fn token_offset(&self, index: u64) -> Duration {
        self.scaled(index as f64 * self.decode_us_per_token)
    }

    /// Time from getting a slot to the last output token (what the handlers
    /// realise step by step: prefill, then `token_offset(n - 1)`).
    #[cfg(test)]
    pub fn service_time(&self, uncached_tokens: u64, output_tokens: u64) -> Duration {
        self.prefill(uncached_tokens) + self.token_offset(output_tokens.saturating_sub(1))
    }
}

/// KV-cache lookup result for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheLookup {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    chains: Vec<Vec<u64>>,
}

impl CacheLookup {
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens - self.cached_tokens
    }
}

/// Slots, queue, KV cache and latency model of one pod.
#[derive(Debug)]
pub struct Engine {
    pub latency: LatencyModel,
    block_tokens: usize,
    slots: Arc<Semaphore>,
    kv: Mutex<KvCache>,
    metrics: Arc<Metrics>,
    /// `--prefill-stalls-decode` only.
    stalls: Option<Stalls>,
}

/// What prefills held decoding back by, so far.
#[derive(Debug, Default)]
struct Stalls {
    /// Prefill time summed (ns): what decoding requests wait for on top of
    /// their own token times.
    ns: AtomicU64,
    /// Prefills counted: each holds back one token of every decoding request.
    count: AtomicU64,
}

/// Held while a request waits in the queue.
struct Waiting(Arc<Metrics>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Held while a request runs: its slot and its share of KV blocks in use.
#[derive(Debug)]
pub struct Running {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
    blocks: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.metrics.running.fetch_sub(1, Ordering::Relaxed);
        self.metrics
            .blocks_in_use
            .fetch_sub(self.blocks, Ordering::Relaxed);
    }
}

impl Engine {
    pub fn new(
        latency: LatencyModel,
        slots: usize,
        block_tokens: usize,
        kv_capacity_blocks: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        Engine {
            latency,
            block_tokens,
            slots: Arc::new(Semaphore::new(slots)),
            kv: Mutex::new(KvCache::new(kv_capacity_blocks)),
            metrics,
            stalls: None,
        }
    }

    /// Prefills hold back the decoding requests (see the module doc).
    pub fn with_prefill_stalls(mut self, on: bool) -> Self {
        self.stalls = on.then(Stalls::default);
        self
    }

    /// Prefill time that held back decoding so far (zero without
    /// `--prefill-stalls-decode`); a decoding request's tokens are late by
    /// how much it grew since its own prefill ended.
    pub fn stalled(&self) -> Duration {
        self.stalls.as_ref().map_or(Duration::ZERO, |s| {
            Duration::from_nanos(s.ns.load(Ordering::Relaxed))
        })
    }

    /// Prefills that held back decoding so far (zero without
    /// `--prefill-stalls-decode`): each delays one token of every request
    /// decoding meanwhile.
    pub fn stall_count(&self) -> u64 {
        self.stalls
            .as_ref()
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }

    fn kv(&self) -> MutexGuard<'_, KvCache> {
        // No code panics while holding the lock, but never propagate poisoning.
        self.kv.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The KV cache's share of a metrics scrape.
    pub fn kv_snapshot(&self) -> KvSnapshot {
        let kv = self.kv();
        KvSnapshot {
            cached_blocks: kv.len(),
            capacity_blocks: kv.capacity(),
            evicted_blocks: kv.evictions(),
        }
    }

    /// Wait in the FIFO queue for a slot. `tokens` (prompt + output) sizes
    /// the request's share of KV blocks for `vllm:kv_cache_usage_perc`.
    /// Cancel-safe: dropping the future leaves the queue.
    pub async fn admit(&self, tokens: u64) -> Option<Running> {
        self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(Arc::clone(&self.metrics));
        let permit = Arc::clone(&self.slots).acquire_owned().await.ok()?;
        drop(waiting);
        let block = self.block_tokens.max(1) as u64;
        let blocks = tokens.div_ceil(block);
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .blocks_in_use
            .fetch_add(blocks, Ordering::Relaxed);
        Some(Running {
            _permit: permit,
            metrics: Arc::clone(&self.metrics),
            blocks,
        })
    }

    /// Look the prompts up in the KV cache and count the query in the metrics.
    pub fn lookup(&self, prompts: &[Vec<u32>]) -> CacheLookup {
        let chains: Vec<Vec<u64>> = prompts
            .iter()
            .map(|p| block_hashes(p, self.block_tokens))
            .collect();
        let prompt_tokens: u64 = prompts.iter().map(|p| p.len() as u64).sum();
        let cached_blocks: u64 = {
            let kv = self.kv();
            chains.iter().map(|c| kv.matched_blocks(c) as u64).sum()
        };
        let cached_tokens = cached_blocks * self.block_tokens as u64;
        self.metrics
            .prefix_queries
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        self.metrics
            .prefix_hits
            .fetch_add(cached_tokens, Ordering::Relaxed);
        self.metrics
            .prompt_tokens
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        CacheLookup {
            prompt_tokens,
            cached_tokens,
            chains,
        }
    }

    /// Insert or touch the full blocks of a looked-up request (after its prefill).
    pub fn commit(&self, lookup: &CacheLookup) {
        let mut kv = self.kv();
        for chain in &lookup.chains {
            kv.insert_chain(chain);
        }
    }

    /// Sleeps until `due`, plus however much prefills held decoding back
    /// since `stall` (what [`Self::stalled`] read when the request's own
    /// prefill ended). Without `--prefill-stalls-decode`: until `due`.
    pub async fn wait_decoded(&self, due: tokio::time::Instant, stall: Duration) {
        loop {
            let at = due + self.stalled().saturating_sub(stall);
            if tokio::time::Instant::now() >= at {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }

    /// Lookup, prefill delay, commit: the part of a request up to its first token.
    pub async fn prefill(&self, prompts: &[Vec<u32>]) -> CacheLookup {
        let lookup = self.lookup(prompts);
        let prefill = self.latency.prefill(lookup.uncached_tokens());
        if let Some(s) = &self.stalls {
            let ns = u64::try_from(prefill.as_nanos()).unwrap_or(u64::MAX);
            s.ns.fetch_add(ns, Ordering::Relaxed);
            s.count.fetch_add(1, Ordering::Relaxed);
        }
        sleep(prefill).await;
        self.commit(&lookup);
        lookup
    }
}

/// `tokio::time::sleep` that returns at once for a zero duration.
pub async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn model(scale: f64) -> LatencyModel {
        LatencyModel {
            prefill_us_per_token: 50.0,
            decode_us_per_token: 1000.0,
            time_scale: scale,
        }
    }

    #[test]
    fn latency_math() {
        let m = model(1.0);
        assert_eq!(m.prefill(1000), Duration::from_millis(50));
        assert_eq!(m.prefill(0), Duration::ZERO);
        assert_eq!(m.token_offset(1), Duration::from_millis(1));
        assert_eq!(m.token_offset(0), Duration::ZERO);
        assert_eq!(m.token_offset(15), Duration::from_millis(15));
        // 1000 uncached tokens, 16 output tokens: 50 ms + 15 ms.
        assert_eq!(m.service_time(1000, 16), Duration::from_millis(65));
        assert_eq!(m.service_time(1000, 1), Duration::from_millis(50));
        assert_eq!(m.service_time(1000, 0), Duration::from_millis(50));
    }

    #[test]
    fn time_scale_multiplies_everything() {
        let half = model(0.5);
        assert_eq!(half.service_time(1000, 16), Duration::from_micros(32_500));
        let off = model(0.0);
        assert_eq!(off.service_time(1_000_000, 1000), Duration::ZERO);
        let tenfold = model(10.0);
        assert_eq!(tenfold.token_offset(1), Duration::from_millis(10));
        let absurd = LatencyModel {
            prefill_us_per_token: f64::MAX,
            decode_us_per_token: 1.0,
            time_scale: 1.0,
        };
        assert_eq!(absurd.prefill(u64::MAX), Duration::ZERO); // non-finite -> no delay
    }

    fn engine(slots: usize) -> (Engine, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        (
            Engine::new(model(0.0), slots, 16, 100, Arc::clone(&metrics)),
            metrics,
        )
    }

    #[tokio::test]
    async fn a_prefill_holds_back_decoding_only_with_stalls_on() {
        let prompt: Vec<u32> = (0..400).collect(); // 20 ms of prefill at 50 us/token
        for on in [false, true] {
            let metrics = Arc::new(Metrics::default());
            let e = Arc::new(Engine::new(model(1.0), 4, 16, 100, metrics).with_prefill_stalls(on));
            let stall = e.stalled();
            let start = tokio::time::Instant::now();
            let other = {
                let (e, p) = (Arc::clone(&e), prompt.clone());
                tokio::spawn(async move { e.prefill(&[p]).await })
            };
            tokio::task::yield_now().await;
            e.wait_decoded(start + Duration::from_millis(2), stall)
                .await;
            let waited = start.elapsed();
            other.await.unwrap();
            if on {
                assert_eq!(e.stalled(), Duration::from_millis(20));
                assert!(waited >= Duration::from_millis(22), "{waited:?}");
            } else {
                assert_eq!(e.stalled(), Duration::ZERO);
                assert!(waited >= Duration::from_millis(2), "{waited:?}");
            }
        }
    }

    #[tokio::test]
    async fn lookup_counts_tokens_and_commit_caches() {
        let (e, m) = engine(1);
        let p: Vec<u32> = (0..40).collect();
        let first = e.prefill(std::slice::from_ref(&p)).await;
        assert_eq!((first.prompt_tokens, first.cached_tokens), (40, 0));
        let second = e.prefill(&[p.clone(), p.clone()]).await;
        assert_eq!((second.prompt_tokens, second.cached_tokens), (80, 64));
        assert_eq!(second.uncached_tokens(), 16);
        assert_eq!(m.prefix_queries.load(Ordering::Relaxed), 120);
        assert_eq!(m.prefix_hits.load(Ordering::Relaxed), 64);
        let kv = e.kv_snapshot();
        assert_eq!(
            (kv.cached_blocks, kv.capacity_blocks, kv.evicted_blocks),
            (2, 100, 0)
        );
    }

    #[tokio::test]
    async fn slots_queue_fifo_and_gauges() {
        let (e, m) = engine(1);
        let e = Arc::new(e);
        let first = e.admit(40).await.unwrap();
        assert_eq!(m.running.load(Ordering::Relaxed), 1);
        assert_eq!(m.blocks_in_use.load(Ordering::Relaxed), 3);
        let e2 = Arc::clone(&e);
        let waiter = tokio::spawn(async move { e2.admit(16).await.map(|_r| ()) });
        tokio::task::yield_now().await;
        for _ in 0..100 {
            if m.waiting.load(Ordering::Relaxed) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(m.waiting.load(Ordering::Relaxed), 1);
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(m.waiting.load(Ordering::Relaxed), 0);
        assert_eq!(m.running.load(Ordering::Relaxed), 0);
        assert_eq!(m.blocks_in_use.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_the_queue() {
        let (e, m) = engine(1);
        let held = e.admit(1).await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(10), e.admit(1)).await;
        assert!(r.is_err());
        assert_eq!(m.waiting.load(Ordering::Relaxed), 0);
        drop(held);
        assert!(e.admit(1).await.is_some());
    }
}
