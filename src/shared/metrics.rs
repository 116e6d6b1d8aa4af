//! Envoy's stats seen through a narrow trait, so every layer counts over
//! [`MetricSink`] and its tests read the values from a double.

/// Kinds of Envoy stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// Envoy's stat hostcalls. Best effort: a stat that fails never fails a
/// request, so nothing here returns an error.
pub(crate) trait MetricSink {
    /// Defines a stat; 0 when the host refuses (writes to 0 are ignored).
    fn define_metric(&self, kind: MetricKind, name: &str) -> u32;
    /// Adds to a counter or gauge.
    fn increment_metric(&self, id: u32, by: i64);
    /// Sets a gauge or records a histogram value.
    fn record_metric(&self, id: u32, value: u64);
    /// Defines `prefix_router.<section>.<name>`, a stat of one part of the
    /// filter (`sync`, `signals`, `membership`).
    fn define_in(&self, section: &str, kind: MetricKind, name: &str) -> u32 {
        self.define_metric(kind, &format!("prefix_router.{section}.{name}"))
    }
}
