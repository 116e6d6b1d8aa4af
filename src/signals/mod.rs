//! Pod signals: what each pod says about its own load, read from its
//! Prometheus `/metrics` (vLLM's names by default): requests waiting for a
//! slot, requests running, and how long the pod takes per output token
//! (its inter-token latency histogram), i.e. how fast it is.
//!
//! Three parts, all pure (no `proxy_wasm` here):
//! - [`parse`] turns a `/metrics` body into [`PodSignals`], or says why it
//!   cannot (a required series missing, a value that is not a finite number,
//!   an absurd value). It never panics and reads at most the bytes it is
//!   given; the host caps those at `signals.max_body_bytes`.
//! - [`Scraper`] is the sync singleton's sans-IO schedule: which pods are due
//!   for a scrape, what each reply means, and the value to publish (the
//!   singleton's signal collector sends its calls).
//! - [`encode`] / [`decode`] are the one shared-data value ([`KEY`]) the
//!   singleton writes and the workers read on their tick, at most
//!   [`MAX_SLOTS`] records of [`RECORD`] bytes (24 KiB).
//!
//! A pod whose scrape fails or returns absurd values has no record (or a
//! stale one, which readers ignore): routing falls back to in-flight counts
//! for it. The singleton counts those fallbacks (`signals.fallbacks`).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::shared::registry::{PodSlot, MAX_SLOTS};

pub(crate) mod buckets;
pub mod share;

use buckets::{Buckets, Span};

/// Shared-data key of the published signals.
pub(crate) const KEY: &str = "signals/pods";
/// Bytes per published record: `slot u16 | at_ms u64 | waiting u32 |
/// running u32 | unused u16 | token_us u32` (little endian; `token_us`
/// 0xFFFFFFFF = not reported). The unused field held the KV-cache usage,
/// which nothing reads any more: written 0xFFFF ("not reported"), as
/// before, so a VM of an older build reads this layout unchanged.
pub const RECORD: usize = 24;
/// Waiting or running counts above this are absurd (no server queues a
/// million requests): the pod falls back to in-flight counts.
pub const MAX_REQUESTS: f64 = 1_000_000.0;
/// The unused field's value: "not reported" to an older build.
const KV_UNKNOWN: u16 = u16::MAX;
const TOKEN_UNKNOWN: u32 = u32::MAX;
/// Scrapes in a row whose buckets do not add up to the count, after one
/// whose did, that are passed over: their tokens go in the next span that
/// adds up. A page rendered while observations land reads torn (each
/// series is read apart), and one span taken by its mean would make a pod
/// whose decoding prefills hold back read slow until it makes tokens again.
/// Past this many in a row, the pod is taken to export no usable buckets.
pub(crate) const MAX_TORN_SCRAPES: u8 = 3;
/// Weight of a pod's older tokens at each scrape that saw new ones: at the
/// 250 ms default interval, tokens of a second ago weigh 0.41.
pub(crate) const TOKEN_DECAY: f64 = 0.8;
/// A mean time per output token above this (µs) is absurd: ignored.
pub(crate) const MAX_TOKEN_US: f64 = 60_000_000.0;

/// The metric names read, each a list tried in order (the first present
/// wins): other servers have names of their own (SGLang:
/// `sglang:num_queue_reqs`, `sglang:num_running_reqs`). `token_latency`
/// names histograms (their `_sum` and `_count` series are read): vLLM's
/// `inter_token_latency_seconds` and the older name it replaces.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricNames {
    pub(crate) waiting: Vec<String>,
    pub(crate) running: Vec<String>,
    pub(crate) token_latency: Vec<String>,
}

impl Default for MetricNames {
    fn default() -> Self {
        Self {
            waiting: vec!["vllm:num_requests_waiting".into()],
            running: vec!["vllm:num_requests_running".into()],
            token_latency: vec![
                "vllm:inter_token_latency_seconds".into(),
                "vllm:time_per_output_token_seconds".into(),
            ],
        }
    }
}

/// What one pod reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodSignals {
    /// Requests queued for a slot (summed over the series' label sets).
    pub waiting: u32,
    /// Requests holding a slot (summed).
    pub running: u32,
    /// Mean time per output token, µs, if the pod reports its inter-token
    /// latency histogram: over the output tokens since the previous scrape,
    /// averaged with the value before (kept while no token was made). Set
    /// by [`Scraper`]; [`parse`] leaves it None.
    pub token_us: Option<u32>,
}

/// A histogram's running totals: its `_sum` (seconds) and `_count`, and
/// its buckets when they are usable ([`Buckets::finish`]) and add up to the
/// count.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct TokenTotals {
    pub(crate) sum_secs: f64,
    pub(crate) count: f64,
    pub(crate) buckets: Option<Buckets>,
}

/// Why a body gave no signals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalError {
    /// None of the names for this role is in the body.
    Missing(&'static str),
    /// A value of this role is not a number, negative, not finite, or out
    /// of range (waiting/running above [`MAX_REQUESTS`], KV usage above 1).
    Absurd(&'static str),
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalError::Missing(role) => write!(f, "no {role} metric"),
            SignalError::Absurd(role) => write!(f, "absurd {role} value"),
        }
    }
}

/// One role's value as found in the body: which name (index in the list)
/// and the value summed over label sets.
#[derive(Clone, Copy)]
struct Found {
    rank: usize,
    value: f64,
    bad: bool,
}

fn fold(slot: &mut Option<Found>, rank: usize, value: Option<f64>) {
    let bad = value.is_none();
    let v = value.unwrap_or(0.0);
    match slot {
        Some(f) if f.rank < rank => {}
        Some(f) if f.rank == rank => {
            f.bad |= bad;
            f.value += v;
        }
        _ => {
            *slot = Some(Found {
                rank,
                value: v,
                bad,
            })
        }
    }
}

/// Parses a Prometheus text body. Waiting and running are required (summed
/// over label sets, e.g. one series per model). Lines that are not samples
/// are skipped.
pub fn parse(body: &[u8], names: &MetricNames) -> Result<PodSignals, SignalError> {
    parse_with_totals(body, names).map(|(signals, _)| signals)
}

/// [`parse`], and the token latency histogram's totals (summed over label
/// sets; None when absent, when `_sum` and `_count` do not come from the same
/// name, or when a value is not a finite number >= 0).
pub(crate) fn parse_with_totals(
    body: &[u8],
    names: &MetricNames,
) -> Result<(PodSignals, Option<TokenTotals>), SignalError> {
    let (mut waiting, mut running) = (None, None);
    let (mut token_sum, mut token_count) = (None, None);
    // The buckets of the best-ranked token latency name seen so far.
    let mut token_buckets: Option<(usize, Buckets)> = None;
    for line in body.split(|&b| b == b'\n') {
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        let rank = |list: &[String]| list.iter().position(|n| n.as_bytes() == name);
        if let Some(r) = rank(&names.waiting) {
            fold(&mut waiting, r, value);
        }
        if let Some(r) = rank(&names.running) {
            fold(&mut running, r, value);
        }
        let series = |suffix: &[u8]| {
            let base = name.strip_suffix(suffix)?;
            names
                .token_latency
                .iter()
                .position(|n| n.as_bytes() == base)
        };
        if let Some(r) = series(b"_sum") {
            fold(&mut token_sum, r, value);
        }
        if let Some(r) = series(b"_count") {
            fold(&mut token_count, r, value);
        }
        if let Some(r) = series(b"_bucket") {
            match &mut token_buckets {
                Some((rank, _)) if *rank < r => {}
                Some((rank, b)) if *rank == r => b.add(label(labels, b"le"), value),
                _ => {
                    let mut b = Buckets::default();
                    b.add(label(labels, b"le"), value);
                    token_buckets = Some((r, b));
                }
            }
        }
    }
    let totals = match (token_sum, token_count) {
        (Some(s), Some(c)) if s.rank == c.rank && !s.bad && !c.bad => Some(TokenTotals {
            sum_secs: s.value,
            count: c.value,
            buckets: token_buckets
                .filter(|(r, _)| *r == s.rank)
                .and_then(|(_, b)| b.finish())
                .filter(|b| (b.total() - c.value).abs() < 0.5),
        }),
        _ => None,
    };
    let count = |f: Option<Found>, role: &'static str| -> Result<u32, SignalError> {
        let f = f.ok_or(SignalError::Missing(role))?;
        if f.bad || !(0.0..=MAX_REQUESTS).contains(&f.value) {
            return Err(SignalError::Absurd(role));
        }
        Ok(f.value.round() as u32)
    };
    let waiting = count(waiting, "waiting")?;
    let running = count(running, "running")?;
    let signals = PodSignals {
        waiting,
        running,
        token_us: None,
    };
    Ok((signals, totals))
}

/// One sample line: its metric name, its label set's text (between the
/// braces; empty without) and value (None if the value is not a finite
/// number >= 0). None for comments, blank and malformed lines.
fn sample(line: &[u8]) -> Option<(&[u8], &[u8], Option<f64>)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let start = line.iter().position(|b| !b.is_ascii_whitespace())?;
    let line = &line[start..];
    if line.first() == Some(&b'#') {
        return None;
    }
    let name_end = line
        .iter()
        .position(|&b| b == b'{' || b.is_ascii_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels: &[u8] = &[];
    if rest.first() == Some(&b'{') {
        let end = labels_end(rest)?;
        labels = &rest[1..end - 1];
        rest = &rest[end..];
    }
    let value = rest
        .split(|b| b.is_ascii_whitespace())
        .find(|t| !t.is_empty())?;
    let value = std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0);
    Some((name, labels, value))
}

/// The raw value of label `key` in a label set's text (`a="x",le="0.5"`),
/// escapes left as they are. None if absent or malformed.
fn label<'a>(mut labels: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    loop {
        let start = labels
            .iter()
            .position(|b| !b.is_ascii_whitespace() && *b != b',')?;
        labels = &labels[start..];
        let eq = labels.iter().position(|&b| b == b'=')?;
        let name = labels[..eq].trim_ascii();
        let rest = labels[eq + 1..].trim_ascii_start();
        let rest = rest.strip_prefix(b"\"")?;
        let mut escaped = false;
        let close = rest.iter().position(|&b| {
            let quote = b == b'"' && !escaped;
            escaped = b == b'\\' && !escaped;
            quote
        })?;
        if name == key {
            return Some(&rest[..close]);
        }
        labels = &rest[close + 1..];
    }
}

/// Index just past the `}` closing a label set that starts at 0 (quoted
/// values may hold `}` and escaped quotes).
fn labels_end(s: &[u8]) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, &b) in s.iter().enumerate().skip(1) {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => quoted = false,
            (false, _, b'"') => quoted = true,
            (false, _, b'}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// One published record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub slot: PodSlot,
    /// When the scrape answered, unix ms.
    pub(crate) at_ms: u64,
    pub signals: PodSignals,
}

/// The published value: one record per pod with good signals, by slot.
pub(crate) fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.len().min(MAX_SLOTS) * RECORD);
    for r in records.iter().take(MAX_SLOTS) {
        out.extend_from_slice(&r.slot.to_le_bytes());
        out.extend_from_slice(&r.at_ms.to_le_bytes());
        out.extend_from_slice(&r.signals.waiting.to_le_bytes());
        out.extend_from_slice(&r.signals.running.to_le_bytes());
        out.extend_from_slice(&KV_UNKNOWN.to_le_bytes());
        out.extend_from_slice(&r.signals.token_us.unwrap_or(TOKEN_UNKNOWN).to_le_bytes());
    }
    out
}

/// Decodes a published value (a trailing partial record is ignored).
pub fn decode(bytes: &[u8]) -> Vec<Record> {
    bytes
        .chunks_exact(RECORD)
        .take(MAX_SLOTS)
        .map(|c| {
            let u32_at = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            let mut at = [0u8; 8];
            at.copy_from_slice(&c[2..10]);
            let token_us = u32_at(20);
            Record {
                slot: PodSlot::from_le_bytes([c[0], c[1]]),
                at_ms: u64::from_le_bytes(at),
                signals: PodSignals {
                    waiting: u32_at(10),
                    running: u32_at(14),
                    token_us: (token_us != TOKEN_UNKNOWN).then_some(token_us),
                },
            }
        })
        .collect()
}

/// What a worker makes of one pod's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) signals: PodSignals,
    /// Requests the pod reported (running + waiting) beyond the most this
    /// replica had in flight on it since the report was taken: traffic
    /// someone else sent (other replicas, clients that bypass the
    /// filter). A report lags by up to an interval and a tick, so the
    /// pod's count of this replica's own requests is stale; those are
    /// counted fresh from the in-flight counts instead.
    pub(crate) foreign: u32,
}

/// A worker's view of the published signals: fresh records by slot, and
/// each pod's concurrency as seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignalView {
    by_slot: BTreeMap<PodSlot, Seen>,
    /// The most requests each pod was seen running at once (since this VM
    /// started): what it serves without queueing. At most [`MAX_SLOTS`].
    capacity: BTreeMap<PodSlot, u32>,
}

impl SignalView {
    /// The records of `bytes` younger than `stale_ms` at `now_ms`, with no
    /// requests of this replica's own on any pod.
    pub fn from_published(bytes: &[u8], now_ms: u64, stale_ms: u64) -> Self {
        let mut view = Self::default();
        view.update(bytes, now_ms, stale_ms, |_, _| 0);
        view
    }

    /// Replaces the records by those of `bytes` younger than `stale_ms`;
    /// raises each pod's capacity to its running count. `own_since(pod,
    /// at_ms)`: the most requests this replica had in flight on `pod` since
    /// `at_ms`.
    pub(crate) fn update(
        &mut self,
        bytes: &[u8],
        now_ms: u64,
        stale_ms: u64,
        own_since: impl Fn(PodSlot, u64) -> u32,
    ) {
        self.by_slot = decode(bytes)
            .into_iter()
            .filter(|r| now_ms.saturating_sub(r.at_ms) <= stale_ms)
            .map(|r| {
                let busy = r.signals.running.saturating_add(r.signals.waiting);
                let foreign = busy.saturating_sub(own_since(r.slot, r.at_ms));
                let seen = Seen {
                    signals: r.signals,
                    foreign,
                };
                (r.slot, seen)
            })
            .collect();
        for (slot, s) in &self.by_slot {
            let cap = self.capacity.entry(*slot).or_default();
            *cap = (*cap).max(s.signals.running);
        }
    }

    pub fn get(&self, slot: PodSlot) -> Option<PodSignals> {
        self.by_slot.get(&slot).map(|s| s.signals)
    }

    pub(crate) fn seen(&self, slot: PodSlot) -> Option<Seen> {
        self.by_slot.get(&slot).copied()
    }

    /// The most requests `slot` was seen running at once (0 if never read).
    pub(crate) fn capacity(&self, slot: PodSlot) -> u32 {
        self.capacity.get(&slot).copied().unwrap_or(0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_slot.is_empty()
    }
}

/// A pod the scraper may be asked to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub slot: PodSlot,
    /// `host:port`, what the scrape call names.
    pub address: String,
    /// The Envoy cluster the call goes through.
    pub cluster: String,
}

/// What a reply did (the host counts it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Good signals; the pod's record is replaced.
    Scraped,
    /// The call failed or the body was refused: the pod's record is dropped
    /// (routing uses in-flight counts for it) and the reason is given.
    Fallback(String),
}

/// The singleton's scrape schedule, sans IO: every `interval_ms`, one call
/// per target not already in flight; replies update one record per pod.
#[derive(Debug)]
pub struct Scraper {
    interval_ms: u64,
    next_ms: u64,
    names: MetricNames,
    /// Slots with a call in flight.
    in_flight: Vec<PodSlot>,
    /// This replica's own scrapes.
    records: BTreeMap<PodSlot, Record>,
    /// Other replicas' scrapes (`signals.share`); published where they are
    /// fresher than this replica's own.
    remote: BTreeMap<PodSlot, Record>,
    /// Per pod: the token latency totals of its last good scrape, the
    /// decayed span of tokens its record's `token_us` is made of, and the
    /// torn scrapes passed over since ([`MAX_TORN_SCRAPES`]).
    tokens: BTreeMap<PodSlot, (TokenTotals, Span, u8)>,
    dirty: bool,
}

impl Scraper {
    pub fn new(interval_ms: u64, names: MetricNames) -> Self {
        Self {
            interval_ms: interval_ms.max(1),
            next_ms: 0,
            names,
            in_flight: Vec::new(),
            records: BTreeMap::new(),
            remote: BTreeMap::new(),
            tokens: BTreeMap::new(),
            dirty: false,
        }
    }

    /// The targets to call now (none before the next round is due). Records
    /// of pods no longer among `targets` are dropped.
    pub fn due(&mut self, now_ms: u64, targets: &[Target]) -> Vec<Target> {
        if now_ms < self.next_ms {
            return Vec::new();
        }
        self.next_ms = now_ms + self.interval_ms;
        let before = self.records.len();
        self.records
            .retain(|slot, _| targets.iter().any(|t| t.slot == *slot));
        self.tokens
            .retain(|slot, _| targets.iter().any(|t| t.slot == *slot));
        self.dirty |= self.records.len() != before;
        let mut out: Vec<Target> = Vec::new();
        for t in targets.iter().take(MAX_SLOTS) {
            if !self.in_flight.contains(&t.slot) && !out.iter().any(|o| o.slot == t.slot) {
                out.push(t.clone());
            }
        }
        self.in_flight.extend(out.iter().map(|t| t.slot));
        out
    }

    /// A call could not be sent (counts as a failed scrape).
    pub(crate) fn not_sent(&mut self, slot: PodSlot, why: &str) -> Outcome {
        self.on_reply(slot, Err(why), 0)
    }

    /// A reply for `slot`: the body, or why there is none.
    pub fn on_reply(&mut self, slot: PodSlot, reply: Result<&[u8], &str>, now_ms: u64) -> Outcome {
        self.in_flight.retain(|s| *s != slot);
        let parsed = match reply {
            Ok(body) => parse_with_totals(body, &self.names).map_err(|e| e.to_string()),
            Err(why) => Err(why.to_string()),
        };
        match parsed {
            Ok((mut signals, totals)) => {
                signals.token_us = self.token_us(slot, totals);
                self.records.insert(
                    slot,
                    Record {
                        slot,
                        at_ms: now_ms,
                        signals,
                    },
                );
                self.dirty = true;
                Outcome::Scraped
            }
            Err(why) => {
                self.dirty |= self.records.remove(&slot).is_some();
                self.tokens.remove(&slot);
                Outcome::Fallback(why)
            }
        }
    }

    /// The pod's time per output token (µs) after a scrape read `totals`:
    /// over its tokens since its first scrape (or since its counts went
    /// back, a restart), each scrape's older ones weighted by
    /// [`TOKEN_DECAY`]; the value stands while no token is made (or the
    /// span's mean is absurd, over [`MAX_TOKEN_US`]). With
    /// usable buckets, the typical time ([`buckets::Span::typical_secs`]:
    /// tokens held back by a prefill left out), else the mean. None
    /// without totals or tokens.
    fn token_us(&mut self, slot: PodSlot, totals: Option<TokenTotals>) -> Option<u32> {
        let Some(now) = totals else {
            self.tokens.remove(&slot);
            return None;
        };
        let span = match self.tokens.remove(&slot) {
            Some((b, acc, torn))
                if now.count >= b.count
                    && b.buckets.is_some()
                    && now.buckets.is_none()
                    && torn < MAX_TORN_SCRAPES =>
            {
                // Torn: the value stands, the next span covers its tokens.
                let value = token_us_of(&acc);
                self.tokens.insert(slot, (b, acc, torn + 1));
                return value;
            }
            Some((b, mut acc, _)) if now.count >= b.count => {
                // Buckets only where the scrape before had them too.
                let new = Span::between(
                    now.buckets.as_ref().filter(|_| b.buckets.is_some()),
                    b.buckets.as_ref(),
                    now.sum_secs - b.sum_secs,
                    now.count - b.count,
                );
                // A span whose mean is absurd is not added: it would
                // linger in the sum for many scrapes.
                let sane = new.sum_secs * 1e6 <= new.count * MAX_TOKEN_US;
                if new.count > 0.0 && sane {
                    acc.decay_add(TOKEN_DECAY, &new);
                }
                acc
            }
            _ => Span::between(now.buckets.as_ref(), None, now.sum_secs, now.count),
        };
        let value = token_us_of(&span);
        self.tokens.insert(slot, (now, span, 0));
        value
    }

    /// Replaces the records other replicas scraped (`signals.share`).
    pub(crate) fn set_remote(&mut self, records: impl IntoIterator<Item = Record>) {
        let remote: BTreeMap<PodSlot, Record> = records
            .into_iter()
            .take(MAX_SLOTS)
            .map(|r| (r.slot, r))
            .collect();
        if remote != self.remote {
            self.remote = remote;
            self.dirty = true;
        }
    }

    /// Whether a scrape call is still in flight.
    pub(crate) fn busy(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// This replica's own good records (what it shares).
    pub fn own(&self) -> impl Iterator<Item = &Record> {
        self.records.values()
    }

    /// Own and remote records, the fresher per pod.
    fn merged(&self) -> BTreeMap<PodSlot, Record> {
        let mut all = self.remote.clone();
        for (slot, r) in &self.records {
            match all.get_mut(slot) {
                Some(o) if o.at_ms > r.at_ms => {
                    // A shared record from a replica of an earlier version
                    // carries no token latency: keep this replica's.
                    o.signals.token_us = o.signals.token_us.or(r.signals.token_us);
                }
                _ => {
                    all.insert(*slot, *r);
                }
            }
        }
        all
    }

    /// The value to publish, once per change.
    pub(crate) fn take_publish(&mut self) -> Option<Vec<u8>> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        let records: Vec<Record> = self.merged().into_values().collect();
        Some(encode(&records))
    }

    /// Pods with good signals now (own or shared).
    pub(crate) fn good(&self) -> usize {
        self.merged().len()
    }
}

/// A span's time per output token in µs, None when it is absurd (over
/// [`MAX_TOKEN_US`]) or holds no token.
fn token_us_of(span: &Span) -> Option<u32> {
    span.time_secs()
        .map(|secs| secs * 1e6)
        .filter(|us| us.is_finite() && *us <= MAX_TOKEN_US)
        .map(|us| us.round() as u32)
}

#[cfg(test)]
mod tests;
