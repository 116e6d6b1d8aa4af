//! What the router learns of each pod as requests pass: how fast its
//! requests and prefills are ([`crate::route::latency::PodLatency`],
//! [`crate::route::prefill::PrefillTiming`], turned into the load-aware
//! slowness by `speed`). The worker's tick and the
//! stream's callbacks feed it; [`Router::route`] reads it.

use crate::shared::registry::PodSlot;
use crate::shared::store::{SharedStore, StoreError};

use super::speed::slowness;
use super::Router;

impl Router {
    /// Every tick (fast ones too): adds this VM's requests in flight to
    /// their pods' time (see [`crate::route::latency::PodLatency::tick`]), and reads the prefills
    /// timed so far (see [`crate::route::prefill::PrefillTiming::tick`]).
    pub(crate) fn tick_latency(&self, now_ms: u64) {
        self.latency
            .borrow_mut()
            .tick(self.load.borrow().own(), now_ms);
        self.prefill.borrow_mut().tick(now_ms);
    }

    /// Times stream `stream`'s prefill of `blocks` uncached blocks on
    /// `pod`, sent at `now_ms`, until [`Self::prefill_answered`] or
    /// [`Self::prefill_ended`]; false when it is not timed.
    pub(crate) fn prefill_started(
        &self,
        stream: u32,
        pod: PodSlot,
        blocks: u32,
        now_ms: u64,
    ) -> bool {
        self.prefill.borrow_mut().start(stream, pod, blocks, now_ms)
    }

    /// Stream `stream`'s first answer bytes, at `now_ms`.
    pub(crate) fn prefill_answered(&self, stream: u32, now_ms: u64) {
        self.prefill.borrow_mut().answered(stream, now_ms);
    }

    /// Stream `stream` ended before any answer bytes.
    pub(crate) fn prefill_ended(&self, stream: u32) {
        self.prefill.borrow_mut().ended(stream);
    }

    /// Exchanges what the prefill timing reads with the replica's other
    /// worker VMs (see [`crate::route::prefill::PrefillTiming::share`]).
    pub(crate) fn share_prefill<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.prefill.borrow_mut().share(store, now_ms)
    }

    /// How long `pod` takes per uncached block, µs, by this VM's prefill
    /// timing (see [`crate::route::prefill::PrefillTiming::us_per_block`]).
    pub(crate) fn prefill_us_per_block(&self, pod: PodSlot) -> Option<u64> {
        self.prefill.borrow().us_per_block(pod)
    }

    /// Whether this VM has timed a prefill on any pod (else a claim's
    /// follower has nothing to wait by).
    pub(crate) fn prefill_timed_any(&self) -> bool {
        self.prefill.borrow().timed_any()
    }

    /// Whether this VM is timing a prefill.
    pub(crate) fn prefills_open(&self) -> bool {
        self.prefill.borrow().any_open()
    }

    /// Each member's slowness as the load-aware policy would weigh it
    /// against all members (see [`slowness`]), indexed by slot; empty when
    /// nothing is measured yet.
    pub(crate) fn member_slowness(&self) -> Vec<u32> {
        let pool: Vec<PodSlot> = self.fleet.borrow().all().map(|(slot, _, _)| slot).collect();
        let prefill = self.prefill.borrow();
        slowness(
            &self.latency.borrow(),
            &self.signals.borrow(),
            prefill.slowness(),
            &pool,
        )
        .0
    }

    /// Whether `pod` had a slot free before this request, as far as this
    /// VM knew: this replica's requests there plus the report's foreign
    /// ones (else every count this VM knows, `load`) below the most the
    /// pod was seen running at once (at least 1). A prefill is timed only
    /// there, so that a queue the router knew of is not read as slowness.
    pub(super) fn had_free_slot(&self, pod: PodSlot, load: &[u32]) -> bool {
        let i = pod.index();
        let signals = self.signals.borrow();
        let known = match signals.seen(pod) {
            Some(seen) => self
                .load
                .borrow()
                .replica_at(i)
                .saturating_add(seen.foreign),
            None => load.get(i).copied().unwrap_or(0),
        };
        known < signals.capacity(pod).max(1)
    }

    /// A hit on `pod` waits for another request's prefill (`hold`): its
    /// time is not timed as a hit's, since waiting is not the pod's speed
    /// (the pod that takes new prefixes would read slower than the others
    /// and lose ties on its matches). Release it with `timed_hit` false.
    pub(crate) fn untime_hit(&self, pod: PodSlot) {
        self.latency.borrow_mut().cancel_hit(pod);
    }

    /// This VM's hits on `pod` timed now, and those timed to their end
    /// (in the current window).
    #[cfg(test)]
    pub(crate) fn hits_timed(&self, pod: PodSlot) -> (u32, u32) {
        self.latency.borrow().hits_timed(pod)
    }
}
