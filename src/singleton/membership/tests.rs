//! The membership refresher under a fake clock: admin calls recorded and
//! answered by the test, shared data in a `MemStore`, stats by name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::*;
use crate::fleet::FleetView;
use crate::shared::store::{MemStore, Versioned};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A call the refresher sent: cluster, path, timeout.
type Sent = (String, String, u64);

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

impl HttpCalls for TestHost {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        _body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Result<u32, String> {
        if self.refuse.get() {
            return Err("BadArgument".into());
        }
        let path = headers.iter().find(|(k, _)| *k == ":path").unwrap().1;
        let mut sent = self.sent.borrow_mut();
        sent.push((cluster.into(), path.into(), timeout_ms));
        Ok(sent.len() as u32)
    }
}

impl TestHost {
    fn stat(&self, name: &str) -> i64 {
        let full = format!("prefix_router.membership.{name}");
        let id = self.metrics.borrow().iter().position(|n| *n == full);
        let id = id.expect("stat defined") as u32 + 1;
        self.values.borrow().get(&id).copied().unwrap_or(0)
    }

    /// The published members key: (addresses with health, cas).
    fn published(&self) -> (Vec<(String, bool)>, Option<u32>) {
        let (value, cas) = self.store.get(MEMBERS_KEY).unwrap();
        let members = value
            .map(|v| Members::decode(&v).unwrap())
            .unwrap_or_default();
        let hosts = members
            .pools
            .values()
            .flatten()
            .map(|m| (m.address.clone(), m.healthy))
            .collect();
        (hosts, cas)
    }
}

fn refresher(config: &str) -> Refresher<TestHost> {
    let settings = Rc::new(Settings::from_json(config.as_bytes()).unwrap());
    let view = Rc::new(RefCell::new(FleetView::new(Members::default())));
    Refresher::new(TestHost::default(), settings, view)
}

const CLUSTER: &str = r#"{"cluster":"pods"}"#;
const T0: u64 = 1_000_000;

/// An admin reply naming `hosts` (address, healthy) in cluster `pods`.
fn reply(hosts: &[(&str, bool)]) -> Vec<u8> {
    let statuses: Vec<String> = hosts
        .iter()
        .map(|(a, ok)| {
            let (ip, port) = a.split_once(':').unwrap();
            let health = if *ok { "HEALTHY" } else { "UNHEALTHY" };
            format!(
                r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"health_status":{{"eds_health_status":"{health}"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"cluster_statuses":[{{"name":"pods","host_statuses":[{}]}}]}}"#,
        statuses.join(",")
    )
    .into_bytes()
}

fn ok(body: Vec<u8>) -> impl FnOnce(usize) -> Result<Vec<u8>, CallFailed> {
    move |_| Ok(body)
}

#[test]
fn a_refresh_goes_at_once_then_every_refresh_ms_one_at_a_time() {
    let mut r = refresher(CLUSTER);
    r.on_tick(T0);
    assert_eq!(
        r.host.sent.borrow().clone(),
        vec![(
            "envoy_admin".to_string(),
            "/clusters?format=json&filter=%5E%28pods%29%24".to_string(),
            1_000
        )]
    );
    // Unanswered: no second call, however late.
    r.on_tick(T0 + 5_000);
    assert_eq!(r.host.sent.borrow().len(), 1);
    assert!(r.on_reply(1, T0 + 5_000, ok(reply(&[("10.0.0.1:80", true)]))));
    // Due 500 ms after the last call went.
    r.on_tick(T0 + 5_001);
    assert_eq!(r.host.sent.borrow().len(), 2);
    assert!(r.on_reply(2, T0 + 5_001, ok(reply(&[("10.0.0.1:80", true)]))));
    r.on_tick(T0 + 5_500);
    assert_eq!(r.host.sent.borrow().len(), 2);
    r.on_tick(T0 + 5_501);
    assert_eq!(r.host.sent.borrow().len(), 3);
    assert!(!r.on_reply(99, T0, ok(Vec::new())), "not its call");
}

#[test]
fn members_are_published_with_health_and_only_when_they_change() {
    let mut r = refresher(CLUSTER);
    r.on_tick(T0);
    r.on_reply(
        1,
        T0,
        ok(reply(&[("10.0.0.1:80", true), ("10.0.0.2:80", false)])),
    );
    let (hosts, cas) = r.host.published();
    assert_eq!(
        hosts,
        vec![("10.0.0.1:80".into(), true), ("10.0.0.2:80".into(), false)]
    );
    assert_eq!((r.host.stat("members"), r.host.stat("healthy")), (2, 1));
    assert_eq!(r.view.borrow().members().pools[""].len(), 2);
    // The same reply again: not rewritten.
    r.on_tick(T0 + 500);
    r.on_reply(
        2,
        T0 + 500,
        ok(reply(&[("10.0.0.1:80", true), ("10.0.0.2:80", false)])),
    );
    assert_eq!(r.host.published().1, cas);
    // Health changed: rewritten.
    r.on_tick(T0 + 1_000);
    r.on_reply(
        3,
        T0 + 1_000,
        ok(reply(&[("10.0.0.1:80", true), ("10.0.0.2:80", true)])),
    );
    let (hosts, new_cas) = r.host.published();
    assert_ne!(new_cas, cas);
    assert!(hosts.iter().all(|(_, ok)| *ok));
    assert_eq!(r.host.stat("refreshes"), 3);
}

#[test]
fn a_failed_refresh_keeps_the_last_good_members_and_counts() {
    let mut r = refresher(CLUSTER);
    r.on_tick(T0);
    r.on_reply(1, T0, ok(reply(&[("10.0.0.1:80", true)])));
    let before = r.host.published();
    // A timeout, garbage, an empty cluster, a refused call.
    r.on_tick(T0 + 500);
    r.on_reply(2, T0 + 500, |_| Err(CallFailed::Timeout));
    r.on_tick(T0 + 1_000);
    r.on_reply(3, T0 + 1_000, ok(b"not json".to_vec()));
    r.on_tick(T0 + 1_500);
    r.on_reply(4, T0 + 1_500, ok(reply(&[])));
    r.host.refuse.set(true);
    r.on_tick(T0 + 2_000);
    assert_eq!(r.host.stat("failures"), 4);
    assert_eq!(r.host.stat("refreshes"), 1);
    assert_eq!(r.host.published(), before);
    assert_eq!(r.view.borrow().members().pools[""].len(), 1);
    // The streak was logged once; a good reply ends it.
    assert!(r.failing_logged);
    r.host.refuse.set(false);
    r.on_tick(T0 + 2_500);
    r.on_reply(5, T0 + 2_500, ok(reply(&[("10.0.0.1:80", true)])));
    assert!(!r.failing_logged);
}

#[test]
fn static_pools_are_rebuilt_every_10_s_and_never_published() {
    let mut r = refresher(r#"{"endpoints":["a:1","b:1"]}"#);
    r.on_tick(T0);
    assert!(r.host.sent.borrow().is_empty(), "no admin call");
    assert_eq!(r.view.borrow().members().pools[""].len(), 2);
    assert_eq!(r.host.published(), (Vec::new(), None));
    let gets = r.host.store.op_counts().0;
    r.on_tick(T0 + STATIC_REFRESH_MS - 1);
    assert_eq!(r.host.store.op_counts().0, gets, "not rebuilt yet");
    r.on_tick(T0 + STATIC_REFRESH_MS);
    assert!(r.host.store.op_counts().0 > gets, "rebuilt");
}

#[test]
fn the_admin_filter_escapes_and_encodes_cluster_names() {
    let names = ["b.x".to_string(), "a".to_string(), "a".to_string()];
    assert_eq!(
        admin_path(names.iter()),
        "/clusters?format=json&filter=%5E%28a%7Cb%5C.x%29%24"
    );
}
