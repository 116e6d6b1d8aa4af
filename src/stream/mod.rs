//! One HTTP stream through the filter, as a state machine over [`Host`]:
//! headers (classify, hold), body (buffer, route, name the pod, perhaps
//! wait for an earlier prefill of the prefix: [`crate::route::hold`]),
//! response headers (match header), first answer bytes (resume the requests
//! waiting for this prefill), end of stream (release the in-flight count,
//! passive health). The `host` module forwards Envoy's callbacks here; the
//! tests drive it with a host double that counts every hostcall.
//!
//! Every failure passes the request on untouched and is counted by reason.

use crate::hostcalls::Host;
use crate::route::load::Ticket;
use crate::route::meter::{Count, SAMPLE_EVERY};
use crate::route::request::{classify, parse_body_as, ApiKind, PassReason};
use crate::route::router::{Family, Outcome, Pending, Place, RouteError, Routed};
use crate::shared::registry::PodSlot;
use crate::sync::place::{self, Candidate, Followed, PlaceError};
use crate::worker::Worker;

/// Header read by Envoy's `override_host` LB policy (Gateway API Inference
/// Extension endpoint-picker protocol).
pub(crate) const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Header read by an `ORIGINAL_DST` cluster with `use_http_header: true`.
pub(crate) const ORIGINAL_DST_HEADER: &str = "x-envoy-original-dst-host";

/// What Envoy should do with the stream after a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Continue,
    /// Hold the headers until the body is read (needs
    /// `allow_on_headers_stop_iteration: true` in the plugin config).
    Pause,
}

/// The request headers the filter reads, from one read of the whole map.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RequestHead {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) content_length: Option<usize>,
    /// A client sent a destination header (it is removed, never honoured).
    pub(crate) has_destination: bool,
    pub(crate) has_original_dst: bool,
}

impl RequestHead {
    /// Decodes the proxy-wasm header map encoding: a `u32` count, then a
    /// `u32` name length and value length per pair, then each name and value
    /// followed by a NUL. None if it is malformed. A value that is not UTF-8
    /// reads as empty.
    pub(crate) fn decode(bytes: &[u8]) -> Option<RequestHead> {
        let mut head = RequestHead::default();
        if bytes.is_empty() {
            return Some(head);
        }
        let u32_at = |at: usize| -> Option<usize> {
            let b = bytes.get(at..at.checked_add(4)?)?;
            usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok()
        };
        let count = u32_at(0)?;
        let mut data = count.checked_mul(8)?.checked_add(4)?;
        if data > bytes.len() {
            return None;
        }
        for i in 0..count {
            let name_len = u32_at(4 + i * 8)?;
            let value_len = u32_at(8 + i * 8)?;
            let name = bytes.get(data..data.checked_add(name_len)?)?;
            data = data.checked_add(name_len)?.checked_add(1)?;
            let value = bytes.get(data..data.checked_add(value_len)?)?;
            data = data.checked_add(value_len)?.checked_add(1)?;
            let text = || std::str::from_utf8(value).unwrap_or("").to_string();
            if name.eq_ignore_ascii_case(b":method") {
                head.method = text();
            } else if name.eq_ignore_ascii_case(b":path") {
                head.path = text();
            } else if name.eq_ignore_ascii_case(b"content-length") {
                head.content_length = text().parse().ok();
            } else if name.eq_ignore_ascii_case(DESTINATION_HEADER.as_bytes()) {
                head.has_destination = true;
            } else if name.eq_ignore_ascii_case(ORIGINAL_DST_HEADER.as_bytes()) {
                head.has_original_dst = true;
            }
        }
        Some(head)
    }
}

/// One stream's state, grouped by the feature that owns it.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    /// Envoy's context id of this stream (what a resume names).
    id: u32,
    /// Set while a body is awaited.
    kind: Option<ApiKind>,
    /// Where the request went, once routed.
    sent: Sent,
    /// `hold`: whether others wait for this stream's prefill, or it for another's.
    hold: Holding,
    /// `sync.place_new`: the placement this stream waits for, or got.
    placement: Placement,
    /// What of this request is timed for the pods' speed.
    timing: Timing,
    /// The filter's own answer (table inspection), sent instead of
    /// forwarding the request.
    answer: Option<Answer>,
}

/// A request the filter answers itself, never sent upstream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: u32,
    pub(crate) body: Vec<u8>,
}

/// Where a routed request went.
#[derive(Debug, Default)]
struct Sent {
    /// The request as counted in flight on its pod
    /// ([`crate::route::router::Routed::ticket`]), released exactly once.
    inflight: Option<Ticket>,
    /// Its pod and address, for the passive health check at the end, and
    /// whether that check reads the upstream address even without a retry
    /// (1 request in [`SAMPLE_EVERY`], not the timed one).
    to: Option<(PodSlot, String, bool)>,
    /// The share of the prompt its pod was predicted to hold (match header).
    match_percent: Option<u8>,
}

/// The stream's side of `hold` ([`crate::route::hold`]).
#[derive(Debug, Default)]
struct Holding {
    /// Others may wait for this stream's first answer bytes.
    computing: bool,
    /// This stream waits for another's prefill.
    held: bool,
}

/// The stream's side of a fleet-wide placement (`sync.place_new`).
#[derive(Debug, Default)]
struct Placement {
    /// A new prompt waiting for Redis to place it.
    waiting: Option<Box<Placing>>,
    /// Its member in Redis once placed there, released at the end.
    member: Option<String>,
}

/// What of the request is timed for the pods' speed.
#[derive(Debug, Default)]
struct Timing {
    /// Timed as a hit to its end ([`crate::route::router::Routed::is_hit`]
    /// and not held).
    hit: bool,
    /// Its prefill is timed until its first answer bytes
    /// ([`crate::route::prefill`]).
    prefill: bool,
}

/// A request waiting for its placement.
#[derive(Debug)]
struct Placing {
    /// The bridge call's token, and the replies it expects.
    token: u32,
    expected: usize,
    member: String,
    /// The pods asked about, and their addresses as sent.
    pods: Vec<PodSlot>,
    candidates: Vec<Candidate>,
    /// The decision Redis's answer finishes (the prompt is not kept).
    pending: Pending,
    facts: RouteFacts,
    /// When the call was made (ns), for `place.wait_us`.
    asked_nanos: u64,
}

/// How a request was routed, for what follows its routing.
#[derive(Debug, Clone, Copy)]
struct RouteFacts {
    /// The answer streams (hold and prefill timing read it).
    stream: bool,
    /// Passive health reads the upstream address even without a retry.
    check_address: bool,
    /// When routing started (ns), for the timed request of a cycle.
    timed_from: Option<u64>,
}

impl Stream {
    /// The stream of Envoy context `id`.
    pub(crate) fn new(id: u32) -> Self {
        Self {
            id,
            ..Self::default()
        }
    }

    /// The answer to send in place of forwarding, once (see [`Answer`]).
    pub(crate) fn take_answer(&mut self) -> Option<Answer> {
        self.answer.take()
    }

    /// Table inspection: true (and the answer set) when `head` asks for it
    /// on a listener whose filter chain `inspect.filter_chain` names. Only
    /// a request on the inspect path reads the chain's name: one hostcall.
    fn inspect<H: Host>(&mut self, w: &Worker, host: &H, head: &RequestHead) -> bool {
        let settings = &w.settings().inspect;
        let crate::inspect::Ask::Inspect { get, from } =
            crate::inspect::ask(settings, &head.method, &head.path)
        else {
            return false;
        };
        let chain = host.property(&["xds", "filter_chain_name"]);
        if chain.as_deref() != Some(settings.filter_chain.as_bytes()) {
            return false;
        }
        self.answer = Some(if get {
            let now = crate::worker::secs(host.now_nanos());
            let view = crate::inspect::view(
                host,
                &w.settings().table_config(),
                settings.max_buckets,
                from,
                now,
            );
            Answer {
                status: if view.is_ok() { 200 } else { 500 },
                body: crate::inspect::body(&view),
            }
        } else {
            Answer {
                status: 405,
                body: b"{\"error\":\"GET only\"}".to_vec(),
            }
        });
        true
    }

    pub(crate) fn on_request_headers<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        end_of_stream: bool,
    ) -> Verdict {
        w.meter.inc(Count::Requests);
        // A client must never pick the upstream itself (with ORIGINAL_DST that
        // would let it reach any host): drop both headers before anything
        // else. One read of the whole map tells whether they are there.
        let head = host.request_headers().and_then(|b| RequestHead::decode(&b));
        let Some(head) = head else {
            host.remove_request_header(DESTINATION_HEADER);
            host.remove_request_header(ORIGINAL_DST_HEADER);
            return self.pass(w, host, PassReason::InternalError);
        };
        if head.has_destination {
            host.remove_request_header(DESTINATION_HEADER);
        }
        if head.has_original_dst {
            host.remove_request_header(ORIGINAL_DST_HEADER);
        }
        if self.inspect(w, host, &head) {
            return Verdict::Pause;
        }
        let kind = match classify(&head.method, &head.path) {
            Ok(kind) => kind,
            Err(reason) => return self.pass(w, host, reason),
        };
        if end_of_stream {
            return self.pass(w, host, PassReason::NoPrompt);
        }
        if head
            .content_length
            .is_some_and(|n| n > w.settings().max_body_bytes)
        {
            return self.pass(w, host, PassReason::BodyTooLarge);
        }
        self.kind = Some(kind);
        Verdict::Pause
    }

    pub(crate) fn on_request_body<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        body_size: usize,
        end_of_stream: bool,
    ) -> Verdict {
        let Some(kind) = self.kind else {
            return Verdict::Continue;
        };
        if body_size > w.settings().max_body_bytes {
            return self.pass(w, host, PassReason::BodyTooLarge);
        }
        if !end_of_stream {
            return Verdict::Pause;
        }
        self.kind = None;
        let Some(body) = host.request_body(body_size) else {
            return self.pass(w, host, PassReason::InternalError);
        };
        self.finish(w, host, kind, &body)
    }

    /// The body ended with trailers (no end_of_stream on its last frame).
    pub(crate) fn on_request_trailers<H: Host>(&mut self, w: &Worker, host: &H) -> Verdict {
        if let Some(kind) = self.kind.take() {
            match host.request_body(w.settings().max_body_bytes) {
                Some(body) => return self.finish(w, host, kind, &body),
                None => self.count_pass(w, host, PassReason::InternalError),
            }
        }
        Verdict::Continue
    }

    pub(crate) fn on_response_headers<H: Host>(&mut self, w: &Worker, host: &H) {
        if let (Some(name), Some(pct)) = (&w.settings().match_header, self.sent.match_percent) {
            host.set_response_header(name, &pct.to_string());
        }
        // Only a 200's first bytes end a prefill: an error answer's come
        // at once, and would read as the fastest pod (one property read,
        // only for a timed prefill).
        if self.timing.prefill && !w.answer_ok(host) {
            self.timing.prefill = false;
            w.prefill_ended(self.id);
        }
    }

    /// A chunk of the answer passes (never held, never read): its first
    /// bytes end this stream's prefill, for those waiting on it and for the
    /// prefill timing.
    pub(crate) fn on_response_body<H: Host>(&mut self, w: &Worker, host: &H, body_size: usize) {
        if body_size == 0 {
            return;
        }
        if self.hold.computing {
            // Its prefill is done: the prefix is cached on its pod.
            self.hold.computing = false;
            w.answered(host, self.id);
        }
        if self.timing.prefill {
            self.timing.prefill = false;
            w.prefill_answered(host, self.id);
        }
    }

    /// The stream is done (Envoy calls this before the access log).
    pub(crate) fn on_done<H: Host>(&mut self, w: &Worker, host: &H) {
        if std::mem::take(&mut self.hold.computing) {
            // Ended before any answer bytes: whoever waits goes on.
            w.answered(host, self.id);
        }
        if std::mem::take(&mut self.hold.held) {
            w.left_hold(self.id);
        }
        if std::mem::take(&mut self.timing.prefill) {
            w.prefill_ended(self.id);
        }
        if let Some(p) = self.placement.waiting.take() {
            // Ended while Redis placed it: Redis may count it.
            w.meter.inc(Count::PlaceAbandoned);
            w.placer.abandoned();
            w.placer.release(p.member, false, &w.meter);
        }
        self.release(w, host);
    }

    /// The access-log phase: the stream's final properties are readable.
    pub(crate) fn on_log<H: Host>(&mut self, w: &Worker, host: &H) {
        self.release(w, host);
        // Passive health: did the pod fail this request?
        if let Some((pod, address, check_address)) = self.sent.to.take() {
            w.observe_outcome(host, pod, &address, check_address);
        }
    }

    fn release<H: Host>(&mut self, w: &Worker, host: &H) {
        if let Some(ticket) = self.sent.inflight.take() {
            w.release(host, ticket, std::mem::take(&mut self.timing.hit));
        }
        if let Some(member) = self.placement.member.take() {
            w.placer.release(member, true, &w.meter);
        }
    }

    fn pass<H: Host>(&mut self, w: &Worker, host: &H, reason: PassReason) -> Verdict {
        self.kind = None;
        self.count_pass(w, host, reason);
        Verdict::Continue
    }

    /// Counts a pass-through; with `original_dst_header`, gives the request a
    /// destination, since an ORIGINAL_DST cluster has no fallback.
    fn count_pass<H: Host>(&self, w: &Worker, host: &H, reason: PassReason) {
        w.meter.inc(Count::Pass(reason));
        // With the decision lines on (Envoy's `wasm` log level at debug).
        log::debug!(
            "prefix_router: pass-through ({}), the request goes on unrouted",
            reason.as_str()
        );
        if w.settings().original_dst_header {
            if let Some(endpoint) = w.fallback_endpoint(w.clock_nanos(host) / 1_000_000) {
                host.set_request_header(ORIGINAL_DST_HEADER, &endpoint);
            }
        }
    }

    /// Routes a complete body, or passes the request through counting why.
    /// Pause: the request waits for an earlier prefill of its prefix, or
    /// for its placement.
    fn finish<H: Host>(&mut self, w: &Worker, host: &H, kind: ApiKind, body: &[u8]) -> Verdict {
        let result = self.route_body(w, host, kind, body);
        self.verdict(w, host, result)
    }

    fn verdict<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        result: Result<bool, PassReason>,
    ) -> Verdict {
        match result {
            Ok(true) => Verdict::Pause,
            Ok(false) => Verdict::Continue,
            Err(reason) => {
                self.count_pass(w, host, reason);
                Verdict::Continue
            }
        }
    }

    fn route_body<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        kind: ApiKind,
        body: &[u8],
    ) -> Result<bool, PassReason> {
        // The tick's clock; a timed request (1 in 8) reads the host's, and
        // again at the end.
        let turn = w.meter.next_turn();
        let timed = turn == 0;
        let started = if timed {
            host.now_nanos()
        } else {
            w.clock_nanos(host)
        };
        let req = parse_body_as(kind, body, w.settings().render())?;
        let mut facts = RouteFacts {
            stream: req.stream,
            // Passive health reads the upstream address without a retry on
            // another request in the cycle than the timed one, so no
            // request pays both (the hostcall budgets hold for each).
            check_address: turn == SAMPLE_EVERY / 2,
            timed_from: timed.then_some(started),
        };
        let place = if w.settings().sync.places_new() && w.placer.may_ask(started / 1_000_000) {
            Place::Ask
        } else {
            Place::Local
        };
        let outcome = w
            .route_placed(host, &req, started, place)
            .map_err(route_error)?;
        let routed = match outcome {
            Outcome::Routed(r) => r,
            Outcome::Ask {
                pods,
                family,
                pending,
            } => {
                // Only the direct route is timed.
                facts.timed_from = None;
                match self.ask(w, host, (pods, family), *pending, facts) {
                    None => return Ok(true),
                    Some(pending) => w.resume(host, pending, None, started),
                }
            }
        };
        self.apply(w, host, routed, facts, None)
    }

    /// Asks Redis to place a new prompt of `family` on one of `pods` (the
    /// worker's pick first); the request then waits for
    /// [`Self::on_place_reply`]. Gives the decision back when it could not
    /// ask (no candidates, the call refused).
    fn ask<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        (pods, family): (Vec<(PodSlot, i64, i64)>, Option<Family>),
        pending: Pending,
        facts: RouteFacts,
    ) -> Option<Pending> {
        let fleet = w.router.fleet();
        let (pods, candidates): (Vec<PodSlot>, Vec<Candidate>) = pods
            .iter()
            .take(place::MAX_CANDIDATES)
            .filter_map(|&(pod, cost, step)| {
                let address = fleet.address(pod)?.to_string();
                Some((
                    pod,
                    Candidate {
                        address,
                        cost,
                        step,
                    },
                ))
            })
            .unzip();
        drop(fleet);
        if candidates.is_empty() {
            return Some(pending);
        }
        let sync = &w.settings().sync;
        // Cluster mode: the master the singleton named (none yet: not sent,
        // and nothing built for it).
        let Ok(node) = place::node(sync, host) else {
            w.meter.inc(Count::PlaceSkipped);
            return Some(pending);
        };
        let member = w.placer.next_member();
        let now_ms = w.clock_nanos(host) / 1_000_000;
        let family = family.as_ref().map(|(f, record)| (*f, record.as_str()));
        // A claim's follower waits by its prefill timing (see hold).
        let may_wait = w.settings().hold.enabled && w.router.prefill_timed_any();
        let Some((body, expected)) = place::ask(
            sync,
            now_ms,
            w.placer.vm(),
            &member,
            family,
            may_wait,
            &candidates,
        ) else {
            return Some(pending);
        };
        let Some(token) = host.call_bridge(sync, node.as_deref(), &body, sync.place_timeout_ms)
        else {
            w.meter.inc(Count::PlaceSkipped);
            return Some(pending);
        };
        w.meter.inc(Count::PlaceAsked);
        w.placer.wait_started();
        // The host's clock, not the tick's: the wait is well under a tick.
        let asked_nanos = host.now_nanos();
        self.placement.waiting = Some(Box::new(Placing {
            token,
            expected,
            member,
            pods,
            candidates,
            pending,
            facts,
            asked_nanos,
        }));
        None
    }

    /// Redis's answer to this stream's placement `token` (`reply`: None
    /// when the call failed or timed out). None if the stream waits for no
    /// such placement; else the verdict: Continue resumes the request, Pause
    /// keeps it waiting for an earlier prefill of its prefix. Whatever went
    /// wrong, the request goes to the worker's own pick, counted.
    pub(crate) fn on_place_reply<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        token: u32,
        reply: Option<&[u8]>,
    ) -> Option<Verdict> {
        let waiting = self.placement.waiting.as_ref();
        if !waiting.is_some_and(|p| p.token == token) {
            return None;
        }
        let p = self.placement.waiting.take()?;
        w.meter
            .place_wait(host.now_nanos().saturating_sub(p.asked_nanos) / 1_000);
        let now_nanos = w.clock_nanos(host);
        let pick = reply
            .ok_or(PlaceError::NoReply)
            .and_then(|r| place::chosen(r, p.expected, &p.candidates));
        let now_ms = now_nanos / 1_000_000;
        w.placer.wait_ended(pick.is_ok(), now_ms);
        let (forced, followed) = match pick.as_ref() {
            Ok((i, followed)) => (p.pods.get(*i).copied(), followed.clone()),
            Err(_) => (None, None),
        };
        if forced.is_none() {
            w.meter.inc(Count::PlaceFailed);
            // A Redis that refuses every placement (an ACL without EVAL,
            // say) must show in the log, not only in place.failed.
            if w.placer.should_warn(now_ms) {
                log::warn!(
                    "prefix_router: placing a new prompt through Redis failed ({pick:?}): the worker's own pick, and none asked for 1 s; `sync.place_new: false` turns placement off (at most one such line a minute per worker VM, all counted in place.failed)"
                );
            } else {
                log::debug!("prefix_router: placement failed ({pick:?}), the worker's own pick");
            }
        }
        let routed = w.resume(host, p.pending, forced, now_nanos);
        let placed = forced == Some(routed.choice.pod);
        if placed {
            w.placer.placed();
            self.placement.member = Some(p.member);
        } else {
            // Not routed where Redis may count it (a failure, a late or
            // hostile reply, a pod gone meanwhile): released at once.
            w.placer.release(p.member, false, &w.meter);
        }
        // A claim's follower may wait for the prefill that set it.
        let followed = followed.filter(|_| placed);
        let result = self.apply(w, host, routed, p.facts, followed.as_ref());
        Some(self.verdict(w, host, result))
    }

    /// Names the pod `routed` chose, and keeps what the rest of the stream
    /// needs (in-flight ticket, hold, prefill timing). True when the
    /// request waits for an earlier prefill of its prefix (`followed`: the
    /// family claim its placement followed, whose prefill may be one).
    fn apply<H: Host>(
        &mut self,
        w: &Worker,
        host: &H,
        routed: Routed,
        facts: RouteFacts,
        followed: Option<&Followed>,
    ) -> Result<bool, PassReason> {
        let pod = routed.choice.pod;
        let endpoint = w
            .router
            .fleet()
            .address(pod)
            .unwrap_or_default()
            .to_string();
        // Counted in flight from here: released on stream end whatever happens next.
        self.sent.inflight = Some(routed.ticket);
        self.sent.match_percent = Some(routed.choice.match_percent);
        self.timing.hit = routed.is_hit();
        if endpoint.is_empty() {
            return Err(PassReason::InternalError);
        }
        self.sent.to = Some((pod, endpoint.clone(), facts.check_address));
        if !host.set_request_header(DESTINATION_HEADER, &endpoint) {
            return Err(PassReason::InternalError);
        }
        if w.settings().original_dst_header
            && !host.set_request_header(ORIGINAL_DST_HEADER, &endpoint)
        {
            return Err(PassReason::InternalError);
        }
        let hold = w.hold(host, self.id, &routed, facts.stream, followed);
        self.hold = Holding {
            computing: hold.computing,
            held: hold.held,
        };
        if hold.held && std::mem::take(&mut self.timing.hit) {
            // Its wait for another's prefill is not its pod's speed.
            w.router.untime_hit(pod);
        }
        if let (Some(blocks), false) = (routed.prefill_blocks, hold.held) {
            self.timing.prefill = w.prefill_started(host, self.id, pod, blocks);
        }
        if let Some(started) = facts.timed_from {
            let us = host.now_nanos().saturating_sub(started) / 1_000;
            w.meter.route_time(us);
        }
        Ok(hold.held)
    }
}

fn route_error(e: RouteError) -> PassReason {
    log::warn!("prefix_router: routing failed, passing through: {e}");
    match e {
        RouteError::NoEndpoints => PassReason::NoEndpoints,
        RouteError::Store(_) => PassReason::InternalError,
    }
}

#[cfg(test)]
mod tests;
