//! What one more request in flight and one more uncached block cost a pod's
//! time to first token, learned per pod from this VM's streamed requests
//! ([`PodPrices`]).
//!
//! Each streamed request this VM sends is a sample: the requests in flight
//! on its pod as this VM knew them when it was sent (`n`), the blocks of
//! its prompt the pod was not predicted to hold (`u`), and the time from
//! routing to its answer's first bytes (`t`). Per pod, `t ≈ a + b·u + w·n`
//! is fitted by least squares over the recent samples (older ones fade by
//! [`FADE`] per sample), pulled toward a prior by [`PRIOR_WEIGHT`]
//! samples' worth at first, less with each sample. So where the pods' time does not grow with the requests
//! in flight (ample batch capacity), `w` reads about 0 and the longest
//! match wins; where requests queue, `w` reads about a request's service
//! time and balance wins. The prior is cautious: one request in flight
//! costs [`PRIOR_BLOCKS_PER_REQUEST`] blocks' prefill, as the fixed price
//! did, until the pod's answers say otherwise.
//!
//! Bounded: [`MAX_OPEN`] requests timed at once, one fit per pod slot.

use crate::route::registry::{PodSlot, MAX_SLOTS};

/// Requests timed at once per VM (others go untimed).
pub(crate) const MAX_OPEN: usize = 64;
/// An open request older than this is forgotten (its end was missed).
const OPEN_TTL_MS: u64 = 60_000;
/// Each sample's weight fades by this factor per newer sample: the fit
/// follows about the last 1 / (1 − FADE) = 20 requests of a pod.
const FADE: f64 = 0.95;
/// How many samples' worth the prior weighs at first (it fades as the
/// pod's samples come: a quarter of that after 12).
const PRIOR_WEIGHT: f64 = 2.0;
/// The prior per-block prefill, µs, for a pod with no samples while no pod
/// has any.
const PRIOR_US_PER_BLOCK: f64 = 1_000.0;
/// The prior cost of one more request in flight, in blocks of prefill.
pub(crate) const PRIOR_BLOCKS_PER_REQUEST: f64 = 16.0;
/// The typical uncached blocks the prior on `b` is stated at.
const PRIOR_BLOCKS: f64 = 32.0;
/// A sample's time is capped here (µs), so one stuck answer cannot swamp
/// a pod's fit.
const MAX_SAMPLE_US: f64 = 60_000_000.0;
/// Fitted prices are capped here (µs per block, µs per request).
const MAX_PRICE_US: f64 = 60_000_000.0;

/// A pod's learned prices: µs of time to first token per uncached block
/// and per request already in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Price {
    pub(crate) per_block_us: f64,
    pub(crate) per_request_us: f64,
}

#[derive(Debug, Clone, Copy)]
struct Open {
    stream: u32,
    pod: PodSlot,
    inflight: u32,
    uncached: u32,
    start_ms: u64,
}

/// One pod's faded sums for the normal equations of `t = a + b·u + w·n`.
#[derive(Debug, Clone, Copy, Default)]
struct Fit {
    /// Σ x xᵀ over x = (1, u, n).
    xx: [[f64; 3]; 3],
    /// Σ x t.
    xt: [f64; 3],
    samples: u32,
}

impl Fit {
    fn add(&mut self, u: f64, n: f64, t: f64) {
        let x = [1.0, u, n];
        for i in 0..3 {
            self.xt[i] = self.xt[i] * FADE + x[i] * t;
            for j in 0..3 {
                self.xx[i][j] = self.xx[i][j] * FADE + x[i] * x[j];
            }
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// (a, b, w) fitted with a ridge toward `(0, b0, w0)`.
    fn solve(&self, b0: f64, w0: f64) -> Option<[f64; 3]> {
        // Ridge: a barely held (its prior is 0), b and w held as
        // PRIOR_WEIGHT samples at typical values of u and n would hold
        // them, less as the pod's own samples accumulate.
        let weight = PRIOR_WEIGHT * 4.0 / (4.0 + f64::from(self.samples));
        let ridge = [weight * 1e-6, weight * PRIOR_BLOCKS * PRIOR_BLOCKS, weight];
        let prior = [0.0, b0, w0];
        let mut m = self.xx;
        let mut v = self.xt;
        for i in 0..3 {
            m[i][i] += ridge[i];
            v[i] += ridge[i] * prior[i];
        }
        solve3(m, v)
    }
}

/// Gaussian elimination with partial pivoting; None when singular.
fn solve3(mut m: [[f64; 3]; 3], mut v: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        v.swap(col, pivot);
        for row in col + 1..3 {
            let f = m[row][col] / m[col][col];
            for k in col..3 {
                m[row][k] -= f * m[col][k];
            }
            v[row] -= f * v[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let mut s = v[row];
        for k in row + 1..3 {
            s -= m[row][k] * x[k];
        }
        x[row] = s / m[row][row];
    }
    x.iter().all(|x| x.is_finite()).then_some(x)
}

/// This VM's learned prices per pod (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct PodPrices {
    fits: Vec<Fit>,
    /// Per slot: the fitted price, None until the pod's first sample.
    prices: Vec<Option<Price>>,
    open: Vec<Open>,
}

impl PodPrices {
    /// Times stream `stream`, sent to `pod` with `inflight` requests of
    /// this VM's knowledge already there and `uncached` blocks of its
    /// prompt not predicted held, from `now_ms`. False when not timed (too
    /// many open, or a slot out of range).
    pub(crate) fn start(
        &mut self,
        stream: u32,
        pod: PodSlot,
        inflight: u32,
        uncached: u32,
        now_ms: u64,
    ) -> bool {
        if pod.index() >= MAX_SLOTS || self.open.len() >= MAX_OPEN {
            return false;
        }
        self.open.retain(|o| o.stream != stream);
        self.open.push(Open {
            stream,
            pod,
            inflight,
            uncached,
            start_ms: now_ms,
        });
        true
    }

    /// Stream `stream`'s first answer bytes at `now_ms`: one sample.
    pub(crate) fn answered(&mut self, stream: u32, now_ms: u64) {
        let Some(i) = self.open.iter().position(|o| o.stream == stream) else {
            return;
        };
        let o = self.open.swap_remove(i);
        let t_us = (now_ms.saturating_sub(o.start_ms) as f64 * 1000.0).min(MAX_SAMPLE_US);
        let slot = o.pod.index();
        if self.fits.len() <= slot {
            self.fits.resize(slot + 1, Fit::default());
            self.prices.resize(slot + 1, None);
        }
        self.fits[slot].add(f64::from(o.uncached), f64::from(o.inflight), t_us);
        let b0 = self.reference_per_block(slot);
        let w0 = PRIOR_BLOCKS_PER_REQUEST * b0;
        self.prices[slot] = self.fits[slot].solve(b0, w0).map(|[_, b, w]| Price {
            per_block_us: b.clamp(0.0, MAX_PRICE_US),
            per_request_us: w.clamp(0.0, MAX_PRICE_US),
        });
    }

    /// Stream `stream` ended unanswered, or its answer is not a 200.
    pub(crate) fn ended(&mut self, stream: u32) {
        self.open.retain(|o| o.stream != stream);
    }

    /// Forgets open requests whose end was missed.
    pub(crate) fn tick(&mut self, now_ms: u64) {
        self.open
            .retain(|o| now_ms.saturating_sub(o.start_ms) < OPEN_TTL_MS);
    }

    /// `pod`'s prices: learned, or for a pod with no samples the prior
    /// (the other pods' median per-block price, or [`PRIOR_US_PER_BLOCK`],
    /// and [`PRIOR_BLOCKS_PER_REQUEST`] of them per request).
    pub(crate) fn price(&self, pod: PodSlot) -> Price {
        if let Some(Some(p)) = self.prices.get(pod.index()) {
            return *p;
        }
        let b = self.reference_per_block(pod.index());
        Price {
            per_block_us: b,
            per_request_us: PRIOR_BLOCKS_PER_REQUEST * b,
        }
    }

    /// The lower median of the other pods' learned per-block prices, or
    /// [`PRIOR_US_PER_BLOCK`].
    fn reference_per_block(&self, except: usize) -> f64 {
        let mut known: Vec<f64> = self
            .prices
            .iter()
            .enumerate()
            .filter(|&(i, p)| i != except && p.is_some_and(|p| p.per_block_us > 0.0))
            .filter_map(|(_, p)| p.map(|p| p.per_block_us))
            .collect();
        if known.is_empty() {
            return PRIOR_US_PER_BLOCK;
        }
        known.sort_by(f64::total_cmp);
        known[(known.len() - 1) / 2]
    }

    /// Requests being timed.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests;
