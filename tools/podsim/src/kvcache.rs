//! Prefix KV-cache model, after vLLM's automatic prefix caching.
//!
//! A prompt's token ids are cut into blocks of `block_tokens` tokens. Only full
//! blocks are cached. Each full block is named by a hash of its parent block's
//! hash and its own tokens, so a block hash stands for the whole prefix up to
//! the end of that block (a chain). The cache holds at most `capacity` block
//! hashes and evicts the least recently used one when full.
//!
//! A request's cached tokens are the leading blocks of its chain already
//! present (the chain stops at the first missing block: attention is causal,
//! so block `i` is only usable when blocks `0..i` are). After the request's
//! prefill, all of its full blocks are inserted or touched. They are touched
//! from the last block to the first, so that within one prompt the tail is
//! older than the head and is evicted first, as vLLM frees a request's blocks
//! in reverse order.
//!
//! The hash is 64-bit FNV-1a over the parent hash and the token ids (little
//! endian), deliberately unrelated to the router's own XXH64 byte hashing.

use std::collections::{BTreeMap, HashMap};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Hash chain of the full blocks of `tokens` (a trailing partial block is left out).
pub fn block_hashes(tokens: &[u32], block_tokens: usize) -> Vec<u64> {
    if block_tokens == 0 {
        return Vec::new();
    }
    let mut parent = FNV_OFFSET;
    tokens
        .chunks_exact(block_tokens)
        .map(|block| {
            let mut h = FNV_OFFSET;
            for byte in parent.to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
            }
            for token in block {
                for byte in token.to_le_bytes() {
                    h = (h ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
                }
            }
            parent = h;
            h
        })
        .collect()
}

/// An LRU set of block hashes with a fixed capacity in blocks.
#[derive(Debug)]
pub struct KvCache {
    capacity: usize,
    /// block hash -> last-use stamp
    stamps: HashMap<u64, u64>,
    /// last-use stamp -> block hash, oldest first
    lru: BTreeMap<u64, u64>,
    clock: u64,
    evictions: u64,
}

impl KvCache {
    /// A cache of `capacity` blocks; 0 disables caching.
    pub fn new(capacity: usize) -> Self {
        KvCache {
            capacity,
            stamps: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            evictions: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks currently cached.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Blocks evicted since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.stamps.contains_key(&hash)
    }

    /// Number of leading blocks of `chain` that are cached. Does not touch them.
    pub fn matched_blocks(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|h| self.contains(**h)).count()
    }

    /// Insert or touch every block of `chain`, last block first (so the first
    /// block ends up the most recently used), evicting LRU blocks when full.
    pub fn insert_chain(&mut self, chain: &[u64]) {
        if self.capacity == 0 {
            return;
        }
        for hash in chain.iter().rev() {
            self.touch(*hash);
        }
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        let stamp = self.clock;
        if let Some(old) = self.stamps.insert(hash, stamp) {
            self.lru.remove(&old);
        } else if self.stamps.len() > self.capacity {
            // The new block is in `stamps` but not yet in `lru`, so the
            // oldest entry of `lru` is never the block just added.
            if let Some((_, victim)) = self.lru.pop_first() {
                self.stamps.remove(&victim);
                self.evictions += 1;
            }
        }
        self.lru.insert(stamp, hash);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn tokens(n: u32, salt: u32) -> Vec<u32> {
        (0..n)
            .map(|i| i.wrapping_mul(31).wrapping_add(salt))
            .collect()
    }

    #[test]
    fn chain_covers_full_blocks_only() {
        assert_eq!(block_hashes(&tokens(15, 0), 16).len(), 0);
        assert_eq!(block_hashes(&tokens(16, 0), 16).len(), 1);
        assert_eq!(block_hashes(&tokens(47, 0), 16).len(), 2);
        assert_eq!(block_hashes(&tokens(48, 0), 16).len(), 3);
        assert!(block_hashes(&tokens(48, 0), 0).is_empty());
    }

    #[test]
    fn chain_depends_on_whole_prefix() {
        let a = tokens(64, 0);
        let mut b = a.clone();
        b[0] ^= 1; // change the first block only
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        // Every block differs: later blocks inherit the change through the chain.
        for (x, y) in ha.iter().zip(&hb) {
            assert_ne!(x, y);
        }
        let mut c = a.clone();
        c[40] ^= 1; // third block
        let hc = block_hashes(&c, 16);
        assert_eq!(ha[..2], hc[..2]);
        assert_ne!(ha[2], hc[2]);
        assert_ne!(ha[3], hc[3]);
    }

    #[test]
    fn shared_prefix_hits() {
        let mut cache = KvCache::new(100);
        let base = tokens(64, 7);
        let chain = block_hashes(&base, 16);
        assert_eq!(cache.matched_blocks(&chain), 0);
        cache.insert_chain(&chain);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.matched_blocks(&chain), 4);

        // Same first 40 tokens, then different: 2 full blocks shared.
        let mut other = base[..40].to_vec();
        other.extend(tokens(40, 999));
        let other_chain = block_hashes(&other, 16);
        assert_eq!(other_chain.len(), 5);
        assert_eq!(cache.matched_blocks(&other_chain), 2);
    }

    #[test]
    fn block_boundary() {
        let mut cache = KvCache::new(100);
        let first = tokens(32, 1);
        cache.insert_chain(&block_hashes(&first, 16));
        // 31 shared tokens: only the first block is whole.
        let mut p = first[..31].to_vec();
        p.extend(tokens(20, 5));
        assert_eq!(cache.matched_blocks(&block_hashes(&p, 16)), 1);
        // 32 shared tokens: both blocks.
        let mut q = first.clone();
        q.extend(tokens(20, 5));
        assert_eq!(cache.matched_blocks(&block_hashes(&q, 16)), 2);
        // A 47-token prompt sharing 32 tokens: 2 full blocks, the partial third is never cached.
        let mut r = first.clone();
        r.extend(tokens(15, 3));
        let chain = block_hashes(&r, 16);
        assert_eq!(chain.len(), 2);
        cache.insert_chain(&chain);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn lru_eviction_at_capacity() {
        let mut cache = KvCache::new(4);
        let a = block_hashes(&tokens(32, 1), 16); // 2 blocks
        let b = block_hashes(&tokens(32, 2), 16); // 2 blocks
        let c = block_hashes(&tokens(32, 3), 16); // 2 blocks
        cache.insert_chain(&a);
        cache.insert_chain(&b);
        assert_eq!(cache.len(), 4);
        // Touch a again: b is now least recently used.
        cache.insert_chain(&a);
        cache.insert_chain(&c);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.evictions(), 2);
        assert_eq!(cache.matched_blocks(&a), 2);
        assert_eq!(cache.matched_blocks(&b), 0);
        assert_eq!(cache.matched_blocks(&c), 2);
    }

    #[test]
    fn tail_blocks_evicted_before_head() {
        let mut cache = KvCache::new(4);
        let a = block_hashes(&tokens(64, 1), 16); // 4 blocks fill the cache
        cache.insert_chain(&a);
        let b = block_hashes(&tokens(16, 2), 16); // 1 new block
        cache.insert_chain(&b);
        // The last block of a went first; its 3-block prefix still hits.
        assert_eq!(cache.matched_blocks(&a), 3);
        assert!(!cache.contains(a[3]));
    }

    #[test]
    fn chain_longer_than_capacity_keeps_its_head() {
        let mut cache = KvCache::new(3);
        let a = block_hashes(&tokens(16 * 5, 1), 16);
        cache.insert_chain(&a);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.matched_blocks(&a), 3);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut cache = KvCache::new(0);
        let a = block_hashes(&tokens(64, 1), 16);
        cache.insert_chain(&a);
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.matched_blocks(&a), 0);
    }
}
