//! Plugin configuration: the JSON given to the filter in Envoy's
//! `plugin_config.configuration`, parsed with serde into typed settings.
//!
//! Unknown fields and invalid values are refused with a [`ConfigError`] that
//! names the field, so `on_configure` can log it and return false (Envoy then
//! refuses the config instead of running with a surprise).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::sync::SyncSettings;

/// Raw configuration as written by the operator; every field has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub endpoints: Vec<String>,
    pub model_endpoints: BTreeMap<String, Vec<String>>,
    pub block_size: usize,
    pub hash_seed: u64,
    pub table_capacity_blocks: u32,
    pub table_idle_expiry_secs: u32,
    pub dense_prefix_blocks: u32,
    pub imbalance_abs_count: u32,
    pub stddev_factor: f64,
    pub match_header: String,
    pub max_body_bytes: usize,
    pub sync: SyncSettings,
}

impl Default for RawConfig {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            model_endpoints: BTreeMap::new(),
            block_size: 128,
            hash_seed: 0,
            table_capacity_blocks: 200_000,
            table_idle_expiry_secs: 20 * 60,
            dense_prefix_blocks: 32,
            imbalance_abs_count: 16,
            stddev_factor: 2.0,
            match_header: String::new(),
            max_body_bytes: 8 * 1024 * 1024,
            sync: SyncSettings::default(),
        }
    }
}

/// Why a configuration was refused: the offending field and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid plugin configuration: field `{}`: {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Validated settings. Endpoints are interned: every pool is a list of indexes
/// into [`Settings::all_endpoints`], which is sorted so that every replica with
/// the same configuration gives each pod the same index.
#[derive(Debug, Clone)]
pub struct Settings {
    pub all_endpoints: Vec<String>,
    pub default_pool: Vec<u16>,
    pub model_pools: BTreeMap<String, Vec<u16>>,
    pub block_size: usize,
    pub hash_seed: u64,
    pub table_capacity_blocks: u32,
    pub table_idle_expiry_secs: u32,
    pub dense_prefix_blocks: u32,
    pub imbalance_abs_count: u32,
    pub stddev_factor: f64,
    pub match_header: Option<String>,
    pub max_body_bytes: usize,
    pub sync: SyncSettings,
}

/// Most endpoints one configuration may name: pod ids are `u16` in the table
/// and the in-flight counters live in one shared-data value.
pub const MAX_ENDPOINTS: usize = 1024;
/// Largest block size accepted; blocks are hashed on the request path.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

impl Settings {
    /// Parses and validates the plugin configuration. An empty configuration
    /// is refused because a router without endpoints cannot route.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_slice(bytes).map_err(|e| {
            err(
                locate_bad_field(bytes).unwrap_or_else(|| "<root>".into()),
                e.to_string(),
            )
        })?;
        Self::from_raw(raw)
    }

    pub fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        if raw.block_size == 0 || raw.block_size > MAX_BLOCK_SIZE {
            return Err(err(
                "block_size",
                format!("must be in 1..={MAX_BLOCK_SIZE}"),
            ));
        }
        if raw.table_capacity_blocks < 64 || raw.table_capacity_blocks > 50_000_000 {
            return Err(err("table_capacity_blocks", "must be in 64..=50000000"));
        }
        if raw.table_idle_expiry_secs == 0 {
            return Err(err("table_idle_expiry_secs", "must be > 0"));
        }
        if !(raw.stddev_factor.is_finite() && raw.stddev_factor >= 0.0) {
            return Err(err("stddev_factor", "must be a finite number >= 0"));
        }
        if !raw.match_header.is_empty() && !is_header_name(&raw.match_header) {
            return Err(err(
                "match_header",
                "must be a lowercase HTTP header name or empty",
            ));
        }
        if raw.max_body_bytes == 0 {
            return Err(err("max_body_bytes", "must be > 0"));
        }
        if raw.endpoints.is_empty() && raw.model_endpoints.is_empty() {
            return Err(err("endpoints", "at least one endpoint is required"));
        }
        let mut all: Vec<String> = Vec::new();
        for (field, list) in std::iter::once(("endpoints".to_string(), &raw.endpoints)).chain(
            raw.model_endpoints
                .iter()
                .map(|(m, l)| (format!("model_endpoints.{m}"), l)),
        ) {
            for ep in list {
                if !is_host_port(ep) {
                    return Err(err(field, format!("`{ep}` is not host:port")));
                }
                all.push(ep.clone());
            }
        }
        for (model, list) in &raw.model_endpoints {
            if model.is_empty() {
                return Err(err("model_endpoints", "model name must not be empty"));
            }
            if list.is_empty() {
                return Err(err(
                    format!("model_endpoints.{model}"),
                    "must list at least one endpoint",
                ));
            }
        }
        all.sort();
        all.dedup();
        if all.len() > MAX_ENDPOINTS {
            return Err(err(
                "endpoints",
                format!("at most {MAX_ENDPOINTS} distinct endpoints"),
            ));
        }
        let intern = |list: &[String]| -> Vec<u16> {
            let mut ids: Vec<u16> = list
                .iter()
                .filter_map(|ep| all.binary_search(ep).ok())
                .filter_map(|i| u16::try_from(i).ok())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let default_pool = intern(&raw.endpoints);
        let model_pools = raw
            .model_endpoints
            .iter()
            .map(|(m, l)| (m.clone(), intern(l)))
            .collect();
        raw.sync
            .validate()
            .map_err(|e| err(format!("sync.{}", e.field), e.reason))?;
        Ok(Self {
            default_pool,
            model_pools,
            block_size: raw.block_size,
            hash_seed: raw.hash_seed,
            table_capacity_blocks: raw.table_capacity_blocks,
            table_idle_expiry_secs: raw.table_idle_expiry_secs,
            dense_prefix_blocks: raw.dense_prefix_blocks,
            imbalance_abs_count: raw.imbalance_abs_count,
            stddev_factor: raw.stddev_factor,
            match_header: (!raw.match_header.is_empty()).then_some(raw.match_header),
            max_body_bytes: raw.max_body_bytes,
            sync: raw.sync,
            all_endpoints: all,
        })
    }

    /// The endpoint pool serving `model`: its own pool, else the default one.
    pub fn pool_for(&self, model: &str) -> &[u16] {
        self.model_pools
            .get(model)
            .map(Vec::as_slice)
            .unwrap_or(&self.default_pool)
    }

    /// Pod id of an endpoint name, if this configuration knows it.
    pub fn endpoint_id(&self, endpoint: &str) -> Option<u16> {
        self.all_endpoints
            .binary_search_by(|e| e.as_str().cmp(endpoint))
            .ok()
            .and_then(|i| u16::try_from(i).ok())
    }

    pub fn endpoint_name(&self, id: u16) -> Option<&str> {
        self.all_endpoints.get(usize::from(id)).map(String::as_str)
    }
}

/// serde_json's errors carry a line and column, not a field path; find the
/// top-level field that fails on its own so the log line can name it.
fn locate_bad_field(bytes: &[u8]) -> Option<String> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes).ok()?;
    map.into_iter().find_map(|(key, value)| {
        let mut single = serde_json::Map::new();
        single.insert(key.clone(), value);
        serde_json::from_value::<RawConfig>(serde_json::Value::Object(single))
            .is_err()
            .then_some(key)
    })
}

fn is_header_name(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(',')
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn parse(s: &str) -> Result<Settings, ConfigError> {
        Settings::from_json(s.as_bytes())
    }

    #[test]
    fn defaults_apply() {
        let s = parse(r#"{"endpoints":["10.0.0.2:8000","10.0.0.1:8000"]}"#).unwrap();
        assert_eq!(s.block_size, 128);
        assert_eq!(s.hash_seed, 0);
        assert_eq!(s.table_capacity_blocks, 200_000);
        assert_eq!(s.table_idle_expiry_secs, 1200);
        assert_eq!(s.imbalance_abs_count, 16);
        assert_eq!(s.stddev_factor, 2.0);
        assert_eq!(s.match_header, None);
        assert_eq!(s.all_endpoints, vec!["10.0.0.1:8000", "10.0.0.2:8000"]);
        assert_eq!(s.default_pool, vec![0, 1]);
        assert!(!s.sync.enabled);
    }

    #[test]
    fn model_pools_intern_shared_endpoints() {
        let s =
            parse(r#"{"endpoints":["a:1","b:1"],"model_endpoints":{"m":["b:1","c:1"]}}"#).unwrap();
        assert_eq!(s.all_endpoints, vec!["a:1", "b:1", "c:1"]);
        assert_eq!(s.pool_for("m"), &[1, 2]);
        assert_eq!(s.pool_for("other"), &[0, 1]);
        assert_eq!(s.endpoint_id("c:1"), Some(2));
        assert_eq!(s.endpoint_name(0), Some("a:1"));
    }

    #[test]
    fn unknown_field_is_refused_by_name() {
        let e = parse(r#"{"endpoints":["a:1"],"blocksize":4}"#).unwrap_err();
        assert_eq!(e.field, "blocksize");
        assert!(e.to_string().contains("blocksize"));
    }

    #[test]
    fn invalid_values_are_refused_by_name() {
        for (cfg, field) in [
            (r#"{"endpoints":["a:1"],"block_size":0}"#, "block_size"),
            (
                r#"{"endpoints":["a:1"],"table_capacity_blocks":1}"#,
                "table_capacity_blocks",
            ),
            (
                r#"{"endpoints":["a:1"],"table_idle_expiry_secs":0}"#,
                "table_idle_expiry_secs",
            ),
            (
                r#"{"endpoints":["a:1"],"stddev_factor":-1}"#,
                "stddev_factor",
            ),
            (
                r#"{"endpoints":["a:1"],"match_header":"Bad Header"}"#,
                "match_header",
            ),
            (r#"{"endpoints":["nope"]}"#, "endpoints"),
            (r#"{"endpoints":["a:0"]}"#, "endpoints"),
            (r#"{}"#, "endpoints"),
            (r#"{"model_endpoints":{"m":[]}}"#, "model_endpoints.m"),
            (r#"{"endpoints":["a:1"],"block_size":"x"}"#, "block_size"),
            (r#"{"endpoints":["a:1"],"sync":{"nope":1}}"#, "sync"),
        ] {
            let e = parse(cfg).unwrap_err();
            assert_eq!(e.field, field, "{cfg}: {e}");
        }
    }

    #[test]
    fn not_json_is_refused() {
        assert!(parse("endpoints: [a]").is_err());
        assert!(parse("").is_err());
    }
}
