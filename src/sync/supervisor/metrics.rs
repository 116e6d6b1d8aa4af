//! Envoy stats of the sync singleton (`prefix_router.sync.*`). Engine totals
//! are turned into counter increments against what was last published. The
//! liveness gauges are the workers' (see [`crate::sync::liveness`]): they
//! must keep moving if this VM dies.

use crate::shared::metrics::{MetricKind, MetricSink};
use crate::sync::stats::{CounterField, SyncStats};

/// The prefix-cache syncable's own counts (not engine stats).
#[derive(Debug, Default)]
pub(super) struct PrefixCounts {
    pub(super) dirty_dropped: u64,
    pub(super) facts_ignored: u64,
    pub(super) foreign_entries: u64,
    pub(super) foreign_dropped: u64,
}

/// A counter fed from a running total: the total last published.
struct Total {
    id: u32,
    last: u64,
}

impl Total {
    fn define(sink: &impl MetricSink, name: &str) -> Self {
        Self {
            id: sink.define_in(SECTION, MetricKind::Counter, name),
            last: 0,
        }
    }

    /// Adds what `total` grew by since the last call.
    fn publish(&mut self, sink: &impl MetricSink, total: u64) {
        if total > self.last {
            sink.increment_metric(
                self.id,
                i64::try_from(total - self.last).unwrap_or(i64::MAX),
            );
            self.last = total;
        }
    }
}

/// The section of this part's stats: `prefix_router.sync.*`.
const SECTION: &str = "sync";

pub(super) struct SyncMetrics {
    /// The engine's counters, by field.
    counters: Vec<(Total, CounterField)>,
    backoff_ms: u32,
    rtt_ms: u32,
    dirty_dropped: Total,
    facts_ignored: Total,
    foreign_entries: u32,
    foreign_dropped: Total,
    probes: u32,
    redis_restarts: u32,
}

impl SyncMetrics {
    pub(super) fn define(sink: &impl MetricSink) -> Self {
        Self {
            counters: SyncStats::COUNTERS
                .iter()
                .map(|(n, f)| (Total::define(sink, n), *f))
                .collect(),
            backoff_ms: sink.define_in(SECTION, MetricKind::Gauge, "backoff_ms"),
            rtt_ms: sink.define_in(SECTION, MetricKind::Histogram, "redis_rtt_ms"),
            dirty_dropped: Total::define(sink, "dirty_dropped"),
            facts_ignored: Total::define(sink, "facts_ignored"),
            foreign_entries: sink.define_in(SECTION, MetricKind::Gauge, "foreign_entries"),
            foreign_dropped: Total::define(sink, "foreign_dropped"),
            probes: sink.define_in(SECTION, MetricKind::Counter, "probes"),
            redis_restarts: sink.define_in(SECTION, MetricKind::Counter, "redis_restarts"),
        }
    }

    pub(super) fn probe_sent(&self, sink: &impl MetricSink) {
        sink.increment_metric(self.probes, 1);
    }

    pub(super) fn redis_restarted(&self, sink: &impl MetricSink) {
        sink.increment_metric(self.redis_restarts, 1);
    }

    pub(super) fn publish(
        &mut self,
        sink: &impl MetricSink,
        stats: &SyncStats,
        rtts: &[u64],
        prefix: &PrefixCounts,
    ) {
        self.facts_ignored.publish(sink, prefix.facts_ignored);
        self.dirty_dropped.publish(sink, prefix.dirty_dropped);
        self.foreign_dropped.publish(sink, prefix.foreign_dropped);
        sink.record_metric(self.foreign_entries, prefix.foreign_entries);
        for (total, field) in &mut self.counters {
            total.publish(sink, field(stats));
        }
        sink.record_metric(self.backoff_ms, stats.backoff_ms);
        for rtt in rtts {
            sink.record_metric(self.rtt_ms, *rtt);
        }
    }
}
