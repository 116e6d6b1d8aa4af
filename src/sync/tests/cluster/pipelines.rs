//! Calls per master in cluster mode: one pipeline per node for a
//! write-through, a poll and a cycle's reads, redirections followed per
//! piece of a pipeline, truncated batches read again piece by piece.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// One call as the fake cluster saw it: the node it named and the commands
/// of its pipeline (AUTH, ASKING and QUIT left out).
#[derive(Clone, Debug)]
struct Seen {
    node: Option<String>,
    commands: Vec<String>,
}

impl Seen {
    fn has(&self, name: &str) -> bool {
        self.commands.iter().any(|c| c == name)
    }
}

fn commands_of(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (frame, used) = parse(rest).unwrap();
        rest = &rest[used..];
        let Frame::Array(items) = frame else { panic!() };
        let name = String::from_utf8_lossy(items[0].as_bytes().unwrap()).to_ascii_uppercase();
        if !matches!(name.as_str(), "AUTH" | "ASKING" | "QUIT") {
            out.push(name);
        }
    }
    out
}

/// One tick at `now`; its calls are answered in waves, as concurrent calls
/// are: every call of a wave, then the follow-ups they produced. Returns
/// each wave's calls (the waves are the round trips one after another).
fn drive_waves(e: &mut SyncEngine, c: &mut FakeCluster, now: u64) -> Vec<Vec<Seen>> {
    c.set_now(now);
    let mut waves = Vec::new();
    let mut wave = e.tick(now);
    while !wave.is_empty() {
        let mut next = Vec::new();
        let mut seen = Vec::new();
        for call in wave {
            seen.push(Seen {
                node: call.node.clone(),
                commands: commands_of(&call.body),
            });
            let reply = c.execute(&call);
            next.extend(e.on_response(call.id, now, Ok(&reply)));
        }
        waves.push(seen);
        wave = next;
    }
    waves
}

/// Calls per node among `calls` that hold a `name` command.
fn per_node(calls: &[Seen], name: &str) -> BTreeMap<Option<String>, usize> {
    let mut out = BTreeMap::new();
    for s in calls.iter().filter(|s| s.has(name)) {
        *out.entry(s.node.clone()).or_default() += 1;
    }
    out
}

/// `Seen`'s commands named `name`.
fn count(s: &Seen, name: &str) -> usize {
    s.commands.iter().filter(|c| *c == name).count()
}

/// The parts of namespace `NS` over `parts` hash tags, as `(tag's log key,
/// owner)` in the fake cluster.
fn part_owners(c: &FakeCluster, parts: usize) -> Vec<(String, String)> {
    namespace_tags(NS, parts)
        .iter()
        .map(|tag| {
            let log = KeyLayout::with_tag("aibrix", tag).log_key().to_owned();
            let owner = c.owner[usize::from(key_slot(log.as_bytes()))].clone();
            (log, owner)
        })
        .collect()
}

/// A prompt's 24 block ids.
fn block_ids() -> Vec<String> {
    (0..24u64)
        .map(|i| (1_000_003 * (i + 1)).to_string())
        .collect()
}

fn write_through(parts: usize) -> SyncSettings {
    SyncSettings {
        write_through: true,
        ..settings(parts)
    }
}

/// Two replicas synced for 3 s (both past their first cycles, polling).
fn warm(c: &mut FakeCluster, s: &SyncSettings) -> (Pair, u64) {
    let wa = MapComponent::shared(NS, caps());
    let rb = MapComponent::shared(NS, caps());
    let mut a = engine(s.clone(), &wa, 1);
    let mut b = engine(s.clone(), &rb, 2);
    wa.borrow_mut().set("warm", b"0");
    let now = run(&mut a, &mut b, c, 0, 3000);
    (Pair { a, b, wa, rb }, now)
}

struct Pair {
    a: SyncEngine,
    b: SyncEngine,
    wa: Rc<RefCell<MapComponent>>,
    rb: Rc<RefCell<MapComponent>>,
}

impl Pair {
    /// A routes a new prompt: its blocks changed and written through.
    fn put(&mut self, ids: &[String], value: &[u8]) {
        for id in ids {
            self.wa.borrow_mut().set(id, value);
            self.a.put(NS, id, value.to_vec()).unwrap();
        }
    }

    fn b_has(&self, ids: &[String], value: &[u8]) -> bool {
        let rb = self.rb.borrow();
        ids.iter()
            .all(|id| rb.entries.get(id).is_some_and(|v| v == value))
    }
}

#[test]
fn a_write_through_and_a_poll_cost_one_call_per_master() {
    let mut c = FakeCluster::new();
    let (mut p, mut now) = warm(&mut c, &write_through(16));
    let ids = block_ids();
    let owners = part_owners(&c, 16);
    let touched: std::collections::BTreeSet<usize> = ids.iter().map(|id| part_of(id, 16)).collect();
    assert!(touched.len() > 6, "24 blocks touch many of the 16 parts");
    p.put(&ids, b"new");
    now += 25;
    let waves = drive_waves(&mut p.a, &mut c, now);
    let flush: Vec<Seen> = waves
        .concat()
        .into_iter()
        .filter(|s| s.has("SETEX"))
        .collect();
    // One pipeline per master: each of its touched parts' SETEXes, then
    // that part's XADD and EXPIRE (16 calls before, one per part).
    assert_eq!(flush.len(), 3, "{flush:?}");
    for call in &flush {
        let node = call.node.clone().unwrap();
        let parts_here = touched.iter().filter(|t| owners[**t].1 == node).count();
        let ids_here = ids
            .iter()
            .filter(|id| owners[part_of(id, 16)].1 == node)
            .count();
        assert_eq!(count(call, "SETEX"), ids_here, "{call:?}");
        assert_eq!(count(call, "XADD"), parts_here, "{call:?}");
        assert_eq!(count(call, "EXPIRE"), parts_here, "{call:?}");
    }
    assert_eq!(p.a.stats().write_through_calls, 3);
    assert_eq!(p.a.stats().write_through_failed, 0);
    // Every key on the master owning its part.
    for id in &ids {
        let (log, owner) = &owners[part_of(id, 16)];
        let key = log.replace(":log", &format!(":e:{id}"));
        assert!(c.nodes[owner].get(&key).is_some(), "{key} not on {owner}");
    }
    // B's poll: the change logs of the parts a master holds in one call,
    // then the changed ids of those parts in one MGET pipeline per master.
    let mut poll = None;
    for _ in 0..20 {
        now += 25;
        let waves = drive_waves(&mut p.b, &mut c, now);
        if p.b_has(&ids, b"new") {
            poll = Some(waves);
            break;
        }
    }
    let waves = poll.expect("B never applied the blocks");
    let calls = waves.concat();
    let xrange = per_node(&calls, "XRANGE");
    let mget = per_node(&calls, "MGET");
    assert!(
        !calls.iter().any(|s| s.has("CLUSTER")),
        "a cycle, not a poll"
    );
    assert_eq!(waves.len(), 2, "log reads, then values: {waves:?}");
    assert!(
        xrange.len() == 3 && xrange.values().all(|n| *n == 1),
        "{xrange:?}"
    );
    assert!(
        mget.len() == 3 && mget.values().all(|n| *n == 1),
        "{mget:?}"
    );
    let mgets: usize = calls.iter().map(|s| count(s, "MGET")).sum();
    assert_eq!(mgets, touched.len(), "one MGET per touched part");
    // B's next cycle: CLUSTER SLOTS and one log-read call per master, all
    // at once (healthy, the map known).
    let cycle = next_cycle(&mut p.b, &mut c, &mut now);
    let xrange = per_node(&cycle[0], "XRANGE");
    assert!(
        xrange.len() == 3 && xrange.values().all(|n| *n == 1),
        "{cycle:?}"
    );
    assert_eq!(cycle.len(), 1, "{cycle:?}");
    assert_eq!(p.a.stats().moved_redirects + p.b.stats().moved_redirects, 0);
}

/// Ticks until a tick starts a cycle (sends `CLUSTER SLOTS`); its waves.
fn next_cycle(e: &mut SyncEngine, c: &mut FakeCluster, now: &mut u64) -> Vec<Vec<Seen>> {
    for _ in 0..400 {
        *now += 25;
        let waves = drive_waves(e, c, *now);
        if waves.concat().iter().any(|s| s.has("CLUSTER")) {
            return waves;
        }
    }
    panic!("no cycle in 10 s");
}

#[test]
fn a_healthy_cycle_reads_the_slots_with_its_reads_and_a_failed_one_first() {
    let mut c = FakeCluster::new();
    let (mut p, mut now) = warm(&mut c, &settings(16));
    let cycle = next_cycle(&mut p.b, &mut c, &mut now);
    assert_eq!(cycle.len(), 1, "{cycle:?}");
    assert!(cycle[0].iter().any(|s| s.has("CLUSTER")));
    assert_eq!(per_node(&cycle[0], "XRANGE").len(), 3, "{cycle:?}");
    // A master stops answering: B's run fails.
    let failed = p.b.stats().cycles_failed;
    for _ in 0..400 {
        now += 25;
        c.set_now(now);
        let mut q: VecDeque<Call> = p.b.tick(now).into();
        while let Some(call) = q.pop_front() {
            let next = if call.node.as_deref() == Some(N2) {
                p.b.on_response(call.id, now, Err(CallFailed::Timeout))
            } else {
                let reply = c.execute(&call);
                p.b.on_response(call.id, now, Ok(&reply))
            };
            q.extend(next);
        }
        if p.b.stats().cycles_failed > failed {
            break;
        }
    }
    assert!(p.b.stats().cycles_failed > failed);
    // The next cycle asks who owns what first, then reads from that map.
    let cycle = next_cycle(&mut p.b, &mut c, &mut now);
    assert_eq!(cycle.len(), 2, "{cycle:?}");
    assert!(
        cycle[0].len() == 1 && cycle[0][0].has("CLUSTER"),
        "{cycle:?}"
    );
    assert_eq!(per_node(&cycle[1], "XRANGE").len(), 3, "{cycle:?}");
    assert!(!p.b.failing(), "{:?}", p.b.stats());
}

#[test]
fn one_tag_and_one_redis_send_work_as_before() {
    // One Redis (cluster off) with 16 tags, and cluster mode with one tag:
    // no batching, one call per part and chunk, as before.
    for (cluster, parts) in [(false, 16), (true, 1)] {
        let mut c = FakeCluster::new();
        let s = SyncSettings {
            cluster,
            ..write_through(parts)
        };
        let (mut p, mut now) = warm(&mut c, &s);
        let ids = block_ids();
        let touched: std::collections::BTreeSet<usize> =
            ids.iter().map(|id| part_of(id, parts)).collect();
        p.put(&ids, b"new");
        now += 25;
        let calls = drive_waves(&mut p.a, &mut c, now).concat();
        let flush: Vec<&Seen> = calls.iter().filter(|s| s.has("SETEX")).collect();
        assert_eq!(
            flush.len(),
            touched.len(),
            "cluster {cluster}, {parts} tags"
        );
        assert!(flush.iter().all(|s| count(s, "XADD") == 1));
    }
}

#[test]
fn redirections_in_a_mixed_pipeline_are_followed_per_piece() {
    let mut c = FakeCluster::new();
    let (mut p, mut now) = warm(&mut c, &write_through(16));
    let owners = part_owners(&c, 16);
    let ids = block_ids();
    // A master with at least three touched parts: one migrates (its values
    // and log already on the target: ASK), one moved for good (MOVED, the
    // engine's map stale), the others stay.
    let by_part = |part: usize| -> Vec<String> {
        ids.iter()
            .filter(|id| part_of(id, 16) == part)
            .cloned()
            .collect()
    };
    let src = N1.to_string();
    let mine: Vec<usize> = (0..16)
        .filter(|t| owners[*t].1 == src && !by_part(*t).is_empty())
        .collect();
    assert!(mine.len() >= 3, "{mine:?}");
    let (asked, moved, stays) = (mine[0], mine[1], mine[2]);
    let slot_of = |part: usize| key_slot(owners[part].0.as_bytes());
    c.migrating = Some(Migration {
        slot: slot_of(asked),
        src: src.clone(),
        dst: N2.into(),
    });
    c.nodes.get_mut(&src).unwrap().remove(&owners[asked].0);
    c.owner[usize::from(slot_of(moved))] = N3.into();
    let calls_before = c.calls.get(&Some(src.clone())).copied().unwrap_or(0);
    p.put(&ids, b"new");
    now += 25;
    let waves = drive_waves(&mut p.a, &mut c, now);
    // The pipeline to N1 carried every N1 part; only the redirected pieces
    // went again, each to its node, after it.
    assert_eq!(waves.len(), 2, "{waves:?}");
    let again = &waves[1];
    assert_eq!(again.len(), 2, "{again:?}");
    let to = |node: &str| {
        again
            .iter()
            .find(|s| s.node.as_deref() == Some(node))
            .unwrap()
    };
    let ask = to(N2);
    assert_eq!(count(ask, "SETEX"), by_part(asked).len(), "{ask:?}");
    assert_eq!(count(ask, "XADD"), 1);
    let moved_call = to(N3);
    assert_eq!(count(moved_call, "SETEX"), by_part(moved).len());
    assert_eq!(c.asking_calls, 1);
    assert_eq!(
        c.calls.get(&Some(src.clone())).copied().unwrap_or(0),
        calls_before + 1,
        "the N1 pipeline was not sent again"
    );
    let key = |part: usize, id: &str| owners[part].0.replace(":log", &format!(":e:{id}"));
    for id in by_part(asked) {
        assert!(c.nodes[N2].get(&key(asked, &id)).is_some());
        assert!(c.nodes[&src].get(&key(asked, &id)).is_none());
    }
    for id in by_part(moved) {
        assert!(c.nodes[N3].get(&key(moved, &id)).is_some());
    }
    for id in by_part(stays) {
        assert!(c.nodes[&src].get(&key(stays, &id)).is_some());
    }
    let s = p.a.stats();
    assert!(s.ask_redirects > 0 && s.moved_redirects > 0, "{s:?}");
    assert_eq!((s.write_through_failed, s.redirects_exhausted), (0, 0));
    assert_eq!(
        s.pushed,
        1 + ids.len() as u64,
        "warm-up's one, then each block once"
    );
    // The map was patched: the next write-through to the moved part goes
    // straight to N3.
    let moved_before = s.moved_redirects;
    p.put(&by_part(moved), b"again");
    now += 25;
    let waves = drive_waves(&mut p.a, &mut c, now);
    let setex: Vec<&Seen> = waves[0].iter().filter(|s| s.has("SETEX")).collect();
    assert!(
        setex.len() == 1 && setex[0].node.as_deref() == Some(N3),
        "{waves:?}"
    );
    assert!(
        waves[1..].iter().flatten().all(|s| !s.has("SETEX")),
        "{waves:?}"
    );
    assert_eq!(p.a.stats().moved_redirects, moved_before);

    // B's poll reads every part's values through per-master pipelines: the
    // asked part's MGET (its log and values on the target) is asked there,
    // the moved one's goes to N3, the rest is applied from the first reply.
    for _ in 0..40 {
        now += 25;
        drive_waves(&mut p.b, &mut c, now);
        drive_waves(&mut p.a, &mut c, now);
        if p.b_has(&by_part(asked), b"new") && p.b_has(&by_part(stays), b"new") {
            break;
        }
    }
    assert!(p.b_has(&by_part(asked), b"new") && p.b_has(&by_part(stays), b"new"));
    let sb = p.b.stats();
    assert!(sb.ask_redirects + sb.moved_redirects > 0, "{sb:?}");
    assert_eq!(
        (sb.cycles_failed, sb.polls_failed, sb.redirects_exhausted),
        (0, 0, 0)
    );
}

#[test]
fn a_truncated_batch_is_read_again_one_piece_per_call() {
    let mut c = FakeCluster::new();
    let s = SyncSettings {
        mget_batch: 200,
        ..write_through(16)
    };
    let (mut p, mut now) = warm(&mut c, &s);
    let ids = block_ids();
    p.put(&ids, b"new");
    now += 25;
    drive_waves(&mut p.a, &mut c, now);
    // B's replies: the first multi-piece MGET pipeline is cut short.
    let mut cut = 0;
    for _ in 0..20 {
        now += 25;
        c.set_now(now);
        let mut q: VecDeque<Call> = p.b.tick(now).into();
        while let Some(call) = q.pop_front() {
            let mut reply = c.execute(&call);
            let commands = commands_of(&call.body);
            if cut == 0 && commands.iter().filter(|n| *n == "MGET").count() > 1 {
                cut += 1;
                reply.truncate(reply.len() - 3);
            }
            q.extend(p.b.on_response(call.id, now, Ok(&reply)));
        }
        if p.b_has(&ids, b"new") {
            break;
        }
    }
    assert_eq!(cut, 1);
    assert!(p.b_has(&ids, b"new"));
    let sb = p.b.stats();
    assert_eq!(sb.truncations, 1);
    assert_eq!((sb.polls_failed, sb.cycles_failed), (0, 0), "{sb:?}");
}
