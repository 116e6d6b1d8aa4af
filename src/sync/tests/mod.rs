//! One test per sync rule, driving engines against the in-memory Redis.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::rc::Rc;

use super::error::SyncError;
use super::testkit::{
    deliver_with, drive, run_cycle, steady_state_cost, steady_state_cost_with, CostModel,
    MapComponent, TICK_MS, TOMBSTONE,
};
use super::*;
use crate::rng::SplitMix64;
use crate::sync::resp::{parse, Frame};
use memredis::MemRedis;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

type Comp = Rc<RefCell<MapComponent>>;

const NS: &str = "prefixcache";

/// Defaults, enabled, with polls every 100 ms so the timing tests read in
/// round numbers (the default is 175 ms).
fn settings() -> SyncSettings {
    SyncSettings {
        enabled: true,
        poll_ms: 100,
        ..Default::default()
    }
}

fn caps(delta: bool, hooks: bool, stale: bool, tombstones: bool) -> Capabilities {
    Capabilities {
        delta,
        hooks,
        stale,
        tombstones,
    }
}

fn engine(settings: SyncSettings, comps: &[&Comp], seed: u64) -> SyncEngine {
    let mut e = SyncEngine::new(settings, seed);
    for c in comps {
        e.register(Box::new(Rc::clone(c))).unwrap();
    }
    e.start(0).unwrap();
    e
}

fn key(id: &str) -> String {
    format!("aibrix:{{{NS}}}:e:{id}")
}

/// Commands (name + args) of a call body.
fn commands(body: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        let (frame, used) = parse(&body[pos..]).unwrap();
        pos += used;
        let Frame::Array(items) = frame else {
            panic!("command not an array")
        };
        out.push(
            items
                .into_iter()
                .map(|f| f.as_bytes().unwrap().to_vec())
                .collect(),
        );
    }
    out
}

fn names(body: &[u8]) -> Vec<String> {
    commands(body)
        .iter()
        .map(|c| String::from_utf8_lossy(&c[0]).into_owned())
        .collect()
}

#[test]
fn keys_use_prefix_and_namespace_hash_tag() {
    let comp = MapComponent::shared("podload", caps(true, false, false, false));
    comp.borrow_mut().set("pod-1", b"3");
    let mut e = engine(
        SyncSettings {
            key_prefix: "prod".into(),
            ..settings()
        },
        &[&comp],
        1,
    );
    let mut r = MemRedis::new();
    run_cycle(&mut e, &mut r, 0);
    assert_eq!(r.keys("*:e:*"), vec!["prod:{podload}:e:pod-1".to_string()]);
    let scan = r.log.iter().find(|c| c[0] == b"SCAN").unwrap();
    assert_eq!(scan[3], b"prod:{podload}:e:*");
}

#[test]
fn every_write_is_setex_with_the_record_ttl() {
    for (configured, expect_ms) in [(120, 120_000), (30, 30_000), (0, 120_000), (-3, 120_000)] {
        let comp = MapComponent::shared(NS, caps(true, false, false, false));
        comp.borrow_mut().set("1", b"a");
        comp.borrow_mut().set("2", b"b");
        let mut e = engine(
            SyncSettings {
                record_ttl_secs: configured,
                ..settings()
            },
            &[&comp],
            1,
        );
        let mut r = MemRedis::new();
        let now = run_cycle(&mut e, &mut r, 0);
        r.set_now(now);
        assert_eq!(r.ttl_ms(&key("1")), Some(expect_ms), "ttl {configured}");
        assert_eq!(r.ttl_ms(&key("2")), Some(expect_ms));
        assert_eq!(r.count("SETEX"), 2);
        assert_eq!(r.count("SET"), 0);
    }
}

#[test]
fn pull_scans_then_mgets_in_batches() {
    let comp = MapComponent::shared(NS, caps(false, false, false, false));
    let mut r = MemRedis::new();
    for i in 0..1000 {
        r.setex(&key(&i.to_string()), 600, b"v");
    }
    r.setex("aibrix:{podload}:e:1", 600, b"other namespace");
    let s = SyncSettings {
        scan_count: 100,
        mget_batch: 50,
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    run_cycle(&mut e, &mut r, 0);
    assert_eq!(comp.borrow().entries.len(), 1000);
    let scans: Vec<_> = r.log.iter().filter(|c| c[0] == b"SCAN").collect();
    assert!(scans.len() >= 2);
    assert!(scans.iter().all(|c| c[2] == b"MATCH" && c[4] == b"COUNT"));
    // The first page asks for scan_count; small replies grow the next ones.
    assert_eq!(scans[0][5], b"100");
    let counts: Vec<usize> = scans
        .iter()
        .map(|c| std::str::from_utf8(&c[5]).unwrap().parse().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[1] >= w[0]), "{counts:?}");
    let mgets: Vec<_> = r.log.iter().filter(|c| c[0] == b"MGET").collect();
    // One MGET per 50 keys of each SCAN page.
    assert!((20..=30).contains(&mgets.len()), "{}", mgets.len());
    assert!(mgets.iter().all(|c| c.len() <= 51));
    assert_eq!(mgets.iter().map(|c| c.len() - 1).sum::<usize>(), 1000);
    assert_eq!(e.stats().applied, 1000);
    assert_eq!(e.stats().keys_pulled, 1000);
}

#[test]
fn a_namespace_with_few_of_the_keyspaces_keys_scans_it_in_few_calls() {
    let comp = MapComponent::shared(NS, caps(false, false, false, false));
    let mut r = MemRedis::new();
    for i in 0..20_000 {
        r.setex(&format!("aibrix:{{other}}:e:{i}"), 600, b"not ours");
    }
    for i in 0..3 {
        r.setex(&key(&i.to_string()), 600, b"v");
    }
    let s = SyncSettings {
        scan_count: 100,
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    run_cycle(&mut e, &mut r, 0);
    assert_eq!(comp.borrow().entries.len(), 3);
    let counts: Vec<usize> = r
        .log
        .iter()
        .filter(|c| c[0] == b"SCAN")
        .map(|c| std::str::from_utf8(&c[5]).unwrap().parse().unwrap())
        .collect();
    // 100, 200, ... 12800, 16384: 20,003 keys walked in 9 calls, not 201.
    assert!(counts.len() <= 10, "{counts:?}");
    assert!(counts.iter().all(|&c| c <= super::engine::MAX_SCAN_COUNT));
}

#[test]
fn pull_runs_before_push() {
    let comp = MapComponent::shared(NS, caps(true, true, false, false));
    comp.borrow_mut().set("local", b"mine");
    let mut r = MemRedis::new();
    r.setex(&key("remote"), 600, b"theirs");
    let mut e = engine(settings(), &[&comp], 1);
    run_cycle(&mut e, &mut r, 0);
    let names = r.command_names();
    let first_write = names.iter().position(|n| n == "SETEX").unwrap();
    let last_read = names
        .iter()
        .rposition(|n| n == "SCAN" || n == "MGET")
        .unwrap();
    assert!(last_read < first_write, "{names:?}");
    assert_eq!(
        comp.borrow().events,
        vec!["start", "apply:remote", "end", "clear:1"]
    );
}

#[test]
fn failed_pull_skips_the_push() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("local", b"mine");
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut |_, _| {
        Some(Err(CallFailed::Status(503)))
    });
    assert_eq!(r.count("SETEX"), 0);
    assert_eq!(e.stats().cycles_failed, 1);
    assert_eq!(comp.borrow().dirty.len(), 1);
}

#[test]
fn clear_dirty_only_after_a_successful_push() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("a", b"1");
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut |c, r| {
        if names(&c.body).iter().any(|n| n == "SETEX") {
            Some(Err(CallFailed::Timeout))
        } else {
            Some(Ok(r.execute(&c.body)))
        }
    });
    assert_eq!(e.stats().cycles_failed, 1);
    assert!(comp
        .borrow()
        .events
        .iter()
        .all(|ev| !ev.starts_with("clear")));
    assert!(comp.borrow().dirty.contains("a"));
    run_cycle(&mut e, &mut r, now);
    assert_eq!(e.stats().cycles_ok, 1);
    assert!(comp.borrow().dirty.is_empty());
    assert_eq!(r.get(&key("a")), Some(b"1".to_vec()));
}

#[test]
fn without_delta_the_full_snapshot_is_pushed_with_size_warnings() {
    let comp = MapComponent::shared(NS, caps(false, false, false, false));
    for i in 0..3 {
        comp.borrow_mut()
            .entries
            .insert(i.to_string(), b"x".to_vec());
    }
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    let now = run_cycle(&mut e, &mut r, 0);
    assert_eq!(r.count("SETEX"), 3);
    // Unchanged entities are pushed again every cycle.
    run_cycle(&mut e, &mut r, now);
    assert_eq!(r.count("SETEX"), 6);
    assert_eq!(e.stats().large_snapshot_warnings, 0);

    let many = MapComponent::shared(NS, caps(false, false, false, false));
    for i in 0..10_001 {
        many.borrow_mut()
            .entries
            .insert(i.to_string(), b"x".to_vec());
    }
    let mut r = MemRedis::new();
    r.record = false;
    let mut e = engine(settings(), &[&many], 1);
    run_cycle(&mut e, &mut r, 0);
    assert_eq!(e.stats().large_snapshot_warnings, 1);
    assert_eq!(e.stats().pushed, 10_001);

    let big = MapComponent::shared(NS, caps(false, false, false, false));
    big.borrow_mut()
        .entries
        .insert("1".into(), vec![b'x'; 600 * 1024]);
    let mut e = engine(settings(), &[&big], 1);
    run_cycle(&mut e, &mut MemRedis::new(), 0);
    assert_eq!(e.stats().large_snapshot_warnings, 1);
}

#[test]
fn writes_are_pipelined_in_chunks() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    for i in 0..60 {
        comp.borrow_mut().set(&i.to_string(), b"v");
    }
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    let mut per_call = Vec::new();
    deliver_with(&mut e, &mut r, now, calls, &mut |c, r| {
        let n = names(&c.body);
        let setex = n.iter().filter(|x| *x == "SETEX").count();
        if setex > 0 {
            per_call.push(setex);
            assert_eq!(n.last().map(String::as_str), Some("QUIT"));
        }
        Some(Ok(r.execute(&c.body)))
    });
    per_call.sort_unstable();
    assert_eq!(per_call, vec![10, 25, 25]);
    assert_eq!(e.stats().pushed, 60);
}

#[test]
fn first_cycle_after_random_delay_below_half_period() {
    let mut delays = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let mut e = SyncEngine::new(settings(), seed);
        e.start(1_000).unwrap();
        let at = e.next_cycle_ms().unwrap();
        assert!((1_000..6_000).contains(&at), "{at}");
        delays.insert(at);
        assert!(e.tick(at.saturating_sub(1).max(1_000)).is_empty() || at == 1_000);
    }
    assert!(delays.len() > 100);
}

#[test]
fn cycles_repeat_with_jitter_never_below_half_period() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 9);
    let mut now = run_cycle(&mut e, &mut r, 0);
    let mut waits = Vec::new();
    for _ in 0..300 {
        let next = e.next_cycle_ms().unwrap();
        waits.push(next - now);
        now = run_cycle(&mut e, &mut r, now);
    }
    assert!(
        waits.iter().all(|w| (9_000..=11_000).contains(w)),
        "{waits:?}"
    );
    assert!(waits.iter().any(|w| *w != 10_000));
    assert_eq!(e.stats().cycles_ok, 301);
}

#[test]
fn failures_double_the_wait_to_sixty_seconds_then_success_resets() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    let mut waits = Vec::new();
    for _ in 0..5 {
        let now = e.next_cycle_ms().unwrap();
        let calls = e.tick(now);
        deliver_with(&mut e, &mut r, now, calls, &mut |_, _| {
            Some(Err(CallFailed::Dispatch("no cluster".into())))
        });
        waits.push(e.next_cycle_ms().unwrap() - now);
        assert_eq!(e.stats().backoff_ms, *waits.last().unwrap());
    }
    assert_eq!(waits, vec![20_000, 40_000, 60_000, 60_000, 60_000]);
    assert_eq!(e.stats().cycles_failed, 5);
    let now = run_cycle(&mut e, &mut r, 0);
    assert_eq!(e.stats().backoff_ms, 10_000);
    let wait = e.next_cycle_ms().unwrap() - now;
    assert!((9_000..=11_000).contains(&wait));
    assert_eq!(e.stats().last_success_ms, Some(now));
}

#[test]
fn retry_now_after_a_failure_starts_the_cycle_without_waiting_the_backoff() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    // Healthy: retry_now changes nothing.
    let now = run_cycle(&mut e, &mut r, 0);
    let next = e.next_cycle_ms().unwrap();
    e.retry_now(now + 1);
    assert_eq!(e.next_cycle_ms(), Some(next));
    assert!(!e.failing());
    // A failed cycle backs off 20 s; Redis answering again cuts that short.
    let calls = e.tick(next);
    deliver_with(&mut e, &mut r, next, calls, &mut |_, _| {
        Some(Err(CallFailed::Status(503)))
    });
    assert!(e.failing());
    assert_eq!(e.next_cycle_ms(), Some(next + 20_000));
    e.retry_now(next + 2_000);
    assert!(!e.tick(next + 2_000).is_empty(), "no cycle started at once");
}

#[test]
fn op_timeout_abandons_the_cycle_and_ignores_late_replies() {
    let comp = MapComponent::shared(NS, caps(true, true, false, false));
    let mut r = MemRedis::new();
    r.setex(&key("x"), 600, b"v");
    let mut e = engine(settings(), &[&comp], 1);
    let start = e.next_cycle_ms().unwrap();
    let calls = e.tick(start);
    let held = deliver_with(&mut e, &mut r, start, calls, &mut |_, _| None);
    assert_eq!(held.len(), 1);
    assert!(e.tick(start + 29_999).is_empty());
    assert!(e.cycle_in_progress());
    e.tick(start + 30_000);
    assert!(!e.cycle_in_progress());
    assert_eq!(e.stats().cycles_failed, 1);
    assert_eq!(e.stats().cycles_timed_out, 1);
    assert_eq!(comp.borrow().events, vec!["start", "end"]);
    // The late SCAN reply must not resurrect the cycle.
    let reply = r.execute(&held[0].body);
    assert!(e
        .on_response(held[0].id, start + 31_000, Ok(&reply))
        .is_empty());
    assert_eq!(e.stats().late_responses, 1);
    assert_eq!(e.stats().applied, 0);
    assert_eq!(e.next_cycle_ms(), Some(start + 30_000 + 20_000));
}

#[test]
fn registration_after_start_is_ignored() {
    let mut e = SyncEngine::new(settings(), 1);
    e.register(Box::new(MapComponent::new("a", Capabilities::default())))
        .unwrap();
    e.start(0).unwrap();
    let late = e.register(Box::new(MapComponent::new("b", Capabilities::default())));
    assert_eq!(late, Err(SyncError::AlreadyStarted));
    assert_eq!(e.namespaces(), vec!["a"]);
}

#[test]
fn empty_invalid_and_duplicate_namespaces_are_refused() {
    let mut e = SyncEngine::new(settings(), 1);
    let none = Capabilities::default();
    assert_eq!(
        e.register(Box::new(MapComponent::new("", none))),
        Err(SyncError::EmptyNamespace)
    );
    assert!(matches!(
        e.register(Box::new(MapComponent::new("a{b}", none))),
        Err(SyncError::InvalidNamespace(_))
    ));
    e.register(Box::new(MapComponent::new("a", none))).unwrap();
    assert!(matches!(
        e.register(Box::new(MapComponent::new("a", none))),
        Err(SyncError::DuplicateNamespace(_))
    ));
    assert_eq!(e.namespaces(), vec!["a"]);
}

#[test]
fn disabled_engine_does_not_start() {
    let mut e = SyncEngine::new(SyncSettings::default(), 1);
    assert_eq!(e.start(0), Err(SyncError::Disabled));
    assert!(e.tick(1_000_000).is_empty());
}

#[test]
fn deletions_travel_as_tombstones() {
    let tomb = caps(true, false, false, true);
    let a = MapComponent::shared(NS, tomb);
    let b = MapComponent::shared(NS, tomb);
    a.borrow_mut().set("gone", b"v");
    let mut r = MemRedis::new();
    let mut ea = engine(settings(), &[&a], 1);
    let mut eb = engine(settings(), &[&b], 2);
    let mut now = run_cycle(&mut ea, &mut r, 0);
    now = run_cycle(&mut eb, &mut r, now);
    assert!(b.borrow().entries.contains_key("gone"));
    a.borrow_mut().remove("gone");
    now = run_cycle(&mut ea, &mut r, now);
    r.set_now(now);
    assert_eq!(r.get(&key("gone")), Some(TOMBSTONE.to_vec()));
    assert_eq!(r.ttl_ms(&key("gone")), Some(120_000));
    assert_eq!(r.count("DEL"), 0);
    run_cycle(&mut eb, &mut r, now);
    assert!(!b.borrow().entries.contains_key("gone"));
    assert!(b.borrow().events.contains(&"delete:gone".to_string()));
    assert_eq!(eb.stats().tombstones_applied, 1);

    // Without the capability a deletion is a plain DEL.
    let c = MapComponent::shared(NS, caps(true, false, false, false));
    c.borrow_mut().remove("old");
    let mut ec = engine(settings(), &[&c], 3);
    run_cycle(&mut ec, &mut r, now);
    assert_eq!(r.count("DEL"), 1);
}

#[test]
fn stale_values_are_deleted_and_not_applied() {
    let comp = MapComponent::shared(NS, caps(false, false, true, false));
    comp.borrow_mut().stale_prefix = Some(b"OLD".to_vec());
    let mut r = MemRedis::new();
    r.setex(&key("old"), 600, b"OLD payload");
    r.setex(&key("new"), 600, b"fresh");
    let mut e = engine(settings(), &[&comp], 1);
    run_cycle(&mut e, &mut r, 0);
    assert_eq!(r.get(&key("old")), None);
    assert_eq!(r.get(&key("new")), Some(b"fresh".to_vec()));
    assert!(!comp.borrow().events.contains(&"apply:old".to_string()));
    assert_eq!(e.stats().stale_deleted, 1);
    assert_eq!(e.stats().applied, 1);
}

#[test]
fn rejected_and_missing_values_are_counted_and_skipped() {
    let comp = MapComponent::shared(NS, caps(false, false, false, false));
    comp.borrow_mut().reject_prefix = Some(b"BAD".to_vec());
    let mut r = MemRedis::new();
    r.setex(&key("bad"), 600, b"BAD");
    r.setex(&key("good"), 600, b"ok");
    r.setex(&key("vanishing"), 600, b"soon gone");
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut |c, r| {
        if names(&c.body).iter().any(|n| n == "MGET") {
            // Expires between SCAN and MGET.
            r.remove(&key("vanishing"));
        }
        Some(Ok(r.execute(&c.body)))
    });
    let st = e.stats();
    assert_eq!((st.applied, st.rejected, st.missing_values), (1, 1, 1));
    assert_eq!(st.cycles_ok, 1);
}

#[test]
fn hooks_wrap_only_the_pull() {
    let comp = MapComponent::shared(NS, caps(true, true, false, false));
    let mut r = MemRedis::new();
    let mut e = engine(
        SyncSettings {
            write_through: true,
            ..settings()
        },
        &[&comp],
        1,
    );
    comp.borrow_mut().set("1", b"a");
    let now = run_cycle(&mut e, &mut r, 0);
    e.put(NS, "2", b"b".to_vec()).unwrap();
    drive(&mut e, &mut r, now);
    comp.borrow_mut().set("3", b"c");
    run_cycle(&mut e, &mut r, now);
    // Each cycle: start/end around the pull, the push (clear) after "end";
    // write-through calls no hook, only clears what it wrote.
    // (The second pull reads the change log from its start, which the
    // first push created: it holds only our own writes, so nothing applies.)
    assert_eq!(
        comp.borrow().events,
        vec!["start", "end", "clear:1", "clear:1", "start", "end", "clear:1"]
    );
}

#[test]
fn write_through_put_and_delete_are_sent_on_the_next_tick() {
    let comp = MapComponent::shared(NS, caps(true, false, false, true));
    let plain = MapComponent::shared("podload", caps(false, false, false, false));
    let mut r = MemRedis::new();
    let mut e = engine(
        SyncSettings {
            write_through: true,
            ..settings()
        },
        &[&comp, &plain],
        1,
    );
    e.put(NS, "7", b"seven".to_vec()).unwrap();
    e.delete(NS, "8").unwrap();
    e.delete("podload", "p").unwrap();
    // Long before the first cycle is due.
    drive(&mut e, &mut r, 1);
    assert!(!e.cycle_in_progress());
    assert_eq!(r.get(&key("7")), Some(b"seven".to_vec()));
    assert_eq!(r.ttl_ms(&key("7")), Some(120_000));
    assert_eq!(r.get(&key("8")), Some(TOMBSTONE.to_vec()));
    assert!(r
        .log
        .iter()
        .any(|c| c[0] == b"DEL" && c[1] == b"aibrix:{podload}:e:p"));
    assert_eq!(e.stats().write_through_calls, 2);
    assert_eq!(
        e.put("nope", "1", Vec::new()),
        Err(SyncError::UnknownNamespace("nope".into()))
    );

    let mut off = engine(settings(), &[], 1);
    assert_eq!(
        off.put(NS, "1", Vec::new()),
        Err(SyncError::WriteThroughOff)
    );
}

#[test]
fn successful_write_through_clears_dirty_and_failed_keeps_it() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    let mut e = engine(
        SyncSettings {
            write_through: true,
            ..settings()
        },
        &[&comp],
        1,
    );
    comp.borrow_mut().set("7", b"seven");
    e.put(NS, "7", b"seven".to_vec()).unwrap();
    drive(&mut e, &mut r, 1);
    assert!(
        !comp.borrow().dirty.contains("7"),
        "written: no second push"
    );

    comp.borrow_mut().set("8", b"eight");
    e.put(NS, "8", b"eight".to_vec()).unwrap();
    r.truncate_at = Some(3);
    drive(&mut e, &mut r, 2);
    assert!(
        comp.borrow().dirty.contains("8"),
        "failed: the periodic push covers it"
    );
    assert!(e.stats().write_through_failed >= 1);
}

#[test]
fn truncated_mget_is_split_never_partially_applied_and_remembered() {
    let comp = MapComponent::shared(NS, caps(false, false, false, false));
    let mut r = MemRedis::new();
    for i in 0..200 {
        r.setex(&key(&format!("{i:03}")), 600, &[b'v'; 1000]);
    }
    // Every cycle scans, so the second one pulls the same values again.
    let s = SyncSettings {
        full_scan_every: 1,
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    let mut truncated_calls = 0;
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut |c, r| {
        let mut reply = r.execute(&c.body);
        // The bridge's cut: Redis output beyond ~64 KiB is lost.
        if reply.len() > 64 * 1024 {
            reply.truncate(64 * 1024);
            truncated_calls += 1;
        }
        Some(Ok(reply))
    });
    assert!(truncated_calls >= 1);
    assert_eq!(e.stats().truncations, truncated_calls);
    assert_eq!(e.stats().cycles_ok, 1);
    let applies = comp
        .borrow()
        .events
        .iter()
        .filter(|ev| ev.starts_with("apply:"))
        .count();
    let unique = comp.borrow().entries.len();
    assert_eq!(
        (applies, unique),
        (200, 200),
        "each value applied exactly once"
    );
    // Remembered: the next cycle needs no split.
    run_cycle(&mut e, &mut r, now);
    assert_eq!(e.stats().truncations, truncated_calls);
    assert!(r.log.iter().rev().find(|c| c[0] == b"MGET").unwrap().len() <= 1 + 48);
}

/// The bridge's cut: Redis output beyond ~64 KiB is lost.
fn bridge_cut(c: &Call, r: &mut MemRedis) -> Option<Result<Vec<u8>, CallFailed>> {
    let mut reply = r.execute(&c.body);
    reply.truncate(64 * 1024);
    Some(Ok(reply))
}

#[test]
fn oversized_values_are_skipped_by_later_scans_without_shrinking_the_batch() {
    // A hostile writer's values, each larger than a reply may be, among 200
    // ordinary ones: the first scan splits its way down to each of them;
    // the next scans skip them instead of splitting again, and keep
    // fetching the ordinary values in full batches.
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    for i in 0..200 {
        r.setex(&key(&format!("{i:03}")), 600, &[b'v'; 100]);
    }
    for i in 0..3 {
        r.setex(&key(&format!("big{i}")), 600, &[b'x'; 70 * 1024]);
    }
    let s = SyncSettings {
        full_scan_every: 1,
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut bridge_cut);
    assert_eq!(e.stats().cycles_ok, 1);
    assert_eq!(e.stats().oversized_values, 3);
    let first = e.stats().clone();
    assert!(first.truncations >= 3);
    assert_eq!(comp.borrow().entries.len(), 200);

    for _ in 0..3 {
        let calls_before = e.stats().calls_sent;
        let now = e.next_cycle_ms().unwrap();
        let calls = e.tick(now);
        deliver_with(&mut e, &mut r, now, calls, &mut bridge_cut);
        // One SCAN page and one MGET of the 200 (nothing to push).
        assert!(
            e.stats().calls_sent - calls_before <= 2,
            "{} calls: {:?}",
            e.stats().calls_sent - calls_before,
            e.stats()
        );
    }
    assert_eq!(e.stats().cycles_ok, 4);
    assert_eq!(e.stats().truncations, first.truncations, "no new splits");
    assert_eq!(e.stats().oversized_values, 3);
    assert_eq!(e.stats().oversized_skipped, 9);
}

#[test]
fn a_value_over_the_reply_budget_that_arrives_whole_is_skipped_too() {
    // Whether the bridge cuts a large reply depends on Redis's timing; a
    // value over the budget is refused either way, and it does not shrink
    // the batches of the ordinary values.
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    for i in 0..200 {
        r.setex(&key(&format!("{i:03}")), 600, &[b'v'; 100]);
    }
    r.setex(&key("big"), 600, &[b'x'; 1024 * 1024]);
    let s = SyncSettings {
        full_scan_every: 1,
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    let now = run_cycle(&mut e, &mut r, 0);
    assert_eq!(e.stats().oversized_values, 1);
    assert_eq!(
        comp.borrow().entries.len(),
        200,
        "the large value is not applied"
    );
    let (calls, bytes) = (e.stats().calls_sent, e.stats().bytes_received);
    run_cycle(&mut e, &mut r, now);
    assert_eq!(e.stats().oversized_skipped, 1);
    assert!(e.stats().calls_sent - calls <= 2, "{:?}", e.stats());
    assert!(
        e.stats().bytes_received - bytes < 64 * 1024,
        "{:?}",
        e.stats()
    );
}

#[test]
fn a_log_entry_naming_a_value_found_oversized_is_read() {
    // Full scans skip a value found too large; the change log does not: an
    // entry there is a rewrite.
    let s = SyncSettings {
        poll_ms: 0,
        ..settings()
    };
    let (a, b, mut ea, mut eb, mut r, now) = warmed_pair(s, 1);
    r.setex(&key("big"), 600, &[b'x'; 70 * 1024]);
    // B's full scan finds it too large.
    let mut now = now;
    while eb.stats().oversized_values == 0 {
        now = eb.next_cycle_ms().unwrap().max(now);
        let calls = eb.tick(now);
        deliver_with(&mut eb, &mut r, now, calls, &mut bridge_cut);
        assert!(eb.stats().cycles_ok < 20, "no full scan found it");
    }
    // A rewrites it, small, through the log.
    a.borrow_mut().set("big", b"small now");
    now = run_cycle(&mut ea, &mut r, now);
    now = eb.next_cycle_ms().unwrap().max(now);
    let calls = eb.tick(now);
    deliver_with(&mut eb, &mut r, now, calls, &mut bridge_cut);
    assert_eq!(b.borrow().entries.get("big"), Some(&b"small now".to_vec()));
}

#[test]
fn an_empty_reply_fails_the_call_without_splitting_or_blaming_values() {
    // What a middlebox that closes instead of passing the half-close on
    // gives: 200 and no bytes. It is not a size problem.
    let comp = MapComponent::shared(NS, caps(false, false, false, false));
    let mut r = MemRedis::new();
    for i in 0..50 {
        r.setex(&key(&format!("{i:03}")), 600, b"v");
    }
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut |_, _| Some(Ok(Vec::new())));
    let st = e.stats();
    assert_eq!(
        (st.cycles_failed, st.empty_replies, st.calls_failed),
        (1, 1, 1)
    );
    assert_eq!((st.truncations, st.oversized_values), (0, 0));
    // Healthy again: the next cycle works.
    let now = run_cycle(&mut e, &mut r, now);
    let _ = now;
    assert_eq!(e.stats().cycles_ok, 1);
    assert_eq!(comp.borrow().entries.len(), 50);
}

#[test]
fn truncated_scan_is_retried_with_a_smaller_count() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut r = MemRedis::new();
    r.record = false;
    for i in 0..3000 {
        r.setex(&key(&format!("{i:04}")), 600, b"v");
    }
    // Only this many keys fit the budget: SCAN COUNT starts at 1200.
    let s = SyncSettings {
        scan_count: 5000,
        max_reply_bytes: 60 * 1024,
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    let cut = |c: &Call, r: &mut MemRedis| {
        let mut reply = r.execute(&c.body);
        reply.truncate(16 * 1024);
        Some(Ok(reply))
    };
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut { cut });
    assert_eq!(e.stats().cycles_ok, 1);
    assert!(e.stats().truncations >= 2);
    let applies = comp
        .borrow()
        .events
        .iter()
        .filter(|ev| ev.starts_with("apply:"))
        .count();
    assert_eq!((applies, comp.borrow().entries.len()), (3000, 3000));
}

#[test]
fn truncated_replies_fail_writes_and_unsplittable_reads() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("a", b"1");
    let mut r = MemRedis::new();
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    deliver_with(&mut e, &mut r, now, calls, &mut |c, r| {
        let mut reply = r.execute(&c.body);
        if names(&c.body).iter().any(|n| n == "SETEX") {
            reply.truncate(reply.len() - 1);
        }
        Some(Ok(reply))
    });
    assert_eq!(e.stats().cycles_failed, 1);
    assert_eq!(e.stats().truncations, 1);
    assert!(comp.borrow().dirty.contains("a"));
}

#[test]
fn auth_comes_first_in_every_call_when_configured() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("a", b"1");
    let mut r = MemRedis::new();
    r.require_password("s3cret");
    r.setex(&key("b"), 600, b"2");
    let s = SyncSettings {
        auth_password: Some("s3cret".into()),
        ..settings()
    };
    let mut e = engine(s, &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    let mut bodies = 0;
    deliver_with(&mut e, &mut r, now, calls, &mut |c, r| {
        let cmds = commands(&c.body);
        assert_eq!(cmds[0], vec![b"AUTH".to_vec(), b"s3cret".to_vec()]);
        bodies += 1;
        Some(Ok(r.execute(&c.body)))
    });
    assert!(bodies >= 3);
    assert_eq!(e.stats().cycles_ok, 1);
    assert_eq!(r.get(&key("a")), Some(b"1".to_vec()));
    assert!(comp.borrow().entries.contains_key("b"));

    let wrong = SyncSettings {
        auth_password: Some("nope".into()),
        ..settings()
    };
    let mut e = engine(wrong, &[&comp], 1);
    run_cycle(&mut e, &mut r, 0);
    assert_eq!(e.stats().cycles_failed, 1);
}

/// Two replicas A (writer) and B (reader) after their first, full cycles.
fn warmed_pair(s: SyncSettings, n: usize) -> (Comp, Comp, SyncEngine, SyncEngine, MemRedis, u64) {
    let d = caps(true, false, false, false);
    let a = MapComponent::shared(NS, d);
    let b = MapComponent::shared(NS, d);
    for i in 0..n {
        a.borrow_mut().set(&i.to_string(), b"v0");
    }
    let mut ea = engine(s.clone(), &[&a], 1);
    let mut eb = engine(s, &[&b], 2);
    let mut r = MemRedis::new();
    let mut now = run_cycle(&mut ea, &mut r, 0);
    now = run_cycle(&mut eb, &mut r, now);
    // A learns its log position on its next (incremental-capable) cycle.
    now = run_cycle(&mut ea, &mut r, now);
    assert_eq!(b.borrow().entries.len(), n);
    (a, b, ea, eb, r, now)
}

#[test]
fn incremental_pull_reads_only_changed_keys() {
    let (a, b, mut ea, mut eb, mut r, mut now) = warmed_pair(settings(), 100);
    for id in ["3", "50", "99"] {
        a.borrow_mut().set(id, b"v1");
    }
    now = run_cycle(&mut ea, &mut r, now);
    r.log.clear();
    run_cycle(&mut eb, &mut r, now);
    assert_eq!(r.count("SCAN"), 0);
    assert_eq!(r.count("XRANGE"), 1);
    let fetched: usize = r
        .log
        .iter()
        .filter(|c| c[0] == b"MGET")
        .map(|c| c.len() - 1)
        .sum();
    assert_eq!(fetched, 3);
    assert_eq!(b.borrow().entries.get("50"), Some(&b"v1".to_vec()));
    assert_eq!(eb.stats().incremental_pulls, 1);
    assert_eq!(eb.stats().full_scans, 1);
}

#[test]
fn truncated_log_read_is_retried_with_a_smaller_count() {
    let s = SyncSettings {
        setex_chunk: 10,
        ..settings()
    };
    let (a, b, mut ea, mut eb, mut r, mut now) = warmed_pair(s, 500);
    for i in 0..500 {
        a.borrow_mut().set(&i.to_string(), b"v1");
    }
    now = run_cycle(&mut ea, &mut r, now);
    let due = eb.next_cycle_ms().unwrap().max(now);
    let calls = eb.tick(due);
    deliver_with(&mut eb, &mut r, due, calls, &mut |c, r| {
        let mut reply = r.execute(&c.body);
        if names(&c.body).iter().any(|n| n == "XRANGE") {
            reply.truncate(2048);
        }
        Some(Ok(reply))
    });
    assert_eq!(eb.stats().cycles_ok, 2);
    assert!(eb.stats().truncations >= 2);
    assert_eq!(eb.stats().log_fallbacks, 0);
    assert!(b.borrow().entries.values().all(|v| v == b"v1"));
}

#[test]
fn own_log_entries_are_skipped() {
    let (a, _b, mut ea, _eb, mut r, mut now) = warmed_pair(settings(), 10);
    a.borrow_mut().set("1", b"v1");
    now = run_cycle(&mut ea, &mut r, now);
    r.log.clear();
    run_cycle(&mut ea, &mut r, now);
    assert_eq!(r.count("XRANGE"), 1);
    assert_eq!(r.count("MGET"), 0);
}

#[test]
fn trimmed_or_missing_log_falls_back_to_full_scan() {
    let s = SyncSettings {
        setex_chunk: 2,
        ..settings()
    };
    let (a, b, mut ea, mut eb, mut r, mut now) = warmed_pair(s, 20);
    for i in 0..20 {
        a.borrow_mut().set(&i.to_string(), b"v1");
    }
    now = run_cycle(&mut ea, &mut r, now);
    // MAXLEN trimmed the log past B's position.
    r.trim_stream(&format!("aibrix:{{{NS}}}:log"), 3);
    r.log.clear();
    now = run_cycle(&mut eb, &mut r, now);
    assert_eq!(eb.stats().log_fallbacks, 1);
    assert!(r.count("SCAN") >= 1);
    assert!(b.borrow().entries.values().all(|v| v == b"v1"));
    // The log key vanished altogether: same fallback.
    r.remove(&format!("aibrix:{{{NS}}}:log"));
    a.borrow_mut().set("1", b"v2");
    r.setex(&key("1"), 600, b"v2");
    run_cycle(&mut eb, &mut r, now);
    assert!(eb.stats().log_fallbacks >= 2 || eb.stats().full_scans >= 3);
    assert_eq!(b.borrow().entries.get("1"), Some(&b"v2".to_vec()));
}

#[test]
fn a_fresh_redis_is_polled_from_the_first_cycle() {
    // A reader and a writer start on an empty Redis: after the reader's
    // first cycle (a full scan finding no log), its polls read the log the
    // writer creates from its start, without waiting for a later cycle.
    let s = SyncSettings {
        poll_ms: 100,
        ..settings()
    };
    let reader = MapComponent::shared(NS, caps(true, false, false, false));
    let writer = MapComponent::shared(NS, caps(true, false, false, false));
    let mut eb = engine(s.clone(), &[&reader], 2);
    let mut ea = engine(s, &[&writer], 1);
    let mut r = MemRedis::new();
    let now = run_cycle(&mut eb, &mut r, 0);
    assert_eq!(eb.stats().full_scans, 1);
    writer.borrow_mut().set("new", b"v");
    let now = run_cycle(&mut ea, &mut r, now);
    // The reader's next poll, before its next cycle.
    let calls = eb.tick(eb.next_poll_ms().unwrap_or(now).max(now));
    deliver_with(&mut eb, &mut r, now, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
    assert_eq!(reader.borrow().entries.get("new"), Some(&b"v".to_vec()));
    assert_eq!(eb.stats().full_scans, 1, "no second scan needed");
    assert_eq!(eb.stats().cycles_ok, 1, "a poll, not a cycle, read it");
}

#[test]
fn rotating_scan_reads_a_slice_per_cycle_and_catches_log_less_writers_within_a_pass() {
    // 1,000 keys, a budget of 100 keys a cycle: after the first full scan,
    // each cycle reads the change log plus the next ~100 keys of one SCAN
    // pass; a key written without the log is found within one pass.
    let s = SyncSettings {
        scan_keys_per_cycle: 100,
        ..settings()
    };
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    let mut e = engine(s, &[&comp], 1);
    let mut r = MemRedis::new();
    for i in 0..1000 {
        r.setex(&key(&format!("k{i:04}")), 600, b"v");
    }
    let mut now = run_cycle(&mut e, &mut r, 0);
    assert_eq!(comp.borrow().entries.len(), 1000);
    // Key "zz" sorts last in the double's keyspace: the pass reaches it at
    // its end.
    r.setex(&key("zz-from-go"), 600, b"go");
    let mut cycles = 0;
    while !comp.borrow().entries.contains_key("zz-from-go") {
        let scanned = e.stats().keys_scanned;
        now = run_cycle(&mut e, &mut r, now);
        cycles += 1;
        // One slice: its pages stop once they asked for 100 keys (the first
        // page may be smaller: the double counts keys, not slots).
        assert!(
            e.stats().keys_scanned - scanned <= 100,
            "cycle {cycles}: {} keys scanned",
            e.stats().keys_scanned - scanned
        );
        assert!(cycles <= 11, "not found within one pass: {:?}", e.stats());
    }
    assert!(cycles >= 9, "found after {cycles} cycles: slices too large");
    let st = e.stats();
    assert_eq!(st.full_scans, 1, "no periodic full scans");
    assert_eq!(st.scan_slices, cycles);
    assert_eq!(st.scan_passes, 1);
}

#[test]
fn full_scan_runs_every_nth_cycle_and_catches_log_less_writers() {
    let s = SyncSettings {
        full_scan_every: 3,
        ..settings()
    };
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("mine", b"x");
    let mut e = engine(s, &[&comp], 1);
    let mut r = MemRedis::new();
    let mut now = 0;
    let mut full = Vec::new();
    for cycle in 0..7 {
        if cycle == 4 {
            // An AIBrix Go gateway writes no change log.
            r.setex(&key("from-go"), 600, b"go");
        }
        let before = r.count("SCAN");
        now = run_cycle(&mut e, &mut r, now);
        full.push(r.count("SCAN") > before);
        // Incremental pulls cannot see it; the next full scan does.
        let seen = comp.borrow().entries.contains_key("from-go");
        assert_eq!(seen, cycle >= 6, "cycle {cycle}");
    }
    // Cycle 1 is incremental: the fresh Redis had no log at cycle 0's scan,
    // so it reads the log the first push created from its start.
    assert_eq!(full, vec![true, false, false, true, false, false, true]);

    // 0/1 = AIBrix mode: every cycle scans, no stream commands at all.
    let s = SyncSettings {
        full_scan_every: 1,
        ..settings()
    };
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("a", b"1");
    let mut e = engine(s, &[&comp], 1);
    let mut r = MemRedis::new();
    let mut now = 0;
    for _ in 0..3 {
        now = run_cycle(&mut e, &mut r, now);
    }
    assert_eq!(r.count("SCAN"), 3);
    let stream_cmds =
        r.count("XADD") + r.count("XRANGE") + r.count("XREVRANGE") + r.count("EXPIRE");
    assert_eq!(stream_cmds, 0);
}

#[test]
fn two_replicas_converge_through_redis() {
    let d = caps(true, true, false, true);
    let a = MapComponent::shared(NS, d);
    let b = MapComponent::shared(NS, d);
    let mut ea = engine(settings(), &[&a], 11);
    let mut eb = engine(settings(), &[&b], 22);
    let mut r = MemRedis::new();
    let mut now = 0;
    for round in 0..8 {
        for i in 0..10 {
            a.borrow_mut()
                .set(&format!("a{round}-{i}"), format!("A{round}").as_bytes());
            b.borrow_mut()
                .set(&format!("b{round}-{i}"), format!("B{round}").as_bytes());
        }
        if round == 3 {
            a.borrow_mut().remove("b0-0");
        }
        // Whichever replica is due runs first.
        if ea.next_cycle_ms() <= eb.next_cycle_ms() {
            now = run_cycle(&mut ea, &mut r, now);
            now = run_cycle(&mut eb, &mut r, now);
        } else {
            now = run_cycle(&mut eb, &mut r, now);
            now = run_cycle(&mut ea, &mut r, now);
        }
    }
    for _ in 0..2 {
        now = run_cycle(&mut ea, &mut r, now);
        now = run_cycle(&mut eb, &mut r, now);
    }
    assert_eq!(a.borrow().entries, b.borrow().entries);
    assert_eq!(a.borrow().entries.len(), 159);
    assert!(!b.borrow().entries.contains_key("b0-0"));
    assert!(ea.stats().incremental_pulls > 0 && eb.stats().incremental_pulls > 0);
}

#[test]
fn stop_ends_cleanly() {
    let comp = MapComponent::shared(NS, caps(true, true, false, false));
    let mut e = engine(settings(), &[&comp], 1);
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    assert_eq!(calls.len(), 1);
    e.stop();
    assert_eq!(comp.borrow().events, vec!["start", "end"]);
    assert!(e.on_response(calls[0].id, now, Ok(b"+OK\r\n")).is_empty());
    assert!(e.tick(now + 1_000_000).is_empty());
    assert_eq!(e.pending_calls(), 0);
    assert_eq!(e.next_cycle_ms(), None);
}

#[test]
fn stats_count_calls_commands_bytes_and_rtt() {
    let comp = MapComponent::shared(NS, caps(true, false, false, false));
    comp.borrow_mut().set("a", b"1");
    let mut e = engine(settings(), &[&comp], 1);
    let mut r = MemRedis::new();
    let now = e.next_cycle_ms().unwrap();
    let calls = e.tick(now);
    let id = calls[0].id;
    let reply = r.execute(&calls[0].body);
    let more = e.on_response(id, now + 3, Ok(&reply));
    deliver_with(&mut e, &mut r, now + 5, more, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
    let st = e.stats().clone();
    assert_eq!(st.cycles_ok, 1);
    assert_eq!(st.calls_sent, 2);
    assert_eq!(st.commands_sent, r.commands_executed);
    assert!(st.bytes_sent > 0 && st.bytes_received > 0);
    assert_eq!(e.drain_rtt_samples(), vec![3, 2]);
    assert!(e.drain_rtt_samples().is_empty());
}

#[test]
fn incremental_pull_costs_far_less_than_full_scan_at_one_percent_churn() {
    // Per reader period (10 s), 5000 entities, 1 % churn, default polls (175 ms).
    let incremental = steady_state_cost(5_000, 10, 6, 6);
    let full = steady_state_cost(5_000, 10, 1, 6);
    let no_polls = steady_state_cost_with(&CostModel {
        entities: 5_000,
        churn_per_mille: 10,
        full_scan_every: 6,
        cycles: 6,
        poll_ms: 0,
        ..Default::default()
    });
    let changes = incremental.beyond_idle_polls();
    eprintln!(
        "per period, 5000 entities, 1% churn:\n  incremental with polls {incremental:?}\n  \
         of which beyond the idle-poll floor {changes:?}\n  incremental without polls \
         {no_polls:?}\n  full scan {full:?}"
    );
    // AIBrix mode never polls; without polls nothing polls either.
    assert_eq!((full.polls, no_polls.polls), (0.0, 0.0));
    // The idle-poll floor: ~period/poll_ms polls, each one call with one
    // XRANGE (one polled namespace) and QUIT.
    assert!((50.0..=65.0).contains(&incremental.idle_polls));
    assert_eq!(incremental.idle_poll_commands, 2.0 * incremental.idle_polls);
    // Beyond that floor, polls only move the change-driven work (log pages,
    // MGETs of changed ids) from the cycle to the poll: about the same as
    // without polls, and still far below a full scan.
    assert!(changes.commands <= no_polls.commands * 1.25 + 2.0);
    assert!(changes.commands * 3.0 < full.commands);
    assert!(changes.bytes_received * 3.0 < full.bytes_received);
    // In bytes the floor is small: the total stays far below a full scan.
    let bytes = |c: &super::testkit::CycleCost| c.bytes_sent + c.bytes_received;
    assert!(bytes(&incremental) * 3.0 < bytes(&full));
    // (In commands it is not: at this small size and a 10 s period, ~100
    // idle polls cost more commands than one full scan; see the report.)
}

// ---- polls and their pushes ----

/// [`warmed_pair`], then B's cycle again: B's next cycle is about a period
/// away, both replicas know their log positions and may poll.
fn polling_pair(s: SyncSettings, n: usize) -> (Comp, Comp, SyncEngine, SyncEngine, MemRedis, u64) {
    let (a, b, ea, mut eb, mut r, now) = warmed_pair(s, n);
    let now = run_cycle(&mut eb, &mut r, now);
    assert!(eb.next_poll_ms().is_some());
    (a, b, ea, eb, r, now)
}

/// Polls applied by `e` so far.
fn polls(e: &SyncEngine) -> u64 {
    e.stats().polls_ok
}

/// Commands (names) of every call a tick emits, answered by `r`.
fn tick_names(e: &mut SyncEngine, r: &mut MemRedis, now: u64) -> Vec<String> {
    let calls = e.tick(now);
    let mut seen = Vec::new();
    deliver_with(e, r, now, calls, &mut |c, r| {
        seen.extend(names(&c.body));
        Some(Ok(r.execute(&c.body)))
    });
    seen
}

#[test]
fn poll_sees_a_peer_change_within_poll_ms() {
    let s = SyncSettings {
        write_through: true,
        ..settings()
    };
    let poll = s.poll_ms;
    let (a, b, mut ea, mut eb, mut r, now) = polling_pair(s, 10);
    let cycles = eb.stats().cycles_ok;

    // Write-through on A: written on A's next tick...
    a.borrow_mut().set("wt", b"1");
    ea.put(NS, "wt", b"1".to_vec()).unwrap();
    let pushed = now + 1;
    drive(&mut ea, &mut r, pushed);
    assert_eq!(r.get(&key("wt")), Some(b"1".to_vec()));
    // ...and applied by B's next poll, within one poll interval, no cycle.
    let seen = pushed + poll;
    assert!(seen < eb.next_cycle_ms().unwrap());
    drive(&mut eb, &mut r, seen);
    assert_eq!(b.borrow().entries.get("wt"), Some(&b"1".to_vec()));
    assert_eq!(eb.stats().cycles_ok, cycles, "no B cycle in between");
    assert_eq!((polls(&eb), eb.stats().poll_applied), (1, 1));

    // Without write-through: A's next push (a poll's or a cycle's) writes
    // it, B's next poll applies it.
    a.borrow_mut().set("periodic", b"2");
    let (mut t, mut pushed) = (seen, None);
    loop {
        t += TICK_MS;
        drive(&mut ea, &mut r, t);
        if pushed.is_none() && r.get(&key("periodic")).is_some() {
            pushed = Some((t, eb.stats().cycles_ok));
        }
        drive(&mut eb, &mut r, t);
        if b.borrow().entries.contains_key("periodic") {
            break;
        }
        assert!(t < seen + 20_000);
    }
    let (pushed_at, cycles) = pushed.unwrap();
    assert!(t - pushed_at <= poll, "pushed {pushed_at}, seen {t}");
    assert_eq!(eb.stats().cycles_ok, cycles, "seen by a poll, not a cycle");
    assert_eq!(eb.stats().poll_applied, 2);
}

#[test]
fn polls_skip_namespaces_with_hooks() {
    // Two plain delta namespaces and one with hooks (like the load tracker).
    let plain = caps(true, false, false, false);
    let hooked = caps(true, true, false, false);
    let mk = || {
        (
            MapComponent::shared(NS, plain),
            MapComponent::shared("second", plain),
            MapComponent::shared("podload", hooked),
        )
    };
    let (a1, a2, a3) = mk();
    let (b1, b2, b3) = mk();
    let mut ea = engine(settings(), &[&a1, &a2, &a3], 1);
    let mut eb = engine(settings(), &[&b1, &b2, &b3], 2);
    let mut r = MemRedis::new();
    for c in [&a1, &a2, &a3] {
        c.borrow_mut().set("warm", b"0");
    }
    let mut now = run_cycle(&mut ea, &mut r, 0);
    now = run_cycle(&mut eb, &mut r, now);
    now = run_cycle(&mut ea, &mut r, now);
    for c in [&a1, &a2, &a3] {
        c.borrow_mut().set("x", b"1");
    }
    now = run_cycle(&mut ea, &mut r, now);
    now = run_cycle(&mut eb, &mut r, now);
    for c in [&a1, &a2, &a3] {
        c.borrow_mut().set("x", b"2");
    }
    now = run_cycle(&mut ea, &mut r, now);
    b3.borrow_mut().events.clear();

    let at = eb.next_poll_ms().unwrap().max(now);
    assert!(at < eb.next_cycle_ms().unwrap());
    let calls = eb.tick(at);
    assert_eq!(calls.len(), 1, "one call reads every polled namespace");
    let cmds = commands(&calls[0].body);
    let logs: Vec<&[u8]> = cmds
        .iter()
        .filter(|c| c[0] == b"XRANGE")
        .map(|c| c[1].as_slice())
        .collect();
    assert_eq!(
        logs,
        vec![
            b"aibrix:{prefixcache}:log".as_slice(),
            b"aibrix:{second}:log".as_slice()
        ]
    );
    deliver_with(&mut eb, &mut r, at, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
    assert_eq!(b1.borrow().entries.get("x"), Some(&b"2".to_vec()));
    assert_eq!(b2.borrow().entries.get("x"), Some(&b"2".to_vec()));
    assert_eq!(b3.borrow().entries.get("x"), Some(&b"1".to_vec()));
    assert!(
        b3.borrow().events.is_empty(),
        "no start/end/apply from polls: {:?}",
        b3.borrow().events
    );
    // An idle poll: one call, XRANGE per polled namespace + QUIT.
    let idle = tick_names(&mut eb, &mut r, at + 100);
    assert_eq!(idle, vec!["XRANGE", "XRANGE", "QUIT"]);
    // The hooked namespace gets the change in its cycle, inside its hooks.
    run_cycle(&mut eb, &mut r, at + 100);
    assert_eq!(b3.borrow().events, vec!["start", "apply:x", "end"]);
    assert_eq!(b3.borrow().entries.get("x"), Some(&b"2".to_vec()));
}

#[test]
fn no_polls_after_a_failed_cycle_until_success() {
    let (a, b, mut ea, mut eb, mut r, now) = polling_pair(settings(), 5);
    let due = eb.next_cycle_ms().unwrap().max(now);
    let calls = eb.tick(due);
    deliver_with(&mut eb, &mut r, due, calls, &mut |_, _| {
        Some(Err(CallFailed::Status(503)))
    });
    assert_eq!(eb.stats().cycles_failed, 1);
    assert_eq!(eb.next_poll_ms(), None);
    // A peer writes meanwhile; B stays silent until its (backed-off) cycle.
    a.borrow_mut().set("1", b"v1");
    ea.put(NS, "1", b"v1".to_vec()).unwrap_err();
    run_cycle(&mut ea, &mut r, due);
    assert_eq!(r.get(&key("1")), Some(b"v1".to_vec()));
    let retry = eb.next_cycle_ms().unwrap();
    let mut t = due;
    while t + TICK_MS < retry {
        t += TICK_MS;
        assert!(eb.tick(t).is_empty(), "no poll at {t}");
    }
    assert_eq!(eb.stats().polls_ok + eb.stats().polls_failed, 0);
    // A successful cycle resumes polling.
    let done = run_cycle(&mut eb, &mut r, t);
    assert_eq!(eb.stats().cycles_ok, 3);
    assert_eq!(b.borrow().entries.get("1"), Some(&b"v1".to_vec()));
    assert_eq!(eb.next_poll_ms(), Some(done + 100));
    assert_eq!(
        tick_names(&mut eb, &mut r, done + 100),
        vec!["XRANGE", "QUIT"]
    );
    assert_eq!(polls(&eb), 1);
}

#[test]
fn failed_poll_is_counted_and_pauses_polls_until_the_next_cycle() {
    let (_a, _b, _ea, mut eb, mut r, now) = polling_pair(settings(), 5);
    let next_cycle = eb.next_cycle_ms().unwrap();
    let backoff = eb.stats().backoff_ms;
    let at = eb.next_poll_ms().unwrap().max(now);
    let calls = eb.tick(at);
    assert_eq!(calls.len(), 1);
    deliver_with(&mut eb, &mut r, at, calls, &mut |_, _| {
        Some(Err(CallFailed::Timeout))
    });
    let st = eb.stats().clone();
    assert_eq!((st.polls_failed, st.polls_ok, st.cycles_failed), (1, 0, 0));
    assert_eq!(
        (eb.next_cycle_ms(), st.backoff_ms),
        (Some(next_cycle), backoff)
    );
    // Paused: no calls at all until the next cycle.
    let mut t = at;
    while t + TICK_MS < next_cycle {
        t += TICK_MS;
        assert!(eb.tick(t).is_empty());
    }
    let done = run_cycle(&mut eb, &mut r, t);
    assert_eq!(
        tick_names(&mut eb, &mut r, done + 100),
        vec!["XRANGE", "QUIT"]
    );
    assert_eq!(eb.stats().polls_ok, 1);
}

#[test]
fn a_due_cycle_waits_for_a_running_poll_and_a_stuck_poll_times_out() {
    let s = SyncSettings {
        op_timeout_ms: 1_000,
        ..settings()
    };
    let (_a, _b, _ea, mut eb, mut r, now) = polling_pair(s, 5);
    let due = eb.next_cycle_ms().unwrap();
    // A poll still waiting for Redis when the cycle falls due.
    let at = due - 50;
    assert!(at >= now);
    let held = eb.tick(at);
    assert!(eb.poll_in_progress());
    assert!(eb.tick(due).is_empty(), "the cycle waits");
    assert!(!eb.cycle_in_progress());
    let reply = r.execute(&held[0].body);
    assert!(eb.on_response(held[0].id, due + 10, Ok(&reply)).is_empty());
    assert_eq!(polls(&eb), 1);
    let calls = eb.tick(due + 100);
    assert!(eb.cycle_in_progress());
    deliver_with(&mut eb, &mut r, due + 100, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
    assert_eq!(eb.stats().cycles_ok, 3);

    // A poll that never gets an answer is abandoned after op_timeout_ms.
    let at = eb.next_poll_ms().unwrap();
    let held = eb.tick(at);
    assert_eq!(held.len(), 1);
    assert!(eb.tick(at + 999).is_empty());
    assert!(eb.poll_in_progress());
    assert!(eb.tick(at + 1_000).is_empty());
    assert!(!eb.poll_in_progress());
    let st = eb.stats();
    assert_eq!(
        (st.polls_failed, st.cycles_failed, st.cycles_timed_out),
        (1, 0, 0)
    );
    let reply = r.execute(&held[0].body);
    assert!(eb
        .on_response(held[0].id, at + 1_001, Ok(&reply))
        .is_empty());
    assert_eq!(eb.stats().late_responses, 1);
    // The cycle still runs on time.
    let next = eb.next_cycle_ms().unwrap();
    run_cycle(&mut eb, &mut r, next);
    assert_eq!(eb.stats().cycles_ok, 4);
}

#[test]
fn poll_with_trimmed_log_schedules_a_full_scan_next_cycle() {
    let s = SyncSettings {
        setex_chunk: 2,
        ..settings()
    };
    let (a, b, mut ea, mut eb, mut r, now) = polling_pair(s, 20);
    for i in 0..20 {
        a.borrow_mut().set(&i.to_string(), b"v1");
    }
    // Written by A (write-through-like, outside A's schedule).
    let calls = ea.tick(ea.next_cycle_ms().unwrap());
    deliver_with(&mut ea, &mut r, now, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
    assert_eq!(r.get(&key("7")), Some(b"v1".to_vec()));
    r.trim_stream(&format!("aibrix:{{{NS}}}:log"), 3);
    let at = eb.next_poll_ms().unwrap().max(now);
    assert!(at + 200 < eb.next_cycle_ms().unwrap());
    let full_scans = eb.stats().full_scans;
    assert_eq!(tick_names(&mut eb, &mut r, at), vec!["XRANGE", "QUIT"]);
    assert_eq!(eb.stats().log_fallbacks, 1);
    assert_eq!(eb.stats().full_scans, full_scans, "a poll never scans");
    assert!(b.borrow().entries.values().all(|v| v == b"v0"));
    // Position unknown: nothing left to poll until the cycle.
    assert!(eb.tick(at + 100).is_empty());
    r.log.clear();
    let done = run_cycle(&mut eb, &mut r, at + 100);
    assert!(r.count("SCAN") >= 1);
    assert_eq!(eb.stats().full_scans, full_scans + 1);
    assert!(b.borrow().entries.values().all(|v| v == b"v1"));
    // The scan learnt the head again: polls resume.
    assert_eq!(
        tick_names(&mut eb, &mut r, done + 100),
        vec!["XRANGE", "QUIT"]
    );
}

#[test]
fn truncated_multi_namespace_poll_is_split_and_retried() {
    let plain = caps(true, false, false, false);
    let a1 = MapComponent::shared(NS, plain);
    let a2 = MapComponent::shared("second", plain);
    let b1 = MapComponent::shared(NS, plain);
    let b2 = MapComponent::shared("second", plain);
    let mut ea = engine(settings(), &[&a1, &a2], 1);
    let mut eb = engine(settings(), &[&b1, &b2], 2);
    let mut r = MemRedis::new();
    a1.borrow_mut().set("w", b"0");
    a2.borrow_mut().set("w", b"0");
    let mut now = run_cycle(&mut ea, &mut r, 0);
    now = run_cycle(&mut eb, &mut r, now);
    now = run_cycle(&mut ea, &mut r, now);
    a1.borrow_mut().set("x", b"1");
    a2.borrow_mut().set("y", b"2");
    now = run_cycle(&mut ea, &mut r, now);
    now = run_cycle(&mut eb, &mut r, now);
    a1.borrow_mut().set("x", b"3");
    a2.borrow_mut().set("y", b"4");
    let due = ea.next_cycle_ms().unwrap();
    let calls = ea.tick(due);
    deliver_with(&mut ea, &mut r, now, calls, &mut |c, r| {
        Some(Ok(r.execute(&c.body)))
    });
    let at = eb.next_poll_ms().unwrap().max(now);
    let calls = eb.tick(at);
    let mut first = true;
    deliver_with(&mut eb, &mut r, at, calls, &mut |c, r| {
        let mut reply = r.execute(&c.body);
        if std::mem::take(&mut first) {
            reply.truncate(reply.len() / 2);
        }
        Some(Ok(reply))
    });
    assert_eq!(eb.stats().truncations, 1);
    assert_eq!((polls(&eb), eb.stats().polls_failed), (1, 0));
    assert_eq!(b1.borrow().entries.get("x"), Some(&b"3".to_vec()));
    assert_eq!(b2.borrow().entries.get("y"), Some(&b"4".to_vec()));
}

#[test]
fn poll_push_waits_push_ms_and_clears_only_on_success() {
    let s = SyncSettings {
        push_ms: 1_000,
        ..settings()
    };
    let (a, _b, mut ea, _eb, mut r, now) = warmed_pair(s, 5);
    let push = ea.settings().push_ms;
    let next_cycle = ea.next_cycle_ms().unwrap();
    assert!(now + push + 200 < next_cycle);
    a.borrow_mut().set("x", b"1");
    // Before push_ms: polls only.
    assert_eq!(
        tick_names(&mut ea, &mut r, now + 100),
        vec!["XRANGE", "QUIT"]
    );
    // At push_ms: poll, then push the delta (SETEX + XADD + EXPIRE).
    // The push fails: counted, the id stays dirty, schedule untouched.
    let at = now + push;
    let calls = ea.tick(at);
    let mut bodies = Vec::new();
    deliver_with(&mut ea, &mut r, at, calls, &mut |c, r| {
        bodies.push(names(&c.body));
        if names(&c.body).iter().any(|n| n == "SETEX") {
            Some(Err(CallFailed::Status(500)))
        } else {
            Some(Ok(r.execute(&c.body)))
        }
    });
    assert_eq!(
        bodies,
        vec![
            vec!["XRANGE", "QUIT"],
            vec!["SETEX", "XADD", "EXPIRE", "QUIT"]
        ]
    );
    let st = ea.stats().clone();
    assert_eq!((st.mid_pushes, st.mid_pushes_failed), (0, 1));
    assert_eq!(
        (st.cycles_failed, st.backoff_ms),
        (0, ea.settings().period_ms)
    );
    assert_eq!(ea.next_cycle_ms(), Some(next_cycle));
    assert!(a.borrow().dirty.contains("x"));
    assert!(!a.borrow().events.iter().any(|e| e == "clear:1"));
    // Paused until the cycle, which pushes it.
    assert!(ea.tick(at + 100).is_empty());
    let done = run_cycle(&mut ea, &mut r, at + 100);
    assert_eq!(r.get(&key("x")), Some(b"1".to_vec()));
    assert!(a.borrow().dirty.is_empty());

    // push_ms later: a successful push clears what it wrote.
    a.borrow_mut().set("y", b"2");
    a.borrow_mut().events.clear();
    let setex = r.count("SETEX");
    assert_eq!(
        tick_names(&mut ea, &mut r, done + push - 100),
        vec!["XRANGE", "QUIT"]
    );
    assert_eq!(
        tick_names(&mut ea, &mut r, done + push),
        vec!["XRANGE", "QUIT", "SETEX", "XADD", "EXPIRE", "QUIT"]
    );
    assert_eq!(r.get(&key("y")), Some(b"2".to_vec()));
    assert_eq!(r.count("SETEX"), setex + 1);
    assert!(a.borrow().dirty.is_empty());
    assert_eq!(a.borrow().events, vec!["clear:1"]);
    assert_eq!(ea.stats().mid_pushes, 1);
    assert_eq!(ea.stats().cycles_ok, 3, "no cycle ran for it");
    // Nothing dirty: no push at the next opportunity either.
    assert_eq!(
        tick_names(&mut ea, &mut r, done + push + 100),
        vec!["XRANGE", "QUIT"]
    );
}

#[test]
fn full_scan_mode_has_no_polls_and_no_mid_pushes() {
    for (every, poll_ms) in [(1, 100), (0, 100), (6, 0)] {
        let s = SyncSettings {
            full_scan_every: every,
            poll_ms,
            write_through: false,
            ..settings()
        };
        let a = MapComponent::shared(NS, caps(true, false, false, false));
        let b = MapComponent::shared(NS, caps(true, false, false, false));
        let mut ea = engine(s.clone(), &[&a], 1);
        let mut eb = engine(s, &[&b], 2);
        let mut r = MemRedis::new();
        let mut t = 0;
        while t < 40_000 {
            t += TICK_MS;
            if t % 700 == 0 {
                a.borrow_mut().set(&t.to_string(), b"v");
            }
            for e in [&mut ea, &mut eb] {
                let cycles = e.stats().cycles_ok;
                let calls = tick_names(e, &mut r, t);
                // Every call belongs to a cycle (none between cycles).
                assert!(
                    calls.is_empty() || e.stats().cycles_ok == cycles + 1,
                    "every {every} poll {poll_ms}: {calls:?} at {t}"
                );
            }
        }
        for e in [&ea, &eb] {
            let st = e.stats();
            assert_eq!((st.polls_ok, st.polls_failed, st.mid_pushes), (0, 0, 0));
            assert!(st.cycles_ok >= 3);
        }
        if every <= 1 {
            let stream =
                r.count("XADD") + r.count("XRANGE") + r.count("XREVRANGE") + r.count("EXPIRE");
            assert_eq!(stream, 0, "AIBrix mode: no stream commands");
        }
    }
}

/// One trial: two replicas ticking every [`TICK_MS`] on their own phases;
/// A changes an entity at a random `t0` (after warm-up) and the time until
/// B holds it is returned. `busy`: A also changes another entity on every
/// tick, so its polls' pushes never wait for a first change (the
/// usual state of a replica routing traffic).
fn convergence_ms(s: &SyncSettings, seed: u64, write_through: bool, busy: bool) -> u64 {
    let mut rng = SplitMix64::new(seed);
    let d = caps(true, false, false, false);
    let a = MapComponent::shared(NS, d);
    let b = MapComponent::shared(NS, d);
    let mut ea = SyncEngine::new(s.clone(), rng.next_u64());
    let mut eb = SyncEngine::new(s.clone(), rng.next_u64());
    ea.register(Box::new(Rc::clone(&a))).unwrap();
    eb.register(Box::new(Rc::clone(&b))).unwrap();
    let mut r = MemRedis::new();
    r.record = false;
    let (phase_a, phase_b) = (
        rng.below(TICK_MS as usize) as u64,
        rng.below(TICK_MS as usize) as u64,
    );
    ea.start(phase_a).unwrap();
    eb.start(phase_b).unwrap();
    a.borrow_mut().set("warm", b"0");
    let period = s.period_ms;
    let t0 = 4 * period + rng.below(period as usize) as u64;
    let (mut next_a, mut next_b) = (phase_a, phase_b);
    let mut changed = false;
    loop {
        let a_first = next_a <= next_b;
        let now = next_a.min(next_b);
        if !changed && now >= t0 {
            changed = true;
            a.borrow_mut().set("new", b"1");
            if write_through {
                ea.put(NS, "new", b"1".to_vec()).unwrap();
            }
        }
        if a_first {
            if busy {
                a.borrow_mut().set("busy", now.to_string().as_bytes());
            }
            drive(&mut ea, &mut r, now);
            next_a += TICK_MS;
        } else {
            drive(&mut eb, &mut r, now);
            next_b += TICK_MS;
            if changed && b.borrow().entries.contains_key("new") {
                return now - t0;
            }
        }
        assert!(now < t0 + 3 * period, "seed {seed}: never converged");
    }
}

fn summary(mut v: Vec<u64>) -> (u64, u64, u64) {
    v.sort_unstable();
    let p = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    (p(0.5), p(0.99), v[v.len() - 1])
}

#[test]
fn convergence_with_polls_and_their_pushes_over_jittered_phases() {
    let trials = 300;
    let s = SyncSettings {
        period_ms: 1_000,
        poll_ms: 100,
        ..settings()
    };
    let (period, poll, push) = (s.period_ms, s.poll_ms, s.push_ms);
    // A change waits for A's next push (the first poll at least push_ms
    // after the last push, on A's next tick), then for B's next poll
    // (<= poll_ms, on B's tick).
    let bound = push + 2 * poll + TICK_MS;
    let periodic: Vec<u64> = (0..trials)
        .map(|i| convergence_ms(&s, i, false, true))
        .collect();
    let (p50, p99, max) = summary(periodic);
    let msg = format!(
        "periodic, P={period} ms, poll={poll} ms, {trials} trials: p50 {p50} ms, p99 {p99} ms, \
         max {max} ms (bound push + 2 poll + tick = {bound} ms; target p99 <= P)"
    );
    eprintln!("{msg}");
    assert!(max <= bound && p99 <= period, "{msg}");

    // Pushing every half period instead (what polls did before `push_ms`).
    let half = SyncSettings {
        push_ms: period / 2,
        ..s.clone()
    };
    let halves: Vec<u64> = (0..trials)
        .map(|i| convergence_ms(&half, i, false, true))
        .collect();
    let (h50, h99, _) = summary(halves);
    let msg =
        format!("push every P/2: p50 {h50} ms, p99 {h99} ms; push_ms {push}: p50 {p50}, p99 {p99}");
    eprintln!("{msg}");
    assert!(p50 < h50 && p99 < h99, "{msg}");

    // The same without polls (cycle push, then the peer's cycle pull).
    let off = SyncSettings {
        poll_ms: 0,
        ..s.clone()
    };
    let baseline: Vec<u64> = (0..trials)
        .map(|i| convergence_ms(&off, i, false, true))
        .collect();
    let (b50, b99, bmax) = summary(baseline);
    let msg = format!("without polls: p50 {b50} ms, p99 {b99} ms, max {bmax} ms");
    eprintln!("{msg}");
    assert!(b99 > period && p99 * 2 < b99, "{msg}");

    let wt = SyncSettings {
        write_through: true,
        ..s.clone()
    };
    let through: Vec<u64> = (0..trials)
        .map(|i| convergence_ms(&wt, i, true, true))
        .collect();
    let (p50, p99, max) = summary(through);
    let msg = format!(
        "write-through, poll={poll} ms, {trials} trials: p50 {p50} ms, p99 {p99} ms, max {max} ms \
         (bound tick + poll = {} ms; target p99 <= 250 ms)",
        TICK_MS + poll
    );
    eprintln!("{msg}");
    assert!(max <= TICK_MS + poll && p99 <= 250, "{msg}");
}

mod cluster;
