//! A VM's bucket copies, through routing decisions of two VMs (two
//! routers) over one in-memory shared store.

use super::*;
use crate::rng::SplitMix64;
use crate::route::registry::PodSlot;
use crate::route::router::tests::{req, router as vm};
use crate::route::router::Router;
use crate::route::store::{cas_update, MemStore};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Routes and releases one request; (pod, match percent, (gets, sets) it
/// made).
fn route(r: &Router, s: &MemStore, prompt: &str, now: u32) -> (PodSlot, u8, (u64, u64)) {
    let before = s.op_counts();
    let x = r
        .route(s, &req(prompt), now, &mut SplitMix64::new(u64::from(now)))
        .unwrap();
    r.release(s, x.ticket, x.is_hit(), u64::from(now) * 1000);
    let after = s.op_counts();
    (
        x.choice.pod,
        x.choice.match_percent,
        (after.0 - before.0, after.1 - before.1),
    )
}

/// 100 blocks of `prefix`, then 5 of `tail`.
fn prompt(prefix: &str, tail: &str) -> String {
    format!("{}{}", prefix.repeat(400), tail.repeat(20))
}

#[test]
fn a_known_prefix_is_probed_from_copies_for_a_second() {
    let s = MemStore::new();
    let a = vm("");
    route(&a, &s, &prompt("w", "0"), 100);
    let (pod, _, _) = route(&a, &s, &prompt("p", "a"), 100);
    // The same prompt again: every segment the probe needs is in this VM's
    // copies, and a fresh match writes nothing.
    let (again, pct, calls) = route(&a, &s, &prompt("p", "a"), 100);
    assert_eq!((again, pct, calls), (pod, 100, (0, 0)));
    // A new tail after the known prefix: the copy's "not held" past the
    // prefix is confirmed by one read of that bucket, which the write of
    // the tail then reuses.
    let (next, pct, (gets, sets)) = route(&a, &s, &prompt("p", "b"), 100);
    assert_eq!(next, pod);
    assert!(pct >= 80, "{pct}");
    assert_eq!((gets, sets), (1, 1));
    // The written bucket is this VM's copy: the same prompt again is free.
    assert_eq!(route(&a, &s, &prompt("p", "b"), 100), (pod, 100, (0, 0)));
    // Copies live COPY_TICKS ticks, then the next request reads again.
    for _ in 1..COPY_TICKS {
        a.tick_copies();
    }
    assert_eq!(route(&a, &s, &prompt("p", "a"), 100).2, (0, 0));
    a.tick_copies();
    let (_, pct, (gets, _)) = route(&a, &s, &prompt("p", "a"), 100);
    assert_eq!(pct, 100);
    assert!(gets > 0);
}

#[test]
fn a_copys_no_is_confirmed_so_another_vms_new_prefix_is_found() {
    // One bucket: every segment shares it, so A's copy of it is the one a
    // new prefix of B's lands in.
    let (a, b) = (
        vm(r#","table_capacity_blocks":64"#),
        vm(r#","table_capacity_blocks":64"#),
    );
    let s = MemStore::new();
    route(&a, &s, "warm up both", 100);
    route(&b, &s, "warm up both", 100);
    // 10 prompts of 4 blocks: within the bucket's 64 records.
    for i in 0..10 {
        let q = format!("{i:04}").repeat(4);
        // A has the bucket's copy (a prompt it knows), then B records a
        // new prompt in that bucket.
        assert_eq!(route(&a, &s, "warm up both", 100).2, (0, 0));
        let (pod, _, (_, sets)) = route(&b, &s, &q, 100);
        assert!(sets > 0);
        let (apod, apct, (gets, _)) = route(&a, &s, &q, 100);
        assert_eq!((apod, apct), (pod, 100), "prompt {i}");
        assert_eq!(gets, 1, "the copy's no was taken without a read");
    }
}

#[test]
fn a_prefix_another_vm_extended_is_followed_past_the_copy() {
    let (a, b) = (vm(""), vm(""));
    let s = MemStore::new();
    route(&a, &s, &prompt("w", "0"), 100);
    route(&b, &s, &prompt("w", "0"), 100);
    let (pod, _, _) = route(&a, &s, &prompt("p", "a"), 100);
    // B routes the prefix with a longer tail (a hit on the same pod, which
    // records the tail); A's copies end where A's own prompt ended.
    let long = format!("{}{}", prompt("p", "a"), "z".repeat(400));
    assert_eq!(route(&b, &s, &long, 100).0, pod);
    let (apod, apct, _) = route(&a, &s, &long, 100);
    assert_eq!(apod, pod);
    assert!(apct >= 90, "A stopped at its copy: {apct}");
}

#[test]
fn copies_are_bounded() {
    let s = MemStore::new();
    let a = vm("");
    for i in 0..(MAX_COPIES + 300) {
        route(&a, &s, &format!("{i:08}").repeat(8), 100);
        assert!(a.copies() <= MAX_COPIES);
    }
    assert!(a.copies() > 0);
}

#[test]
fn a_read_serves_the_next_update_and_a_stale_one_fails_its_cas() {
    let cfg = TableConfig::new(1024, 600, crate::route::table::Layout::Segments);
    let s = MemStore::new();
    s.set("ptab/1", b"1", None).unwrap();
    let cell = RefCell::new(Mirror::default());
    let view = Mirrored::new(&cell, &s, cfg, 100);
    assert_eq!(view.get("ptab/1").unwrap().0.as_deref(), Some(&b"1"[..]));
    let before = s.op_counts();
    cas_update(&view, "ptab/1", 3, |_| Some(b"2".to_vec())).unwrap();
    assert_eq!(s.op_counts().0, before.0, "the update reused the read");
    // Changed behind a read: the write fails on its cas, the retry reads.
    assert_eq!(view.get("ptab/1").unwrap().0.as_deref(), Some(&b"2"[..]));
    s.set("ptab/1", b"3", None).unwrap();
    let o = cas_update(&view, "ptab/1", 3, |cur| {
        let mut v = cur.unwrap().to_vec();
        v.push(b'+');
        Some(v)
    })
    .unwrap();
    assert_eq!(o.retries, 1);
    assert_eq!(s.get("ptab/1").unwrap().0.as_deref(), Some(&b"3+"[..]));
    // Other keys pass straight through, with no copy kept.
    s.set("other", b"x", None).unwrap();
    let before = s.op_counts();
    view.get("other").unwrap();
    view.get("other").unwrap();
    assert_eq!(s.op_counts().0, before.0 + 2);
    assert_eq!(cell.borrow().len(), 1);
}
