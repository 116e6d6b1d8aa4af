//! Sending: the work a run (or write-through) queues, what each call in
//! flight was for, and how work becomes a RESP pipeline (AUTH first, QUIT
//! last; the commands themselves are in [`crate::sync::cmd`]) and a
//! [`Call`] for one Redis node (cluster mode) or the bridge's default route.
//!
//! Cluster mode with K > 1 hash tags: queued work of one kind whose slots
//! one master owns goes out as one pipeline ([`Work::Batch`], see
//! [`SyncEngine::coalesce`]), so a push or a poll costs one call per master
//! instead of one per part.

use std::collections::VecDeque;

use crate::sync::cmd;
use crate::sync::keys::part_of;
use crate::sync::resp::Pipeline;

use super::{Call, NsIndex, SyncEngine};

/// Most pieces of work in one [`Work::Batch`].
pub(super) const MAX_BATCH_WORKS: usize = 64;
/// Queued ops [`SyncEngine::coalesce`] looks through for work to join.
const MAX_BATCH_LOOKAHEAD: usize = 256;

/// One entity write: SETEX of a payload, or DEL.
#[derive(Clone)]
pub(super) enum Write {
    Set(String, Vec<u8>),
    Del(String),
}

impl Write {
    pub(super) fn id(&self) -> &str {
        match self {
            Write::Set(id, _) | Write::Del(id) => id,
        }
    }
}

/// A read, the same value whether queued or in flight (in [`Work`]): its
/// reply and a truncation retry work on it directly.
#[derive(Clone)]
pub(super) enum Read {
    Scan {
        ns: NsIndex,
        part: usize,
        cursor: String,
        count: usize,
        with_head: bool,
        attempt: u32,
    },
    /// XRANGE of one part's change log.
    Log {
        ns: NsIndex,
        part: usize,
        from: String,
        count: usize,
        attempt: u32,
    },
    /// A poll's first call (per node in cluster mode): one XRANGE per
    /// polled part, one pipeline.
    Logs(Vec<LogRead>),
    Mget {
        ns: NsIndex,
        part: usize,
        ids: Vec<String>,
        attempt: u32,
    },
    /// Cluster mode: `CLUSTER SLOTS`, first call of every cycle, sent to
    /// `asked` (None: the bridge's default route).
    Slots { asked: Option<String> },
}

impl Read {
    fn command(&self) -> &'static str {
        match self {
            Read::Scan { .. } => "SCAN",
            Read::Log { .. } | Read::Logs(_) => "XRANGE",
            Read::Mget { .. } => "MGET",
            Read::Slots { .. } => "CLUSTER SLOTS",
        }
    }
}

/// One part's share of [`Read::Logs`].
#[derive(Clone, Debug)]
pub(super) struct LogRead {
    pub(super) ns: NsIndex,
    pub(super) part: usize,
    pub(super) from: String,
    pub(super) count: usize,
}

/// Work for Redis: queued in a run (as [`Op::Work`]), then in flight (in
/// [`Outstanding`]), enough to act on its reply and, in cluster mode, to
/// send it again elsewhere.
pub(super) enum Work {
    Read(Read),
    DelStale {
        ns: NsIndex,
        part: usize,
        ids: Vec<String>,
    },
    /// SETEX/DEL of one part's entities, then (when `log_ids` is not
    /// empty) the XADD of those ids to its change log and its EXPIRE.
    Write {
        ns: NsIndex,
        part: usize,
        /// Written (their count goes to `pushed`); a successful
        /// write-through clears their dirty marks.
        writes: Vec<Write>,
        log_ids: Vec<String>,
    },
    /// Cluster mode: pieces of work of one kind, each on one slot, all of
    /// them owned by one master, in one pipeline (one after another). Each
    /// piece's replies are acted on as if it had been sent alone: a
    /// redirection of one piece sends only that piece again. Never nested,
    /// never redirected as a whole.
    Batch(Vec<Work>),
}

/// Work not yet sent.
pub(super) enum Op {
    Work(Work),
    /// Cluster mode: `op` again after a redirection, to `node` (None: the
    /// slot's owner in the map), with `ASKING` before each command after an
    /// `ASK`; `redirects` so far.
    Redirected {
        op: Box<Op>,
        node: Option<String>,
        asking: bool,
        redirects: u32,
    },
}

impl Op {
    pub(super) fn read(read: Read) -> Self {
        Op::Work(Work::Read(read))
    }
}

impl Work {
    pub(super) fn command(&self) -> &'static str {
        match self {
            Work::Read(read) => read.command(),
            Work::DelStale { .. } => "DEL",
            Work::Write { .. } => "SETEX",
            Work::Batch(works) => works.first().map_or("QUIT", Work::command),
        }
    }
}

/// What [`SyncEngine::coalesce`] may put in one pipeline: work of one kind,
/// within what one call of that kind carries alone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BatchKind {
    /// Change-log reads (XRANGE), up to [`MAX_BATCH_WORKS`].
    Logs,
    /// MGETs of one namespace, up to one MGET's keys in all.
    Mgets(NsIndex),
    /// Entity writes (with their XADD), up to `setex_chunk` writes in all.
    Writes,
}

impl BatchKind {
    /// The kind of `work` and its size in the kind's unit; None = goes
    /// alone (scans, stale deletes, `CLUSTER SLOTS`, a retry after a
    /// truncated reply, work already batched).
    fn of(work: &Work) -> Option<(Self, usize)> {
        match work {
            Work::Read(Read::Log { attempt: 0, .. }) => Some((BatchKind::Logs, 1)),
            Work::Read(Read::Mget {
                ns,
                ids,
                attempt: 0,
                ..
            }) => Some((BatchKind::Mgets(*ns), ids.len())),
            Work::Write { writes, .. } => Some((BatchKind::Writes, writes.len().max(1))),
            _ => None,
        }
    }
}

/// A call sent and not answered yet.
pub(super) struct Outstanding {
    pub(super) sent: Work,
    pub(super) sent_ms: u64,
    pub(super) expected: usize,
    pub(super) auth: bool,
    /// Every command was preceded by `ASKING` (its replies are dropped).
    pub(super) asking: bool,
    /// Redirections that led to this call (cluster mode).
    pub(super) redirects: u32,
    /// A [`Work::Batch`]: the replies each piece expects, in order (AUTH
    /// and QUIT not counted); empty otherwise.
    pub(super) replies: Vec<usize>,
    /// Sequence number of the run (cycle or poll) the call belongs to;
    /// None for write-through calls, which live outside runs.
    pub(super) run: Option<u64>,
}

impl SyncEngine {
    pub(super) fn dispatch(&mut self, op: Op, run: Option<u64>, now_ms: u64) -> Call {
        let (op, node, asking, redirects) = match op {
            Op::Redirected {
                op,
                node,
                asking,
                redirects,
            } => {
                let node = node.or_else(|| self.node_for(&op));
                (*op, node, asking, redirects)
            }
            op => {
                let node = self.node_for(&op);
                (op, node, false, 0)
            }
        };
        if let Op::Work(Work::Read(Read::Scan {
            ns, part, cursor, ..
        })) = &op
        {
            // A pass starts here: its later pages go to the same node.
            if cursor == "0" && self.settings.cluster {
                if let Some(p) = self.regs.get_mut(ns.0).and_then(|r| r.parts.get_mut(*part)) {
                    p.scan_node.clone_from(&node);
                }
            }
        }
        let mut p = Pipeline::new();
        let auth = match &self.settings.auth_password {
            Some(pw) => {
                cmd::auth(&mut p, self.settings.auth_username.as_deref(), pw);
                true
            }
            None => false,
        };
        p.set_asking(asking);
        let mut replies = Vec::new();
        let sent = match op {
            Op::Work(Work::Batch(works)) => {
                let mut sent = Vec::with_capacity(works.len());
                for work in works {
                    let before = p.len();
                    sent.push(self.encode(Op::Work(work), &mut p));
                    replies.push(p.len() - before);
                }
                Work::Batch(sent)
            }
            op => self.encode(op, &mut p),
        };
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
                asking,
                redirects,
                run,
                replies,
            },
        );
        Call { id, body, node }
    }

    /// Whether queued work is grouped into one pipeline per master
    /// (cluster mode with K > 1 hash tags; one tag, or one Redis, sends
    /// every piece of work on its own as before).
    pub(super) fn batching(&self) -> bool {
        self.settings.cluster && self.settings.hash_tags > 1
    }

    /// Cluster mode with K > 1 tags: `first` together with the queued work
    /// (among the next [`MAX_BATCH_LOOKAHEAD`] ops) that is of its kind and
    /// goes to the same master, as one [`Work::Batch`], within what one
    /// call of that kind carries alone: `setex_chunk` entity writes, one
    /// MGET's keys, [`MAX_BATCH_WORKS`] change-log reads. Redirected work,
    /// work whose master is unknown and retries after a truncated reply go
    /// alone. Returns `first` unchanged when nothing joins it (and always
    /// when [`Self::batching`] is off).
    pub(super) fn coalesce(&self, first: Op, queue: &mut VecDeque<Op>) -> Op {
        if !self.batching() {
            return first;
        }
        let Op::Work(first) = first else {
            return first;
        };
        let Some((kind, mut size)) = BatchKind::of(&first) else {
            return Op::Work(first);
        };
        let limit = match kind {
            BatchKind::Logs => MAX_BATCH_WORKS,
            BatchKind::Mgets(ns) => self.mget_batch(ns),
            BatchKind::Writes => self.settings.setex_chunk,
        };
        let Some(node) = self.work_node(&first) else {
            return Op::Work(first);
        };
        let mut works = vec![first];
        let mut i = 0;
        let mut looked = 0;
        while i < queue.len() && looked < MAX_BATCH_LOOKAHEAD && works.len() < MAX_BATCH_WORKS {
            looked += 1;
            let joins = match &queue[i] {
                Op::Work(work) => BatchKind::of(work).is_some_and(|(k, n)| {
                    k == kind
                        && size + n <= limit
                        && self.work_node(work).is_some_and(|w| w == node)
                }),
                Op::Redirected { .. } => false,
            };
            if !joins {
                i += 1;
                continue;
            }
            if let Some(Op::Work(work)) = queue.remove(i) {
                size += BatchKind::of(&work).map_or(0, |(_, n)| n);
                works.push(work);
            }
        }
        if works.len() == 1 {
            if let Some(work) = works.pop() {
                return Op::Work(work);
            }
        }
        Op::Work(Work::Batch(works))
    }

    /// The master owning the slot one (unbatched) piece of work touches.
    fn work_node(&self, work: &Work) -> Option<&str> {
        match work {
            // A SCAN cursor is a cursor of one node's keyspace: the pages
            // after the first go where the pass started (`dispatch` notes
            // it), even if a newer map names another owner (the next cycle
            // then starts a new pass on the new owner).
            Work::Read(Read::Scan {
                ns, part, cursor, ..
            }) if cursor != "0" => {
                let p = self.regs.get(ns.0)?.parts.get(*part)?;
                p.scan_node.as_deref().or_else(|| self.owner_of(*ns, *part))
            }
            Work::Read(
                Read::Scan { ns, part, .. }
                | Read::Log { ns, part, .. }
                | Read::Mget { ns, part, .. },
            )
            | Work::DelStale { ns, part, .. }
            | Work::Write { ns, part, .. } => self.owner_of(*ns, *part),
            Work::Read(Read::Logs(reads)) => {
                let first = reads.first()?;
                self.owner_of(first.ns, first.part)
            }
            Work::Read(Read::Slots { .. }) | Work::Batch(_) => None,
        }
    }

    /// Cluster mode: the node owning the slot `op` touches, if known (None
    /// outside cluster mode: the bridge's default route).
    fn node_for(&self, op: &Op) -> Option<String> {
        if !self.settings.cluster {
            return None;
        }
        match op {
            Op::Work(Work::Read(Read::Slots { asked })) => asked.clone(),
            // Every piece of a batch goes to the same master.
            Op::Work(Work::Batch(works)) => works
                .first()
                .and_then(|w| self.work_node(w))
                .map(str::to_owned),
            Op::Work(work) => self.work_node(work).map(str::to_owned),
            Op::Redirected { op, .. } => self.node_for(op),
        }
    }

    fn encode(&self, op: Op, p: &mut Pipeline) -> Work {
        let work = match op {
            Op::Work(work) => work,
            // `dispatch` unwraps redirections before encoding.
            Op::Redirected { op, .. } => return self.encode(*op, p),
        };
        match work {
            // `dispatch` encodes a batch's pieces one by one; a nested one
            // (never built) is flattened the same way.
            Work::Batch(works) => Work::Batch(
                works
                    .into_iter()
                    .map(|w| self.encode(Op::Work(w), p))
                    .collect(),
            ),
            Work::Read(read) => {
                self.encode_read(&read, p);
                Work::Read(read)
            }
            Work::DelStale { ns, part, ids } => {
                cmd::del(p, &self.entity_keys(ns, part, &ids));
                Work::DelStale { ns, part, ids }
            }
            Work::Write {
                ns,
                part,
                writes,
                log_ids,
            } => {
                let ttl = self.settings.effective_ttl_secs();
                let keys = &self.regs[ns].parts[part].keys;
                for w in &writes {
                    let key = keys.entity_key(w.id());
                    match w {
                        Write::Set(_, v) => cmd::setex(p, &key, ttl, v),
                        Write::Del(_) => cmd::del(p, &[key]),
                    }
                }
                if !log_ids.is_empty() {
                    // Ids with a comma cannot be listed; the periodic full
                    // scan still carries them.
                    let ids: Vec<&str> = log_ids
                        .iter()
                        .map(String::as_str)
                        .filter(|id| !id.contains(','))
                        .collect();
                    if !ids.is_empty() {
                        let log = keys.log_key();
                        let max = self.settings.change_log_max_entries;
                        cmd::xadd(p, log, max, &self.origin, &ids.join(","));
                        cmd::expire(p, log, ttl);
                    }
                }
                Work::Write {
                    ns,
                    part,
                    writes,
                    log_ids,
                }
            }
        }
    }

    fn encode_read(&self, read: &Read, p: &mut Pipeline) {
        match read {
            Read::Scan {
                ns,
                part,
                cursor,
                count,
                with_head,
                ..
            } => {
                let keys = &self.regs[*ns].parts[*part].keys;
                if *with_head {
                    cmd::xrevrange_newest(p, keys.log_key());
                }
                cmd::scan(p, cursor, keys.scan_pattern(), *count);
            }
            Read::Log {
                ns,
                part,
                from,
                count,
                ..
            } => cmd::xrange(p, self.regs[*ns].parts[*part].keys.log_key(), from, *count),
            Read::Logs(reads) => {
                for read in reads {
                    let log = self.regs[read.ns].parts[read.part].keys.log_key();
                    cmd::xrange(p, log, &read.from, read.count);
                }
            }
            Read::Mget { ns, part, ids, .. } => cmd::mget(p, &self.entity_keys(*ns, *part, ids)),
            Read::Slots { .. } => cmd::cluster_slots(p),
        }
    }

    fn entity_keys(&self, ns: NsIndex, part: usize, ids: &[String]) -> Vec<String> {
        let keys = &self.regs[ns].parts[part].keys;
        ids.iter().map(|id| keys.entity_key(id)).collect()
    }

    /// Entity writes of namespace `ns` as one [`Work::Write`] per part and
    /// chunk of `chunk`, in the order given within a part (one part: the
    /// writes as given).
    pub(super) fn write_ops(&self, ns: NsIndex, writes: Vec<Write>, chunk: usize) -> Vec<Op> {
        let parts = self.regs[ns].parts.len();
        let log = self.settings.change_log_enabled();
        let mut by_part: Vec<Vec<Write>> = vec![Vec::new(); parts];
        for w in writes {
            by_part[part_of(w.id(), parts)].push(w);
        }
        let mut ops = Vec::new();
        for (part, writes) in by_part.into_iter().enumerate() {
            let mut it = writes.into_iter().peekable();
            while it.peek().is_some() {
                let writes: Vec<Write> = it.by_ref().take(chunk).collect();
                let log_ids = if log {
                    writes.iter().map(|w| w.id().to_owned()).collect()
                } else {
                    Vec::new()
                };
                ops.push(Op::Work(Work::Write {
                    ns,
                    part,
                    writes,
                    log_ids,
                }));
            }
        }
        ops
    }
}
