//! Replies: what a run does with each answer (SCAN pages, change-log
//! entries, MGET values, confirmed writes) and how a truncated reply is
//! retried smaller.

use std::collections::BTreeMap;

use crate::sync::error::SyncError;
use crate::sync::reply::{log_entries, proto};
use crate::sync::resp::Frame;
use crate::sync::settings::SyncSettings;

use super::runs::{Kind, Run};
use super::sending::{Op, Read, Work};
use super::{
    NsIndex, Registered, SyncEngine, MAX_OVERSIZED_REMEMBERED, MAX_SCAN_COUNT,
    MAX_TRUNCATION_RETRIES,
};

/// The change-log position before any entry (`XRANGE` reads after it).
const LOG_START: &str = "0-0";

impl SyncEngine {
    pub(super) fn on_run_reply(
        &mut self,
        sent: Work,
        frames: Vec<Frame>,
        reply_len: usize,
        now_ms: u64,
    ) -> Result<(), SyncError> {
        match sent {
            Work::Read(read) => self.on_read(read, frames, reply_len, now_ms),
            Work::DelStale { ids, .. } => {
                self.stats.stale_deleted += ids.len() as u64;
                Ok(())
            }
            Work::Write { writes, .. } => {
                self.stats.pushed += writes.len() as u64;
                Ok(())
            }
            // `on_response` gives every piece of a batch its own replies.
            Work::Batch(_) => Err(proto("a batch's replies not split")),
        }
    }

    fn on_read(
        &mut self,
        read: Read,
        frames: Vec<Frame>,
        reply_len: usize,
        now_ms: u64,
    ) -> Result<(), SyncError> {
        match read {
            Read::Scan {
                ns,
                part,
                with_head,
                count,
                ..
            } => self.on_scan(ns, part, with_head, count, frames, reply_len),
            Read::Log {
                ns,
                part,
                from,
                count,
                ..
            } => {
                let frame = frames
                    .into_iter()
                    .next()
                    .ok_or_else(|| proto("no XRANGE reply"))?;
                self.on_log(ns, part, &from, count, frame)
            }
            Read::Logs(reads) => {
                if frames.len() != reads.len() {
                    return Err(proto(&format!(
                        "{} XRANGE replies for {} reads",
                        frames.len(),
                        reads.len()
                    )));
                }
                for (read, frame) in reads.into_iter().zip(frames) {
                    self.on_log(read.ns, read.part, &read.from, read.count, frame)?;
                }
                Ok(())
            }
            Read::Mget { ns, part, ids, .. } => {
                self.on_mget(ns, part, ids, frames, reply_len, now_ms)
            }
            Read::Slots { asked } => self.on_slots(asked.as_deref(), frames),
        }
    }

    fn on_scan(
        &mut self,
        ns: NsIndex,
        part: usize,
        with_head: bool,
        count: usize,
        frames: Vec<Frame>,
        reply_len: usize,
    ) -> Result<(), SyncError> {
        let mut frames = frames.into_iter();
        if with_head {
            let head = frames
                .next()
                .ok_or_else(|| proto("XREVRANGE reply missing"))?;
            // No log yet (a fresh Redis, or one idle past the log's TTL):
            // everything appended from now on is new, so read from the start
            // instead of keeping polls off until a later cycle finds a head.
            let pos = log_entries(head)?
                .into_iter()
                .next()
                .map_or_else(|| LOG_START.to_string(), |e| e.id);
            if let Some(c) = self.run.as_mut() {
                c.ns[ns].new_pos[part] = Some(pos);
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
        let layout = &self.regs[ns].parts[part].keys;
        let ids: Vec<String> = keys
            .iter()
            .filter_map(|k| k.as_bytes())
            .filter_map(|k| std::str::from_utf8(k).ok())
            .filter_map(|k| layout.entity_id(k))
            .map(str::to_owned)
            .collect();
        self.stats.keys_scanned += ids.len() as u64;
        let ids = self.skip_oversized(ns, ids);
        // A page whose reply used under a quarter of the budget doubles the
        // next one (up to MAX_SCAN_COUNT): SCAN walks the whole keyspace
        // whatever it matches, so a namespace holding few of its keys (the
        // one-key-per-replica `podload` beside a large `prefixcache`) would
        // otherwise take hundreds of calls to find a handful. A reply over
        // budget halves it again (see the truncation retry).
        if reply_len.saturating_mul(4) < self.settings.max_reply_bytes {
            let grown = count.saturating_mul(2).min(MAX_SCAN_COUNT);
            let reg = &mut self.regs[ns];
            reg.scan_cap = reg.scan_cap.max(grown);
        }
        let budget = self.settings.scan_keys_per_cycle;
        let reg = &mut self.regs[ns];
        let scan_cap = reg.scan_cap;
        let Some(cycle) = self.run.as_mut() else {
            return Ok(());
        };
        // A rotating slice stops once it has walked its keys (SCAN's COUNT:
        // Redis's work, whatever matched) and keeps the cursor for the next
        // cycle; the pass ends when the cursor comes back to 0.
        let part_budget = budget.div_ceil(reg.parts.len()).max(1);
        if let Some(read) = cycle.ns[ns].slice_keys[part].as_mut() {
            *read += count;
            if cursor == b"0" {
                reg.parts[part].scan_cursor = None;
                self.stats.scan_passes += 1;
            } else if *read >= part_budget {
                reg.parts[part].scan_cursor = Some(String::from_utf8_lossy(&cursor).into_owned());
                let batch = mget_batch_size(reg, &self.settings);
                queue_mgets(cycle, ns, part, ids, batch);
                return Ok(());
            }
        }
        let slice_cap = cycle.ns[ns].slice_keys[part].map_or(scan_cap, |read| {
            scan_cap.min(part_budget.saturating_sub(read).max(1))
        });
        let reg = &self.regs[ns];
        if cursor != b"0" {
            // Next page first: enumeration overlaps with the MGETs below.
            cycle.queue.push_front(Op::read(Read::Scan {
                ns,
                part,
                cursor: String::from_utf8_lossy(&cursor).into_owned(),
                count: slice_cap,
                with_head: false,
                attempt: 0,
            }));
        }
        let batch = mget_batch_size(reg, &self.settings);
        queue_mgets(cycle, ns, part, ids, batch);
        Ok(())
    }

    pub(super) fn on_log(
        &mut self,
        ns: NsIndex,
        part: usize,
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
        // still being there proves nothing after it was lost. From the start
        // of a log (none existed at the last scan) every entry is new.
        let from_start = from == LOG_START;
        let lost = !from_start && entries.first().map(|e| e.id.as_str()) != Some(from);
        if lost && cycle.kind == Kind::Poll {
            // A poll does not scan: the next cycle does (unknown position).
            log::info!(
                "sync: change log of {:?} trimmed or gone; the next cycle scans",
                reg.ns
            );
            self.stats.log_fallbacks += 1;
            cycle.ns[ns].new_pos[part] = None;
            return Ok(());
        }
        if lost {
            log::info!(
                "sync: change log of {:?} trimmed or gone; full scan",
                reg.ns
            );
            self.stats.log_fallbacks += 1;
            self.stats.full_scans += 1;
            cycle.ns[ns].new_pos[part] = None;
            cycle.queue.push_back(Op::read(Read::Scan {
                ns,
                part,
                cursor: "0".into(),
                count: reg.scan_cap,
                with_head: true,
                attempt: 0,
            }));
            return Ok(());
        }
        let full_page = entries.len() >= count;
        let mut ids = Vec::new();
        let mut last = None;
        for entry in entries.into_iter().skip(usize::from(!from_start)) {
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
                cycle.queue.push_front(Op::read(Read::Log {
                    ns,
                    part,
                    from: last.clone(),
                    count: reg.log_cap,
                    attempt: 0,
                }));
            }
            cycle.ns[ns].new_pos[part] = Some(last);
        }
        queue_mgets(cycle, ns, part, ids, batch);
        Ok(())
    }

    fn on_mget(
        &mut self,
        ns: NsIndex,
        part: usize,
        ids: Vec<String>,
        frames: Vec<Frame>,
        reply_len: usize,
        now_ms: u64,
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
        let polling = self.run.as_ref().is_some_and(|r| r.kind == Kind::Poll);
        // A value larger than a whole reply may be is treated as if the
        // bridge had cut it (whether it did depends on Redis's timing): not
        // applied, remembered, and kept out of the size estimate so it does
        // not shrink the batches of the namespace's ordinary values.
        let budget = self.settings.max_reply_bytes;
        let is_oversized = |v: &Frame| matches!(v, Frame::Bulk(b) if b.len() > budget);
        let (big_n, big_bytes) = values
            .iter()
            .filter(|v| is_oversized(v))
            .fold((0, 0), |(n, bytes), v| {
                (n + 1, bytes + v.as_bytes().map_or(0, <[u8]>::len))
            });
        let until = now_ms.saturating_add(oversized_memory_ms(&self.settings));
        let reg = &mut self.regs[ns];
        if big_n < ids.len() {
            let sample = reply_len.saturating_sub(big_bytes) / (ids.len() - big_n);
            reg.value_reply_bytes = if reg.value_reply_bytes == 0 {
                sample
            } else {
                (reg.value_reply_bytes * 3 + sample) / 4
            };
        }
        let mut stale = Vec::new();
        for (id, value) in ids.into_iter().zip(values) {
            let payload = match value {
                Frame::Bulk(b) if b.len() > budget => {
                    self.stats.oversized_values += 1;
                    log::warn!(
                        "sync: {:?}/{id} ({} bytes) is larger than sync.max_reply_bytes; skipped",
                        reg.ns,
                        b.len()
                    );
                    remember_oversized(&mut reg.oversized, id, until);
                    continue;
                }
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
                run.queue.push_back(Op::Work(Work::DelStale {
                    ns,
                    part,
                    ids: stale,
                }));
            }
        }
        Ok(())
    }

    /// `ids` without those recently found too large to fetch (counted).
    fn skip_oversized(&mut self, ns: NsIndex, mut ids: Vec<String>) -> Vec<String> {
        let reg = &self.regs[ns];
        if reg.oversized.is_empty() {
            return ids;
        }
        let before = ids.len();
        ids.retain(|id| !reg.oversized.contains_key(id));
        self.stats.oversized_skipped += (before - ids.len()) as u64;
        ids
    }

    /// A truncated reply is dropped whole; reads are retried smaller.
    pub(super) fn on_truncated(&mut self, sent: Work, now_ms: u64) -> Result<(), SyncError> {
        self.stats.truncations += 1;
        let command = sent.command();
        let Some(cycle) = self.run.as_mut() else {
            return Ok(());
        };
        let read = match sent {
            Work::Read(read) => read,
            Work::Batch(works) => {
                // Pieces that fit alone did not fit together: each read goes
                // again on its own (a retry is never batched again), then
                // shrinks on its own if still too large. Writes' replies are
                // a few bytes: a truncated one is a failure, as alone.
                let mut reads = Vec::with_capacity(works.len());
                for work in works {
                    match work {
                        Work::Read(read) => reads.push(read),
                        _ => return Err(SyncError::Truncated { command }),
                    }
                }
                for read in reads.into_iter().rev() {
                    cycle.queue.push_front(Op::read(retry_alone(read)));
                }
                return Ok(());
            }
            _ => return Err(SyncError::Truncated { command }),
        };
        match read {
            Read::Logs(reads) => {
                // Several namespaces' reads did not fit together: each one
                // alone, then halved on its own if still too large.
                for read in reads.into_iter().rev() {
                    cycle.queue.push_front(Op::read(Read::Log {
                        ns: read.ns,
                        part: read.part,
                        from: read.from,
                        count: read.count,
                        attempt: 1,
                    }));
                }
                Ok(())
            }
            Read::Mget {
                ns,
                part,
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
                    let until = now_ms.saturating_add(oversized_memory_ms(&self.settings));
                    remember_oversized(&mut reg.oversized, ids.swap_remove(0), until);
                    return Ok(());
                }
                // Halves until the replies fit. The batch size of later
                // MGETs is not cut here: it follows the value sizes seen in
                // replies that fit (`value_reply_bytes`), so one large value
                // (a hostile writer's) does not shrink every later batch.
                let tail = ids.split_off(ids.len() / 2);
                cycle.queue.push_front(Op::read(Read::Mget {
                    ns,
                    part,
                    ids: tail,
                    attempt: attempt + 1,
                }));
                cycle.queue.push_front(Op::read(Read::Mget {
                    ns,
                    part,
                    ids,
                    attempt: attempt + 1,
                }));
                Ok(())
            }
            Read::Scan {
                ns,
                part,
                cursor,
                count,
                with_head,
                attempt,
            } if count > 1 && attempt < MAX_TRUNCATION_RETRIES => {
                let count = count / 2;
                self.regs[ns].scan_cap = count;
                cycle.queue.push_front(Op::read(Read::Scan {
                    ns,
                    part,
                    cursor,
                    count,
                    with_head,
                    attempt: attempt + 1,
                }));
                Ok(())
            }
            Read::Log {
                ns,
                part,
                from,
                count,
                attempt,
            } if count > 2 && attempt < MAX_TRUNCATION_RETRIES => {
                let count = (count / 2).max(2);
                self.regs[ns].log_cap = count;
                cycle.queue.push_front(Op::read(Read::Log {
                    ns,
                    part,
                    from,
                    count,
                    attempt: attempt + 1,
                }));
                Ok(())
            }
            _ => Err(SyncError::Truncated { command }),
        }
    }
}

/// A read of a truncated batch, to send alone: marked as a retry (attempt
/// at least 1), which [`SyncEngine::coalesce`] never batches.
fn retry_alone(mut read: Read) -> Read {
    if let Read::Log { attempt, .. } | Read::Mget { attempt, .. } = &mut read {
        *attempt = (*attempt).max(1);
    }
    read
}

/// How long full scans skip an oversized value: four full-scan intervals,
/// and at least [`OVERSIZED_MEMORY_MIN_MS`], so a value that stays too large
/// is fetched again at most that often.
fn oversized_memory_ms(settings: &SyncSettings) -> u64 {
    let scans = u64::from(settings.full_scan_every.max(1));
    let intervals = settings.period_ms.saturating_mul(scans).saturating_mul(4);
    intervals.max(OVERSIZED_MEMORY_MIN_MS)
}

/// Shortest time an oversized value is skipped (one minute).
const OVERSIZED_MEMORY_MIN_MS: u64 = 60_000;

/// Remembers `id` as oversized until `until`, within the cap (the entry
/// due to expire first makes room).
fn remember_oversized(memory: &mut BTreeMap<String, u64>, id: String, until: u64) {
    if memory.len() >= MAX_OVERSIZED_REMEMBERED && !memory.contains_key(&id) {
        let soonest = memory
            .iter()
            .min_by_key(|(_, until)| **until)
            .map(|(id, _)| id.clone());
        if let Some(soonest) = soonest {
            memory.remove(&soonest);
        }
    }
    memory.insert(id, until);
}

impl SyncEngine {
    /// MGET keys per call for namespace `ns` (see [`mget_batch_size`]).
    pub(super) fn mget_batch(&self, ns: NsIndex) -> usize {
        self.regs
            .get(ns.0)
            .map_or(1, |reg| mget_batch_size(reg, &self.settings))
    }
}

/// MGET keys per call: configured batch, shrunk by the observed value size
/// so the reply fits the budget with a 25 % margin.
fn mget_batch_size(reg: &Registered, settings: &SyncSettings) -> usize {
    let mut n = settings.mget_batch;
    if let Some(fit) = (settings.max_reply_bytes * 3 / 4).checked_div(reg.value_reply_bytes) {
        n = n.min(fit);
    }
    n.max(1)
}

fn queue_mgets(run: &mut Run, ns: NsIndex, part: usize, ids: Vec<String>, batch: usize) {
    let mut it = ids.into_iter().peekable();
    while it.peek().is_some() {
        let ids: Vec<String> = it.by_ref().take(batch).collect();
        run.queue.push_back(Op::read(Read::Mget {
            ns,
            part,
            ids,
            attempt: 0,
        }));
    }
}
