//! One worker VM's side of the fleet-wide placement of new prompts
//! (`sync.place_new`; the Redis side is [`crate::sync::place`]): who may
//! ask now, the members it names its requests by, the releases the tick
//! sends, and the backoff after a failure.
//!
//! Bounds: at most [`MAX_WAITING`] requests of a VM wait for Redis at once
//! (others take the VM's own pick); after a failed or late placement the VM
//! asks nothing for [`BACKOFF_MS`], so a dead Redis costs each VM one
//! timeout a second, not one per request; at most [`MAX_RELEASES`] releases
//! wait for the tick (beyond, the oldest are dropped and counted: their
//! requests stay counted in Redis until this VM is reaped, or its keys go
//! an hour unwritten).

use std::cell::{Cell, RefCell};

use crate::hostcalls::Host;
use crate::route::meter::{Count, Meter};
use crate::sync::place;

/// Requests of one VM waiting for a placement at once (each keeps its
/// prompt meanwhile: 64 MiB at most with 1 MiB bodies).
pub(crate) const MAX_WAITING: u32 = 64;
/// No placement is asked for this long after one failed.
pub(crate) const BACKOFF_MS: u64 = 1_000;
/// Releases kept for the tick.
pub(crate) const MAX_RELEASES: usize = 4_096;
/// Longest wait for the tick's release call.
const RELEASE_TIMEOUT_MS: u64 = 1_000;
/// At most one warning a VM logs about failed placements in this long.
pub(crate) const WARN_EVERY_MS: u64 = 60_000;

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Placer {
    /// This VM's name in Redis (16 hex digits).
    vm: String,
    seq: Cell<u64>,
    waiting: Cell<u32>,
    /// This VM's placed requests in flight.
    placed: Cell<u32>,
    backoff_until_ms: Cell<u64>,
    releases: RefCell<Vec<String>>,
    /// The tick's release call in flight: its token, replies expected and
    /// members (sent again if it fails: a release is idempotent).
    sending: RefCell<Option<(u32, usize, Vec<String>)>>,
    last_beat_ms: Cell<u64>,
    /// When this VM last warned of a failed placement (None: never).
    last_warn_ms: Cell<Option<u64>>,
}

impl Placer {
    /// The placer of the VM named `token` in Redis.
    pub(crate) fn new(token: u64) -> Self {
        Self {
            vm: format!("{token:016x}"),
            ..Self::default()
        }
    }

    pub(crate) fn vm(&self) -> &str {
        &self.vm
    }

    /// Whether a new prompt may ask Redis now (not backing off, fewer
    /// than [`MAX_WAITING`] waiting). Those that may not take the VM's own
    /// pick (`routed.no_match`).
    pub(crate) fn may_ask(&self, now_ms: u64) -> bool {
        now_ms >= self.backoff_until_ms.get() && self.waiting.get() < MAX_WAITING
    }

    /// A new member name for one request (unique to this VM).
    pub(crate) fn next_member(&self) -> String {
        let n = self.seq.get().wrapping_add(1);
        self.seq.set(n);
        format!("{}:{n:x}", self.vm)
    }

    pub(crate) fn wait_started(&self) {
        self.waiting.set(self.waiting.get().saturating_add(1));
    }

    /// A wait ended: `ok` if Redis named a candidate, else the VM backs
    /// off for [`BACKOFF_MS`] from `now_ms` (any failure: timeout, error,
    /// a stale or hostile reply).
    pub(crate) fn wait_ended(&self, ok: bool, now_ms: u64) {
        self.waiting.set(self.waiting.get().saturating_sub(1));
        if !ok {
            self.backoff_until_ms.set(now_ms.saturating_add(BACKOFF_MS));
        }
    }

    /// Whether a failed placement at `now_ms` should be logged at warn
    /// level: the VM's first, then at most one per [`WARN_EVERY_MS`] (the
    /// others are counted in `place.failed` and logged at debug level).
    pub(crate) fn should_warn(&self, now_ms: u64) -> bool {
        let due = self
            .last_warn_ms
            .get()
            .map_or(true, |at| now_ms >= at.saturating_add(WARN_EVERY_MS));
        if due {
            self.last_warn_ms.set(Some(now_ms));
        }
        due
    }

    /// A stream ended while it waited.
    pub(crate) fn abandoned(&self) {
        self.waiting.set(self.waiting.get().saturating_sub(1));
    }

    /// A request went where Redis placed it: in flight until
    /// [`Self::release`]d as placed.
    pub(crate) fn placed(&self) {
        self.placed.set(self.placed.get().saturating_add(1));
    }

    /// Queues the release of `member` for the tick; `placed`: it was
    /// [`Self::placed`].
    pub(crate) fn release(&self, member: String, placed: bool, meter: &Meter) {
        if placed {
            self.placed.set(self.placed.get().saturating_sub(1));
        }
        let mut r = self.releases.borrow_mut();
        if r.len() >= MAX_RELEASES {
            r.remove(0);
            meter.inc(Count::PlaceReleaseDropped);
        }
        r.push(member);
    }

    /// Whether the VM should tick fast: placed requests in flight or
    /// releases to send (a release shows in Redis up to a tick late).
    pub(crate) fn busy(&self) -> bool {
        self.placed.get() > 0 || !self.releases.borrow().is_empty()
    }

    /// The tick: sends the waiting releases, or a heartbeat every
    /// [`place::HEARTBEAT_MS`], when no release call is in flight.
    /// A call unanswered for twice its timeout counts as failed (Envoy
    /// answers every call, a timeout included; this only bounds the wait).
    pub(crate) fn tick<H: Host>(&self, host: &H, sync: &crate::sync::SyncSettings, now_ms: u64) {
        let lost = now_ms
            >= self
                .last_beat_ms
                .get()
                .saturating_add(2 * RELEASE_TIMEOUT_MS);
        if self.sending.borrow().is_some() {
            if !lost {
                return;
            }
            if let Some((_, _, members)) = self.sending.borrow_mut().take() {
                self.requeue(members);
            }
        }
        let due = now_ms >= self.last_beat_ms.get().saturating_add(place::HEARTBEAT_MS);
        if self.releases.borrow().is_empty() && !due {
            return;
        }
        // Cluster mode: no master named yet, the releases wait for one.
        let Ok(node) = place::node(sync, host) else {
            return;
        };
        let members = std::mem::take(&mut *self.releases.borrow_mut());
        let (body, expected) = place::release(sync, now_ms, &self.vm, &members);
        match host.call_bridge(sync, node.as_deref(), &body, RELEASE_TIMEOUT_MS) {
            Some(token) => {
                self.last_beat_ms.set(now_ms);
                *self.sending.borrow_mut() = Some((token, expected, members));
            }
            None => self.requeue(members),
        }
    }

    /// A bridge reply to the root context: true if it was the tick's
    /// release call. A failed one is sent again with the next tick's.
    pub(crate) fn on_reply(&self, token: u32, reply: Option<&[u8]>, meter: &Meter) -> bool {
        let mut sending = self.sending.borrow_mut();
        if !sending.as_ref().is_some_and(|(t, _, _)| *t == token) {
            return false;
        }
        let Some((_, expected, members)) = sending.take() else {
            return false;
        };
        drop(sending);
        if !reply.is_some_and(|r| place::released(r, expected)) {
            meter.inc(Count::PlaceReleaseFailed);
            self.requeue(members);
        }
        true
    }

    fn requeue(&self, mut members: Vec<String>) {
        let mut r = self.releases.borrow_mut();
        members.append(&mut r);
        let over = members.len().saturating_sub(MAX_RELEASES);
        members.drain(..over);
        *r = members;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn failed_placements_warn_first_then_once_a_minute() {
        let p = Placer::new(1);
        assert!(p.should_warn(5_000), "the first");
        assert!(!p.should_warn(5_001));
        assert!(!p.should_warn(5_000 + WARN_EVERY_MS - 1));
        assert!(p.should_warn(5_000 + WARN_EVERY_MS));
        assert!(!p.should_warn(5_000 + WARN_EVERY_MS + 10));
    }
}
