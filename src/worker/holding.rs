//! The worker's side of `hold` ([`crate::route::hold`]): whether a routed
//! stream waits for an earlier prefill of its prefix, who answered, and the
//! prefill timing that rides on the same callbacks.

use super::*;
use crate::route::router::shared_with_claim;
use crate::sync::place::Followed;

impl Worker {
    /// After stream `stream` was routed (`r`), with `hold.enabled`: tells
    /// whether it must wait because an earlier request is still computing
    /// part of its match on that pod (see [`crate::route::hold`]): one of
    /// this VM, else, while other worker VMs are live and the match is
    /// young, one another VM listed. When its answer is `streamed` (only
    /// then do its first answer bytes mark its prefill done), remembers the
    /// blocks it makes its pod compute when they are many, and lists them
    /// for the other VMs. `followed`: the family claim its placement
    /// followed, whose prefill on another replica it may wait for instead
    /// (see [`Self::claim_wait`]). `held`: the stream waits until
    /// [`Self::answered`] or a tick resumes it. `computing`: call
    /// [`Self::answered`] at its first answer bytes or its end.
    pub(crate) fn hold<H: Host>(
        &self,
        host: &H,
        stream: u32,
        r: &Routed,
        streamed: bool,
        followed: Option<&Followed>,
    ) -> HoldOutcome {
        let mut out = HoldOutcome::default();
        let cfg = &self.settings().hold;
        let Some(model) = r.model.filter(|_| cfg.enabled) else {
            return out;
        };
        let now_nanos = self.clock_nanos(host);
        let now_ms = now_nanos / 1_000_000;
        let mut holds = self.holds.borrow_mut();
        // Who computes its match, found before this stream is remembered.
        let mut owner = self.prefill_owner(host, &holds, r, model, now_nanos);
        if streamed {
            out.computing = self.remember_computing(host, &mut holds, stream, r, model, now_ms);
        }
        let mut deadline = now_ms + u64::from(cfg.max_ms);
        if owner.is_none() {
            if let Some(wait) = followed.and_then(|f| self.claim_wait(f, r.choice.pod, &r.hashes)) {
                owner = Some(Owner::Claim);
                // The host's clock (one read): the tick's may be a tick
                // old, and this wait is a prefill's, not `max_ms`.
                deadline = host.now_nanos() / 1_000_000 + wait;
            }
        }
        let Some(owner) = owner else {
            return out;
        };
        if holds.wait(stream, owner, deadline, cfg.max_waiting as usize) {
            self.meter.inc(Count::Held);
            match owner {
                Owner::Shared { .. } => self.meter.inc(Count::HeldForOtherVm),
                Owner::Claim => self.meter.inc(Count::HeldForClaim),
                Owner::Local(_) => {}
            }
            out.held = true;
        } else {
            self.meter.inc(Count::HoldRefused);
        }
        out
    }

    /// The earlier request computing part of `r`'s match on its pod: one
    /// of this VM, else, while other worker VMs are live and the match is
    /// young, one another VM listed (one get).
    fn prefill_owner<H: Host>(
        &self,
        host: &H,
        holds: &Holds,
        r: &Routed,
        model: u16,
        now_nanos: u64,
    ) -> Option<Owner> {
        let pod = r.choice.pod;
        let matched = r.matched as usize;
        if let Some(local) = holds.computing_for(pod, model, &r.hashes, matched) {
            return Some(Owner::Local(local));
        }
        let max_ms = self.settings().hold.max_ms;
        let young = secs(now_nanos).saturating_sub(r.matched_since) <= hold::young_secs(max_ms);
        if !(self.router.other_vms_live() && matched > 0 && young) {
            return None;
        }
        let Ok((Some(bytes), _)) = host.get(hold::SHARED_KEY) else {
            return None;
        };
        let listed = hold::decode_shared(&bytes, now_nanos / 1_000_000);
        let token = self.router.vm_token();
        hold::find_shared(&listed, token, pod, model, &r.hashes, matched)
    }

    /// Remembers the blocks streamed request `stream` makes its pod compute,
    /// when they are many, and lists them for the other worker VMs while
    /// any are live. True when remembered: its first answer bytes or its
    /// end must call [`Self::answered`].
    fn remember_computing<H: Host>(
        &self,
        host: &H,
        holds: &mut Holds,
        stream: u32,
        r: &Routed,
        model: u16,
        now_ms: u64,
    ) -> bool {
        let pod = r.choice.pod;
        let matched = r.matched as usize;
        let Remembered::Yes(forgot) = holds.computing(stream, pod, model, &r.hashes, matched)
        else {
            return false;
        };
        if let Some(f) = forgot {
            // Rare (64 long prefills in progress on one VM): the requests
            // held for the forgotten one go on now.
            for waiter in &f.waiters {
                host.resume_request(*waiter, stream);
            }
            self.meter.add(Count::HoldTimedOut, f.waiters.len() as u64);
            if f.shared {
                let token = self.router.vm_token();
                if hold::withdraw_shared(host, token, f.owner, now_ms).is_err() {
                    self.meter.inc(Count::HoldShareFailed);
                }
            }
        }
        // Remembered, so the prompt has a block at `matched`.
        if let (true, Some(&hash)) = (self.router.other_vms_live(), r.hashes.get(matched)) {
            let entry = SharedEntry {
                token: self.router.vm_token(),
                stream,
                pod,
                model,
                at: u32::try_from(matched).unwrap_or(u32::MAX),
                hash,
                until_ms: now_ms + u64::from(self.settings().hold.max_ms),
            };
            match hold::list_shared(host, entry, now_ms) {
                Ok(()) => holds.mark_shared(stream),
                Err(_) => self.meter.inc(Count::HoldShareFailed),
            }
        }
        true
    }

    /// How long (ms) a request sent to `pod` by its family's claim
    /// (`followed`) waits for the prefill of the prompt that set the claim,
    /// on another replica: that prompt's blocks at this VM's prefill time
    /// per block on `pod`, plus a sixteenth, less the claim's age. None
    /// when not worth it: no block shared, no prefill timed yet, that
    /// prefill due already, over `hold.max_ms`, or the wait and a fast tick
    /// (which resumes it) not shorter than computing the shared blocks
    /// itself would take (then it would wait longer for its first token
    /// than it takes to compute them: a follower sent right after the
    /// claim goes at once).
    fn claim_wait(&self, followed: &Followed, pod: PodSlot, hashes: &[u64]) -> Option<u64> {
        let (shared, total) = shared_with_claim(&followed.record, hashes)?;
        let us = self.router.prefill_us_per_block(pod)?;
        let prefill_ms = (total as u64).saturating_mul(us) / 1_000;
        let left = prefill_ms.checked_sub(followed.age_ms).filter(|&l| l > 0)?;
        let saves_ms = (shared as u64).saturating_mul(us) / 1_000;
        let wait = left.saturating_add(prefill_ms / 16);
        let worth = wait.saturating_add(u64::from(FAST_TICK_MS)) < saves_ms;
        (worth && wait <= u64::from(self.settings().hold.max_ms)).then_some(wait)
    }

    /// Stream `stream`, which made its pod compute blocks, answered (its
    /// first answer bytes passed) or ended: the requests this VM holds for
    /// it go on, and its listing for the other VMs is withdrawn. Called in
    /// that stream's own callback.
    pub(crate) fn answered<H: Host>(&self, host: &H, stream: u32) {
        let (resumed, shared) = self.holds.borrow_mut().answered(stream);
        for waiter in &resumed {
            host.resume_request(*waiter, stream);
        }
        self.meter.add(Count::HoldAnswered, resumed.len() as u64);
        if shared {
            let now_ms = self.clock_nanos(host) / 1_000_000;
            let token = self.router.vm_token();
            if hold::withdraw_shared(host, token, stream, now_ms).is_err() {
                // Void by its end anyway (`hold.max_ms`).
                self.meter.inc(Count::HoldShareFailed);
            }
        }
    }

    /// Times stream `stream`'s prefill of `blocks` uncached blocks on `pod`
    /// from now (one clock read, only when it is long enough to be timed;
    /// see [`crate::route::prefill`]). Whether it is timed.
    pub(crate) fn prefill_started<H: Host>(
        &self,
        host: &H,
        stream: u32,
        pod: PodSlot,
        blocks: u32,
    ) -> bool {
        if blocks < prefill::MIN_BLOCKS {
            return false;
        }
        let now_ms = host.now_nanos() / 1_000_000;
        self.router.prefill_started(stream, pod, blocks, now_ms)
    }

    /// A timed prefill's first answer bytes (one clock read).
    pub(crate) fn prefill_answered<H: Host>(&self, host: &H, stream: u32) {
        self.router
            .prefill_answered(stream, host.now_nanos() / 1_000_000);
    }

    /// Whether the pod answered 200 (`response.code`, one property read).
    pub(crate) fn answer_ok<H: Host>(&self, host: &H) -> bool {
        int_property(host, &["response", "code"]) == Some(200)
    }

    /// A timed prefill's stream ended before any answer bytes, or its
    /// answer is not a 200.
    pub(crate) fn prefill_ended(&self, stream: u32) {
        self.router.prefill_ended(stream);
    }

    /// A held stream ended before it was resumed.
    pub(crate) fn left_hold(&self, stream: u32) {
        self.holds.borrow_mut().left(stream);
    }

    /// Resumes the held requests whose `hold.max_ms` is up, and those whose
    /// other-VM prefill is no longer listed (one get while any waits for
    /// one).
    pub(super) fn tick_holds<H: Host>(&self, host: &H, now_ms: u64) {
        let root = self.root_context.get();
        let (expired, claims) = self.holds.borrow_mut().expired(now_ms);
        for waiter in &expired {
            host.resume_request(*waiter, root);
        }
        // A claim's wait ends at its deadline by design.
        self.meter
            .add(Count::HoldTimedOut, (expired.len() - claims) as u64);
        if !self.holds.borrow().waits_on_shared() {
            return;
        }
        let listed = match host.get(hold::SHARED_KEY) {
            Ok((bytes, _)) => hold::decode_shared(&bytes.unwrap_or_default(), now_ms),
            // Unreadable: they wait for their deadline.
            Err(_) => return,
        };
        let done = self.holds.borrow_mut().shared_done(&listed);
        for waiter in &done {
            host.resume_request(*waiter, root);
        }
        self.meter.add(Count::HoldAnswered, done.len() as u64);
    }
}
