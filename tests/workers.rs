//! With two Envoy workers, the prefix table is one table: what one worker
//! learns routes on the other, and concurrent writers lose no update.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::thread;

use harness::{completion_body, send, text, Running, Setup, CLIENT_TIMEOUT};
use serde_json::json;

/// Downstream connections accepted so far, per worker thread.
fn connections_per_worker(run: &Running) -> BTreeMap<String, i64> {
    let filter = format!(r"^listener\.127\.0\.0\.1_{}\.worker_", run.ports.listener);
    run.envoy
        .stats_matching(&filter)
        .into_iter()
        .filter(|(k, _)| k.ends_with(".downstream_cx_total"))
        .collect()
}

#[test]
fn prefix_learned_on_one_worker_routes_on_other() {
    let run = Setup::new("single.yaml").concurrency(2).start();
    let prefix = text(80, 4096);
    let first = run
        .complete(&json!(format!("{prefix}{}", text(8000, 200))))
        .expect_pod();
    let before = connections_per_worker(&run);
    assert_eq!(before.len(), 2, "expected two workers: {before:?}");

    // Each request opens a new connection; the kernel spreads them over the
    // workers' sockets. Once both workers served follow-ups, at least one of
    // them was not the worker that learned the prefix.
    let mut both_served = false;
    for i in 0..200 {
        let reply = run.complete(&json!(format!("{prefix}{}", text(8001 + i, 200))));
        assert_eq!(
            reply.expect_pod(),
            first,
            "follow-up {i} left the prefix's pod"
        );
        assert!(reply.match_percent() > 0, "follow-up {i}: {reply:?}");
        let now = connections_per_worker(&run);
        if i >= 10
            && now
                .iter()
                .all(|(k, v)| *v > before.get(k).copied().unwrap_or(0))
        {
            both_served = true;
            break;
        }
    }
    assert!(
        both_served,
        "one worker took every connection: {:?}",
        connections_per_worker(&run)
    );
}

#[test]
fn concurrent_writers_lose_no_update() {
    let run = Setup::new("single.yaml").concurrency(2).start();
    const PER_THREAD: u64 = 40;
    let url = run.envoy.url("/v1/completions");
    // Under dense_prefix_blocks * block_size, so every block is recorded.
    let prompt = |t: u64, i: u64| text(90_000 + t * 1000 + i, 3000);
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let url = url.clone();
            thread::spawn(move || {
                (0..PER_THREAD)
                    .map(|i| {
                        let body = completion_body(&json!(prompt(t, i)));
                        let headers = [("content-type", "application/json")];
                        let reply = send(
                            "POST",
                            &url,
                            &headers,
                            Some(body.as_bytes()),
                            CLIENT_TIMEOUT,
                        )
                        .expect("writer request");
                        (i, reply.expect_pod())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let learned: Vec<(u64, u64, String)> = writers
        .into_iter()
        .enumerate()
        .flat_map(|(t, h)| {
            h.join()
                .expect("writer thread")
                .into_iter()
                .map(move |(i, pod)| (t as u64, i, pod))
        })
        .collect();

    for (t, i, pod) in learned {
        let reply = run.complete(&json!(prompt(t, i)));
        assert_eq!(reply.match_percent(), 100, "prompt {t}/{i} lost: {reply:?}");
        assert_eq!(reply.expect_pod(), pod, "prompt {t}/{i} moved");
    }
    assert_eq!(
        run.envoy
            .settled_router_stat("prefix_router.table.cas_exhausted"),
        0
    );
}
