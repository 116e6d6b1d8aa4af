//! The probe: how far each pod's cached prefix reaches, found by galloping
//! then bisecting over the sampled positions, one table read per segment
//! (see the module docs of [`super`]).

use crate::route::reads::RequestReads;
use crate::route::table::Record;
use crate::shared::registry::PodSlot;
use crate::shared::store::{SharedStore, StoreError};

use super::MAX_PROBES;

/// How far one pod's cached prefix reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PodMatch {
    pub(super) pod: PodSlot,
    /// Leading blocks the pod holds.
    pub(super) blocks: u32,
    /// Oldest last access among the probed blocks it holds.
    pub(super) oldest_access: u32,
    /// Newest last access among the probed blocks it holds: about when a
    /// request with this prefix was last sent to the pod, by any VM or
    /// (with sync) replica, since a routed request rewrites the held records
    /// of the segment its new blocks start in (see `Router::route`), which
    /// the search reads where the match ends.
    pub(super) newest_access: u32,
    /// Sampled index of the last block it holds.
    pub(super) last_index: usize,
}

/// Block positions recorded and probed for a prompt of `blocks` blocks:
/// all below `dense`, then 8 per doubling, then the last block. Ascending.
pub fn sampled_positions(blocks: usize, dense: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for i in 0..blocks {
        let n = i + 1;
        let keep = i < dense || {
            let octave = usize::BITS - 1 - n.leading_zeros();
            let step = 1usize << octave.saturating_sub(3);
            n % step == 0
        };
        if keep || i + 1 == blocks {
            out.push(i);
        }
    }
    out
}

/// What one routing decision probes.
pub(super) struct Probe<'a> {
    pub(super) hashes: &'a [u64],
    pub(super) positions: &'a [usize],
    /// Per sampled index, the anchor of its block (its bucket).
    pub(super) anchors: &'a [u32],
    pub(super) model: u16,
    pub(super) pool: &'a [PodSlot],
    /// Sampled index where the longest match ended last time for this first
    /// block: probed first, with the index after it. A repeated prefix (a
    /// system prompt) is then confirmed in three segment reads instead of a
    /// gallop.
    pub(super) hint: Option<usize>,
}

/// For each pod of `pool` holding the first sampled block, how many leading
/// blocks it holds, by galloping then bisecting over the sampled positions
/// (from the hint when there is one). Returns the matches and the number of
/// segment reads made.
pub(super) fn longest_matches<S: SharedStore + ?Sized>(
    table: &RequestReads<'_, S>,
    p: &Probe<'_>,
) -> Result<(Vec<PodMatch>, usize), StoreError> {
    if p.positions.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let mut probe = Prober {
        table,
        hashes: p.hashes,
        positions: p.positions,
        anchors: p.anchors,
        model: p.model,
        memo: vec![None; p.positions.len()],
        segments: Vec::new(),
        probes: 0,
    };
    let first = probe.pool_pods_at(0, p.pool)?;
    let mut matches = Vec::with_capacity(first.len());
    for (pod, first_seen) in first {
        let (lo, oldest, newest) = probe.search(pod, 0, first_seen, p.hint)?;
        matches.push(PodMatch {
            pod,
            blocks: (p.positions[lo] + 1) as u32,
            oldest_access: oldest,
            newest_access: newest.max(first_seen),
            last_index: lo,
        });
    }
    Ok((matches, probe.probes))
}

/// What one probe of a pod at a sampled position found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The pod holds the block, last accessed at this time.
    Since(u32),
    /// The pod does not hold the block.
    No,
    /// The probe budget ([`MAX_PROBES`]) is spent: nothing was read.
    OutOfBudget,
}

/// Memoized table reads: one read per anchor (segment) answers every
/// sampled position in it; reads are capped at [`MAX_PROBES`].
struct Prober<'a, 't, S: SharedStore + ?Sized> {
    table: &'a RequestReads<'t, S>,
    hashes: &'a [u64],
    positions: &'a [usize],
    anchors: &'a [u32],
    model: u16,
    memo: Vec<Option<Vec<(PodSlot, u32)>>>,
    /// The model's live records per anchor read so far.
    segments: Vec<(u32, Vec<Record>)>,
    probes: usize,
}

impl<S: SharedStore + ?Sized> Prober<'_, '_, S> {
    /// How far `pod` holds the prompt, knowing it holds sampled index `lo`
    /// (last accessed no earlier than `oldest`): gallop then bisect, from
    /// the hint when there is one. Returns the last held index and the
    /// oldest and newest access met (newest 0 when nothing was read).
    fn search(
        &mut self,
        pod: PodSlot,
        mut lo: usize,
        mut oldest: u32,
        hint: Option<usize>,
    ) -> Result<(usize, u32, u32), StoreError> {
        let mut newest = 0u32;
        let mut hi = self.positions.len();
        // Start at the hint: held there -> search above it, else below.
        if let Some(h) = hint.filter(|&h| h > lo && h < hi) {
            match self.held_since(h, pod)? {
                Held::Since(t) => {
                    oldest = oldest.min(t);
                    newest = newest.max(t);
                    lo = h;
                }
                Held::No => hi = h,
                Held::OutOfBudget => {}
            }
        }
        // Gallop: double the stride while the pod still holds the block.
        let mut step = 1;
        while lo + step < hi {
            match self.held_since(lo + step, pod)? {
                Held::Since(t) => {
                    oldest = oldest.min(t);
                    newest = newest.max(t);
                    lo += step;
                    step *= 2;
                }
                Held::No => {
                    hi = lo + step;
                    break;
                }
                Held::OutOfBudget => {
                    hi = lo + 1;
                    break;
                }
            }
        }
        // Bisect (lo holds, hi does not or is the end).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match self.held_since(mid, pod)? {
                Held::Since(t) => {
                    oldest = oldest.min(t);
                    newest = newest.max(t);
                    lo = mid;
                }
                Held::No => hi = mid,
                Held::OutOfBudget => break,
            }
        }
        Ok((lo, oldest, newest))
    }

    /// Pods (with last access) holding the block at sampled index `idx`;
    /// None once the probe budget is spent.
    fn pods_at(&mut self, idx: usize) -> Result<Option<&[(PodSlot, u32)]>, StoreError> {
        if self.memo[idx].is_none() {
            let anchor = self.anchors[idx];
            let seg = match self.segments.iter().position(|(a, _)| *a == anchor) {
                Some(seg) => seg,
                None => {
                    if self.probes >= MAX_PROBES {
                        return Ok(None);
                    }
                    self.probes += 1;
                    let records = self.table.segment(anchor, self.model)?;
                    self.segments.push((anchor, records));
                    self.segments.len() - 1
                }
            };
            let block = self.hashes[self.positions[idx]];
            let mut pods: Vec<(PodSlot, u32)> = Vec::new();
            for r in self.segments[seg].1.iter().filter(|r| r.block == block) {
                if !pods.iter().any(|(p, _)| *p == r.pod) {
                    pods.push((r.pod, r.last_access));
                }
            }
            self.memo[idx] = Some(pods);
        }
        Ok(self.memo[idx].as_deref())
    }

    /// Pods of `pool` holding the block at sampled index `idx`, with their
    /// last access; empty once the probe budget is spent.
    fn pool_pods_at(
        &mut self,
        idx: usize,
        pool: &[PodSlot],
    ) -> Result<Vec<(PodSlot, u32)>, StoreError> {
        Ok(self
            .pods_at(idx)?
            .map(|held| {
                held.iter()
                    .copied()
                    .filter(|(pod, _)| pool.contains(pod))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Whether `pod` holds the block at sampled index `idx`, and since when.
    fn held_since(&mut self, idx: usize, pod: PodSlot) -> Result<Held, StoreError> {
        Ok(match self.pods_at(idx)? {
            None => Held::OutOfBudget,
            Some(p) => match p.iter().find(|(q, _)| *q == pod) {
                Some(&(_, t)) => Held::Since(t),
                None => Held::No,
            },
        })
    }
}
