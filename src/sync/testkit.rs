//! Drivers that connect [`SyncEngine`]s to a [`MemRedis`] without Envoy, a
//! configurable map component, and the cost model used to compare
//! incremental (change-log) pulls with full-scan pulls. Shared by the unit
//! tests and the benchmarks; not used by the filter.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use super::engine::{Call, SyncEngine};
use super::error::CallFailed;
use super::memredis::MemRedis;
use super::settings::SyncSettings;
use super::syncable::{Capabilities, Delta, Rejected, Syncable};

/// Payloads starting with this are tombstones for [`MapComponent`].
pub const TOMBSTONE: &[u8] = b"\x00tombstone";

/// A map `id -> bytes` with every capability switchable, recording the
/// calls the engine makes (`events`) so tests can check their order.
#[derive(Clone, Debug, Default)]
pub struct MapComponent {
    /// Namespace returned by `namespace()`.
    pub ns: String,
    /// Capabilities reported.
    pub caps: Capabilities,
    /// Local state.
    pub entries: BTreeMap<String, Vec<u8>>,
    /// Ids changed locally since the last clear.
    pub dirty: BTreeSet<String>,
    /// Ids deleted locally since the last clear.
    pub deleted: BTreeSet<String>,
    /// `start`, `end`, `apply:<id>`, `reject:<id>`, `delete:<id>`,
    /// `delta`, `snapshot`, `clear:<n>`.
    pub events: Vec<String>,
    /// Remote payloads starting with this are stale.
    pub stale_prefix: Option<Vec<u8>>,
    /// Remote payloads starting with this are rejected.
    pub reject_prefix: Option<Vec<u8>>,
}

impl MapComponent {
    /// An empty component for `ns` with `caps`.
    pub fn new(ns: &str, caps: Capabilities) -> Self {
        Self {
            ns: ns.to_owned(),
            caps,
            ..Default::default()
        }
    }

    /// Shared handle, so a test keeps access after registering it.
    pub fn shared(ns: &str, caps: Capabilities) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self::new(ns, caps)))
    }

    /// A local change (marks the id dirty).
    pub fn set(&mut self, id: &str, payload: &[u8]) {
        self.entries.insert(id.to_owned(), payload.to_vec());
        self.deleted.remove(id);
        self.dirty.insert(id.to_owned());
    }

    /// A local delete (marks the id deleted).
    pub fn remove(&mut self, id: &str) {
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
pub type Outcome = Option<Result<Vec<u8>, CallFailed>>;

/// Delivers `calls` to `redis` and their follow-ups until none is left.
/// `outcome` decides each call's fate: `Some(Ok(bytes))` / `Some(Err(_))`
/// answer it, `None` holds it (returned, never answered).
pub fn deliver_with(
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
pub fn drive(engine: &mut SyncEngine, redis: &mut MemRedis, now_ms: u64) {
    let calls = engine.tick(now_ms);
    deliver_with(engine, redis, now_ms, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
}

/// Ticks at the engine's next due time and drives that cycle to its end;
/// returns the time used.
pub fn run_cycle(engine: &mut SyncEngine, redis: &mut MemRedis, not_before_ms: u64) -> u64 {
    let now = engine
        .next_cycle_ms()
        .unwrap_or(not_before_ms)
        .max(not_before_ms);
    drive(engine, redis, now);
    now
}

/// Redis work of one replica's cycles.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CycleCost {
    /// Bridge calls per cycle.
    pub calls: f64,
    /// Redis commands per cycle.
    pub commands: f64,
    /// Request bytes per cycle.
    pub bytes_sent: f64,
    /// Reply bytes per cycle.
    pub bytes_received: f64,
}

/// Average Redis work per cycle of a reader replica in steady state: a
/// writer holds `entities` entities (≈100-byte payloads, delta-capable) and
/// changes `churn_per_mille` ‰ of them before each cycle; the reader, with
/// `full_scan_every`, pulls them over `cycles` cycles.
/// `full_scan_every <= 1` is AIBrix's full-scan-only behaviour.
pub fn steady_state_cost(
    entities: usize,
    churn_per_mille: usize,
    full_scan_every: u32,
    cycles: usize,
) -> CycleCost {
    let caps = Capabilities {
        delta: true,
        ..Default::default()
    };
    let settings = SyncSettings {
        enabled: true,
        full_scan_every,
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
    let mut redis = MemRedis::new();
    redis.record = false;
    let _ = a.start(0);
    let _ = b.start(0);
    let payload = |i: usize, gen: usize| {
        format!(
            r#"{{"model_to_pods":{{"llama-3-8b":{{"10.0.0.{}:8000":{}}}}}}}"#,
            i % 8,
            1_700_000_000_000_000_000u64 + gen as u64
        )
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
    let mut now = run_cycle(&mut a, &mut redis, 0);
    now = run_cycle(&mut b, &mut redis, now);
    let churn = (entities * churn_per_mille).div_ceil(1000);
    let before = b.stats().clone();
    for gen in 1..=cycles {
        {
            let mut w = writer.borrow_mut();
            for k in 0..churn {
                let i = (gen * 7919 + k * 104_729) % entities.max(1);
                w.set(
                    &format!("{}", 1_000_000_007u64 * i as u64),
                    payload(i, gen).as_bytes(),
                );
            }
        }
        now = run_cycle(&mut a, &mut redis, now);
        now = run_cycle(&mut b, &mut redis, now);
    }
    let after = b.stats();
    let n = cycles.max(1) as f64;
    CycleCost {
        calls: (after.calls_sent - before.calls_sent) as f64 / n,
        commands: (after.commands_sent - before.commands_sent) as f64 / n,
        bytes_sent: (after.bytes_sent - before.bytes_sent) as f64 / n,
        bytes_received: (after.bytes_received - before.bytes_received) as f64 / n,
    }
}
