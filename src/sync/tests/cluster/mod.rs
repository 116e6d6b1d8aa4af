//! The engine in Redis Cluster mode against a fake cluster: nodes are
//! in-memory Redises, and the fake answers as Redis Cluster does: `CLUSTER
//! SLOTS`, `MOVED` from a node that does not own a slot, `ASK`/`TRYAGAIN`
//! from a source whose slot is migrating, `ASKING` on the importing node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use crate::sync::error::CallFailed;
use crate::sync::keys::{key_slot, namespace_tags, part_of, KeyLayout, SLOTS};
use crate::sync::memredis::MemRedis;
use crate::sync::resp::{encode_command, parse, Frame};
use crate::sync::testkit::MapComponent;
use crate::sync::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const NS: &str = "prefixcache";
const N1: &str = "10.0.0.1:7000";
const N2: &str = "10.0.0.2:7000";
const N3: &str = "10.0.0.3:7000";

/// A slot being moved from `src` to `dst`.
struct Migration {
    slot: u16,
    src: String,
    dst: String,
}

struct FakeCluster {
    nodes: BTreeMap<String, MemRedis>,
    /// Owner of every slot.
    owner: Vec<String>,
    migrating: Option<Migration>,
    /// Node of calls that name none (the bridge's seed route).
    seed: String,
    /// Calls per node (None: seed route).
    calls: BTreeMap<Option<String>, usize>,
    /// Bodies sent with ASKING in them.
    asking_calls: usize,
    /// Always answer MOVED to the other node (a broken hand-over).
    ping_pong: bool,
}

impl FakeCluster {
    /// Three masters with equal contiguous ranges, as `--cluster create`.
    fn new() -> Self {
        let third = usize::from(SLOTS) / 3;
        let owner = (0..usize::from(SLOTS))
            .map(|s| match s {
                s if s <= third => N1,
                s if s <= 2 * third => N2,
                _ => N3,
            })
            .map(str::to_owned)
            .collect();
        Self {
            nodes: [N1, N2, N3]
                .iter()
                .map(|n| (n.to_string(), MemRedis::new()))
                .collect(),
            owner,
            migrating: None,
            seed: N1.into(),
            calls: BTreeMap::new(),
            asking_calls: 0,
            ping_pong: false,
        }
    }

    fn slots_reply(&self) -> Frame {
        let mut ranges = Vec::new();
        let mut start = 0usize;
        for s in 1..=self.owner.len() {
            if s == self.owner.len() || self.owner[s] != self.owner[start] {
                let (host, port) = self.owner[start].rsplit_once(':').unwrap();
                ranges.push(Frame::Array(vec![
                    Frame::Integer(start as i64),
                    Frame::Integer(s as i64 - 1),
                    Frame::Array(vec![
                        Frame::Bulk(host.as_bytes().to_vec()),
                        Frame::Integer(port.parse().unwrap()),
                        Frame::Bulk(b"id".to_vec()),
                    ]),
                ]));
                start = s;
            }
        }
        Frame::Array(ranges)
    }

    /// One command on `node` as Redis Cluster would answer it.
    fn command(&mut self, node: &str, args: &[Vec<u8>], asking: bool) -> Frame {
        let name = args[0].to_ascii_uppercase();
        match name.as_slice() {
            b"CLUSTER" => return self.slots_reply(),
            b"SCAN" | b"INFO" => return self.run(node, args),
            _ => {}
        }
        let keys: Vec<&Vec<u8>> = match name.as_slice() {
            b"MGET" | b"DEL" => args[1..].iter().collect(),
            _ => vec![&args[1]],
        };
        let slot = key_slot(keys[0]);
        let owner = self.owner[usize::from(slot)].clone();
        if self.ping_pong {
            let other = if node == N1 { N2 } else { N1 };
            return Frame::Error(format!("MOVED {slot} {other}"));
        }
        let migrating = self.migrating.as_ref().filter(|m| m.slot == slot);
        if node != owner {
            if asking && migrating.is_some_and(|m| m.dst == node) {
                return self.run(node, args);
            }
            return Frame::Error(format!("MOVED {slot} {owner}"));
        }
        if let Some(m) = migrating.filter(|m| m.src == node) {
            let here = self.nodes.get(node).unwrap();
            let missing = keys
                .iter()
                .filter(|k| here.get(&String::from_utf8_lossy(k)).is_none())
                .filter(|k| here.stream_len(&String::from_utf8_lossy(k)) == 0)
                .count();
            if missing == keys.len() {
                return Frame::Error(format!("ASK {slot} {}", m.dst));
            }
            if missing > 0 {
                return Frame::Error(
                    "TRYAGAIN Multiple keys request during rehashing of slot".into(),
                );
            }
        }
        self.run(node, args)
    }

    fn run(&mut self, node: &str, args: &[Vec<u8>]) -> Frame {
        let mut body = Vec::new();
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        encode_command(&mut body, &refs);
        let reply = self.nodes.get_mut(node).unwrap().execute(&body);
        parse(&reply).unwrap().0
    }

    /// Answers one call's pipeline.
    fn execute(&mut self, call: &Call) -> Vec<u8> {
        let node = call.node.clone().unwrap_or_else(|| self.seed.clone());
        *self.calls.entry(call.node.clone()).or_default() += 1;
        let mut out = Vec::new();
        let mut rest = &call.body[..];
        let mut asking = false;
        let mut saw_asking = false;
        while !rest.is_empty() {
            let (frame, used) = parse(rest).unwrap();
            rest = &rest[used..];
            let Frame::Array(items) = frame else { panic!() };
            let args: Vec<Vec<u8>> = items
                .iter()
                .map(|f| f.as_bytes().unwrap().to_vec())
                .collect();
            let name = args[0].to_ascii_uppercase();
            let reply = match name.as_slice() {
                b"QUIT" | b"AUTH" => Frame::Simple("OK".into()),
                b"ASKING" => {
                    asking = true;
                    saw_asking = true;
                    Frame::Simple("OK".into())
                }
                _ => {
                    let r = self.command(&node, &args, asking);
                    asking = false;
                    r
                }
            };
            reply.encode(&mut out);
        }
        if saw_asking {
            self.asking_calls += 1;
        }
        out
    }

    fn set_now(&mut self, now_ms: u64) {
        for r in self.nodes.values_mut() {
            r.set_now(now_ms);
        }
    }

    /// Entity keys of the namespace on `node`.
    fn keys_on(&self, node: &str) -> Vec<String> {
        self.nodes[node].keys(&format!("aibrix:{{{NS}*}}:e:*"))
    }

    /// Moves `n` entity keys of the migrating slot from source to target.
    fn migrate_some(&mut self, n: usize) {
        let m = self.migrating.as_ref().unwrap();
        let (slot, src, dst) = (m.slot, m.src.clone(), m.dst.clone());
        let keys: Vec<String> = self
            .keys_on(&src)
            .into_iter()
            .filter(|k| key_slot(k.as_bytes()) == slot)
            .take(n)
            .collect();
        for k in keys {
            let v = self.nodes[&src].get(&k).unwrap();
            let ttl = self.nodes[&src].ttl_ms(&k).unwrap_or(120_000);
            assert!(
                self.nodes[&dst].get(&k).is_none(),
                "{k} exists on both sides of the migration (MIGRATE would fail with BUSYKEY)"
            );
            self.nodes
                .get_mut(&dst)
                .unwrap()
                .setex(&k, ttl.div_ceil(1000), &v);
            self.nodes.get_mut(&src).unwrap().remove(&k);
        }
    }
}

fn settings(parts: usize) -> SyncSettings {
    SyncSettings {
        enabled: true,
        poll_ms: 100,
        period_ms: 1000,
        hash_tags: parts,
        cluster: true,
        ..Default::default()
    }
}

fn engine(settings: SyncSettings, comp: &Rc<RefCell<MapComponent>>, seed: u64) -> SyncEngine {
    let mut e = SyncEngine::new(settings, seed);
    e.register(Box::new(Rc::clone(comp))).unwrap();
    e.start(0).unwrap();
    e
}

fn caps() -> Capabilities {
    Capabilities {
        delta: true,
        ..Default::default()
    }
}

/// One tick at `now`, every call answered by the cluster.
fn drive(e: &mut SyncEngine, c: &mut FakeCluster, now: u64) {
    c.set_now(now);
    let mut q: VecDeque<Call> = e.tick(now).into();
    while let Some(call) = q.pop_front() {
        let reply = c.execute(&call);
        q.extend(e.on_response(call.id, now, Ok(&reply)));
    }
}

/// Runs both engines tick by tick for `ms`.
fn run(a: &mut SyncEngine, b: &mut SyncEngine, c: &mut FakeCluster, from: u64, ms: u64) -> u64 {
    let mut now = from;
    while now < from + ms {
        now += 25;
        drive(a, c, now);
        drive(b, c, now);
    }
    now
}

#[test]
fn parts_spread_over_the_masters_and_two_replicas_converge() {
    let mut cluster = FakeCluster::new();
    let wa = MapComponent::shared(NS, caps());
    let rb = MapComponent::shared(NS, caps());
    let mut a = engine(settings(6), &wa, 1);
    let mut b = engine(settings(6), &rb, 2);
    for i in 0..300 {
        wa.borrow_mut()
            .set(&format!("{i}"), format!("v{i}").as_bytes());
    }
    let now = run(&mut a, &mut b, &mut cluster, 0, 3000);
    assert_eq!(rb.borrow().entries.len(), 300, "{:?}", b.stats());
    // 6 parts over 3 masters: 2 each, so each holds about a third.
    for n in [N1, N2, N3] {
        let keys = cluster.keys_on(n).len();
        assert!((60..=140).contains(&keys), "{n} holds {keys} keys");
    }
    // Only the first CLUSTER SLOTS of each replica took the seed route.
    assert_eq!(cluster.calls.get(&None).copied(), Some(2));
    assert!(a.stats().topology_refreshes >= 2);
    assert_eq!(a.stats().moved_redirects + b.stats().moved_redirects, 0);
    // A change reaches B through its polls of the parts' logs.
    wa.borrow_mut().set("7", b"changed");
    run(&mut a, &mut b, &mut cluster, now, 1000);
    assert_eq!(rb.borrow().entries["7"], b"changed");
}

#[test]
fn moved_patches_the_map_and_the_work_goes_to_the_new_owner() {
    let mut cluster = FakeCluster::new();
    let wa = MapComponent::shared(NS, caps());
    let rb = MapComponent::shared(NS, caps());
    let mut a = engine(settings(3), &wa, 1);
    let mut b = engine(settings(3), &rb, 2);
    for i in 0..100 {
        wa.borrow_mut().set(&format!("{i}"), b"v0");
    }
    let now = run(&mut a, &mut b, &mut cluster, 0, 2500);
    assert_eq!(rb.borrow().entries.len(), 100);
    // Every slot of N1 now belongs to N2 (its keys copied over): the
    // engines' maps are stale until their next CLUSTER SLOTS.
    let moved: Vec<String> = cluster.keys_on(N1);
    for k in &moved {
        let v = cluster.nodes[N1].get(k).unwrap();
        cluster.nodes.get_mut(N2).unwrap().setex(k, 120, &v);
        cluster.nodes.get_mut(N1).unwrap().remove(k);
    }
    for o in cluster.owner.iter_mut().filter(|o| *o == N1) {
        *o = N2.into();
    }
    for i in 0..100 {
        wa.borrow_mut().set(&format!("n{i}"), b"v1");
    }
    run(&mut a, &mut b, &mut cluster, now, 3000);
    let entries = &rb.borrow().entries;
    assert!((0..100).all(|i| entries[&format!("n{i}")] == b"v1"));
    let moved_seen = a.stats().moved_redirects + b.stats().moved_redirects;
    assert!(moved_seen > 0, "{:?}", a.stats());
    assert_eq!(a.stats().redirects_exhausted, 0);
    assert!(cluster.keys_on(N1).is_empty(), "{:?}", cluster.keys_on(N1));
}

#[test]
fn ask_sends_only_the_redirected_commands_and_tryagain_splits_the_mget() {
    let mut cluster = FakeCluster::new();
    let wa = MapComponent::shared(NS, caps());
    let rb = MapComponent::shared(NS, caps());
    // One part: every key in one slot, the one being migrated.
    let mut a = engine(settings(1), &wa, 1);
    let mut b = engine(settings(1), &rb, 2);
    for i in 0..50 {
        wa.borrow_mut().set(&format!("{i}"), b"v0");
    }
    let mut now = run(&mut a, &mut b, &mut cluster, 0, 2500);
    assert_eq!(rb.borrow().entries.len(), 50);
    let slot = key_slot(NS.as_bytes());
    let src = cluster.owner[usize::from(slot)].clone();
    let dst = if src == N1 { N2 } else { N1 }.to_string();
    cluster.migrating = Some(Migration {
        slot,
        src: src.clone(),
        dst: dst.clone(),
    });
    // Half the keys move; new keys and changes keep coming.
    cluster.migrate_some(25);
    for round in 0..6 {
        for i in 0..60 {
            let v = format!("v{}", round + 1);
            wa.borrow_mut().set(&format!("{i}"), v.as_bytes());
        }
        now = run(&mut a, &mut b, &mut cluster, now, 1000);
        cluster.migrate_some(5);
    }
    let stats = |e: &SyncEngine| e.stats().clone();
    let (sa, sb) = (stats(&a), stats(&b));
    assert!(sa.ask_redirects + sb.ask_redirects > 0, "{sa:?}");
    assert!(cluster.asking_calls > 0);
    assert!(sb.tryagain_retries > 0, "{sb:?}");
    assert_eq!(sa.redirects_exhausted + sb.redirects_exhausted, 0);
    assert!(sb.cycles_ok > 0 && sa.cycles_failed == 0 && sb.cycles_failed == 0);
    // Hand-over: the rest moves (no key ever on both sides: migrate_some
    // checks), the slot is the target's.
    cluster.migrate_some(usize::MAX);
    cluster.migrating = None;
    cluster.owner[usize::from(slot)] = dst.clone();
    // (New ids: the fake moves no streams, so the writer's next cycle
    // full-scans, and MapComponent, unlike the real syncables, takes any
    // pulled value over its own unpushed change.)
    for i in 0..60 {
        wa.borrow_mut().set(&format!("f{i}"), b"final");
    }
    run(&mut a, &mut b, &mut cluster, now, 3000);
    let entries = &rb.borrow().entries;
    assert_eq!(entries.len(), 120);
    assert!(
        (0..60).all(|i| entries[&format!("f{i}")] == b"final"),
        "{entries:?}\n{:?}\n{:?}",
        a.stats(),
        b.stats()
    );
    assert!(cluster.keys_on(&src).is_empty());
}

#[test]
fn endless_redirections_fail_the_cycle_bounded_and_counted() {
    let mut cluster = FakeCluster::new();
    let wa = MapComponent::shared(NS, caps());
    let mut a = engine(settings(2), &wa, 1);
    wa.borrow_mut().set("1", b"v");
    cluster.ping_pong = true;
    let mut now = 0;
    while now < 3000 {
        now += 25;
        drive(&mut a, &mut cluster, now);
    }
    let s = a.stats();
    assert!(s.redirects_exhausted > 0, "{s:?}");
    assert!(s.cycles_failed > 0 && s.cycles_ok == 0, "{s:?}");
    // Bounded: at most MAX_REDIRECTS + 1 calls per redirected piece of work.
    assert!(s.moved_redirects <= s.calls_sent, "{s:?}");
    // Redis answers again: sync recovers.
    cluster.ping_pong = false;
    a.retry_now(now);
    while now < 8000 {
        now += 25;
        drive(&mut a, &mut cluster, now);
    }
    assert!(a.stats().cycles_ok > 0, "{:?}", a.stats());
}

#[test]
fn a_redirected_log_entry_goes_again_with_every_id_it_listed() {
    let mut cluster = FakeCluster::new();
    let wa = MapComponent::shared(NS, caps());
    let mut a = engine(settings(1), &wa, 1);
    for i in 0..10 {
        wa.borrow_mut().set(&format!("{i}"), b"v0");
    }
    let mut now = 0;
    while now < 2500 {
        now += 25;
        drive(&mut a, &mut cluster, now);
    }
    let slot = key_slot(NS.as_bytes());
    let src = cluster.owner[usize::from(slot)].clone();
    let dst = if src == N1 { N2 } else { N1 }.to_string();
    let log = format!("aibrix:{{{NS}}}:log");
    // The change log has moved already (gone from the source), the values
    // not yet: SETEX runs on the source, XADD is asked to the target.
    cluster.nodes.get_mut(&src).unwrap().remove(&log);
    cluster.migrating = Some(Migration {
        slot,
        src: src.clone(),
        dst: dst.clone(),
    });
    for i in 0..10 {
        wa.borrow_mut().set(&format!("{i}"), b"v1");
    }
    let end = now + 2000;
    while now < end {
        now += 25;
        drive(&mut a, &mut cluster, now);
    }
    let key0 = format!("aibrix:{{{NS}}}:e:0");
    assert_eq!(cluster.nodes[&src].get(&key0).as_deref(), Some(&b"v1"[..]));
    assert!(cluster.nodes[&dst].get(&key0).is_none());
    assert!(
        cluster.nodes[&dst].stream_len(&log) >= 1,
        "no log entry on the target"
    );
    assert!(a.stats().ask_redirects >= 1);
    let xadds: Vec<&Vec<Vec<u8>>> = cluster.nodes[&dst]
        .log
        .iter()
        .filter(|c| c[0] == b"XADD")
        .collect();
    let listed = String::from_utf8_lossy(xadds.last().unwrap().last().unwrap()).into_owned();
    assert_eq!(listed.split(',').count(), 10, "{listed}");
}

mod pipelines;
