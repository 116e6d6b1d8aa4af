//! Write-through: single-entity writes queued by `put`/`delete`, sent on
//! the next tick outside any run, never retried (the entity stays dirty
//! for the periodic push).

use crate::sync::error::SyncError;
use crate::sync::resp::Frame;

use super::sending::Work;
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
            for op in self.write_ops(NsIndex(ns), pending, chunk) {
                self.stats.write_through_calls += 1;
                calls.push(self.dispatch(op, None, now_ms));
            }
        }
    }

    pub(super) fn on_write_through_reply(
        &mut self,
        sent: Work,
        frames: Result<Vec<Frame>, SyncError>,
    ) {
        match (sent, frames) {
            (Work::Write { ns, writes, .. }, Ok(_)) => {
                let ids: Vec<String> = writes.iter().map(|w| w.id().to_owned()).collect();
                self.stats.pushed += ids.len() as u64;
                // Written: the periodic push need not send these again.
                if let Some(reg) = self.regs.get_mut(ns.0) {
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

    pub(super) fn expire_write_through(&mut self, now_ms: u64) {
        let timeout = self.settings.op_timeout_ms;
        let before = self.outstanding.len();
        self.outstanding
            .retain(|_, o| o.run.is_some() || now_ms.saturating_sub(o.sent_ms) < timeout);
        let expired = (before - self.outstanding.len()) as u64;
        self.stats.write_through_failed += expired;
    }
}
