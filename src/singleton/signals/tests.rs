//! The signal collector under a fake clock: scrape and exchange calls
//! recorded by the singleton's double and answered by the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};

use super::*;
use crate::fleet::FleetView;
use crate::testhost::{FakeEnvoy, Sent};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The value of stat `prefix_router.signals.<name>`.
fn stat(host: &FakeEnvoy, name: &str) -> i64 {
    host.stat(&format!("prefix_router.signals.{name}"))
}

fn published(host: &FakeEnvoy) -> Vec<Record> {
    let (value, _) = host.get(KEY).unwrap();
    value
        .map(|v| crate::signals::decode(&v))
        .unwrap_or_default()
}

const VLLM: &str = "\
vllm:num_requests_running{model_name=\"m\"} 3.0
vllm:num_requests_waiting{model_name=\"m\"} 2.0
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5
";

const T0: u64 = 1_000_000;

/// A collector for `config`, its view holding the static pools.
fn collector(config: &str, replica: Option<&str>) -> Collector<FakeEnvoy> {
    let settings = Rc::new(Settings::from_json(config.as_bytes()).unwrap());
    let host = FakeEnvoy::default();
    let members = crate::fleet::static_members(&host, &settings.static_pools(), 1, 100).unwrap();
    let view = Rc::new(RefCell::new(FleetView::new(members)));
    Collector::new(host, settings, view, replica)
}

const THROUGH_PODS: &str =
    r#"{"endpoints":["a:1","b:1"],"signals":{"enabled":true,"cluster":"pods"}}"#;

fn body(text: &str) -> impl FnOnce(usize) -> Result<Vec<u8>, CallFailed> + '_ {
    move |_| Ok(text.as_bytes().to_vec())
}

#[test]
fn each_live_pod_is_scraped_once_per_interval_naming_it_in_the_host_header() {
    let mut c = collector(THROUGH_PODS, None);
    c.on_tick(T0);
    let sent = c.host.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0],
        Sent {
            token: 1,
            to: "pods".into(),
            headers: vec![
                ":method: GET".into(),
                ":path: /metrics".into(),
                ":authority: a:1".into(),
                "x-gateway-destination-endpoint: a:1".into(),
            ],
            node: None,
            body: Vec::new(),
            timeout_ms: 1000,
        }
    );
    assert!(sent[1].headers.contains(&":authority: b:1".to_string()));
    // Answered: the next round waits for its interval.
    assert!(c.on_reply(1, T0 + 10, body(VLLM)));
    assert!(c.on_reply(2, T0 + 10, body(VLLM)));
    c.on_tick(T0 + 100);
    assert_eq!(c.host.sent().len(), 2);
    c.on_tick(T0 + 250);
    assert_eq!(c.host.sent().len(), 4);
    assert!(!c.on_reply(99, T0, body(VLLM)), "not its call");
}

#[test]
fn without_a_signals_cluster_a_pod_is_scraped_through_its_pools_cluster() {
    let settings = Rc::new(
        Settings::from_json(br#"{"cluster":"pods-a","signals":{"enabled":true}}"#).unwrap(),
    );
    let host = FakeEnvoy::default();
    let hosts = [(
        String::new(),
        vec![crate::fleet::membership::Host {
            name: "10.0.0.1:80".into(),
            address: "10.0.0.1:80".into(),
            healthy: true,
        }],
    )]
    .into_iter()
    .collect();
    let members = crate::fleet::cluster_members(&host, &hosts, 1, 100).unwrap();
    let view = Rc::new(RefCell::new(FleetView::new(members)));
    let mut c = Collector::new(host, settings, view, None);
    c.on_tick(T0);
    let sent = c.host.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].to, "pods-a");
}

#[test]
fn a_scrape_is_read_within_max_body_bytes_and_published() {
    let config = r#"{"endpoints":["a:1","b:1"],"signals":{"enabled":true,"cluster":"pods","max_body_bytes":4096}}"#;
    let mut c = collector(config, None);
    c.on_tick(T0);
    let bound = Cell::new(0);
    let read = |max: usize| {
        bound.set(max);
        Ok(VLLM.as_bytes().to_vec())
    };
    c.on_reply(1, T0 + 10, read);
    assert_eq!(bound.get(), 4096);
    c.on_reply(2, T0 + 10, body(VLLM));
    let published = published(&c.host);
    assert_eq!(published.len(), 2);
    assert_eq!(
        (published[0].signals.waiting, published[0].signals.running),
        (2, 3)
    );
    assert_eq!((stat(&c.host, "scrapes"), stat(&c.host, "pods")), (2, 2));
}

#[test]
fn failed_scrapes_fall_back_counted_and_a_pod_is_logged_once_per_streak() {
    let mut c = collector(THROUGH_PODS, None);
    c.on_tick(T0);
    c.on_reply(1, T0 + 10, |_| Err(CallFailed::Timeout));
    c.on_reply(2, T0 + 10, body("garbage"));
    assert_eq!(stat(&c.host, "fallbacks"), 2);
    assert_eq!(c.failing.len(), 2);
    // Refused by Envoy: a fallback too, the pod still in one streak.
    c.host.0.refuse.set(true);
    c.on_tick(T0 + 250);
    assert_eq!(stat(&c.host, "fallbacks"), 4);
    assert_eq!(c.failing.len(), 2);
    // Read again: the streak ends.
    c.host.0.refuse.set(false);
    c.on_tick(T0 + 500);
    let n = c.host.sent().len() as u32;
    c.on_reply(n - 1, T0 + 510, body(VLLM));
    c.on_reply(n, T0 + 510, body(VLLM));
    assert!(c.failing.is_empty());
    assert_eq!(stat(&c.host, "scrapes"), 2);
}

const SHARED: &str = r#"{"endpoints":["a:1","b:1"],"signals":{"enabled":true,"cluster":"pods","share":true},"sync":{"enabled":true}}"#;

/// A share reply with no other replica: HSET, PEXPIRE, HGETALL, QUIT.
const NO_PEERS: &str = ":1\r\n:1\r\n*0\r\n+OK\r\n";

#[test]
fn a_complete_round_is_shared_at_once_through_the_bridge() {
    let mut c = collector(SHARED, Some("r1"));
    c.on_tick(T0);
    // The first exchange goes with the first tick, after the round's scrapes.
    let to: Vec<String> = c.host.sent().iter().map(|s| s.to.clone()).collect();
    assert_eq!(to, vec!["pods", "pods", "bridge"]);
    c.on_reply(1, T0 + 10, body(VLLM));
    c.on_reply(2, T0 + 10, body(VLLM));
    // The next round starts while that exchange is still in flight.
    c.on_tick(T0 + 250);
    assert_eq!(c.host.sent().len(), 5);
    assert!(c.on_reply(3, T0 + 260, body(NO_PEERS)));
    assert_eq!(stat(&c.host, "shared"), 1);
    c.on_reply(4, T0 + 270, body(VLLM));
    assert_eq!(c.host.sent().len(), 5, "round not complete yet");
    c.on_reply(5, T0 + 270, body(VLLM));
    // The round is complete: shared now, not at the next tick.
    let sent = c.host.sent();
    assert_eq!(sent.len(), 6);
    assert_eq!(sent[5].to, "bridge");
}

#[test]
fn a_failing_exchange_is_counted_and_logged_once_per_streak() {
    let mut c = collector(SHARED, Some("r1"));
    c.on_tick(T0);
    c.on_reply(3, T0 + 5, |_| Err(CallFailed::Status(503)));
    assert_eq!(stat(&c.host, "share_failures"), 1);
    assert!(c.share_failing);
    c.host.0.refuse.set(true);
    c.on_tick(T0 + 300);
    assert_eq!(
        stat(&c.host, "share_failures"),
        2,
        "a refused exchange fails too"
    );
    c.host.0.refuse.set(false);
    c.on_tick(T0 + 600);
    let n = c.host.sent().len() as u32;
    let bridge = c.host.sent().iter().rposition(|s| s.to == "bridge");
    assert_eq!(bridge, Some(n as usize - 1));
    c.on_reply(n, T0 + 605, body(NO_PEERS));
    assert!(!c.share_failing);
    assert_eq!(stat(&c.host, "shared"), 1);
}

#[test]
fn without_syncs_origin_nothing_is_shared_and_every_pod_is_scraped_here() {
    let mut c = collector(SHARED, None);
    c.on_tick(T0);
    assert!(c.host.sent().iter().all(|s| s.to == "pods"));
}
