//! Sending: the work a run (or write-through) queues, what each call in
//! flight was for, and how work becomes a RESP pipeline (AUTH first, QUIT
//! last; the commands themselves are in [`crate::sync::cmd`]) and a
//! [`Call`] for one Redis node (cluster mode) or the bridge's default route.

use crate::sync::cmd;
use crate::sync::keys::part_of;
use crate::sync::resp::Pipeline;

use super::{Call, NsIndex, SyncEngine};

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
        let mut p = Pipeline::new();
        let auth = match &self.settings.auth_password {
            Some(pw) => {
                cmd::auth(&mut p, self.settings.auth_username.as_deref(), pw);
                true
            }
            None => false,
        };
        p.set_asking(asking);
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
                asking,
                redirects,
                run,
            },
        );
        Call { id, body, node }
    }

    /// Cluster mode: the node owning the slot `op` touches, if known (None
    /// outside cluster mode: the bridge's default route).
    fn node_for(&self, op: &Op) -> Option<String> {
        if !self.settings.cluster {
            return None;
        }
        let (ns, part) = match op {
            Op::Work(Work::Read(Read::Slots { asked })) => return asked.clone(),
            Op::Work(Work::Read(Read::Logs(reads))) => {
                let first = reads.first()?;
                (first.ns, first.part)
            }
            Op::Work(
                Work::Read(
                    Read::Scan { ns, part, .. }
                    | Read::Log { ns, part, .. }
                    | Read::Mget { ns, part, .. },
                )
                | Work::DelStale { ns, part, .. }
                | Work::Write { ns, part, .. },
            ) => (*ns, *part),
            Op::Redirected { op, .. } => return self.node_for(op),
        };
        self.owner_of(ns, part).map(str::to_owned)
    }

    fn encode(&self, op: Op, p: &mut Pipeline) -> Work {
        let work = match op {
            Op::Work(work) => work,
            // `dispatch` unwraps redirections before encoding.
            Op::Redirected { op, .. } => return self.encode(*op, p),
        };
        match work {
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
