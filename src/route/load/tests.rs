use super::value::{HEADER, VERSION};
use super::*;
use crate::shared::store::MemStore;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn p(n: u16) -> PodSlot {
    PodSlot::new(n)
}

#[test]
fn the_replica_peak_since_a_time_covers_every_tick_after_it() {
    let store = MemStore::default();
    let mut a = VmLoad::new(1);
    let mut b = VmLoad::new(2);
    // Tick ending at 250: a had 3 in flight at once, then 1.
    for _ in 0..3 {
        a.add(p(0), 1);
    }
    a.add(p(0), -2);
    b.add(p(0), 2);
    b.refresh(&store, 250, false).unwrap();
    a.refresh(&store, 250, false).unwrap();
    // Tick ending at 500: a ends its last one; b's 2 are published.
    a.add(p(0), -1);
    a.refresh(&store, 500, false).unwrap();
    // Now (after 500): nothing of a's.
    assert_eq!(a.replica(1), vec![2]);
    // Since 600: this tick only (a 0, b 2).
    assert_eq!(a.peak_since(p(0), 600), 2);
    // Since 400: the tick ending at 500 (a's 1 at its start, b's 2).
    assert_eq!(a.peak_since(p(0), 400), 3);
    // Since 100: the tick ending at 250 too (a's 3, b's 2).
    assert_eq!(a.peak_since(p(0), 100), 5);
    assert_eq!(a.peak_since(p(1), 100), 0);
    // Only PEAK_TICKS ticks are remembered.
    for t in 1..=PEAK_TICKS as u64 {
        a.refresh(&store, 500 + t * 250, false).unwrap();
    }
    assert_eq!(a.peak_since(p(0), 0), 2, "b's 2 only");
}

#[test]
fn own_counts_are_exact_and_saturate_at_zero() {
    let mut vm = VmLoad::new(1);
    assert_eq!(vm.add(p(1), 1), 1);
    assert_eq!(vm.add(p(1), 1), 2);
    assert_eq!(vm.add(p(2), 1), 1);
    assert_eq!(vm.replica(3), vec![0, 2, 1]);
    assert_eq!(vm.add(p(0), -1), 0);
    let past = PodSlot::new(u16::try_from(MAX_SLOTS).unwrap());
    assert_eq!(vm.add(past, 1), 0, "out of range is not counted");
}

#[test]
fn a_lone_vms_age_reads_how_many_requests_ago_its_requests_were_sent() {
    let mut vm = VmLoad::new(1);
    // The clock does not move: a lone VM counts requests, not time.
    let a = vm.start(p(0), 1000, true);
    let b = vm.start(p(1), 1000, true);
    let c = vm.start(p(1), 1000, true);
    // Three routed: pod 0's request is 3 old, pod 1's 2 and 1 (mean 1.5,
    // in whole requests 2), pod 2 has none.
    assert_eq!(vm.age(1000), vec![3, 2]);
    assert_eq!(vm.replica(3), vec![1, 2, 0]);
    assert_eq!(vm.end(a), 0);
    assert_eq!(vm.end(b), 1);
    assert_eq!(vm.age(1000), vec![0, 1]);
    assert_eq!(vm.end(c), 0);
    // Ending more than started, or a ticket never given, saturates.
    let never = Ticket {
        pod: p(1),
        seq: u64::MAX,
        sent_ms: u64::MAX,
    };
    assert_eq!(vm.end(never), 0);
    assert_eq!(vm.age(1000), vec![0, 0]);
    let past = PodSlot::new(u16::try_from(MAX_SLOTS).unwrap());
    let d = vm.start(past, 1000, true);
    assert_eq!(vm.end(d), 0, "out of range is not counted");
    assert_eq!(vm.age(1000).len(), 2);
}

#[test]
fn with_other_vms_live_the_age_is_the_replicas_in_ms() {
    let s = MemStore::new();
    let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
    a.refresh(&s, 1000, false).unwrap();
    b.refresh(&s, 1000, false).unwrap();
    a.refresh(&s, 1000, false).unwrap();
    assert!(a.others_live() && b.others_live());
    // A sends to pod 0 at 1000 and 1100; B to pod 1 at 1200, then to
    // pod 0 at 1300.
    let a1 = a.start(p(0), 1000, true);
    assert!(a.publish(&s, 1000));
    a.start(p(0), 1100, true);
    assert!(a.publish(&s, 1100));
    b.start(p(1), 1200, true);
    assert!(b.publish(&s, 1200));
    b.read_others(&s, 1300);
    b.start(p(0), 1300, true);
    // At 1400, for B: pod 0 holds the replica's 1000, 1100 and 1300
    // (mean 1133, 267 ms ago), pod 1 its own 1200. By B's own requests
    // alone pod 1's would be the older.
    assert_eq!(b.age(1400), vec![267, 200]);
    // A reads B's requests after B publishes; A's own end at once.
    assert!(b.publish(&s, 1300));
    a.read_others(&s, 1400);
    a.end(a1);
    assert_eq!(a.age(1400), vec![200, 200]);
    // A VM gone quiet past the stale bound: its requests age nothing.
    let late = 1401 + VM_STALE_MS;
    a.read_others(&s, late);
    assert_eq!(a.age(late), vec![late - 1100]);
}

#[test]
fn sent_and_placed_counts_are_the_replicas_and_follow_recent_traffic() {
    let s = MemStore::new();
    let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
    // A lone VM: its own counts.
    a.start(p(0), 1000, true);
    a.start(p(0), 1000, false);
    assert_eq!((a.sent(2), a.placed(2)), (vec![2, 0], vec![1, 0]));
    a.refresh(&s, 1000, false).unwrap();
    b.refresh(&s, 1000, false).unwrap();
    a.refresh(&s, 1000, false).unwrap();
    // B sends to pod 1, new prefixes; A reads it per request.
    b.start(p(1), 1100, true);
    assert!(b.publish(&s, 1100));
    a.read_others(&s, 1200);
    assert_eq!((a.sent(2), a.placed(2)), (vec![2, 1], vec![1, 1]));
    assert_eq!(
        (b.sent(2), b.placed(2)),
        (vec![2, 1], vec![1, 1]),
        "read on B's tick"
    );
    // Ending a request leaves what was sent.
    let t = a.start(p(1), 1200, false);
    a.end(t);
    assert_eq!(a.sent(2), vec![2, 2]);
    // Every count halves when one reaches HALVE_AT.
    for _ in 0..HALVE_AT - 2 {
        a.start(p(0), 1300, false);
    }
    // A's [256, 1] halved to [128, 0], plus B's [0, 1].
    assert_eq!(a.sent(2), vec![HALVE_AT / 2, 1]);
    assert_eq!(a.placed(2), vec![1, 1], "placed counts halve on their own");
}

#[test]
fn a_quiet_vms_sent_and_placed_counts_fade() {
    let s = MemStore::new();
    let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
    for _ in 0..8 {
        b.start(p(0), 1000, true);
    }
    a.refresh(&s, 1000, false).unwrap();
    b.refresh(&s, 1000, false).unwrap();
    a.refresh(&s, 1000, false).unwrap();
    assert_eq!((a.sent(1), a.placed(1)), (vec![8], vec![8]));
    // B routes nothing more; its ticks go on.
    b.refresh(&s, 2999, false).unwrap();
    a.read_others(&s, 2999);
    assert_eq!(a.sent(1), vec![8], "not idle long enough");
    b.refresh(&s, 3000, false).unwrap();
    a.read_others(&s, 3000);
    assert_eq!((a.sent(1), a.placed(1)), (vec![4], vec![4]));
    b.refresh(&s, 4000, false).unwrap();
    assert_eq!(b.sent(1), vec![4], "once per idle span");
    for t in [5000, 7000, 9000] {
        b.refresh(&s, t, false).unwrap();
    }
    a.read_others(&s, 9000);
    assert_eq!((a.sent(1), a.placed(1)), (vec![0], vec![0]));
    // A VM that keeps routing keeps its counts.
    a.start(p(0), 9000, false);
    a.refresh(&s, 10_500, false).unwrap();
    assert_eq!(a.sent(1), vec![1]);
}

#[test]
fn a_value_of_another_version_counts_nothing_but_keeps_its_key() {
    let s = MemStore::new();
    let tally = Tally {
        counts: vec![5, 0],
        sent: vec![9, 1],
        placed: vec![2],
        sent_ms: vec![5000],
    };
    let mut value = Published::encode(7, 1000, &tally);
    let read = Published::decode(&value).unwrap();
    assert_eq!((read.token, read.at_ms), (7, 1000));
    assert_eq!(
        read.tally(),
        Tally {
            placed: vec![2, 0],
            sent_ms: vec![5000, 0],
            ..tally
        }
    );
    // Not whole slots, or more than MAX_SLOTS: nothing counted, no misread.
    let mut too_many = value[..HEADER].to_vec();
    too_many.resize(HEADER + SLOT_BYTES * (MAX_SLOTS + 1), 1);
    for bad in [[value.as_slice(), &[1]].concat(), too_many] {
        assert_eq!(Published::decode(&bad).unwrap().tally(), Tally::default());
    }
    value[16] = VERSION + 1;
    s.set(&vm_key(0), &value, None).unwrap();
    let mut vm = VmLoad::new(9);
    vm.add(p(0), 1);
    vm.refresh(&s, 1000, false).unwrap();
    assert_eq!(vm.key(), Some(1), "the other build's key stays its own");
    assert_eq!(vm.replica(1), vec![1]);
    assert_eq!(replica_total(&s, 1000).unwrap(), vec![1]);
}

#[test]
fn each_vm_sees_the_others_after_a_tick() {
    let s = MemStore::new();
    let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
    a.add(p(0), 3);
    b.add(p(1), 2);
    a.refresh(&s, 1000, false).unwrap();
    b.refresh(&s, 1000, false).unwrap();
    a.refresh(&s, 1250, false).unwrap();
    assert_eq!((a.key(), b.key()), (Some(0), Some(1)));
    assert_eq!(a.replica(2), vec![3, 2]);
    assert_eq!(b.replica(2), vec![3, 2]);
    assert_eq!(
        (b.replica_at(0), b.replica_at(1), b.replica_at(9)),
        (3, 2, 0)
    );
    assert_eq!(replica_total(&s, 1250).unwrap(), vec![3, 2]);
    // Released on A: exact on A at once, on B after A's next tick.
    a.add(p(0), -3);
    assert_eq!(a.replica(2), vec![0, 2]);
    a.refresh(&s, 1500, false).unwrap();
    b.refresh(&s, 1500, false).unwrap();
    assert_eq!(b.replica(2), vec![0, 2]);
}

#[test]
fn vms_exchange_counts_per_request_between_ticks() {
    let s = MemStore::new();
    let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
    // A lone VM: no call per request, before and after its tick.
    a.read_others(&s, 1000);
    assert!(!a.publish(&s, 1000));
    a.refresh(&s, 1000, false).unwrap();
    let before = s.op_counts();
    a.add(p(0), 1);
    a.read_others(&s, 1000);
    assert!(!a.publish(&s, 1000), "nobody to tell");
    assert_eq!(s.op_counts(), before);
    // Once each has seen the other on a tick: one get per other VM to
    // read, one set to publish.
    b.refresh(&s, 1000, false).unwrap();
    a.refresh(&s, 1250, false).unwrap();
    assert_eq!(b.replica(1), vec![0], "A's 1 came after B's tick read");
    b.read_others(&s, 1260);
    assert_eq!(b.replica(1), vec![1]);
    let before = s.op_counts();
    a.add(p(0), 2);
    assert!(a.publish(&s, 1300));
    b.read_others(&s, 1300);
    assert_eq!(s.op_counts(), (before.0 + 1, before.1 + 1));
    assert_eq!(
        b.replica(1),
        vec![3],
        "A's requests as of now, not its tick"
    );
    a.add(p(0), -3);
    assert!(a.publish(&s, 1400));
    b.read_others(&s, 1400);
    assert_eq!(b.replica(1), vec![0]);
    // A VM gone quiet past the stale bound stops counting here too.
    a.add(p(0), 4);
    assert!(a.publish(&s, 1500));
    b.read_others(&s, 1501 + VM_STALE_MS);
    assert_eq!(b.replica(1), vec![0]);
}

#[test]
fn fresh_reads_are_bounded_and_the_rest_count_as_of_the_tick() {
    let s = MemStore::new();
    let mut vms: Vec<VmLoad> = (1..=FRESH_READS as u64 + 3).map(VmLoad::new).collect();
    for vm in &mut vms {
        vm.add(p(0), 1);
        vm.refresh(&s, 1000, false).unwrap();
    }
    let (first, rest) = vms.split_first_mut().unwrap();
    first.refresh(&s, 1250, false).unwrap();
    assert_eq!(first.replica(1), vec![FRESH_READS as u32 + 3]);
    // Every other VM ends its request; the first reads as many as it may.
    for vm in rest.iter_mut() {
        vm.add(p(0), -1);
        assert!(vm.publish(&s, 1300));
    }
    let before = s.op_counts();
    first.read_others(&s, 1300);
    assert_eq!(s.op_counts().0 - before.0, FRESH_READS as u64);
    assert_eq!(
        first.replica(1),
        vec![1 + 2],
        "two VMs past the bound, as of the tick"
    );
}

#[test]
fn a_vm_that_stops_ticking_stops_counting_and_its_key_is_reused() {
    let s = MemStore::new();
    let (mut dead, mut live) = (VmLoad::new(1), VmLoad::new(2));
    dead.add(p(0), 5);
    dead.refresh(&s, 1000, false).unwrap();
    live.refresh(&s, 1000, false).unwrap();
    assert_eq!(live.replica(1), vec![5]);
    // The dead VM never ticks again.
    live.refresh(&s, 1000 + VM_STALE_MS, false).unwrap();
    assert_eq!(live.replica(1), vec![5], "still within the stale bound");
    live.refresh(&s, 1001 + VM_STALE_MS, false).unwrap();
    assert_eq!(
        live.replica(1),
        vec![0],
        "a dead VM's pods are not loaded for good"
    );
    assert!(replica_total(&s, 1001 + VM_STALE_MS)
        .unwrap()
        .iter()
        .all(|&c| c == 0));
    // A reloaded VM takes the dead one's key; the key space stays put.
    let mut new = VmLoad::new(3);
    new.add(p(0), 1);
    new.refresh(&s, 7000, false).unwrap();
    assert_eq!(new.key(), Some(0));
    assert_eq!(s.key_count(), 2);
    // The old VM wakes up: its key is gone, it claims a free one.
    dead.refresh(&s, 7100, false).unwrap();
    assert_eq!(dead.key(), Some(2));
    live.refresh(&s, 7200, false).unwrap();
    assert_eq!(live.replica(1), vec![6]);
}

#[test]
fn two_vms_racing_for_one_key_never_share_it() {
    let s = MemStore::new();
    let (mut a, mut b) = (VmLoad::new(1), VmLoad::new(2));
    // B writes between A's read and A's claim.
    s.interfere_next(1);
    a.refresh(&s, 1000, false).unwrap();
    b.refresh(&s, 1000, false).unwrap();
    a.refresh(&s, 1250, false).unwrap();
    assert_ne!(a.key(), b.key());
    assert!(a.key().is_some() && b.key().is_some());
}

#[test]
fn fleet_adds_the_other_replicas() {
    let s = MemStore::new();
    let mut vm = VmLoad::new(1);
    vm.add(p(0), 1);
    set_remote(&s, &[4, 5]).unwrap();
    vm.refresh(&s, 1000, true).unwrap();
    assert_eq!(vm.fleet(2), vec![5, 5]);
    assert_eq!(vm.replica(2), vec![1, 0]);
    assert_eq!(remote(&s).unwrap(), vec![4, 5]);
}

#[test]
fn malformed_values_count_as_free_keys() {
    let s = MemStore::new();
    s.set(&vm_key(0), b"junk", None).unwrap();
    let mut vm = VmLoad::new(9);
    vm.add(p(0), 1);
    vm.refresh(&s, 1000, false).unwrap();
    assert_eq!(vm.key(), Some(0));
    assert_eq!(replica_total(&s, 1000).unwrap(), vec![1]);
}
