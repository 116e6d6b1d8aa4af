//! The router's side of a fleet-wide placement (`sync.place_new`): which
//! requests ask Redis, what they send, and how the answer settles the
//! policy's choice (see [`crate::sync::place`] for Redis's side).

use crate::route::policy::{Choice, Reason};
use crate::shared::registry::PodSlot;

use super::steps::Probed;
use super::Routed;

/// How [`super::Router::route_placed`] places a new prompt (`sync.place_new`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// The worker's own pick, as [`super::Router::route_at`].
    Local,
    /// A new prompt asks Redis first (see [`Outcome::Ask`]).
    Ask,
}

/// A decision waiting for Redis's placement: the probed prompt and the
/// worker's own pick. [`super::Router::resume`] finishes it.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The client's model name (its pool, the decision line).
    pub(super) model: String,
    pub(super) probed: Probed,
    pub(super) choice: Choice,
    pub(super) view: Option<crate::route::policy::PoolView>,
}

/// What [`super::Router::route_placed`] did.
// Routed is the variant of every request; boxing it would allocate once
// per request to save moving a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Outcome {
    /// Routed, recorded and counted in flight.
    Routed(Routed),
    /// A new prompt, nothing recorded: the pods it may go to, in the
    /// policy's order (the worker's own pick first), each with its prefill
    /// cost and the cost of one more queued request there
    /// ([`crate::route::policy::placement_candidates`]), and its family
    /// and claim record when it has one (see [`family_of`], [`claim_record`]),
    /// and the decision to resume with Redis's answer.
    Ask {
        pods: Vec<(PodSlot, i64, i64)>,
        family: Option<Family>,
        pending: Box<Pending>,
    },
}

/// A prompt's family ([`family_of`]) and the record it leaves in the
/// family's claim if it sets it ([`claim_record`]).
pub(crate) type Family = (u64, String);

/// Blocks a prompt shares with another to be of its family: a claim
/// (`sync.place_claim_ms`) keeps a family's new prompts on one pod and may
/// hold one for another's prefill, worth it only for a long shared prefix
/// (4 KiB at the default `block_size`); a short common opening ("You are a
/// helpful assistant") makes no family.
pub const FAMILY_BLOCKS: usize = 32;

/// A prompt's family across replicas: XXH64 of its model name, seeded
/// with the hash of its block [`FAMILY_BLOCKS`]` - 1` (by the chain, its
/// first [`FAMILY_BLOCKS`] blocks). The same on every replica with the same
/// `block_size` and `hash_seed`. None for a shorter prompt.
pub(crate) fn family_of(model: &str, hashes: &[u64]) -> Option<u64> {
    let &at = hashes.get(FAMILY_BLOCKS - 1)?;
    Some(xxhash_rust::xxh64::xxh64(model.as_bytes(), at))
}

/// Most entries of a [`claim_record`]: with 4 a doubling, a prompt of
/// 32 x 2^9 blocks (2 MiB at the default `block_size`) fills them; a
/// longer one's record skips to its last block.
const MAX_RECORD_ENTRIES: usize = 40;

/// What a claim records of the prompt that set it, for a follower to tell
/// how much of it it shares and how long its prefill takes: the prompt's
/// block hashes at position [`FAMILY_BLOCKS`]` - 1`, then at 4 positions a
/// doubling (`32 x 2^k x (1 + j/4) - 1`: 39, 47, 55, 63, 79, ...), and at its
/// last block, as `position:hash` (hex) joined by `,`, positions rising.
/// At most [`MAX_RECORD_ENTRIES`] entries, under 1,000 bytes; empty for a
/// prompt shorter than a family.
pub fn claim_record(hashes: &[u64]) -> String {
    let mut out = String::new();
    let Some(last) = hashes
        .len()
        .checked_sub(1)
        .filter(|&l| l + 1 >= FAMILY_BLOCKS)
    else {
        return out;
    };
    let mut entries = 0;
    let mut base = FAMILY_BLOCKS;
    let mut at = FAMILY_BLOCKS - 1;
    let mut step = 0;
    while at < last && entries + 1 < MAX_RECORD_ENTRIES {
        push_entry(&mut out, at, hashes[at]);
        entries += 1;
        step += 1;
        if step > 4 {
            base *= 2;
            step = 1;
        }
        at = base + base * step / 4 - 1;
    }
    push_entry(&mut out, last, hashes[last]);
    out
}

fn push_entry(out: &mut String, at: usize, hash: u64) {
    use std::fmt::Write as _;
    if !out.is_empty() {
        out.push(',');
    }
    let _ = write!(out, "{at}:{hash:x}");
}

/// What a follower of a claim shares with the prompt that set it, from the
/// claim's record ([`claim_record`]) and its own block hashes:
/// `(shared, total)`, the blocks up to its deepest recorded position it
/// also has, and the claiming prompt's blocks. None when the record is
/// unreadable (positions not rising, or not below `u32::MAX`) or shares no
/// recorded position.
pub fn shared_with_claim(record: &str, hashes: &[u64]) -> Option<(usize, usize)> {
    let mut shared = 0;
    let mut total = 0;
    for (n, entry) in record.split(',').enumerate() {
        if n >= MAX_RECORD_ENTRIES {
            return None;
        }
        let (at, hash) = entry.split_once(':')?;
        // Block positions are u32 here as everywhere (a match's length);
        // the one after the last u32 is no position.
        let at: u32 = at.parse().ok().filter(|&at| at < u32::MAX)?;
        let at = at as usize;
        let hash = u64::from_str_radix(hash, 16).ok()?;
        if at < total {
            return None;
        }
        total = at + 1;
        if hashes.get(at) == Some(&hash) {
            shared = at + 1;
        }
    }
    (shared > 0).then_some((shared, total))
}

/// The pod Redis chose, `forced`, settles the worker's `choice` when it is
/// still in the request's pool: the request goes there (reason
/// [`Reason::Placed`], or [`Reason::PrefixMatch`] when the probe found part
/// of the prompt there). Otherwise the worker's own pick stands.
pub(super) fn settle(
    choice: &mut Choice,
    forced: Option<PodSlot>,
    probed: &Probed,
    pool: &[PodSlot],
) {
    let Some(pod) = forced.filter(|p| pool.contains(p)) else {
        return;
    };
    let matched = probed.matched(pod).map_or(0, |m| m.blocks);
    choice.pod = pod;
    choice.reason = if matched > 0 {
        Reason::PrefixMatch
    } else {
        Reason::Placed
    };
    choice.match_percent = match probed.hashes.len() {
        0 => 0,
        n => ((u64::from(matched) * 100) / n as u64).min(100) as u8,
    };
}
