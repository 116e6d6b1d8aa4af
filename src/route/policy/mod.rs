//! The routing policies. Pure: loads and matches come in, a choice comes
//! out; randomness only breaks ties.
//!
//! - [`PolicyMode::LoadAware`] ([`choose_load_aware`]): the longest match
//!   unless its pod's load is clearly above the least loaded pod's, or the
//!   queueing that extra load costs exceeds the prefill the match saves.
//!   Loads are in-flight counts, or with pod signals the requests a pod is
//!   estimated to have queued ([`effective_load`]).
//! - [`PolicyMode::Aibrix`] ([`choose`]): AIBrix `prefix-cache`, exactly: a
//!   load guard first, then the longest cached prefix among pods within
//!   mean + k·σ of in-flight, else the least loaded pod.

use serde::Deserialize;

use crate::rng::SplitMix64;
use crate::shared::registry::PodSlot;
use crate::signals::Seen;

/// Which rules choose the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// [`choose_load_aware`].
    #[default]
    LoadAware,
    /// [`choose`]: AIBrix's rules (mixed fleets with AIBrix gateways).
    Aibrix,
}

/// Knobs of [`choose_load_aware`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAwareConfig {
    /// A pod above the least loaded pod's load `min` + max(`slack_abs`,
    /// `slack_rel` x `min`) is never chosen.
    pub slack_abs: u32,
    pub slack_rel: f64,
    /// Prefill blocks one request of load above `min` costs in queueing.
    pub queue_cost_blocks: u32,
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

/// A pod's load for [`choose_load_aware`]: the requests it is estimated to
/// have queued. Without a report, `E` is `fleet`, the in-flight count
/// this VM knows of (this replica's, plus the other replicas' with sync).
/// With one, `E` is `replica`, this replica's in-flight count now, plus
/// what the pod reported beyond this replica's own requests
/// ([`Seen::foreign`]): its own requests fresh, everyone else's as of the
/// report. (Taking the report whole would count this replica's requests
/// as they were up to an interval and a tick ago: a pod that has just
/// finished a burst would look busy, and one that has just been sent one
/// idle.) The estimate is `E` less `capacity`, the most requests the pod
/// was seen running at once.
pub fn effective_load(replica: u32, fleet: u32, seen: Option<Seen>, capacity: u32) -> u32 {
    let Some(seen) = seen else {
        return fleet;
    };
    replica
        .saturating_add(seen.foreign)
        .saturating_sub(capacity)
}

/// The load-aware rule. Over the pool's loads (`load[pod]`, missing = 0),
/// `min` the lowest:
/// 1. a pod above `min + max(slack_abs, ceil(slack_rel x min))` is out;
/// 2. every other pod costs `uncached blocks x slowness' + (load - min) x
///    queue_cost_blocks x slowness`: the prefill the request still needs
///    there plus the queueing its extra load costs (`slowness`: how much
///    longer this pod's hits take than the fastest pod's; `slowness'` the
///    same from [`SLOW_PREFILL`] up, else 1x). On pods alike this is the
///    prefill a match saves less its queue cost; a pod clearly slower
///    keeps the prefixes it holds, but misses go to faster pods. A match
///    on a pod in `untrusted` (not sent there for its trust horizon,
///    learned from its answers, so perhaps evicted) saves nothing here: it buys no queueing;
/// 3. the lowest cost wins; ties go to the longer (trusted) match, then the
///    lower load, then fewer in flight (`inflight`: fresh, where reports
///    lag), then the longer untrusted match (an old match still goes to a
///    holder no busier than the others),
///    then the pod this replica sent fewer requests to recently (`sent`,
///    times `slowness`: a prefix placed now draws its later requests
///    there), then the pod it placed fewer new prefixes on (`placed`, so no pod's
///    cache holds more than its share; with `place_by_count`, unmatched
///    pods compare `placed` first, right after the match), then, among
///    unmatched pods, the one whose requests in flight were sent longest
///    ago (`age`: it frees a slot first); remaining ties among
///    unmatched pods rotate with `turn` (as in [`choose`]), among matched
///    pods they are shuffled;
/// 4. a hot prefix is copied. The prompt's prefix group (`share`: its
///    part of this VM's recent requests) needs `ceil(0.9 x share x pods)`
///    pods, and one more than hold it when it is big (at least half a
///    pod's share per holder) and the winning holder carries over 1.15x
///    its share of the traffic (`sent`).
///    When fewer pods of the pool hold at least half the best match, the
///    eligible non-holder with the lowest (load, sent) takes the request
///    if it has fewer requests in flight than the winner (no copies
///    between idle pods), and carried less traffic than the winner and
///    less than its share. Later requests of the group tie on the match
///    and go to the holder with less traffic.
///
/// Reason: `PrefixMatch` when the chosen pod holds part of the prompt,
/// `Spread` when a hot prefix is copied (rule 4), `LoadGuard` when another
/// pod held some and was passed over, else `NoMatch`. None only for an
/// empty pool.
#[allow(clippy::too_many_arguments)]
pub fn choose_load_aware(
    cfg: &LoadAwareConfig,
    pool: &[PodSlot],
    loads: &PodLoads<'_>,
    matches: &[(PodSlot, u32)],
    total_blocks: usize,
    share: f64,
    turn: usize,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    let w = Weigh::new(cfg, pool, loads, matches, total_blocks)?;
    let bound = w.bound;
    let at = |v: &[u32], pod: PodSlot| v.get(pod.index()).copied().unwrap_or(0);
    let load_of = |pod: PodSlot| w.load(pod);
    let matched_of = |pod: PodSlot| w.matched(pod);
    let sent_of = |pod: PodSlot| w.sent(pod);
    let key = |pod: PodSlot| w.key(pod);
    let eligible = pool.iter().copied().filter(|&p| load_of(p) <= bound);
    let best = eligible.clone().map(key).max()?;
    let mut tied: Vec<PodSlot> = eligible.clone().filter(|&p| key(p) == best).collect();
    let mut pod = if best.1 == 0 && best.5 == 0 {
        tied[turn % tied.len()]
    } else {
        rng.shuffle(&mut tied);
        tied[0]
    };
    let mut matched = matched_of(pod);
    let mut spread_now = false;
    let n = pool.len();
    let fair = share * n as f64;
    if matched > 0 && fair >= 0.5 {
        let holds = |p: PodSlot| u64::from(matched_of(p)) * 2 >= u64::from(matched);
        // Holders over the whole pool: one briefly above the bound still
        // holds the prefix, and copying past it would make a third copy.
        let holders = pool.iter().filter(|&&p| holds(p)).count();
        let sent = |p: PodSlot| sent_of(p) * n as u64;
        let total: u64 = pool.iter().map(|&p| sent_of(p)).sum();
        let mut wanted = ((fair * 0.9).ceil() as usize).clamp(1, n);
        // The winner is the holder the group's requests go to: when even it
        // carries over 1.15x its share, a group worth half a pod's share per
        // holder takes one more (with only one, tenants' requests per pod
        // read max/min <= 1.5 in about half the runs; see policy-notes).
        if fair >= 0.5 * holders as f64 && sent(pod) * 20 > total * 23 {
            wanted = wanted.max(holders + 1);
        }
        let copy_to = eligible
            .filter(|&p| !holds(p))
            .min_by_key(|&p| (load_of(p), sent_of(p), at(loads.placed, p)));
        // Only under load: on idle pods a copy is a miss that buys nothing.
        let busier = |c: PodSlot| at(loads.inflight, pod) > at(loads.inflight, c);
        if let Some(c) = copy_to
            .filter(|&c| holders < wanted && busier(c) && sent(c) < sent(pod) && sent(c) < total)
        {
            pod = c;
            matched = matched_of(c);
            spread_now = true;
        }
    }
    let any_match = pool.iter().any(|&p| matched_of(p) > 0);
    let reason = match (matched > 0, any_match) {
        _ if spread_now => Reason::Spread,
        (true, _) => Reason::PrefixMatch,
        (false, true) => Reason::LoadGuard,
        (false, false) => Reason::NoMatch,
    };
    let match_percent = if total_blocks == 0 {
        0
    } else {
        ((u64::from(matched) * 100) / total_blocks as u64).min(100) as u8
    };
    Some(Choice {
        pod,
        reason,
        match_percent,
    })
}

/// Slowness (thousandths) from which [`choose_load_aware`] stretches a
/// request's uncached prefill on a pod.
pub const SLOW_PREFILL: i128 = 1500;

/// The order [`choose_load_aware`]'s rules 2-3 put pods in: larger first.
type Key = (
    i64,
    u32,
    std::cmp::Reverse<u32>,
    std::cmp::Reverse<u32>,
    std::cmp::Reverse<u32>,
    u32,
    std::cmp::Reverse<u64>,
    std::cmp::Reverse<u32>,
    u64,
);

/// What [`choose_load_aware`] weighs of each pod of a pool (rules 1-3).
struct Weigh<'a> {
    cfg: &'a LoadAwareConfig,
    loads: &'a PodLoads<'a>,
    matches: &'a [(PodSlot, u32)],
    total_blocks: usize,
    /// The pool's least load, and the bound of rule 1.
    min: u32,
    bound: u32,
}

impl<'a> Weigh<'a> {
    /// None for an empty pool.
    fn new(
        cfg: &'a LoadAwareConfig,
        pool: &[PodSlot],
        loads: &'a PodLoads<'a>,
        matches: &'a [(PodSlot, u32)],
        total_blocks: usize,
    ) -> Option<Self> {
        let at = |pod: PodSlot| loads.queue.get(pod.index()).copied().unwrap_or(0);
        let min = pool.iter().map(|&p| at(p)).min()?;
        let bound = load_bound(cfg, pool, loads.queue)?;
        Some(Self {
            cfg,
            loads,
            matches,
            total_blocks,
            min,
            bound,
        })
    }

    fn at(v: &[u32], pod: PodSlot) -> u32 {
        v.get(pod.index()).copied().unwrap_or(0)
    }

    fn load(&self, pod: PodSlot) -> u32 {
        Self::at(self.loads.queue, pod)
    }

    fn matched(&self, pod: PodSlot) -> u32 {
        self.matches
            .iter()
            .filter(|(p, _)| *p == pod)
            .map(|(_, m)| *m)
            .max()
            .unwrap_or(0)
    }

    /// The match that buys queueing: none on a pod whose match is too old
    /// to trust (it may have been evicted).
    fn trusted(&self, pod: PodSlot) -> u32 {
        if self.loads.untrusted.contains(&pod) {
            0
        } else {
            self.matched(pod)
        }
    }

    /// Slowness in thousandths (1000 when not measured).
    fn slow(&self, pod: PodSlot) -> i128 {
        match Self::at(self.loads.slowness, pod) {
            0 => 1000,
            s => i128::from(s),
        }
    }

    /// Recent requests weighted by slowness: a pod 3x slower carries a
    /// request's traffic three times over.
    fn sent(&self, pod: PodSlot) -> u64 {
        u64::from(Self::at(self.loads.sent, pod)) * self.slow(pod) as u64 / 1000
    }

    /// The time to the first token, in a fast pod's prefill blocks: the
    /// uncached blocks' prefill plus the queue above the pool's least.
    fn cost(&self, pod: PodSlot) -> i64 {
        let extra = i128::from(self.load(pod) - self.min);
        let queue = extra * i128::from(self.step_unit()) * self.slow(pod);
        let cost = (self.prefill_permille(pod) + queue) / 1000;
        cost.min(i128::from(i64::MAX)) as i64
    }

    /// The uncached blocks' prefill alone, in a fast pod's blocks.
    fn prefill(&self, pod: PodSlot) -> i64 {
        (self.prefill_permille(pod) / 1000).min(i128::from(i64::MAX)) as i64
    }

    fn prefill_permille(&self, pod: PodSlot) -> i128 {
        let slow = self.slow(pod);
        // Pods within 1.5x of the fastest prefill alike: that close,
        // measured slowness is mostly queueing and noise, and weighing a
        // miss's whole prefill by it would place new prefixes by noise.
        let prefill_slow = if slow >= SLOW_PREFILL { slow } else { 1000 };
        let uncached = (self.total_blocks as i128 - i128::from(self.trusted(pod))).max(0);
        uncached * prefill_slow
    }

    fn step_unit(&self) -> u32 {
        self.cfg.queue_cost_blocks
    }

    /// What one more request queued on `pod` adds to its cost (at least 1).
    fn step(&self, pod: PodSlot) -> i64 {
        let step = i128::from(self.step_unit()) * self.slow(pod) / 1000;
        step.clamp(1, i128::from(i64::MAX)) as i64
    }

    /// How long ago the requests in flight there were sent, for a pod
    /// without a match: of pods alike, the one whose requests are oldest
    /// frees a slot first. Not among holders of a match: their requests
    /// are hits and misses mixed, whose age says less of when they end
    /// (with it there too, cache-pressure through three replicas read
    /// higher TTFT p99s; see policy-notes).
    fn age(&self, pod: PodSlot) -> u64 {
        if self.matched(pod) == 0 {
            self.loads.age.get(pod.index()).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// (-cost, trusted match, [-placed,] -load, -in flight, untrusted
    /// match, -sent, -placed, age) decides; equal keys tie.
    fn key(&self, pod: PodSlot) -> Key {
        use std::cmp::Reverse;
        let placed_first = if self.loads.place_by_count && self.matched(pod) == 0 {
            Self::at(self.loads.placed, pod)
        } else {
            0
        };
        (
            -self.cost(pod),
            self.trusted(pod),
            Reverse(placed_first),
            Reverse(self.load(pod)),
            Reverse(Self::at(self.loads.inflight, pod)),
            self.matched(pod) - self.trusted(pod),
            Reverse(self.sent(pod)),
            Reverse(Self::at(self.loads.placed, pod)),
            self.age(pod),
        )
    }
}

/// The load bound of rule 1: the pool's least load plus
/// `max(slack_abs, ceil(slack_rel x least))`. None for an empty pool.
fn load_bound(cfg: &LoadAwareConfig, pool: &[PodSlot], queue: &[u32]) -> Option<u32> {
    let min = pool
        .iter()
        .map(|p| queue.get(p.index()).copied().unwrap_or(0))
        .min()?;
    let rel = (cfg.slack_rel * f64::from(min))
        .ceil()
        .min(f64::from(u32::MAX)) as u32;
    Some(min.saturating_add(cfg.slack_abs.max(rel)))
}

/// Where a new prompt may go under [`choose_load_aware`] (its matches
/// `matches`, `total_blocks` long): the pods within rule 1's load bound, in
/// the order rules 2-3 prefer them (the pool's order among equals), each
/// with its prefill cost (rule 2 without the queue: the uncached blocks,
/// times the pod's slowness from 1.5x up) and what one more queued request
/// adds to it: the candidates of a fleet-wide placement, whose queue Redis
/// knows better.
pub(crate) fn placement_candidates(
    cfg: &LoadAwareConfig,
    pool: &[PodSlot],
    loads: &PodLoads<'_>,
    matches: &[(PodSlot, u32)],
    total_blocks: usize,
) -> Vec<(PodSlot, i64, i64)> {
    let Some(w) = Weigh::new(cfg, pool, loads, matches, total_blocks) else {
        return Vec::new();
    };
    let mut out: Vec<PodSlot> = pool
        .iter()
        .copied()
        .filter(|&p| w.load(p) <= w.bound)
        .collect();
    out.sort_by_key(|&p| std::cmp::Reverse(w.key(p)));
    out.into_iter()
        .map(|p| (p, w.prefill(p), w.step(p)))
        .collect()
}

/// Per-pod figures [`choose_load_aware`] weighs, indexed by pod slot
/// (missing = 0).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodLoads<'a> {
    /// Estimated queue ([`effective_load`]).
    pub queue: &'a [u32],
    /// In-flight requests, for ties: this replica's (this VM's exact, its
    /// other VMs' as of their last request) where the pod has a fresh
    /// report, else also the other replicas' as of the last sync.
    pub inflight: &'a [u32],
    /// New prefixes this replica placed on the pod (recently): this VM's,
    /// plus its other VMs' as of their last request.
    pub placed: &'a [u32],
    /// Requests this replica sent to the pod (recently), counted alike.
    pub sent: &'a [u32],
    /// How much one queued request costs on this pod relative to the
    /// fastest pod, in thousandths (missing or 0 = 1000): a pod whose
    /// requests take 3x as long makes each one queued ahead cost 3x.
    pub slowness: &'a [u32],
    /// New prefixes go first to the pod this replica placed fewer on (before
    /// load and in-flight counts): set while a pod of the pool reports
    /// itself slow, so that the others, which take its share of new
    /// prefixes, share them evenly (each pod's cache holds its share).
    pub place_by_count: bool,
    /// Pods whose match is not trusted to be cached any more (no request
    /// with the prefix sent there for the pod's trust horizon, learned or
    /// learned from its answers): their match buys
    /// no queueing (they cost as if unmatched) and counts in the ties only
    /// after in-flight counts.
    pub untrusted: &'a [PodSlot],
    /// How long ago the requests in flight on the pod were sent, on
    /// average (0 with none; higher = older, in one unit for all pods): the
    /// last tie among unmatched pods (older requests free a slot sooner).
    /// The router gives the replica's ages in ms while other worker VMs
    /// are live, else this VM's own counted in requests it routed since
    /// (see [`crate::route::load::VmLoad::age`]).
    pub age: &'a [u64],
}

/// The policy's two knobs (AIBrix ships 16 and 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PolicyConfig {
    /// Max - min in-flight spread above which only the least loaded pods count.
    pub(crate) imbalance_abs_count: u32,
    /// A matched pod is taken only if its in-flight count is within
    /// mean + factor x standard deviation of the pool's counts.
    pub(crate) stddev_factor: f64,
}

/// Why a pod was chosen; each maps to a stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The pod with the longest cached prefix within load bounds.
    PrefixMatch,
    /// No pod holds the first block: least loaded pod.
    NoMatch,
    /// Load imbalance, or every matching pod above the load bound: least loaded pod.
    LoadGuard,
    /// A hot prefix copied to a less busy pod (load-aware rule 4).
    Spread,
    /// A new prompt (no pod held any of it) on the pod Redis chose over
    /// every replica's placed requests (`sync.place_new`).
    Placed,
}

/// The policy's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub pod: PodSlot,
    pub(crate) reason: Reason,
    /// Share of the request's blocks the chosen pod already holds, 0..=100.
    pub match_percent: u8,
}

/// Picks a pod from `pool`.
///
/// - `load[pod]`: in-flight requests per pod id (missing ids count as 0);
/// - `matches`: `(pod, matched leading blocks)` for pods holding a prefix;
/// - `total_blocks`: the request's full block count;
/// - `turn`: a counter the caller advances after each least-loaded pick.
///   Ties among the least loaded pods rotate with it instead of being drawn
///   at random: at concurrency 1 every pod is idle, and a random (or
///   first-pod) draw places new prefixes unevenly; a rotation spreads them
///   one per pod. Ties among matched pods are still shuffled (`rng`).
///
/// Returns None only for an empty pool.
pub(crate) fn choose(
    cfg: &PolicyConfig,
    pool: &[PodSlot],
    load: &[u32],
    matches: &[(PodSlot, u32)],
    total_blocks: usize,
    turn: usize,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    let load_of = |pod: PodSlot| load.get(pod.index()).copied().unwrap_or(0);
    let percent_of = |pod: PodSlot| -> u8 {
        let matched = matches
            .iter()
            .find(|(p, _)| *p == pod)
            .map_or(0, |(_, m)| *m);
        if total_blocks == 0 {
            0
        } else {
            ((u64::from(matched) * 100) / total_blocks as u64).min(100) as u8
        }
    };
    let (min, max) = pool
        .iter()
        .map(|&p| load_of(p))
        .fold((u32::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
    if pool.is_empty() {
        return None;
    }
    let least_loaded = || -> PodSlot {
        let mins: Vec<PodSlot> = pool
            .iter()
            .copied()
            .filter(|&p| load_of(p) == min)
            .collect();
        mins[turn % mins.len()]
    };
    let pick = |pod: PodSlot, reason: Reason| Choice {
        pod,
        reason,
        match_percent: percent_of(pod),
    };

    // 1. Load guard: with a wide spread, only the least loaded pods count.
    if pool.len() > 1 && max - min > cfg.imbalance_abs_count {
        return Some(pick(least_loaded(), Reason::LoadGuard));
    }

    // 2-3. Longest match first, then fewer in flight, ties shuffled; take the
    // first within mean + factor x stddev.
    let mut matched: Vec<(PodSlot, u32)> = matches
        .iter()
        .copied()
        .filter(|(p, m)| *m > 0 && pool.contains(p))
        .collect();
    if matched.is_empty() {
        return Some(pick(least_loaded(), Reason::NoMatch));
    }
    rng.shuffle(&mut matched);
    matched.sort_by(|a, b| b.1.cmp(&a.1).then(load_of(a.0).cmp(&load_of(b.0))));
    let n = pool.len() as f64;
    let mean = pool.iter().map(|&p| f64::from(load_of(p))).sum::<f64>() / n;
    let var = pool
        .iter()
        .map(|&p| (f64::from(load_of(p)) - mean).powi(2))
        .sum::<f64>()
        / n;
    let bound = mean + cfg.stddev_factor * var.sqrt();
    if let Some((pod, _)) = matched
        .iter()
        .find(|(p, _)| f64::from(load_of(*p)) <= bound)
    {
        return Some(pick(*pod, Reason::PrefixMatch));
    }
    // 4. Every matching pod is too busy.
    Some(pick(least_loaded(), Reason::LoadGuard))
}

#[cfg(test)]
mod load_aware_tests;
#[cfg(test)]
mod tests;
