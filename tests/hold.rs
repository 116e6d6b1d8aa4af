//! `hold` through a real Envoy in front of podsim pods whose prefill is
//! slow: a request for a prefix its pod is still computing waits for that
//! prefill's first answer bytes, then hits on the same pod. Without hold it
//! goes to the same pod at once and computes the whole prefix again (podsim,
//! like vLLM, caches a prompt's blocks only once they are computed).

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::thread;
use std::time::Duration;

use harness::{completion_body, text, Reply, Running, Setup};
use serde_json::json;

fn setup(hold: bool) -> Setup {
    Setup::new("single.yaml")
        .plugin_field("hold", json!({ "enabled": hold, "max_ms": 20_000 }))
        // 3,000 bytes of prompt are ~750 podsim tokens: ~1.5 s of prefill,
        // so the second request surely arrives while the first computes.
        .pod_args(&["--prefill-us-per-token", "2000"])
}

fn start(hold: bool) -> Running {
    setup(hold).start()
}

/// Sends a streamed request with a new 3,000-byte prefix and, while its
/// prefill runs, a second request with the same prefix and another
/// question on a new connection. Returns (first, second).
fn first_then_second(run: &Running) -> (Reply, Reply) {
    let prefix = text(1, 3000);
    let first = json!({
        "model": "test-model",
        "prompt": format!("{prefix}{}", text(2, 100)),
        "max_tokens": 8,
        "stream": true,
    })
    .to_string();
    let envoy_url = run.envoy.url("/v1/completions");
    let streamed = thread::spawn(move || {
        harness::send(
            "POST",
            &envoy_url,
            &[("content-type", "application/json")],
            Some(first.as_bytes()),
            harness::CLIENT_TIMEOUT,
        )
        .unwrap()
    });
    // The first is routed (its blocks are in the table) before the second
    // is sent; its prefill has ~1.5 s to go.
    run.envoy
        .router_stat_within("prefix_router.routed.no_match", 1, Duration::from_secs(10));
    thread::sleep(Duration::from_millis(100));
    let second = run.post(
        "/v1/completions",
        &completion_body(&json!(format!("{prefix}{}", text(3, 100)))),
    );
    let first = streamed.join().unwrap();
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(second.expect_pod(), first.expect_pod());
    assert!(second.match_percent() > 80, "{second:?}");
    (first, second)
}

#[test]
fn a_request_for_a_prefix_in_prefill_waits_for_it_and_hits() {
    for hold in [true, false] {
        let run = start(hold);
        let (_, second) = first_then_second(&run);
        let stat = |name: &str| run.envoy.settled_router_stat(name);
        let cached = second.cached_tokens();
        if hold {
            assert!(cached >= 700, "held for the prefill, then a hit: {cached}");
            assert_eq!(stat("prefix_router.hold.held"), 1);
            assert_eq!(stat("prefix_router.hold.answered"), 1);
            assert_eq!(stat("prefix_router.hold.timed_out"), 0);
        } else {
            assert_eq!(cached, 0, "sent during the prefill: computed again");
            assert_eq!(stat("prefix_router.hold.held"), 0);
        }
    }
}

/// Two Envoy worker threads, connections balanced exactly (the second
/// request's connection goes to the worker without one): the second request
/// waits in its worker VM for the other VM's prefill, listed in shared
/// data, and its VM's tick resumes it once that prefill answered.
#[test]
fn a_request_waits_for_another_worker_vms_prefill() {
    let run = setup(true)
        .concurrency(2)
        .edit_yaml(
            "      # Prompts of several hundred KB",
            "      connection_balance_config: { exact_balance: {} }\n      # Prompts of several hundred KB",
        )
        .start();
    // Each worker VM sees the other on its tick (250 ms): a few ticks.
    thread::sleep(Duration::from_millis(1500));
    let (_, second) = first_then_second(&run);
    let stat = |name: &str| run.envoy.settled_router_stat(name);
    let cached = second.cached_tokens();
    assert!(
        cached >= 700,
        "held for the other VM's prefill, then a hit: {cached}"
    );
    assert_eq!(stat("prefix_router.hold.held_other_vm"), 1);
    assert_eq!(stat("prefix_router.hold.answered"), 1);
    assert_eq!(stat("prefix_router.hold.timed_out"), 0);
    assert_eq!(stat("prefix_router.hold.share_failed"), 0);
}
