//! Cycle life: a scheduled cycle starts (full scan or change-log pull per
//! namespace), builds its push once the pull is over, and ends in success
//! (next cycle after the jittered period, polls allowed) or failure
//! (backoff, polls paused).

use std::collections::HashSet;

use super::runs::{delta_writes, Kind, NsRun, Run};
use super::sending::{Op, Read, Write};
use super::{NsIndex, SyncEngine, LARGE_SNAPSHOT_AVG_BYTES, LARGE_SNAPSHOT_ENTITIES};
use crate::sync::error::SyncError;

impl SyncEngine {
    pub(super) fn start_cycle(&mut self, now_ms: u64) {
        let index = self.cycles_started;
        self.cycles_started += 1;
        let seq = self.next_seq();
        let mut cycle = Run::new(Kind::Cycle, seq, now_ms, self.regs.len());
        cycle.index = index;
        for reg in &mut self.regs {
            reg.oversized.retain(|_, until| *until > now_ms);
            if reg.caps.hooks {
                reg.comp.on_sync_start();
            }
            let parts = reg.parts.len();
            cycle.ns.push(NsRun {
                active: true,
                new_pos: vec![None; parts],
                seen: HashSet::new(),
                hooks_started: reg.caps.hooks,
                slice_keys: vec![None; parts],
            });
        }
        if self.settings.cluster {
            cycle.queue.push_back(Op::read(Read::Slots {
                asked: self.topology_node(),
            }));
            if self.topology.is_some() && self.polls_allowed {
                // Healthy, with a map: the reads go out with `CLUSTER
                // SLOTS`, to the owners as last known (a `MOVED` corrects
                // any that changed); its reply replaces the map for the
                // rest of the cycle. Not a round trip before every cycle.
                self.queue_pulls(&mut cycle);
            } else {
                // First cycle, or after a failure (a master may be gone):
                // who owns which slot first; the reads follow its reply.
                cycle.awaiting_topology = true;
            }
        } else {
            self.queue_pulls(&mut cycle);
        }
        self.run = Some(cycle);
    }

    /// Queues a cycle's reads: per part, the change log (plus a rotating
    /// slice) or a full scan.
    pub(super) fn queue_pulls(&mut self, cycle: &mut Run) {
        let log = self.settings.change_log_enabled();
        let every = u64::from(self.settings.full_scan_every.max(1));
        let budget = self.settings.scan_keys_per_cycle;
        let cluster = self.settings.cluster;
        for (i, reg) in self.regs.iter_mut().enumerate() {
            // With a budget, a rotating slice replaces the periodic full
            // scan (namespaces with hooks, `podload`, whose every live writer
            // rewrites its key each period, then read only the change log);
            // a full scan still runs whenever the log position is unknown.
            let rotating = log && budget > 0;
            let sliced = rotating && !reg.caps.hooks;
            let full_cycle = !log || (!rotating && cycle.index % every == 0);
            // The budget is shared by the parts.
            let part_budget = budget.div_ceil(reg.parts.len()).max(1);
            let scan_cap = reg.scan_cap;
            for (p, part) in reg.parts.iter_mut().enumerate() {
                if cluster {
                    // A cursor is a cursor of one node's keyspace.
                    let owner = self
                        .topology
                        .as_ref()
                        .and_then(|t| t.owner(part.slot))
                        .map(str::to_owned);
                    if part.scan_node != owner {
                        part.scan_cursor = None;
                        part.scan_node = owner;
                    }
                }
                let pos = if full_cycle {
                    None
                } else {
                    part.log_pos.clone()
                };
                match &pos {
                    Some(from) => {
                        self.stats.incremental_pulls += 1;
                        cycle.queue.push_back(Op::read(Read::Log {
                            ns: NsIndex(i),
                            part: p,
                            from: from.clone(),
                            count: reg.log_cap,
                            attempt: 0,
                        }));
                        if sliced {
                            self.stats.scan_slices += 1;
                            cycle.ns[i].slice_keys[p] = Some(0);
                            cycle.queue.push_back(Op::read(Read::Scan {
                                ns: NsIndex(i),
                                part: p,
                                cursor: part.scan_cursor.clone().unwrap_or_else(|| "0".into()),
                                count: scan_cap.min(part_budget),
                                with_head: false,
                                attempt: 0,
                            }));
                        }
                    }
                    None => {
                        // This scan covers everything: a new pass starts after.
                        part.scan_cursor = None;
                        self.stats.full_scans += 1;
                        cycle.queue.push_back(Op::read(Read::Scan {
                            ns: NsIndex(i),
                            part: p,
                            cursor: "0".into(),
                            count: scan_cap,
                            with_head: log,
                            attempt: 0,
                        }));
                    }
                }
                cycle.ns[i].new_pos[p] = pos;
            }
        }
    }

    pub(super) fn build_push(&mut self, cycle: &mut Run) {
        let chunk = self.settings.setex_chunk;
        for i in 0..self.regs.len() {
            let reg = &mut self.regs[i];
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
            let ops = self.write_ops(NsIndex(i), writes, chunk);
            cycle.queue.extend(ops);
        }
    }

    pub(super) fn finish_cycle(&mut self, now_ms: u64, cycle: &Run, ok: bool) {
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
            // Ask another node for the slots next time.
            self.topology_turn = self.topology_turn.wrapping_add(1);
            self.schedule.after_failure()
        };
        self.stats.backoff_ms = self.schedule.backoff_ms();
        self.next_cycle_ms = Some(now_ms + wait);
    }

    pub(super) fn fail_cycle(&mut self, now_ms: u64, why: SyncError) {
        let Some(mut cycle) = self.run.take() else {
            return;
        };
        log::warn!("sync: cycle {} failed: {why}", cycle.seq);
        self.end_pull_hooks(&mut cycle);
        // Forget its calls: their replies, if any, count as late.
        self.outstanding.retain(|_, o| o.run != Some(cycle.seq));
        self.finish_cycle(now_ms, &cycle, false);
    }
}
