//! The router's side of a fleet-wide placement (`sync.place_new`): which
//! requests ask Redis, what they send, and how the answer settles the
//! policy's choice (see [`crate::sync::place`] for Redis's side).

use crate::route::policy::{placement_candidates, Choice, LoadAwareConfig, PodLoads, Reason};
use crate::route::registry::PodSlot;

use super::Routed;

/// How [`super::Router::route_placed`] places a new prompt (`sync.place_new`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// The worker's own pick, as [`super::Router::route_at`].
    Local,
    /// A new prompt asks Redis first (see [`Outcome::Ask`]).
    Ask,
    /// After asking: the pod Redis chose, or (None: no usable answer) the
    /// worker's own pick. The request's demand was counted when it asked.
    Answered(Option<PodSlot>),
}

/// What [`super::Router::route_placed`] did.
// Routed is the variant of every request; boxing it would allocate once
// per request to save moving a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Routed, recorded and counted in flight.
    Routed(Routed),
    /// A new prompt, nothing recorded: the pods it may go to, in the
    /// policy's order (the worker's own pick first), each with its prefill
    /// cost and the cost of one more queued request there
    /// ([`crate::route::policy::placement_candidates`]), and its family (model and first block;
    /// see [`family_of`]).
    Ask {
        pods: Vec<(PodSlot, i64, i64)>,
        family: Option<u64>,
    },
}

/// A prompt's family across replicas: XXH64 of its model name, seeded
/// with its first block's hash. The same on every replica with the same
/// `block_size` and `hash_seed`.
pub(crate) fn family_of(model: &str, first_block: u64) -> u64 {
    xxhash_rust::xxh64::xxh64(model.as_bytes(), first_block)
}

/// The request being placed: its model, block hashes and matches.
pub(super) struct Prompt<'a> {
    pub(super) model: &'a str,
    pub(super) hashes: &'a [u64],
    pub(super) matches: &'a [(PodSlot, u32)],
}

/// What `place` makes of the load-aware policy's `choice` for `prompt`:
/// with [`Place::Ask`] and a new prompt ([`Reason::NoMatch`]), the
/// [`Outcome::Ask`] to return; with [`Place::Answered`] naming a pod still
/// in `pool`, the choice goes there (reason [`Reason::Placed`], or
/// [`Reason::PrefixMatch`] when it meanwhile holds some of the prompt).
pub(super) fn settle(
    place: Place,
    choice: Option<&mut Choice>,
    cfg: &LoadAwareConfig,
    pool: &[PodSlot],
    loads: &PodLoads<'_>,
    prompt: &Prompt<'_>,
) -> Option<Outcome> {
    let c = choice?;
    let total = prompt.hashes.len();
    match place {
        Place::Ask if c.reason == Reason::NoMatch => {
            let mut pods = placement_candidates(cfg, pool, loads, prompt.matches, total);
            // The worker's own pick first: it wins Redis's ties.
            if let Some(i) = pods.iter().position(|&(p, _, _)| p == c.pod) {
                pods[..=i].rotate_right(1);
            }
            let family = prompt.hashes.first().map(|&f| family_of(prompt.model, f));
            Some(Outcome::Ask { pods, family })
        }
        Place::Answered(Some(pod)) if pool.contains(&pod) => {
            let matched = prompt
                .matches
                .iter()
                .filter(|&&(p, _)| p == pod)
                .map(|&(_, m)| m)
                .max()
                .unwrap_or(0);
            c.pod = pod;
            c.reason = if matched > 0 {
                Reason::PrefixMatch
            } else {
                Reason::Placed
            };
            c.match_percent = match total {
                0 => 0,
                n => ((u64::from(matched) * 100) / n as u64).min(100) as u8,
            };
            None
        }
        _ => None,
    }
}
