//! The singleton's services started and driven as Envoy calls them: what
//! starts when, where replies go, how much of the hand-off queue one
//! callback takes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::Cell;

use super::*;
use crate::shared::registry::PodSlot;
use crate::sync::handoff::{self, Touched};
use crate::testhost::FakeEnvoy;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const T0_NS: u64 = 1_000_000 * 1_000_000;

fn singleton(config: &str) -> (FakeEnvoy, Rc<Cell<u64>>, Singleton<FakeEnvoy>) {
    let host = FakeEnvoy::default();
    let settings = Settings::from_json(config.as_bytes()).unwrap();
    let now = Rc::new(Cell::new(T0_NS));
    let n = now.clone();
    let s = Singleton::new(
        host.clone(),
        settings,
        config.as_bytes().to_vec(),
        Rc::new(move || n.get()),
    );
    (host, now, s)
}

fn vm() -> String {
    "vm".into()
}

fn message(block: u64) -> Vec<u8> {
    handoff::encode(&Touched {
        model: 0,
        pod: PodSlot::new(0),
        time: 1,
        blocks: vec![(block, 0)],
    })
}

const SHARED_SIGNALS: &str = r#"{"endpoints":["a:1"],"signals":{"enabled":true,"cluster":"pods","share":true},"sync":{"enabled":true}}"#;

#[test]
fn nothing_starts_before_the_first_tick_or_hand_off() {
    let (host, _, mut s) = singleton(SHARED_SIGNALS);
    assert!(s.sync.is_none() && s.membership.is_none() && s.signals.is_none());
    assert!(host.sent().is_empty());
    // A hand-off starts sync (and only sync), and is not lost.
    s.on_queue([message(5)].into_iter());
    assert_eq!(s.sync.as_ref().unwrap().dirty_len(), 1);
    assert!(s.membership.is_none() && s.signals.is_none());
}

#[test]
fn the_first_tick_starts_every_service_and_signals_share_under_syncs_origin() {
    let (host, _, mut s) = singleton(SHARED_SIGNALS);
    s.on_tick(vm, std::iter::empty());
    assert!(s.membership.is_some());
    let origin = s.sync.as_ref().unwrap().origin().to_string();
    let sent = host.sent();
    assert!(sent.iter().any(|c| c.to == "pods"), "a scrape");
    assert!(sent.iter().any(|c| c.is_probe()), "the Redis probe");
    // The exchange writes this replica's records under sync's origin.
    let exchange = sent
        .iter()
        .find(|c| c.to == "bridge" && c.body.starts_with(b"*4\r\n$4\r\nHSET"));
    let body = &exchange.expect("an exchange").body;
    assert!(body.windows(origin.len()).any(|w| w == origin.as_bytes()));
}

#[test]
fn without_sync_there_is_no_loop_and_hand_offs_are_dropped() {
    let config = r#"{"endpoints":["a:1"],"signals":{"enabled":true,"cluster":"pods"}}"#;
    let (host, _, mut s) = singleton(config);
    let taken = Cell::new(0);
    s.on_tick(
        vm,
        [message(5)]
            .into_iter()
            .inspect(|_| taken.set(taken.get() + 1)),
    );
    assert!(s.sync.is_none());
    assert_eq!(taken.get(), 1, "the queue is drained all the same");
    assert!(s.signals.is_some());
    assert!(host.sent().iter().all(|c| c.to == "pods"), "no bridge call");
}

#[test]
fn one_callback_takes_at_most_max_drain_hand_offs() {
    let (_, _, mut s) = singleton(SHARED_SIGNALS);
    let taken = Cell::new(0usize);
    let endless = std::iter::repeat_with(|| {
        taken.set(taken.get() + 1);
        message(taken.get() as u64)
    });
    s.on_queue(endless);
    assert_eq!(taken.get(), MAX_DRAIN);
}

#[test]
fn replies_go_to_the_service_that_sent_the_call_read_within_its_bound() {
    let config = r#"{"cluster":"pods","signals":{"enabled":true,"max_body_bytes":4096},"sync":{"enabled":true}}"#;
    let (host, now, mut s) = singleton(config);
    s.on_tick(vm, std::iter::empty());
    // No members yet: the admin call and the Redis probe.
    let sent = host.sent();
    let admin = sent.iter().find(|c| c.to == "envoy_admin").unwrap();
    let probe = sent.iter().find(|c| c.is_probe()).unwrap();
    let reply = br#"{"cluster_statuses":[{"name":"pods","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}},"health_status":{"eds_health_status":"HEALTHY"}}]}]}"#;
    let bound = Cell::new(0);
    assert!(s.on_reply(admin.token, |max| {
        bound.set(max);
        Ok(reply.to_vec())
    }));
    assert_eq!(bound.get(), usize::MAX);
    assert_eq!(host.stat("prefix_router.membership.refreshes"), 1);
    // The probe's reply goes to sync.
    assert!(s.on_reply(probe.token, |_| Err(CallFailed::Timeout)));
    // Now a member: the next round scrapes it, read within max_body_bytes.
    now.set(now.get() + 250 * 1_000_000);
    s.on_tick(vm, std::iter::empty());
    let scrape = host.sent().into_iter().find(|c| c.to == "pods").unwrap();
    assert!(s.on_reply(scrape.token, |max| {
        bound.set(max);
        Err(CallFailed::Timeout)
    }));
    assert_eq!(bound.get(), 4096);
    assert_eq!(host.stat("prefix_router.signals.fallbacks"), 1);
    // A token nobody sent is not read.
    assert!(!s.on_reply(999, |_| panic!("read a reply nobody asked for")));
}

#[test]
fn a_later_configuration_is_compared_from_then_on() {
    let (host, now, mut s) = singleton(r#"{"endpoints":["a:1"]}"#);
    crate::deployment::publish_filter_config(&host, br#"{"endpoints":["b:1"]}"#);
    s.on_tick(vm, std::iter::empty());
    assert_eq!(host.gauge("prefix_router.config_mismatch"), Some(1));
    s.reconfigure(
        Settings::from_json(br#"{"endpoints":["b:1"]}"#).unwrap(),
        br#"{"endpoints":["b:1"]}"#.to_vec(),
    );
    now.set(now.get() + 1_000 * 1_000_000);
    s.on_tick(vm, std::iter::empty());
    assert_eq!(host.gauge("prefix_router.config_mismatch"), Some(0));
}
