//! The load side of routing through a real Envoy: the load guard moves a hot
//! prefix off a busy pod, and the per-pod in-flight gauges return to zero
//! whatever way a request ends.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::thread;
use std::time::Duration;

use harness::{completion_body, send, text, wait_until, Running, Setup, STATS_FLUSH};
use serde_json::json;

fn total_inflight(run: &Running) -> i64 {
    run.envoy.inflight().values().sum()
}

#[test]
fn load_guard_moves_traffic_from_busy_pod() {
    // AIBrix's imbalance guard (`policy.mode: aibrix`): once it fires, every
    // request goes to the least loaded pod, counted as `load_guard`. (The
    // load-aware policy sends a request to another pod that holds the
    // prefix, as a match: tests/signals.rs.)
    let run = Setup::new("single.yaml")
        .plugin_field("policy", json!({"mode": "aibrix"}))
        .plugin_field("imbalance_abs_count", json!(2))
        .start();
    let prefix = text(50, 4096);
    let body = |i: u64| completion_body(&json!(format!("{prefix}{}", text(5000 + i, 200))));
    let hot = run.post("/v1/completions", &body(0)).expect_pod();
    let hot_port = run.pod_named(&hot).port;
    let guard_before = run
        .envoy
        .settled_router_stat("prefix_router.routed.load_guard");

    // Pile slow requests for the hot prefix on until the guard sends one elsewhere.
    let mut holders = Vec::new();
    let mut guarded = false;
    for i in 1..=8 {
        holders.push(run.envoy.slow_completion(body(i), 10_000));
        let landed = wait_until(Duration::from_secs(5), || total_inflight(&run) >= i as i64);
        assert!(
            landed,
            "slow request {i} never showed in the in-flight gauges"
        );
        // A decision reaches the stats on the next tick of its worker.
        let guard = run.envoy.router_stat_within(
            "prefix_router.routed.load_guard",
            guard_before + 1,
            STATS_FLUSH * 3,
        );
        if guard > guard_before {
            guarded = true;
            break;
        }
    }
    assert!(
        guarded,
        "load guard never fired: {:?}",
        run.envoy.router_stats()
    );
    assert!(
        run.envoy.inflight_of(hot_port) >= 2,
        "{:?}",
        run.envoy.inflight()
    );

    // While the hot pod is busy, the next request for its prefix goes elsewhere.
    let guard_mid = run
        .envoy
        .settled_router_stat("prefix_router.routed.load_guard");
    let probe = run.post("/v1/completions", &body(100));
    assert_ne!(
        probe.expect_pod(),
        hot,
        "busy pod still took the hot prefix"
    );
    assert!(
        run.envoy
            .router_stat_reaching("prefix_router.routed.load_guard", guard_mid + 1)
            > guard_mid
    );

    for holder in holders {
        let reply = holder.join().expect("holder thread");
        assert_eq!(reply.expect("slow request").status, 200);
    }
}

#[test]
fn inflight_counters_return_to_zero() {
    // A short route timeout, so one outcome is Envoy's 504. (A per-request
    // `x-envoy-upstream-rq-timeout-ms` is sanitized away: Envoy 1.40 ignored
    // it from a loopback client here, with or without use_remote_address.)
    let mut run = Setup::new("single.yaml")
        .edit_yaml(" timeout: 600s", " timeout: 3s") // the route, not stream_idle_timeout
        .start();
    let body = |seed: u64| completion_body(&json!(text(seed, 1024)));

    // Completed.
    for i in 0..5 {
        run.post("/v1/completions", &body(7000 + i)).expect_pod();
    }

    // Routed, then refused by the pod (podsim rejects a bad delay header).
    for i in 0..2 {
        let reply = run.post_with(
            "/v1/completions",
            &body(7050 + i),
            &[("x-sim-delay-ms", "soon")],
        );
        assert_eq!(reply.status, 400, "{reply:?}");
    }

    // Client gives up before the pod answers (downstream reset).
    let url = run.envoy.url("/v1/completions");
    for i in 0..3 {
        let headers = [
            ("content-type", "application/json"),
            ("x-sim-delay-ms", "3000"),
        ];
        let b = body(7100 + i);
        let result = send(
            "POST",
            &url,
            &headers,
            Some(b.as_bytes()),
            Duration::from_millis(300),
        );
        assert!(result.is_err(), "client timeout did not fire: {result:?}");
    }

    // Envoy's route timeout fires (504).
    let timed_out = run.post_with(
        "/v1/completions",
        &body(7200),
        &[("x-sim-delay-ms", "5000")],
    );
    assert_eq!(timed_out.status, 504, "{timed_out:?}");

    // A pod dies with requests in flight (upstream reset), then refuses connections.
    // (The gauges are set on the workers' tick: let the last releases show.)
    thread::sleep(STATS_FLUSH * 3);
    let before: i64 = total_inflight(&run);
    let gauges_before = run.envoy.inflight();
    let slow: Vec<_> = (0..4)
        .map(|i| run.envoy.slow_completion(body(7300 + i), 2500))
        .collect();
    let landed = wait_until(Duration::from_secs(5), || {
        total_inflight(&run) >= before + 4
    });
    assert!(
        landed,
        "slow requests not in flight: {:?}",
        run.envoy.inflight()
    );
    let busy_port = run
        .envoy
        .inflight()
        .into_iter()
        .find(|(name, v)| *v > gauges_before.get(name).copied().unwrap_or(0))
        .and_then(|(name, _)| name.rsplit('_').next()?.parse::<u16>().ok())
        .expect("a pod with a slow request");
    let victim = run
        .pods
        .iter()
        .position(|p| p.port == busy_port)
        .expect("pod for the busy port");
    run.pods[victim].kill();
    for i in 0..8 {
        // Whatever lands on the dead pod gets a 503; others a 200.
        let reply = run.post("/v1/completions", &body(7400 + i));
        assert!(matches!(reply.status, 200 | 503), "{reply:?}");
    }
    let statuses: Vec<u16> = slow
        .into_iter()
        .map(|h| {
            h.join()
                .expect("slow thread")
                .map(|r| r.status)
                .unwrap_or(0)
        })
        .collect();
    assert!(
        statuses.iter().any(|&s| s != 200),
        "no slow request failed: {statuses:?}"
    );

    let gauges = run.wait_inflight_zero(Duration::from_secs(15));
    assert!(gauges.len() >= 4, "missing in-flight gauges: {gauges:?}");
    assert!(
        gauges.values().all(|&v| v == 0),
        "in-flight gauges stuck: {gauges:?}"
    );
}
