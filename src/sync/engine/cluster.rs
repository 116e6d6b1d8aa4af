//! Redis Cluster mode (`sync.cluster`): the slot map every cycle starts by
//! reading, which node each call goes to, and what a redirection does.
//!
//! - Every cycle reads `CLUSTER SLOTS` (from a known master, turning to
//!   the next one after a failed cycle, and to the bridge's default route
//!   when none is known). While sync is healthy (the last run succeeded)
//!   and a map is known, the cycle's reads go out with it, routed by the
//!   map as last known; otherwise (first cycle, after a failure: a master
//!   may be gone) they are queued once its reply is in.
//! - With K > 1 hash tags, queued work of one kind for the parts one master
//!   holds goes as one pipeline ([`super::sending::Work::Batch`]); each
//!   piece's replies are handled as if it had been sent alone, so a
//!   redirection of one piece sends only that piece again.
//! - `MOVED slot node`: the map is patched and the command goes again to
//!   that node. `ASK slot node` (a slot being migrated, the key already
//!   moved): the command goes again to that node after `ASKING`, only that
//!   command (a write that landed on the source is not repeated, so a key
//!   never exists on both sides of a migration; a redirected change-log
//!   entry goes again with every id it listed). `TRYAGAIN` (an MGET whose
//!   keys are split by a migration): the MGET is split down to single keys.
//! - A call is redirected at most [`MAX_REDIRECTS`] times; past that the
//!   run fails like any Redis error (counted, backoff, never a trap).
//! - A node that cannot be reached fails the run; the next cycle reads the
//!   slots again, from another node, so a replica promoted by a failover is
//!   used as soon as the cluster names it.

use crate::sync::error::SyncError;
use crate::sync::reply::{redirect, Redirect};
use crate::sync::resp::Frame;
use crate::sync::topology::SlotMap;

use super::runs::Kind;
use super::sending::{Op, Read, Work, Write};
use super::{NsIndex, SyncEngine};

/// Most redirections one piece of work follows before its run fails.
pub(crate) const MAX_REDIRECTS: u32 = 5;

impl SyncEngine {
    /// The master owning `key`'s slot, as last known (None outside cluster
    /// mode or before the first `CLUSTER SLOTS`).
    pub(crate) fn owner_of_key(&self, key: &[u8]) -> Option<&str> {
        self.topology
            .as_ref()?
            .owner(crate::sync::keys::key_slot(key))
    }

    /// The master owning part `part` of namespace `ns`, as last known.
    pub(super) fn owner_of(&self, ns: NsIndex, part: usize) -> Option<&str> {
        let slot = self.regs.get(ns.0)?.parts.get(part)?.slot;
        self.topology.as_ref()?.owner(slot)
    }

    /// Where the next `CLUSTER SLOTS` goes: the known masters in turn, then
    /// the bridge's default route (None), and again.
    pub(super) fn topology_node(&self) -> Option<String> {
        let nodes = self
            .topology
            .as_ref()
            .map(SlotMap::nodes)
            .unwrap_or_default();
        nodes
            .get(self.topology_turn % (nodes.len() + 1))
            .map(|n| (*n).to_owned())
    }

    /// A `CLUSTER SLOTS` reply: the new map, then the cycle's reads if they
    /// waited for it.
    pub(super) fn on_slots(
        &mut self,
        asked: Option<&str>,
        frames: Vec<Frame>,
    ) -> Result<(), SyncError> {
        let frame = frames.into_iter().next();
        let map = frame
            .as_ref()
            .and_then(|f| SlotMap::parse(f, asked))
            .ok_or_else(|| SyncError::Protocol("CLUSTER SLOTS reply unusable".into()))?;
        self.topology = Some(map);
        self.stats.topology_refreshes += 1;
        if let Some(mut run) = self.run.take() {
            if run.kind == Kind::Cycle && std::mem::take(&mut run.awaiting_topology) {
                self.queue_pulls(&mut run);
            }
            self.run = Some(run);
        }
        Ok(())
    }

    /// The replies to one piece of work (`sent`, a call's or its share of
    /// a batch; `so_far` redirections led to it) with at least one
    /// redirection among them: what succeeded counts, what was redirected
    /// is returned as work to send again (the caller queues it in the run,
    /// or dispatches it for write-through). Any other error reply fails it.
    pub(super) fn on_redirect(
        &mut self,
        sent: Work,
        so_far: u32,
        frames: Vec<Frame>,
    ) -> (Result<(), SyncError>, Vec<Op>) {
        let redirects: Vec<Option<Redirect>> = frames.iter().map(redirect).collect();
        let other_error = frames
            .iter()
            .zip(&redirects)
            .find(|(f, r)| matches!(f, Frame::Error(_)) && r.is_none());
        if let Some((Frame::Error(msg), _)) = other_error {
            return (Err(SyncError::Redis(msg.clone())), Vec::new());
        }
        if so_far >= MAX_REDIRECTS {
            self.stats.redirects_exhausted += 1;
            let msg = frames.iter().find_map(|f| match f {
                Frame::Error(msg) => Some(msg.clone()),
                _ => None,
            });
            let msg = msg.unwrap_or_default();
            log::warn!("sync: still redirected after {MAX_REDIRECTS} redirections: {msg}");
            return (Err(SyncError::Redis(msg)), Vec::new());
        }
        for r in redirects.iter().flatten() {
            match r {
                Redirect::Moved { slot, node } => {
                    self.stats.moved_redirects += 1;
                    if let Some(map) = self.topology.as_mut() {
                        map.set_owner(*slot, node);
                    }
                }
                Redirect::Ask { .. } => self.stats.ask_redirects += 1,
                Redirect::TryAgain => self.stats.tryagain_retries += 1,
            }
        }
        let next = so_far + 1;
        let again = |op: Op, r: &Redirect| match r {
            Redirect::Moved { node, .. } => Op::Redirected {
                op: Box::new(op),
                node: Some(node.clone()),
                asking: false,
                redirects: next,
            },
            Redirect::Ask { node } => Op::Redirected {
                op: Box::new(op),
                node: Some(node.clone()),
                asking: true,
                redirects: next,
            },
            Redirect::TryAgain => Op::Redirected {
                op: Box::new(op),
                node: None,
                asking: false,
                redirects: next,
            },
        };
        let first = redirects.iter().flatten().next().cloned();
        let Some(first) = first else {
            return (Ok(()), Vec::new());
        };
        match sent {
            Work::Read(Read::Logs(reads)) => {
                // Each part's log on its own: the redirected ones again,
                // the others read now.
                let mut ops = Vec::new();
                for ((read, frame), r) in reads.into_iter().zip(frames).zip(&redirects) {
                    match r {
                        Some(r) => ops.push(again(
                            Op::read(Read::Log {
                                ns: read.ns,
                                part: read.part,
                                from: read.from,
                                count: read.count,
                                attempt: 0,
                            }),
                            r,
                        )),
                        None => {
                            if let Err(e) =
                                self.on_log(read.ns, read.part, &read.from, read.count, frame)
                            {
                                return (Err(e), Vec::new());
                            }
                        }
                    }
                }
                (Ok(()), ops)
            }
            Work::Read(Read::Mget {
                ns,
                part,
                mut ids,
                attempt,
            }) if first == Redirect::TryAgain && ids.len() > 1 => {
                // Some keys moved, some not: one key per call, each then
                // answered or redirected on its own.
                let ops = ids
                    .drain(..)
                    .map(|id| {
                        again(
                            Op::read(Read::Mget {
                                ns,
                                part,
                                ids: vec![id],
                                attempt,
                            }),
                            &first,
                        )
                    })
                    .collect();
                (Ok(()), ops)
            }
            Work::Write {
                ns,
                part,
                writes,
                log_ids,
            } => {
                // One reply per entity write, then XADD and EXPIRE (when the
                // log was written): only the redirected commands go again.
                // A redirected XADD is sent again with every id it listed
                // (the values that landed on the source included), after the
                // redirected values in the same pipeline.
                let n = writes.len();
                let mut redo: Vec<Write> = Vec::new();
                for (w, r) in writes.into_iter().zip(&redirects) {
                    if r.is_some() {
                        redo.push(w);
                    } else {
                        self.stats.pushed += 1;
                    }
                }
                let log_redirect = redirects.get(n).cloned().flatten();
                let log_again = !log_ids.is_empty() && log_redirect.is_some();
                if redo.is_empty() && !log_again {
                    return (Ok(()), Vec::new());
                }
                let how = if redo.is_empty() {
                    log_redirect.unwrap_or(first)
                } else {
                    first
                };
                let op = Op::Work(Work::Write {
                    ns,
                    part,
                    writes: redo,
                    log_ids: if log_again { log_ids } else { Vec::new() },
                });
                (Ok(()), vec![again(op, &how)])
            }
            Work::DelStale { ids, .. } => {
                // Stale keys leave by TTL anyway: not chased.
                let done = redirects.iter().filter(|r| r.is_none()).count();
                self.stats.stale_deleted += done.min(ids.len()) as u64;
                (Ok(()), Vec::new())
            }
            // `on_response` gives every piece of a batch its own replies.
            Work::Batch(_) => (
                Err(SyncError::Protocol("a batch's replies not split".into())),
                Vec::new(),
            ),
            sent => (Ok(()), vec![again(Op::Work(sent), &first)]),
        }
    }
}
