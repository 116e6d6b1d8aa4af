//! Per-pod stats reach Prometheus with the pod as a label: every shipped
//! Envoy config tags them (`stats_config.stats_tags`), and a real Envoy's
//! `/stats/prometheus` shows `prefix_router_inflight{pod="..."}` where the
//! metric name alone used to carry the pod. The alert rules and the
//! dashboard in deploy/monitoring parse and name only metrics a real Envoy
//! exports.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::time::Duration;

use harness::{get, repo_root, text, wait_until, Setup};
use serde_json::json;

/// The tag every shipped config carries, as docs/operations.md gives it.
const POD_TAG_REGEX: &str = r"'^wasmcustom\.prefix_router\.(?:inflight|slowness)(\.([^.]+))$'";

#[test]
fn every_shipped_config_tags_per_pod_stats_with_the_pod() {
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
            text.contains(POD_TAG_REGEX),
            "{name}'s pod tag differs from envoy/single.yaml's"
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

    // The pod is no longer part of any metric's name.
    let all = get(&format!("{admin}/stats/prometheus")).expect("GET /stats/prometheus");
    let encoded = format!("_127_0_0_1_{}", run.ports.pods[0]);
    let named: Vec<&str> = all
        .body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' '])
                .next()
                .is_some_and(|n| n.contains(&encoded))
        })
        .collect();
    assert!(
        named.is_empty(),
        "metric names still carry the pod: {named:?}"
    );

    // `/stats` keeps the full names the tests and docs/CONTRACTS.md use.
    assert!(
        run.envoy
            .router_stats()
            .keys()
            .any(|k| k.starts_with("prefix_router.inflight.127_0_0_1_")),
        "/stats lost the full per-pod names"
    );
}

/// Metric families a running Envoy exports, from the `# TYPE`
/// lines of its `/stats/prometheus`.
fn exported_families(run: &harness::Running) -> std::collections::BTreeSet<String> {
    let admin = run.envoy.admin_url("/stats/prometheus");
    let reply = get(&admin).expect("GET /stats/prometheus");
    reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every `prefix_router_*` metric name in `text`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("prefix_router_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// promtool, where this machine has it (`.tools/bin/promtool`, from
/// Debian's `prometheus` package, or on PATH).
fn promtool() -> Option<std::path::PathBuf> {
    let local = repo_root().join(".tools/bin/promtool");
    if local.is_file() {
        return Some(local);
    }
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    found.then(|| "promtool".into())
}

/// The alert rules as JSON, read by the .venv's PyYAML (`make setup`
/// installs it); None when it cannot read them.
fn alert_rules_json(path: &std::path::Path) -> Option<serde_json::Value> {
    let out = std::process::Command::new(repo_root().join(".venv/bin/python"))
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(path)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "python3 could not read {} as YAML: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("yaml.safe_load output is JSON"))
}

#[test]
fn monitoring_rules_and_dashboard_parse_and_name_only_exported_metrics() {
    let dir = repo_root().join("deploy/monitoring");
    let rules_path = dir.join("alerts.yaml");
    let rules_text = fs::read_to_string(&rules_path).expect("read alerts.yaml");
    let dashboard_text =
        fs::read_to_string(dir.join("dashboard.json")).expect("read dashboard.json");

    // The dashboard: JSON, every panel with a query.
    let dashboard: serde_json::Value =
        serde_json::from_str(&dashboard_text).expect("dashboard.json is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queries = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let targets = panel["targets"].as_array().map(Vec::len).unwrap_or(0);
        assert!(targets > 0, "panel {} has no query", panel["title"]);
        for t in panel["targets"].as_array().into_iter().flatten() {
            assert!(
                t["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains("prefix_router_")),
                "panel {}: {t}",
                panel["title"]
            );
            queries += 1;
        }
    }
    assert!(queries >= 20, "only {queries} queries in the dashboard");

    // The rules: promtool's check and its unit tests (`make setup` takes
    // promtool out of Debian's prometheus package into .tools/bin).
    let promtool = promtool().expect("promtool: run `make setup` (scripts/setup.sh installs it)");
    for args in [
        vec!["check", "rules", "alerts.yaml"],
        vec!["test", "rules", "alerts_test.yaml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .current_dir(&dir)
            .args(&args)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    match alert_rules_json(&rules_path) {
        Some(rules) => {
            let mut alerts = 0;
            for group in rules["groups"].as_array().expect("groups") {
                for rule in group["rules"].as_array().expect("rules") {
                    let name = rule["alert"].as_str().expect("every rule is an alert");
                    assert!(rule["expr"].as_str().is_some(), "{name}: no expr");
                    assert!(
                        rule["labels"]["severity"].as_str().is_some(),
                        "{name}: no severity"
                    );
                    assert!(
                        rule["annotations"]["summary"].as_str().is_some(),
                        "{name}: no summary"
                    );
                    alerts += 1;
                }
            }
            assert!(alerts >= 8, "only {alerts} alerts");
        }
        None => panic!("alerts.yaml not parsed (.venv's PyYAML: run `make setup`)"),
    }

    // Every metric they name is one a real Envoy exports with the shipped
    // sync config (the singleton defines the sync stats without Redis up).
    let run = Setup::new("sync.yaml").start();
    let reply = run.complete(&json!(text(11, 2048)));
    reply.expect_pod();
    let mut exported = Default::default();
    wait_until(Duration::from_secs(5), || {
        exported = exported_families(&run);
        exported.contains("prefix_router_inflight")
            && exported.contains("prefix_router_sync_last_success_age_s")
    });
    for (file, text) in [
        ("alerts.yaml", &rules_text),
        ("dashboard.json", &dashboard_text),
    ] {
        for name in metric_names(text) {
            // `{__name__=~"prefix_router_routed_.+"}`: a prefix of families.
            if name.ends_with('_') {
                assert!(
                    exported.iter().any(|e| e.starts_with(&name)),
                    "{file} matches {name}.+, which no exported metric does"
                );
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(*b)))
                .unwrap_or(&name);
            assert!(
                exported.contains(family),
                "{file} names {name}, which Envoy does not export (exported: {exported:?})"
            );
        }
    }
}
