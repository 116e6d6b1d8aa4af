//! The deployment checks under a fake clock: the VMs of one Envoy share the
//! singleton's double (shared data, stats, the singleton's queue or none).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::testhost::FakeEnvoy;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

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
    let host = FakeEnvoy::default();
    let s = settings(SYNCED);
    let mut a = SingletonWatch::new(&host, T0);
    let mut b = SingletonWatch::new(&host, T0);
    a.on_tick(&host, &s, vm, T0 + CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISSING), None, "within the grace");
    a.on_tick(&host, &s, vm, T0 + SINGLETON_GRACE_MS);
    assert_eq!(host.gauge(MISSING), Some(1));
    // The first VM to see it missing takes the log; the other does not.
    let (taken, cas) = host.get(MISSING_LOGGED_KEY).unwrap();
    assert_eq!(taken.as_deref(), Some(b"1".as_slice()));
    b.on_tick(&host, &s, vm, T0 + SINGLETON_GRACE_MS);
    assert!(b.missing);
    assert_eq!(host.get(MISSING_LOGGED_KEY).unwrap().1, cas);
    // It starts: the gauge clears, and nothing is looked up again.
    host.0.queue.set(true);
    a.on_tick(&host, &s, vm, T0 + SINGLETON_GRACE_MS + CHECK_EVERY_MS);
    assert_eq!(host.gauge(MISSING), Some(0));
    let lookups = host.0.lookups.get();
    a.on_tick(&host, &s, vm, T0 + 100_000);
    assert_eq!(host.0.lookups.get(), lookups);
}

#[test]
fn the_singleton_is_looked_for_at_most_once_a_second() {
    let host = FakeEnvoy::default();
    let s = settings(SYNCED);
    let mut w = SingletonWatch::new(&host, T0);
    for t in (0..CHECK_EVERY_MS * 2).step_by(250) {
        w.on_tick(&host, &s, vm, T0 + t);
    }
    // At T0 and T0 + 1 s.
    assert_eq!(host.0.lookups.get(), 2);
}

#[test]
fn nothing_is_looked_for_when_nothing_needs_the_singleton() {
    let host = FakeEnvoy::default();
    let mut w = SingletonWatch::new(&host, T0);
    w.on_tick(&host, &settings(r#"{"endpoints":["a:1"]}"#), vm, T0);
    assert_eq!((host.0.lookups.get(), host.gauge(MISSING)), (0, Some(0)));
    let needs = needs_singleton(&settings(
        r#"{"cluster":"pods","signals":{"enabled":true},"sync":{"enabled":true}}"#,
    ));
    assert_eq!(needs.len(), 3, "{needs:?}");
}

const FILTER: &[u8] = br#"{"endpoints":["a:1"],"block_size":64}"#;
const MISMATCH: &str = "prefix_router.config_mismatch";

#[test]
fn a_singleton_configured_unlike_the_filter_sets_the_gauge_compared_once_per_change() {
    let host = FakeEnvoy::default();
    publish_filter_config(&host, FILTER);
    let mut w = ConfigWatch::new(&host, br#"{"endpoints":["a:1"]}"#.to_vec());
    w.on_tick(&host, vm, T0);
    assert_eq!(host.gauge(MISMATCH), Some(1));
    assert_eq!(w.logged.len(), 1);
    // Checked once a second; compared only when the filter's copy changed.
    host.clear_stats();
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
    let host = FakeEnvoy::default();
    publish_filter_config(&host, FILTER);
    let (_, cas) = host.get(FILTER_CONFIG_KEY).unwrap();
    publish_filter_config(&host, FILTER);
    assert_eq!(host.get(FILTER_CONFIG_KEY).unwrap().1, cas);
    // No filter published yet: the singleton has nothing to compare.
    let empty = FakeEnvoy::default();
    let mut w = ConfigWatch::new(&empty, FILTER.to_vec());
    w.on_tick(&empty, vm, T0);
    assert_eq!(empty.gauge(MISMATCH), None);
}

#[test]
fn the_build_gauge_names_version_and_commit() {
    let host = FakeEnvoy::default();
    announce_build(&host, "test");
    let name = format!(
        "prefix_router.build.{}.{}",
        stat_segment(VERSION),
        stat_segment(commit())
    );
    assert_eq!(host.gauge(&name), Some(1));
    assert_eq!(stat_segment("1.2.3+g/x"), "1_2_3_g_x");
}
