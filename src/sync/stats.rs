//! Counters the engine keeps for the host to export as Envoy metrics.

/// Counters and gauges for the host to export as metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Cycles whose pull and push all succeeded.
    pub cycles_ok: u64,
    /// Cycles that failed (timeouts included).
    pub cycles_failed: u64,
    /// Cycles abandoned after `op_timeout_ms`.
    pub cycles_timed_out: u64,
    /// Current base wait between cycles (period, or more while backing off).
    pub backoff_ms: u64,
    /// Namespace pulls done by full SCAN.
    pub full_scans: u64,
    /// Namespace pulls done from the change log.
    pub incremental_pulls: u64,
    /// Incremental pulls that found the log trimmed/missing and fell back
    /// to a full scan, and polls that found it so (the next cycle scans).
    pub log_fallbacks: u64,
    /// Keys returned by SCAN.
    pub keys_scanned: u64,
    /// Values fetched by MGET (non-nil).
    pub keys_pulled: u64,
    /// MGET slots that were nil (expired since SCAN).
    pub missing_values: u64,
    /// Remote entities merged (by cycles and polls).
    pub applied: u64,
    /// Remote entities the component refused.
    pub rejected: u64,
    /// Stale remote entities deleted from Redis.
    pub stale_deleted: u64,
    /// Remote tombstones applied (`delete_local`).
    pub tombstones_applied: u64,
    /// Entity writes (SETEX/DEL) confirmed, periodic and write-through.
    pub pushed: u64,
    /// Replies cut by the bridge (never applied).
    pub truncations: u64,
    /// Values too large to fetch even alone within the reply budget.
    pub oversized_values: u64,
    /// Full pushes that hit the size warnings.
    pub large_snapshot_warnings: u64,
    /// Bridge calls emitted.
    pub calls_sent: u64,
    /// Bridge calls that failed (transport, protocol, Redis error).
    pub calls_failed: u64,
    /// Redis commands sent (AUTH and QUIT included).
    pub commands_sent: u64,
    /// Request bytes sent.
    pub bytes_sent: u64,
    /// Reply bytes received.
    pub bytes_received: u64,
    /// Replies for calls the engine no longer waits for (abandoned cycle or
    /// poll, expired write-through call, unknown id).
    pub late_responses: u64,
    /// Write-through calls emitted.
    pub write_through_calls: u64,
    /// Write-through calls that failed.
    pub write_through_failed: u64,
    /// Polls (change-log reads between cycles, `poll_ms`) that succeeded.
    pub polls_ok: u64,
    /// Polls that failed or timed out; polling then pauses until a cycle
    /// succeeds. Never changes the cycle schedule or backoff.
    pub polls_failed: u64,
    /// Remote entities merged by polls (included in `applied`).
    pub poll_applied: u64,
    /// Half-period delta pushes (riding on a poll) that succeeded.
    pub mid_pushes: u64,
    /// Half-period delta pushes that failed (the ids stay dirty for the
    /// next push; polling pauses until a cycle succeeds).
    pub mid_pushes_failed: u64,
    /// `now_ms` of the last successful cycle's end.
    pub last_success_ms: Option<u64>,
    /// Duration of the last finished cycle.
    pub last_cycle_ms: u64,
}
