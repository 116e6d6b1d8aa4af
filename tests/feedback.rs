//! `feedback.cached_tokens` through a real Envoy in front of four podsim
//! pods with small KV caches: pods evict prefixes the table says they hold,
//! their answers say so (`usage.prompt_tokens_details.cached_tokens`), each
//! pod learns from what age its matches are evicted (its trust horizon), and
//! an older match then buys no queueing on a busier pod. Envoy runs two
//! workers: each reads the answers of its own streams, and both learn from
//! all of them through shared data.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::thread;
use std::time::Duration;

use harness::fleet::{sync_patch, Fleet};
use harness::{completion_body, send, text, wait_until, Running, Setup, CLIENT_TIMEOUT};
use serde_json::json;

/// podsim KV blocks of 16 tokens (64 bytes of text): 64 blocks hold 4 KiB.
const KV_BLOCKS: &str = "64";
/// Learning prefixes: the rotation places three on each of the four pods.
const LEARN: u64 = 12;

fn start(feedback: bool) -> Running {
    Setup::new("single.yaml")
        .concurrency(2)
        .plugin_field("feedback", json!({ "cached_tokens": feedback }))
        .pod_args(&["--time-scale", "0", "--kv-capacity-blocks", KV_BLOCKS])
        .start()
}

/// Fills `pod`'s KV cache with other prompts, sent to it directly: the
/// prefixes it held are evicted (LRU).
fn evict_on(run: &Running, pod: &str) {
    evict_at(run.pod_named(pod).port);
}

/// [`evict_on`] the pod listening on `port`.
fn evict_at(port: u16) {
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

/// A prompt of prefix `k` with tail `i`.
fn prompt(k: u64, i: u64) -> serde_json::Value {
    json!(format!(
        "{}{}",
        text(1 + k, 3000),
        text(100 + 10 * k + i, 200)
    ))
}

/// Each pod learns its horizon from its answers to old matches it had
/// evicted; then a match that old on a pod with a request in flight goes to
/// an idle pod, while with the setting off it buys the queueing.
#[test]
fn a_pod_that_evicted_old_matches_gives_them_no_queue_credit() {
    for feedback in [true, false] {
        let run = start(feedback);
        let pods: Vec<String> = (0..LEARN)
            .map(|k| run.complete(&prompt(k, 0)).expect_pod())
            .collect();
        let mut per_pod: BTreeMap<&str, u32> = BTreeMap::new();
        for p in &pods {
            *per_pod.entry(p).or_default() += 1;
        }
        // Each worker VM rotates new prefixes over the pods on its own.
        assert_eq!(per_pod.len(), 4, "new prefixes spread: {pods:?}");
        // The matches age past 2 s; meanwhile every pod evicts them.
        thread::sleep(Duration::from_millis(2100));
        for pod in per_pod.keys() {
            evict_on(&run, pod);
        }
        // Each is routed on the table's prediction (idle pods: an old match
        // still wins the tie); the pod held none of it.
        for (k, pod) in pods.iter().enumerate() {
            let stale = run.complete(&prompt(k as u64, 1));
            assert_eq!(&stale.expect_pod(), pod);
            assert!(stale.match_percent() > 80, "{stale:?}");
            let usage: serde_json::Value = serde_json::from_str(&stale.body).unwrap();
            assert_eq!(
                usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
                "the pod had evicted the prefix: {usage}"
            );
        }
        let stat = |name: &str| run.envoy.settled_router_stat(name);
        // A pod of three prefixes or more (12 over 4 pods), and one of them:
        // its three evictions may have been read by either worker VM.
        let (&pod, _) = per_pod.iter().max_by_key(|(_, &n)| n).unwrap();
        let k = pods.iter().position(|p| p == pod).unwrap() as u64;
        let port = run.pod_named(pod).port;
        let horizon = stat(&format!("prefix_router.match_trust_s.127_0_0_1_{port}"));
        if feedback {
            assert_eq!(stat("prefix_router.feedback.checked"), LEARN as i64);
            assert_eq!(
                stat("prefix_router.feedback.evictions_learned"),
                LEARN as i64
            );
            // Evicted at 2 or 3 s (whole seconds).
            assert!((2..=3).contains(&horizon), "{horizon}");
        } else {
            assert_eq!(stat("prefix_router.feedback.checked"), 0);
            assert_eq!(horizon, 0, "no gauge with the setting off");
        }
        // A request of prefix k stays in flight on its pod (a match 0 s
        // old: trusted). Then, 3 s after it was sent, prefix k again.
        let busy = run
            .envoy
            .slow_completion(completion_body(&prompt(k, 2)), 6000);
        thread::sleep(Duration::from_millis(3100));
        let old = run.complete(&prompt(k, 3));
        if feedback {
            assert_ne!(
                &old.expect_pod(),
                pod,
                "an old match bought queueing: {old:?}"
            );
            assert_eq!(old.match_percent(), 0, "{old:?}");
        } else {
            assert_eq!(
                &old.expect_pod(),
                pod,
                "a trusted match buys queueing: {old:?}"
            );
            assert!(old.match_percent() > 80, "{old:?}");
        }
        let busy = busy.join().unwrap().unwrap();
        assert_eq!(
            &busy.expect_pod(),
            pod,
            "the busy request went to the holder"
        );
    }
}

/// Two synced replicas: the answers one replica read teach the other, which
/// read none, each pod's horizon (through the replicas' `podload` reports).
#[test]
fn a_replica_learns_the_horizon_from_answers_another_replica_read() {
    let mut f = Fleet::new("feedback-sync");
    f.start_pods(&["--time-scale", "0", "--kv-capacity-blocks", KV_BLOCKS]);
    f.start_redis();
    let specs = ["a", "b"]
        .iter()
        .map(|name| {
            f.spec(name, "sync.yaml")
                .merge(sync_patch(500, json!({})))
                .merge(json!({ "feedback": { "cached_tokens": true } }))
        })
        .collect();
    f.launch_all(specs);
    let (a, b) = (&f.replicas[0].envoy, &f.replicas[1].envoy);
    let pods: Vec<String> = (0..LEARN)
        .map(|k| a.complete(&prompt(k, 0)).unwrap().expect_pod())
        .collect();
    let mut per_pod: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &pods {
        *per_pod.entry(p).or_default() += 1;
    }
    // pod-1..pod-4 listen on the fleet's ports in order.
    let port_of = |pod: &str| {
        let n: usize = pod.trim_start_matches("pod-").parse().unwrap();
        f.pod_ports[n - 1]
    };
    thread::sleep(Duration::from_millis(2100));
    for pod in per_pod.keys() {
        evict_at(port_of(pod));
    }
    for (k, pod) in pods.iter().enumerate() {
        let stale = a.complete(&prompt(k as u64, 1)).unwrap();
        assert_eq!(&stale.expect_pod(), pod);
        let usage: serde_json::Value = serde_json::from_str(&stale.body).unwrap();
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    assert_eq!(
        a.settled_router_stat("prefix_router.feedback.evictions_learned"),
        LEARN as i64
    );
    // A pod with three evictions or more: B's gauge reads A's horizon.
    let (&pod, _) = per_pod.iter().max_by_key(|(_, &n)| n).unwrap();
    let gauge = format!("prefix_router.match_trust_s.127_0_0_1_{}", port_of(pod));
    let learned = wait_until(Duration::from_secs(15), || {
        (2..=3).contains(&b.router_stat(&gauge))
    });
    assert!(
        learned,
        "B's horizon for {pod}: {} (A's {})",
        b.router_stat(&gauge),
        a.router_stat(&gauge)
    );
    assert_eq!(
        b.router_stat("prefix_router.feedback.checked"),
        0,
        "B read no answer"
    );
}
