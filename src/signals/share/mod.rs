//! Pod signals shared through Redis (`signals.share`): each pod is scraped
//! by one replica, and every replica reads what the others scraped.
//!
//! Without it every replica scrapes every pod: 10 replicas x 200 pods at
//! 250 ms are 40 scrapes per pod per second, each a whole Prometheus page
//! rendered by the pod's API server. With it, each pod is scraped about
//! once per interval by the whole fleet, and each replica makes one Redis
//! call per interval.
//!
//! - **Who scrapes a pod.** Rendezvous hashing of (replica, pod) over the
//!   live replicas: this one, and those whose value in the hash was written
//!   within the stale bound. When a replica dies, its pods pass to the
//!   others once its value is stale; a pod whose shared record is missing
//!   or stale is scraped by every replica (an *orphan*), so a replica that
//!   cannot reach a pod, a new replica, or a Redis that does not answer
//!   falls back to what happens without sharing.
//! - **The exchange.** One pipelined call per interval through the sync
//!   bridge, sent as soon as this replica's scrape round has completed: `HSET key <replica> <own records>`, `PEXPIRE key`, `HDEL` of
//!   fields long dead (bounded), `HGETALL key`. The key is
//!   `{key_prefix}:{signals}:pods`.
//! - **The value** of a field is text: `v2 <written unix ms>` on the first
//!   line, then one line per pod,
//!   `<host:port> <age ms> <waiting> <running> - <µs per output token or ->`.
//!   The lone `-` is where the KV-cache usage was, which no rule reads: an
//!   older replica may write a number there (0 to 1000), which is checked
//!   and ignored. About 35-45 bytes a
//!   pod: the reply of a fleet of some 1,400 pods fits the bridge's 64 KB; a
//!   larger or malformed reply is an exchange failure (counted), not a
//!   partial read. A `v1` value (the same lines without the token latency,
//!   from a replica of an earlier version) is read too; an earlier version
//!   cannot read a `v2` value, so during a rolling upgrade it counts the
//!   upgraded replicas as absent and scrapes their pods itself, as without
//!   sharing.
//!
//! Pure: the host sends [`Share::request`] and feeds the reply to
//! [`Share::on_reply`].

use std::collections::BTreeMap;

use super::PodSignals;
use crate::sync::resp::{parse_pipeline_reply, Frame, Pipeline};

/// Replicas remembered at most (the freshest are kept).
pub(crate) const MAX_PEERS: usize = 256;
/// Pods in one replica's value at most, and remote records kept at most.
pub const MAX_PODS: usize = 4096;
/// Fields deleted per exchange at most (values of replicas long gone).
const MAX_HDEL: usize = 16;
/// A field this many stale bounds old belongs to a replica that is gone.
const DEAD_AFTER_STALE: u64 = 20;
/// A pod name longer than this is refused (a `host:port` is far shorter).
const MAX_POD_NAME: usize = 256;

/// One pod's signals as shared: the pod by its stable name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRecord {
    pub pod: String,
    /// When the scrape answered, unix ms (on the scraping replica's clock).
    pub(crate) at_ms: u64,
    pub signals: PodSignals,
}

/// Why an exchange gave nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShareError {
    /// No reply, an error reply, a truncated or malformed pipeline reply.
    Reply(String),
}

impl std::fmt::Display for ShareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShareError::Reply(why) => write!(f, "{why}"),
        }
    }
}

/// The sharing state of one replica (its sync singleton).
#[derive(Debug)]
pub(crate) struct Share {
    replica: String,
    key: String,
    interval_ms: u64,
    stale_ms: u64,
    next_ms: u64,
    /// Replies expected by the call in flight, and when it was sent.
    in_flight: Option<(usize, u64)>,
    /// Other replicas by name: when each last wrote its value.
    peers: BTreeMap<String, u64>,
    /// The freshest remote record per pod.
    remote: BTreeMap<String, SharedRecord>,
    /// Fields to delete with the next exchange.
    dead: Vec<String>,
}

impl Share {
    /// `replica`: this replica's name (the sync origin); `key_prefix`: the
    /// sync key prefix; `stale_ms`: how old a record may be and still count.
    pub(crate) fn new(replica: &str, key_prefix: &str, interval_ms: u64, stale_ms: u64) -> Self {
        Self {
            replica: replica.to_string(),
            key: format!("{key_prefix}:{{signals}}:pods"),
            interval_ms: interval_ms.max(1),
            stale_ms,
            next_ms: 0,
            in_flight: None,
            peers: BTreeMap::new(),
            remote: BTreeMap::new(),
            dead: Vec::new(),
        }
    }

    /// The Redis key of the hash.
    #[cfg(test)]
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Other replicas whose value is fresh at `now_ms`.
    pub(crate) fn live_peers(&self, now_ms: u64) -> usize {
        self.peers
            .values()
            .filter(|&&at| now_ms.saturating_sub(at) <= self.stale_ms)
            .count()
    }

    /// The live replica that scrapes `pod`: highest rendezvous score.
    fn owner(&self, pod: &str, now_ms: u64) -> &str {
        let mut best = (score(&self.replica, pod), self.replica.as_str());
        for (name, &at) in &self.peers {
            if now_ms.saturating_sub(at) > self.stale_ms {
                continue;
            }
            let s = (score(name, pod), name.as_str());
            if s > best {
                best = s;
            }
        }
        best.1
    }

    /// Whether this replica scrapes `pod` now: it owns it, or no fresh
    /// record of it came from the replica that does (an orphan).
    pub(crate) fn scrapes(&self, pod: &str, now_ms: u64) -> bool {
        if self.owner(pod, now_ms) == self.replica {
            return true;
        }
        self.remote
            .get(pod)
            .map_or(true, |r| now_ms.saturating_sub(r.at_ms) > self.stale_ms)
    }

    /// Fresh remote records (for pods this replica does not scrape itself,
    /// the caller prefers its own).
    pub(crate) fn remote(&self, now_ms: u64) -> impl Iterator<Item = &SharedRecord> {
        self.remote
            .values()
            .filter(move |r| now_ms.saturating_sub(r.at_ms) <= self.stale_ms)
    }

    /// Whether an exchange is due: at once when this replica's scrape
    /// round has just completed (`round_done`: its records are fresh), else
    /// an interval after the last one (a round slowed by timeouts). No
    /// second call while one is in flight; one unanswered after
    /// `timeout_ms` is given up.
    pub(crate) fn due(&mut self, now_ms: u64, timeout_ms: u64, round_done: bool) -> bool {
        if let Some((_, sent)) = self.in_flight {
            if now_ms.saturating_sub(sent) <= timeout_ms {
                return false;
            }
            self.in_flight = None;
        }
        if !round_done && now_ms < self.next_ms {
            return false;
        }
        self.next_ms = now_ms + self.interval_ms;
        true
    }

    /// The exchange's pipeline (`AUTH` first with a password): writes this
    /// replica's `own` records, reads every replica's.
    pub(crate) fn request(
        &mut self,
        own: &[SharedRecord],
        now_ms: u64,
        auth: Option<(Option<&str>, &str)>,
    ) -> Vec<u8> {
        let mut p = Pipeline::new();
        if let Some((user, password)) = auth {
            crate::sync::cmd::auth(&mut p, user, password);
        }
        let value = encode(own, now_ms);
        let key = self.key.as_bytes();
        p.push(&[b"HSET", key, self.replica.as_bytes(), &value]);
        // The hash outlives every live writer by the dead bound, no more.
        let ttl = (self.stale_ms.saturating_mul(DEAD_AFTER_STALE))
            .max(1000)
            .to_string();
        p.push(&[b"PEXPIRE", key, ttl.as_bytes()]);
        let dead: Vec<String> = self.dead.drain(..).take(MAX_HDEL).collect();
        if !dead.is_empty() {
            let mut args: Vec<&[u8]> = vec![b"HDEL", key];
            args.extend(dead.iter().map(|d| d.as_bytes()));
            p.push(&args);
        }
        p.push(&[b"HGETALL", key]);
        let (body, expected) = p.finish();
        self.in_flight = Some((expected, now_ms));
        body
    }

    /// The exchange's reply (None: the call failed). Returns the number of
    /// live peers. The `HGETALL` reply replaces what is known of the
    /// others: their liveness and, per pod, the freshest record; a field
    /// that does not decode is skipped.
    pub(crate) fn on_reply(
        &mut self,
        reply: Option<&[u8]>,
        now_ms: u64,
    ) -> Result<usize, ShareError> {
        let Some((expected, _)) = self.in_flight.take() else {
            return Err(ShareError::Reply("no exchange in flight".into()));
        };
        let reply = reply.ok_or_else(|| ShareError::Reply("the call failed".into()))?;
        let frames = parse_pipeline_reply(reply, expected)
            .map_err(|e| ShareError::Reply(format!("{e:?}")))?;
        if let Some(Frame::Error(e)) = frames.iter().find(|f| matches!(f, Frame::Error(_))) {
            return Err(ShareError::Reply(format!("Redis: {e}")));
        }
        let Some(Frame::Array(items)) = frames.get(expected.wrapping_sub(2)) else {
            return Err(ShareError::Reply("HGETALL gave no array".into()));
        };
        let mut peers = BTreeMap::new();
        let mut remote: BTreeMap<String, SharedRecord> = BTreeMap::new();
        let mut dead = Vec::new();
        for pair in items.chunks_exact(2) {
            let (Frame::Bulk(field), Frame::Bulk(value)) = (&pair[0], &pair[1]) else {
                continue;
            };
            let Ok(name) = std::str::from_utf8(field) else {
                continue;
            };
            if name == self.replica {
                continue;
            }
            let Some((written, records)) = decode(value) else {
                continue;
            };
            // A value from the future (a clock far ahead, or a hostile
            // writer) would never go stale: refused.
            if written > now_ms.saturating_add(self.stale_ms) {
                continue;
            }
            if now_ms.saturating_sub(written) > self.stale_ms.saturating_mul(DEAD_AFTER_STALE) {
                if dead.len() < MAX_HDEL {
                    dead.push(name.to_string());
                }
                continue;
            }
            peers.insert(name.to_string(), written);
            for r in records {
                if now_ms.saturating_sub(r.at_ms) > self.stale_ms {
                    continue;
                }
                let fresher = remote.get(&r.pod).map_or(true, |old| old.at_ms < r.at_ms);
                if fresher && (remote.len() < MAX_PODS || remote.contains_key(&r.pod)) {
                    remote.insert(r.pod.clone(), r);
                }
            }
        }
        // Bounded: the freshest writers are kept.
        if peers.len() > MAX_PEERS {
            let mut by_age: Vec<(String, u64)> = peers.into_iter().collect();
            by_age.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
            by_age.truncate(MAX_PEERS);
            peers = by_age.into_iter().collect();
        }
        self.peers = peers;
        self.remote = remote;
        self.dead = dead;
        Ok(self.live_peers(now_ms))
    }

    /// Forgets what the others said (an exchange failed): their records
    /// age out on their own, this only makes every pod this replica's.
    pub(crate) fn forget_peers(&mut self) {
        self.peers.clear();
    }
}

/// Rendezvous score of (replica, pod): FNV-1a over both, then a 64-bit
/// finalizer so close names spread.
fn score(replica: &str, pod: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica.bytes().chain([0xff]).chain(pod.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// One replica's value (see the module doc).
pub(crate) fn encode(records: &[SharedRecord], now_ms: u64) -> Vec<u8> {
    let mut out = format!("v2 {now_ms}\n").into_bytes();
    for r in records.iter().take(MAX_PODS) {
        if r.pod.is_empty() || r.pod.len() > MAX_POD_NAME || r.pod.contains([' ', '\n']) {
            continue;
        }
        let token = r
            .signals
            .token_us
            .map_or_else(|| "-".to_string(), |t| t.to_string());
        let age = now_ms.saturating_sub(r.at_ms);
        out.extend_from_slice(
            format!(
                "{} {age} {} {} - {token}\n",
                r.pod, r.signals.waiting, r.signals.running
            )
            .as_bytes(),
        );
    }
    out
}

/// Decodes one replica's value, `v2` or `v1` (see the module doc): when it
/// was written and its records (a malformed line is skipped; absurd numbers
/// are refused as the scrape parser refuses them). None when the header is
/// not one of ours.
pub fn decode(value: &[u8]) -> Option<(u64, Vec<SharedRecord>)> {
    let text = std::str::from_utf8(value).ok()?;
    let mut lines = text.lines();
    let header = lines.next()?;
    let (written, with_token) = match (header.strip_prefix("v2 "), header.strip_prefix("v1 ")) {
        (Some(ms), _) => (ms, true),
        (None, Some(ms)) => (ms, false),
        _ => return None,
    };
    let written: u64 = written.parse().ok()?;
    let max = super::MAX_REQUESTS as u32;
    let mut out = Vec::new();
    for line in lines.take(MAX_PODS) {
        let mut f = line.split(' ');
        let (Some(pod), Some(age), Some(w), Some(r), Some(kv)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let token = if with_token { f.next() } else { Some("-") };
        let (Some(token), None) = (token, f.next()) else {
            continue;
        };
        let (Ok(age), Ok(waiting), Ok(running)) =
            (age.parse::<u64>(), w.parse::<u32>(), r.parse::<u32>())
        else {
            continue;
        };
        // The KV-cache usage field: read by no rule, written `-`; an older
        // replica's number is checked as it was, then ignored.
        if kv != "-" && !matches!(kv.parse::<u16>(), Ok(k) if k <= 1000) {
            continue;
        }
        let token_us = match token {
            "-" => None,
            t => match t.parse::<u32>() {
                Ok(t) if f64::from(t) <= super::MAX_TOKEN_US => Some(t),
                _ => continue,
            },
        };
        if pod.is_empty() || pod.len() > MAX_POD_NAME || waiting > max || running > max {
            continue;
        }
        out.push(SharedRecord {
            pod: pod.to_string(),
            at_ms: written.saturating_sub(age),
            signals: PodSignals {
                waiting,
                running,
                token_us,
            },
        });
    }
    Some((written, out))
}

#[cfg(test)]
mod tests;
