//! Drivers that connect [`SyncEngine`]s to a [`MemRedis`] without Envoy, a
//! configurable map component, and the cost model used to compare
//! incremental (change-log) pulls and polls with full-scan pulls. Shared by
//! the unit tests and the benchmarks (behind the `testkit` feature); never
//! built into the filter.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use super::engine::{Call, SyncEngine};
use super::error::CallFailed;
use super::memredis::MemRedis;
use super::resp::{parse, Frame};
use super::settings::SyncSettings;
use super::stats::SyncStats;
use super::syncable::{Capabilities, Delta, Rejected, Syncable};

/// Payloads starting with this are tombstones for [`MapComponent`].
pub(crate) const TOMBSTONE: &[u8] = b"\x00tombstone";

/// A map `id -> bytes` with every capability switchable, recording the
/// calls the engine makes (`events`) so tests can check their order.
#[derive(Clone, Debug, Default)]
pub(crate) struct MapComponent {
    /// Namespace returned by `namespace()`.
    pub(crate) ns: String,
    /// Capabilities reported.
    pub(crate) caps: Capabilities,
    /// Local state.
    pub(crate) entries: BTreeMap<String, Vec<u8>>,
    /// Ids changed locally since the last clear.
    pub(crate) dirty: BTreeSet<String>,
    /// Ids deleted locally since the last clear.
    pub(crate) deleted: BTreeSet<String>,
    /// `start`, `end`, `apply:<id>`, `reject:<id>`, `delete:<id>`,
    /// `delta`, `snapshot`, `clear:<n>`.
    pub(crate) events: Vec<String>,
    /// Remote payloads starting with this are stale.
    pub(crate) stale_prefix: Option<Vec<u8>>,
    /// Remote payloads starting with this are rejected.
    pub(crate) reject_prefix: Option<Vec<u8>>,
}

impl MapComponent {
    /// An empty component for `ns` with `caps`.
    pub(crate) fn new(ns: &str, caps: Capabilities) -> Self {
        Self {
            ns: ns.to_owned(),
            caps,
            ..Default::default()
        }
    }

    /// Shared handle, so a test keeps access after registering it.
    pub(crate) fn shared(ns: &str, caps: Capabilities) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self::new(ns, caps)))
    }

    /// A local change (marks the id dirty).
    pub(crate) fn set(&mut self, id: &str, payload: &[u8]) {
        self.entries.insert(id.to_owned(), payload.to_vec());
        self.deleted.remove(id);
        self.dirty.insert(id.to_owned());
    }

    /// A local delete (marks the id deleted).
    pub(crate) fn remove(&mut self, id: &str) {
        self.entries.remove(id);
        self.dirty.remove(id);
        self.deleted.insert(id.to_owned());
    }
}

impl Syncable for MapComponent {
    fn namespace(&self) -> String {
        self.ns.clone()
    }
    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        self.entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
    fn apply_remote(&mut self, id: &str, payload: &[u8]) -> Result<(), Rejected> {
        if self
            .reject_prefix
            .as_ref()
            .is_some_and(|p| payload.starts_with(p))
        {
            self.events.push(format!("reject:{id}"));
            return Err(Rejected(format!("{id} refused")));
        }
        self.events.push(format!("apply:{id}"));
        self.entries.insert(id.to_owned(), payload.to_vec());
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    fn delta(&self) -> Delta {
        Delta {
            updated: self
                .dirty
                .iter()
                .filter_map(|id| self.entries.get(id).map(|v| (id.clone(), v.clone())))
                .collect(),
            deleted: self.deleted.iter().cloned().collect(),
        }
    }
    fn clear_dirty(&mut self, pushed_ids: &[String]) {
        self.events.push(format!("clear:{}", pushed_ids.len()));
        for id in pushed_ids {
            self.dirty.remove(id);
            self.deleted.remove(id);
        }
    }
    fn on_sync_start(&mut self) {
        self.events.push("start".into());
    }
    fn on_sync_end(&mut self) {
        self.events.push("end".into());
    }
    fn is_stale(&self, _id: &str, payload: &[u8]) -> bool {
        self.stale_prefix
            .as_ref()
            .is_some_and(|p| payload.starts_with(p))
    }
    fn make_tombstone(&self, _id: &str) -> Vec<u8> {
        TOMBSTONE.to_vec()
    }
    fn is_tombstone(&self, _id: &str, payload: &[u8]) -> bool {
        payload == TOMBSTONE
    }
    fn delete_local(&mut self, id: &str) {
        self.events.push(format!("delete:{id}"));
        self.entries.remove(id);
    }
}

/// A call's fate in [`deliver_with`]: `Some(Ok(reply))`, `Some(Err(_))`
/// or `None` (held, never answered).
pub(crate) type Outcome = Option<Result<Vec<u8>, CallFailed>>;

/// Delivers `calls` to `redis` and their follow-ups until none is left.
/// `outcome` decides each call's fate: `Some(Ok(bytes))` / `Some(Err(_))`
/// answer it, `None` holds it (returned, never answered).
pub(crate) fn deliver_with(
    engine: &mut SyncEngine,
    redis: &mut MemRedis,
    now_ms: u64,
    calls: Vec<Call>,
    outcome: &mut dyn FnMut(&Call, &mut MemRedis) -> Outcome,
) -> Vec<Call> {
    let mut queue: std::collections::VecDeque<Call> = calls.into();
    let mut held = Vec::new();
    redis.set_now(now_ms);
    while let Some(call) = queue.pop_front() {
        match outcome(&call, redis) {
            Some(Ok(reply)) => queue.extend(engine.on_response(call.id, now_ms, Ok(&reply))),
            Some(Err(e)) => queue.extend(engine.on_response(call.id, now_ms, Err(e))),
            None => held.push(call),
        }
    }
    held
}

/// One tick at `now_ms`, every call answered by `redis`.
pub(crate) fn drive(engine: &mut SyncEngine, redis: &mut MemRedis, now_ms: u64) {
    let calls = engine.tick(now_ms);
    deliver_with(engine, redis, now_ms, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
}

/// Ticks at the engine's next due time and drives that cycle to its end;
/// returns the time used.
pub(crate) fn run_cycle(engine: &mut SyncEngine, redis: &mut MemRedis, not_before_ms: u64) -> u64 {
    let now = engine
        .next_cycle_ms()
        .unwrap_or(not_before_ms)
        .max(not_before_ms);
    drive(engine, redis, now);
    now
}

/// Host tick period the time-driven drivers use (the filter's host ticks
/// the engine every 25 ms).
pub(crate) const TICK_MS: u64 = 25;

/// Redis work of one replica per cycle period: its cycle and, between
/// cycles, its polls (see [`SyncSettings::poll_ms`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CycleCost {
    /// Bridge calls per period, cycle and polls.
    pub calls: f64,
    /// Redis commands per period (QUIT included), cycle and polls.
    pub commands: f64,
    /// Request bytes per period, cycle and polls.
    pub bytes_sent: f64,
    /// Reply bytes per period, cycle and polls.
    pub bytes_received: f64,
    /// Polls per period.
    pub polls: f64,
    /// Polls per period that found nothing to fetch: one call each, with
    /// one XRANGE per polled namespace and QUIT. This floor depends on
    /// `period_ms / poll_ms`, not on the table size or the churn.
    pub idle_polls: f64,
    /// The polls' share of `calls` (idle polls included).
    pub(crate) poll_calls: f64,
    /// The polls' share of `commands`.
    pub poll_commands: f64,
    /// The polls' share of `bytes_sent`.
    pub(crate) poll_bytes_sent: f64,
    /// The polls' share of `bytes_received`.
    pub(crate) poll_bytes_received: f64,
    /// The idle polls' share of `commands`.
    pub idle_poll_commands: f64,
    /// The idle polls' share of `bytes_sent`.
    pub(crate) idle_poll_bytes_sent: f64,
    /// The idle polls' share of `bytes_received`.
    pub(crate) idle_poll_bytes_received: f64,
    /// Keys read per period: returned by SCAN plus fetched by MGET.
    pub keys_read: f64,
    /// The writer's Redis commands per period (its pushes of the churn, its
    /// own scans and polls included).
    pub(crate) writer_commands: f64,
    /// The writer's request bytes per period.
    pub writer_bytes_sent: f64,
    /// The writer's keys written per period.
    pub writer_keys_written: f64,
    /// The writer's keys read per period.
    pub(crate) writer_keys_read: f64,
}

impl CycleCost {
    /// The work that follows the changes (cycle + polls that fetched
    /// something), i.e. the totals without the idle-poll floor.
    pub fn beyond_idle_polls(&self) -> CycleCost {
        CycleCost {
            calls: self.calls - self.idle_polls,
            commands: self.commands - self.idle_poll_commands,
            bytes_sent: self.bytes_sent - self.idle_poll_bytes_sent,
            bytes_received: self.bytes_received - self.idle_poll_bytes_received,
            ..Default::default()
        }
    }
}

/// Parameters of [`steady_state_cost_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// Entities the writer holds (≈100-byte payloads, delta-capable).
    pub entities: usize,
    /// Entities changed per period, per mille.
    pub churn_per_mille: usize,
    /// `full_scan_every` of both replicas (`<= 1`: AIBrix mode).
    pub full_scan_every: u32,
    /// Reader cycles measured.
    pub cycles: usize,
    /// `period_ms` of both replicas.
    pub period_ms: u64,
    /// `poll_ms` of both replicas (0: no polls).
    pub poll_ms: u64,
    /// `scan_keys_per_cycle` of both replicas (0: periodic full scans).
    pub scan_keys_per_cycle: usize,
    /// `hash_tags` of both replicas (1: one tag per namespace).
    pub hash_tags: usize,
}

impl Default for CostModel {
    fn default() -> Self {
        let s = SyncSettings::default();
        Self {
            entities: 5_000,
            churn_per_mille: 10,
            full_scan_every: s.full_scan_every,
            cycles: s.full_scan_every.max(1) as usize,
            period_ms: s.period_ms,
            poll_ms: s.poll_ms,
            scan_keys_per_cycle: s.scan_keys_per_cycle,
            hash_tags: s.hash_tags,
        }
    }
}

/// One hash tag's share of the Redis load per period, from
/// [`steady_state_cost_per_tag`].
#[derive(Clone, Debug, PartialEq)]
pub struct TagLoad {
    /// The hash tag (`prefixcache.3`, `podload.0`, ...).
    pub(crate) tag: String,
    /// Its Redis Cluster slot.
    pub slot: u16,
    /// Keys the reader read per period under this tag (SCAN + MGET).
    pub reader_keys: f64,
    /// Keys the writer wrote per period under this tag.
    pub writer_keys: f64,
    /// Commands the reader sent per period under this tag, each call's
    /// `QUIT` counted with its first command (only with several tags).
    pub reader_commands: f64,
}

/// [`steady_state_cost_with`] with the default period (10 s) and poll
/// interval (100 ms).
pub(crate) fn steady_state_cost(
    entities: usize,
    churn_per_mille: usize,
    full_scan_every: u32,
    cycles: usize,
) -> CycleCost {
    steady_state_cost_with(&CostModel {
        entities,
        churn_per_mille,
        full_scan_every,
        cycles,
        ..Default::default()
    })
}

/// Average Redis work per period of a reader replica in steady state: a
/// writer holds `entities` entities and changes `churn_per_mille` ‰ of them
/// once per period (right after each reader cycle); both replicas are
/// ticked every [`TICK_MS`] on a fake clock, so the writer pushes the change
/// at its next push (a cycle's or a poll's) and the reader picks it up by a
/// poll or its cycle. Measured from the end of the reader's first (full)
/// cycle to the end of its `cycles`-th next one, so with `cycles` a
/// multiple of `full_scan_every` the full scans are amortised exactly.
/// `full_scan_every <= 1` is AIBrix's full-scan-only behaviour.
pub fn steady_state_cost_with(m: &CostModel) -> CycleCost {
    steady_state_cost_per_tag(m).0
}

/// [`steady_state_cost_with`], plus the keys of each hash tag per period
/// (reader and writer apart; `m.hash_tags` tags per namespace), counted by
/// the in-memory Redis: how the load would spread over a Redis Cluster.
pub fn steady_state_cost_per_tag(m: &CostModel) -> (CycleCost, Vec<TagLoad>) {
    let caps = Capabilities {
        delta: true,
        ..Default::default()
    };
    let settings = SyncSettings {
        enabled: true,
        full_scan_every: m.full_scan_every,
        period_ms: m.period_ms,
        poll_ms: m.poll_ms,
        scan_keys_per_cycle: m.scan_keys_per_cycle,
        hash_tags: m.hash_tags.max(1),
        // Keep the namespace at a constant size for the whole run.
        record_ttl_secs: 86_400,
        change_log_max_entries: 100_000,
        ..Default::default()
    };
    let writer = MapComponent::shared("prefixcache", caps);
    let reader = MapComponent::shared("prefixcache", caps);
    let mut a = SyncEngine::new(settings.clone(), 1);
    let mut b = SyncEngine::new(settings, 2);
    let _ = a.register(Box::new(writer.clone()));
    let _ = b.register(Box::new(reader.clone()));
    // One Redis, or with several tags one node per tag (so a part's SCAN
    // walks its own keys, as on a cluster with a master per tag).
    let mut redis: Box<dyn Backend> = if m.hash_tags > 1 {
        Box::new(TaggedRedis::default())
    } else {
        let mut one = MemRedis::new();
        one.record = false;
        Box::new(one)
    };
    // Keys per tag, the reader's and the writer's apart, over the window.
    let mut reader_tags: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut writer_tags: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut reader_commands: TagCounts = TagCounts::new();
    // The reader's keys read; the writer's keys written (its own reads are
    // one more replica's, not the fleet's writes).
    let take_tags =
        |redis: &mut dyn Backend, into: &mut BTreeMap<Vec<u8>, u64>, on: bool, reads: bool| {
            let (read, written) = redis.take_counts();
            for (tag, n) in if reads { read } else { written } {
                if on {
                    *into.entry(tag).or_default() += n;
                }
            }
        };
    let entities = m.entities.max(1);
    let payload = |i: usize, gen: usize| {
        format!(
            r#"{{"model_to_pods":{{"llama-3-8b":{{"10.0.0.{}:8000":{}}}}}}}"#,
            i % 8,
            1_700_000_000_000_000_000u64 + gen as u64
        )
    };
    let churn = (entities * m.churn_per_mille).div_ceil(1000);
    let change = |gen: usize| {
        let mut w = writer.borrow_mut();
        for k in 0..churn {
            let i = (gen * 7919 + k * 104_729) % entities;
            w.set(
                &format!("{}", 1_000_000_007u64 * i as u64),
                payload(i, gen).as_bytes(),
            );
        }
    };
    {
        let mut w = writer.borrow_mut();
        for i in 0..entities {
            w.set(
                &format!("{}", 1_000_000_007u64 * i as u64),
                payload(i, 0).as_bytes(),
            );
        }
    }
    // The writer pushes everything first, then the reader starts.
    let _ = a.start(0);
    let mut now = a.next_cycle_ms().unwrap_or(0);
    drive_on(&mut a, redis.as_mut(), now);
    let _ = b.start(now);
    let mut cost = CycleCost::default();
    let mut before: Option<SyncStats> = None;
    let mut writer_before: Option<SyncStats> = None;
    let cycles = m.cycles.max(1) as u64;
    let limit = now + (cycles + 3) * 2 * m.period_ms.max(TICK_MS);
    while now < limit {
        now += TICK_MS;
        redis.set_count(before.is_some());
        drive_on(&mut a, redis.as_mut(), now);
        take_tags(redis.as_mut(), &mut writer_tags, before.is_some(), false);
        redis.take_commands();
        let s0 = b.stats().clone();
        drive_on(&mut b, redis.as_mut(), now);
        take_tags(redis.as_mut(), &mut reader_tags, before.is_some(), true);
        if before.is_some() {
            for (tag, n) in redis.take_commands() {
                *reader_commands.entry(tag).or_default() += n;
            }
        }
        let s1 = b.stats().clone();
        if s1.cycles_ok > s0.cycles_ok {
            // A reader cycle ended: the measured window opens after the
            // first, closes after the `cycles`-th next one.
            let Some(start) = &before else {
                before = Some(s1);
                writer_before = Some(a.stats().clone());
                change(1);
                continue;
            };
            let done = s1.cycles_ok - start.cycles_ok;
            if done >= cycles {
                let n = cycles as f64;
                let d = |f: fn(&SyncStats) -> u64| (f(&s1) - f(start)) as f64 / n;
                cost.calls = d(|s| s.calls_sent);
                cost.commands = d(|s| s.commands_sent);
                cost.bytes_sent = d(|s| s.bytes_sent);
                cost.bytes_received = d(|s| s.bytes_received);
                cost.keys_read = d(|s| s.keys_scanned + s.keys_pulled);
                if let Some(w0) = &writer_before {
                    let w1 = a.stats();
                    let dw = |f: fn(&SyncStats) -> u64| (f(w1) - f(w0)) as f64 / n;
                    cost.writer_commands = dw(|s| s.commands_sent);
                    cost.writer_bytes_sent = dw(|s| s.bytes_sent);
                    cost.writer_keys_written = dw(|s| s.pushed);
                    cost.writer_keys_read = dw(|s| s.keys_scanned + s.keys_pulled);
                }
                for f in [
                    &mut cost.polls,
                    &mut cost.idle_polls,
                    &mut cost.poll_calls,
                    &mut cost.poll_commands,
                    &mut cost.poll_bytes_sent,
                    &mut cost.poll_bytes_received,
                    &mut cost.idle_poll_commands,
                    &mut cost.idle_poll_bytes_sent,
                    &mut cost.idle_poll_bytes_received,
                ] {
                    *f /= n;
                }
                let mut tags: BTreeMap<Vec<u8>, TagLoad> = BTreeMap::new();
                let commands = &reader_commands;
                for (map, reader) in [(&reader_tags, true), (&writer_tags, false)] {
                    for (tag, keys) in map {
                        let load = tags.entry(tag.clone()).or_insert_with(|| TagLoad {
                            tag: String::from_utf8_lossy(tag).into_owned(),
                            slot: crate::sync::keys::key_slot(tag),
                            reader_keys: 0.0,
                            writer_keys: 0.0,
                            reader_commands: commands.get(tag).copied().unwrap_or(0) as f64 / n,
                        });
                        let per_period = *keys as f64 / n;
                        if reader {
                            load.reader_keys += per_period;
                        } else {
                            load.writer_keys += per_period;
                        }
                    }
                }
                return (cost, tags.into_values().collect());
            }
            change(done as usize + 1);
        } else if before.is_some() && s1.polls_ok + s1.polls_failed > s0.polls_ok + s0.polls_failed
        {
            let calls = (s1.calls_sent - s0.calls_sent) as f64;
            let commands = (s1.commands_sent - s0.commands_sent) as f64;
            let sent = (s1.bytes_sent - s0.bytes_sent) as f64;
            let received = (s1.bytes_received - s0.bytes_received) as f64;
            cost.polls += 1.0;
            cost.poll_calls += calls;
            cost.poll_commands += commands;
            cost.poll_bytes_sent += sent;
            cost.poll_bytes_received += received;
            if calls <= 1.0 {
                cost.idle_polls += 1.0;
                cost.idle_poll_commands += commands;
                cost.idle_poll_bytes_sent += sent;
                cost.idle_poll_bytes_received += received;
            }
        }
    }
    // Not reached with a healthy in-memory Redis; a visibly empty result.
    (CycleCost::default(), Vec::new())
}

/// Keys per hash tag.
type TagCounts = BTreeMap<Vec<u8>, u64>;

/// What answers the cost model's calls: one in-memory Redis, or one per tag.
trait Backend {
    fn set_now(&mut self, now_ms: u64);
    fn execute(&mut self, body: &[u8]) -> Vec<u8>;
    fn set_count(&mut self, on: bool);
    /// Keys read and keys written per tag since the last take.
    fn take_counts(&mut self) -> (TagCounts, TagCounts);
    /// Commands per tag since the last take (empty for one Redis).
    fn take_commands(&mut self) -> TagCounts {
        TagCounts::new()
    }
}

impl Backend for MemRedis {
    fn set_now(&mut self, now_ms: u64) {
        MemRedis::set_now(self, now_ms);
    }
    fn execute(&mut self, body: &[u8]) -> Vec<u8> {
        MemRedis::execute(self, body)
    }
    fn set_count(&mut self, on: bool) {
        self.count_tags = on;
    }
    fn take_counts(&mut self) -> (TagCounts, TagCounts) {
        (
            std::mem::take(&mut self.keys_read_by_tag),
            std::mem::take(&mut self.keys_written_by_tag),
        )
    }
}

/// One in-memory Redis per hash tag: every command runs on the node of its
/// key's tag (SCAN: of its MATCH pattern's tag), as on a Redis Cluster whose
/// every tag has a master of its own.
#[derive(Default)]
struct TaggedRedis {
    nodes: BTreeMap<Vec<u8>, MemRedis>,
    now_ms: u64,
    count: bool,
    /// Commands per tag (QUIT: the tag of its call's first command).
    commands: TagCounts,
}

/// The hash tag of a key or pattern (the whole of it without braces).
fn tag_of(key: &[u8]) -> &[u8] {
    key.iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

impl Backend for TaggedRedis {
    fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        for node in self.nodes.values_mut() {
            node.set_now(now_ms);
        }
    }

    fn execute(&mut self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        let mut first_tag: Option<Vec<u8>> = None;
        while let Ok((Frame::Array(items), used)) = parse(rest) {
            let command = &rest[..used];
            rest = &rest[used..];
            let args: Vec<&[u8]> = items.iter().filter_map(Frame::as_bytes).collect();
            let name = args
                .first()
                .map(|n| n.to_ascii_uppercase())
                .unwrap_or_default();
            if name == b"QUIT" {
                if self.count {
                    *self
                        .commands
                        .entry(first_tag.unwrap_or_default())
                        .or_default() += 1;
                }
                Frame::Simple("OK".into()).encode(&mut out);
                break;
            }
            let key = if name == b"SCAN" {
                args.iter()
                    .position(|a| a.eq_ignore_ascii_case(b"MATCH"))
                    .and_then(|i| args.get(i + 1))
            } else {
                args.get(1)
            };
            let tag = key.map(|k| tag_of(k).to_vec()).unwrap_or_default();
            if self.count {
                *self.commands.entry(tag.clone()).or_default() += 1;
            }
            first_tag.get_or_insert_with(|| tag.clone());
            let (now, count) = (self.now_ms, self.count);
            let node = self.nodes.entry(tag).or_insert_with(|| {
                let mut n = MemRedis::new();
                n.record = false;
                n.set_now(now);
                n
            });
            node.count_tags = count;
            out.extend(node.execute(command));
        }
        out
    }

    fn set_count(&mut self, on: bool) {
        self.count = on;
    }

    fn take_commands(&mut self) -> TagCounts {
        std::mem::take(&mut self.commands)
    }

    fn take_counts(&mut self) -> (TagCounts, TagCounts) {
        let (mut read, mut written) = (TagCounts::new(), TagCounts::new());
        for node in self.nodes.values_mut() {
            for (tag, n) in std::mem::take(&mut node.keys_read_by_tag) {
                *read.entry(tag).or_default() += n;
            }
            for (tag, n) in std::mem::take(&mut node.keys_written_by_tag) {
                *written.entry(tag).or_default() += n;
            }
        }
        (read, written)
    }
}

/// One tick at `now_ms`, every call answered by `redis`.
fn drive_on(engine: &mut SyncEngine, redis: &mut dyn Backend, now_ms: u64) {
    redis.set_now(now_ms);
    let mut queue: std::collections::VecDeque<Call> = engine.tick(now_ms).into();
    while let Some(call) = queue.pop_front() {
        let reply = redis.execute(&call.body);
        queue.extend(engine.on_response(call.id, now_ms, Ok(&reply)));
    }
}
