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
//! fetched and applied like a pull's, and once half a period has passed
//! since the last push the poll goes on to push those namespaces' deltas.
//! Cycles and polls are both *runs* and only one run exists at a time.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;

use crate::resp::{Frame, Pipeline};

use super::error::{CallFailed, SyncError};
use super::keys::KeyLayout;
use super::reply::{decode, log_entries, proto};
use super::schedule::{Schedule, SplitMix64};
use super::settings::{key_part, SyncSettings};
use super::stats::SyncStats;
use super::syncable::{Capabilities, Syncable};

/// Identifies one call between [`SyncEngine::tick`]/[`SyncEngine::on_response`].
pub type CallId = u64;

/// Snapshot size beyond which a full push logs a warning (as AIBrix does).
pub const LARGE_SNAPSHOT_ENTITIES: usize = 10_000;
/// Average payload beyond which a full push logs a warning.
pub const LARGE_SNAPSHOT_AVG_BYTES: usize = 512 * 1024;
/// Halvings of a truncated MGET/SCAN/XRANGE before the cycle gives up.
pub const MAX_TRUNCATION_RETRIES: u32 = 10;
/// RTT samples kept until drained.
const MAX_RTT_SAMPLES: usize = 1024;

/// One bridge call to make: POST `body` to the Redis bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Pass back to [`SyncEngine::on_response`] with the reply.
    pub id: CallId,
    /// Raw RESP pipeline, ending with QUIT.
    pub body: Vec<u8>,
}

enum Write {
    Set(String, Vec<u8>),
    Del(String),
}

impl Write {
    fn id(&self) -> &str {
        match self {
            Write::Set(id, _) | Write::Del(id) => id,
        }
    }
}

/// Work not yet sent.
enum Op {
    Scan {
        ns: usize,
        cursor: String,
        count: usize,
        with_head: bool,
        attempt: u32,
    },
    LogRead {
        ns: usize,
        from: String,
        count: usize,
        attempt: u32,
    },
    /// A poll's first call: one XRANGE per polled namespace, one pipeline.
    LogReads(Vec<LogRead>),
    Mget {
        ns: usize,
        ids: Vec<String>,
        attempt: u32,
    },
    DelStale {
        ns: usize,
        ids: Vec<String>,
    },
    Write {
        ns: usize,
        writes: Vec<Write>,
    },
}

/// One namespace's part of [`Op::LogReads`].
#[derive(Clone, Debug)]
struct LogRead {
    ns: usize,
    from: String,
    count: usize,
}

/// What a call in flight was for (write payloads already dropped).
enum Sent {
    Scan {
        ns: usize,
        cursor: String,
        count: usize,
        with_head: bool,
        attempt: u32,
    },
    LogRead {
        ns: usize,
        from: String,
        count: usize,
        attempt: u32,
    },
    LogReads(Vec<LogRead>),
    Mget {
        ns: usize,
        ids: Vec<String>,
        attempt: u32,
    },
    DelStale {
        n: usize,
    },
    Write {
        n: usize,
        ns: usize,
        /// Ids written: a successful write-through clears their dirty marks.
        ids: Vec<String>,
    },
}

impl Sent {
    fn command(&self) -> &'static str {
        match self {
            Sent::Scan { .. } => "SCAN",
            Sent::LogRead { .. } | Sent::LogReads(_) => "XRANGE",
            Sent::Mget { .. } => "MGET",
            Sent::DelStale { .. } => "DEL",
            Sent::Write { .. } => "SETEX",
        }
    }
}

struct Outstanding {
    sent: Sent,
    sent_ms: u64,
    expected: usize,
    auth: bool,
    /// Sequence number of the run (cycle or poll) the call belongs to;
    /// None for write-through calls, which live outside runs.
    run: Option<u64>,
}

struct Registered {
    comp: Box<dyn Syncable>,
    ns: String,
    keys: KeyLayout,
    caps: Capabilities,
    /// Last change-log entry this replica has seen; None = unknown, the
    /// next pull must be a full scan.
    log_pos: Option<String>,
    /// Learned caps (shrink on truncation, regrow slowly).
    mget_cap: usize,
    scan_cap: usize,
    log_cap: usize,
    /// Estimated reply bytes per MGET value (0 = nothing seen yet).
    value_reply_bytes: usize,
    write_through: Vec<Write>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Pull,
    Push,
}

/// What a run is: a scheduled cycle, or a poll between cycles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Cycle,
    Poll,
}

struct NsRun {
    /// The run reads this namespace (cycles: all; polls: the polled ones).
    active: bool,
    /// Log position to keep once the pull stage is over (None: unknown, the
    /// next cycle scans).
    new_pos: Option<String>,
    seen: HashSet<String>,
    hooks_started: bool,
}

/// A cycle or a poll in progress; at most one exists.
struct Run {
    kind: Kind,
    seq: u64,
    started_ms: u64,
    stage: Stage,
    queue: VecDeque<Op>,
    inflight: usize,
    ns: Vec<NsRun>,
    pushed_ids: Vec<Vec<String>>,
}

impl Run {
    fn new(kind: Kind, seq: u64, started_ms: u64, namespaces: usize) -> Self {
        Self {
            kind,
            seq,
            started_ms,
            stage: Stage::Pull,
            queue: VecDeque::new(),
            inflight: 0,
            ns: Vec::with_capacity(namespaces),
            pushed_ids: vec![Vec::new(); namespaces],
        }
    }
}

/// The cross-replica sync state machine. See the module docs.
pub struct SyncEngine {
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
    /// When the last push (cycle or half-period) took its delta.
    last_push_ms: Option<u64>,
    outstanding: BTreeMap<CallId, Outstanding>,
    next_call_id: CallId,
    stats: SyncStats,
    rtt_samples: Vec<u64>,
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
    pub fn new(settings: SyncSettings, seed: u64) -> Self {
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
        }
    }

    /// Adds a component. Refused (with a warning) after `start`, for an
    /// empty or invalid namespace, or a namespace already registered.
    /// Capabilities are read once, here.
    pub fn register(&mut self, comp: Box<dyn Syncable>) -> Result<(), SyncError> {
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
        let keys = KeyLayout::new(&self.settings.key_prefix, &ns);
        // SCAN returns about COUNT keys: keep a page's reply within budget
        // up front (ids estimated at 20 bytes, RESP framing at 8).
        let key_reply = keys.entity_prefix().len() + 28;
        let scan_cap = self
            .settings
            .scan_count
            .min(self.settings.max_reply_bytes / key_reply)
            .max(1);
        self.regs.push(Registered {
            keys,
            comp,
            ns,
            caps,
            log_pos: None,
            mget_cap: self.settings.mget_batch,
            scan_cap,
            log_cap: self.settings.log_read_count,
            value_reply_bytes: 0,
            write_through: Vec::new(),
        });
        Ok(())
    }

    /// Starts the loop: the first cycle runs after a random delay in
    /// `[0, period/2)` from `now_ms`.
    pub fn start(&mut self, now_ms: u64) -> Result<(), SyncError> {
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
    pub fn stop(&mut self) {
        if let Some(mut run) = self.run.take() {
            self.end_pull_hooks(&mut run);
        }
        self.outstanding.clear();
        self.stopped = true;
        self.next_cycle_ms = None;
        self.next_poll_ms = None;
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
    /// - once `period/2` has passed since the last push, the poll goes on to
    ///   push the polled namespaces' deltas (pull first, then push, as a
    ///   cycle does). Why: pull-first still holds per replica (what is
    ///   pushed was refreshed by this very poll); a change is now written
    ///   within about period/2 and seen by peers within about `poll_ms`
    ///   after that, so convergence is about period/2 + `poll_ms` instead of
    ///   up to two periods (a push, then the peer's pull, each waiting up to
    ///   a period). Writes per entity do not grow: the dirty set
    ///   deduplicates and an entity is written only when it changed since
    ///   the last push (the router re-marks a hot block at most once per
    ///   touch interval, 30 s by default). Only an entity that changes
    ///   again within every half period is written up to twice per period
    ///   instead of once.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Call> {
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
    pub fn on_response(
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
        let frames = decode(result, out.expected, out.auth, out.sent.command());
        let Some(seq) = out.run else {
            self.on_write_through_reply(out.sent, frames);
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
            Ok(frames) => self.on_run_reply(out.sent, frames, reply_len),
            Err(SyncError::Truncated { .. }) => self.on_truncated(out.sent),
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            self.stats.calls_failed += 1;
            self.fail_run(now_ms, e);
        }
        self.pump(now_ms, &mut calls);
        calls
    }

    /// Queues a write-through SETEX of one entity; sent on the next tick.
    pub fn put(&mut self, ns: &str, id: &str, payload: Vec<u8>) -> Result<(), SyncError> {
        let reg = self.write_through_target(ns)?;
        reg.write_through.push(Write::Set(id.to_owned(), payload));
        Ok(())
    }

    /// Queues a write-through delete (tombstone SETEX when the component
    /// supports tombstones, else DEL); sent on the next tick.
    pub fn delete(&mut self, ns: &str, id: &str) -> Result<(), SyncError> {
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
    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }

    /// Round-trip times (ms) of calls answered since the last drain.
    pub fn drain_rtt_samples(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.rtt_samples)
    }

    /// When the next cycle is due (None before start / after stop).
    pub fn next_cycle_ms(&self) -> Option<u64> {
        self.next_cycle_ms
    }

    /// True while a cycle is in progress.
    pub fn cycle_in_progress(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.kind == Kind::Cycle)
    }

    /// True while a poll (with its half-period push, if any) is in progress.
    pub fn poll_in_progress(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.kind == Kind::Poll)
    }

    /// When the next poll may start (None while polls are off or paused:
    /// before the first successful cycle, after a failed cycle or poll).
    pub fn next_poll_ms(&self) -> Option<u64> {
        self.next_poll_ms.filter(|_| self.polls_allowed)
    }

    /// Calls sent and not answered yet.
    pub fn pending_calls(&self) -> usize {
        self.outstanding.len()
    }

    /// This replica's id in change-log entries.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The settings in use.
    pub fn settings(&self) -> &SyncSettings {
        &self.settings
    }

    /// Registered namespaces, in registration order.
    pub fn namespaces(&self) -> Vec<&str> {
        self.regs.iter().map(|r| r.ns.as_str()).collect()
    }

    // ---- cycle life ----

    fn next_seq(&mut self) -> u64 {
        let seq = self.runs_started;
        self.runs_started += 1;
        seq
    }

    fn start_cycle(&mut self, now_ms: u64) {
        let index = self.cycles_started;
        self.cycles_started += 1;
        let log = self.settings.change_log_enabled();
        let every = u64::from(self.settings.full_scan_every.max(1));
        let full_cycle = !log || index % every == 0;
        let seq = self.next_seq();
        let mut cycle = Run::new(Kind::Cycle, seq, now_ms, self.regs.len());
        for (i, reg) in self.regs.iter_mut().enumerate() {
            if reg.caps.hooks {
                reg.comp.on_sync_start();
            }
            let pos = if full_cycle {
                None
            } else {
                reg.log_pos.clone()
            };
            match &pos {
                Some(from) => {
                    self.stats.incremental_pulls += 1;
                    cycle.queue.push_back(Op::LogRead {
                        ns: i,
                        from: from.clone(),
                        count: reg.log_cap,
                        attempt: 0,
                    });
                }
                None => {
                    self.stats.full_scans += 1;
                    cycle.queue.push_back(Op::Scan {
                        ns: i,
                        cursor: "0".into(),
                        count: reg.scan_cap,
                        with_head: log,
                        attempt: 0,
                    });
                }
            }
            cycle.ns.push(NsRun {
                active: true,
                new_pos: pos,
                seen: HashSet::new(),
                hooks_started: reg.caps.hooks,
            });
        }
        self.run = Some(cycle);
    }

    // ---- polls ----

    fn poll_due(&self, now_ms: u64) -> bool {
        // A poll due within 10 % of poll_ms counts as due, so a host tick
        // that fires a little early does not skip a whole interval.
        let early = self.settings.poll_ms / 10;
        self.settings.polling_enabled()
            && self.polls_allowed
            && self.next_poll_ms.is_some_and(|t| now_ms + early >= t)
    }

    /// Namespaces a poll reads: delta-capable, no hooks, log position known.
    fn pollable(reg: &Registered) -> bool {
        reg.caps.delta && !reg.caps.hooks && reg.log_pos.is_some()
    }

    fn start_poll(&mut self, now_ms: u64) {
        self.next_poll_ms = Some(now_ms + self.settings.poll_ms);
        let mut reads = Vec::new();
        let mut nss = Vec::with_capacity(self.regs.len());
        for (i, reg) in self.regs.iter().enumerate() {
            let active = Self::pollable(reg);
            if active {
                if let Some(from) = &reg.log_pos {
                    reads.push(LogRead {
                        ns: i,
                        from: from.clone(),
                        count: reg.log_cap,
                    });
                }
            }
            nss.push(NsRun {
                active,
                new_pos: reg.log_pos.clone().filter(|_| active),
                seen: HashSet::new(),
                hooks_started: false,
            });
        }
        if reads.is_empty() {
            return;
        }
        let seq = self.next_seq();
        let mut poll = Run::new(Kind::Poll, seq, now_ms, self.regs.len());
        poll.ns = nss;
        let op = match <[LogRead; 1]>::try_from(reads) {
            Ok([one]) => Op::LogRead {
                ns: one.ns,
                from: one.from,
                count: one.count,
                attempt: 0,
            },
            Err(reads) => Op::LogReads(reads),
        };
        poll.queue.push_back(op);
        self.run = Some(poll);
    }

    /// Half-period push due: at least period/2 since the last push.
    fn mid_push_due(&self, now_ms: u64) -> bool {
        self.last_push_ms
            .is_some_and(|t| now_ms >= t + self.settings.period_ms / 2)
    }

    /// After a poll's reads: keep the new log positions (None = the log was
    /// trimmed or gone, the next cycle scans) and, when due, queue the
    /// delta push of the namespaces this poll read completely.
    fn end_poll_reads(&mut self, poll: &mut Run, now_ms: u64) {
        self.stats.polls_ok += 1;
        let mut pushable = vec![false; self.regs.len()];
        for ((reg, ns), ok) in self
            .regs
            .iter_mut()
            .zip(poll.ns.iter_mut())
            .zip(pushable.iter_mut())
        {
            if ns.active {
                reg.log_pos = ns.new_pos.take();
                *ok = reg.log_pos.is_some();
            }
        }
        if !self.mid_push_due(now_ms) {
            return;
        }
        // Pull first still holds: every namespace pushed here was just
        // refreshed by this poll (the others wait for the cycle). An empty
        // delta counts as a push too, so `delta()` (which may walk a large
        // dirty set) runs at most every period/2, not on every poll.
        self.last_push_ms = Some(now_ms);
        let chunk = self.settings.setex_chunk;
        for (i, reg) in self.regs.iter_mut().enumerate() {
            if !pushable[i] {
                continue;
            }
            let writes = delta_writes(reg);
            poll.pushed_ids[i] = writes.iter().map(|w| w.id().to_owned()).collect();
            queue_writes(poll, i, writes, chunk);
        }
    }

    fn fail_poll(&mut self, why: SyncError) {
        let Some(poll) = self.run.take() else {
            return;
        };
        if poll.stage == Stage::Push {
            self.stats.mid_pushes_failed += 1;
            log::warn!("sync: half-period push failed: {why}; polls pause until a cycle succeeds");
        } else {
            self.stats.polls_failed += 1;
            log::warn!("sync: poll failed: {why}; polls pause until a cycle succeeds");
        }
        self.polls_allowed = false;
        // Its log positions stay where they were: the next cycle re-reads.
        self.outstanding.retain(|_, o| o.run != Some(poll.seq));
    }

    // ---- runs ----

    /// Sends queued work up to the in-flight cap and moves the run on when
    /// a stage has drained.
    fn pump(&mut self, now_ms: u64, calls: &mut Vec<Call>) {
        while let Some(mut run) = self.run.take() {
            while run.inflight < self.settings.max_inflight_calls {
                let Some(op) = run.queue.pop_front() else {
                    break;
                };
                calls.push(self.dispatch(op, Some(run.seq), now_ms));
                run.inflight += 1;
            }
            if run.inflight > 0 || !run.queue.is_empty() {
                self.run = Some(run);
                return;
            }
            match (run.kind, run.stage) {
                (Kind::Cycle, Stage::Pull) => {
                    self.end_pull_hooks(&mut run);
                    for (reg, ns) in self.regs.iter_mut().zip(run.ns.iter_mut()) {
                        reg.log_pos = ns.new_pos.take();
                    }
                    self.build_push(&mut run);
                    self.last_push_ms = Some(now_ms);
                    run.stage = Stage::Push;
                    self.run = Some(run);
                }
                (Kind::Poll, Stage::Pull) => {
                    self.end_poll_reads(&mut run, now_ms);
                    if !run.queue.is_empty() {
                        run.stage = Stage::Push;
                        self.run = Some(run);
                    }
                }
                (kind, Stage::Push) => {
                    for (reg, ids) in self.regs.iter_mut().zip(run.pushed_ids.iter()) {
                        if reg.caps.delta && !ids.is_empty() {
                            reg.comp.clear_dirty(ids);
                        }
                    }
                    if kind == Kind::Cycle {
                        self.finish_cycle(now_ms, &run, true);
                    } else {
                        self.stats.mid_pushes += 1;
                    }
                }
            }
        }
    }

    fn end_pull_hooks(&mut self, run: &mut Run) {
        if run.stage != Stage::Pull {
            return;
        }
        for (reg, ns) in self.regs.iter_mut().zip(run.ns.iter_mut()) {
            if std::mem::take(&mut ns.hooks_started) {
                reg.comp.on_sync_end();
            }
        }
    }

    fn build_push(&mut self, cycle: &mut Run) {
        let chunk = self.settings.setex_chunk;
        for (i, reg) in self.regs.iter_mut().enumerate() {
            let writes: Vec<Write> = if reg.caps.delta {
                let writes = delta_writes(reg);
                cycle.pushed_ids[i] = writes.iter().map(|w| w.id().to_owned()).collect();
                writes
            } else {
                let snapshot = reg.comp.snapshot();
                let total: usize = snapshot.iter().map(|(_, v)| v.len()).sum();
                let avg = if snapshot.is_empty() {
                    0
                } else {
                    total / snapshot.len()
                };
                if snapshot.len() > LARGE_SNAPSHOT_ENTITIES || avg > LARGE_SNAPSHOT_AVG_BYTES {
                    self.stats.large_snapshot_warnings += 1;
                    log::warn!(
                        "sync: namespace {:?} pushes a full snapshot of {} entities, {} bytes on \
                         average; consider delta support",
                        reg.ns,
                        snapshot.len(),
                        avg
                    );
                }
                snapshot
                    .into_iter()
                    .map(|(id, v)| Write::Set(id, v))
                    .collect()
            };
            queue_writes(cycle, i, writes, chunk);
        }
    }

    fn finish_cycle(&mut self, now_ms: u64, cycle: &Run, ok: bool) {
        self.stats.last_cycle_ms = now_ms.saturating_sub(cycle.started_ms);
        let wait = if ok {
            self.stats.cycles_ok += 1;
            self.stats.last_success_ms = Some(now_ms);
            self.polls_allowed = true;
            self.next_poll_ms = Some(now_ms + self.settings.poll_ms);
            self.schedule.after_success()
        } else {
            self.stats.cycles_failed += 1;
            self.polls_allowed = false;
            self.schedule.after_failure()
        };
        self.stats.backoff_ms = self.schedule.backoff_ms();
        self.next_cycle_ms = Some(now_ms + wait);
    }

    fn fail_run(&mut self, now_ms: u64, why: SyncError) {
        match self.run.as_ref().map(|r| r.kind) {
            Some(Kind::Cycle) => self.fail_cycle(now_ms, why),
            Some(Kind::Poll) => self.fail_poll(why),
            None => {}
        }
    }

    fn fail_cycle(&mut self, now_ms: u64, why: SyncError) {
        let Some(mut cycle) = self.run.take() else {
            return;
        };
        log::warn!("sync: cycle {} failed: {why}", cycle.seq);
        self.end_pull_hooks(&mut cycle);
        // Forget its calls: their replies, if any, count as late.
        self.outstanding.retain(|_, o| o.run != Some(cycle.seq));
        self.finish_cycle(now_ms, &cycle, false);
    }

    // ---- replies ----

    fn on_run_reply(
        &mut self,
        sent: Sent,
        frames: Vec<Frame>,
        reply_len: usize,
    ) -> Result<(), SyncError> {
        match sent {
            Sent::Scan { ns, with_head, .. } => self.on_scan(ns, with_head, frames),
            Sent::LogRead {
                ns, from, count, ..
            } => {
                let frame = frames
                    .into_iter()
                    .next()
                    .ok_or_else(|| proto("no XRANGE reply"))?;
                self.on_log(ns, &from, count, frame)
            }
            Sent::LogReads(reads) => {
                if frames.len() != reads.len() {
                    return Err(proto(&format!(
                        "{} XRANGE replies for {} reads",
                        frames.len(),
                        reads.len()
                    )));
                }
                for (read, frame) in reads.into_iter().zip(frames) {
                    self.on_log(read.ns, &read.from, read.count, frame)?;
                }
                Ok(())
            }
            Sent::Mget { ns, ids, .. } => self.on_mget(ns, ids, frames, reply_len),
            Sent::DelStale { n } => {
                self.stats.stale_deleted += n as u64;
                Ok(())
            }
            Sent::Write { n, .. } => {
                self.stats.pushed += n as u64;
                Ok(())
            }
        }
    }

    fn on_scan(&mut self, ns: usize, with_head: bool, frames: Vec<Frame>) -> Result<(), SyncError> {
        let mut frames = frames.into_iter();
        if with_head {
            let head = frames
                .next()
                .ok_or_else(|| proto("XREVRANGE reply missing"))?;
            let pos = log_entries(head)?.into_iter().next().map(|e| e.id);
            if let Some(c) = self.run.as_mut() {
                c.ns[ns].new_pos = pos;
            }
        }
        let (cursor, keys) = match frames.next() {
            Some(Frame::Array(mut parts)) if parts.len() == 2 => {
                let keys = parts.pop();
                let cursor = parts.pop().and_then(|f| f.as_bytes().map(|b| b.to_vec()));
                match (cursor, keys) {
                    (Some(c), Some(Frame::Array(keys))) => (c, keys),
                    _ => return Err(proto("SCAN reply is not [cursor, keys]")),
                }
            }
            other => return Err(proto(&format!("SCAN replied {other:?}"))),
        };
        let reg = &self.regs[ns];
        let ids: Vec<String> = keys
            .iter()
            .filter_map(|k| k.as_bytes())
            .filter_map(|k| std::str::from_utf8(k).ok())
            .filter_map(|k| reg.keys.entity_id(k))
            .map(str::to_owned)
            .collect();
        self.stats.keys_scanned += ids.len() as u64;
        let scan_cap = reg.scan_cap;
        let Some(cycle) = self.run.as_mut() else {
            return Ok(());
        };
        if cursor != b"0" {
            // Next page first: enumeration overlaps with the MGETs below.
            cycle.queue.push_front(Op::Scan {
                ns,
                cursor: String::from_utf8_lossy(&cursor).into_owned(),
                count: scan_cap,
                with_head: false,
                attempt: 0,
            });
        }
        let batch = mget_batch_size(reg, &self.settings);
        queue_mgets(cycle, ns, ids, batch);
        Ok(())
    }

    fn on_log(
        &mut self,
        ns: usize,
        from: &str,
        count: usize,
        frame: Frame,
    ) -> Result<(), SyncError> {
        let entries = log_entries(frame)?;
        let batch = mget_batch_size(&self.regs[ns], &self.settings);
        let reg = &self.regs[ns];
        let Some(cycle) = self.run.as_mut() else {
            return Ok(());
        };
        // Trimming removes the oldest entries first, so our last-seen entry
        // still being there proves nothing after it was lost.
        let lost = entries.first().map(|e| e.id.as_str()) != Some(from);
        if lost && cycle.kind == Kind::Poll {
            // A poll does not scan: the next cycle does (unknown position).
            log::info!(
                "sync: change log of {:?} trimmed or gone; the next cycle scans",
                reg.ns
            );
            self.stats.log_fallbacks += 1;
            cycle.ns[ns].new_pos = None;
            return Ok(());
        }
        if lost {
            log::info!(
                "sync: change log of {:?} trimmed or gone; full scan",
                reg.ns
            );
            self.stats.log_fallbacks += 1;
            self.stats.full_scans += 1;
            cycle.ns[ns].new_pos = None;
            cycle.queue.push_back(Op::Scan {
                ns,
                cursor: "0".into(),
                count: reg.scan_cap,
                with_head: true,
                attempt: 0,
            });
            return Ok(());
        }
        let full_page = entries.len() >= count;
        let mut ids = Vec::new();
        let mut last = None;
        for entry in entries.into_iter().skip(1) {
            if entry.origin.as_deref() != Some(self.origin.as_str()) {
                for id in entry.ids.split(',').filter(|s| !s.is_empty()) {
                    if cycle.ns[ns].seen.insert(id.to_owned()) {
                        ids.push(id.to_owned());
                    }
                }
            }
            last = Some(entry.id);
        }
        if let Some(last) = last {
            if full_page {
                cycle.queue.push_front(Op::LogRead {
                    ns,
                    from: last.clone(),
                    count: reg.log_cap,
                    attempt: 0,
                });
            }
            cycle.ns[ns].new_pos = Some(last);
        }
        queue_mgets(cycle, ns, ids, batch);
        Ok(())
    }

    fn on_mget(
        &mut self,
        ns: usize,
        ids: Vec<String>,
        frames: Vec<Frame>,
        reply_len: usize,
    ) -> Result<(), SyncError> {
        let values = match frames.into_iter().next() {
            Some(Frame::Array(values)) if values.len() == ids.len() => values,
            other => {
                return Err(proto(&format!(
                    "MGET of {} keys replied {other:?}",
                    ids.len()
                )))
            }
        };
        let budget = self.settings.max_reply_bytes;
        let mget_batch = self.settings.mget_batch;
        let polling = self.run.as_ref().is_some_and(|r| r.kind == Kind::Poll);
        let reg = &mut self.regs[ns];
        let sample = reply_len / ids.len().max(1);
        reg.value_reply_bytes = if reg.value_reply_bytes == 0 {
            sample
        } else {
            (reg.value_reply_bytes * 3 + sample) / 4
        };
        if reply_len < budget / 2 && reg.mget_cap < mget_batch {
            reg.mget_cap = (reg.mget_cap + reg.mget_cap / 4 + 1).min(mget_batch);
        }
        let mut stale = Vec::new();
        for (id, value) in ids.into_iter().zip(values) {
            let payload = match value {
                Frame::Bulk(b) => b,
                Frame::Null => {
                    self.stats.missing_values += 1;
                    continue;
                }
                other => return Err(proto(&format!("MGET value {other:?}"))),
            };
            self.stats.keys_pulled += 1;
            if reg.caps.tombstones && reg.comp.is_tombstone(&id, &payload) {
                reg.comp.delete_local(&id);
                self.stats.tombstones_applied += 1;
            } else if reg.caps.stale && reg.comp.is_stale(&id, &payload) {
                stale.push(id);
            } else {
                match reg.comp.apply_remote(&id, &payload) {
                    Ok(()) => {
                        self.stats.applied += 1;
                        if polling {
                            self.stats.poll_applied += 1;
                        }
                    }
                    Err(e) => {
                        self.stats.rejected += 1;
                        log::debug!("sync: {:?}/{id}: {e}", reg.ns);
                    }
                }
            }
        }
        if !stale.is_empty() {
            if let Some(run) = self.run.as_mut() {
                run.queue.push_back(Op::DelStale { ns, ids: stale });
            }
        }
        Ok(())
    }

    /// A truncated reply is dropped whole; reads are retried smaller.
    fn on_truncated(&mut self, sent: Sent) -> Result<(), SyncError> {
        self.stats.truncations += 1;
        let command = sent.command();
        let Some(cycle) = self.run.as_mut() else {
            return Ok(());
        };
        match sent {
            Sent::LogReads(reads) => {
                // Several namespaces' reads did not fit together: each one
                // alone, then halved on its own if still too large.
                for read in reads.into_iter().rev() {
                    cycle.queue.push_front(Op::LogRead {
                        ns: read.ns,
                        from: read.from,
                        count: read.count,
                        attempt: 1,
                    });
                }
                Ok(())
            }
            Sent::Mget {
                ns,
                mut ids,
                attempt,
            } if attempt < MAX_TRUNCATION_RETRIES => {
                let reg = &mut self.regs[ns];
                if ids.len() == 1 {
                    self.stats.oversized_values += 1;
                    log::warn!(
                        "sync: {:?}/{} is larger than sync.max_reply_bytes; skipped",
                        reg.ns,
                        ids[0]
                    );
                    return Ok(());
                }
                let tail = ids.split_off(ids.len() / 2);
                reg.mget_cap = reg.mget_cap.min(ids.len()).max(1);
                cycle.queue.push_front(Op::Mget {
                    ns,
                    ids: tail,
                    attempt: attempt + 1,
                });
                cycle.queue.push_front(Op::Mget {
                    ns,
                    ids,
                    attempt: attempt + 1,
                });
                Ok(())
            }
            Sent::Scan {
                ns,
                cursor,
                count,
                with_head,
                attempt,
            } if count > 1 && attempt < MAX_TRUNCATION_RETRIES => {
                let count = count / 2;
                self.regs[ns].scan_cap = count;
                cycle.queue.push_front(Op::Scan {
                    ns,
                    cursor,
                    count,
                    with_head,
                    attempt: attempt + 1,
                });
                Ok(())
            }
            Sent::LogRead {
                ns,
                from,
                count,
                attempt,
            } if count > 2 && attempt < MAX_TRUNCATION_RETRIES => {
                let count = (count / 2).max(2);
                self.regs[ns].log_cap = count;
                cycle.queue.push_front(Op::LogRead {
                    ns,
                    from,
                    count,
                    attempt: attempt + 1,
                });
                Ok(())
            }
            _ => Err(SyncError::Truncated { command }),
        }
    }

    // ---- sending ----

    fn dispatch(&mut self, op: Op, run: Option<u64>, now_ms: u64) -> Call {
        let mut p = Pipeline::new();
        let auth = match (&self.settings.auth_username, &self.settings.auth_password) {
            (Some(user), Some(pw)) => {
                p.push(&[b"AUTH", user.as_bytes(), pw.as_bytes()]);
                true
            }
            (None, Some(pw)) => {
                p.push(&[b"AUTH", pw.as_bytes()]);
                true
            }
            _ => false,
        };
        let sent = self.encode(op, &mut p);
        let (body, expected) = p.finish();
        let id = self.next_call_id;
        self.next_call_id += 1;
        self.stats.calls_sent += 1;
        self.stats.commands_sent += expected as u64;
        self.stats.bytes_sent += body.len() as u64;
        self.outstanding.insert(
            id,
            Outstanding {
                sent,
                sent_ms: now_ms,
                expected,
                auth,
                run,
            },
        );
        Call { id, body }
    }

    fn encode(&self, op: Op, p: &mut Pipeline) -> Sent {
        let ttl = self.settings.effective_ttl_secs().to_string();
        match op {
            Op::Scan {
                ns,
                cursor,
                count,
                with_head,
                attempt,
            } => {
                let keys = &self.regs[ns].keys;
                if with_head {
                    p.push(&[
                        b"XREVRANGE",
                        keys.log_key().as_bytes(),
                        b"+",
                        b"-",
                        b"COUNT",
                        b"1",
                    ]);
                }
                let n = count.to_string();
                p.push(&[
                    b"SCAN",
                    cursor.as_bytes(),
                    b"MATCH",
                    keys.scan_pattern().as_bytes(),
                    b"COUNT",
                    n.as_bytes(),
                ]);
                Sent::Scan {
                    ns,
                    cursor,
                    count,
                    with_head,
                    attempt,
                }
            }
            Op::LogRead {
                ns,
                from,
                count,
                attempt,
            } => {
                let keys = &self.regs[ns].keys;
                let n = count.to_string();
                // Inclusive start: the first entry must be `from` itself,
                // which is how a trimmed log is detected.
                p.push(&[
                    b"XRANGE",
                    keys.log_key().as_bytes(),
                    from.as_bytes(),
                    b"+",
                    b"COUNT",
                    n.as_bytes(),
                ]);
                Sent::LogRead {
                    ns,
                    from,
                    count,
                    attempt,
                }
            }
            Op::LogReads(reads) => {
                for read in &reads {
                    let n = read.count.to_string();
                    p.push(&[
                        b"XRANGE",
                        self.regs[read.ns].keys.log_key().as_bytes(),
                        read.from.as_bytes(),
                        b"+",
                        b"COUNT",
                        n.as_bytes(),
                    ]);
                }
                Sent::LogReads(reads)
            }
            Op::Mget { ns, ids, attempt } => {
                let keys = &self.regs[ns].keys;
                let names: Vec<String> = ids.iter().map(|id| keys.entity_key(id)).collect();
                let mut args: Vec<&[u8]> = Vec::with_capacity(names.len() + 1);
                args.push(b"MGET");
                args.extend(names.iter().map(|k| k.as_bytes()));
                p.push(&args);
                Sent::Mget { ns, ids, attempt }
            }
            Op::DelStale { ns, ids } => {
                let keys = &self.regs[ns].keys;
                let names: Vec<String> = ids.iter().map(|id| keys.entity_key(id)).collect();
                let mut args: Vec<&[u8]> = Vec::with_capacity(names.len() + 1);
                args.push(b"DEL");
                args.extend(names.iter().map(|k| k.as_bytes()));
                p.push(&args);
                Sent::DelStale { n: ids.len() }
            }
            Op::Write { ns, writes } => {
                let keys = &self.regs[ns].keys;
                for w in &writes {
                    let key = keys.entity_key(w.id());
                    match w {
                        Write::Set(_, v) => p.push(&[b"SETEX", key.as_bytes(), ttl.as_bytes(), v]),
                        Write::Del(_) => p.push(&[b"DEL", key.as_bytes()]),
                    }
                }
                if self.settings.change_log_enabled() {
                    // Ids with a comma cannot be listed; the periodic full
                    // scan still carries them.
                    let ids: Vec<&str> = writes
                        .iter()
                        .map(Write::id)
                        .filter(|id| !id.contains(','))
                        .collect();
                    if !ids.is_empty() {
                        let joined = ids.join(",");
                        let maxlen = self.settings.change_log_max_entries.to_string();
                        let log = keys.log_key().as_bytes();
                        p.push(&[
                            b"XADD",
                            log,
                            b"MAXLEN",
                            b"~",
                            maxlen.as_bytes(),
                            b"*",
                            b"o",
                            self.origin.as_bytes(),
                            b"i",
                            joined.as_bytes(),
                        ]);
                        p.push(&[b"EXPIRE", log, ttl.as_bytes()]);
                    }
                }
                Sent::Write {
                    n: writes.len(),
                    ns,
                    ids: writes.iter().map(|w| w.id().to_owned()).collect(),
                }
            }
        }
    }

    // ---- write-through ----

    fn write_through_target(&mut self, ns: &str) -> Result<&mut Registered, SyncError> {
        if !self.settings.write_through {
            return Err(SyncError::WriteThroughOff);
        }
        self.regs
            .iter_mut()
            .find(|r| r.ns == ns)
            .ok_or_else(|| SyncError::UnknownNamespace(ns.to_owned()))
    }

    fn flush_write_through(&mut self, now_ms: u64, calls: &mut Vec<Call>) {
        let chunk = self.settings.setex_chunk;
        for ns in 0..self.regs.len() {
            let pending = std::mem::take(&mut self.regs[ns].write_through);
            let mut it = pending.into_iter().peekable();
            while it.peek().is_some() {
                let writes: Vec<Write> = it.by_ref().take(chunk).collect();
                self.stats.write_through_calls += 1;
                calls.push(self.dispatch(Op::Write { ns, writes }, None, now_ms));
            }
        }
    }

    fn on_write_through_reply(&mut self, sent: Sent, frames: Result<Vec<Frame>, SyncError>) {
        match (sent, frames) {
            (Sent::Write { n, ns, ids }, Ok(_)) => {
                self.stats.pushed += n as u64;
                // Written: the periodic push need not send these again.
                if let Some(reg) = self.regs.get_mut(ns) {
                    if reg.caps.delta {
                        reg.comp.clear_dirty(&ids);
                    }
                }
            }
            (_, Err(e)) => {
                // Not retried: the entity stays dirty, the periodic push
                // (or its TTL) covers it.
                self.stats.write_through_failed += 1;
                self.stats.calls_failed += 1;
                log::warn!("sync: write-through failed: {e}");
            }
            _ => {}
        }
    }

    fn expire_write_through(&mut self, now_ms: u64) {
        let timeout = self.settings.op_timeout_ms;
        let before = self.outstanding.len();
        self.outstanding
            .retain(|_, o| o.run.is_some() || now_ms.saturating_sub(o.sent_ms) < timeout);
        let expired = (before - self.outstanding.len()) as u64;
        self.stats.write_through_failed += expired;
    }
}

/// MGET keys per call: configured batch, shrunk by truncations and by the
/// observed value size so the reply fits the budget with a 25 % margin.
fn mget_batch_size(reg: &Registered, settings: &SyncSettings) -> usize {
    let mut n = settings.mget_batch.min(reg.mget_cap);
    if let Some(fit) = (settings.max_reply_bytes * 3 / 4).checked_div(reg.value_reply_bytes) {
        n = n.min(fit);
    }
    n.max(1)
}

fn queue_mgets(run: &mut Run, ns: usize, ids: Vec<String>, batch: usize) {
    let mut it = ids.into_iter().peekable();
    while it.peek().is_some() {
        let ids: Vec<String> = it.by_ref().take(batch).collect();
        run.queue.push_back(Op::Mget {
            ns,
            ids,
            attempt: 0,
        });
    }
}

/// A delta-capable namespace's changes as writes (tombstone SETEX or DEL
/// for deletions). `delta()` clears nothing: `clear_dirty` follows success.
fn delta_writes(reg: &Registered) -> Vec<Write> {
    let delta = reg.comp.delta();
    let mut writes = Vec::with_capacity(delta.updated.len() + delta.deleted.len());
    for (id, payload) in delta.updated {
        writes.push(Write::Set(id, payload));
    }
    for id in delta.deleted {
        writes.push(if reg.caps.tombstones {
            Write::Set(id.clone(), reg.comp.make_tombstone(&id))
        } else {
            Write::Del(id)
        });
    }
    writes
}

fn queue_writes(run: &mut Run, ns: usize, writes: Vec<Write>, chunk: usize) {
    let mut it = writes.into_iter().peekable();
    while it.peek().is_some() {
        let writes: Vec<Write> = it.by_ref().take(chunk).collect();
        run.queue.push_back(Op::Write { ns, writes });
    }
}
