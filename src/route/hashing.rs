//! AIBrix-compatible block hashing: the prompt's bytes are cut into fixed-size
//! blocks and hashed as a chain, so a block's hash names the whole prefix up to
//! and including that block.
//!
//! `parent = seed`; for each full block `h = XXH64(seed, le_bytes(parent) || block)`;
//! `parent = h`. An incomplete tail block is not hashed. With the same seed and
//! block size these hashes equal AIBrix's (`pkg/utils/prefixcacheindexer`),
//! which is what lets a mixed fleet share one Redis namespace.

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
        let mut parent = self.seed;
        for block in bytes.chunks_exact(self.block_size) {
            parent = xxh64_after(parent, block, self.seed);
            out.push(parent);
        }
        out
    }
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

#[inline(always)]
fn round(acc: u64, lane: u64) -> u64 {
    acc.wrapping_add(lane.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

#[inline(always)]
fn merge(acc: u64, val: u64) -> u64 {
    (acc ^ round(0, val)).wrapping_mul(P1).wrapping_add(P4)
}

/// `XXH64(seed, le_bytes(parent) || block)`, without building that buffer:
/// the 8-byte lane at offset 0 is `parent`, every other byte at offset `o`
/// is `block[o - 8]` (a hash per 128-byte block is most of a long prompt's
/// cost in the VM; the copy and the generic one-shot's set-up were a third
/// of it). A test holds it equal to `xxhash_rust`'s XXH64 on every length.
fn xxh64_after(parent: u64, block: &[u8], seed: u64) -> u64 {
    let len = block.len() + 8;
    let u64_at = |o: usize| -> u64 {
        if o == 0 {
            return parent;
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&block[o - 8..o]);
        u64::from_le_bytes(b)
    };
    let mut o = 0;
    let mut h = if len >= 32 {
        let mut v1 = seed.wrapping_add(P1).wrapping_add(P2);
        let mut v2 = seed.wrapping_add(P2);
        let mut v3 = seed;
        let mut v4 = seed.wrapping_sub(P1);
        // The first stripe holds `parent`; the rest read the block at an
        // 8-byte offset.
        v1 = round(v1, parent);
        v2 = round(v2, u64_at(8));
        v3 = round(v3, u64_at(16));
        v4 = round(v4, u64_at(24));
        o = 32;
        while o + 32 <= len {
            let s = &block[o - 8..o + 24];
            let lane = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&s[i * 8..i * 8 + 8]);
                u64::from_le_bytes(b)
            };
            v1 = round(v1, lane(0));
            v2 = round(v2, lane(1));
            v3 = round(v3, lane(2));
            v4 = round(v4, lane(3));
            o += 32;
        }
        let mut h = v1
            .rotate_left(1)
            .wrapping_add(v2.rotate_left(7))
            .wrapping_add(v3.rotate_left(12))
            .wrapping_add(v4.rotate_left(18));
        h = merge(h, v1);
        h = merge(h, v2);
        h = merge(h, v3);
        merge(h, v4)
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len as u64);
    while o + 8 <= len {
        h ^= round(0, u64_at(o));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        o += 8;
    }
    // Past the first 8 bytes everything is in `block`.
    if o + 4 <= len {
        let mut b = [0u8; 4];
        b.copy_from_slice(&block[o - 8..o - 4]);
        h ^= u64::from(u32::from_le_bytes(b)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        o += 4;
    }
    while o < len {
        h ^= u64::from(block[o - 8]).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
        o += 1;
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
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

    /// The buffer-free XXH64 equals the library's one-shot XXH64 of
    /// `le_bytes(parent) || block` for every block size up to 300 and a few
    /// seeds and parents.
    #[test]
    fn chained_xxh64_equals_the_one_shot_on_every_length() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let data: Vec<u8> = (0..300).map(|_| rng.next_u64() as u8).collect();
        for len in 0..=300 {
            for (seed, parent) in [(0, 0), (42, 7), (u64::MAX, rng.next_u64())] {
                let block = &data[..len];
                let mut buf = parent.to_le_bytes().to_vec();
                buf.extend_from_slice(block);
                assert_eq!(
                    xxh64_after(parent, block, seed),
                    xxhash_rust::xxh64::xxh64(&buf, seed),
                    "len {len} seed {seed} parent {parent}"
                );
            }
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
