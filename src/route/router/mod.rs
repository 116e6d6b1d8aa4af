//! One routing decision end to end, over the shared store: hash the prompt,
//! find how far each pod's cached prefix reaches, apply the policy, record
//! the blocks for the chosen pod and count it in flight.
//!
//! Reads do not grow with prompt length. Only blocks at *sampled positions*
//! are recorded and probed: every position below `dense_prefix_blocks`, then
//! 8 positions per doubling of the position (so a 400 KB prompt of 3,200
//! blocks records ~90), plus the last block. A pod that holds a sampled block
//! held the whole chain up to it (the hash chain's prefix property), so the
//! longest match per pod is found by galloping then binary search over the
//! sampled positions. One bucket read answers every position of a segment
//! (see [`crate::route::table::Layout`]), so a probe reads at most one
//! bucket per segment it visits, once per request (see
//! [`crate::route::reads`]), capped at [`MAX_PROBES`]. Limits: a
//! match is known to the sampled position just below its true end (within
//! 1/8 of its length past the dense prefix), and an eviction hole inside a
//! chain can make the search stop early.

use std::cell::{Cell, Ref, RefCell};
use std::collections::HashMap;
use std::fmt;

use crate::config::Settings;
use crate::fleet::{self, FleetView, Members};
use crate::rng::SplitMix64;
use crate::route::hashing::BlockHasher;
use crate::route::latency::PodLatency;
use crate::route::load::{Ticket, VmLoad};
use crate::route::policy::{placement_candidates, Choice, PolicyConfig, PoolView, Reason};
use crate::route::prefill::PrefillTiming;
use crate::route::reads::RequestReads;
use crate::route::request::PromptRequest;
use crate::route::table::{Layout, TableConfig, WriteOutcome};
use crate::shared::registry::{
    local_model_id, NameRegistry, PodSlot, CLIENT_SLOTS, MAX_SLOTS, SEEN_EVERY_SECS,
};
use crate::shared::store::{SharedStore, StoreError};
use crate::signals::SignalView;

/// Most table reads one routing decision may do.
pub(crate) const MAX_PROBES: usize = 64;
/// Most probe hints one VM keeps (then they start over).
const MAX_HINTS: usize = 4096;
/// Requests per window of [`Demand`].
const DEMAND_WINDOW: u32 = 256;
/// Fewest requests in [`Demand`]'s two windows before a share is trusted.
const DEMAND_MIN: u32 = 64;

/// Why routing could not decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// The model's pool is empty.
    NoEndpoints,
    /// Shared data failed; the request passes through.
    Store(StoreError),
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::NoEndpoints => write!(f, "no endpoints for this model"),
            RouteError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl From<StoreError> for RouteError {
    fn from(e: StoreError) -> Self {
        RouteError::Store(e)
    }
}

/// A routing decision and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub(crate) choice: Choice,
    /// The request as counted in flight on the chosen pod:
    /// [`Router::release`] takes it back.
    pub ticket: Ticket,
    pub(crate) total_blocks: usize,
    pub(crate) probes: usize,
    /// Model id in the table, None when the request names no model.
    pub(crate) model: Option<u16>,
    /// The blocks written for the chosen pod, (hash, anchor) (sync pushes
    /// these): the sampled blocks past its fresh matched prefix, and the
    /// held ones of the segment where they start.
    pub(crate) recorded: Vec<(u64, u32)>,
    pub(crate) write: WriteOutcome,
    /// Blocks of the prompt the chosen pod was predicted to hold (from the
    /// start), and every block hash of the prompt: what [`crate::route::hold`]
    /// compares with the prefixes in prefill.
    pub(crate) matched: u32,
    pub(crate) hashes: Vec<u64>,
    /// When the chosen pod's match was first recorded (the oldest access
    /// of its blocks, whole seconds; 0 without a match).
    pub(crate) matched_since: u32,
    /// With the load-aware policy, a streamed request sent to a pod with a
    /// free slot (as far as this VM knew) that held none of its prompt by
    /// the table: its blocks, for [`Router::prefill_started`] (which times
    /// it if long enough).
    pub(crate) prefill_blocks: Option<u32>,
}

impl Routed {
    /// Whether the chosen pod was predicted to hold at least
    /// [`HIT_PERCENT`] of the prompt: the request is timed as a hit (pod
    /// slowness) from routing.
    pub fn is_hit(&self) -> bool {
        self.choice.match_percent >= HIT_PERCENT
    }
}

/// Routing state of one VM: settings-derived helpers, the VM's view of the
/// fleet, and a model-id cache.
pub struct Router {
    settings: Settings,
    fleet: RefCell<FleetView>,
    hasher: BlockHasher,
    table: TableConfig,
    layout: Layout,
    policy: PolicyConfig,
    /// Model name -> (table id, when it was last marked seen).
    model_ids: RefCell<HashMap<String, (u16, u32)>>,
    touch_interval_secs: u32,
    /// Rotation among equally loaded pods (see [`crate::route::policy::choose`]).
    turn: Cell<Option<usize>>,
    /// In-flight counts: this VM's, and the others' as of the last tick.
    load: RefCell<VmLoad>,
    /// What the pods reported, as of the last tick (load-aware policy only).
    signals: RefCell<SignalView>,
    /// How long this VM's requests take per pod (load-aware slowness).
    latency: RefCell<PodLatency>,
    /// Recent traffic per prefix group (load-aware hot prefix copies).
    demand: RefCell<Demand>,
    /// (model, first block) -> sampled index where the longest match ended
    /// last time: the probe starts there (see [`probe::longest_matches`]).
    hints: RefCell<HashMap<(u16, u64), u32>>,
    /// How fast each pod prefills, timed by this VM (load-aware slowness).
    prefill: RefCell<PrefillTiming>,
}

impl Router {
    pub fn new(settings: Settings) -> Self {
        Self {
            hasher: BlockHasher::new(settings.block_size, settings.hash_seed),
            table: settings.table_config(),
            layout: settings.table_layout(),
            policy: PolicyConfig {
                imbalance_abs_count: settings.imbalance_abs_count,
                stddev_factor: settings.stddev_factor,
            },
            model_ids: RefCell::new(HashMap::new()),
            fleet: RefCell::new(FleetView::default()),
            touch_interval_secs: touch_interval_secs(&settings),
            turn: Cell::new(None),
            load: RefCell::new(VmLoad::new(0)),
            signals: RefCell::new(SignalView::default()),
            demand: RefCell::new(Demand::default()),
            latency: RefCell::new(PodLatency::default()),
            hints: RefCell::new(HashMap::new()),
            prefill: RefCell::new(PrefillTiming::default()),
            settings,
        }
    }

    /// Whether other worker VMs of this replica were live at the last tick.
    pub(crate) fn other_vms_live(&self) -> bool {
        self.load.borrow().others_live()
    }

    /// The token naming this VM among the replica's worker VMs.
    pub(crate) fn vm_token(&self) -> u64 {
        self.load.borrow().token()
    }

    /// Names this VM's in-flight key (a value unique per VM, see
    /// [`VmLoad::new`]); call once, before the first tick.
    pub(crate) fn with_vm_token(self, token: u64) -> Self {
        *self.load.borrow_mut() = VmLoad::new(token);
        self
    }

    /// The tick's load exchange (see [`VmLoad::refresh`]); returns this
    /// replica's in-flight count per slot, for the gauges.
    pub(crate) fn refresh_load<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        now_ms: u64,
    ) -> Result<Vec<u32>, StoreError> {
        let mut load = self.load.borrow_mut();
        load.refresh(store, now_ms, self.settings.sync.enabled)?;
        Ok(load.replica(self.fleet.borrow().bound()))
    }

    /// This replica's in-flight counts as this VM last saw them (its own
    /// exactly, the other VMs' as of its last read).
    #[cfg(test)]
    pub(crate) fn replica_load(&self) -> Vec<u32> {
        self.load.borrow().replica(self.fleet.borrow().bound())
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Replaces the pods' signals with the value the singleton published
    /// (read on the tick; see [`crate::signals`]), keeping what was learned
    /// of each pod's capacity.
    pub(crate) fn set_signals(&self, bytes: &[u8], now_ms: u64, stale_ms: u64) {
        let load = self.load.borrow();
        self.signals
            .borrow_mut()
            .update(bytes, now_ms, stale_ms, |pod, at| load.peak_since(pod, at));
    }

    /// This VM's view of the fleet (members, health, cooldowns).
    pub(crate) fn fleet(&self) -> Ref<'_, FleetView> {
        self.fleet.borrow()
    }

    /// Replaces the members (published by the singleton, or built from
    /// static pools), keeping the cooldowns.
    pub(crate) fn set_members(&self, members: Members) {
        self.fleet.borrow_mut().set_members(members);
    }

    pub(crate) fn set_down(&self, down: Vec<(PodSlot, u64)>) {
        self.fleet.borrow_mut().set_down(down);
    }

    /// Whether every pool is a static list (this VM builds its own members
    /// then; cluster pools are published by the singleton).
    pub(crate) fn all_static(&self) -> bool {
        self.settings.cluster_pools().is_empty()
    }

    /// Builds the members of static pools, registering their names (a CAS
    /// write only when one is new, or at most once a minute to mark them
    /// still in use). No-op with cluster pools.
    pub(crate) fn refresh_static<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        now_secs: u32,
    ) -> Result<(), StoreError> {
        if !self.all_static() {
            return Ok(());
        }
        let members = fleet::static_members(
            store,
            &self.settings.static_pools(),
            now_secs,
            self.settings.retire_secs(),
        )?;
        self.set_members(members);
        Ok(())
    }

    /// Table id of a model name: its registry slot, registering it if new
    /// (a configured pool's model whenever a slot is free or retired, a
    /// client's only within [`CLIENT_SLOTS`]), else its [`local_model_id`]
    /// (see [`crate::shared::registry`]). `None` when the request names no
    /// model. Cached, and looked up again (marking it seen in the registry)
    /// at most once a minute: a slot is given to another model only after
    /// it has not been seen for `retire_secs`, so a cached slot is always
    /// still this model's, and a model under its local id takes a slot
    /// within a minute of one freeing up.
    pub(crate) fn model_id<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        model: &str,
        now_secs: u32,
    ) -> Result<Option<u16>, StoreError> {
        if model.is_empty() {
            return Ok(None);
        }
        if let Some((id, seen)) = self.model_ids.borrow().get(model) {
            if now_secs.saturating_sub(*seen) < SEEN_EVERY_SECS {
                return Ok(Some(*id));
            }
        }
        let limit = if self.settings.pools.contains_key(model) {
            MAX_SLOTS
        } else {
            CLIENT_SLOTS
        };
        let (ids, _) = NameRegistry::models(store).intern_within(
            &[model],
            now_secs,
            self.settings.retire_secs(),
            limit,
        )?;
        let id = ids
            .first()
            .copied()
            .flatten()
            .unwrap_or_else(|| local_model_id(model));
        let mut cache = self.model_ids.borrow_mut();
        // Bounded like the registry itself.
        if cache.len() >= MAX_SLOTS {
            cache.clear();
        }
        cache.insert(model.to_string(), (id, now_secs));
        Ok(Some(id))
    }

    /// [`Self::route_at`] with the clock in whole seconds.
    pub fn route<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        req: &PromptRequest,
        now_secs: u32,
        rng: &mut SplitMix64,
    ) -> Result<Routed, RouteError> {
        self.route_at(store, req, u64::from(now_secs) * 1000, rng)
    }

    /// Routes one request at `now_ms` (unix ms), records its blocks for the
    /// chosen pod and counts it in flight; the caller must release it with
    /// [`Router::release`] when the stream ends.
    pub(crate) fn route_at<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        req: &PromptRequest,
        now_ms: u64,
        rng: &mut SplitMix64,
    ) -> Result<Routed, RouteError> {
        match self.route_placed(store, req, now_ms, rng, Place::Local)? {
            Outcome::Routed(r) => Ok(r),
            Outcome::Ask { .. } => Err(RouteError::NoEndpoints),
        }
    }

    /// [`Self::route_at`], with a fleet-wide placement (`sync.place_new`):
    /// with [`Place::Ask`], a new prompt under the load-aware policy (no pod
    /// of the pool holds any of it) is neither recorded nor counted; its
    /// candidates come back ([`crate::route::policy::placement_candidates`])
    /// for Redis to choose from, with the decision for [`Self::resume`].
    pub(crate) fn route_placed<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        req: &PromptRequest,
        now_ms: u64,
        rng: &mut SplitMix64,
        place: Place,
    ) -> Result<Outcome, RouteError> {
        let now_secs = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX);
        self.ensure_members(store, now_secs)?;
        // The write after the probe reuses its reads of the same buckets.
        let reads = RequestReads::new(store, self.table, now_secs);
        let probed = self.probe_prompt(store, &reads, req, now_secs)?;
        let decision = self.decide(store, &probed, now_ms, rng)?;
        if place == Place::Ask && decision.choice.reason == Reason::NoMatch {
            if let Some(view) = &decision.view {
                let pods = self.candidates(view, decision.choice.pod);
                let family = placing::family_of(&req.model, &probed.hashes)
                    .map(|f| (f, claim_record(&probed.hashes)));
                let pending = Box::new(Pending {
                    model: req.model.clone(),
                    probed,
                    choice: decision.choice,
                    view: decision.view,
                });
                return Ok(Outcome::Ask {
                    pods,
                    family,
                    pending,
                });
            }
        }
        Ok(Outcome::Routed(self.record(
            store, &reads, probed, decision, &req.model, now_ms,
        )))
    }

    /// Finishes a decision that asked Redis ([`Outcome::Ask`]): to `forced`,
    /// the pod Redis chose, when it is still routable, else to the worker's
    /// own pick; recorded and counted there. Nothing is hashed or probed
    /// again.
    pub(crate) fn resume<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        pending: Pending,
        forced: Option<PodSlot>,
        now_ms: u64,
    ) -> Routed {
        let now_secs = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX);
        let Pending {
            model,
            probed,
            mut choice,
            view,
        } = pending;
        let pool = self
            .fleet
            .borrow()
            .routable(self.settings.pool_key(&model), now_ms);
        placing::settle(&mut choice, forced, &probed, &pool);
        let load = self.load.borrow().fleet(self.fleet.borrow().bound());
        let decision = steps::Decision { choice, view, load };
        let reads = RequestReads::new(store, self.table, now_secs);
        self.record(store, &reads, probed, decision, &model, now_ms)
    }

    /// Where a new prompt may be placed, the worker's own pick `own` first
    /// (it wins Redis's ties).
    fn candidates(&self, view: &PoolView, own: PodSlot) -> Vec<(PodSlot, i64, i64)> {
        let mut pods = placement_candidates(&self.settings.load_aware, view);
        if let Some(i) = pods.iter().position(|&(p, _, _)| p == own) {
            pods[..=i].rotate_right(1);
        }
        pods
    }

    /// Releases one in-flight request, `ticket` (its [`Routed::ticket`];
    /// `timed_hit`: it was
    /// routed as a hit, [`Routed::is_hit`], and timed as one to the end, not
    /// taken back by [`Self::untime_hit`]), and (while other VMs of the
    /// replica are live) writes this VM's counts for them at `now_ms` (unix
    /// ms, the clock of [`Self::route_at`]), one set; returns this VM's new
    /// count.
    pub fn release<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        ticket: Ticket,
        timed_hit: bool,
        now_ms: u64,
    ) -> u32 {
        self.latency.borrow_mut().completed(ticket.pod, timed_hit);
        let mut load = self.load.borrow_mut();
        let left = load.end(ticket);
        load.publish(store, now_ms);
        left
    }
}

/// Recent requests per prefix group ((model, first block)) and in all,
/// over the current and the previous window of [`DEMAND_WINDOW`] requests
/// of this VM: a group's share of traffic. Bounded by [`MAX_HINTS`] groups
/// (then it starts over).
#[derive(Debug, Default)]
struct Demand {
    window: u64,
    in_window: u32,
    previous: u32,
    /// Group -> (window of `current`, requests in it, in the one before).
    groups: HashMap<(u16, u64), (u64, u32, u32)>,
}

impl Demand {
    /// Counts one request of `group`; its share of the two windows' requests,
    /// None until they hold [`DEMAND_MIN`].
    fn count(&mut self, group: (u16, u64)) -> Option<f64> {
        if self.in_window >= DEMAND_WINDOW {
            self.window += 1;
            self.previous = self.in_window;
            self.in_window = 0;
        }
        self.in_window += 1;
        if self.groups.len() >= MAX_HINTS && !self.groups.contains_key(&group) {
            self.groups.clear();
        }
        let window = self.window;
        let g = self.groups.entry(group).or_insert((window, 0, 0));
        if g.0 != window {
            let previous = if g.0 + 1 == window { g.1 } else { 0 };
            *g = (window, 0, previous);
        }
        g.1 += 1;
        let total = self.in_window + self.previous;
        (total >= DEMAND_MIN).then(|| f64::from(g.1 + g.2) / f64::from(total))
    }
}

/// A request routed to a pod holding at least this share of its prompt is
/// a hit, timed apart for [`speed::slowness`].
pub(crate) const HIT_PERCENT: u8 = 50;

/// How long a recorded block counts as fresh: a quarter of the shortest
/// lifetime it must survive (idle expiry; Redis TTL when syncing), at most 60 s.
fn touch_interval_secs(s: &Settings) -> u32 {
    let mut life = s.table_idle_expiry_secs;
    if s.sync.enabled {
        life = life.min(u32::try_from(s.sync.effective_ttl_secs()).unwrap_or(u32::MAX));
    }
    (life / 4).clamp(1, 60)
}

pub(crate) mod explain;
mod learning;
mod placing;
mod probe;
mod speed;
mod steps;

#[cfg(test)]
use placing::family_of;
pub use placing::{claim_record, shared_with_claim, FAMILY_BLOCKS};
pub(crate) use placing::{Family, Outcome, Pending, Place};
pub use probe::sampled_positions;

#[cfg(test)]
pub(crate) mod tests;
