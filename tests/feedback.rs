//! `feedback.cached_tokens` through a real Envoy in front of four podsim
//! pods with small KV caches: a pod evicts a prefix the table says it holds,
//! its answer says so (`usage.prompt_tokens_details.cached_tokens`), and the
//! table forgets the pod's records past what it held.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use harness::{completion_body, send, text, Running, Setup, CLIENT_TIMEOUT};
use serde_json::json;

/// podsim KV blocks of 16 tokens (64 bytes of text): 64 blocks hold 4 KiB.
const KV_BLOCKS: &str = "64";

fn start(feedback: bool) -> Running {
    Setup::new("single.yaml")
        .plugin_field("feedback", json!({ "cached_tokens": feedback }))
        .pod_args(&["--time-scale", "0", "--kv-capacity-blocks", KV_BLOCKS])
        .start()
}

/// Fills `pod`'s KV cache with other prompts, sent to it directly (the
/// filter never sees them): the prefix it held is evicted (LRU).
fn evict_on(run: &Running, pod: &str) {
    let port = run.pod_named(pod).port;
    for i in 0..3 {
        let body = completion_body(&json!(text(9000 + i, 3000)));
        let reply = send(
            "POST",
            &format!("http://127.0.0.1:{port}/v1/completions"),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
            CLIENT_TIMEOUT,
        )
        .unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
    }
}

/// The table learns that a pod evicted a prefix from the pod's own answer:
/// the request routed on the stale prediction is answered with 0 cached
/// tokens, the pod's records past that are removed, and the next request
/// with that prefix no longer matches it. With the setting off the table
/// keeps predicting the full match.
#[test]
fn the_table_learns_an_eviction_from_the_pods_answer() {
    for feedback in [true, false] {
        let run = start(feedback);
        let prefix = text(1, 3000);
        let prompt = |i: u64| json!(format!("{prefix}{}", text(100 + i, 200)));
        let pod = run.complete(&prompt(0)).expect_pod();
        evict_on(&run, &pod);
        // Routed on the table's prediction; the pod held none of it.
        let stale = run.complete(&prompt(1));
        assert_eq!(stale.expect_pod(), pod);
        assert!(stale.match_percent() > 80, "{stale:?}");
        let usage: serde_json::Value = serde_json::from_str(&stale.body).unwrap();
        assert_eq!(
            usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
            "the pod had evicted the prefix: {usage}"
        );
        let stat = |name: &str| run.envoy.settled_router_stat(name);
        let next = run.complete(&prompt(2));
        if feedback {
            assert_eq!(stat("prefix_router.feedback.evictions_learned"), 1);
            assert!(stat("prefix_router.feedback.records_removed") > 10);
            assert_eq!(stat("prefix_router.feedback.checked"), 1);
            assert_eq!(
                next.match_percent(),
                0,
                "the table still predicts the evicted prefix: {next:?}"
            );
        } else {
            assert_eq!(stat("prefix_router.feedback.checked"), 0);
            assert!(next.match_percent() > 80, "{next:?}");
        }
    }
}
