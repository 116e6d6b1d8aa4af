//! Runs: the one cycle or poll in progress, how its queued work is sent
//! (up to `max_inflight_calls`) and how it moves from pull to push to done.

use std::collections::{HashSet, VecDeque};
use std::ops::{Index, IndexMut};

use super::sending::{Op, Write};
use super::{Call, NsIndex, Registered, SyncEngine};
use crate::sync::error::SyncError;

/// Where a run is: reading (pull) or writing (push).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Stage {
    Pull,
    Push,
}

/// What a run is: a scheduled cycle, or a poll between cycles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    Cycle,
    Poll,
}

/// One namespace's part of a run.
pub(super) struct NsRun {
    /// The run reads this namespace (cycles: all; polls: the polled ones).
    pub(super) active: bool,
    /// Per part: log position to keep once the pull stage is over (None:
    /// unknown, the next cycle scans that part).
    pub(super) new_pos: Vec<Option<String>>,
    pub(super) seen: HashSet<String>,
    pub(super) hooks_started: bool,
    /// Per part: keys this run's rotating-scan slice has read (None: no
    /// slice).
    pub(super) slice_keys: Vec<Option<usize>>,
}

impl Index<NsIndex> for Vec<NsRun> {
    type Output = NsRun;
    fn index(&self, ns: NsIndex) -> &NsRun {
        &self[ns.0]
    }
}

impl IndexMut<NsIndex> for Vec<NsRun> {
    fn index_mut(&mut self, ns: NsIndex) -> &mut NsRun {
        &mut self[ns.0]
    }
}

/// A cycle or a poll in progress; at most one exists.
pub(super) struct Run {
    pub(super) kind: Kind,
    pub(super) seq: u64,
    pub(super) started_ms: u64,
    pub(super) stage: Stage,
    pub(super) queue: VecDeque<Op>,
    pub(super) inflight: usize,
    pub(super) ns: Vec<NsRun>,
    pub(super) pushed_ids: Vec<Vec<String>>,
    /// Which cycle this is (decides full scans); 0 for polls.
    pub(super) index: u64,
    /// Cluster mode: the cycle waits for its `CLUSTER SLOTS` reply before
    /// queueing its reads.
    pub(super) awaiting_topology: bool,
}

impl Run {
    pub(super) fn new(kind: Kind, seq: u64, started_ms: u64, namespaces: usize) -> Self {
        Self {
            kind,
            seq,
            started_ms,
            stage: Stage::Pull,
            queue: VecDeque::new(),
            inflight: 0,
            ns: Vec::with_capacity(namespaces),
            pushed_ids: vec![Vec::new(); namespaces],
            index: 0,
            awaiting_topology: false,
        }
    }
}

impl SyncEngine {
    pub(super) fn next_seq(&mut self) -> u64 {
        let seq = self.runs_started;
        self.runs_started += 1;
        seq
    }

    /// Sends queued work up to the in-flight cap and moves the run on when
    /// a stage has drained.
    pub(super) fn pump(&mut self, now_ms: u64, calls: &mut Vec<Call>) {
        while let Some(mut run) = self.run.take() {
            while run.inflight < self.settings.max_inflight_calls {
                let Some(op) = run.queue.pop_front() else {
                    break;
                };
                // Cluster mode with K > 1 tags: one pipeline per master.
                let op = self.coalesce(op, &mut run.queue);
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
                        for (part, pos) in reg.parts.iter_mut().zip(ns.new_pos.iter_mut()) {
                            part.log_pos = pos.take();
                        }
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

    pub(super) fn end_pull_hooks(&mut self, run: &mut Run) {
        if run.stage != Stage::Pull {
            return;
        }
        for (reg, ns) in self.regs.iter_mut().zip(run.ns.iter_mut()) {
            if std::mem::take(&mut ns.hooks_started) {
                reg.comp.on_sync_end();
            }
        }
    }

    pub(super) fn fail_run(&mut self, now_ms: u64, why: SyncError) {
        match self.run.as_ref().map(|r| r.kind) {
            Some(Kind::Cycle) => self.fail_cycle(now_ms, why),
            Some(Kind::Poll) => self.fail_poll(why),
            None => {}
        }
    }
}

/// A delta-capable namespace's changes as writes (tombstone SETEX or DEL
/// for deletions). `delta()` clears nothing: `clear_dirty` follows success.
pub(super) fn delta_writes(reg: &Registered) -> Vec<Write> {
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
