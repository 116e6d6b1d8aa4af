//! The signal collector under a fake clock: scrape and exchange calls
//! recorded and answered by the test, shared data in a `MemStore`, stats by
//! name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::*;
use crate::fleet::FleetView;
use crate::shared::store::{MemStore, Versioned};
use crate::sync::SyncSettings;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A call the collector sent: where (cluster, or `bridge`), its headers
/// (`name: value`), timeout.
#[derive(Clone, Debug, PartialEq)]
struct Sent {
    to: String,
    headers: Vec<String>,
    timeout_ms: u64,
}

#[derive(Default)]
struct TestHost {
    store: MemStore,
    metrics: RefCell<Vec<String>>,
    values: RefCell<HashMap<u32, i64>>,
    sent: RefCell<Vec<Sent>>,
    /// Envoy refuses every call while set.
    refuse: Cell<bool>,
}

impl SharedStore for TestHost {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        self.store.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.store.set(key, value, cas)
    }
}

impl MetricSink for TestHost {
    fn define_metric(&self, _kind: MetricKind, name: &str) -> u32 {
        let mut names = self.metrics.borrow_mut();
        names.push(name.to_string());
        names.len() as u32
    }
    fn increment_metric(&self, id: u32, by: i64) {
        *self.values.borrow_mut().entry(id).or_default() += by;
    }
    fn record_metric(&self, id: u32, value: u64) {
        self.values.borrow_mut().insert(id, value as i64);
    }
}

impl TestHost {
    fn send(&self, to: &str, headers: Vec<String>, timeout_ms: u64) -> Result<u32, String> {
        if self.refuse.get() {
            return Err("BadArgument".into());
        }
        let mut sent = self.sent.borrow_mut();
        sent.push(Sent {
            to: to.into(),
            headers,
            timeout_ms,
        });
        Ok(sent.len() as u32)
    }

    fn stat(&self, name: &str) -> i64 {
        let full = format!("prefix_router.signals.{name}");
        let id = self.metrics.borrow().iter().position(|n| *n == full);
        let id = id.expect("stat defined") as u32 + 1;
        self.values.borrow().get(&id).copied().unwrap_or(0)
    }

    fn published(&self) -> Vec<Record> {
        let (value, _) = self.store.get(KEY).unwrap();
        value
            .map(|v| crate::signals::decode(&v))
            .unwrap_or_default()
    }
}

impl HttpCalls for TestHost {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        _body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Result<u32, String> {
        let headers = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        self.send(cluster, headers, timeout_ms)
    }
}

impl BridgeCalls for TestHost {
    fn post_bridge(
        &self,
        _sync: &SyncSettings,
        _node: Option<&str>,
        _body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, String> {
        self.send("bridge", Vec::new(), timeout_ms)
    }
}

const VLLM: &str = "\
vllm:num_requests_running{model_name=\"m\"} 3.0
vllm:num_requests_waiting{model_name=\"m\"} 2.0
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5
";

const T0: u64 = 1_000_000;

/// A collector for `config`, its view holding the static pools.
fn collector(config: &str, replica: Option<&str>) -> Collector<TestHost> {
    let settings = Rc::new(Settings::from_json(config.as_bytes()).unwrap());
    let host = TestHost::default();
    let members =
        crate::fleet::static_members(&host.store, &settings.static_pools(), 1, 100).unwrap();
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
    let sent = c.host.sent.borrow().clone();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0],
        Sent {
            to: "pods".into(),
            headers: vec![
                ":method: GET".into(),
                ":path: /metrics".into(),
                ":authority: a:1".into(),
                "x-gateway-destination-endpoint: a:1".into(),
            ],
            timeout_ms: 1000,
        }
    );
    assert!(sent[1].headers.contains(&":authority: b:1".to_string()));
    // Answered: the next round waits for its interval.
    assert!(c.on_reply(1, T0 + 10, body(VLLM)));
    assert!(c.on_reply(2, T0 + 10, body(VLLM)));
    c.on_tick(T0 + 100);
    assert_eq!(c.host.sent.borrow().len(), 2);
    c.on_tick(T0 + 250);
    assert_eq!(c.host.sent.borrow().len(), 4);
    assert!(!c.on_reply(99, T0, body(VLLM)), "not its call");
}

#[test]
fn without_a_signals_cluster_a_pod_is_scraped_through_its_pools_cluster() {
    let settings = Rc::new(
        Settings::from_json(br#"{"cluster":"pods-a","signals":{"enabled":true}}"#).unwrap(),
    );
    let host = TestHost::default();
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
    let members = crate::fleet::cluster_members(&host.store, &hosts, 1, 100).unwrap();
    let view = Rc::new(RefCell::new(FleetView::new(members)));
    let mut c = Collector::new(host, settings, view, None);
    c.on_tick(T0);
    let sent = c.host.sent.borrow().clone();
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
    let published = c.host.published();
    assert_eq!(published.len(), 2);
    assert_eq!(
        (published[0].signals.waiting, published[0].signals.running),
        (2, 3)
    );
    assert_eq!((c.host.stat("scrapes"), c.host.stat("pods")), (2, 2));
}

#[test]
fn failed_scrapes_fall_back_counted_and_a_pod_is_logged_once_per_streak() {
    let mut c = collector(THROUGH_PODS, None);
    c.on_tick(T0);
    c.on_reply(1, T0 + 10, |_| Err(CallFailed::Timeout));
    c.on_reply(2, T0 + 10, body("garbage"));
    assert_eq!(c.host.stat("fallbacks"), 2);
    assert_eq!(c.failing.len(), 2);
    // Refused by Envoy: a fallback too, the pod still in one streak.
    c.host.refuse.set(true);
    c.on_tick(T0 + 250);
    assert_eq!(c.host.stat("fallbacks"), 4);
    assert_eq!(c.failing.len(), 2);
    // Read again: the streak ends.
    c.host.refuse.set(false);
    c.on_tick(T0 + 500);
    let n = c.host.sent.borrow().len() as u32;
    c.on_reply(n - 1, T0 + 510, body(VLLM));
    c.on_reply(n, T0 + 510, body(VLLM));
    assert!(c.failing.is_empty());
    assert_eq!(c.host.stat("scrapes"), 2);
}

const SHARED: &str = r#"{"endpoints":["a:1","b:1"],"signals":{"enabled":true,"cluster":"pods","share":true},"sync":{"enabled":true}}"#;

/// A share reply with no other replica: HSET, PEXPIRE, HGETALL, QUIT.
const NO_PEERS: &str = ":1\r\n:1\r\n*0\r\n+OK\r\n";

#[test]
fn a_complete_round_is_shared_at_once_through_the_bridge() {
    let mut c = collector(SHARED, Some("r1"));
    c.on_tick(T0);
    // The first exchange goes with the first tick, after the round's scrapes.
    let to: Vec<String> = c.host.sent.borrow().iter().map(|s| s.to.clone()).collect();
    assert_eq!(to, vec!["pods", "pods", "bridge"]);
    c.on_reply(1, T0 + 10, body(VLLM));
    c.on_reply(2, T0 + 10, body(VLLM));
    // The next round starts while that exchange is still in flight.
    c.on_tick(T0 + 250);
    assert_eq!(c.host.sent.borrow().len(), 5);
    assert!(c.on_reply(3, T0 + 260, body(NO_PEERS)));
    assert_eq!(c.host.stat("shared"), 1);
    c.on_reply(4, T0 + 270, body(VLLM));
    assert_eq!(c.host.sent.borrow().len(), 5, "round not complete yet");
    c.on_reply(5, T0 + 270, body(VLLM));
    // The round is complete: shared now, not at the next tick.
    let sent = c.host.sent.borrow().clone();
    assert_eq!(sent.len(), 6);
    assert_eq!(sent[5].to, "bridge");
}

#[test]
fn a_failing_exchange_is_counted_and_logged_once_per_streak() {
    let mut c = collector(SHARED, Some("r1"));
    c.on_tick(T0);
    c.on_reply(3, T0 + 5, |_| Err(CallFailed::Status(503)));
    assert_eq!(c.host.stat("share_failures"), 1);
    assert!(c.share_failing);
    c.host.refuse.set(true);
    c.on_tick(T0 + 300);
    assert_eq!(
        c.host.stat("share_failures"),
        2,
        "a refused exchange fails too"
    );
    c.host.refuse.set(false);
    c.on_tick(T0 + 600);
    let n = c.host.sent.borrow().len() as u32;
    let bridge = c.host.sent.borrow().iter().rposition(|s| s.to == "bridge");
    assert_eq!(bridge, Some(n as usize - 1));
    c.on_reply(n, T0 + 605, body(NO_PEERS));
    assert!(!c.share_failing);
    assert_eq!(c.host.stat("shared"), 1);
}

#[test]
fn sharing_needs_sync() {
    let mut c = collector(SHARED, None);
    c.on_tick(T0);
    assert!(c.host.sent.borrow().iter().all(|s| s.to == "pods"));
}
