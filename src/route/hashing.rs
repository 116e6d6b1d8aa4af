//! AIBrix-compatible block hashing: the prompt's bytes are cut into fixed-size
//! blocks and hashed as a chain, so a block's hash names the whole prefix up to
//! and including that block.
//!
//! `parent = seed`; for each full block `h = XXH64(seed, le_bytes(parent) || block)`;
//! `parent = h`. An incomplete tail block is not hashed. With the same seed and
//! block size these hashes equal AIBrix's (`pkg/utils/prefixcacheindexer`),
//! which is what lets a mixed fleet share one Redis namespace.

use xxhash_rust::xxh64::xxh64;

/// Cuts byte strings into chained XXH64 block hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHasher {
    block_size: usize,
    seed: u64,
}

impl BlockHasher {
    /// `block_size` must be non-zero; configuration validation guarantees it.
    /// A zero block size is treated as 1 rather than looping forever.
    pub fn new(block_size: usize, seed: u64) -> Self {
        Self {
            block_size: block_size.max(1),
            seed,
        }
    }

    /// Number of full blocks `len` bytes make.
    pub(crate) fn block_count(&self, len: usize) -> usize {
        len / self.block_size
    }

    /// The chained hash of every full block of `bytes`, in order.
    pub fn hash(&self, bytes: &[u8]) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.block_count(bytes.len()));
        // `le_bytes(parent) || block` in one buffer, hashed in one shot: the
        // streaming hasher's buffering cost more than the 128-byte copy.
        let mut buf = vec![0u8; 8 + self.block_size];
        let mut parent = self.seed;
        for block in bytes.chunks_exact(self.block_size) {
            buf[..8].copy_from_slice(&parent.to_le_bytes());
            buf[8..].copy_from_slice(block);
            parent = xxh64(&buf, self.seed);
            out.push(parent);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Golden vectors: produced by `tests/golden/gen_hash_vectors.py` with
    /// Python's `xxhash` package (an independent C implementation).
    /// Columns: block size, seed, input, expected hashes.
    const GOLDEN: &[(usize, u64, &str, &[u64])] = include!("../../tests/golden/hash_vectors.rs.in");

    #[test]
    fn golden_vectors_match_independent_xxh64() {
        assert!(!GOLDEN.is_empty());
        for (block_size, seed, input, expected) in GOLDEN {
            let got = BlockHasher::new(*block_size, *seed).hash(input.as_bytes());
            assert_eq!(
                &got[..],
                *expected,
                "block_size={block_size} seed={seed} input={input:?}"
            );
        }
    }

    #[test]
    fn incomplete_tail_is_not_hashed() {
        let h = BlockHasher::new(4, 0);
        assert_eq!(h.hash(b"abc").len(), 0);
        assert_eq!(h.hash(b"abcdefg").len(), 1);
        assert_eq!(h.hash(b"abcdefgh").len(), 2);
        assert_eq!(h.hash(b"abcdefg")[0], h.hash(b"abcdefgh")[0]);
    }

    #[test]
    fn chain_makes_block_hash_depend_on_prefix() {
        let h = BlockHasher::new(4, 0);
        let a = h.hash(b"aaaabbbb");
        let b = h.hash(b"ccccbbbb");
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1], "same second block, different prefix");
    }

    #[test]
    fn seed_changes_every_hash() {
        let a = BlockHasher::new(8, 0).hash(b"0123456789abcdef");
        let b = BlockHasher::new(8, 1).hash(b"0123456789abcdef");
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }

    #[test]
    fn one_shot_equals_the_streaming_definition() {
        use xxhash_rust::xxh64::Xxh64;
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (size, seed) in [(1, 0), (4, 9), (128, 3), (333, u64::MAX)] {
            let mut parent = seed;
            let want: Vec<u64> = bytes
                .chunks_exact(size)
                .map(|block| {
                    let mut h = Xxh64::new(seed);
                    h.update(&parent.to_le_bytes());
                    h.update(block);
                    parent = h.digest();
                    parent
                })
                .collect();
            assert_eq!(BlockHasher::new(size, seed).hash(&bytes), want);
        }
    }
}
