//! Sending: the work a run (or write-through) queues, what each call in
//! flight was for, and how work becomes a RESP pipeline (AUTH first, QUIT
//! last; the commands themselves are in [`crate::sync::cmd`]) and a
//! [`Call`].

use crate::sync::cmd;
use crate::sync::resp::Pipeline;

use super::{Call, NsIndex, SyncEngine};

/// One entity write: SETEX of a payload, or DEL.
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

/// A read, the same value whether queued (in [`Op`]) or in flight (in
/// [`Sent`]): its reply and a truncation retry work on it directly.
pub(super) enum Read {
    Scan {
        ns: NsIndex,
        cursor: String,
        count: usize,
        with_head: bool,
        attempt: u32,
    },
    /// XRANGE of one namespace's change log.
    Log {
        ns: NsIndex,
        from: String,
        count: usize,
        attempt: u32,
    },
    /// A poll's first call: one XRANGE per polled namespace, one pipeline.
    Logs(Vec<LogRead>),
    Mget {
        ns: NsIndex,
        ids: Vec<String>,
        attempt: u32,
    },
}

impl Read {
    fn command(&self) -> &'static str {
        match self {
            Read::Scan { .. } => "SCAN",
            Read::Log { .. } | Read::Logs(_) => "XRANGE",
            Read::Mget { .. } => "MGET",
        }
    }
}

/// One namespace's part of [`Read::Logs`].
#[derive(Clone, Debug)]
pub(super) struct LogRead {
    pub(super) ns: NsIndex,
    pub(super) from: String,
    pub(super) count: usize,
}

/// Work not yet sent.
pub(super) enum Op {
    Read(Read),
    DelStale { ns: NsIndex, ids: Vec<String> },
    Write { ns: NsIndex, writes: Vec<Write> },
}

/// What a call in flight was for: a read as it was queued; for writes only
/// what the reply needs (payloads are dropped once encoded).
pub(super) enum Sent {
    Read(Read),
    DelStale {
        n: usize,
    },
    Write {
        ns: NsIndex,
        /// Ids written (their count goes to `pushed`); a successful
        /// write-through clears their dirty marks.
        ids: Vec<String>,
    },
}

impl Sent {
    pub(super) fn command(&self) -> &'static str {
        match self {
            Sent::Read(read) => read.command(),
            Sent::DelStale { .. } => "DEL",
            Sent::Write { .. } => "SETEX",
        }
    }
}

/// A call sent and not answered yet.
pub(super) struct Outstanding {
    pub(super) sent: Sent,
    pub(super) sent_ms: u64,
    pub(super) expected: usize,
    pub(super) auth: bool,
    /// Sequence number of the run (cycle or poll) the call belongs to;
    /// None for write-through calls, which live outside runs.
    pub(super) run: Option<u64>,
}

impl SyncEngine {
    pub(super) fn dispatch(&mut self, op: Op, run: Option<u64>, now_ms: u64) -> Call {
        let mut p = Pipeline::new();
        let auth = match &self.settings.auth_password {
            Some(pw) => {
                cmd::auth(&mut p, self.settings.auth_username.as_deref(), pw);
                true
            }
            None => false,
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
        match op {
            Op::Read(read) => {
                self.encode_read(&read, p);
                Sent::Read(read)
            }
            Op::DelStale { ns, ids } => {
                cmd::del(p, &self.entity_keys(ns, &ids));
                Sent::DelStale { n: ids.len() }
            }
            Op::Write { ns, writes } => {
                let ttl = self.settings.effective_ttl_secs();
                let keys = &self.regs[ns].keys;
                for w in &writes {
                    let key = keys.entity_key(w.id());
                    match w {
                        Write::Set(_, v) => cmd::setex(p, &key, ttl, v),
                        Write::Del(_) => cmd::del(p, &[key]),
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
                        let log = keys.log_key();
                        let max = self.settings.change_log_max_entries;
                        cmd::xadd(p, log, max, &self.origin, &ids.join(","));
                        cmd::expire(p, log, ttl);
                    }
                }
                Sent::Write {
                    ns,
                    ids: writes.iter().map(|w| w.id().to_owned()).collect(),
                }
            }
        }
    }

    fn encode_read(&self, read: &Read, p: &mut Pipeline) {
        match read {
            Read::Scan {
                ns,
                cursor,
                count,
                with_head,
                ..
            } => {
                let keys = &self.regs[*ns].keys;
                if *with_head {
                    cmd::xrevrange_newest(p, keys.log_key());
                }
                cmd::scan(p, cursor, keys.scan_pattern(), *count);
            }
            Read::Log {
                ns, from, count, ..
            } => cmd::xrange(p, self.regs[*ns].keys.log_key(), from, *count),
            Read::Logs(reads) => {
                for read in reads {
                    cmd::xrange(p, self.regs[read.ns].keys.log_key(), &read.from, read.count);
                }
            }
            Read::Mget { ns, ids, .. } => cmd::mget(p, &self.entity_keys(*ns, ids)),
        }
    }

    fn entity_keys(&self, ns: NsIndex, ids: &[String]) -> Vec<String> {
        let keys = &self.regs[ns].keys;
        ids.iter().map(|id| keys.entity_key(id)).collect()
    }
}
