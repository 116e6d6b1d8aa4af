//! One test per sync rule, driving engines against the in-memory Redis.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::rc::Rc;

use super::testkit::{deliver_with, drive, run_cycle, steady_state_cost, MapComponent, TOMBSTONE};
use super::*;
use crate::resp::{parse, Frame};
use memredis::MemRedis;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

type Comp = Rc<RefCell<MapComponent>>;

const NS: &str = "prefixcache";

fn settings() -> SyncSettings {
    SyncSettings {
        enabled: true,
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
    assert!(scans.len() >= 10);
    assert!(scans
        .iter()
        .all(|c| c[2] == b"MATCH" && c[4] == b"COUNT" && c[5] == b"100"));
    let mgets: Vec<_> = r.log.iter().filter(|c| c[0] == b"MGET").collect();
    // One MGET per 50 keys of each SCAN page.
    assert!((20..=30).contains(&mgets.len()), "{}", mgets.len());
    assert!(mgets.iter().all(|c| c.len() <= 51));
    assert_eq!(mgets.iter().map(|c| c.len() - 1).sum::<usize>(), 1000);
    assert_eq!(e.stats().applied, 1000);
    assert_eq!(e.stats().keys_pulled, 1000);
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
    let mut now = run_cycle(&mut e, &mut r, 0);
    e.put(NS, "2", b"b".to_vec()).unwrap();
    drive(&mut e, &mut r, now);
    comp.borrow_mut().set("3", b"c");
    now = run_cycle(&mut e, &mut r, now);
    let _ = now;
    // Each cycle: start/end around the pull, the push (clear) after "end";
    // write-through calls no hook, only clears what it wrote.
    // (The second pull is a full scan, so it also re-reads our own "1".)
    assert_eq!(
        comp.borrow().events,
        vec!["start", "end", "clear:1", "clear:1", "start", "apply:1", "apply:2", "end", "clear:1"]
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
    let mut e = engine(settings(), &[&comp], 1);
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
    let now = run_cycle(&mut e, &mut r, now);
    let _ = now;
    assert_eq!(e.stats().truncations, truncated_calls);
    assert!(r.log.iter().rev().find(|c| c[0] == b"MGET").unwrap().len() <= 1 + 48);
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
    // Cycle 1 is full too: no log position was known yet.
    assert_eq!(full, vec![true, true, false, true, false, false, true]);

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
    let incremental = steady_state_cost(5_000, 10, 6, 6);
    let full = steady_state_cost(5_000, 10, 1, 6);
    eprintln!(
        "per cycle, 5000 entities, 1% churn: incremental {incremental:?}, full scan {full:?}"
    );
    assert!(incremental.commands * 3.0 < full.commands);
    assert!(incremental.bytes_received * 3.0 < full.bytes_received);
}
