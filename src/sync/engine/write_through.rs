//! Write-through: single-entity writes queued by `put`/`delete`, sent on
//! the next tick outside any run, never retried (the entity stays dirty
//! for the periodic push).

use std::collections::VecDeque;

use crate::sync::error::SyncError;

use super::sending::{Op, Work};
use super::{Call, NsIndex, Registered, SyncEngine};

impl SyncEngine {
    pub(super) fn write_through_target(&mut self, ns: &str) -> Result<&mut Registered, SyncError> {
        if !self.settings.write_through {
            return Err(SyncError::WriteThroughOff);
        }
        self.regs
            .iter_mut()
            .find(|r| r.ns == ns)
            .ok_or_else(|| SyncError::UnknownNamespace(ns.to_owned()))
    }

    pub(super) fn flush_write_through(&mut self, now_ms: u64, calls: &mut Vec<Call>) {
        let chunk = self.settings.setex_chunk;
        for ns in 0..self.regs.len() {
            let pending = std::mem::take(&mut self.regs[ns].write_through);
            if pending.is_empty() {
                continue;
            }
            // Cluster mode with K > 1 tags: one pipeline per master.
            let mut ops: VecDeque<Op> = self.write_ops(NsIndex(ns), pending, chunk).into();
            while let Some(op) = ops.pop_front() {
                let op = self.coalesce(op, &mut ops);
                self.stats.write_through_calls += 1;
                calls.push(self.dispatch(op, None, now_ms));
            }
        }
    }

    /// One written-through piece confirmed: counted, its dirty marks
    /// cleared (the periodic push need not send these again).
    pub(super) fn on_written_through(&mut self, sent: Work) {
        let Work::Write { ns, writes, .. } = sent else {
            return;
        };
        let ids: Vec<String> = writes.iter().map(|w| w.id().to_owned()).collect();
        self.stats.pushed += ids.len() as u64;
        if let Some(reg) = self.regs.get_mut(ns.0) {
            if reg.caps.delta {
                reg.comp.clear_dirty(&ids);
            }
        }
    }

    /// A write-through call failed (or a piece of it): not retried, the
    /// entities stay dirty, the periodic push (or their TTL) covers them.
    pub(super) fn on_write_through_failed(&mut self, e: &SyncError) {
        self.stats.write_through_failed += 1;
        self.stats.calls_failed += 1;
        log::warn!("sync: write-through failed: {e}");
    }

    pub(super) fn expire_write_through(&mut self, now_ms: u64) {
        let timeout = self.settings.op_timeout_ms;
        let before = self.outstanding.len();
        self.outstanding
            .retain(|_, o| o.run.is_some() || now_ms.saturating_sub(o.sent_ms) < timeout);
        let expired = (before - self.outstanding.len()) as u64;
        self.stats.write_through_failed += expired;
    }
}
