//! A pod's typical time per output token from its inter-token latency
//! histogram's buckets, which a prefill sharing the pod does not inflate.
//!
//! A vLLM step that carries a prefill chunk delays every decoding request's
//! next token by the chunk's time. A pod computing many prompts therefore
//! reports a mean inter-token latency well above its decode speed, and the
//! load-aware policy would read a pod busy with misses as a slow pod and
//! send its matches elsewhere. The delayed tokens are a minority and lie far
//! above the others; [`Span::typical_secs`] leaves them out: it is the mean of the
//! tokens below twice the bound of the bucket holding the median. The
//! tokens left out are valued at their bucket's middle, and the result is
//! held within what the kept buckets' bounds allow, so it is exact when no
//! token is left out (a pod whose tokens all take under 10 ms, vLLM's
//! lowest bound, is read at its mean, not at a bucket's resolution).

/// Distinct bucket bounds read at most; a histogram with more is not used
/// (the mean is).
pub(crate) const MAX_BUCKETS: usize = 64;

/// One histogram's cumulative bucket counts by upper bound (`le`), summed
/// over its label sets (e.g. one series per model).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Buckets {
    /// (upper bound s, cumulative count, label sets summed), in body order
    /// until [`Buckets::finish`] sorts them.
    bounds: Vec<(f64, f64, u32)>,
    bad: bool,
}

impl Buckets {
    /// Adds one `_bucket` sample: its `le` label's text and its value (None
    /// if not a finite number >= 0).
    pub(crate) fn add(&mut self, le: Option<&[u8]>, value: Option<f64>) {
        let bound = le.and_then(parse_bound);
        let (Some(bound), Some(value)) = (bound, value) else {
            self.bad = true;
            return;
        };
        if let Some(b) = self.bounds.iter_mut().find(|b| b.0 == bound) {
            b.1 += value;
            b.2 += 1;
        } else if self.bounds.len() < MAX_BUCKETS {
            self.bounds.push((bound, value, 1));
        } else {
            self.bad = true;
        }
    }

    /// Sorted by bound and checked: every label set gave every bound, the
    /// last is `+Inf`, and the counts never fall. None otherwise.
    pub(crate) fn finish(mut self) -> Option<Self> {
        self.bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let sets = self.bounds.first()?.2;
        let ok = !self.bad
            && self.bounds.iter().all(|b| b.2 == sets)
            && self.bounds.last()?.0.is_infinite()
            && self.bounds.windows(2).all(|w| w[0].1 <= w[1].1);
        ok.then_some(self)
    }

    /// The count at or below `+Inf`: every observation.
    pub(crate) fn total(&self) -> f64 {
        self.bounds.last().map_or(0.0, |b| b.1)
    }

    fn same_bounds(&self, other: &Self) -> bool {
        self.bounds.len() == other.bounds.len()
            && self
                .bounds
                .iter()
                .zip(&other.bounds)
                .all(|(a, b)| a.0 == b.0)
    }
}

/// `le` label text as a bound: a number, or `+Inf`.
fn parse_bound(text: &[u8]) -> Option<f64> {
    if text == b"+Inf" || text == b"Inf" {
        return Some(f64::INFINITY);
    }
    let v: f64 = std::str::from_utf8(text).ok()?.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// Observations per bucket and their sum over a span of time: a
/// histogram's difference between two scrapes ([`Span::between`]), or a
/// decayed sum of such differences ([`Span::decay_add`]). Without buckets
/// it holds the sum and count alone (the mean is all it gives).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Span {
    /// Per bucket: (lower bound, upper bound, observations in it).
    buckets: Vec<(f64, f64, f64)>,
    pub(crate) sum_secs: f64,
    pub(crate) count: f64,
}

impl Span {
    /// The observations made between `before` and `now` (all of `now`'s
    /// when `before` is None: the caller passes no `now` where the scrape
    /// before had no buckets); `sum` and `count` are the histogram's `_sum`
    /// and `_count` over the same span. Without `now`, or with buckets that
    /// do not match each other or the count, the span has no buckets.
    pub(crate) fn between(
        now: Option<&Buckets>,
        before: Option<&Buckets>,
        sum: f64,
        count: f64,
    ) -> Self {
        let mut span = Span {
            buckets: Vec::new(),
            sum_secs: sum.max(0.0),
            count: count.max(0.0),
        };
        let Some(now) = now else { return span };
        if before.is_some_and(|b| !b.same_bounds(now)) {
            return span;
        }
        let (mut lower, mut below) = (0.0, 0.0);
        for (i, &(upper, cumulative, _)) in now.bounds.iter().enumerate() {
            let cumulative = cumulative - before.map_or(0.0, |b| b.bounds[i].1);
            let n = cumulative - below;
            if n < 0.0 {
                span.buckets.clear();
                return span;
            }
            span.buckets.push((lower, upper, n));
            (lower, below) = (upper, cumulative);
        }
        if (below - count).abs() > 0.5 {
            span.buckets.clear();
        }
        span
    }

    /// This span weighted by `decay` (0..1), plus `newer`: older tokens
    /// count less and less. When the two do not have the same buckets, the
    /// result has none.
    pub(crate) fn decay_add(&mut self, decay: f64, newer: &Span) {
        self.sum_secs = self.sum_secs * decay + newer.sum_secs;
        self.count = self.count * decay + newer.count;
        let same = self.buckets.len() == newer.buckets.len()
            && self
                .buckets
                .iter()
                .zip(&newer.buckets)
                .all(|(a, b)| a.1 == b.1);
        if same {
            for (a, b) in self.buckets.iter_mut().zip(&newer.buckets) {
                a.2 = a.2 * decay + b.2;
            }
        } else {
            self.buckets.clear();
        }
    }

    /// The typical time per observation, seconds: [`Self::typical_secs`]
    /// where the buckets allow it, else the mean. None without observations.
    pub(crate) fn time_secs(&self) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        self.typical_secs().or(Some(self.sum_secs / self.count))
    }

    /// The mean of the observations below twice the upper bound of the
    /// bucket holding the median, those above valued at their bucket's
    /// middle (at its lower bound in `+Inf`), held within what the kept
    /// buckets' bounds allow. None without buckets or observations, or
    /// when the median lies in `+Inf`.
    pub(crate) fn typical_secs(&self) -> Option<f64> {
        let mut seen = 0.0;
        let median = self.buckets.iter().find(|b| {
            seen += b.2;
            seen >= self.count / 2.0
        })?;
        let cut = 2.0 * median.1;
        if !cut.is_finite() {
            return None;
        }
        let (mut kept, mut lo, mut hi, mut left_out) = (0.0, 0.0, 0.0, 0.0);
        for &(lower, upper, n) in self.buckets.iter().filter(|b| b.2 > 0.0) {
            if lower >= cut {
                let middle = if upper.is_finite() {
                    (lower + upper) / 2.0
                } else {
                    lower
                };
                left_out += n * middle;
            } else {
                kept += n;
                lo += n * lower;
                hi += n * upper;
            }
        }
        (kept > 0.0).then(|| (self.sum_secs - left_out).max(lo).min(hi) / kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's inter-token latency bounds.
    const VLLM: [f64; 18] = [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0,
    ];

    /// A histogram of `obs` (seconds, count) over vLLM's bounds, with its
    /// sum and count.
    fn histogram(obs: &[(f64, u32)]) -> (Buckets, f64, f64) {
        let mut b = Buckets::default();
        let count = |le: f64| {
            obs.iter()
                .filter(|o| o.0 <= le)
                .map(|o| f64::from(o.1))
                .sum::<f64>()
        };
        for le in VLLM {
            b.add(Some(le.to_string().as_bytes()), Some(count(le)));
        }
        b.add(Some(b"+Inf"), Some(count(f64::INFINITY)));
        let sum = obs.iter().map(|o| o.0 * f64::from(o.1)).sum();
        (b.finish().unwrap(), sum, count(f64::INFINITY))
    }

    fn typical_ms(obs: &[(f64, u32)]) -> f64 {
        let (b, sum, count) = histogram(obs);
        let t = Span::between(Some(&b), None, sum, count).typical_secs();
        (t.unwrap() * 1e3 * 100.0).round() / 100.0
    }

    #[test]
    fn tokens_held_back_by_prefills_are_left_out() {
        // 3 ms tokens, and a tenth of them 250-350 ms late: the mean says
        // 33 ms, the typical time 3 ms (the late ones valued at their
        // buckets' middles, which here are their values).
        let mixed = [(0.003, 900), (0.25, 50), (0.35, 50)];
        let (_, sum, count) = histogram(&mixed);
        assert!(sum / count > 0.03);
        assert_eq!(typical_ms(&mixed), 3.0);
        // A pod 3x slower stays 3x slower, with or without late tokens.
        assert_eq!(typical_ms(&[(0.009, 1000)]), 9.0);
        assert_eq!(typical_ms(&[(0.009, 900), (0.625, 100)]), 9.0);
    }

    #[test]
    fn tokens_on_both_sides_of_a_bound_count_at_their_mean() {
        // Half just under 10 ms, half just over: both buckets are kept.
        assert_eq!(typical_ms(&[(0.0099, 50), (0.0101, 50)]), 10.0);
        // Slower pods resolve as well: 40 ms with late tokens at 1 s.
        assert_eq!(typical_ms(&[(0.04, 95), (1.75, 5)]), 40.0);
    }

    #[test]
    fn the_estimate_stays_within_the_kept_buckets_bounds() {
        // The late tokens' real values lie far under their buckets' middles:
        // the kept ones cannot be read below their own lower bounds.
        let (b, _, count) = histogram(&[(0.02, 90), (2.6, 10)]);
        let sum = 90.0 * 0.02 + 10.0 * 2.5001;
        let t = Span::between(Some(&b), None, sum, count).typical_secs();
        assert!((0.01..=0.025).contains(&t.unwrap()), "{t:?}");
    }

    #[test]
    fn only_the_span_between_two_scrapes_counts() {
        let (before, sum0, count0) = histogram(&[(0.003, 100)]);
        let (now, sum1, count1) = histogram(&[(0.003, 100), (0.03, 100)]);
        let span = Span::between(Some(&now), Some(&before), sum1 - sum0, count1 - count0);
        let t = span.typical_secs().unwrap();
        assert!((t - 0.03).abs() < 1e-9, "{t}");
    }

    #[test]
    fn unusable_buckets_leave_the_mean() {
        let (b, sum, count) = histogram(&[(0.003, 100), (0.625, 10)]);
        let mean = sum / count;
        let time = |span: Span| (span.typical_secs(), span.time_secs());
        // No observation: nothing.
        assert_eq!(time(Span::between(Some(&b), None, 0.0, 0.0)), (None, None));
        // A count the buckets do not add up to.
        let span = Span::between(Some(&b), None, sum, count + 5.0);
        assert_eq!(time(span), (None, Some(sum / (count + 5.0))));
        // Counts that fell since the scrape before (a restart).
        let (bigger, ..) = histogram(&[(0.003, 200)]);
        let span = Span::between(Some(&b), Some(&bigger), sum, count);
        assert_eq!(time(span), (None, Some(mean)));
        // The median in +Inf.
        let (inf, sum, count) = histogram(&[(50.0, 10)]);
        let span = Span::between(Some(&inf), None, sum, count);
        assert_eq!(time(span), (None, Some(50.0)));
        // Bounds that differ between scrapes.
        let mut other = Buckets::default();
        other.add(Some(b"0.5"), Some(1.0));
        other.add(Some(b"+Inf"), Some(1.0));
        let other = other.finish().unwrap();
        let span = Span::between(Some(&b), Some(&other), 1.0, 1.0);
        assert_eq!(time(span), (None, Some(1.0)));
    }

    #[test]
    fn a_decayed_span_weighs_recent_tokens_more_and_keeps_its_buckets() {
        let (fast, sum, count) = histogram(&[(0.003, 100)]);
        let mut acc = Span::between(Some(&fast), None, sum, count);
        let (slow, sum, count) = histogram(&[(0.009, 100)]);
        acc.decay_add(0.5, &Span::between(Some(&slow), None, sum, count));
        // 50 tokens at 3 ms and 100 at 9 ms.
        assert!((acc.typical_secs().unwrap() - 0.007).abs() < 1e-9);
        // A span without buckets: the mean only from then on.
        acc.decay_add(0.5, &Span::between(None, None, 0.9, 100.0));
        assert_eq!(acc.typical_secs(), None);
        assert!((acc.time_secs().unwrap() - (0.075 + 0.45 + 0.9) / 175.0).abs() < 1e-12);
    }

    #[test]
    fn malformed_buckets_are_refused() {
        let finish = |samples: &[(&[u8], Option<f64>)]| {
            let mut b = Buckets::default();
            for (le, v) in samples {
                b.add(Some(le), *v);
            }
            b.finish()
        };
        // No +Inf, a bad bound, a bad value, counts that fall.
        assert!(finish(&[(b"0.1", Some(1.0))]).is_none());
        assert!(finish(&[(b"x", Some(1.0)), (b"+Inf", Some(1.0))]).is_none());
        assert!(finish(&[(b"0.1", None), (b"+Inf", Some(1.0))]).is_none());
        assert!(finish(&[(b"0.1", Some(5.0)), (b"+Inf", Some(1.0))]).is_none());
        // Two label sets, one of them missing a bound.
        assert!(finish(&[
            (b"0.1", Some(1.0)),
            (b"+Inf", Some(1.0)),
            (b"+Inf", Some(2.0))
        ])
        .is_none());
        // Two label sets with the same bounds sum.
        let b = finish(&[
            (b"0.1", Some(1.0)),
            (b"+Inf", Some(1.0)),
            (b"0.1", Some(2.0)),
            (b"+Inf", Some(4.0)),
        ])
        .unwrap();
        assert_eq!(b.total(), 5.0);
        // Too many bounds.
        let mut b = Buckets::default();
        for i in 0..=MAX_BUCKETS {
            b.add(Some(i.to_string().as_bytes()), Some(i as f64));
        }
        b.add(Some(b"+Inf"), Some(100.0));
        assert!(b.finish().is_none());
    }
}
