//! Every shipped Envoy config validates, a bad plugin configuration stops
//! Envoy at startup with a log line naming the field, and the benchmark
//! baselines (no filter; the reference filter) serve.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

use harness::{envoy_bin, repo_root, text, with_module_paths, Setup, TestDir};
use serde_json::json;

#[test]
fn every_envoy_config_validates() {
    let dir = TestDir::new("validate");
    let mut checked = 0;
    let mut entries: Vec<_> = fs::read_dir(repo_root().join("envoy"))
        .expect("envoy/ dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    entries.sort();
    for path in entries {
        // As shipped, except the module paths (the target dir may be elsewhere).
        let text = with_module_paths(&fs::read_to_string(&path).expect("read config"));
        let name = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .to_string();
        let rendered = dir.join(&name);
        fs::write(&rendered, text).expect("write config");
        let out = Command::new(envoy_bin())
            .current_dir(repo_root())
            .args(["--mode", "validate", "-c"])
            .arg(&rendered)
            .output()
            .expect("run envoy --mode validate");
        assert!(
            out.status.success(),
            "{name} does not validate:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} configs in envoy/");
}

fn refuses_to_start(setup: Setup, field: &str) {
    let (_dir, result) = setup.start_envoy_only();
    let err = match result {
        Ok(_) => panic!("envoy started with a bad `{field}`"),
        Err(e) => e,
    };
    assert!(
        err.log.lines().any(|l| l.contains(field)),
        "no log line names `{field}`: {err}"
    );
}

#[test]
fn unknown_plugin_field_refuses_to_start() {
    refuses_to_start(
        Setup::new("single.yaml").plugin_field("no_such_knob", json!(1)),
        "no_such_knob",
    );
}

#[test]
fn zero_hash_tags_refuses_to_start() {
    refuses_to_start(
        Setup::new("cluster.yaml").patch(|config| config["sync"]["hash_tags"] = json!(0)),
        "sync.hash_tags",
    );
}

#[test]
fn zero_block_size_refuses_to_start() {
    refuses_to_start(
        Setup::new("single.yaml").plugin_field("block_size", json!(0)),
        "block_size",
    );
}

#[test]
fn plain_config_serves_round_robin() {
    let run = Setup::new("plain.yaml").start();
    let mut pods = BTreeSet::new();
    for i in 0..8 {
        pods.insert(run.complete(&json!(text(i, 512))).expect_pod());
    }
    assert!(pods.len() >= 3, "round robin used only {pods:?}");
}

/// The benchmark's floor (`prefix-bench overhead`) must do what it claims:
/// buffer the body and name a pod drawn from its list, which `override_host`
/// then obeys. The draw is the module's xorshift64 from its fixed seed, so
/// with one worker the pods answering are known in advance.
#[test]
fn reference_config_sends_each_request_to_the_pod_it_draws() {
    let run = Setup::new("reference.yaml").start();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut expected = Vec::new();
    let mut answered = Vec::new();
    for i in 0..16 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        expected.push(format!("pod-{}", state % 4 + 1));
        answered.push(run.complete(&json!(text(i, 512))).expect_pod());
    }
    assert_eq!(answered, expected);
    let distinct: BTreeSet<_> = answered.iter().collect();
    assert!(distinct.len() >= 3, "the draw used only {distinct:?}");
}
