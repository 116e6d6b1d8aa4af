//! Percentiles and summaries of samples (latencies, delays, costs).
//!
//! Percentiles interpolate linearly between the two nearest ranks (numpy's
//! default, "type 7"), so p50 of an even count is the mean of the middle two
//! and small samples give stable, explainable numbers.

use serde::Serialize;

/// The `p`-th percentile (`0..=100`) of ascending `sorted` samples; None when
/// there are none. `p` outside `0..=100` is clamped.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = p.clamp(0.0, 100.0) / 100.0 * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    if lo == hi {
        // An exact rank: the sample itself (also when it is infinite).
        return Some(sorted[lo]);
    }
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Count, mean, extremes and the usual percentiles of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `values` (any order); None when empty. NaNs are dropped.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        let count = sorted.len();
        Some(Summary {
            count,
            mean: sorted.iter().sum::<f64>() / count.max(1) as f64,
            min: *sorted.first()?,
            p50: percentile(&sorted, 50.0)?,
            p90: percentile(&sorted, 90.0)?,
            p99: percentile(&sorted, 99.0)?,
            max: *sorted.last()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn an_exact_rank_is_the_sample_even_when_infinite() {
        let inf = f64::INFINITY;
        assert_eq!(percentile(&[1.0, inf, inf], 50.0), Some(inf));
        assert_eq!(percentile(&[1.0, inf], 50.0), Some(inf));
        assert_eq!(percentile(&[1.0, 2.0, 4.0], 50.0), Some(2.0));
    }

    #[test]
    fn empty_sample_has_no_percentile() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn single_sample_is_every_percentile() {
        for p in [0.0, 1.0, 50.0, 99.0, 100.0] {
            assert_eq!(percentile(&[7.0], p), Some(7.0));
        }
    }

    #[test]
    fn interpolates_between_nearest_ranks() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!(close(percentile(&v, 50.0).unwrap(), 50.5));
        assert!(close(percentile(&v, 99.0).unwrap(), 99.01));
        assert!(close(percentile(&v, 90.0).unwrap(), 90.1));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        // numpy.percentile([1, 2, 3, 4], 25) == 1.75
        assert!(close(
            percentile(&[1.0, 2.0, 3.0, 4.0], 25.0).unwrap(),
            1.75
        ));
    }

    #[test]
    fn out_of_range_p_is_clamped() {
        let v = [1.0, 2.0, 3.0];
        assert_eq!(percentile(&v, -5.0), Some(1.0));
        assert_eq!(percentile(&v, 250.0), Some(3.0));
    }

    #[test]
    fn summary_sorts_and_drops_nan() {
        let s = Summary::of(&[5.0, f64::NAN, 1.0, 3.0]).unwrap();
        assert_eq!(s.count, 3);
        assert_eq!((s.min, s.p50, s.max), (1.0, 3.0, 5.0));
        assert!(close(s.mean, 3.0));
        assert!(close(s.p99, 4.96));
    }
}
