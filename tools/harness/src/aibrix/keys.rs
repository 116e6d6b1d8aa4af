//! What AIBrix writes to Redis: the block hashes of a prompt, the key of
//! each block and its value (`blockWire`), and how a pull merges a value.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::time::{SystemTime, UNIX_EPOCH};

use twox_hash::XxHash64;

use super::json::{parse_json, write_json_string, Kind};

/// `hash.go` `defaultPrefixCacheBlockSize`.
pub const DEFAULT_BLOCK_SIZE: usize = 4;
/// The seed an AIBrix gateway hashes with when statesync is on.
pub const STATESYNC_SEED: u64 = 0;
/// `redissync.go` `defaultKeyPrefix`.
pub const DEFAULT_KEY_PREFIX: &str = "aibrix";
/// `sync.go` `prefixCacheNamespace`.
pub const PREFIX_CACHE_NAMESPACE: &str = "prefixcache";
/// `redissync.go` `defaultRecordTTL` (2 minutes).
pub const DEFAULT_RECORD_TTL_SECS: u64 = 120;

pub fn xxh64(seed: u64, data: &[u8]) -> u64 {
    XxHash64::oneshot(seed, data)
}

/// `getPrefixHashes`: full blocks of `block_size` tokens (bytes, the
/// character tokenizer), each `XXH64(seed, le64(parent) || block)` with the
/// parent starting as the seed; an incomplete last block is not hashed.
pub fn prefix_hashes(seed: u64, tokens: &[u8], block_size: usize) -> Vec<u64> {
    assert!(block_size > 0, "block size must be positive");
    let mut parent = seed;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let mut digest = XxHash64::with_seed(seed);
            digest.write(&parent.to_le_bytes());
            digest.write(block);
            parent = digest.finish();
            parent
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Redis keys and values
// ---------------------------------------------------------------------------

/// model -> pod -> last access (Unix nanoseconds): `blockWire.ModelToPods`.
pub type ModelToPods = BTreeMap<String, BTreeMap<String, i64>>;

/// `redisKeyForEntity`: `<prefix>:{<namespace>}:e:<id>`.
pub fn entity_key(prefix: &str, namespace: &str, block: u64) -> String {
    format!("{prefix}:{{{namespace}}}:e:{block}")
}

/// `encodeBlock`: Go `json.Marshal(blockWire)` (keys sorted, compact, HTML
/// escaped).
pub fn encode_block(block: &ModelToPods) -> String {
    let mut out = String::from("{\"model_to_pods\":{");
    for (i, (model, pods)) in block.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_string(model, &mut out, true);
        out.push_str(":{");
        for (j, (pod, nanos)) in pods.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            write_json_string(pod, &mut out, true);
            out.push(':');
            out.push_str(&nanos.to_string());
        }
        out.push('}');
    }
    out.push_str("}}");
    out
}

/// `decodeBlock`: Go `json.Unmarshal` into `blockWire` (unknown fields
/// ignored, `model_to_pods` absent or `null` = empty, times must be int64).
pub fn decode_block(data: &str) -> Result<ModelToPods, String> {
    let doc = parse_json(data)?;
    if !matches!(doc.kind, Kind::Obj(_)) {
        return Err("value is not a JSON object".into());
    }
    let mut block = ModelToPods::new();
    let models = match doc.get("model_to_pods").map(|m| &m.kind) {
        None | Some(Kind::Null) => return Ok(block),
        Some(Kind::Obj(models)) => models,
        Some(_) => return Err("model_to_pods is not an object".into()),
    };
    for (model, pods) in models {
        let entry = block.entry(model.clone()).or_default();
        match &pods.kind {
            Kind::Null => {}
            Kind::Obj(pods) => {
                for (pod, t) in pods {
                    let nanos = match &t.kind {
                        Kind::Num(n) => n
                            .parse::<i64>()
                            .map_err(|_| format!("time of {model}/{pod} is not an int64: {n}"))?,
                        _ => return Err(format!("time of {model}/{pod} is not a number")),
                    };
                    entry.insert(pod.clone(), nanos);
                }
            }
            _ => return Err(format!("pods of {model} are not an object")),
        }
    }
    Ok(block)
}

/// `ApplyRemoteForSync`: merge `remote` into `local`, per model and pod the
/// newer time wins, everything else is kept.
pub fn merge_newer(local: &mut ModelToPods, remote: &ModelToPods) {
    for (model, pods) in remote {
        let entry = local.entry(model.clone()).or_default();
        for (pod, &t) in pods {
            let cur = entry.entry(pod.clone()).or_insert(t);
            if t > *cur {
                *cur = t;
            }
        }
    }
}

/// Now as Unix nanoseconds (`time.Now().UnixNano()`).
pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
