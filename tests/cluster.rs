//! Sync through a real Redis Cluster (issue 13, item 3): three masters made
//! with `redis-server --cluster-enabled yes` and `redis-cli --cluster create`
//! on 127.0.0.1, two Envoy replicas on `envoy/cluster.yaml` (16 hash tags,
//! cluster mode, one ORIGINAL_DST bridge reaching every node). A prefix
//! learned on one replica routes on the other; then a slot of the namespace
//! is migrated to another master while both replicas take load: no client
//! request fails, the replicas follow ASK/MOVED (counted), sync goes on and
//! a prefix learned after the migration still routes on the other replica.
//! New prompts are placed through the master of the placement keys' slot
//! (`sync.place_new`, on by default).
//!
//! Needs `redis-server` and `redis-cli` with `--cluster` (Debian's
//! redis-tools 7.0 has it); the servers listen on free loopback ports and
//! are killed when the test ends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use harness::cluster::{add_replica, cli, start_cluster};
use harness::fleet::{sync_patch, Fleet, Replica};
use harness::{completion_body, send, text, wait_until, Reply, CLIENT_TIMEOUT};
use serde_json::json;

/// Sync period of both replicas.
const PERIOD_MS: u64 = 1000;
/// Prompt length: 32 blocks of 128 bytes, about two per hash tag.
const PROMPT_LEN: usize = 4096;
/// Blocks each prompt records (all 32 are below `dense_prefix_blocks`).
const BLOCKS: i64 = 32;

/// Replicas `a` and `b` on `envoy/cluster.yaml` (period 1 s, polls every
/// 100 ms, keys under `key_prefix`), its seed route to the fleet's Redis
/// port.
fn start_replicas(fleet: &mut Fleet, key_prefix: &str) {
    let specs = ["a", "b"]
        .iter()
        .map(|name| {
            fleet.spec(name, "cluster.yaml").merge(sync_patch(
                PERIOD_MS,
                json!({ "poll_ms": 100, "key_prefix": key_prefix }),
            ))
        })
        .collect();
    fleet.launch_all(specs);
}

/// The port of the master that owns `key`'s slot, by each node's own
/// `CLUSTER NODES` line (`myself`, then its slot ranges).
fn owner_of(nodes: &[u16], key: &str) -> Option<u16> {
    let slot: u32 = cli(nodes[0], &["CLUSTER", "KEYSLOT", key])
        .trim()
        .parse()
        .ok()?;
    nodes.iter().copied().find(|&port| {
        let out = cli(port, &["CLUSTER", "NODES"]);
        let Some(line) = out.lines().find(|l| l.contains("myself")) else {
            return false;
        };
        line.split_whitespace().skip(8).any(|range| {
            let mut ends = range.splitn(2, '-').map(|n| n.parse::<u32>().ok());
            match (ends.next().flatten(), ends.next()) {
                (Some(lo), None) => lo == slot,
                (Some(lo), Some(Some(hi))) => (lo..=hi).contains(&slot),
                _ => false,
            }
        })
    })
}

fn node_id(port: u16) -> String {
    cli(port, &["CLUSTER", "MYID"])
}

/// Every key on node `port` matching `pattern` (SCAN, the node's own keys).
fn node_keys(port: u16, pattern: &str) -> Vec<String> {
    let out = cli(port, &["--scan", "--pattern", pattern]);
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn sync_stat(r: &Replica, name: &str) -> i64 {
    r.stat(&format!("prefix_router.sync.{name}"))
}

fn sync_stats(r: &Replica) -> String {
    let stats: BTreeMap<String, i64> = r
        .stats()
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("prefix_router.sync.")?.to_string(), v)))
        .collect();
    format!(
        "replica {} sync stats: {stats:?}\n--- log tail ---\n{}",
        r.name,
        harness::tail(&r.envoy.log, 20)
    )
}

fn complete(r: &Replica, prompt: &str) -> Reply {
    r.envoy
        .complete(&json!(prompt))
        .unwrap_or_else(|e| panic!("replica {}: {e}", r.name))
}

fn match_percent(reply: &Reply) -> u32 {
    reply
        .header("x-prefix-match")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// New prompts sent alternately to two replicas from a thread, every 20 ms,
/// until stopped: each writes new keys (a new prefix's blocks) to the
/// cluster.
struct Load {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<(u32, Vec<String>)>,
}

impl Load {
    fn start(replicas: [&Replica; 2], first_seed: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let urls = replicas.map(|r| r.envoy.url("/v1/completions"));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let (mut sent, mut failed) = (0u32, Vec::new());
            let mut seed = first_seed;
            while !flag.load(Ordering::Relaxed) {
                let body = completion_body(&json!(text(seed, PROMPT_LEN)));
                let url = &urls[(seed % 2) as usize];
                let reply = send(
                    "POST",
                    url,
                    &[("content-type", "application/json")],
                    Some(body.as_bytes()),
                    CLIENT_TIMEOUT,
                );
                sent += 1;
                match reply {
                    Ok(r) if r.status == 200 => {}
                    other => failed.push(format!("{other:?}")),
                }
                seed += 1;
                thread::sleep(Duration::from_millis(20));
            }
            (sent, failed)
        });
        Load { stop, thread }
    }

    /// Stops the load; requests sent and the failures.
    fn stop(self) -> (u32, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("load thread")
    }
}

/// Routes fresh prompts (one per seed) on `r`; returns (prompt, pod).
fn learn(r: &Replica, seeds: std::ops::Range<u64>) -> Vec<(String, String)> {
    seeds
        .map(|seed| {
            let prompt = text(seed, PROMPT_LEN);
            let reply = complete(r, &prompt);
            assert_eq!(reply.status, 200, "{reply:?}");
            (prompt, reply.served_by())
        })
        .collect()
}

/// Learns 8 prompts on `writer` and waits until `reader` has them: the
/// writer pushed their blocks, the reader applied as many entities more,
/// then completed two more cycles (`applied` alone also counts entities a
/// migration's rescans apply again, so it can reach the mark early).
fn learn_synced(
    writer: &Replica,
    reader: &Replica,
    seeds: std::ops::Range<u64>,
) -> Vec<(String, String)> {
    let marks = [
        (writer, "pushed", sync_stat(writer, "pushed") + 8 * BLOCKS),
        (reader, "applied", sync_stat(reader, "applied") + 8 * BLOCKS),
    ];
    let learned = learn(writer, seeds);
    for (r, stat, mark) in marks {
        let ok = wait_until(Duration::from_secs(15), || sync_stat(r, stat) >= mark);
        assert!(ok, "{stat} stuck below {mark}:\n{}", sync_stats(r));
    }
    let mark = sync_stat(reader, "cycles_ok") + 2;
    let ok = wait_until(Duration::from_secs(15), || {
        sync_stat(reader, "cycles_ok") >= mark
    });
    assert!(ok, "no cycle:\n{}", sync_stats(reader));
    learned
}

/// Sends every learned prompt to `r`: each must go to the pod it was learned
/// on, with a match of at least 90 %; returns what went elsewhere.
fn routed_on(r: &Replica, learned: &[(String, String)]) -> Vec<String> {
    learned
        .iter()
        .filter_map(|(prompt, pod)| {
            let reply = complete(r, prompt);
            assert_eq!(reply.status, 200, "{reply:?}");
            let got = reply.served_by();
            (got != *pod || match_percent(&reply) < 90)
                .then(|| format!("{got} ({} %) instead of {pod}", match_percent(&reply)))
        })
        .collect()
}

#[test]
fn two_replicas_sync_through_a_redis_cluster_and_survive_a_slot_migration() {
    let mut fleet = Fleet::new("cluster");
    let nodes = start_cluster(fleet.dir.path(), 3);
    fleet.start_pods(&["--time-scale", "0"]);
    // The seed route (calls naming no node) goes to the first master.
    fleet.redis_port = nodes[0].port;
    start_replicas(&mut fleet, "aibrix");
    let (a, b) = (&fleet.replicas[0], &fleet.replicas[1]);
    for r in [a, b] {
        let ok = wait_until(Duration::from_secs(10), || {
            sync_stat(r, "cycles_ok") >= 1 && sync_stat(r, "topology_refreshes") >= 1
        });
        assert!(ok, "no cluster cycle: {}", sync_stats(r));
    }

    // 1. A prefix learned on A routes on B.
    let learned = learn_synced(a, b, 0..8);
    let missed = routed_on(b, &learned);
    assert!(missed.is_empty(), "{missed:?}\n{}", sync_stats(b));
    // A's 8 new prompts were placed through Redis (`sync.place_new`, on by
    // default), on the master the singleton named: the only one holding
    // the placement keys' hash tag.
    let placed = wait_until(Duration::from_secs(5), || {
        a.stat("prefix_router.routed.placed") >= 8
    });
    assert!(
        placed && a.stat("prefix_router.place.failed") == 0,
        "placed {}, failed {}\n{}",
        a.stat("prefix_router.routed.placed"),
        a.stat("prefix_router.place.failed"),
        harness::tail(&a.envoy.log, 20)
    );
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let holders: Vec<u16> = nodes
        .iter()
        .filter(|n| !node_keys(n.port, "{aibrix:pl}:*").is_empty())
        .map(|n| n.port)
        .collect();
    let owner = owner_of(&ports, "{aibrix:pl}:vms");
    assert_eq!(holders, owner.into_iter().collect::<Vec<_>>());
    // The namespace is spread: every master holds some of its keys.
    for n in &nodes {
        let keys = node_keys(n.port, "aibrix:{prefixcache*");
        assert!(
            keys.len() >= 8,
            "master {} holds {} prefixcache keys",
            n.port,
            keys.len()
        );
    }

    // 2. A slot of the namespace moves from its master to another while
    //    both replicas take load. The slot is one a prefixcache tag hashes to.
    let (src, dst) = (&nodes[0], &nodes[1]);
    let key = node_keys(src.port, "aibrix:{prefixcache.*}:log")
        .into_iter()
        .next()
        .expect("a change log on the first master");
    let slot = cli(src.port, &["CLUSTER", "KEYSLOT", &key]);
    let (src_id, dst_id) = (node_id(src.port), node_id(dst.port));
    cli(
        dst.port,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id],
    );
    cli(
        src.port,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id],
    );
    let cycles_before = [a, b].map(|r| sync_stat(r, "cycles_ok"));
    let load = Load::start([a, b], 1000);
    // Move the slot's keys a few at a time over ~4 s, then hand it over.
    let started = Instant::now();
    loop {
        let keys = cli(src.port, &["CLUSTER", "GETKEYSINSLOT", &slot, "5"]);
        let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        if keys.is_empty() && started.elapsed() > Duration::from_secs(4) {
            break;
        }
        if !keys.is_empty() {
            let port = dst.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().copied());
            let out = cli(src.port, &args);
            assert!(
                out == "OK" || out == "NOKEY",
                "MIGRATE of {keys:?}: {out} (a key written on both sides?)"
            );
        }
        thread::sleep(Duration::from_millis(300));
    }
    // The importing node first, then the source, then the rest (as
    // `redis-cli --cluster reshard` does: the other order makes both nodes
    // answer MOVED to each other for a moment).
    for n in [dst, src, &nodes[2]] {
        cli(n.port, &["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    }
    // Load goes on across the hand-over (MOVED until the next CLUSTER SLOTS).
    thread::sleep(Duration::from_millis(PERIOD_MS * 3));
    let (sent, failed) = load.stop();
    assert!(
        failed.is_empty(),
        "{} of {sent} requests failed: {failed:?}",
        failed.len()
    );
    assert!(sent >= 50, "only {sent} requests sent during the migration");
    assert!(
        cli(src.port, &["CLUSTER", "COUNTKEYSINSLOT", &slot]) == "0",
        "keys left behind on the source"
    );

    // Sync went on through the migration: cycles succeed after it, and the
    // redirections were followed.
    for (r, before) in [a, b].iter().zip(cycles_before) {
        let ok = wait_until(Duration::from_secs(10), || {
            sync_stat(r, "cycles_ok") >= before + 3
        });
        assert!(ok, "sync stalled:\n{}", sync_stats(r));
    }
    let redirects: i64 = [a, b]
        .iter()
        .map(|r| sync_stat(r, "ask_redirects") + sync_stat(r, "moved_redirects"))
        .sum();
    assert!(
        redirects > 0,
        "no ASK/MOVED seen:\n{}\n{}",
        sync_stats(a),
        sync_stats(b)
    );
    for r in [a, b] {
        assert_eq!(sync_stat(r, "redirects_exhausted"), 0, "{}", sync_stats(r));
    }
    eprintln!(
        "migration of slot {slot}: {sent} requests, 0 failed; A: {} ASK, {} MOVED, {} TRYAGAIN; \
         B: {} ASK, {} MOVED, {} TRYAGAIN",
        sync_stat(a, "ask_redirects"),
        sync_stat(a, "moved_redirects"),
        sync_stat(a, "tryagain_retries"),
        sync_stat(b, "ask_redirects"),
        sync_stat(b, "moved_redirects"),
        sync_stat(b, "tryagain_retries"),
    );

    // 3. After the migration, a prefix learned on B routes on A (its blocks
    //    in the moved slot now live on the new master).
    let learned = learn_synced(b, a, 5000..5008);
    let missed = routed_on(a, &learned);
    assert!(missed.is_empty(), "{missed:?}\n{}", sync_stats(a));
    let moved = node_keys(dst.port, "aibrix:{prefixcache*")
        .into_iter()
        .filter(|k| cli(dst.port, &["CLUSTER", "KEYSLOT", k]) == slot)
        .count();
    assert!(moved > 0, "no key of slot {slot} on its new master");
    drop(fleet);
    drop(nodes);
}

#[test]
fn a_master_killed_its_replica_promoted_sync_resumes_and_clients_never_fail() {
    let mut fleet = Fleet::new("cluster-failover");
    let mut nodes = start_cluster(fleet.dir.path(), 3);
    // A replica of the third master. The keys go under `router`, whose
    // placement keys (`{router:pl}`, slot 13756) live on that master: its
    // death also takes placement's master away.
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    assert_eq!(
        owner_of(&ports, "{router:pl}:vms"),
        Some(nodes[2].port),
        "the third master should own the placement slot"
    );
    let replica = add_replica(fleet.dir.path(), 3, nodes[0].port, nodes[2].port);
    fleet.start_pods(&["--time-scale", "0"]);
    fleet.redis_port = nodes[0].port;
    start_replicas(&mut fleet, "router");
    let (a, b) = (&fleet.replicas[0], &fleet.replicas[1]);
    for r in [a, b] {
        let ok = wait_until(Duration::from_secs(10), || sync_stat(r, "cycles_ok") >= 1);
        assert!(ok, "no cluster cycle: {}", sync_stats(r));
    }
    let load = Load::start([a, b], 2000);
    thread::sleep(Duration::from_millis(1500));
    // The master dies; after the node timeout (2 s) its replica takes over.
    let killed_at = Instant::now();
    drop(nodes.remove(2));
    let promoted = wait_until(Duration::from_secs(30), || {
        cli(replica.port, &["INFO", "replication"]).contains("role:master")
            && cli(nodes[0].port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
    });
    assert!(promoted, "replica not promoted");
    let promoted_after = killed_at.elapsed();
    let ok_before = [a, b].map(|r| sync_stat(r, "cycles_ok"));
    for (r, before) in [a, b].iter().zip(ok_before) {
        let ok = wait_until(Duration::from_secs(20), || {
            sync_stat(r, "cycles_ok") >= before + 2
        });
        assert!(
            ok,
            "sync did not resume after the failover:\n{}",
            sync_stats(r)
        );
    }
    let resumed_after = killed_at.elapsed();
    // Placements went to the dead master and failed, each backing off its
    // VM for a second, until the singletons named the promoted one; from
    // then on new prompts are placed again.
    let failed_placements = [a, b].map(|r| r.stat("prefix_router.place.failed"));
    let placed_before = [a, b].map(|r| r.stat("prefix_router.routed.placed"));
    for (r, before) in [a, b].iter().zip(placed_before) {
        let ok = wait_until(Duration::from_secs(10), || {
            r.stat("prefix_router.routed.placed") >= before + 5
        });
        assert!(
            ok,
            "no placement after the failover (placed {}, failed {})",
            r.stat("prefix_router.routed.placed"),
            r.stat("prefix_router.place.failed")
        );
    }
    let (sent, failed) = load.stop();
    assert!(
        failed.is_empty(),
        "{} of {sent} requests failed: {failed:?}",
        failed.len()
    );
    assert!(
        failed_placements.iter().any(|&f| f > 0),
        "no placement failed while its master was dead"
    );
    assert_eq!(
        owner_of(
            &[nodes[0].port, nodes[1].port, replica.port],
            "{router:pl}:vms"
        ),
        Some(replica.port)
    );
    // A prefix learned on A after the failover routes on B.
    let learned = learn_synced(a, b, 9000..9008);
    let missed = routed_on(b, &learned);
    assert!(missed.is_empty(), "{missed:?}\n{}", sync_stats(b));
    // The promoted replica holds the namespace's keys of its slots.
    let held = node_keys(replica.port, "router:{prefixcache*").len();
    assert!(held > 0, "the promoted master holds no prefixcache keys");
    eprintln!(
        "failover: replica promoted {promoted_after:?} after the kill, both replicas synced again \
         {resumed_after:?} after it; {sent} requests, 0 failed; A: {} failed cycles, B: {}; \
         failed placements A {}, B {}",
        sync_stat(a, "cycles_failed"),
        sync_stat(b, "cycles_failed"),
        failed_placements[0],
        failed_placements[1],
    );
    drop(fleet);
    drop(replica);
    drop(nodes);
}
