//! `sync.place_new` through two real Envoy replicas, a real `redis-server`
//! and four podsim pods: each new prompt is placed by one Redis script over
//! both replicas' placed requests, so a replica sends a new prompt to the
//! pod the other replica left free, before any sync could tell it; ended
//! requests leave Redis on the tick; a dead replica's requests are reaped;
//! a dead Redis costs no request; a Redis user that may not run `EVAL`
//! costs none either, and the log says why. A family claim keeps a
//! family's new prompts on one pod, and a follower waits there for the
//! first one's prefill and hits.
//!
//! Pods answer a token every 150 ms: a request asking for [`TOKENS`]
//! stays in flight ~1.2 s, one asking for [`LONG`] ~3.6 s.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use harness::fleet::{sync_patch, Fleet};
use harness::redis::RedisAt;
use harness::wait_until;
use serde_json::json;

const POD_ARGS: [&str; 4] = [
    "--decode-us-per-token",
    "150000",
    "--prefill-us-per-token",
    "10",
];

/// Two replicas (A, B) with `place_new`; the sync period is long, so
/// nothing but the placement tells one replica of the other's requests.
fn fleet(label: &str) -> Fleet {
    fleet_with(label, json!({}))
}

/// [`fleet`] with more `sync` settings.
fn fleet_with(label: &str, sync: serde_json::Value) -> Fleet {
    fleet_of(label, &POD_ARGS, sync, json!({}))
}

/// Two replicas with `place_new` over pods started with `pod_args`, `sync`
/// and the other plugin settings `more` merged in.
fn fleet_of(
    label: &str,
    pod_args: &[&str],
    sync: serde_json::Value,
    more: serde_json::Value,
) -> Fleet {
    let mut f = Fleet::new(label);
    f.start_pods(pod_args);
    f.start_redis();
    let mut settings = json!({ "place_new": true, "poll_ms": 0 });
    for (k, v) in sync.as_object().into_iter().flatten() {
        settings[k] = v.clone();
    }
    let specs = ["a", "b"]
        .iter()
        .map(|name| {
            f.spec(name, "sync.yaml")
                .merge(sync_patch(60_000, settings.clone()))
                .merge(more.clone())
        })
        .collect();
    f.launch_all(specs);
    f
}

/// A prompt no pod has seen (distinct from its first byte).
fn new_prompt(tag: &str) -> String {
    format!(
        "{tag} {}",
        "a fresh prompt with nothing shared. ".repeat(20)
    )
}

/// Output tokens of a request: ~1.2 s in flight.
const TOKENS: u32 = 8;
/// Output tokens of a request that must still be in flight when the other
/// replica's placement reads Redis: ~3.6 s, so a slow or busy machine's
/// delays between the two do not end it first.
const LONG: u32 = 24;

/// Sends `prompt` through replica `i` on a thread; the pod that answered.
fn send_async(f: &Fleet, i: usize, prompt: String) -> thread::JoinHandle<String> {
    send_tokens_async(f, i, prompt, TOKENS)
}

/// [`send_async`] asking for [`LONG`] tokens.
fn send_long_async(f: &Fleet, i: usize, prompt: String) -> thread::JoinHandle<String> {
    send_tokens_async(f, i, prompt, LONG)
}

fn send_tokens_async(
    f: &Fleet,
    i: usize,
    prompt: String,
    tokens: u32,
) -> thread::JoinHandle<String> {
    let reply = post_async(f, i, prompt, false, tokens);
    thread::spawn(move || reply.join().unwrap().expect_pod())
}

/// Sends `prompt` through replica `i` on a thread, streamed if `stream`,
/// asking for `tokens`; the reply (a 200).
fn post_async(
    f: &Fleet,
    i: usize,
    prompt: String,
    stream: bool,
    tokens: u32,
) -> thread::JoinHandle<harness::Reply> {
    let base = f.replicas[i].base_url();
    thread::spawn(move || {
        let mut body: serde_json::Value =
            serde_json::from_str(&harness::completion_body(&json!(prompt))).unwrap();
        body["max_tokens"] = json!(tokens);
        if stream {
            body["stream"] = json!(true);
        }
        let reply = harness::send(
            "POST",
            &format!("{base}/v1/completions"),
            &[("content-type", "application/json")],
            Some(body.to_string().as_bytes()),
            harness::CLIENT_TIMEOUT,
        )
        .unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
        reply
    })
}

/// Waits (5 s at most) until Redis counts `n` placed requests in flight;
/// a failure names, with Redis's counts, what each replica counted of its
/// placements.
fn wait_placed(f: &Fleet, redis: &RedisAt, n: i64, when: &str) {
    if wait_until(Duration::from_secs(5), || total(redis) == n) {
        return;
    }
    let counted: Vec<_> = f
        .replicas
        .iter()
        .map(|r| {
            let mut s = r.settled_stats();
            s.retain(|k, _| k.contains(".place.") || k.contains(".routed."));
            s
        })
        .collect();
    panic!(
        "{when}: Redis counts {:?}; the replicas counted {counted:?}",
        placed(redis)
    );
}

/// Placed requests in flight per pod, as Redis counts them.
fn placed(redis: &RedisAt) -> Vec<(String, i64)> {
    redis
        .scan("{aibrix:pl}:p:*")
        .into_iter()
        .map(|k| {
            let n = redis.cmd(&["ZCARD", &k]).int();
            (k, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn total(redis: &RedisAt) -> i64 {
    placed(redis).iter().map(|(_, n)| n).sum()
}

#[test]
fn a_replica_places_a_new_prompt_on_the_pod_the_other_left_free() {
    let f = fleet("place-free");
    let redis = RedisAt::of(f.redis.as_ref().unwrap());
    for round in 0..3 {
        // A sends three new prompts at once: three pods, one each.
        let a: Vec<_> = (0..3)
            .map(|k| send_long_async(&f, 0, new_prompt(&format!("r{round}a{k}"))))
            .collect();
        wait_placed(&f, &redis, 3, &format!("round {round}"));
        assert_eq!(placed(&redis).len(), 3, "one per pod: {:?}", placed(&redis));
        // B knows nothing of them but through Redis: the fourth pod.
        let b = send_async(&f, 1, new_prompt(&format!("r{round}b")));
        let a: BTreeSet<String> = a.into_iter().map(|h| h.join().unwrap()).collect();
        let b = b.join().unwrap();
        assert_eq!(a.len(), 3, "round {round}: {a:?}");
        assert!(
            !a.contains(&b),
            "round {round}: B sent to {b}, A used {a:?}"
        );
        // Ended requests leave Redis on the tick.
        wait_placed(
            &f,
            &redis,
            0,
            &format!("round {round}: ended requests released"),
        );
    }
    let (a, b) = (&f.replicas[0], &f.replicas[1]);
    let stats = |r: &harness::fleet::Replica| r.envoy.settled_router_stats();
    let (sa, sb) = (stats(a), stats(b));
    let get = |s: &std::collections::BTreeMap<String, i64>, n: &str| {
        s.get(&format!("prefix_router.{n}")).copied().unwrap_or(0)
    };
    assert_eq!(get(&sa, "routed.placed") + get(&sb, "routed.placed"), 12);
    assert_eq!(get(&sa, "place.failed") + get(&sb, "place.failed"), 0);
    assert_eq!(get(&sa, "routed.no_match") + get(&sb, "routed.no_match"), 0);
    // Each wait was timed: Envoy's histogram (after its 5 s stats flush)
    // reads more than nothing and less than the call's timeout
    // (`sync.place_timeout_ms`, 50 ms by default): none failed.
    let timeout_us = 50_000.0;
    for r in [a, b] {
        let mut q = Vec::new();
        assert!(
            wait_until(Duration::from_secs(8), || {
                q = r.histogram("prefix_router.place.wait_us");
                !q.is_empty()
            }),
            "no place.wait_us"
        );
        let median = q.iter().find(|(p, _)| *p == 50.0).map(|(_, v)| *v).unwrap();
        assert!(median > 0.0 && median < timeout_us, "{q:?}");
    }
}

/// `place_claim_ms`: B's new prompt of a family (model and first 32
/// blocks) that A placed goes to A's pod, though a request is placed there
/// and the other pods are idle; the claim runs from the family's first
/// placement, not extended by the one that followed it.
#[test]
fn a_family_follows_its_claim_which_the_follower_does_not_extend() {
    let f = fleet_with("place-claim", json!({ "place_claim_ms": 5000 }));
    let redis = RedisAt::of(f.redis.as_ref().unwrap());
    // B times a prefill of its own first (a streamed new prompt): a
    // follower that can wait follows a claim whose pod is busy.
    post_async(&f, 1, harness::text(11, 8300), true, TOKENS)
        .join()
        .unwrap();
    wait_placed(&f, &redis, 0, "B's own prompt ended");
    let warm = redis.scan("{aibrix:pl}:c:*");
    // Over 32 128-byte blocks shared, then the prompts differ.
    let family = "the same opening for every prompt of this family. ".repeat(90);
    let a = send_long_async(&f, 0, format!("{family} and then the first question"));
    wait_placed(&f, &redis, 1, "A placed");
    let mut claims = redis.scan("{aibrix:pl}:c:*");
    claims.retain(|c| !warm.contains(c));
    assert_eq!(claims.len(), 1, "{claims:?}");
    let ttl_first = redis.cmd(&["PTTL", &claims[0]]).int();
    assert!(ttl_first > 4000, "{ttl_first}");
    thread::sleep(Duration::from_millis(400));
    // A's request is still in flight (~3.6 s): by count B would pick an idle pod.
    assert_eq!(total(&redis), 1);
    let b = send_async(&f, 1, format!("{family} and then another question"));
    wait_placed(&f, &redis, 2, "B placed");
    let ttl_after = redis.cmd(&["PTTL", &claims[0]]).int();
    assert!(
        ttl_after > 0 && ttl_after <= ttl_first - 300,
        "the claim was extended: {ttl_first} ms left after A, {ttl_after} after B"
    );
    // Another family is placed by cost: an idle pod, not the claimed one.
    // Sent while A's and B's placed requests are still in flight there, so
    // Redis counts that pod busy (once they end, every pod is idle and the
    // tie may fall on it: CI saw that once).
    let other = send_async(&f, 1, new_prompt("another family"));
    let (a, b, other) = (a.join().unwrap(), b.join().unwrap(), other.join().unwrap());
    assert_eq!(a, b, "B followed the claim");
    assert_ne!(other, a, "a new family is not claimed");
    let a2 = send_async(&f, 0, format!("{family} third")).join().unwrap();
    assert_eq!(a2, a, "A's own table matches the family there");
}

/// A follower that has timed no prefill cannot wait for a claim's: it
/// follows the claim only while no placed request is in flight on its pod,
/// else Redis places it by cost (not beside the first one's prefill,
/// perhaps on a slow pod no replica has timed yet).
#[test]
fn a_follower_that_cannot_wait_leaves_a_busy_claim() {
    let f = fleet_with("place-claim-busy", json!({ "place_claim_ms": 5000 }));
    let redis = RedisAt::of(f.redis.as_ref().unwrap());
    let family = "an opening shared by every prompt of this family. ".repeat(90);
    let a = send_long_async(&f, 0, format!("{family} and then the first question"));
    wait_placed(&f, &redis, 1, "A placed");
    assert_eq!(redis.scan("{aibrix:pl}:c:*").len(), 1, "A's claim");
    // A's request is in flight (~3.6 s); B has timed nothing.
    let b = send_async(&f, 1, format!("{family} and then another question"));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_ne!(a, b, "B placed by cost, away from A's busy pod");
}

/// With a claim, B's prompt of A's family, sent while A's prefill runs on
/// the claimed pod, waits there for that prefill (by B's own timing of the
/// pod) and hits; with `hold` off it cannot wait, so it leaves the busy
/// claim and computes the prefix on another pod.
#[test]
fn a_claims_follower_waits_for_the_other_replicas_prefill_and_hits() {
    // 8,192 bytes of prefix are ~2,050 podsim tokens: ~2 s of prefill,
    // within which B must arrive (a slow machine's delays stay well
    // inside it); `hold.max_ms` lets B wait that long.
    let pods = [
        "--decode-us-per-token",
        "20000",
        "--prefill-us-per-token",
        "1000",
    ];
    for hold in [true, false] {
        let f = fleet_of(
            "place-claim-hold",
            &pods,
            json!({ "place_claim_ms": 5000 }),
            json!({ "hold": { "enabled": hold, "max_ms": 3000 } }),
        );
        let redis = RedisAt::of(f.redis.as_ref().unwrap());
        // B times one prefill of its own (a streamed new prompt).
        let warm = post_async(&f, 1, harness::text(11, 8300), true, TOKENS)
            .join()
            .unwrap();
        assert!(warm.body.contains("data:"), "streamed: {}", warm.body);
        // 64 blocks shared, then each prompt its own question.
        let prefix = harness::text(1, 8192);
        let a = post_async(
            &f,
            0,
            format!("{prefix}{}", harness::text(2, 300)),
            false,
            TOKENS,
        );
        assert!(
            wait_until(Duration::from_secs(5), || redis
                .scan("{aibrix:pl}:c:*")
                .len()
                == 2),
            "A's claim: {:?}",
            redis.scan("{aibrix:pl}:c:*")
        );
        thread::sleep(Duration::from_millis(200));
        let b = post_async(
            &f,
            1,
            format!("{prefix}{}", harness::text(3, 300)),
            false,
            TOKENS,
        );
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        // With hold off B cannot wait: it leaves the busy claim.
        assert_eq!(b.served_by() == a.served_by(), hold, "B followed the claim");
        let held = f.replicas[1]
            .settled_stats()
            .get("prefix_router.hold.held_claim")
            .copied()
            .unwrap_or(0);
        let cached = b.cached_tokens();
        if hold {
            assert_eq!(held, 1, "held for A's prefill");
            assert!(cached >= 2_000, "then a hit: {cached} tokens cached");
        } else {
            assert_eq!(held, 0);
            assert_eq!(
                cached, 0,
                "sent during A's prefill: computed again elsewhere"
            );
        }
    }
}

#[test]
fn a_dead_replicas_requests_are_reaped_and_a_dead_redis_fails_no_request() {
    let mut f = fleet("place-faults");
    let redis = RedisAt::of(f.redis.as_ref().unwrap());
    // A worker VM that died with three requests placed on pod-1.
    let pod1 = format!("127.0.0.1:{}", f.pod_ports[0]);
    let set = format!("{{aibrix:pl}}:p:{pod1}");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    for m in ["dead:1", "dead:2", "dead:3"] {
        redis.cmd(&["ZADD", &set, &now, m]);
        redis.cmd(&["HSET", "{aibrix:pl}:v:dead", m, &pod1]);
    }
    redis.cmd(&["ZADD", "{aibrix:pl}:vms", "1", "dead"]);
    let pod = send_async(&f, 0, new_prompt("after the death"))
        .join()
        .unwrap();
    assert_eq!(redis.cmd(&["EXISTS", "{aibrix:pl}:v:dead"]).int(), 0);
    assert!(redis.cmd(&["ZSCORE", &set, "dead:1"]).bytes().is_none());
    assert_eq!(
        redis.cmd(&["ZSCORE", "{aibrix:pl}:vms", "dead"]).bytes(),
        None
    );
    assert!(!pod.is_empty());
    // Redis dies: every request is still served, on the replica's own pick.
    drop(f.redis.take());
    let served: Vec<String> = (0..6)
        .map(|k| send_async(&f, k % 2, new_prompt(&format!("no redis {k}"))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(served.len(), 6);
    let failed: i64 = f
        .replicas
        .iter()
        .map(|r| r.envoy.settled_router_stat("prefix_router.place.failed"))
        .sum();
    assert!(failed >= 1, "failures counted");
}

/// A Redis user whose ACL leaves out scripting (a sync user given only the
/// commands sync sends): sync goes on, every new prompt is served on the
/// replica's own pick, the failures are counted, and the log says why
/// (once per worker VM, not once per request).
#[test]
fn a_redis_user_without_eval_fails_placements_loudly_but_no_request() {
    let mut f = Fleet::new("place-noperm");
    f.start_pods(&POD_ARGS);
    f.start_redis();
    let redis = RedisAt::of(f.redis.as_ref().unwrap());
    redis.cmd(&[
        "ACL",
        "SETUSER",
        "sync",
        "on",
        ">sync-pw",
        "~*",
        "&*",
        "+@all",
        "-@scripting",
    ]);
    let spec = f.spec("a", "sync.yaml").concurrency(2).merge(sync_patch(
        1_000,
        json!({ "auth_username": "sync", "auth_password": "sync-pw", "poll_ms": 0 }),
    ));
    f.launch_all(vec![spec]);
    let a = &f.replicas[0];
    let synced = wait_until(Duration::from_secs(10), || {
        a.stat("prefix_router.sync.cycles_ok") >= 1
    });
    assert!(synced, "sync with that user: {:?}", a.stats());
    let served: Vec<String> = (0..4)
        .map(|k| send_async(&f, 0, new_prompt(&format!("no eval {k}"))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(served.iter().all(|pod| !pod.is_empty()), "{served:?}");
    assert!(a.envoy.settled_router_stat("prefix_router.place.failed") >= 1);
    assert_eq!(
        a.envoy.settled_router_stat("prefix_router.routed.placed"),
        0
    );
    let log = a.envoy.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("placing a new prompt through Redis failed"))
        .collect();
    assert!(
        (1..=2).contains(&warnings.len()) && warnings.iter().all(|l| l.contains("NOPERM")),
        "one warning per worker VM at most, naming Redis's refusal: {warnings:?}"
    );
}
