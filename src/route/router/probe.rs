//! The probe: how far each pod's cached prefix reaches, found by galloping
//! then bisecting over the sampled positions, one table read per segment
//! (see the module docs of [`super`]).

use crate::route::registry::PodSlot;
use crate::route::store::{SharedStore, StoreError};
use crate::route::table::{PrefixTable, Record};

use super::MAX_PROBES;

/// How far one pod's cached prefix reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PodMatch {
    pub(super) pod: PodSlot,
    /// Leading blocks the pod holds.
    pub(super) blocks: u32,
    /// Oldest last access among the probed blocks it holds.
    pub(super) oldest_access: u32,
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
    pub(super) now: u32,
    /// Sampled index where the longest match ended last time for this first
    /// block: probed first, with the index after it. A repeated prefix (a
    /// system prompt) is then confirmed in three reads instead of a gallop.
    pub(super) hint: Option<usize>,
}

/// For each pod of `pool` holding the first sampled block, how many leading
/// blocks it holds, by galloping then bisecting over the sampled positions
/// (from the hint when there is one). Returns the matches and the number of
/// table reads made.
pub(super) fn longest_matches<S: SharedStore + ?Sized>(
    table: &PrefixTable<'_, S>,
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
        now: p.now,
        memo: vec![None; p.positions.len()],
        segments: Vec::new(),
        probes: 0,
    };
    // Which pods hold the first sampled block at all.
    let first: Vec<(PodSlot, u32)> = probe
        .pods_at(0)?
        .map(|held| {
            held.iter()
                .copied()
                .filter(|(pod, _)| p.pool.contains(pod))
                .collect()
        })
        .unwrap_or_default();
    let n = p.positions.len();
    let mut matches = Vec::with_capacity(first.len());
    for (pod, first_seen) in first {
        let mut oldest = first_seen;
        let (mut lo, mut hi) = (0usize, n);
        // Start at the hint: held there -> search above it, else below.
        if let Some(h) = p.hint.filter(|&h| h > 0 && h < n) {
            match probe.held_since(h, pod)? {
                Held::Since(t) => {
                    oldest = oldest.min(t);
                    lo = h;
                }
                Held::No => hi = h,
                Held::OutOfBudget => {}
            }
        }
        // Gallop: double the stride while the pod still holds the block.
        let mut step = 1;
        while lo + step < hi {
            match probe.held_since(lo + step, pod)? {
                Held::Since(t) => {
                    oldest = oldest.min(t);
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
            match probe.held_since(mid, pod)? {
                Held::Since(t) => {
                    oldest = oldest.min(t);
                    lo = mid;
                }
                Held::No => hi = mid,
                Held::OutOfBudget => break,
            }
        }
        matches.push(PodMatch {
            pod,
            blocks: (p.positions[lo] + 1) as u32,
            oldest_access: oldest,
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
    table: &'a PrefixTable<'t, S>,
    hashes: &'a [u64],
    positions: &'a [usize],
    anchors: &'a [u32],
    model: u16,
    now: u32,
    memo: Vec<Option<Vec<(PodSlot, u32)>>>,
    /// The model's live records per anchor read so far.
    segments: Vec<(u32, Vec<Record>)>,
    probes: usize,
}

impl<S: SharedStore + ?Sized> Prober<'_, '_, S> {
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
                    let records = self.table.segment(anchor, self.model, self.now)?;
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
