use super::*;
use crate::route::table::Layout;
use crate::shared::store::{cas_update, MemStore};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn cfg() -> TableConfig {
    TableConfig::new(1024, 600, Layout::Segments)
}

#[test]
fn a_read_serves_the_next_update_and_a_stale_one_fails_its_cas() {
    let s = MemStore::new();
    s.set("ptab/1", b"1", None).unwrap();
    let view = RequestReads::new(&s, cfg(), 100);
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
}

#[test]
fn each_bucket_is_read_once_per_request_and_absent_stays_absent() {
    let s = MemStore::new();
    let view = RequestReads::new(&s, cfg(), 100);
    let before = s.op_counts().0;
    assert!(view.segment(7, 0).unwrap().is_empty());
    assert!(view.segment(7, 0).unwrap().is_empty());
    let key = bucket_key(cfg().bucket_of(7));
    assert_eq!(
        view.get(&key).unwrap().0,
        None,
        "an absent bucket reads as absent"
    );
    assert_eq!(s.op_counts().0, before + 1);
    // A new request reads again: nothing is kept between requests.
    let next = RequestReads::new(&s, cfg(), 100);
    next.segment(7, 0).unwrap();
    assert_eq!(s.op_counts().0, before + 2);
    // Other keys pass straight through.
    s.set("other", b"x", None).unwrap();
    let before = s.op_counts().0;
    view.get("other").unwrap();
    view.get("other").unwrap();
    assert_eq!(s.op_counts().0, before + 2);
}
