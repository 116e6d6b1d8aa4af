//! An AIBrix gateway as seen from Redis: what one writes (`AddPrefix`) and
//! what one reads and routes by.

use std::collections::BTreeMap;

use crate::redis::RedisAt;

use super::keys::{
    decode_block, encode_block, entity_key, now_nanos, prefix_hashes, ModelToPods,
    DEFAULT_BLOCK_SIZE, DEFAULT_KEY_PREFIX, DEFAULT_RECORD_TTL_SECS, PREFIX_CACHE_NAMESPACE,
    STATESYNC_SEED,
};
use super::select::{select_target, seq_search, PrefixMatch, DEFAULT_STDDEV_FACTOR};

#[derive(Clone, Debug)]
pub struct AibrixConfig {
    pub block_size: usize,
    pub seed: u64,
    pub key_prefix: String,
    pub namespace: String,
    pub ttl_secs: u64,
}

impl Default for AibrixConfig {
    fn default() -> Self {
        AibrixConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            seed: STATESYNC_SEED,
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            namespace: PREFIX_CACHE_NAMESPACE.into(),
            ttl_secs: DEFAULT_RECORD_TTL_SECS,
        }
    }
}

impl AibrixConfig {
    pub fn hashes(&self, text: &str) -> Vec<u64> {
        prefix_hashes(self.seed, text.as_bytes(), self.block_size)
    }

    pub fn key(&self, block: u64) -> String {
        entity_key(&self.key_prefix, &self.namespace, block)
    }

    pub fn keys(&self, text: &str) -> Vec<String> {
        self.hashes(text).into_iter().map(|h| self.key(h)).collect()
    }
}

/// Writes what an AIBrix gateway writes after routing a prompt to a pod:
/// `AddPrefix` records every block for (model, pod) at now, after its pull
/// merged what Redis held (other pods and models kept, newer time wins); its
/// push SETEXes each block with the record TTL.
pub struct AibrixWriter {
    pub redis: RedisAt,
    pub cfg: AibrixConfig,
}

impl AibrixWriter {
    pub fn new(redis_port: u16) -> AibrixWriter {
        AibrixWriter {
            redis: RedisAt {
                port: redis_port,
                password: None,
            },
            cfg: AibrixConfig::default(),
        }
    }

    /// Records `text` (the hashed text, see [`super::text::prefix_text`]) for (model,
    /// pod) at now; returns the block hashes.
    pub fn add_prefix(&self, model: &str, pod: &str, text: &str) -> Vec<u64> {
        self.add_prefix_at(model, pod, text, now_nanos())
    }

    /// Like [`AibrixWriter::add_prefix`] with a given time (Unix nanos).
    pub fn add_prefix_at(&self, model: &str, pod: &str, text: &str, nanos: i64) -> Vec<u64> {
        let hashes = self.cfg.hashes(text);
        let keys: Vec<String> = hashes.iter().map(|&h| self.cfg.key(h)).collect();
        let current = self.redis.mget(&keys);
        let entries: Vec<(String, String)> = keys
            .into_iter()
            .zip(current)
            .map(|(key, value)| {
                // Pull: ApplyRemote (a value that does not decode is skipped
                // and the push then overwrites it with the local block).
                let mut block = value
                    .as_deref()
                    .and_then(|v| decode_block(v).ok())
                    .unwrap_or_default();
                // AddPrefix: blockPods[pod] = time.Now().
                block
                    .entry(model.to_string())
                    .or_default()
                    .insert(pod.to_string(), nanos);
                (key, encode_block(&block))
            })
            .collect();
        self.redis.setex_many(&entries, self.cfg.ttl_secs);
        hashes
    }

    /// SETEX one block's value as given (e.g. an old entry of a pod nobody
    /// else knows) with `ttl_secs`.
    pub fn put_block(&self, block: u64, value: &ModelToPods, ttl_secs: u64) -> String {
        let key = self.cfg.key(block);
        self.redis
            .setex_many(&[(key.clone(), encode_block(value))], ttl_secs);
        key
    }
}

/// Reads Redis the way an AIBrix gateway's lookup sees it after a pull.
pub struct AibrixReader {
    pub redis: RedisAt,
    pub cfg: AibrixConfig,
}

impl AibrixReader {
    pub fn new(redis_port: u16) -> AibrixReader {
        AibrixReader {
            redis: RedisAt {
                port: redis_port,
                password: None,
            },
            cfg: AibrixConfig::default(),
        }
    }

    /// The decoded value of every block of `text` (`None`: no key; a value
    /// that does not decode panics, naming the key).
    pub fn blocks(&self, text: &str) -> Vec<(String, Option<ModelToPods>)> {
        let keys = self.cfg.keys(text);
        let values = self.redis.mget(&keys);
        keys.into_iter()
            .zip(values)
            .map(|(k, v)| {
                let decoded = v.map(|v| {
                    decode_block(&v)
                        .unwrap_or_else(|e| panic!("{k}: AIBrix cannot decode {v:?}: {e}"))
                });
                (k, decoded)
            })
            .collect()
    }

    /// `MatchPrefix` over Redis: per ready pod its match percent and blocks.
    pub fn match_prefix(&self, model: &str, text: &str, ready: &[&str]) -> PrefixMatch {
        let hashes = self.cfg.hashes(text);
        let blocks: Vec<Option<ModelToPods>> =
            self.blocks(text).into_iter().map(|(_, b)| b).collect();
        seq_search(&hashes, model, ready, |i, _| blocks[i].clone())
    }

    /// AIBrix's prefix-cache choice for `text` among `ready` pods, all idle:
    /// `Some((pod, matched blocks, total blocks))`, `None` when no ready pod
    /// holds the first block (AIBrix then falls back to the least loaded).
    pub fn lookup(
        &self,
        model: &str,
        text: &str,
        ready: &[&str],
    ) -> Option<(String, usize, usize)> {
        let found = self.match_prefix(model, text, ready);
        let percents: BTreeMap<String, usize> = found
            .pods
            .iter()
            .map(|(p, &(percent, _))| (p.clone(), percent))
            .collect();
        let pod = select_target(&percents, ready, &BTreeMap::new(), DEFAULT_STDDEV_FACTOR)?;
        let blocks = found.pods[&pod].1;
        Some((pod, blocks, found.hashes.len()))
    }
}
