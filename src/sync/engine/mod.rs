//! The sync engine: a sans-IO state machine that turns registered
//! [`Syncable`]s into Redis pipelines and Redis replies back into
//! `apply_remote` calls. The host sends each [`Call`] body to the Redis
//! bridge and feeds the reply to [`SyncEngine::on_response`]; time only
//! enters through the `now_ms` arguments.
//!
//! A cycle = pull every namespace (full SCAN+MGET, or the change log +
//! MGET), then push every namespace (delta or snapshot, SETEX chunks).
//! Calls inside a stage run concurrently (up to `max_inflight_calls`); a
//! failed call fails the cycle at once and a failed pull skips the push, so
//! a replica never overwrites peers' keys with a view it could not refresh.
//!
//! Between cycles, with the change log on and `poll_ms > 0`, the engine
//! *polls* (see [`SyncEngine::tick`] for the rules): one call reads the log
//! of every delta-capable namespace without hooks, the changed ids are
//! fetched and applied like a pull's, and once `push_ms` has passed since
//! the last push the poll goes on to push those namespaces' deltas.
//! Cycles and polls are both *runs* and only one run exists at a time.
//!
//! This file holds [`SyncEngine`] and its public methods; the rest is split
//! by concern, each an `impl SyncEngine` block with the types it owns:
//! `runs` (the run in progress and how it advances), `cycle` (a cycle's
//! start, push and end), `polls` (a poll's reads and its push),
//! `replies` (what each answer does, truncation retries), `sending` (queued
//! and in-flight work, pipelines), `write_through` (`put`/`delete`) and
//! `cluster` (Redis Cluster: the slot map and `MOVED`/`ASK`/`TRYAGAIN`).
//!
//! A namespace is read and written in *parts*, one per hash tag
//! (`sync.hash_tags`, 1 by default: the whole namespace is one part): every
//! key, change log, scan cursor and log position belongs to one part, and
//! every piece of work touches one part's slot. A call carries one piece,
//! except in cluster mode with K > 1 parts, where pieces of one kind whose
//! slots one master owns share a call (one pipeline per master: a poll's or
//! a cycle's change-log reads, MGETs, a push's writes, write-through); a
//! poll's change-log read covers several parts of one node in every mode.

mod cluster;
mod cycle;
mod polls;
mod replies;
mod runs;
mod sending;
mod write_through;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Index, IndexMut};

use super::error::{CallFailed, SyncError};
use super::keys::{key_slot, namespace_tags, KeyLayout};
use super::reply::{check_errors, decode_raw, redirect};
use super::resp::Frame;
use super::schedule::Schedule;
use super::settings::{key_part, SyncSettings};
use super::stats::SyncStats;
use super::syncable::{Capabilities, Syncable};
use super::topology::SlotMap;
use crate::rng::SplitMix64;

use runs::{Kind, Run};
use sending::{Op, Outstanding, Write};

/// Identifies one call between [`SyncEngine::tick`]/[`SyncEngine::on_response`].
pub(crate) type CallId = u64;

/// Snapshot size beyond which a full push logs a warning (as AIBrix does).
pub(crate) const LARGE_SNAPSHOT_ENTITIES: usize = 10_000;
/// Average payload beyond which a full push logs a warning.
pub(crate) const LARGE_SNAPSHOT_AVG_BYTES: usize = 512 * 1024;
/// Halvings of a truncated MGET/SCAN/XRANGE before the cycle gives up.
pub(crate) const MAX_TRUNCATION_RETRIES: u32 = 10;
/// Largest SCAN COUNT a page grows to (Redis walks this many keys in one
/// call, about a millisecond of its time).
pub(crate) const MAX_SCAN_COUNT: usize = 16_384;
/// RTT samples kept until drained.
const MAX_RTT_SAMPLES: usize = 1024;
/// Oversized ids remembered per namespace (beyond it, the soonest to expire
/// is forgotten first).
pub(crate) const MAX_OVERSIZED_REMEMBERED: usize = 1024;

/// One bridge call to make: POST `body` to the Redis bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    /// Pass back to [`SyncEngine::on_response`] with the reply.
    pub(crate) id: CallId,
    /// Raw RESP pipeline, ending with QUIT.
    pub(crate) body: Vec<u8>,
    /// Cluster mode: the Redis node (`host:port`) the call is for, named in
    /// `sync.node_header`; None = the bridge's default route (always
    /// outside cluster mode).
    pub(crate) node: Option<String>,
}

/// Which registered namespace: its place in registration order. Ops,
/// replies and runs carry it; its name is [`Registered::ns`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NsIndex(usize);

impl Index<NsIndex> for Vec<Registered> {
    type Output = Registered;
    fn index(&self, ns: NsIndex) -> &Registered {
        &self[ns.0]
    }
}

impl IndexMut<NsIndex> for Vec<Registered> {
    fn index_mut(&mut self, ns: NsIndex) -> &mut Registered {
        &mut self[ns.0]
    }
}

/// One hash tag of a namespace: its keys, slot and what the engine
/// learned about them.
pub(super) struct Part {
    keys: KeyLayout,
    /// Redis Cluster slot of every key of the part.
    slot: u16,
    /// Last change-log entry this replica has seen; None = unknown, the
    /// next pull must be a full scan.
    log_pos: Option<String>,
    /// Where the rotating anti-entropy scan (`scan_keys_per_cycle`) goes on
    /// next cycle; None = a new pass starts.
    scan_cursor: Option<String>,
    /// Cluster mode: the node `scan_cursor` is a cursor of, noted when a
    /// pass's first page is sent; its later pages go there (a SCAN cursor
    /// means nothing on another node: the pass restarts when the slot
    /// moved).
    scan_node: Option<String>,
}

/// A registered component and what the engine learned about its namespace.
struct Registered {
    comp: Box<dyn Syncable>,
    ns: String,
    caps: Capabilities,
    /// The namespace's parts (one per hash tag), in tag order.
    parts: Vec<Part>,
    /// Learned page sizes (SCAN: shrink on truncation, grow while replies
    /// are small; XRANGE: shrink on truncation).
    scan_cap: usize,
    log_cap: usize,
    /// Estimated reply bytes per MGET value (0 = nothing seen yet).
    value_reply_bytes: usize,
    /// Ids whose value was too large to fetch even alone, and until when
    /// (`now_ms`) full scans skip them: without this, every full scan would
    /// split its way down to the same values again (a hostile writer's cheap
    /// DoS). Change-log reads do not skip them: an entry there is a rewrite.
    /// At most [`MAX_OVERSIZED_REMEMBERED`] ids.
    oversized: BTreeMap<String, u64>,
    write_through: Vec<Write>,
}

/// The cross-replica sync state machine. See the module docs.
pub(crate) struct SyncEngine {
    settings: SyncSettings,
    schedule: Schedule,
    origin: String,
    regs: Vec<Registered>,
    started: bool,
    stopped: bool,
    next_cycle_ms: Option<u64>,
    cycles_started: u64,
    /// Runs (cycles and polls) started: their sequence numbers.
    runs_started: u64,
    run: Option<Run>,
    /// Polls may run: the last cycle succeeded and no poll failed since.
    polls_allowed: bool,
    next_poll_ms: Option<u64>,
    /// When the last push (a cycle's or a poll's) took its delta.
    last_push_ms: Option<u64>,
    outstanding: BTreeMap<CallId, Outstanding>,
    next_call_id: CallId,
    stats: SyncStats,
    rtt_samples: Vec<u64>,
    /// Cluster mode: the slot owners as last read (None before the first
    /// `CLUSTER SLOTS` reply).
    topology: Option<SlotMap>,
    /// Cluster mode: which node the next `CLUSTER SLOTS` goes to (turns
    /// after every failed cycle, so a dead master is not asked forever).
    topology_turn: usize,
}

impl fmt::Debug for SyncEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncEngine")
            .field("origin", &self.origin)
            .field("namespaces", &self.namespaces())
            .field("started", &self.started)
            .field("stopped", &self.stopped)
            .field("next_cycle_ms", &self.next_cycle_ms)
            .field("outstanding", &self.outstanding.len())
            .finish()
    }
}

impl SyncEngine {
    /// An engine for (already validated) `settings`. `seed` drives the
    /// startup delay, jitter and this replica's origin id in the change log:
    /// give every replica a different one (e.g. current time in ns).
    pub(crate) fn new(settings: SyncSettings, seed: u64) -> Self {
        let mut origin_rng = SplitMix64::new(seed ^ 0x5EED_0F01_2345_6789);
        Self {
            schedule: Schedule::new(settings.period_ms, seed),
            stats: SyncStats {
                backoff_ms: settings.period_ms,
                ..Default::default()
            },
            settings,
            origin: format!("{:016x}", origin_rng.next_u64()),
            regs: Vec::new(),
            started: false,
            stopped: false,
            next_cycle_ms: None,
            cycles_started: 0,
            runs_started: 0,
            run: None,
            polls_allowed: false,
            next_poll_ms: None,
            last_push_ms: None,
            outstanding: BTreeMap::new(),
            next_call_id: 1,
            rtt_samples: Vec::new(),
            topology: None,
            topology_turn: 0,
        }
    }

    /// Adds a component. Refused (with a warning) after `start`, for an
    /// empty or invalid namespace, or a namespace already registered.
    /// Capabilities are read once, here.
    pub(crate) fn register(&mut self, comp: Box<dyn Syncable>) -> Result<(), SyncError> {
        let ns = comp.namespace();
        let refused = if self.started {
            Some(SyncError::AlreadyStarted)
        } else if ns.is_empty() {
            Some(SyncError::EmptyNamespace)
        } else if key_part("namespace", &ns).is_err() {
            Some(SyncError::InvalidNamespace(ns.clone()))
        } else if self.regs.iter().any(|r| r.ns == ns) {
            Some(SyncError::DuplicateNamespace(ns.clone()))
        } else {
            None
        };
        if let Some(e) = refused {
            log::warn!("sync: registration of namespace {ns:?} ignored: {e}");
            return Err(e);
        }
        let caps = comp.capabilities();
        let prefix = &self.settings.key_prefix;
        let parts: Vec<Part> = namespace_tags(&ns, self.settings.hash_tags)
            .iter()
            .map(|tag| {
                let keys = KeyLayout::with_tag(prefix, tag);
                Part {
                    slot: key_slot(keys.log_key().as_bytes()),
                    keys,
                    log_pos: None,
                    scan_cursor: None,
                    scan_node: None,
                }
            })
            .collect();
        // SCAN returns about COUNT keys: keep a page's reply within budget
        // up front (ids estimated at 20 bytes, RESP framing at 8).
        let longest = parts.iter().map(|p| p.keys.entity_prefix().len()).max();
        let key_reply = longest.unwrap_or(0) + 28;
        let scan_cap = self
            .settings
            .scan_count
            .min(self.settings.max_reply_bytes / key_reply)
            .max(1);
        self.regs.push(Registered {
            comp,
            ns,
            caps,
            parts,
            scan_cap,
            log_cap: self.settings.log_read_count,
            value_reply_bytes: 0,
            oversized: BTreeMap::new(),
            write_through: Vec::new(),
        });
        Ok(())
    }

    /// Starts the loop: the first cycle runs after a random delay in
    /// `[0, period/2)` from `now_ms`.
    pub(crate) fn start(&mut self, now_ms: u64) -> Result<(), SyncError> {
        if !self.settings.enabled {
            return Err(SyncError::Disabled);
        }
        if self.started {
            return Err(SyncError::AlreadyStarted);
        }
        self.started = true;
        self.next_cycle_ms = Some(now_ms + self.schedule.startup_delay());
        Ok(())
    }

    /// Ends the loop: the running cycle or poll is dropped (a cycle's pull
    /// hooks closed), later replies are ignored, no further calls are
    /// emitted.
    pub(crate) fn stop(&mut self) {
        if let Some(mut run) = self.run.take() {
            self.end_pull_hooks(&mut run);
        }
        self.outstanding.clear();
        self.stopped = true;
        self.next_cycle_ms = None;
        self.next_poll_ms = None;
    }

    /// Whether the last cycle failed (sync is backing off).
    pub(crate) fn failing(&self) -> bool {
        self.started && !self.stopped && self.stats.cycles_failed > 0 && !self.polls_allowed
    }

    /// Redis answers again (the host's probe got a reply while backing
    /// off): start the next cycle at the next tick instead of waiting out
    /// the backoff (up to 60 s). Does nothing unless sync is failing and no
    /// run is in progress.
    pub(crate) fn retry_now(&mut self, now_ms: u64) {
        if self.failing() && self.run.is_none() {
            self.next_cycle_ms = Some(now_ms);
        }
    }

    /// Call on every host tick. Abandons a run (cycle or poll) past its
    /// operation timeout, starts a due cycle or else a due poll, and flushes
    /// queued write-through writes.
    ///
    /// Poll rules (`poll_ms > 0` and the change log on, i.e. not AIBrix
    /// mode):
    /// - a poll starts every `poll_ms` while no cycle runs, only after a
    ///   successful cycle, and never again after a failed cycle or a failed
    ///   poll until a cycle succeeds (a Redis that is down sees no polls);
    /// - it reads, in one call, the change log of every namespace that has
    ///   the delta capability, no hooks (hooks expect the whole pull between
    ///   `on_sync_start`/`on_sync_end`) and a known log position; the changed
    ///   ids of peers are fetched and applied exactly as a pull does;
    /// - a trimmed or missing log does not scan: the next cycle does;
    /// - a due cycle waits for a running poll (at most `op_timeout_ms`, after
    ///   which the poll is abandoned as failed); a poll never changes the
    ///   cycle schedule or backoff;
    /// - once `push_ms` (175 ms) has passed since the last push, the poll
    ///   goes on to push the polled namespaces' deltas (pull first, then
    ///   push, as a cycle does). Why: pull-first still holds per replica
    ///   (what is pushed was refreshed by this very poll); a change is
    ///   written within about `push_ms` + `poll_ms` and seen by peers within
    ///   about `poll_ms` after that, instead of up to two periods (a push,
    ///   then the peer's pull, each waiting up to a period). Writes per
    ///   entity do not grow: the dirty set deduplicates and an entity is
    ///   written only when it changed since the last push (the router
    ///   re-marks a hot block at most once per touch interval, 30 s by
    ///   default). Only an entity that changes again within every
    ///   `push_ms` is written more often than once per period. Calls grow
    ///   by at most one per poll that has something to push.
    pub(crate) fn tick(&mut self, now_ms: u64) -> Vec<Call> {
        if !self.started || self.stopped {
            return Vec::new();
        }
        let mut calls = Vec::new();
        self.expire_write_through(now_ms);
        let timed_out = self
            .run
            .as_ref()
            .filter(|r| now_ms.saturating_sub(r.started_ms) >= self.settings.op_timeout_ms)
            .map(|r| (r.kind, r.inflight + r.queue.len()));
        if let Some((kind, pending)) = timed_out {
            if kind == Kind::Cycle {
                self.stats.cycles_timed_out += 1;
            }
            self.fail_run(now_ms, SyncError::Timeout { pending });
        }
        if self.run.is_none() {
            if self.next_cycle_ms.is_some_and(|t| now_ms >= t) {
                self.start_cycle(now_ms);
            } else if self.poll_due(now_ms) {
                self.start_poll(now_ms);
            }
        }
        self.pump(now_ms, &mut calls);
        self.flush_write_through(now_ms, &mut calls);
        calls
    }

    /// Feed the outcome of call `id`; returns follow-up calls to send now
    /// (a cycle proceeds on replies, not only on ticks).
    pub(crate) fn on_response(
        &mut self,
        id: CallId,
        now_ms: u64,
        result: Result<&[u8], CallFailed>,
    ) -> Vec<Call> {
        let mut calls = Vec::new();
        let Some(out) = self.outstanding.remove(&id) else {
            self.stats.late_responses += 1;
            return calls;
        };
        if self.rtt_samples.len() < MAX_RTT_SAMPLES {
            self.rtt_samples.push(now_ms.saturating_sub(out.sent_ms));
        }
        let reply_len = result.as_ref().map(|b| b.len()).unwrap_or(0);
        self.stats.bytes_received += reply_len as u64;
        let frames = decode_raw(
            result,
            out.expected,
            out.auth,
            out.asking,
            out.sent.command(),
        );
        if let Err(SyncError::EmptyReply { command }) = &frames {
            self.note_empty_reply(command);
        }
        let Some(seq) = out.run else {
            for op in self.on_write_through_response(out, frames, reply_len) {
                calls.push(self.dispatch(op, None, now_ms));
            }
            return calls;
        };
        match self.run.as_mut() {
            Some(r) if r.seq == seq => r.inflight = r.inflight.saturating_sub(1),
            _ => {
                self.stats.late_responses += 1;
                return calls;
            }
        }
        let outcome = match frames {
            Ok(frames) => {
                let (outcome, again) = self.on_run_frames(out, frames, reply_len, now_ms);
                if let Some(run) = self.run.as_mut() {
                    for op in again.into_iter().rev() {
                        run.queue.push_front(op);
                    }
                }
                outcome
            }
            Err(SyncError::Truncated { .. }) => self.on_truncated(out.sent, now_ms),
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            self.stats.calls_failed += 1;
            self.fail_run(now_ms, e);
        }
        self.pump(now_ms, &mut calls);
        calls
    }

    /// A run's call answered in full: each piece of work (the call's, or
    /// each of a batch's) acted on with its own replies. Returns the first
    /// failure, if any, and the redirected work to send again.
    fn on_run_frames(
        &mut self,
        out: Outstanding,
        frames: Vec<Frame>,
        reply_len: usize,
        now_ms: u64,
    ) -> (Result<(), SyncError>, Vec<Op>) {
        let pieces = match split_replies(out.sent, &out.replies, frames, reply_len) {
            Ok(pieces) => pieces,
            Err(e) => return (Err(e), Vec::new()),
        };
        let mut again = Vec::new();
        for (work, frames, len) in pieces {
            // Cluster mode: a MOVED/ASK/TRYAGAIN among the replies is
            // followed (bounded by MAX_REDIRECTS) instead of failing.
            let (outcome, ops) = if self.redirected(&frames) {
                self.on_redirect(work, out.redirects, frames)
            } else {
                let outcome = check_errors(frames)
                    .and_then(|frames| self.on_run_reply(work, frames, len, now_ms));
                (outcome, Vec::new())
            };
            again.extend(ops);
            if outcome.is_err() {
                return (outcome, again);
            }
        }
        (Ok(()), again)
    }

    /// A write-through call's outcome: each piece acted on with its own
    /// replies; returns the redirected work to send again. A failure
    /// (transport, error reply, redirections exhausted) counts once per
    /// call and is not retried.
    fn on_write_through_response(
        &mut self,
        out: Outstanding,
        frames: Result<Vec<Frame>, SyncError>,
        reply_len: usize,
    ) -> Vec<Op> {
        let pieces =
            frames.and_then(|frames| split_replies(out.sent, &out.replies, frames, reply_len));
        let mut again = Vec::new();
        let mut failed = None;
        match pieces {
            Ok(pieces) => {
                for (work, frames, _) in pieces {
                    if self.redirected(&frames) {
                        let (outcome, ops) = self.on_redirect(work, out.redirects, frames);
                        again.extend(ops);
                        if let Err(e) = outcome {
                            failed = Some(e);
                        }
                    } else {
                        match check_errors(frames) {
                            Ok(_) => self.on_written_through(work),
                            Err(e) => failed = Some(e),
                        }
                    }
                }
            }
            Err(e) => failed = Some(e),
        }
        if let Some(e) = failed {
            self.on_write_through_failed(&e);
        }
        again
    }

    /// Cluster mode: whether one piece's replies hold a redirection.
    fn redirected(&self, frames: &[Frame]) -> bool {
        self.settings.cluster && frames.iter().any(|f| redirect(f).is_some())
    }

    /// Counts an empty reply and says, at error level, what usually causes
    /// it (on the 1st, 2nd, 4th, 8th... one, so a long outage stays quiet).
    fn note_empty_reply(&mut self, command: &str) {
        self.stats.empty_replies += 1;
        let n = self.stats.empty_replies;
        if n.is_power_of_two() {
            log::error!(
                "sync: {command} call got an empty reply from the Redis bridge ({n} so far): the \
                 connection to Redis closed before Redis answered. Redis went away mid-call, or \
                 something between the bridge and Redis (a TCP proxy or load balancer) closes the \
                 connection when Envoy half-closes it after sending the request: that path must \
                 pass TCP half-close on (see docs/deploy.md)"
            );
        }
    }

    /// Queues a write-through SETEX of one entity; sent on the next tick.
    pub(crate) fn put(&mut self, ns: &str, id: &str, payload: Vec<u8>) -> Result<(), SyncError> {
        let reg = self.write_through_target(ns)?;
        reg.write_through.push(Write::Set(id.to_owned(), payload));
        Ok(())
    }

    /// Queues a write-through delete (tombstone SETEX when the component
    /// supports tombstones, else DEL); sent on the next tick.
    #[cfg(test)]
    pub(crate) fn delete(&mut self, ns: &str, id: &str) -> Result<(), SyncError> {
        let reg = self.write_through_target(ns)?;
        let write = if reg.caps.tombstones {
            Write::Set(id.to_owned(), reg.comp.make_tombstone(id))
        } else {
            Write::Del(id.to_owned())
        };
        reg.write_through.push(write);
        Ok(())
    }

    /// Counters so far.
    pub(crate) fn stats(&self) -> &SyncStats {
        &self.stats
    }

    /// Round-trip times (ms) of calls answered since the last drain.
    pub(crate) fn drain_rtt_samples(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.rtt_samples)
    }

    /// This replica's id in change-log entries.
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// Registered namespaces, in registration order.
    pub(crate) fn namespaces(&self) -> Vec<&str> {
        self.regs.iter().map(|r| r.ns.as_str()).collect()
    }
}

/// A call's work with its replies: one piece (the work, its replies, the
/// reply's length), or one per piece of a [`sending::Work::Batch`] (each
/// with its share of the replies, by the counts noted when it was encoded,
/// and their encoded length).
fn split_replies(
    sent: sending::Work,
    replies: &[usize],
    frames: Vec<Frame>,
    reply_len: usize,
) -> Result<Vec<(sending::Work, Vec<Frame>, usize)>, SyncError> {
    let works = match sent {
        sending::Work::Batch(works) => works,
        sent => return Ok(vec![(sent, frames, reply_len)]),
    };
    if works.len() != replies.len() || replies.iter().sum::<usize>() != frames.len() {
        return Err(SyncError::Protocol(format!(
            "{} replies for a batch of {} pieces",
            frames.len(),
            works.len()
        )));
    }
    let mut frames = frames.into_iter();
    let mut pieces = Vec::with_capacity(works.len());
    for (work, n) in works.into_iter().zip(replies) {
        let mine: Vec<Frame> = frames.by_ref().take(*n).collect();
        let len = mine.iter().map(Frame::wire_len).sum();
        pieces.push((work, mine, len));
    }
    Ok(pieces)
}

/// Read-only views of the schedule and the run in progress, for unit tests
/// and the testkit drivers; the filter has no use for them.
#[cfg(any(test, feature = "testkit"))]
impl SyncEngine {
    /// When the next cycle is due (None before start / after stop).
    pub(crate) fn next_cycle_ms(&self) -> Option<u64> {
        self.next_cycle_ms
    }

    /// True while a cycle is in progress.
    pub(crate) fn cycle_in_progress(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.kind == Kind::Cycle)
    }

    /// True while a poll (with its push, if any) is in progress.
    pub(crate) fn poll_in_progress(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.kind == Kind::Poll)
    }

    /// When the next poll may start (None while polls are off or paused:
    /// before the first successful cycle, after a failed cycle or poll).
    pub(crate) fn next_poll_ms(&self) -> Option<u64> {
        self.next_poll_ms.filter(|_| self.polls_allowed)
    }

    /// Calls sent and not answered yet.
    pub(crate) fn pending_calls(&self) -> usize {
        self.outstanding.len()
    }

    /// The settings in use.
    pub(crate) fn settings(&self) -> &SyncSettings {
        &self.settings
    }
}
