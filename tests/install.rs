//! What a new installation shows through a real Envoy: the minimal configs
//! route by prefix (alone and synced through Redis), the build is named in
//! the log and a stat, and the two wiring mistakes the docs warn about (no
//! sync singleton; a singleton given another plugin configuration) are each
//! named in one log line and a gauge.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::time::Duration;

use harness::{
    assert_one_pod, patch_plugin_json, repo_root, shared_prefix_prompts, wait_until, Ports, Redis,
    Setup,
};
use serde_json::json;

const MISSING_LINE: &str = "no sync singleton runs with vm_id";
const MISMATCH_LINE: &str = "its plugin configuration differs from the filter's";

/// Sends 12 requests sharing a 4 KiB prefix; returns the pods that answered.
fn shared_prefix_pods(complete: impl Fn(&str) -> String) -> Vec<String> {
    shared_prefix_prompts(7, 12)
        .iter()
        .map(|p| complete(p))
        .collect()
}

fn count_lines(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn minimal_single_routes_a_shared_prefix_to_one_pod() {
    let run = Setup::new("minimal-single.yaml").start();
    let pods = shared_prefix_pods(|p| run.complete(&json!(p)).expect_pod());
    assert_one_pod(&pods, "minimal-single.yaml");
    assert!(
        run.envoy
            .router_stat_reaching("prefix_router.routed.prefix_match", 11)
            >= 11
    );
    // Nothing in this config needs the singleton: none is reported missing.
    std::thread::sleep(Duration::from_millis(3_500));
    assert_eq!(run.envoy.router_stat("prefix_router.singleton_missing"), 0);
    assert_eq!(count_lines(&run.envoy.log_text(), MISSING_LINE), 0);
}

#[test]
fn build_version_and_commit_are_logged_and_a_stat() {
    let run = Setup::new("minimal-sync.yaml").start();
    let version = env!("CARGO_PKG_VERSION");
    let head = format!("prefix_router {version} (commit ");
    let mut log = String::new();
    let seen = wait_until(Duration::from_secs(5), || {
        log = run.envoy.log_text();
        log.contains(&head)
            && log.contains("starting: sync singleton")
            && log.contains("starting: filter worker VM")
    });
    assert!(
        seen,
        "no version line from both the filter and the singleton:\n{log}"
    );
    let line = log.lines().find(|l| l.contains(&head)).unwrap();
    let commit = line.split(&head).nth(1).unwrap().split(')').next().unwrap();
    assert!(!commit.is_empty());
    let stat = format!(
        "prefix_router.build.{}.{}",
        version.replace('.', "_"),
        commit.replace(|c: char| !(c.is_ascii_alphanumeric() || c == '-'), "_")
    );
    assert_eq!(
        run.envoy.router_stat(&stat),
        1,
        "{:?}",
        run.envoy.router_stats()
    );
}

#[test]
fn minimal_sync_pushes_to_redis_with_singleton_found_and_configs_agreeing() {
    let run = Setup::new("minimal-sync.yaml").start();
    let redis = Redis::start(&run.dir, run.ports.redis, None);
    let pods = shared_prefix_pods(|p| run.complete(&json!(p)).expect_pod());
    assert_one_pod(&pods, "minimal-sync.yaml");
    let pushed = wait_until(Duration::from_secs(20), || redis.dbsize() > 0);
    assert!(pushed, "nothing reached Redis");
    // The controls of the two tests below: same config, nothing reported.
    std::thread::sleep(Duration::from_millis(3_500));
    assert_eq!(run.envoy.router_stat("prefix_router.singleton_missing"), 0);
    assert_eq!(run.envoy.router_stat("prefix_router.config_mismatch"), 0);
    let log = run.envoy.log_text();
    assert_eq!(count_lines(&log, MISSING_LINE), 0, "{log}");
    assert_eq!(count_lines(&log, MISMATCH_LINE), 0, "{log}");
}

#[test]
fn missing_singleton_is_named_once_and_counted() {
    // minimal-sync.yaml without its bootstrap wasm service, two workers.
    let run = Setup::new("minimal-sync.yaml")
        .concurrency(2)
        .edit(|text, _| {
            let start = text
                .find("bootstrap_extensions:")
                .expect("a bootstrap service");
            let end = text[start..].find("admin:").expect("admin after it") + start;
            format!("{}{}", &text[..start], &text[end..])
        })
        .start();
    // Requests still route (the table is per Envoy), nothing is pushed.
    let pods = shared_prefix_pods(|p| run.envoy.complete(&json!(p)).unwrap().expect_pod());
    assert_one_pod(&pods, "minimal-sync.yaml without its singleton");
    let mut log = String::new();
    let named = wait_until(Duration::from_secs(8), || {
        log = run.envoy.log_text();
        count_lines(&log, MISSING_LINE) > 0
    });
    assert!(named, "no line names the missing singleton:\n{log}");
    assert_eq!(run.envoy.router_stat("prefix_router.singleton_missing"), 1);
    std::thread::sleep(Duration::from_secs(2));
    let log = run.envoy.log_text();
    let line = log.lines().find(|l| l.contains(MISSING_LINE)).unwrap();
    eprintln!("{line}");
    assert_eq!(
        count_lines(&log, MISSING_LINE),
        1,
        "logged more than once:\n{log}"
    );
    for part in [
        "sync (sync.enabled)",
        "singleton: true",
        "prefix_router_sync",
        "\"prefix_router\"",
    ] {
        assert!(
            line.contains(part),
            "the line does not say {part:?}: {line}"
        );
    }
}

#[test]
fn singleton_config_mismatch_is_named_once_and_counted() {
    // The singleton gets its own copy with another block size.
    let run = Setup::new("minimal-sync.yaml").concurrency(2).edit(|text, ports: &Ports| {
        let own = json!({
            "endpoints": ports.pods.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>(),
            "sync": { "enabled": true },
            "block_size": 64,
        });
        let replacement = format!(
            "configuration: {{ \"@type\": type.googleapis.com/google.protobuf.StringValue, value: '{own}' }}"
        );
        text.replace("configuration: *plugin", &replacement)
    })
    .start();
    let mut log = String::new();
    let named = wait_until(Duration::from_secs(8), || {
        log = run.envoy.log_text();
        count_lines(&log, MISMATCH_LINE) > 0
    });
    assert!(named, "no line names the mismatch:\n{log}");
    assert_eq!(run.envoy.router_stat("prefix_router.config_mismatch"), 1);
    // More requests and ticks: still one line.
    shared_prefix_pods(|p| run.envoy.complete(&json!(p)).unwrap().expect_pod());
    std::thread::sleep(Duration::from_secs(2));
    let log = run.envoy.log_text();
    assert_eq!(
        count_lines(&log, MISMATCH_LINE),
        1,
        "logged more than once:\n{log}"
    );
    let line = log.lines().find(|l| l.contains(MISMATCH_LINE)).unwrap();
    eprintln!("{line}");
    assert!(
        line.contains("in: block_size."),
        "the line does not name block_size alone: {line}"
    );
}

/// The static half of the agreement check: every shipped config that runs
/// the singleton gives it the filter's plugin JSON (the run-time half is
/// the gauge above, for configs written elsewhere).
#[test]
fn every_shipped_singleton_gets_the_filters_plugin_json() {
    let mut checked = 0;
    for entry in fs::read_dir(repo_root().join("envoy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension() != Some(std::ffi::OsStr::new("yaml")) {
            continue;
        }
        let yaml = fs::read_to_string(&path).unwrap();
        if !yaml.contains("root_id: prefix_router_sync") {
            continue;
        }
        let mut copies = Vec::new();
        patch_plugin_json(&yaml, &mut |v| copies.push(v.clone()));
        assert!(
            !copies.is_empty(),
            "{}: no plugin JSON found",
            path.display()
        );
        assert!(
            copies.iter().all(|c| *c == copies[0]),
            "{}: the filter's and the singleton's plugin JSON differ",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} configs with a singleton");
}
