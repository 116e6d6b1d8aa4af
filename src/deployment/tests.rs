//! The deployment checks under a fake clock: shared data in a `MemStore`
//! shared by the VMs of one Envoy, the singleton's queue present or not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::*;
use crate::shared::store::{MemStore, StoreError, Versioned};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// One Envoy as the checks see it: shared data, stats by name, whether the
/// singleton registered its queue, and how often it was looked up.
#[derive(Default)]
struct TestHost {
    store: MemStore,
    metrics: RefCell<Vec<String>>,
    values: RefCell<HashMap<u32, i64>>,
    queue: Cell<Option<u32>>,
    lookups: Cell<u32>,
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
        if let Some(i) = names.iter().position(|n| n == name) {
            return i as u32 + 1;
        }
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

impl DeploymentHost for TestHost {
    fn queue_registered(&self, vm_id: &str, name: &str) -> bool {
        assert_eq!((vm_id, name), ("vm", handoff::QUEUE_NAME));
        self.lookups.set(self.lookups.get() + 1);
        self.queue.get().is_some()
    }
}

impl TestHost {
    /// A gauge's value; None if never recorded.
    fn gauge(&self, name: &str) -> Option<i64> {
        let id = self.metrics.borrow().iter().position(|n| n == name)? as u32 + 1;
        self.values.borrow().get(&id).copied()
    }
}

fn settings(json: &str) -> Settings {
    Settings::from_json(json.as_bytes()).unwrap()
}

const SYNCED: &str = r#"{"endpoints":["a:1"],"sync":{"enabled":true}}"#;
const MISSING: &str = "prefix_router.singleton_missing";
const T0: u64 = 1_000_000;

fn vm() -> String {
    "vm".into()
}

#[test]
fn a_missing_singleton_is_reported_after_the_grace_and_logged_by_one_vm() {
    let host = TestHost::default();
    let s = settings(SYNCED);
    let mut a = SingletonWatch::new(&host, T0);
    let mut b = SingletonWatch::new(&host, T0);
    a.on_tick(&host, &s, vm, T0 + CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISSING), None, "within the grace");
    a.on_tick(&host, &s, vm, T0 + SINGLETON_GRACE_MS);
    assert_eq!(host.gauge(MISSING), Some(1));
    // The first VM to see it missing takes the log; the other does not.
    let (taken, cas) = host.store.get(MISSING_LOGGED_KEY).unwrap();
    assert_eq!(taken.as_deref(), Some(b"1".as_slice()));
    b.on_tick(&host, &s, vm, T0 + SINGLETON_GRACE_MS);
    assert!(b.missing);
    assert_eq!(host.store.get(MISSING_LOGGED_KEY).unwrap().1, cas);
    // It starts: the gauge clears, and nothing is looked up again.
    host.queue.set(Some(7));
    a.on_tick(&host, &s, vm, T0 + SINGLETON_GRACE_MS + CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISSING), Some(0));
    let lookups = host.lookups.get();
    a.on_tick(&host, &s, vm, T0 + 100_000);
    assert_eq!(host.lookups.get(), lookups);
}

#[test]
fn the_singleton_is_looked_for_at_most_once_a_second() {
    let host = TestHost::default();
    let s = settings(SYNCED);
    let mut w = SingletonWatch::new(&host, T0);
    for t in (0..CHECK_EVERY_MS * 2).step_by(250) {
        w.on_tick(&host, &s, vm, T0 + t);
    }
    // At T0 and T0 + 1 s.
    assert_eq!(host.lookups.get(), 2);
}

#[test]
fn nothing_is_looked_for_when_nothing_needs_the_singleton() {
    let host = TestHost::default();
    let mut w = SingletonWatch::new(&host, T0);
    w.on_tick(&host, &settings(r#"{"endpoints":["a:1"]}"#), vm, T0);
    assert_eq!((host.lookups.get(), host.gauge(MISSING)), (0, Some(0)));
    let needs = needs_singleton(&settings(
        r#"{"cluster":"pods","signals":{"enabled":true},"sync":{"enabled":true}}"#,
    ));
    assert_eq!(needs.len(), 3, "{needs:?}");
}

const FILTER: &[u8] = br#"{"endpoints":["a:1"],"block_size":64}"#;
const MISMATCH: &str = "prefix_router.config_mismatch";

#[test]
fn a_singleton_configured_unlike_the_filter_sets_the_gauge_compared_once_per_change() {
    let host = TestHost::default();
    publish_filter_config(&host, FILTER);
    let mut w = ConfigWatch::new(&host, br#"{"endpoints":["a:1"]}"#.to_vec());
    w.on_tick(&host, vm, T0);
    assert_eq!(host.gauge(MISMATCH), Some(1));
    assert_eq!(w.logged.len(), 1);
    // Checked once a second; compared only when the filter's copy changed.
    host.values.borrow_mut().clear();
    w.on_tick(&host, vm, T0 + CHECK_EVERY_MS - 1);
    w.on_tick(&host, vm, T0 + CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISMATCH), None, "not compared again");
    // The filter now agrees (spacing aside): the gauge clears.
    publish_filter_config(&host, br#"{ "endpoints": ["a:1"] }"#);
    w.on_tick(&host, vm, T0 + 2 * CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISMATCH), Some(0));
    // The first copy again: flagged, not logged twice.
    publish_filter_config(&host, FILTER);
    w.on_tick(&host, vm, T0 + 3 * CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISMATCH), Some(1));
    assert_eq!(w.logged.len(), 1);
}

#[test]
fn the_filters_configuration_is_written_only_when_it_changed() {
    let host = TestHost::default();
    publish_filter_config(&host, FILTER);
    let (_, cas) = host.store.get(FILTER_CONFIG_KEY).unwrap();
    publish_filter_config(&host, FILTER);
    assert_eq!(host.store.get(FILTER_CONFIG_KEY).unwrap().1, cas);
    // No filter published yet: the singleton has nothing to compare.
    let empty = TestHost::default();
    let mut w = ConfigWatch::new(&empty, FILTER.to_vec());
    w.on_tick(&empty, vm, T0);
    assert_eq!(empty.gauge(MISMATCH), None);
}

#[test]
fn the_build_gauge_names_version_and_commit() {
    let host = TestHost::default();
    announce_build(&host, "test");
    let name = format!(
        "prefix_router.build.{}.{}",
        stat_segment(VERSION),
        stat_segment(commit())
    );
    assert_eq!(host.gauge(&name), Some(1));
    assert_eq!(stat_segment("1.2.3+g/x"), "1_2_3_g_x");
}
