//! Smoke runs of the benchmark harness end to end, into scratch results
//! directories; never timing:
//! - the built `prefix-bench compare` with a tiny shared-prefix workload over
//!   3 podsim pods, through round-robin Envoy and one Envoy with the filter
//!   (no peers): the JSON, SVG and table files exist and the numbers are sane;
//! - `prefix-bench compat-cost` on 2 KiB prompts: the key counts the README
//!   table shows are exact, its Redis meter agrees with Redis's own count,
//!   and an AIBrix gateway finds every compat prompt whole.
//!
//! The binary is built by `make build` (`cargo build --release -p
//! prefix-bench`); `PREFIX_BENCH_BIN` overrides where it is looked for.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use harness::{target_dir, TestDir};
use serde_json::Value;

fn bench_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PREFIX_BENCH_BIN") {
        return PathBuf::from(p);
    }
    let target = target_dir();
    [
        target.join("release/prefix-bench"),
        target.join("debug/prefix-bench"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| {
        panic!(
            "prefix-bench not built under {}: run `make build`",
            target.display()
        )
    })
}

/// Runs `prefix-bench <args> --results-dir <out>`; panics with its output
/// unless it succeeds; returns its stdout.
fn run_bench(args: &[&str], out: &Path) -> String {
    let run = Command::new(bench_bin())
        .args(args)
        .arg("--results-dir")
        .arg(out)
        .output()
        .expect("run prefix-bench");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "prefix-bench {} failed: {}\n{stdout}\n{stderr}",
        args[0],
        run.status
    );
    stdout
}

#[test]
fn compare_smoke_run_writes_sane_results() {
    let dir = TestDir::new("bench-smoke");
    let out = dir.join("results");
    #[rustfmt::skip]
    let stdout = run_bench(&[
        "compare", "--pods", "3", "--routers", "round-robin,filter",
        "--workloads", "shared-prefix", "--groups", "4",
        "--prompts-per-group", "4", "--system-tokens", "256",
        "--question-tokens", "32", "--output-tokens", "4",
        "--rate", "20", "--time-scale", "0.1", "--seed", "3",
    ], &out);

    let files: Vec<PathBuf> = std::fs::read_dir(&out)
        .expect("results dir")
        .map(|e| e.unwrap().path())
        .collect();
    let find = |ext: &str| {
        files
            .iter()
            .find(|p| p.extension().and_then(|e| e.to_str()) == Some(ext))
            .unwrap_or_else(|| panic!("no .{ext} in {files:?}"))
            .clone()
    };
    let svg = std::fs::read_to_string(find("svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let txt = std::fs::read_to_string(find("txt")).unwrap();
    assert!(
        txt.contains("round-robin") && txt.contains("filter"),
        "{txt}"
    );
    assert!(stdout.contains("hit rate"), "table printed: {stdout}");

    let json: Value = serde_json::from_str(&std::fs::read_to_string(find("json")).unwrap())
        .expect("results JSON");
    let workloads = json["workloads"].as_array().expect("workloads");
    assert_eq!(workloads.len(), 1);
    let results = workloads[0]["results"].as_array().expect("results");
    let routers: Vec<&str> = results
        .iter()
        .map(|r| r["router"].as_str().unwrap())
        .collect();
    assert_eq!(routers, ["round-robin", "filter"]);
    for r in results {
        let name = r["router"].as_str().unwrap();
        assert!(r["skipped"].is_null(), "{name} skipped: {}", r["skipped"]);
        let s = &r["stats"];
        assert_eq!(s["sent"], 16, "{name}: all 16 requests sent");
        assert_eq!(s["ok"], 16, "{name}: all answered: {}", s["error_samples"]);
        assert_eq!(s["errors"], 0, "{name}");
        let hit = s["hit_rate"].as_f64().expect("hit rate");
        assert!((0.0..=1.0).contains(&hit), "{name}: hit rate {hit}");
        let cached = s["cached_tokens"].as_u64().unwrap();
        let prompt = s["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 0 && cached <= prompt, "{name}: {cached}/{prompt}");
        // Every request streamed: a TTFT each, no later than the whole reply.
        let ttft = &s["ttft_ms"];
        assert_eq!(ttft["count"], 16, "{name}");
        assert!(ttft["p50"].as_f64().unwrap() >= 0.0);
        assert!(ttft["max"].as_f64().unwrap() <= s["latency_ms"]["max"].as_f64().unwrap());
        // Every reply named one of the 3 pods.
        let per_pod = s["per_pod"].as_object().unwrap();
        let counted: u64 = ["pod-1", "pod-2", "pod-3"]
            .iter()
            .map(|p| per_pod[*p].as_u64().unwrap())
            .sum();
        assert_eq!(counted, 16, "{name}: {per_pod:?}");
        assert_eq!(r["outcomes"].as_array().unwrap().len(), 16);
    }
    // The filter's routing counters: every request routed by the filter.
    let f = &results[1]["filter"];
    let routed = f["prefix_match"].as_i64().unwrap()
        + f["no_match"].as_i64().unwrap()
        + f["load_guard"].as_i64().unwrap();
    assert_eq!(routed, 16, "{f}");
    assert!(json["targets"].as_array().is_some_and(|t| !t.is_empty()));
}

#[test]
fn compat_cost_smoke_run_counts_keys_exactly() {
    let dir = TestDir::new("bench-smoke-compat");
    let out = dir.join("results");
    #[rustfmt::skip]
    let stdout = run_bench(&[
        "compat-cost", "--prompts", "3", "--sizes-kib", "2",
        "--steady-prompts", "2", "--steady-kib", "2", "--steady-cycles", "1",
    ], &out);
    assert!(stdout.contains("Holding the namespace"), "{stdout}");
    let file = std::fs::read_dir(&out)
        .expect("results dir")
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .expect("a JSON file");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let push = json["push"].as_array().expect("push rows");
    assert_eq!(push.len(), 2, "{push:?}");
    for row in push {
        let mode = row["mode"].as_str().unwrap();
        assert_eq!(row["quiet"], true, "{mode}: push never went quiet");
        // 2 KiB = 16 blocks of 128 (+ the change log's key, once) or 512 of 4.
        let keys = row["keys_per_prompt"].as_f64().unwrap();
        let expected = row["expected_keys"].as_f64().unwrap();
        match mode {
            "native" => assert!((16.0..=16.0 + 1.0 / 3.0 + 1e-9).contains(&keys), "{keys}"),
            "compat" => assert_eq!(keys, 512.0),
            other => panic!("mode {other}"),
        }
        assert_eq!(expected, if mode == "native" { 16.0 } else { 512.0 });
        // The relay sees what Redis processed (+ our INFO and DBSIZE; a poll
        // racing a snapshot may shift a few).
        let n = row["prompts"].as_f64().unwrap();
        let relayed = row["window"]["commands"].as_f64().unwrap() * n;
        let redis = row["redis"]["total_commands_processed"].as_f64().unwrap();
        assert!(
            (relayed + 2.0 - redis).abs() <= 4.0,
            "{mode}: {relayed} vs {redis}"
        );
        let push_commands = row["push"]["commands"].as_f64().unwrap() * n;
        assert!(push_commands >= expected * n, "{mode}: {push_commands}");
    }
    let aibrix = push[1]["aibrix_match_percent"]
        .as_array()
        .expect("compat lookups");
    assert_eq!(aibrix.len(), 3);
    assert!(
        aibrix.iter().all(|p| p.as_f64() == Some(100.0)),
        "{aibrix:?}"
    );
    let steady = json["steady"].as_array().expect("steady rows");
    assert_eq!(steady[1]["mode"], "compat");
    // 2 prompts x 512 blocks, + the podload entity.
    assert_eq!(steady[1]["keys"], 1025);
    assert!(steady[1]["per_cycle"]["commands"].as_f64().unwrap() > 0.0);
}
