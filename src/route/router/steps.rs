//! The steps of one routing decision, in order: [`Router::probe_prompt`]
//! (the pool, the prompt's blocks and how far each pod's cached prefix
//! reaches), [`Router::pool_view`] (what the load-aware policy weighs of each
//! pod), [`Router::decide`] (the policy) and [`Router::record`] (the table
//! write and the in-flight count). [`Router::route_placed`] runs them; a
//! fleet-wide placement stops after `decide` and [`Router::resume`] runs
//! `record` once Redis has answered, with nothing probed again.

use crate::fleet::{self, Members};
use crate::rng::SplitMix64;
use crate::route::policy::{
    choose, choose_load_aware, effective_load, Choice, PodView, PolicyMode, PoolView, Reason,
};
use crate::route::reads::RequestReads;
use crate::route::request::PromptRequest;
use crate::route::table::{anchor_of, PrefixTable, WriteOutcome};
use crate::shared::registry::PodSlot;
use crate::shared::store::{SharedStore, StoreError};

use super::probe::{longest_matches, PodMatch, Probe};
use super::speed::slowness;
use super::{explain, sampled_positions, RouteError, Routed, Router, HIT_PERCENT, MAX_HINTS};

/// A prompt as the table sees it on the request's pool: what every step
/// after the probe needs, and all a placed request keeps while Redis
/// answers (not its prompt).
#[derive(Debug)]
pub(crate) struct Probed {
    /// Model id in the table, None when the request names no model.
    pub(super) model: Option<u16>,
    /// Whether the answer streams (only a streamed prefill is timed).
    pub(super) stream: bool,
    pub(super) pool: Vec<PodSlot>,
    /// Every block hash of the prompt.
    pub(super) hashes: Vec<u64>,
    /// The sampled positions recorded and probed, and their segments' anchors.
    positions: Vec<usize>,
    anchors: Vec<u32>,
    /// How far each pod's cached prefix reaches, and the reads it took.
    matches: Vec<PodMatch>,
    pub(super) probes: usize,
    /// The prompt's group's share of this VM's recent requests (hot
    /// prefix copies), None until enough were seen.
    share: Option<f64>,
}

impl Probed {
    /// `(pod, leading blocks)` of each pod holding part of the prompt.
    pub(super) fn lengths(&self) -> Vec<(PodSlot, u32)> {
        self.matches.iter().map(|m| (m.pod, m.blocks)).collect()
    }

    pub(super) fn matched(&self, pod: PodSlot) -> Option<&PodMatch> {
        self.matches.iter().find(|m| m.pod == pod)
    }
}

/// What the policy step decided.
pub(super) struct Decision {
    pub(super) choice: Choice,
    /// The load-aware policy's view of the pool (None under `aibrix`).
    pub(super) view: Option<PoolView>,
    /// The fleet's in-flight counts the decision saw, by slot.
    pub(super) load: Vec<u32>,
}

impl Router {
    /// Before this VM's first tick: builds static pools, or reads what the
    /// singleton published (one read, only while nothing is known).
    pub(super) fn ensure_members<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        now_secs: u32,
    ) -> Result<(), StoreError> {
        if !self.fleet.borrow().is_empty() {
            return Ok(());
        }
        if self.all_static() {
            self.refresh_static(store, now_secs)?;
        } else if let (Some(bytes), _) = store.get(fleet::MEMBERS_KEY)? {
            if let Some(members) = Members::decode(&bytes) {
                self.set_members(members);
            }
        }
        Ok(())
    }

    /// Step 1: the request's pool, its prompt's blocks, and how far each
    /// pod of the pool holds them (one table read per segment visited,
    /// reused by the write). `count_demand`: the request counts in its
    /// group's share of traffic.
    pub(super) fn probe_prompt<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        reads: &RequestReads<'_, S>,
        req: &PromptRequest,
        now_secs: u32,
    ) -> Result<Probed, RouteError> {
        let pool = self.fleet.borrow().routable(
            self.settings.pool_key(&req.model),
            u64::from(now_secs) * 1000,
        );
        if pool.is_empty() {
            return Err(RouteError::NoEndpoints);
        }
        let model = self.model_id(store, &req.model, now_secs)?;
        let hashes = self.hasher.hash(&req.prompt);
        let dense = self.settings.dense_prefix_blocks as usize;
        let positions = sampled_positions(hashes.len(), dense);
        let anchors: Vec<u32> = positions
            .iter()
            .map(|&i| anchor_of(hashes[self.layout.anchor_position(i, dense)]))
            .collect();
        let mut probed = Probed {
            model,
            stream: req.stream,
            pool,
            hashes,
            positions,
            anchors,
            matches: Vec::new(),
            probes: 0,
            share: None,
        };
        let Some(m) = model else {
            return Ok(probed);
        };
        let key = (m, probed.hashes.first().copied().unwrap_or(0));
        probed.share = self.demand.borrow_mut().count(key);
        let hint = self.hints.borrow().get(&key).copied();
        let (matches, probes) = longest_matches(
            reads,
            &Probe {
                hashes: &probed.hashes,
                positions: &probed.positions,
                anchors: &probed.anchors,
                model: m,
                pool: &probed.pool,
                hint: hint.map(|h| h as usize),
            },
        )?;
        if let Some(best) = matches.iter().map(|p| p.last_index).max() {
            let mut hints = self.hints.borrow_mut();
            if hints.len() >= MAX_HINTS && !hints.contains_key(&key) {
                hints.clear();
            }
            hints.insert(key, best as u32);
        }
        probed.matches = matches;
        probed.probes = probes;
        Ok(probed)
    }

    /// Step 2: what the load-aware policy weighs of each pod of the pool,
    /// from the fleet's in-flight counts `load` (by slot), the pods'
    /// reports, this replica's sent and placed counts and the ages of its
    /// requests, and each pod's slowness.
    pub(super) fn pool_view(&self, probed: &Probed, load: &[u32], now_ms: u64) -> PoolView {
        let signals = self.signals.borrow();
        let vm_load = self.load.borrow();
        let bound = self.fleet.borrow().bound();
        let (placed, sent, age) = (
            vm_load.placed(bound),
            vm_load.sent(bound),
            vm_load.age(now_ms),
        );
        let prefill = self.prefill.borrow();
        let (slow, place_by_count) = slowness(
            &self.latency.borrow(),
            &signals,
            prefill.slowness(),
            &probed.pool,
        );
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        let pods = probed
            .pool
            .iter()
            .map(|&pod| {
                let i = pod.index();
                let fleet = at(load, i);
                let replica = vm_load.replica_at(i);
                let seen = signals.seen(pod);
                // This replica's own count matters only beside a report.
                let mine = if signals.is_empty() { 0 } else { replica };
                PodView {
                    pod,
                    matched: probed.matched(pod).map_or(0, |m| m.blocks),
                    queue: effective_load(mine, fleet, seen, signals.capacity(pod)),
                    // Ties weigh in-flight counts as fresh as they come: for
                    // a pod with a report, this replica's own (exact; the
                    // report already puts the other replicas' load in its
                    // queue, and their synced counts are up to a period
                    // old); for the others, every count this VM knows.
                    inflight: if seen.is_some() { replica } else { fleet },
                    placed: at(&placed, i),
                    sent: at(&sent, i),
                    slowness: at(&slow, i),
                    age: age.get(i).copied().unwrap_or(0),
                }
            })
            .collect();
        PoolView {
            pods,
            total_blocks: probed.hashes.len(),
            place_by_count,
        }
    }

    /// Step 3: the policy's choice for `probed`, with the fleet's in-flight
    /// counts as of now (one get per other live VM of this replica; other
    /// replicas' load exists only when syncing, see `refresh_load`).
    pub(super) fn decide<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        probed: &Probed,
        now_ms: u64,
        rng: &mut SplitMix64,
    ) -> Result<Decision, RouteError> {
        self.load.borrow_mut().read_others(store, now_ms);
        let load = self.load.borrow().fleet(self.fleet.borrow().bound());
        // Each VM starts its rotation at a random pod, so workers and
        // replicas do not all begin with the first one.
        let turn = match self.turn.get() {
            Some(t) => t,
            None => {
                let t = rng.next_u64() as usize;
                self.turn.set(Some(t));
                t
            }
        };
        let total = probed.hashes.len();
        let (choice, view) = match self.settings.policy {
            PolicyMode::Aibrix => {
                let lengths = probed.lengths();
                let choice = choose(
                    &self.policy,
                    &probed.pool,
                    &load,
                    &lengths,
                    total,
                    turn,
                    rng,
                );
                (choice, None)
            }
            PolicyMode::LoadAware => {
                let view = self.pool_view(probed, &load, now_ms);
                let share = probed.share.unwrap_or(0.0);
                let choice = choose_load_aware(&self.settings.load_aware, &view, share, turn, rng);
                (choice, Some(view))
            }
        };
        let choice = choice.ok_or(RouteError::NoEndpoints)?;
        Ok(Decision { choice, view, load })
    }

    /// Writes the decision line of `d` (Envoy's `wasm` log at debug).
    fn explain(&self, model: &str, probed: &Probed, d: &Decision) {
        // Nothing is built for a line nobody reads (the request path).
        if !log::log_enabled!(log::Level::Debug) {
            return;
        }
        let fleet = self.fleet.borrow();
        let lengths = probed.lengths();
        let scene = explain::Scene::new(&fleet, model, probed.hashes.len(), &probed.pool, &lengths);
        match &d.view {
            Some(view) => explain::load_aware(&scene, view, Some(&d.choice)),
            None => explain::aibrix(&scene, &d.load, Some(&d.choice)),
        }
    }

    /// Step 4: writes the decision line, records the prompt's blocks for the
    /// chosen pod and counts the request in flight there. The decision's
    /// `load` tells whether the pod had a slot free (prefill timing).
    pub(super) fn record<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        reads: &RequestReads<'_, S>,
        probed: Probed,
        decision: Decision,
        model: &str,
        now_ms: u64,
    ) -> Routed {
        self.explain(model, &probed, &decision);
        let Decision { choice, load, .. } = decision;
        let load = load.as_slice();
        let now_secs = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX);
        // Before it is counted in flight there.
        let timeable = probed.stream
            && self.settings.policy == PolicyMode::LoadAware
            && self.had_free_slot(choice.pod, load);
        let advance = choice.reason != Reason::PrefixMatch;
        if advance {
            self.turn
                .set(Some(self.turn.get().unwrap_or(0).wrapping_add(1)));
        }
        let chosen = probed.matched(choice.pod).copied();
        let recorded = self.blocks_to_record(&probed, chosen, now_secs);
        let write = match probed.model {
            Some(m) => {
                PrefixTable::new(reads, self.table).record(&recorded, m, choice.pod, now_secs)
            }
            None => WriteOutcome::default(),
        };
        let ticket = {
            let mut load = self.load.borrow_mut();
            let ticket = load.start(choice.pod, now_ms, advance);
            load.publish(store, now_ms);
            ticket
        };
        if choice.match_percent >= HIT_PERCENT {
            // Timed as a hit until released, or until it waits (untime_hit).
            self.latency.borrow_mut().started_hit(choice.pod);
        }
        let predicted = chosen.map_or(0, |m| m.blocks);
        let total = probed.hashes.len();
        // Only a prompt the table knew nothing of on that pod: a predicted
        // match the pod had evicted would prefill more than the blocks
        // past it, and read as a slow pod.
        let prefill_blocks =
            (timeable && predicted == 0).then(|| u32::try_from(total).unwrap_or(u32::MAX));
        Routed {
            ticket,
            prefill_blocks,
            choice,
            total_blocks: total,
            probes: probed.probes,
            model: probed.model,
            recorded,
            write,
            matched: predicted,
            matched_since: chosen.map_or(0, |m| m.oldest_access),
            hashes: probed.hashes,
        }
    }

    /// The blocks written for the chosen pod, (hash, anchor). The chosen
    /// pod's matched prefix needs no rewrite while it is fresh: only blocks
    /// past the match are new. Refreshing at most every
    /// `touch_interval_secs` keeps hot prefixes alive (idle expiry, Redis
    /// TTL) at a fraction of the shared-data writes. The held blocks of the
    /// segment the new ones start in are written again with them (same
    /// bucket, no extra call): a shared prefix then stays as recent as the
    /// unique tails that follow it, and the bucket's LRU evicts old tails,
    /// not the prefix. Only that segment's: held blocks of other segments
    /// would cost a read each.
    fn blocks_to_record(
        &self,
        probed: &Probed,
        chosen: Option<PodMatch>,
        now_secs: u32,
    ) -> Vec<(u64, u32)> {
        let fresh = chosen
            .filter(|m| now_secs.saturating_sub(m.oldest_access) < self.touch_interval_secs)
            .map_or(0, |m| m.blocks as usize);
        let Some(k) = probed.positions.iter().position(|&i| i >= fresh) else {
            return Vec::new();
        };
        let first_anchor = probed.anchors[k];
        probed
            .positions
            .iter()
            .zip(&probed.anchors)
            .enumerate()
            .filter(|&(j, (_, &a))| j >= k || a == first_anchor)
            .map(|(_, (&i, &a))| (probed.hashes[i], a))
            .collect()
    }
}
