//! Counters the engine keeps for the host to export as Envoy metrics.

/// Counters and gauges for the host to export as metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncStats {
    /// Cycles whose pull and push all succeeded.
    pub(crate) cycles_ok: u64,
    /// Cycles that failed (timeouts included).
    pub(crate) cycles_failed: u64,
    /// Cycles abandoned after `op_timeout_ms`.
    pub(crate) cycles_timed_out: u64,
    /// Current base wait between cycles (period, or more while backing off).
    pub(crate) backoff_ms: u64,
    /// Namespace pulls done by full SCAN.
    pub(crate) full_scans: u64,
    /// Namespace pulls done from the change log.
    pub(crate) incremental_pulls: u64,
    /// Slices of the rotating anti-entropy scan read (`scan_keys_per_cycle`).
    pub(crate) scan_slices: u64,
    /// Rotating anti-entropy passes completed (a part's cursor came back to
    /// 0; one per part and pass with `hash_tags` > 1).
    pub(crate) scan_passes: u64,
    /// Incremental pulls that found the log trimmed/missing and fell back
    /// to a full scan, and polls that found it so (the next cycle scans).
    pub(crate) log_fallbacks: u64,
    /// Keys returned by SCAN.
    pub(crate) keys_scanned: u64,
    /// Values fetched by MGET (non-nil).
    pub(crate) keys_pulled: u64,
    /// MGET slots that were nil (expired since SCAN).
    pub(crate) missing_values: u64,
    /// Remote entities merged (by cycles and polls).
    pub(crate) applied: u64,
    /// Remote entities the component refused.
    pub(crate) rejected: u64,
    /// Stale remote entities deleted from Redis.
    pub(crate) stale_deleted: u64,
    /// Remote tombstones applied (`delete_local`).
    pub(crate) tombstones_applied: u64,
    /// Entity writes (SETEX/DEL) confirmed, periodic and write-through.
    pub(crate) pushed: u64,
    /// Replies cut by the bridge (never applied).
    pub(crate) truncations: u64,
    /// Values larger than `max_reply_bytes` (cut by the bridge even alone,
    /// or arrived whole): never applied, and skipped by the next full scans.
    pub(crate) oversized_values: u64,
    /// MGET slots not read because the value was found oversized recently.
    pub(crate) oversized_skipped: u64,
    /// Calls the bridge answered with no bytes at all (the connection to
    /// Redis closed first: Redis gone mid-call, or a middlebox that closes
    /// instead of passing TCP half-close on).
    pub(crate) empty_replies: u64,
    /// Full pushes that hit the size warnings.
    pub(crate) large_snapshot_warnings: u64,
    /// Bridge calls emitted.
    pub(crate) calls_sent: u64,
    /// Bridge calls that failed (transport, protocol, Redis error).
    pub(crate) calls_failed: u64,
    /// Redis commands sent (AUTH and QUIT included).
    pub(crate) commands_sent: u64,
    /// Request bytes sent.
    pub(crate) bytes_sent: u64,
    /// Reply bytes received.
    pub(crate) bytes_received: u64,
    /// Replies for calls the engine no longer waits for (abandoned cycle or
    /// poll, expired write-through call, unknown id).
    pub(crate) late_responses: u64,
    /// Write-through calls emitted.
    pub(crate) write_through_calls: u64,
    /// Write-through calls that failed.
    pub(crate) write_through_failed: u64,
    /// Polls (change-log reads between cycles, `poll_ms`) that succeeded.
    pub(crate) polls_ok: u64,
    /// Polls that failed or timed out; polling then pauses until a cycle
    /// succeeds. Never changes the cycle schedule or backoff.
    pub(crate) polls_failed: u64,
    /// Remote entities merged by polls (included in `applied`).
    pub(crate) poll_applied: u64,
    /// Half-period delta pushes (riding on a poll) that succeeded.
    pub(crate) mid_pushes: u64,
    /// Half-period delta pushes that failed (the ids stay dirty for the
    /// next push; polling pauses until a cycle succeeds).
    pub(crate) mid_pushes_failed: u64,
    /// Cluster mode: `MOVED` replies followed (the slot map is patched).
    pub(crate) moved_redirects: u64,
    /// Cluster mode: `ASK` replies followed (`ASKING` to the importing node).
    pub(crate) ask_redirects: u64,
    /// Cluster mode: `TRYAGAIN` replies (a multi-key read on a slot half
    /// migrated), retried key by key.
    pub(crate) tryagain_retries: u64,
    /// Cluster mode: calls that still got a redirection after
    /// `MAX_REDIRECTS` of them (the run fails, as for any Redis error).
    pub(crate) redirects_exhausted: u64,
    /// Cluster mode: `CLUSTER SLOTS` replies read (one per cycle).
    pub(crate) topology_refreshes: u64,
    /// `now_ms` of the last successful cycle's end.
    pub(crate) last_success_ms: Option<u64>,
    /// Duration of the last finished cycle.
    pub(crate) last_cycle_ms: u64,
}

/// Reads one counter of [`SyncStats`].
pub(crate) type CounterField = fn(&SyncStats) -> u64;

impl SyncStats {
    /// Every counter, by its exported name (`prefix_router.sync.<name>`): the
    /// one table the host exports from. `backoff_ms`, `last_success_ms` and
    /// `last_cycle_ms` are not counters and are exported otherwise.
    pub(crate) const COUNTERS: [(&'static str, CounterField); 39] = [
        ("cycles_ok", |s| s.cycles_ok),
        ("cycles_failed", |s| s.cycles_failed),
        ("cycles_timed_out", |s| s.cycles_timed_out),
        ("full_scans", |s| s.full_scans),
        ("incremental_pulls", |s| s.incremental_pulls),
        ("scan_slices", |s| s.scan_slices),
        ("scan_passes", |s| s.scan_passes),
        ("log_fallbacks", |s| s.log_fallbacks),
        ("keys_scanned", |s| s.keys_scanned),
        ("keys_pulled", |s| s.keys_pulled),
        ("missing_values", |s| s.missing_values),
        ("applied", |s| s.applied),
        ("rejected", |s| s.rejected),
        ("stale_deleted", |s| s.stale_deleted),
        ("tombstones_applied", |s| s.tombstones_applied),
        ("pushed", |s| s.pushed),
        ("truncations", |s| s.truncations),
        ("oversized_values", |s| s.oversized_values),
        ("oversized_skipped", |s| s.oversized_skipped),
        ("empty_replies", |s| s.empty_replies),
        ("large_snapshot_warnings", |s| s.large_snapshot_warnings),
        ("calls_sent", |s| s.calls_sent),
        ("calls_failed", |s| s.calls_failed),
        ("commands_sent", |s| s.commands_sent),
        ("bytes_sent", |s| s.bytes_sent),
        ("bytes_received", |s| s.bytes_received),
        ("late_responses", |s| s.late_responses),
        ("write_through_calls", |s| s.write_through_calls),
        ("write_through_failed", |s| s.write_through_failed),
        ("polls_ok", |s| s.polls_ok),
        ("polls_failed", |s| s.polls_failed),
        ("poll_applied", |s| s.poll_applied),
        ("mid_pushes", |s| s.mid_pushes),
        ("mid_pushes_failed", |s| s.mid_pushes_failed),
        ("moved_redirects", |s| s.moved_redirects),
        ("ask_redirects", |s| s.ask_redirects),
        ("tryagain_retries", |s| s.tryagain_retries),
        ("redirects_exhausted", |s| s.redirects_exhausted),
        ("topology_refreshes", |s| s.topology_refreshes),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The table reads each counter field once: give every field its own
    /// value (a struct literal fails to compile when a field is added, which
    /// is the reminder to add it to the table) and read them all back.
    #[test]
    fn counter_table_reads_every_counter_once() {
        let s = SyncStats {
            cycles_ok: 1,
            cycles_failed: 2,
            cycles_timed_out: 3,
            backoff_ms: 0,
            full_scans: 4,
            incremental_pulls: 5,
            log_fallbacks: 6,
            keys_scanned: 7,
            keys_pulled: 8,
            missing_values: 9,
            applied: 10,
            rejected: 11,
            stale_deleted: 12,
            tombstones_applied: 13,
            pushed: 14,
            truncations: 15,
            oversized_values: 16,
            large_snapshot_warnings: 17,
            calls_sent: 18,
            calls_failed: 19,
            commands_sent: 20,
            bytes_sent: 21,
            bytes_received: 22,
            late_responses: 23,
            write_through_calls: 24,
            write_through_failed: 25,
            polls_ok: 26,
            polls_failed: 27,
            poll_applied: 28,
            mid_pushes: 29,
            mid_pushes_failed: 30,
            oversized_skipped: 31,
            empty_replies: 32,
            scan_slices: 33,
            scan_passes: 34,
            moved_redirects: 35,
            ask_redirects: 36,
            tryagain_retries: 37,
            redirects_exhausted: 38,
            topology_refreshes: 39,
            last_success_ms: None,
            last_cycle_ms: 0,
        };
        let mut read: Vec<u64> = SyncStats::COUNTERS.iter().map(|(_, f)| f(&s)).collect();
        read.sort_unstable();
        assert_eq!(read, (1..=39).collect::<Vec<u64>>());
    }
}
