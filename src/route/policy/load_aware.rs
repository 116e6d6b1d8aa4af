//! The load-aware rule ([`choose_load_aware`]) over one [`PoolView`]: what
//! the router knows of each pod of the request's pool, one [`PodView`] per
//! pod, and an order of pods named field by field ([`Rank`]).

use std::cmp::Reverse;

use crate::rng::SplitMix64;
use crate::shared::registry::PodSlot;

use super::{Choice, Reason};

/// Knobs of [`choose_load_aware`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LoadAwareConfig {
    /// A pod above the least loaded pod's load `min` + max(`slack_abs`,
    /// `slack_rel` x `min`) is never chosen.
    pub(crate) slack_abs: u32,
    pub(crate) slack_rel: f64,
    /// Prefill blocks one request of load above `min` costs in queueing.
    pub(crate) queue_cost_blocks: u32,
}

impl Default for LoadAwareConfig {
    fn default() -> Self {
        Self {
            slack_abs: 8,
            slack_rel: 1.0,
            queue_cost_blocks: 16,
        }
    }
}

/// What the load-aware policy weighs of one pod for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PodView {
    pub(crate) pod: PodSlot,
    /// Leading blocks of the prompt the table says the pod holds.
    pub(crate) matched: u32,
    /// Estimated queue ([`super::effective_load`]).
    pub(crate) queue: u32,
    /// In-flight requests, for ties: this replica's (this VM's exact, its
    /// other VMs' as of their last request) where the pod has a fresh
    /// report, else also the other replicas' as of the last sync.
    pub(crate) inflight: u32,
    /// New prefixes this replica placed on the pod (recently): this VM's,
    /// plus its other VMs' as of their last request.
    pub(crate) placed: u32,
    /// Requests this replica sent to the pod (recently), counted alike.
    pub(crate) sent: u32,
    /// How much one queued request costs on this pod relative to the
    /// fastest pod, in thousandths (0 = not measured, taken as 1000): a pod
    /// whose requests take 3x as long makes each one queued ahead cost 3x.
    pub(crate) slowness: u32,
    /// How long ago the requests in flight on the pod were sent, on
    /// average (0 with none; higher = older, in one unit for all pods): the
    /// last tie among unmatched pods (older requests free a slot sooner).
    /// The router gives the replica's ages in ms while other worker VMs
    /// are live, else this VM's own counted in requests it routed since
    /// (see [`crate::route::load::VmLoad::age`]).
    pub(crate) age: u64,
}

/// The request's pool as the load-aware policy sees it: one [`PodView`] per
/// pod, in the pool's order (rotation among equals follows it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PoolView {
    pub(crate) pods: Vec<PodView>,
    /// The request's blocks.
    pub(crate) total_blocks: usize,
    /// New prefixes go first to the pod this replica placed fewer on (before
    /// load and in-flight counts): set while a pod of the pool reports
    /// itself slow, so that the others, which take its share of new
    /// prefixes, share them evenly (each pod's cache holds its share).
    pub(crate) place_by_count: bool,
}

impl PoolView {
    fn percent(&self, matched: u32) -> u8 {
        match self.total_blocks {
            0 => 0,
            n => ((u64::from(matched) * 100) / n as u64).min(100) as u8,
        }
    }
}

/// Slowness (thousandths) from which [`choose_load_aware`] stretches a
/// request's uncached prefill on a pod.
pub(crate) const SLOW_PREFILL: i128 = 1500;

/// The load-aware rule. Over the pool's queues, `min` the lowest:
/// 1. a pod above `min + max(slack_abs, ceil(slack_rel x min))` is out;
/// 2. every other pod costs `uncached blocks x slowness' + (queue - min) x
///    queue_cost_blocks x slowness`: the prefill the request still needs
///    there plus the queueing its extra load costs (`slowness`: how much
///    longer this pod's hits take than the fastest pod's; `slowness'` the
///    same from [`SLOW_PREFILL`] up, else 1x). On pods alike this is the
///    prefill a match saves less its queue cost; a pod clearly slower
///    keeps the prefixes it holds, but misses go to faster pods;
/// 3. the lowest cost wins; ties are broken in the order of [`Rank`]'s
///    fields; remaining ties among unmatched pods rotate with `turn` (as
///    in [`super::choose`]), among matched pods they are shuffled;
/// 4. a hot prefix is copied. The prompt's prefix group (`share`: its
///    part of this VM's recent requests) needs `ceil(0.9 x share x pods)`
///    pods, and one more than hold it when it is big (at least half a
///    pod's share per holder) and the winning holder carries over 1.15x
///    its share of the traffic (`sent`).
///    When fewer pods of the pool hold at least half the best match, the
///    eligible non-holder with the lowest (queue, sent) takes the request
///    if it has fewer requests in flight than the winner (no copies
///    between idle pods), and carried less traffic than the winner and
///    less than its share. Later requests of the group tie on the match
///    and go to the holder with less traffic.
///
/// Reason: `PrefixMatch` when the chosen pod holds part of the prompt,
/// `Spread` when a hot prefix is copied (rule 4), `LoadGuard` when another
/// pod held some and was passed over, else `NoMatch`. None only for an
/// empty pool.
pub(crate) fn choose_load_aware(
    cfg: &LoadAwareConfig,
    view: &PoolView,
    share: f64,
    turn: usize,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    let w = Weigh::new(cfg, view)?;
    let eligible: Vec<&PodView> = view.pods.iter().filter(|v| w.eligible(v)).collect();
    let best = eligible.iter().map(|v| w.rank(v)).max()?;
    let mut tied: Vec<&PodView> = eligible
        .iter()
        .copied()
        .filter(|v| w.rank(v) == best)
        .collect();
    let mut chosen = if best.matched == 0 {
        tied[turn % tied.len()]
    } else {
        rng.shuffle(&mut tied);
        tied[0]
    };
    let mut spread_now = false;
    if let Some(copy) = copy_target(&w, view, &eligible, chosen, share) {
        chosen = copy;
        spread_now = true;
    }
    let any_match = view.pods.iter().any(|v| v.matched > 0);
    let reason = match (chosen.matched > 0, any_match) {
        _ if spread_now => Reason::Spread,
        (true, _) => Reason::PrefixMatch,
        (false, true) => Reason::LoadGuard,
        (false, false) => Reason::NoMatch,
    };
    Some(Choice {
        pod: chosen.pod,
        reason,
        match_percent: view.percent(chosen.matched),
    })
}

/// Rule 4: the pod a hot prefix is copied to instead of `winner`, if any.
fn copy_target<'v>(
    w: &Weigh<'_>,
    view: &'v PoolView,
    eligible: &[&'v PodView],
    winner: &PodView,
    share: f64,
) -> Option<&'v PodView> {
    let n = view.pods.len();
    let fair = share * n as f64;
    let matched = winner.matched;
    if matched == 0 || fair < 0.5 {
        return None;
    }
    let holds = |v: &PodView| u64::from(v.matched) * 2 >= u64::from(matched);
    // Holders over the whole pool: one briefly above the bound still holds
    // the prefix, and copying past it would make a third copy.
    let holders = view.pods.iter().filter(|v| holds(v)).count();
    let sent = |v: &PodView| w.sent(v) * n as u64;
    let total: u64 = view.pods.iter().map(|v| w.sent(v)).sum();
    let mut wanted = ((fair * 0.9).ceil() as usize).clamp(1, n);
    // The winner is the holder the group's requests go to: when even it
    // carries over 1.15x its share, a group worth half a pod's share per
    // holder takes one more.
    if fair >= 0.5 * holders as f64 && sent(winner) * 20 > total * 23 {
        wanted = wanted.max(holders + 1);
    }
    let copy_to = eligible
        .iter()
        .copied()
        .filter(|v| !holds(v))
        .min_by_key(|v| (v.queue, w.sent(v), v.placed))?;
    // Only under load: on idle pods a copy is a miss that buys nothing.
    let busier = winner.inflight > copy_to.inflight;
    (holders < wanted && busier && sent(copy_to) < sent(winner) && sent(copy_to) < total)
        .then_some(copy_to)
}

/// Where a new prompt may go under [`choose_load_aware`]: the pods within
/// rule 1's load bound, in the order rules 2-3 prefer them (the pool's
/// order among equals), each with its prefill cost (rule 2 without the
/// queue: the uncached blocks, times the pod's slowness from 1.5x up) and
/// what one more queued request adds to it: the candidates of a fleet-wide
/// placement, whose queue Redis knows better.
pub(crate) fn placement_candidates(
    cfg: &LoadAwareConfig,
    view: &PoolView,
) -> Vec<(PodSlot, i64, i64)> {
    let Some(w) = Weigh::new(cfg, view) else {
        return Vec::new();
    };
    let mut out: Vec<&PodView> = view.pods.iter().filter(|v| w.eligible(v)).collect();
    out.sort_by_key(|v| Reverse(w.rank(v)));
    out.into_iter()
        .map(|v| (v.pod, w.prefill(v), w.step(v)))
        .collect()
}

/// How rules 2-3 order the pods: compared field by field, in this order,
/// the larger wins; pods equal in every field tie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    /// Rule 2: the lower time to the first token.
    cost: Reverse<i64>,
    /// The longer match.
    matched: u32,
    /// With `place_by_count`, an unmatched pod this replica placed fewer
    /// new prefixes on (0 for every other pod).
    placed_first: Reverse<u32>,
    /// The shorter estimated queue.
    queue: Reverse<u32>,
    /// Fewer requests in flight (fresh, where reports lag).
    inflight: Reverse<u32>,
    /// Fewer requests sent recently, times slowness: a prefix placed now
    /// draws its later requests there.
    sent: Reverse<u64>,
    /// Fewer new prefixes placed, so that no pod's cache holds more than
    /// its share.
    placed: Reverse<u32>,
    /// Among unmatched pods, requests in flight sent longest ago: that pod
    /// frees a slot first. Not among holders of a match: their requests
    /// are hits and misses mixed, whose age says less of when they end.
    age: u64,
}

/// What [`choose_load_aware`] weighs of a pool (rules 1-3).
struct Weigh<'a> {
    cfg: &'a LoadAwareConfig,
    place_by_count: bool,
    total_blocks: usize,
    /// The pool's least queue, and the bound of rule 1.
    min: u32,
    bound: u32,
}

impl<'a> Weigh<'a> {
    /// None for an empty pool.
    fn new(cfg: &'a LoadAwareConfig, view: &PoolView) -> Option<Self> {
        let min = view.pods.iter().map(|v| v.queue).min()?;
        let rel = (cfg.slack_rel * f64::from(min))
            .ceil()
            .min(f64::from(u32::MAX)) as u32;
        Some(Self {
            cfg,
            place_by_count: view.place_by_count,
            total_blocks: view.total_blocks,
            min,
            bound: min.saturating_add(cfg.slack_abs.max(rel)),
        })
    }

    /// Rule 1.
    fn eligible(&self, v: &PodView) -> bool {
        v.queue <= self.bound
    }

    /// Slowness in thousandths (1000 when not measured).
    fn slow(v: &PodView) -> i128 {
        match v.slowness {
            0 => 1000,
            s => i128::from(s),
        }
    }

    /// Recent requests weighted by slowness: a pod 3x slower carries a
    /// request's traffic three times over.
    fn sent(&self, v: &PodView) -> u64 {
        u64::from(v.sent) * Self::slow(v) as u64 / 1000
    }

    /// The time to the first token, in a fast pod's prefill blocks: the
    /// uncached blocks' prefill plus the queue above the pool's least.
    fn cost(&self, v: &PodView) -> i64 {
        let extra = i128::from(v.queue - self.min);
        let queue = extra * i128::from(self.cfg.queue_cost_blocks) * Self::slow(v);
        let cost = (self.prefill_permille(v) + queue) / 1000;
        cost.min(i128::from(i64::MAX)) as i64
    }

    /// The uncached blocks' prefill alone, in a fast pod's blocks.
    fn prefill(&self, v: &PodView) -> i64 {
        (self.prefill_permille(v) / 1000).min(i128::from(i64::MAX)) as i64
    }

    fn prefill_permille(&self, v: &PodView) -> i128 {
        let slow = Self::slow(v);
        // Pods within 1.5x of the fastest prefill alike: that close,
        // measured slowness is mostly queueing and noise, and weighing a
        // miss's whole prefill by it would place new prefixes by noise.
        let prefill_slow = if slow >= SLOW_PREFILL { slow } else { 1000 };
        let uncached = (self.total_blocks as i128 - i128::from(v.matched)).max(0);
        uncached * prefill_slow
    }

    /// What one more request queued on the pod adds to its cost (at least 1).
    fn step(&self, v: &PodView) -> i64 {
        let step = i128::from(self.cfg.queue_cost_blocks) * Self::slow(v) / 1000;
        step.clamp(1, i128::from(i64::MAX)) as i64
    }

    fn rank(&self, v: &PodView) -> Rank {
        let unmatched = v.matched == 0;
        Rank {
            cost: Reverse(self.cost(v)),
            matched: v.matched,
            placed_first: Reverse(if self.place_by_count && unmatched {
                v.placed
            } else {
                0
            }),
            queue: Reverse(v.queue),
            inflight: Reverse(v.inflight),
            sent: Reverse(self.sent(v)),
            placed: Reverse(v.placed),
            age: if unmatched { v.age } else { 0 },
        }
    }
}
