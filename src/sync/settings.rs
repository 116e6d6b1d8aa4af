//! The plugin configuration's `"sync"` object: defaults, parsing and
//! validation. Invalid values are refused with an error naming the field, so
//! `on_configure` can log it and return false.

use serde::Deserialize;
use std::fmt;

/// Redis closes the bridge's reply stream after about 64 KiB once Envoy has
/// half-closed; budgets above this cannot be honoured.
pub(crate) const MAX_REPLY_BUDGET: usize = 60 * 1024;
/// Most hash tags a namespace may be split into.
pub(crate) const MAX_HASH_TAGS: usize = 1024;
/// Record TTL used when the configured one is `<= 0`.
pub(crate) const DEFAULT_RECORD_TTL_SECS: i64 = 120;

/// Names of the built-in namespaces (the engine itself is generic: the host
/// passes these names to the components it registers).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SyncNamespaces {
    /// Namespace of the prefix table (AIBrix: `prefixcache`).
    pub(crate) prefixcache: String,
    /// Namespace of the per-pod load tracker.
    pub(crate) load: String,
}

impl Default for SyncNamespaces {
    fn default() -> Self {
        Self {
            prefixcache: "prefixcache".into(),
            load: "podload".into(),
        }
    }
}

/// Settings of the Redis sync engine (`"sync": {...}` in the plugin config).
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SyncSettings {
    /// Master switch; off by default.
    pub(crate) enabled: bool,
    /// Time between cycles (jittered +-10 %).
    pub(crate) period_ms: u64,
    /// A cycle or poll still running after this long is abandoned as
    /// failed; a write-through call unanswered after this long counts as
    /// failed.
    pub(crate) op_timeout_ms: u64,
    /// First part of every key: `{key_prefix}:{{ns}}:e:{id}`.
    pub(crate) key_prefix: String,
    /// Names of the built-in namespaces.
    pub(crate) namespaces: SyncNamespaces,
    /// TTL of every record written; `<= 0` means the default (120 s).
    pub(crate) record_ttl_secs: i64,
    /// Entity writes (SETEX/DEL) per pipelined call.
    pub setex_chunk: usize,
    /// Keys per MGET, before the reply budget shrinks it.
    pub(crate) mget_batch: usize,
    /// SCAN COUNT of a scan's first page (shrunk to fit the reply budget);
    /// pages whose replies stay under a quarter of it double, up to 16,384.
    pub(crate) scan_count: usize,
    /// Allow components to write single entities at once (`put`/`delete`).
    pub(crate) write_through: bool,
    /// Every Nth cycle pulls with a full SCAN (anti-entropy; catches keys
    /// written by peers that do not write the change log, e.g. AIBrix's Go
    /// gateways). Cycles in between read only the change log. `0` or `1`
    /// is the AIBrix-compatible mode: every pull is a full SCAN and no
    /// change log is written or read, so the Redis traffic is exactly
    /// AIBrix's command set.
    pub(crate) full_scan_every: u32,
    /// Anti-entropy by rotating scan: `0` (default) keeps the full SCAN
    /// every `full_scan_every` cycles. `N > 0`: instead, every cycle (after
    /// the first full scan) also reads the next slice of one SCAN pass over
    /// the namespace: SCAN pages asking for `N` keys in all (Redis walks
    /// about that many), continuing the cursor across cycles. The cost per cycle
    /// is then flat whatever the table size; a change the change log missed
    /// (a writer without the log, e.g. AIBrix's gateways) arrives within one
    /// pass, `ceil(keys / N)` cycles. Namespaces with hooks (`podload`,
    /// whose live writers rewrite their key every period) then read only
    /// the change log after their first full scan. Ignored in AIBrix mode.
    /// With `hash_tags` K > 1 each part gets `ceil(N / K)` of it per cycle.
    pub(crate) scan_keys_per_cycle: usize,
    /// MAXLEN (approximate) of each namespace's change-log stream.
    pub(crate) change_log_max_entries: usize,
    /// Log entries per XRANGE call.
    pub(crate) log_read_count: usize,
    /// Between cycles, every `poll_ms` the engine *polls*: one call reads
    /// the change log of every delta-capable namespace without hooks from
    /// its last position and applies what peers changed (MGET of just those
    /// ids). A poll also pushes such a namespace's delta once `push_ms`
    /// has passed since the last push. Polls run only while the last cycle
    /// succeeded and never overlap a cycle. `0` turns polls and their
    /// pushes off; ignored in AIBrix mode (`full_scan_every` 0 or 1). The
    /// host ticks every 25 ms, so smaller values mean "every tick".
    /// Default 175 ms: write-through changes reach peers within
    /// tick + poll ≈ 200 ms, while idle polls (two commands each) keep the
    /// steady-state Redis commands of a 200k-entity namespace >= 20x below
    /// full-scan mode.
    pub poll_ms: u64,
    /// Least time between two pushes, for the pushes polls make: a poll
    /// pushes the delta once this much has passed since the last push
    /// (a cycle's or a poll's). Default 175 ms, i.e. every poll: a new
    /// prefix reaches peers within about two polls instead of half a
    /// period plus a poll. Writes per entity do not grow (the dirty set
    /// deduplicates, and the router re-marks a block at most once per touch
    /// interval); calls grow by at most one per poll. Range 10..=`period_ms`.
    pub(crate) push_ms: u64,
    /// Bridge calls a cycle or poll keeps in flight at once (write-through
    /// calls are not capped by it).
    pub(crate) max_inflight_calls: usize,
    /// Envoy cluster of the HTTP->Redis bridge (for dispatch_http_call).
    pub(crate) bridge_cluster: String,
    /// `:authority` of the bridge calls.
    pub(crate) bridge_authority: String,
    /// `:path` of the bridge calls.
    pub(crate) bridge_path: String,
    /// ACL user for `AUTH user password`; needs `auth_password`.
    pub(crate) auth_username: Option<String>,
    /// When set, every pipeline starts with `AUTH`. Never logged.
    pub(crate) auth_password: Option<String>,
    /// Budget for the replies of one call (Redis truncates beyond ~64 KiB).
    pub(crate) max_reply_bytes: usize,
    /// Hash tags (parts) each namespace is split into: `1` (default) keeps
    /// the whole namespace under one tag, `{key_prefix}:{{ns}}:...`, in one
    /// Redis Cluster slot; `K > 1` spreads it over K tags with evenly spaced
    /// slots, each with its own change log (see [`crate::sync::keys`]).
    /// Refused above 1 with `compat: aibrix` (AIBrix reads one tag).
    pub(crate) hash_tags: usize,
    /// Redis Cluster mode: each cycle reads `CLUSTER SLOTS` (with its
    /// reads while sync is healthy, before them otherwise), every pipeline
    /// goes to the master owning its parts' slots (named in `node_header`
    /// on the bridge call; with `hash_tags` > 1 the work of one kind for
    /// the parts a master holds goes as one pipeline), and
    /// `MOVED`/`ASK`/`TRYAGAIN` replies are followed per command (bounded). Needs a bridge whose upstream is an
    /// `ORIGINAL_DST` cluster reading `node_header` (see docs/deploy.md).
    pub(crate) cluster: bool,
    /// Header naming the Redis node (`ip:port`) of a bridge call in cluster
    /// mode; calls without it (the first `CLUSTER SLOTS`) go to the
    /// bridge's default route.
    pub(crate) node_header: String,
    /// Most entries of other writers (pods this replica does not route to,
    /// models it has no slot for) kept from pulls and carried in its pushes,
    /// so it never erases them (see [`crate::sync::foreign`]).
    pub(crate) foreign_max_entries: usize,
    /// Place each new prompt (no pod of the pool holds any of it) through
    /// one Redis script over every replica's placed requests in flight
    /// (see [`crate::sync::place`]): replicas then stop sending new
    /// prompts to the same pod between syncs. Costs one bridge round trip
    /// on those requests only. Unset (the default), the config turns it
    /// on where it applies (`enabled` and the load-aware policy) and off
    /// elsewhere; `true` where it does not apply is refused at load. Read
    /// it through [`Self::places_new`].
    pub(crate) place_new: Option<bool>,
    /// Longest wait for a placement; past it (or on any failure) the
    /// request goes to the worker's own pick, and the VM asks nothing for a
    /// second. Range 1..=1000.
    pub(crate) place_timeout_ms: u64,
    /// With `place_new`: for this long after a new prompt's placement,
    /// another new prompt of its family (the same model and first 32
    /// blocks) goes to the same pod when it is a candidate, so a burst of
    /// one new prefix through several replicas is not split before their
    /// tables know it; with `hold` it waits there for the first prompt's
    /// prefill when that pays (see [`crate::route::hold`]). The claim runs
    /// from the family's first placement; the prompts that follow it do
    /// not extend it. Default 1000 (3 Envoys, 3 alternated rounds against
    /// none: hit rate 0.901-0.904 against 0.884-0.892 on hetero-fleet,
    /// 0.515-0.530 against 0.505-0.513 on cache-pressure; the price, a
    /// hot tenant's early requests kept on one pod: tenants' requests per
    /// pod max/min 1.32-1.59 against 1.06-1.25; policy-notes). 0 = off.
    /// Range 0..=10000.
    pub(crate) place_claim_ms: u64,
}

impl Default for SyncSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            period_ms: 10_000,
            op_timeout_ms: 30_000,
            key_prefix: "aibrix".into(),
            namespaces: SyncNamespaces::default(),
            record_ttl_secs: DEFAULT_RECORD_TTL_SECS,
            setex_chunk: 25,
            mget_batch: 200,
            scan_count: 500,
            write_through: false,
            full_scan_every: 6,
            scan_keys_per_cycle: 0,
            change_log_max_entries: 4096,
            log_read_count: 64,
            poll_ms: 175,
            push_ms: 175,
            max_inflight_calls: 4,
            bridge_cluster: "redis_bridge".into(),
            bridge_authority: "redis".into(),
            bridge_path: "/".into(),
            auth_username: None,
            auth_password: None,
            max_reply_bytes: 48 * 1024,
            hash_tags: 1,
            cluster: false,
            node_header: "x-redis-node".into(),
            foreign_max_entries: 65_536,
            place_new: None,
            place_timeout_ms: 50,
            place_claim_ms: 1_000,
        }
    }
}

impl fmt::Debug for SyncSettings {
    // Hand-written so the password can never reach a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncSettings")
            .field("enabled", &self.enabled)
            .field("period_ms", &self.period_ms)
            .field("op_timeout_ms", &self.op_timeout_ms)
            .field("key_prefix", &self.key_prefix)
            .field("namespaces", &self.namespaces)
            .field("record_ttl_secs", &self.record_ttl_secs)
            .field("setex_chunk", &self.setex_chunk)
            .field("mget_batch", &self.mget_batch)
            .field("scan_count", &self.scan_count)
            .field("write_through", &self.write_through)
            .field("full_scan_every", &self.full_scan_every)
            .field("scan_keys_per_cycle", &self.scan_keys_per_cycle)
            .field("change_log_max_entries", &self.change_log_max_entries)
            .field("log_read_count", &self.log_read_count)
            .field("poll_ms", &self.poll_ms)
            .field("push_ms", &self.push_ms)
            .field("foreign_max_entries", &self.foreign_max_entries)
            .field("max_inflight_calls", &self.max_inflight_calls)
            .field("bridge_cluster", &self.bridge_cluster)
            .field("bridge_authority", &self.bridge_authority)
            .field("bridge_path", &self.bridge_path)
            .field("auth_username", &self.auth_username)
            .field(
                "auth_password",
                &self.auth_password.as_ref().map(|_| "<redacted>"),
            )
            .field("max_reply_bytes", &self.max_reply_bytes)
            .field("hash_tags", &self.hash_tags)
            .field("cluster", &self.cluster)
            .field("node_header", &self.node_header)
            .field("place_new", &self.place_new)
            .field("place_timeout_ms", &self.place_timeout_ms)
            .field("place_claim_ms", &self.place_claim_ms)
            .finish()
    }
}

/// A `sync` setting that was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SettingsError {
    /// Field path inside the `sync` object, e.g. `namespaces.load`.
    pub(crate) field: &'static str,
    /// Why it was refused.
    pub(crate) reason: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid sync.{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for SettingsError {}

fn err(field: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError {
        field,
        reason: reason.into(),
    }
}

fn range<T: PartialOrd + fmt::Display + Copy>(
    field: &'static str,
    value: T,
    min: T,
    max: T,
) -> Result<(), SettingsError> {
    if value < min || value > max {
        return Err(err(field, format!("{value} is outside [{min}, {max}]")));
    }
    Ok(())
}

/// Key parts must not contain braces (a second `{...}` would change the
/// Redis Cluster hash tag) nor whitespace.
pub(crate) fn key_part(field: &'static str, value: &str) -> Result<(), SettingsError> {
    if value.is_empty() {
        return Err(err(field, "must not be empty"));
    }
    if value
        .chars()
        .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err(err(
            field,
            format!("{value:?} must not contain braces or whitespace"),
        ));
    }
    Ok(())
}

impl SyncSettings {
    /// Parses the `sync` object (unknown fields refused) and validates it.
    #[cfg(test)]
    pub(crate) fn from_json(value: &serde_json::Value) -> Result<Self, SettingsError> {
        let settings: SyncSettings =
            serde_json::from_value(value.clone()).map_err(|e| err("<object>", e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every field; the error names the first bad one.
    pub(crate) fn validate(&self) -> Result<(), SettingsError> {
        range("period_ms", self.period_ms, 100, 3_600_000)?;
        range("op_timeout_ms", self.op_timeout_ms, 100, 3_600_000)?;
        key_part("key_prefix", &self.key_prefix)?;
        key_part("namespaces.prefixcache", &self.namespaces.prefixcache)?;
        key_part("namespaces.load", &self.namespaces.load)?;
        if self.namespaces.prefixcache == self.namespaces.load {
            return Err(err(
                "namespaces.load",
                "must differ from namespaces.prefixcache",
            ));
        }
        range("setex_chunk", self.setex_chunk, 1, 10_000)?;
        range("mget_batch", self.mget_batch, 1, 10_000)?;
        range("scan_count", self.scan_count, 1, 100_000)?;
        range(
            "scan_keys_per_cycle",
            self.scan_keys_per_cycle,
            0,
            10_000_000,
        )?;
        range(
            "change_log_max_entries",
            self.change_log_max_entries,
            16,
            1_000_000,
        )?;
        range("log_read_count", self.log_read_count, 2, 10_000)?;
        if self.poll_ms != 0 {
            // Polling less often than cycles run would never happen.
            range("poll_ms", self.poll_ms, 10, self.period_ms)?;
            range("push_ms", self.push_ms, 10, self.period_ms)?;
        }
        range("max_inflight_calls", self.max_inflight_calls, 1, 64)?;
        range(
            "foreign_max_entries",
            self.foreign_max_entries,
            0,
            1_000_000,
        )?;
        range(
            "max_reply_bytes",
            self.max_reply_bytes,
            1024,
            MAX_REPLY_BUDGET,
        )?;
        range("hash_tags", self.hash_tags, 1, MAX_HASH_TAGS)?;
        range("place_timeout_ms", self.place_timeout_ms, 1, 1_000)?;
        range("place_claim_ms", self.place_claim_ms, 0, 10_000)?;
        let header_ok = |h: &str| {
            !h.is_empty()
                && !h.starts_with(':')
                && h.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        };
        if !header_ok(&self.node_header) {
            return Err(err(
                "node_header",
                format!(
                    "{:?} must be a lowercase HTTP header name",
                    self.node_header
                ),
            ));
        }
        if self.bridge_cluster.is_empty() {
            return Err(err("bridge_cluster", "must not be empty"));
        }
        if self.bridge_authority.is_empty() {
            return Err(err("bridge_authority", "must not be empty"));
        }
        if !self.bridge_path.starts_with('/') {
            return Err(err("bridge_path", "must start with '/'"));
        }
        if matches!(&self.auth_password, Some(p) if p.is_empty()) {
            return Err(err("auth_password", "must not be empty when set"));
        }
        if self.auth_username.is_some() && self.auth_password.is_none() {
            return Err(err("auth_username", "needs auth_password"));
        }
        if matches!(&self.auth_username, Some(u) if u.is_empty()) {
            return Err(err("auth_username", "must not be empty when set"));
        }
        Ok(())
    }

    /// Whether new prompts are placed through Redis (`place_new` as the
    /// config resolved it at load; unset counts as off here).
    pub(crate) fn places_new(&self) -> bool {
        self.place_new == Some(true)
    }

    /// The TTL written with every record (`<= 0` configured -> default).
    pub(crate) fn effective_ttl_secs(&self) -> i64 {
        if self.record_ttl_secs <= 0 {
            DEFAULT_RECORD_TTL_SECS
        } else {
            self.record_ttl_secs
        }
    }

    /// True when pulls may read the change log and pushes write it.
    pub(crate) fn change_log_enabled(&self) -> bool {
        self.full_scan_every > 1
    }

    /// True when the engine polls the change log between cycles (and pushes
    /// deltas at most every `push_ms`): `poll_ms > 0` and the change log is on.
    pub(crate) fn polling_enabled(&self) -> bool {
        self.poll_ms > 0 && self.change_log_enabled()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn defaults_match_the_spec() {
        let s = SyncSettings::from_json(&json!({})).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.period_ms, 10_000);
        assert_eq!(s.op_timeout_ms, 30_000);
        assert_eq!(s.key_prefix, "aibrix");
        assert_eq!(s.effective_ttl_secs(), 120);
        assert_eq!((s.setex_chunk, s.mget_batch, s.scan_count), (25, 200, 500));
        assert!(!s.write_through);
        assert_eq!((s.poll_ms, s.push_ms), (175, 175));
        assert_eq!((s.full_scan_every, s.scan_keys_per_cycle), (6, 0));
        assert!(s.polling_enabled());
        assert_eq!(s.namespaces.prefixcache, "prefixcache");
        assert_eq!((s.hash_tags, s.cluster), (1, false));
        assert_eq!(s.node_header, "x-redis-node");
        assert!(s.validate().is_ok());
    }

    #[test]
    fn non_positive_ttl_means_default() {
        for ttl in [0, -5] {
            let s = SyncSettings {
                record_ttl_secs: ttl,
                ..Default::default()
            };
            assert_eq!(s.effective_ttl_secs(), 120);
        }
        let s = SyncSettings {
            record_ttl_secs: 30,
            ..Default::default()
        };
        assert_eq!(s.effective_ttl_secs(), 30);
    }

    #[test]
    fn unknown_fields_refused() {
        assert!(SyncSettings::from_json(&json!({"enabeld": true})).is_err());
        assert!(SyncSettings::from_json(&json!({"namespaces": {"x": "y"}})).is_err());
    }

    #[test]
    fn invalid_values_name_the_field() {
        let cases = [
            (json!({"period_ms": 0}), "period_ms"),
            (json!({"key_prefix": ""}), "key_prefix"),
            (json!({"key_prefix": "a{b}"}), "key_prefix"),
            (json!({"namespaces": {"load": ""}}), "namespaces.load"),
            (json!({"setex_chunk": 0}), "setex_chunk"),
            (json!({"mget_batch": 0}), "mget_batch"),
            (json!({"max_reply_bytes": 70000}), "max_reply_bytes"),
            (json!({"auth_password": ""}), "auth_password"),
            (json!({"auth_username": "u"}), "auth_username"),
            (json!({"bridge_cluster": ""}), "bridge_cluster"),
            (json!({"poll_ms": 5}), "poll_ms"),
            (json!({"period_ms": 1000, "poll_ms": 1001}), "poll_ms"),
            (json!({"push_ms": 9}), "push_ms"),
            (json!({"period_ms": 1000, "push_ms": 1001}), "push_ms"),
            (
                json!({"scan_keys_per_cycle": 10_000_001}),
                "scan_keys_per_cycle",
            ),
            (json!({"hash_tags": 0}), "hash_tags"),
            (json!({"hash_tags": 1025}), "hash_tags"),
            (json!({"node_header": ""}), "node_header"),
            (json!({"node_header": "X-Redis"}), "node_header"),
        ];
        for (value, field) in cases {
            match SyncSettings::from_json(&value) {
                Err(e) => {
                    assert_eq!(e.field, field, "{value}");
                    assert!(e.to_string().contains(field));
                }
                Ok(_) => panic!("{value} accepted"),
            }
        }
    }

    #[test]
    fn poll_ms_zero_or_up_to_the_period_and_off_in_aibrix_mode() {
        let ok = |v: serde_json::Value| SyncSettings::from_json(&v).unwrap();
        assert!(!ok(json!({"poll_ms": 0})).polling_enabled());
        assert!(ok(json!({"period_ms": 1000, "poll_ms": 1000})).polling_enabled());
        assert!(ok(json!({"poll_ms": 10})).polling_enabled());
        for every in [0, 1] {
            assert!(!ok(json!({"full_scan_every": every})).polling_enabled());
        }
    }

    #[test]
    fn debug_redacts_the_password() {
        let s = SyncSettings {
            auth_password: Some("hunter2".into()),
            ..Default::default()
        };
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"));
        assert!(shown.contains("redacted"));
    }
}
