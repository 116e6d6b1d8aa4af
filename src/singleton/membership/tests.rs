//! The membership refresher under a fake clock: admin calls recorded by the
//! singleton's double and answered by the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;

use super::*;
use crate::fleet::FleetView;
use crate::testhost::FakeEnvoy;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// The value of stat `prefix_router.membership.<name>`.
fn stat(host: &FakeEnvoy, name: &str) -> i64 {
    host.stat(&format!("prefix_router.membership.{name}"))
}

/// The published members key: (addresses with health, cas).
fn published(host: &FakeEnvoy) -> (Vec<(String, bool)>, Option<u32>) {
    let (value, cas) = host.get(MEMBERS_KEY).unwrap();
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

/// Where each call went: (cluster, path, timeout).
fn calls(host: &FakeEnvoy) -> Vec<(String, String, u64)> {
    host.sent()
        .into_iter()
        .map(|c| {
            let path = c.headers.iter().find_map(|h| h.strip_prefix(":path: "));
            (c.to.clone(), path.unwrap().to_string(), c.timeout_ms)
        })
        .collect()
}

fn refresher(config: &str) -> Refresher<FakeEnvoy> {
    let settings = Rc::new(Settings::from_json(config.as_bytes()).unwrap());
    let view = Rc::new(RefCell::new(FleetView::new(Members::default())));
    Refresher::new(FakeEnvoy::default(), settings, view)
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
        calls(&r.host),
        vec![(
            "envoy_admin".to_string(),
            "/clusters?format=json&filter=%5E%28pods%29%24".to_string(),
            1_000
        )]
    );
    // Unanswered: no second call, however late.
    r.on_tick(T0 + 5_000);
    assert_eq!(r.host.sent().len(), 1);
    assert!(r.on_reply(1, T0 + 5_000, ok(reply(&[("10.0.0.1:80", true)]))));
    // Due 500 ms after the last call went.
    r.on_tick(T0 + 5_001);
    assert_eq!(r.host.sent().len(), 2);
    assert!(r.on_reply(2, T0 + 5_001, ok(reply(&[("10.0.0.1:80", true)]))));
    r.on_tick(T0 + 5_500);
    assert_eq!(r.host.sent().len(), 2);
    r.on_tick(T0 + 5_501);
    assert_eq!(r.host.sent().len(), 3);
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
    let (hosts, cas) = published(&r.host);
    assert_eq!(
        hosts,
        vec![("10.0.0.1:80".into(), true), ("10.0.0.2:80".into(), false)]
    );
    assert_eq!((stat(&r.host, "members"), stat(&r.host, "healthy")), (2, 1));
    assert_eq!(r.view.borrow().members().pools[""].len(), 2);
    // The same reply again: not rewritten.
    r.on_tick(T0 + 500);
    r.on_reply(
        2,
        T0 + 500,
        ok(reply(&[("10.0.0.1:80", true), ("10.0.0.2:80", false)])),
    );
    assert_eq!(published(&r.host).1, cas);
    // Health changed: rewritten.
    r.on_tick(T0 + 1_000);
    r.on_reply(
        3,
        T0 + 1_000,
        ok(reply(&[("10.0.0.1:80", true), ("10.0.0.2:80", true)])),
    );
    let (hosts, new_cas) = published(&r.host);
    assert_ne!(new_cas, cas);
    assert!(hosts.iter().all(|(_, ok)| *ok));
    assert_eq!(stat(&r.host, "refreshes"), 3);
}

#[test]
fn a_failed_refresh_keeps_the_last_good_members_and_counts() {
    let mut r = refresher(CLUSTER);
    r.on_tick(T0);
    r.on_reply(1, T0, ok(reply(&[("10.0.0.1:80", true)])));
    let before = published(&r.host);
    // A timeout, garbage, an empty cluster, a refused call.
    r.on_tick(T0 + 500);
    r.on_reply(2, T0 + 500, |_| Err(CallFailed::Timeout));
    r.on_tick(T0 + 1_000);
    r.on_reply(3, T0 + 1_000, ok(b"not json".to_vec()));
    r.on_tick(T0 + 1_500);
    r.on_reply(4, T0 + 1_500, ok(reply(&[])));
    r.host.0.refuse.set(true);
    r.on_tick(T0 + 2_000);
    assert_eq!(stat(&r.host, "failures"), 4);
    assert_eq!(stat(&r.host, "refreshes"), 1);
    assert_eq!(published(&r.host), before);
    assert_eq!(r.view.borrow().members().pools[""].len(), 1);
    // The streak was logged once; a good reply ends it.
    assert!(r.failing_logged);
    r.host.0.refuse.set(false);
    r.on_tick(T0 + 2_500);
    r.on_reply(5, T0 + 2_500, ok(reply(&[("10.0.0.1:80", true)])));
    assert!(!r.failing_logged);
}

#[test]
fn static_pools_are_rebuilt_every_10_s_and_never_published() {
    let mut r = refresher(r#"{"endpoints":["a:1","b:1"]}"#);
    r.on_tick(T0);
    assert!(r.host.sent().is_empty(), "no admin call");
    assert_eq!(r.view.borrow().members().pools[""].len(), 2);
    assert_eq!(published(&r.host), (Vec::new(), None));
    let gets = r.host.0.store.op_counts().0;
    r.on_tick(T0 + STATIC_REFRESH_MS - 1);
    assert_eq!(r.host.0.store.op_counts().0, gets, "not rebuilt yet");
    r.on_tick(T0 + STATIC_REFRESH_MS);
    assert!(r.host.0.store.op_counts().0 > gets, "rebuilt");
}

#[test]
fn the_admin_filter_escapes_and_encodes_cluster_names() {
    let names = ["b.x".to_string(), "a".to_string(), "a".to_string()];
    assert_eq!(
        admin_path(names.iter()),
        "/clusters?format=json&filter=%5E%28a%7Cb%5C.x%29%24"
    );
}
