//! Per-pod stats reach Prometheus with the pod as a label: every shipped
//! Envoy config tags them (`stats_config.stats_tags`), and a real Envoy's
//! `/stats/prometheus` shows `prefix_router_inflight{pod="..."}` where the
//! metric name alone used to carry the pod, and the routing and
//! pass-through counters carry their reason as `reason="..."`.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::time::Duration;

use harness::{get, repo_root, text, wait_until, Setup};
use serde_json::json;

/// The tags every shipped config carries, as docs/operations.md gives them.
const POD_TAG_REGEX: &str =
    r"'^wasmcustom\.prefix_router\.(?:inflight|slowness|match_trust_s)(\.([^.]+))$'";
const REASON_TAG_REGEX: &str = r"'^wasmcustom\.prefix_router\.(?:routed|passthrough)(\.(\w+))$'";

#[test]
fn every_shipped_config_tags_per_pod_stats_and_reasons() {
    let mut checked = Vec::new();
    for entry in fs::read_dir(repo_root().join("envoy")).expect("envoy/ dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = fs::read_to_string(&path).expect("read config");
        let name = path.display().to_string();
        assert!(
            text.contains("stats_tags:") && text.contains("tag_name: pod"),
            "{name} has no `pod` stats tag (copy the stats_config block of envoy/single.yaml)"
        );
        assert!(
            text.contains(POD_TAG_REGEX) && text.contains(REASON_TAG_REGEX),
            "{name}'s tags differ from envoy/single.yaml's"
        );
        checked.push(name);
    }
    assert!(checked.len() >= 3, "only {checked:?} in envoy/");
}

/// `/stats/prometheus` lines of metric family `family` (its sample lines,
/// not `# TYPE`).
fn prometheus_lines(admin: &str, family: &str) -> Vec<String> {
    let reply = get(&format!("{admin}/stats/prometheus")).expect("GET /stats/prometheus");
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
        .body
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} ")))
        .map(str::to_string)
        .collect()
}

#[test]
fn per_pod_gauges_carry_the_pod_as_a_prometheus_label() {
    let run = Setup::new("single.yaml").start();
    let reply = run.complete(&json!(text(7, 2048)));
    let pod = reply.expect_pod();
    let admin = run.envoy.admin_url("");
    let admin = admin.trim_end_matches('/');

    // The workers define each member's gauges on their tick (250 ms).
    let mut lines = Vec::new();
    let found = wait_until(Duration::from_secs(5), || {
        lines = prometheus_lines(admin, "prefix_router_inflight");
        lines.len() >= run.ports.pods.len()
    });
    assert!(found, "per-pod in-flight gauges in Prometheus: {lines:?}");
    for port in &run.ports.pods {
        let label = format!("pod=\"127_0_0_1_{port}\"");
        assert!(
            lines.iter().any(|l| l.contains(&label)),
            "no prefix_router_inflight{{{label}}} in {lines:?} (routed to {pod})"
        );
    }
    let slowness = prometheus_lines(admin, "prefix_router_slowness");
    assert!(
        slowness.iter().all(|l| l.contains("pod=\"127_0_0_1_")) && !slowness.is_empty(),
        "slowness gauges without a pod label: {slowness:?}"
    );

    // Routing decisions and pass-throughs carry their reason as a label.
    let routed = prometheus_lines(admin, "prefix_router_routed");
    assert!(
        routed.iter().any(|l| l.contains("reason=\"no_match\"") || l.contains("reason=\"prefix_match\"")),
        "no prefix_router_routed{{reason=...}}: {routed:?}"
    );
    let passthrough = prometheus_lines(admin, "prefix_router_passthrough");
    assert!(
        passthrough.iter().all(|l| l.contains("reason=\"")),
        "pass-throughs without a reason label: {passthrough:?}"
    );

    // The pod is no longer part of any metric's name.
    let all = get(&format!("{admin}/stats/prometheus")).expect("GET /stats/prometheus");
    let encoded = format!("_127_0_0_1_{}", run.ports.pods[0]);
    let named: Vec<&str> = all
        .body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next().is_some_and(|n| n.contains(&encoded)))
        .collect();
    assert!(named.is_empty(), "metric names still carry the pod: {named:?}");

    // `/stats` keeps the full names the tests and docs/CONTRACTS.md use.
    assert!(
        run.envoy
            .router_stats()
            .keys()
            .any(|k| k.starts_with("prefix_router.inflight.127_0_0_1_")),
        "/stats lost the full per-pod names"
    );
}
