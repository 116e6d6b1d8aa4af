//! Polls: between cycles, one call reads the change logs of the pollable
//! namespaces; once `push_ms` has passed since the last push, the poll goes
//! on to push their deltas (rules in [`SyncEngine::tick`]).

use std::collections::HashSet;

use super::runs::{delta_writes, Kind, NsRun, Run, Stage};
use super::sending::{LogRead, Op, Read};
use super::{NsIndex, Registered, SyncEngine};
use crate::sync::error::SyncError;

impl SyncEngine {
    pub(super) fn poll_due(&self, now_ms: u64) -> bool {
        // A poll due within 10 % of poll_ms counts as due, so a host tick
        // that fires a little early does not skip a whole interval.
        let early = self.settings.poll_ms / 10;
        self.settings.polling_enabled()
            && self.polls_allowed
            && self.next_poll_ms.is_some_and(|t| now_ms + early >= t)
    }

    /// Namespaces a poll reads: delta-capable, no hooks, every part's log
    /// position known.
    fn pollable(reg: &Registered) -> bool {
        reg.caps.delta && !reg.caps.hooks && reg.parts.iter().all(|p| p.log_pos.is_some())
    }

    pub(super) fn start_poll(&mut self, now_ms: u64) {
        self.next_poll_ms = Some(now_ms + self.settings.poll_ms);
        let mut reads = Vec::new();
        let mut nss = Vec::with_capacity(self.regs.len());
        for (i, reg) in self.regs.iter().enumerate() {
            let active = Self::pollable(reg);
            if active {
                for (p, part) in reg.parts.iter().enumerate() {
                    if let Some(from) = &part.log_pos {
                        reads.push(LogRead {
                            ns: NsIndex(i),
                            part: p,
                            from: from.clone(),
                            count: reg.log_cap,
                        });
                    }
                }
            }
            nss.push(NsRun {
                active,
                new_pos: reg
                    .parts
                    .iter()
                    .map(|p| p.log_pos.clone().filter(|_| active))
                    .collect(),
                seen: HashSet::new(),
                hooks_started: false,
                slice_keys: vec![None; reg.parts.len()],
            });
        }
        if reads.is_empty() {
            return;
        }
        let seq = self.next_seq();
        let mut poll = Run::new(Kind::Poll, seq, now_ms, self.regs.len());
        poll.ns = nss;
        // One call, or in cluster mode one per node.
        let mut groups: Vec<(Option<String>, Vec<LogRead>)> = Vec::new();
        for read in reads {
            let node = if self.settings.cluster {
                self.owner_of(read.ns, read.part).map(str::to_owned)
            } else {
                None
            };
            match groups.iter_mut().find(|(n, _)| *n == node) {
                Some((_, group)) => group.push(read),
                None => groups.push((node, vec![read])),
            }
        }
        for (_, reads) in groups {
            let op = match <[LogRead; 1]>::try_from(reads) {
                Ok([one]) => Op::read(Read::Log {
                    ns: one.ns,
                    part: one.part,
                    from: one.from,
                    count: one.count,
                    attempt: 0,
                }),
                Err(reads) => Op::read(Read::Logs(reads)),
            };
            poll.queue.push_back(op);
        }
        self.run = Some(poll);
    }

    /// A poll's push due: at least `push_ms` since the last push.
    fn poll_push_due(&self, now_ms: u64) -> bool {
        self.last_push_ms
            .is_some_and(|t| now_ms >= t + self.settings.push_ms)
    }

    /// After a poll's reads: keep the new log positions (None = the log was
    /// trimmed or gone, the next cycle scans) and, when due, queue the
    /// delta push of the namespaces this poll read completely.
    pub(super) fn end_poll_reads(&mut self, poll: &mut Run, now_ms: u64) {
        self.stats.polls_ok += 1;
        let mut pushable = vec![false; self.regs.len()];
        for ((reg, ns), ok) in self
            .regs
            .iter_mut()
            .zip(poll.ns.iter_mut())
            .zip(pushable.iter_mut())
        {
            if ns.active {
                for (part, pos) in reg.parts.iter_mut().zip(ns.new_pos.iter_mut()) {
                    part.log_pos = pos.take();
                }
                *ok = reg.parts.iter().all(|p| p.log_pos.is_some());
            }
        }
        if !self.poll_push_due(now_ms) {
            return;
        }
        // Pull first still holds: every namespace pushed here was just
        // refreshed by this poll (the others wait for the cycle). An empty
        // delta counts as a push too, so `delta()` (which walks the dirty
        // set) runs at most every `push_ms`.
        self.last_push_ms = Some(now_ms);
        let chunk = self.settings.setex_chunk;
        for (i, ok) in pushable.into_iter().enumerate() {
            if !ok {
                continue;
            }
            let writes = delta_writes(&self.regs[i]);
            poll.pushed_ids[i] = writes.iter().map(|w| w.id().to_owned()).collect();
            let ops = self.write_ops(NsIndex(i), writes, chunk);
            poll.queue.extend(ops);
        }
    }

    pub(super) fn fail_poll(&mut self, why: SyncError) {
        let Some(poll) = self.run.take() else {
            return;
        };
        if poll.stage == Stage::Push {
            self.stats.mid_pushes_failed += 1;
            log::warn!("sync: a poll's push failed: {why}; polls pause until a cycle succeeds");
        } else {
            self.stats.polls_failed += 1;
            log::warn!("sync: poll failed: {why}; polls pause until a cycle succeeds");
        }
        self.polls_allowed = false;
        // Its log positions stay where they were: the next cycle re-reads.
        self.outstanding.retain(|_, o| o.run != Some(poll.seq));
    }
}
