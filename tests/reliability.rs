//! A worker VM that traps, under Envoy's failure policies (issue 9). The
//! filter never panics on purpose; a bug still could, so the fault-injection
//! build (`make build` puts it under `target/fault/`) traps the worker VM on a
//! request carrying `x-prefix-router-fault: trap`. One worker
//! (`--concurrency 1`), so the trap hits the VM that routes everything.
//!
//! - `FAIL_OPEN` (the shipped configs): later requests bypass the filter and
//!   are served round robin; none fails.
//! - `FAIL_RELOAD`: the trapping request and the one in flight in the dead
//!   VM get 503, so does every request while Envoy backs off from reloading
//!   (counted in its `wasm.<plugin>.vm_reload_backoff`), then one fresh VM
//!   is loaded (`vm_reload_success`) and the filter routes again; the dead
//!   VM's in-flight count does not stay stuck on its pod (it stops counting
//!   once its key is stale).
//!
//! Both tests first check, from Envoy's log, that the VM did trap, once: a
//! module that does not trap fails them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use harness::{completion_body, target_dir, text, wait_until, Reply, Running, Setup, STATS_FLUSH};
use serde_json::json;

/// The fault-injection build of the filter.
fn fault_module() -> PathBuf {
    let wasm = target_dir().join("fault/wasm32-wasip1/release/envoy_prefix_router.wasm");
    assert!(
        wasm.is_file(),
        "{} missing: run `make build` (it builds the fault-injection module)",
        wasm.display()
    );
    wasm
}

/// single.yaml on the fault-injection module, one worker, `policy`.
fn start(policy: &'static str) -> Running {
    Setup::new("single.yaml")
        .concurrency(1)
        .module(fault_module())
        .edit_yaml("failure_policy: FAIL_OPEN", policy)
        .start()
}

fn body(seed: u64) -> String {
    completion_body(&json!(format!("{}{}", text(77, 2048), text(seed, 64))))
}

fn trap(run: &Running) -> Reply {
    run.post_with(
        "/v1/completions",
        &body(1),
        &[("x-prefix-router-fault", "trap")],
    )
}

/// What V8 logs when the filter's request-headers callback traps on the
/// fault build's `unreachable`.
const TRAP_LOG: &str =
    "Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable";

/// Checks that the worker VM trapped exactly once (Envoy logs every trap),
/// and that the trapping request got a 503.
fn assert_trapped_once(run: &Running, trapped: &Reply) {
    let log = wait_for_log(run, TRAP_LOG);
    assert_eq!(
        log.matches(TRAP_LOG).count(),
        1,
        "the VM did not trap exactly once:\n{}",
        harness::tail(&run.envoy.log, 20)
    );
    assert_eq!(trapped.status, 503, "the trapping request: {trapped:?}");
}

/// Envoy's log once it holds `line` (it flushes every 100 ms), or as it is
/// after a few seconds.
fn wait_for_log(run: &Running, line: &str) -> String {
    let mut log = String::new();
    wait_until(Duration::from_secs(5), || {
        log = run.envoy.log_text();
        log.contains(line)
    });
    log
}

/// Envoy's own counter `wasm.prefix_router.<name>` (the filter's plugin).
fn plugin_stat(run: &Running, name: &str) -> i64 {
    let full = format!("wasm.prefix_router.{name}");
    run.envoy
        .stats_matching(&format!("^{}$", full.replace('.', r"\.")))
        .get(&full)
        .copied()
        .unwrap_or_else(|| panic!("Envoy has no stat {full}"))
}

/// Whether the filter routed the reply (it sets the match header).
fn routed(r: &Reply) -> bool {
    r.header("x-prefix-match").is_some()
}

#[test]
fn a_trapped_vm_under_fail_open_fails_no_later_request() {
    let run = start("failure_policy: FAIL_OPEN");
    for i in 0..5 {
        let r = run.post("/v1/completions", &body(100 + i));
        r.expect_pod();
        assert!(routed(&r), "routed before the trap: {r:?}");
    }
    let trapped = trap(&run);
    let mut failed = 0;
    let mut routed_after = 0;
    for i in 0..30 {
        let r = run.post("/v1/completions", &body(200 + i));
        failed += usize::from(r.status != 200);
        routed_after += usize::from(routed(&r));
    }
    eprintln!(
        "FAIL_OPEN: the trapping request got {}; after it, 30 requests: {failed} failed, \
         {routed_after} routed by the filter",
        trapped.status
    );
    assert_trapped_once(&run, &trapped);
    // The VM is gone (nothing is routed any more), and nothing fails.
    assert_eq!(routed_after, 0, "a VM still routes after the trap");
    assert_eq!(failed, 0, "requests failed after the VM trapped");
}

#[test]
fn a_trapped_vm_under_fail_reload_comes_back_and_leaves_no_stuck_count() {
    let run = start("failure_policy: FAIL_RELOAD");
    for i in 0..5 {
        assert!(routed(&run.post("/v1/completions", &body(300 + i))));
    }
    // One request in flight on the VM that is about to die: its release
    // never runs.
    let slow = run.envoy.slow_completion(body(400), 4000);
    let counted = wait_until(Duration::from_secs(5), || {
        run.envoy.inflight().values().sum::<i64>() == 1
    });
    assert!(
        counted,
        "slow request not counted: {:?}",
        run.envoy.inflight()
    );

    let trapped = trap(&run);
    let t0 = Instant::now();
    let (mut sent, mut failed) = (0u64, 0i64);
    let mut other = Vec::new();
    let mut back = None;
    // A safety timeout only: Envoy reloads after its own backoff.
    while t0.elapsed() < Duration::from_secs(30) {
        let r = run.post("/v1/completions", &body(500 + sent));
        sent += 1;
        if r.status == 200 && routed(&r) {
            back = Some(t0.elapsed());
            break;
        }
        if r.status == 503 {
            failed += 1;
        } else {
            other.push(r.status);
        }
        thread::sleep(Duration::from_millis(50));
    }
    let back = back.unwrap_or_else(|| panic!("the filter never routed again: {sent} sent"));
    assert_trapped_once(&run, &trapped);
    // Until the fresh VM routes, Envoy refuses what arrives while it backs
    // off from reloading: each such request a 503, each counted; then it
    // loads one fresh VM.
    assert!(
        other.is_empty(),
        "before the filter routed again, replies neither 503 nor routed: {other:?}"
    );
    assert_eq!(
        failed,
        plugin_stat(&run, "vm_reload_backoff"),
        "503s before the filter routed again vs Envoy's reload backoffs"
    );
    assert_eq!(
        plugin_stat(&run, "vm_reload_success"),
        1,
        "fresh VMs loaded"
    );
    assert_eq!(plugin_stat(&run, "vm_reload_failure"), 0, "failed reloads");
    // The slow request ends (its stream lived in the dead VM), then the dead
    // VM's published count goes stale: no pod looks loaded for good.
    let slow = slow.join().expect("slow request thread");
    // Its stream lived in the VM that trapped: Envoy fails it too.
    assert_eq!(
        slow.as_ref().map(|r| r.status),
        Ok(503),
        "the request in flight in the dead VM"
    );
    let t1 = Instant::now();
    let stale = Duration::from_millis(envoy_prefix_router::route::load::VM_STALE_MS);
    let mut gauges = run.envoy.inflight();
    let cleared = wait_until(stale + STATS_FLUSH * 8, || {
        gauges = run.envoy.inflight();
        gauges.values().all(|&v| v == 0)
    });
    eprintln!(
        "FAIL_RELOAD: the trapping request got {}; {failed} of {sent} requests failed until the \
         filter routed again {:.2} s after the trap; the slow request in the dead VM got {:?}; \
         in-flight gauges back to 0 {:.1} s after it ended",
        trapped.status,
        back.as_secs_f64(),
        slow.as_ref().map(|r| r.status),
        t1.elapsed().as_secs_f64()
    );
    assert!(
        cleared,
        "in-flight count stuck after the VM died: {gauges:?}"
    );
}
