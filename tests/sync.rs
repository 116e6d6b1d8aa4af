//! Cross-replica sync of the prefix table through a real Redis
//! (docs/statesync.md): two or three Envoy replicas on
//! `envoy/sync.yaml` (own listener, admin and bridge ports; the same four
//! podsim pods and the same `redis-server`), driven through their listeners
//! and observed through their `prefix_router.sync.*` stats and Redis itself.
//!
//! Probing discipline: a request that a replica routes *is recorded* on that
//! replica for the pod it chose. So a replica is never asked twice about the
//! same prompt while waiting for the sync: a miss would plant the prompt
//! there for a random pod (a 1-in-4 chance to be the right one, and a local
//! 100 % match from then on). Instead, many prompts are learned on the source
//! replica up front and each probe of the target uses a prompt the target has
//! never seen; a 100 % match on the learning replica's pod can then only come
//! from Redis.
//!
//! Timing: waits are deadlines, never latency assertions; every deadline is
//! derived from the configured period and generous slack (two shared cores).

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_prefix_router::route::hashing::BlockHasher;
use envoy_prefix_router::route::request::{parse_body, ApiKind};
use envoy_prefix_router::route::router::sampled_positions;
use envoy_prefix_router::route::table::{anchor_of, Layout};
use harness::fleet::{self, launch, launch_all, merge_json, start_pods, sync_patch, EnvoySpec};
use harness::redis::{RedisAt, Resp};
use harness::{
    completion_body, free_port, send, tail, text, wait_until, Pod, Redis, Reply, TestDir,
    CLIENT_TIMEOUT,
};
use serde_json::{json, Value};

/// Model named by `harness::completion_body`.
const MODEL: &str = "test-model";
/// Block size and dense prefix of envoy/sync.yaml (defaults).
const BLOCK: usize = 128;
const DENSE: usize = 32;
/// 32 full blocks: every block is recorded (all below `dense_prefix_blocks`),
/// so a 100 % match needs every one of them.
const PROMPT_LEN: usize = DENSE * BLOCK;
/// Time between two probes of a replica.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Added to every period-derived deadline: CPU contention, Envoy start-up
/// of the singleton, cycle duration, stats publishing.
const SLACK: Duration = Duration::from_millis(2500);

// ---------------------------------------------------------------------------
// Fleet: pods, replicas
// ---------------------------------------------------------------------------

/// The four pods every replica routes to (named `pod-1`..`pod-4`).
struct Pods {
    _pods: Vec<Pod>,
    ports: [u16; 4],
}

impl Pods {
    fn start(dir: &TestDir) -> Pods {
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let pods = start_pods(dir, &ports, &["--time-scale", "0"]);
        Pods { _pods: pods, ports }
    }

    fn name(&self, i: usize) -> String {
        format!("pod-{}", i + 1)
    }

    fn endpoint_of(&self, name: &str) -> String {
        let i = (1..=4)
            .position(|n| format!("pod-{n}") == name)
            .unwrap_or_else(|| panic!("no pod {name}"));
        format!("127.0.0.1:{}", self.ports[i])
    }

    /// A replica on `envoy/sync.yaml` in front of these pods and the Redis
    /// on `redis`, `plugin` merged (recursively) into both plugin
    /// configurations (filter and singleton).
    fn replica(&self, name: &str, redis: u16, plugin: Value) -> EnvoySpec<'static> {
        EnvoySpec::new(name, "sync.yaml", &self.ports)
            .redis(redis)
            .merge(plugin)
            .plugins(2)
    }
}

/// One Envoy replica of the fleet, with the sync tests' view of it.
struct Replica(fleet::Replica);

impl std::ops::Deref for Replica {
    type Target = fleet::Replica;

    fn deref(&self) -> &fleet::Replica {
        &self.0
    }
}

/// Starts the replicas in parallel (the harness's launcher) and waits until
/// each one's sync singleton has started.
fn start_replicas(dir: &TestDir, specs: Vec<EnvoySpec<'_>>) -> Vec<Replica> {
    let replicas = launch_all(dir, specs).unwrap_or_else(|e| panic!("{e}"));
    let replicas: Vec<Replica> = replicas.into_iter().map(Replica).collect();
    for r in &replicas {
        r.wait_singleton();
    }
    replicas
}

impl Replica {
    fn complete(&self, prompt: &str) -> Reply {
        self.envoy
            .complete(&json!(prompt))
            .unwrap_or_else(|e| panic!("replica {}: {e}", self.name))
    }

    /// A `prefix_router.sync.<name>` stat (0 while not defined yet).
    fn stat(&self, name: &str) -> i64 {
        self.envoy
            .router_stat(&format!("prefix_router.sync.{name}"))
    }

    /// Every sync stat, for failure messages.
    fn sync_stats(&self) -> String {
        let stats: BTreeMap<String, i64> = self
            .envoy
            .router_stats()
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("prefix_router.sync.")?.to_string(), v)))
            .collect();
        format!("replica {} sync stats: {stats:?}", self.name)
    }

    /// Waits until stat `name` satisfies `ok` and returns it; panics with the
    /// replica's sync stats and log tail after `timeout`.
    fn wait_stat(&self, name: &str, timeout: Duration, ok: impl Fn(i64) -> bool) -> i64 {
        let mut last = 0;
        let met = wait_until(timeout, || {
            last = self.stat(name);
            ok(last)
        });
        assert!(
            met,
            "replica {}: sync.{name} stuck at {last} after {timeout:?}\n{}\n{}",
            self.name,
            self.sync_stats(),
            self.log_tail()
        );
        last
    }

    /// Waits until the sync singleton has started (its stats exist). Envoy
    /// reports LIVE and routes before the singleton's first tick registers
    /// the hand-off queue; blocks routed in that window are never pushed
    /// (counted in `sync.handoff_dropped`), so tests learn only after this.
    fn wait_singleton(&self) {
        let up = wait_until(SLACK * 4, || {
            self.envoy
                .router_stats()
                .contains_key("prefix_router.sync.cycles_ok")
        });
        assert!(
            up,
            "replica {}: sync singleton not started\n{}",
            self.name,
            self.log_tail()
        );
    }

    /// Cycles started so far (each cycle pulls both namespaces and counts
    /// one full scan or incremental pull per namespace).
    fn pull_starts(&self) -> i64 {
        self.stat("full_scans") + self.stat("incremental_pulls")
    }

    fn log_tail(&self) -> String {
        format!(
            "--- replica {} log tail ---\n{}",
            self.name,
            tail(&self.envoy.log, 15)
        )
    }
}

// ---------------------------------------------------------------------------
// Learning and probing
// ---------------------------------------------------------------------------

/// A prompt routed on the learning replica, and where it went.
struct Learned {
    prompt: String,
    pod: String,
    at: Instant,
}

/// Routes one fresh prompt per seed on `r` (each must be new to it).
fn learn(r: &Replica, seeds: std::ops::Range<u64>) -> VecDeque<Learned> {
    seeds
        .map(|seed| {
            let prompt = text(seed, PROMPT_LEN);
            let reply = r.complete(&prompt);
            let pod = reply.expect_pod();
            assert_eq!(
                reply.match_percent(),
                0,
                "replica {}: fresh prompt {seed} already matched: {reply:?}",
                r.name
            );
            Learned {
                prompt,
                pod,
                at: Instant::now(),
            }
        })
        .collect()
}

/// What one probe saw (shown through Debug in failure messages).
#[derive(Debug)]
#[allow(dead_code)]
struct Probe {
    after: Duration,
    pod: String,
    percent: u32,
}

/// The first probe that routed with a full match (shown through Debug).
#[derive(Debug)]
#[allow(dead_code)]
struct Hit {
    /// From the moment the probed prompt was learned to the probe.
    since_learned: Duration,
    /// From the start of probing.
    since_start: Duration,
    probes: usize,
    /// The probes before it.
    misses: Vec<Probe>,
}

/// Probes `r` every [`PROBE_EVERY`], each time with the next learned prompt
/// (consumed: never probed again), until one routes with a 100 % match to the
/// pod that learned it. A full match to another pod fails at once.
fn first_synced(
    r: &Replica,
    learned: &mut VecDeque<Learned>,
    timeout: Duration,
) -> Result<Hit, String> {
    let start = Instant::now();
    let mut seen: Vec<Probe> = Vec::new();
    loop {
        let Some(l) = learned.pop_front() else {
            return Err(format!(
                "ran out of fresh prompts after {:?}; probes: {seen:?}",
                start.elapsed()
            ));
        };
        let reply = r.complete(&l.prompt);
        let pod = reply.expect_pod();
        let percent = reply.match_percent();
        if percent == 100 {
            assert_eq!(
                pod, l.pod,
                "replica {}: full match routed to {pod}, but the prompt was learned on {}",
                r.name, l.pod
            );
            return Ok(Hit {
                since_learned: l.at.elapsed(),
                since_start: start.elapsed(),
                probes: seen.len() + 1,
                misses: seen,
            });
        }
        seen.push(Probe {
            after: start.elapsed(),
            pod,
            percent,
        });
        if start.elapsed() >= timeout {
            return Err(format!(
                "replica {}: no full match within {timeout:?} ({} probes: {seen:?})",
                r.name,
                seen.len()
            ));
        }
        thread::sleep(PROBE_EVERY);
    }
}

/// Probes `r` with the next `n` learned prompts; returns the ones that did
/// not route with a 100 % match to their learning pod.
fn not_synced(r: &Replica, learned: &mut VecDeque<Learned>, n: usize) -> Vec<String> {
    let mut misses = Vec::new();
    for _ in 0..n {
        let l = learned.pop_front().expect("enough learned prompts");
        let reply = r.complete(&l.prompt);
        let pod = reply.expect_pod();
        let percent = reply.match_percent();
        if percent != 100 || pod != l.pod {
            misses.push(format!(
                "{}...: {percent}% on {pod}, learned on {}",
                &l.prompt[..12],
                l.pod
            ));
        }
    }
    misses
}

/// Worst case from a request on A to B routing it: A pushes at its next
/// cycle (up to period + 10 % jitter away), B pulls at its next cycle after
/// that (the same again). The two schedules are independent, so the bound is
/// two jittered periods, plus slack.
fn sync_deadline(period_ms: u64) -> Duration {
    Duration::from_millis(2 * period_ms * 11 / 10) + SLACK
}

/// Enough fresh prompts to probe every [`PROBE_EVERY`] until `deadline`.
fn probes_for(deadline: Duration) -> u64 {
    (deadline.as_millis() / PROBE_EVERY.as_millis()) as u64 + 10
}

/// Block hashes a replica records for `prompt` (sampled positions), with
/// the crate's own hasher over the crate's own prompt bytes.
fn recorded_blocks(prompt: &str, seed: u64) -> Vec<u64> {
    anchored_blocks(prompt, seed)
        .into_iter()
        .map(|(b, _)| b)
        .collect()
}

/// [`recorded_blocks`] with each block's anchor, as a native replica
/// files and publishes it (the segment layout).
fn anchored_blocks(prompt: &str, seed: u64) -> Vec<(u64, u32)> {
    let body = completion_body(&json!(prompt));
    let req = parse_body(ApiKind::Completions, body.as_bytes()).expect("parse completion body");
    let hashes = BlockHasher::new(BLOCK, seed).hash(&req.prompt);
    sampled_positions(hashes.len(), DENSE)
        .into_iter()
        .map(|i| {
            let anchor = Layout::Segments.anchor_position(i, DENSE);
            (hashes[i], anchor_of(hashes[anchor]))
        })
        .collect()
}

/// A native value: AIBrix's shape plus the block's anchor when it is not
/// the block's own.
fn native_value(block: u64, anchor: u32, model_to_pods: Value) -> String {
    let mut v = json!({ "model_to_pods": model_to_pods });
    if anchor != anchor_of(block) {
        v["anchor"] = json!(anchor);
    }
    v.to_string()
}

fn entity_key(block: u64) -> String {
    format!("aibrix:{{prefixcache}}:e:{block}")
}

/// The Redis keys of the blocks a replica with `seed` records for `prompt`.
fn block_keys(prompt: &str, seed: u64) -> Vec<String> {
    recorded_blocks(prompt, seed)
        .into_iter()
        .map(entity_key)
        .collect()
}

/// Another native writer's values saying `pod` holds `prompt` (model
/// `test-model`, last seen at `nanos`): (key, value) per recorded block.
fn block_facts(prompt: &str, pod: &str, nanos: i64) -> Vec<(String, String)> {
    anchored_blocks(prompt, 0)
        .into_iter()
        .map(|(b, a)| {
            let value = native_value(b, a, json!({ "test-model": { pod: nanos } }));
            (entity_key(b), value)
        })
        .collect()
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn prefix_learned_on_a_routes_on_b_within_a_period() {
    const PERIOD: u64 = 2000;
    let dir = TestDir::new("sync-a-to-b");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica("a", redis.port, sync_patch(PERIOD, json!({}))),
            pods.replica("b", redis.port, sync_patch(PERIOD, json!({}))),
        ],
    );
    let (a, b) = (&fleet[0], &fleet[1]);
    // Steady state: both singletons have finished a cycle (the first one
    // comes after a random delay below period/2).
    for r in [a, b] {
        r.wait_stat(
            "cycles_ok",
            Duration::from_millis(PERIOD) + SLACK * 2,
            |v| v >= 1,
        );
    }

    // The request on A to B routing it: A pushes within half a period (its
    // cycle or a half-period push), B's change-log poll (every 175 ms) picks
    // it up; so the spec's bound, one jittered period, holds with room.
    // (Without polls the two schedules added up to ~2 periods.)
    let one_period = Duration::from_millis(PERIOD * 11 / 10 + 500);
    let deadline = sync_deadline(PERIOD);
    let mut learned = learn(a, 1000..1000 + probes_for(one_period) + 8);
    let first_keys = block_keys(&learned[0].prompt, 0);
    let pushed = wait_until(one_period, || {
        db.exists(&first_keys) == first_keys.len() as i64
    });
    let to_redis = learned[0].at.elapsed();
    assert!(
        pushed,
        "A did not push its blocks within {one_period:?}\n{}",
        a.sync_stats()
    );
    let pushed_at = Instant::now();
    // B cannot match before the keys are in Redis: probing starts now.
    let hit = first_synced(b, &mut learned, one_period).unwrap_or_else(|e| {
        panic!(
            "a prefix A pushed {to_redis:?} after learning it never routed on B: {e}\n{}\n{}\n{}",
            a.sync_stats(),
            b.sync_stats(),
            b.log_tail()
        )
    });
    let pull_lag = pushed_at.elapsed();
    eprintln!(
        "A->B (period {PERIOD} ms): A's push in Redis {to_redis:?} after the request, B routed \
         it {pull_lag:?} after that, {:?} in all (probe {})",
        hit.since_learned, hit.probes
    );
    assert!(
        hit.since_learned <= deadline,
        "A->B took {:?} (push {to_redis:?} + pull {pull_lag:?}) > {deadline:?}",
        hit.since_learned
    );

    // Every other prompt A learned in that burst arrives too, once B has run
    // two more cycles (the burst may straddle one of A's pushes).
    let ok = b.stat("cycles_ok");
    b.wait_stat("cycles_ok", deadline, |v| v >= ok + 2);
    let misses = not_synced(b, &mut learned, 8);
    assert!(
        misses.is_empty(),
        "prompts learned on A that B does not route to A's pod: {misses:#?}\n{}",
        b.sync_stats()
    );
    assert!(a.stat("pushed") >= 32, "{}", a.sync_stats());
    assert!(b.stat("applied") >= 32, "{}", b.sync_stats());
}

#[test]
fn different_hash_seed_on_b_gives_no_match() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-seed");
    let redis = Redis::start(&dir, free_port(), None);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica("a", redis.port, sync_patch(PERIOD, json!({}))),
            pods.replica("b", redis.port, {
                let mut p = sync_patch(PERIOD, json!({}));
                p["hash_seed"] = json!(7);
                p
            }),
            pods.replica("c", redis.port, sync_patch(PERIOD, json!({}))),
        ],
    );
    let (a, b, c) = (&fleet[0], &fleet[1], &fleet[2]);
    for r in [a, b, c] {
        r.wait_stat(
            "cycles_ok",
            Duration::from_millis(PERIOD) + SLACK * 2,
            |v| v >= 1,
        );
    }
    let b_pulled = b.stat("keys_pulled");
    let deadline = sync_deadline(PERIOD);
    let mut learned = learn(a, 2000..2000 + probes_for(deadline) + 12);
    let blocks_learned = 32 * learned.len() as i64;
    let b_cycles = b.stat("cycles_ok");

    // Same seed: C routes A's prefixes.
    let hit = first_synced(c, &mut learned, deadline)
        .unwrap_or_else(|e| panic!("same-seed replica C never matched: {e}\n{}", c.sync_stats()));
    eprintln!("A->C (same seed): {:?}", hit.since_learned);

    // Different seed: B pulls every block A pushed (so it did sync) ...
    b.wait_stat("keys_pulled", deadline, |v| v >= b_pulled + blocks_learned);
    b.wait_stat("cycles_ok", deadline * 2, |v| v >= b_cycles + 3);
    // ... but over several more periods none of A's prompts ever matches.
    let mut seen = Vec::new();
    for _ in 0..6 {
        let l = learned.pop_front().expect("prompt");
        let reply = b.complete(&l.prompt);
        reply.expect_pod();
        seen.push(reply.match_percent());
        thread::sleep(Duration::from_millis(PERIOD / 2));
    }
    assert!(
        seen.iter().all(|&p| p == 0),
        "replica B with hash_seed 7 matched prefixes hashed with seed 0: {seen:?}"
    );
    // C still matches the remaining ones.
    let misses = not_synced(c, &mut learned, 4);
    assert!(misses.is_empty(), "same-seed misses on C: {misses:#?}");
}

#[test]
fn keys_carry_the_ttl_and_expire() {
    const PERIOD: u64 = 500;
    const TTL_SECS: u64 = 3;
    let dir = TestDir::new("sync-ttl");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let patch = sync_patch(PERIOD, json!({ "record_ttl_secs": TTL_SECS }));
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica("a", redis.port, patch.clone()),
            pods.replica("b", redis.port, patch),
        ],
    );
    let (a, b) = (&fleet[0], &fleet[1]);
    let b_pulled = b.stat("keys_pulled");

    let learned = learn(a, 3000..3001);
    let l = &learned[0];
    let keys: Vec<String> = block_keys(&l.prompt, 0);
    assert_eq!(keys.len(), 32);

    // A pushes every block of the prompt, each with the record TTL.
    let mut present = 0;
    let pushed = wait_until(sync_deadline(PERIOD), || {
        present = db.exists(&keys);
        present == keys.len() as i64
    });
    assert!(
        pushed,
        "only {present} of {} keys in Redis\n{}",
        keys.len(),
        a.sync_stats()
    );
    let appeared = Instant::now();
    let ttls: Vec<i64> = db
        .pipeline(
            &keys
                .iter()
                .map(|k| vec!["PTTL".to_string(), k.clone()])
                .collect::<Vec<_>>(),
        )
        .iter()
        .map(Resp::int)
        .collect();
    assert!(
        ttls.iter().all(|&t| t > 0 && t <= (TTL_SECS * 1000) as i64),
        "PTTL outside (0, {TTL_SECS} s]: {ttls:?}"
    );

    // The payload is AIBrix's, naming the pod A chose, with a recent time.
    let value = match db.cmd(&["GET", &keys[0]]) {
        Resp::Bulk(Some(v)) => v,
        other => panic!("GET {}: {other:?}", keys[0]),
    };
    let payload: Value = serde_json::from_slice(&value).expect("payload is JSON");
    let pods_of_model = payload["model_to_pods"][MODEL]
        .as_object()
        .unwrap_or_else(|| panic!("payload without model {MODEL}: {payload}"));
    let endpoint = pods.endpoint_of(&l.pod);
    let nanos = pods_of_model
        .get(&endpoint)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("payload does not name {endpoint}: {payload}"));
    let age_secs = (now_nanos() as i128 - nanos as i128).abs() / 1_000_000_000;
    assert!(age_secs < 120, "last access {age_secs} s off: {payload}");

    // B pulls them (and must not write them back: pulled facts are not dirty).
    b.wait_stat("keys_pulled", sync_deadline(PERIOD), |v| v >= b_pulled + 32);

    // No new traffic: nothing is dirty, nobody rewrites them, they expire.
    let mut left = 0;
    let expired = wait_until(Duration::from_secs(TTL_SECS) + SLACK, || {
        left = db.exists(&keys);
        left == 0
    });
    assert!(
        expired,
        "{left} keys still in Redis {:?} after they appeared (TTL {TTL_SECS} s): \
         something keeps rewriting them\n{}\n{}",
        appeared.elapsed(),
        a.sync_stats(),
        b.sync_stats()
    );
    // And they stay gone for several more cycles of both replicas.
    let (ca, cb) = (a.stat("cycles_ok"), b.stat("cycles_ok"));
    a.wait_stat("cycles_ok", sync_deadline(PERIOD), |v| v >= ca + 3);
    b.wait_stat("cycles_ok", sync_deadline(PERIOD), |v| v >= cb + 3);
    assert_eq!(db.exists(&keys), 0, "expired keys came back");
}

#[test]
fn write_through_makes_b_see_it_fast() {
    // A has write-through on and a 30 s period; B pulls every 500 ms.
    // Without write-through A's blocks reach Redis only with A's next
    // periodic push: its first cycle comes after a random delay in [0, 15 s),
    // then one every ~30 s. With write-through the singleton SETEXes them on
    // its next 100 ms tick, so B's next pull (<= ~550 ms later) sees them.
    //
    // To make the test unable to pass without write-through, an attempt
    // counts only if A started no periodic cycle and finished none between
    // learning and B's match (A's pull-start and cycles_ok stats unchanged):
    // then the only way the blocks reached Redis is write-through. A's
    // periodic cycle can spoil at most one attempt (they are ~30 s apart).
    const PERIOD_A: u64 = 30_000;
    const PERIOD_B: u64 = 500;
    let dir = TestDir::new("sync-write-through");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica(
                "a",
                redis.port,
                sync_patch(PERIOD_A, json!({ "write_through": true })),
            ),
            pods.replica("b", redis.port, sync_patch(PERIOD_B, json!({}))),
        ],
    );
    let (a, b) = (&fleet[0], &fleet[1]);
    b.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);
    // B's deadline: one jittered B period, plus A's tick, plus slack; far
    // below the A period it would otherwise take.
    let deadline = Duration::from_millis(PERIOD_B * 11 / 10) + SLACK;

    let mut outcomes = Vec::new();
    for attempt in 0..3u64 {
        let (starts0, ok0) = (a.pull_starts(), a.stat("cycles_ok"));
        let wt0 = a.stat("write_through_calls");
        let seed = 4000 + attempt * 100;
        let mut learned = learn(a, seed..seed + probes_for(deadline));
        let first_keys: Vec<String> = block_keys(&learned[0].prompt, 0);
        let in_redis = wait_until(Duration::from_millis(500) + SLACK, || {
            db.exists(&first_keys) == first_keys.len() as i64
        });
        let to_redis = learned[0].at.elapsed();
        let hit = first_synced(b, &mut learned, deadline);
        thread::sleep(Duration::from_millis(300)); // let A publish its stats
        let clean = a.pull_starts() == starts0 && a.stat("cycles_ok") == ok0;
        outcomes.push(format!(
            "attempt {attempt}: keys in redis {in_redis} after {to_redis:?}, B: {hit:?}, \
             A ran a periodic cycle meanwhile: {}",
            !clean
        ));
        if !clean {
            continue; // A's periodic push may have carried the blocks; retry.
        }
        assert!(
            in_redis,
            "write-through did not put A's blocks in Redis: {outcomes:#?}\n{}",
            a.sync_stats()
        );
        let hit = hit.unwrap_or_else(|e| {
            panic!(
                "B did not see A's write-through blocks: {e}\n{outcomes:#?}\n{}\n{}",
                a.sync_stats(),
                b.sync_stats()
            )
        });
        assert!(
            a.stat("write_through_calls") > wt0,
            "no write-through call counted\n{}",
            a.sync_stats()
        );
        eprintln!(
            "write-through: A's blocks in Redis after {to_redis:?}, B matched {:?} after \
             learning ({PERIOD_A} ms period on A)",
            hit.since_learned
        );
        return;
    }
    panic!("A's periodic cycle overlapped every attempt: {outcomes:#?}");
}

#[test]
fn large_value_set_exceeding_64k_mget_still_syncs() {
    // Written straight into Redis as an AIBrix Go gateway does: plain SETEX,
    // no change-log entry, so the replica finds them only with a full SCAN
    // (every `full_scan_every` = 6 cycles here), and ~1 KB payloads make a
    // 200-key MGET reply ~200 KB, far beyond what the bridge can return
    // (~64 KB): the engine must shrink its batches and still apply them all.
    const PERIOD: u64 = 500;
    const PROMPTS: usize = 10;
    const BLOCKS: usize = 30; // all below dense_prefix_blocks: every one probed
    const PAYLOAD: usize = 1024;
    let dir = TestDir::new("sync-large");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica(
            "r",
            redis.port,
            sync_patch(PERIOD, json!({ "full_scan_every": 6 })),
        )],
    );
    let r = &fleet[0];
    // Its start-up full scan is over: the keys below arrive by anti-entropy.
    r.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);
    let applied0 = r.stat("applied");
    let truncations0 = r.stat("truncations");

    let now = now_nanos();
    let mut commands = Vec::new();
    let mut prompts = Vec::new();
    let mut sizes = Vec::new();
    for i in 0..PROMPTS {
        let prompt = text(5000 + i as u64, BLOCKS * BLOCK);
        let blocks = anchored_blocks(&prompt, 0);
        assert_eq!(blocks.len(), BLOCKS);
        let pod = i % 4;
        for (block, anchor) in blocks {
            let mut holders = serde_json::Map::new();
            holders.insert(format!("127.0.0.1:{}", pods.ports[pod]), json!(now));
            let mut n = 0;
            while json!({ "model_to_pods": { MODEL: &holders } })
                .to_string()
                .len()
                < PAYLOAD
            {
                // Pods this fleet does not know (another gateway's pool).
                holders.insert(
                    format!("pad-{n:03}-{block:020}.pool.example:8000"),
                    json!(now - n),
                );
                n += 1;
            }
            let value = native_value(block, anchor, json!({ MODEL: holders }));
            sizes.push(value.len());
            commands.push(vec![
                "SETEX".to_string(),
                entity_key(block),
                "120".to_string(),
                value,
            ]);
        }
        prompts.push((prompt, pods.name(pod)));
    }
    let total = commands.len();
    assert_eq!(total, PROMPTS * BLOCKS);
    let mget200: usize = sizes.iter().take(200).sum();
    assert!(
        mget200 > 64 * 1024,
        "premise: 200 values are {mget200} bytes"
    );
    for reply in db.pipeline(&commands) {
        assert_eq!(reply, Resp::Simple("OK".into()));
    }

    // Up to one full-scan interval away, then the scan itself.
    let deadline = Duration::from_millis(6 * PERIOD * 11 / 10) + SLACK * 2;
    r.wait_stat("applied", deadline, |v| v >= applied0 + total as i64);
    eprintln!(
        "large values: {total} keys of ~{PAYLOAD} B applied; truncations {}, keys_pulled {}",
        r.stat("truncations") - truncations0,
        r.stat("keys_pulled")
    );

    // Every single key was applied: a prompt cut to k blocks fully matches
    // only if block k-1 is held (the search always probes the last block of
    // a full match), so k = 1..=30 checks each of the prompt's 30 keys.
    let mut misses = Vec::new();
    for (prompt, pod) in &prompts {
        for k in 1..=BLOCKS {
            let reply = r.complete(&prompt[..k * BLOCK]);
            let served = reply.expect_pod();
            let percent = reply.match_percent();
            if percent != 100 || &served != pod {
                misses.push(format!(
                    "{}.. cut to {k} blocks: {percent}% on {served}, written for {pod}",
                    &prompt[..8]
                ));
            }
        }
    }
    assert!(
        misses.is_empty(),
        "{} of {total} written blocks not routable: {misses:#?}\n{}",
        misses.len(),
        r.sync_stats()
    );
}

#[test]
fn redis_stopped_mid_run_requests_still_succeed_and_sync_resumes() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-redis-down");
    let port = free_port();
    let mut redis = Redis::start(&dir, port, None);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica("a", port, sync_patch(PERIOD, json!({}))),
            pods.replica("b", port, sync_patch(PERIOD, json!({}))),
        ],
    );
    let (a, b) = (&fleet[0], &fleet[1]);
    for r in [a, b] {
        r.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);
    }
    let failed0 = [a.stat("cycles_failed"), b.stat("cycles_failed")];
    assert_eq!(a.stat("backoff_ms"), PERIOD as i64, "{}", a.sync_stats());

    redis.kill();
    // Routing does not depend on Redis: every request is served.
    let mut during = learn(a, 6000..6020);
    for seed in 6500..6510 {
        assert_eq!(b.complete(&text(seed, PROMPT_LEN)).status, 200);
    }
    // Cycles fail and the wait doubles.
    let mut backoffs = vec![a.stat("backoff_ms")];
    let failing = wait_until(Duration::from_millis(PERIOD * 4) + SLACK * 2, || {
        let v = a.stat("backoff_ms");
        if backoffs.last() != Some(&v) {
            backoffs.push(v);
        }
        a.stat("cycles_failed") >= failed0[0] + 2 && b.stat("cycles_failed") > failed0[1]
    });
    assert!(
        failing,
        "cycles did not fail with Redis down\n{}\n{}",
        a.sync_stats(),
        b.sync_stats()
    );
    let backoff = a.stat("backoff_ms");
    assert!(
        backoff >= 2 * PERIOD as i64 && backoffs.windows(2).all(|w| w[1] > w[0]),
        "backoff did not grow: seen {backoffs:?}, now {backoff}\n{}",
        a.sync_stats()
    );
    during.extend(learn(a, 6020..6030));
    for seed in 6510..6515 {
        assert_eq!(b.complete(&text(seed, PROMPT_LEN)).status, 200);
    }

    // Redis back on the same port (empty: no keys, no change log).
    redis = Redis::start(&dir, port, None);
    let waits = [a.stat("backoff_ms"), b.stat("backoff_ms")];
    let resume = Duration::from_millis(*waits.iter().max().unwrap() as u64) + SLACK * 2;
    let ok = [a.stat("cycles_ok"), b.stat("cycles_ok")];
    a.wait_stat("cycles_ok", resume, |v| v > ok[0]);
    b.wait_stat("cycles_ok", resume, |v| v > ok[1]);
    assert_eq!(a.stat("backoff_ms"), PERIOD as i64, "backoff not reset");

    // What A learned while Redis was down stayed dirty and is pushed now.
    let hit = first_synced(b, &mut during, sync_deadline(PERIOD)).unwrap_or_else(|e| {
        panic!(
            "prompts learned during the outage never reached B: {e}\n{}\n{}",
            a.sync_stats(),
            b.sync_stats()
        )
    });
    eprintln!(
        "outage-learned prefix on B {:?} after probing began",
        hit.since_start
    );
    // And a new prefix syncs as usual.
    let deadline = sync_deadline(PERIOD);
    let mut after = learn(a, 6100..6100 + probes_for(deadline));
    first_synced(b, &mut after, deadline).unwrap_or_else(|e| {
        panic!(
            "a new prefix did not sync after Redis came back: {e}\n{}\n{}",
            a.sync_stats(),
            b.sync_stats()
        )
    });
    drop(redis);
}

/// Issue 9: Redis absent when Envoy starts. Clients are served as usual, the
/// singleton keeps probing, and once Redis comes up sync starts without a
/// restart: cycles succeed and change-log polls run from the first one.
#[test]
fn redis_absent_at_start_then_up_sync_starts_and_clients_never_fail() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-redis-absent");
    let port = free_port();
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica("a", port, sync_patch(PERIOD, json!({})))],
    );
    let a = &fleet[0];
    let client_failures = steady_load(a, 9200..9240);
    a.wait_stat("cycles_failed", SLACK * 2, |v| v >= 1);
    assert_eq!(client_failures, 0, "clients failed with Redis absent");
    assert_eq!(a.stat("cycles_ok"), 0, "{}", a.sync_stats());

    let redis = Redis::start(&dir, port, None);
    let resume = Duration::from_millis(a.stat("backoff_ms").max(0) as u64) + SLACK * 4;
    a.wait_stat("cycles_ok", resume, |v| v >= 1);
    a.wait_stat("polls_ok", Duration::from_millis(PERIOD * 2), |v| v >= 1);
    // What it routed while Redis was absent reaches Redis.
    assert!(
        wait_until(sync_deadline(PERIOD), || prefix_keys(&redis) > 0),
        "nothing pushed after Redis came up\n{}",
        a.sync_stats()
    );
}

/// Issue 9, items 2 and 3, through real Redis: values naming 2,400 models
/// do not fill the model registry (a client's new model still gets prefix
/// matches), and a record stamped far in the future does not pin its prefix
/// to a pod: once the key is gone it idles out like any other. (Before: the
/// registry filled for good, and the time was clamped to `u32::MAX` seconds,
/// so the record never idled out and won every merge.)
#[test]
fn hostile_values_neither_fill_the_model_registry_nor_pin_a_prefix() {
    const PERIOD: u64 = 500;
    const IDLE_SECS: u64 = 6;
    let dir = TestDir::new("sync-hostile-values");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let mut patch = sync_patch(PERIOD, json!({}));
    merge_json(&mut patch, &json!({ "table_idle_expiry_secs": IDLE_SECS }));
    let fleet = start_replicas(&dir, vec![pods.replica("a", redis.port, patch)]);
    let a = &fleet[0];
    a.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);

    // Written once A runs, so a slow start cannot age them out first.
    let pod = pods.endpoint_of(&pods.name(0));
    let flood: Vec<(String, String)> = (0..8u64)
        .map(|i| {
            let models: serde_json::Map<String, Value> = (0..300)
                .map(|j| {
                    (
                        format!("flood-{i}-{j}"),
                        json!({ pod.as_str(): now_nanos() }),
                    )
                })
                .collect();
            (
                entity_key(0xF100D + i),
                json!({ "model_to_pods": models }).to_string(),
            )
        })
        .collect();
    let pinned = text(9300, PROMPT_LEN);
    let pin = block_facts(&pinned, &pod, i64::MAX);
    let applied = a.stat("applied");
    db.setex_many(&flood, 600);
    db.setex_many(&pin, 600);
    // The next full scan (every 6th cycle) reads them all.
    a.wait_stat("applied", Duration::from_millis(PERIOD * 8) + SLACK, |v| {
        v >= applied + pin.len() as i64
    });
    // Models only Redis names take at most half of the registry: of the
    // 2,400, at least 1,888 are refused.
    a.wait_stat("facts_ignored", SLACK, |v| v >= 1800);

    // A model no request named before: matched on its second request.
    let url = a.envoy.url("/v1/completions");
    let fresh =
        json!({ "model": "a-new-model", "prompt": text(9301, PROMPT_LEN), "max_tokens": 8 });
    let ask = || {
        send(
            "POST",
            &url,
            &[("content-type", "application/json")],
            Some(fresh.to_string().as_bytes()),
            CLIENT_TIMEOUT,
        )
        .expect("POST a-new-model")
    };
    assert_eq!(ask().status, 200);
    let again = ask();
    assert_eq!(
        again.match_percent(),
        100,
        "a new model got no prefix match: the registry is full?\n{}",
        a.sync_stats()
    );

    // The writer's keys go away; past the idle expiry (and one more scan
    // that may have read them just before) the record is gone here too.
    let keys: Vec<&str> = pin.iter().map(|(k, _)| k.as_str()).collect();
    db.cmd(&[&["DEL"], keys.as_slice()].concat());
    thread::sleep(Duration::from_secs(IDLE_SECS) + Duration::from_millis(PERIOD * 6));
    let r = a.complete(&pinned);
    assert_eq!(
        r.match_percent(),
        0,
        "a record stamped in the future still routes its prefix (to {})\n{}",
        r.served_by(),
        a.sync_stats()
    );
}

/// Issue 13: with `scan_keys_per_cycle`, anti-entropy is a rotating SCAN
/// that reads a bounded slice per cycle instead of the whole namespace every
/// `full_scan_every` cycles; a value written without the change log (as
/// AIBrix's gateways write) is still found within one pass.
#[test]
fn rotating_scan_finds_log_less_writes_within_a_pass_at_a_bounded_cost() {
    const PERIOD: u64 = 500;
    const BUDGET: i64 = 100;
    let dir = TestDir::new("sync-rotating-scan");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let filler: Vec<(String, String)> = (0..600u64)
        .map(|i| (entity_key(0xF111 + i), "{}".to_string()))
        .collect();
    db.setex_many(&filler, 600);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica(
            "a",
            redis.port,
            sync_patch(PERIOD, json!({ "scan_keys_per_cycle": BUDGET })),
        )],
    );
    let a = &fleet[0];
    a.wait_stat("cycles_ok", SLACK * 2, |v| v >= 2);
    let full_scans = a.stat("full_scans");

    // Another writer, without the change log, says pod-3 holds a prompt.
    let prompt = text(9400, PROMPT_LEN);
    let pod = pods.endpoint_of(&pods.name(2));
    db.setex_many(&block_facts(&prompt, &pod, now_nanos() as i64), 600);
    // Two pass ends: the second pass ran wholly after the write.
    let passes = a.stat("scan_passes");
    let (slices, scanned) = (a.stat("scan_slices"), a.stat("keys_scanned"));
    a.wait_stat("scan_passes", Duration::from_secs(30), |v| v >= passes + 2);
    let r = a.complete(&prompt);
    assert_eq!(
        (r.served_by(), r.match_percent()),
        (pods.name(2), 100),
        "a log-less write was not found by a whole pass\n{}",
        a.sync_stats()
    );
    assert_eq!(a.stat("full_scans"), full_scans, "periodic full scans ran");
    // Each slice asks SCAN for at most BUDGET keys (the namespace's keys
    // are most of the keyspace).
    let per_slice = (a.stat("keys_scanned") - scanned) / (a.stat("scan_slices") - slices).max(1);
    assert!(
        per_slice <= BUDGET,
        "{per_slice} keys per slice\n{}",
        a.sync_stats()
    );
}

#[test]
fn auth_protected_redis_works() {
    const PERIOD: u64 = 500;
    const PASSWORD: &str = "s3cret-sync-pw";
    let dir = TestDir::new("sync-auth");
    let redis = Redis::start(&dir, free_port(), Some(PASSWORD));
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica(
                "a",
                redis.port,
                sync_patch(PERIOD, json!({ "auth_password": PASSWORD })),
            ),
            pods.replica(
                "b",
                redis.port,
                sync_patch(PERIOD, json!({ "auth_password": PASSWORD })),
            ),
            pods.replica(
                "c",
                redis.port,
                sync_patch(PERIOD, json!({ "auth_password": "wrong-pw" })),
            ),
        ],
    );
    let (a, b, c) = (&fleet[0], &fleet[1], &fleet[2]);
    let deadline = sync_deadline(PERIOD);
    let mut learned = learn(a, 7000..7000 + probes_for(deadline));
    let keys: Vec<String> = block_keys(&learned[0].prompt, 0);
    first_synced(b, &mut learned, deadline).unwrap_or_else(|e| {
        panic!(
            "no sync through password-protected Redis: {e}\n{}\n{}",
            a.sync_stats(),
            b.sync_stats()
        )
    });
    assert_eq!(db.exists(&keys), keys.len() as i64);

    // The wrong password fails every cycle, and routing carries on.
    c.wait_stat("cycles_failed", deadline * 2, |v| v >= 2);
    assert_eq!(c.stat("cycles_ok"), 0, "{}", c.sync_stats());
    assert_eq!(c.complete(&text(7999, PROMPT_LEN)).status, 200);
    let log = c.envoy.log_text();
    assert!(
        !log.contains("wrong-pw") && !a.envoy.log_text().contains(PASSWORD),
        "a password reached the Envoy log"
    );
}

/// Self-signed certificate for `localhost` / 127.0.0.1 (it is its own CA).
fn make_cert(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("redis.crt"), dir.join("redis.key"));
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then_some((cert, key))
}

#[test]
fn tls_and_auth_to_redis_sync() {
    const PERIOD: u64 = 500;
    const PASSWORD: &str = "tls-sync-pw";
    let dir = TestDir::new("sync-tls");
    // `make setup` installs openssl and a TLS-capable redis-server: a
    // machine without them fails here rather than passing untested.
    let Some((cert, key)) = make_cert(dir.path()) else {
        panic!("openssl cannot make a certificate here (run `make setup`)");
    };
    let (plain, tls) = (free_port(), free_port());
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let tls_port = tls.to_string();
    // A build without TLS refuses --tls-port at start-up.
    let redis = Redis::start_with(
        &dir,
        plain,
        Some(PASSWORD),
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &cert,
            "--tls-auth-clients",
            "no",
        ],
    );
    let db = RedisAt::of(&redis);
    let up = wait_until(Duration::from_secs(10), || {
        TcpStream::connect((Ipv4Addr::LOCALHOST, tls)).is_ok()
    });
    if !up {
        let log = tail(&dir.join("redis.log"), 10);
        panic!("TLS redis-server not ready (does it serve TLS?):\n{log}");
    }
    assert_eq!(db.cmd(&["PING"]), Resp::Simple("PONG".into()));

    let pods = Pods::start(&dir);
    let spec = |name| {
        EnvoySpec::new(name, "sync-tls.yaml", &pods.ports)
            .redis(tls)
            .merge(sync_patch(PERIOD, json!({ "auth_password": PASSWORD })))
            .plugins(2)
            .edit("/etc/ssl/certs/ca-certificates.crt", &cert)
    };
    let fleet = start_replicas(&dir, vec![spec("a"), spec("b")]);
    let (a, b) = (&fleet[0], &fleet[1]);
    let deadline = sync_deadline(PERIOD);
    let mut learned = learn(a, 8000..8000 + probes_for(deadline));
    let keys: Vec<String> = block_keys(&learned[0].prompt, 0);
    first_synced(b, &mut learned, deadline).unwrap_or_else(|e| {
        panic!(
            "no sync over TLS: {e}\n{}\n{}\n{}",
            a.sync_stats(),
            b.sync_stats(),
            a.log_tail()
        )
    });
    assert_eq!(db.exists(&keys), keys.len() as i64);
    // The bridge really spoke TLS to Redis (the TLS port speaks nothing else).
    let handshakes = a
        .envoy
        .stats_matching(r"^cluster\.redis\.ssl\.handshake$")
        .values()
        .sum::<i64>();
    assert!(handshakes > 0, "no TLS handshake on cluster redis");
}

/// Blocks routed right after Envoy comes up, before the sync singleton's
/// first tick, still reach Redis: the hand-off queue is registered when the
/// singleton is configured, before any listener serves.
#[test]
fn blocks_routed_before_the_first_sync_tick_still_reach_redis() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-early");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let spec = pods.replica("a", redis.port, sync_patch(PERIOD, json!({})));
    let a = Replica(launch(&dir, spec).unwrap_or_else(|e| panic!("replica a: {e}")));
    // No wait_singleton(): learn at once.
    let learned = learn(&a, 7000..7001);
    let keys = block_keys(&learned[0].prompt, 0);
    let mut present = 0;
    let pushed = wait_until(sync_deadline(PERIOD), || {
        present = db.exists(&keys);
        present == keys.len() as i64
    });
    assert!(
        pushed,
        "only {present} of {} keys reached Redis\n{}",
        keys.len(),
        a.sync_stats()
    );
    assert_eq!(
        a.envoy
            .settled_router_stat("prefix_router.sync.handoff_dropped"),
        0,
        "{}",
        a.sync_stats()
    );
}

/// Sends `n` fresh completions to `r`, one every 50 ms, and returns how many
/// did not answer 200 (steady client load while a fault is on).
fn steady_load(r: &Replica, seeds: std::ops::Range<u64>) -> usize {
    seeds
        .filter(|seed| {
            thread::sleep(Duration::from_millis(50));
            r.complete(&text(*seed, PROMPT_LEN)).status != 200
        })
        .count()
}

/// Issue 9, item 1: a bridge call that times out arrives as a response
/// without headers. Reading its `:status` through the SDK trapped the
/// singleton, and sync stayed dead without a sign. Now the singleton lives
/// through Redis being slower than the call timeout and then answering
/// garbage, the workers' liveness gauges show the outage, and sync resumes
/// when Redis is healthy again.
#[test]
fn singleton_survives_slow_and_garbage_redis_and_reports_liveness() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-slow-redis");
    let redis = Redis::start(&dir, free_port(), None);
    let proxy = harness::FaultProxy::start(redis.port);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica(
            "a",
            proxy.port,
            sync_patch(PERIOD, json!({ "op_timeout_ms": 1500 })),
        )],
    );
    let a = &fleet[0];
    let ok0 = a.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);
    // The workers report liveness from the singleton's heartbeat.
    let gauge = |name: &str| a.envoy.router_stat(&format!("prefix_router.sync.{name}"));
    assert!(
        wait_until(SLACK * 2, || a
            .envoy
            .router_stats()
            .contains_key("prefix_router.sync.singleton_age_s")),
        "no liveness gauge\n{}",
        a.sync_stats()
    );

    // Slower than the 1.5 s call timeout: calls end without headers.
    proxy.set_delay(Duration::from_millis(2500));
    let failed0 = a.stat("calls_failed");
    let mut client_failures = steady_load(a, 9000..9040);
    a.wait_stat("calls_failed", Duration::from_secs(20), |v| v > failed0);
    // Garbage instead of RESP.
    proxy.set_delay(Duration::ZERO);
    proxy.set_garbage(Some(b"HTTP/9 ???\r\n\x00\xff garbage\r\n"));
    let failed1 = a.stat("calls_failed");
    client_failures += steady_load(a, 9040..9080);
    a.wait_stat("calls_failed", Duration::from_secs(20), |v| v > failed1);
    // With no success for a while, the workers' gauge keeps counting.
    let age = gauge("last_success_age_s");
    assert!(
        age >= 2,
        "last_success_age_s {age} during the outage\n{}",
        a.sync_stats()
    );
    assert_eq!(client_failures, 0, "clients failed while Redis misbehaved");

    // Healthy again: the same singleton resumes syncing.
    proxy.set_garbage(None);
    let resume = Duration::from_millis(a.stat("backoff_ms").max(0) as u64) + SLACK * 4;
    let ok1 = a.stat("cycles_ok");
    assert!(ok1 >= ok0);
    a.wait_stat("cycles_ok", resume, |v| v > ok1);
    let log = a.envoy.log_text();
    assert!(
        !log.contains("unexpected status") && !log.contains("RuntimeError"),
        "the VM trapped:\n{}",
        a.log_tail()
    );
    assert!(
        wait_until(SLACK * 2, || gauge("last_success_age_s") <= 1
            && gauge("singleton_age_s") <= 1),
        "liveness gauges did not recover: success age {}, singleton age {}",
        gauge("last_success_age_s"),
        gauge("singleton_age_s")
    );
}

/// Issue 9, item 8: a middlebox between the bridge and Redis that closes
/// both directions when Envoy half-closes (after the request) loses every
/// reply. It is not a size problem: the calls are counted as empty replies,
/// an error log line names the likely cause, nothing is retried smaller or
/// blamed on values, and clients see nothing. (Before: each empty reply was
/// taken for a truncation, MGETs were halved down to single keys and every
/// key was reported oversized.)
#[test]
fn a_middlebox_closing_on_half_close_is_named_not_taken_for_truncation() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-middlebox");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let proxy = harness::FaultProxy::start(redis.port);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica("a", proxy.port, sync_patch(PERIOD, json!({})))],
    );
    let a = &fleet[0];
    a.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);
    // Something to read: values another writer left in the namespace.
    let entries: Vec<(String, String)> = (0..40)
        .map(|i| (format!("aibrix:{{prefixcache}}:e:{i}"), "{}".to_string()))
        .collect();
    db.setex_many(&entries, 600);

    // Redis answers after the middlebox has closed: nothing comes back.
    proxy.set_delay(Duration::from_millis(50));
    proxy.set_close_on_half_close(true);
    let failed0 = a.stat("cycles_failed");
    let client_failures = steady_load(a, 9100..9140);
    a.wait_stat("cycles_failed", Duration::from_secs(20), |v| {
        v >= failed0 + 2
    });
    assert_eq!(client_failures, 0, "clients failed behind the middlebox");
    assert!(a.stat("empty_replies") >= 2, "{}", a.sync_stats());
    assert_eq!(
        (a.stat("truncations"), a.stat("oversized_values")),
        (0, 0),
        "empty replies taken for truncations\n{}",
        a.sync_stats()
    );
    let log = a.envoy.log_text();
    assert!(
        log.contains("empty reply") && log.contains("half-close"),
        "no log line naming the cause:\n{}",
        a.log_tail()
    );

    // A path that passes the half-close on: sync resumes.
    proxy.set_close_on_half_close(false);
    proxy.set_delay(Duration::ZERO);
    let ok = a.stat("cycles_ok");
    let resume = Duration::from_millis(a.stat("backoff_ms").max(0) as u64) + SLACK * 4;
    a.wait_stat("cycles_ok", resume, |v| v > ok);
}

/// Issue 9, item 8: a writer of values too large for one reply slowed every
/// full scan: each one fetched them again (or, when the bridge cut the reply,
/// split its way down to them again), and the MGET batch shrank to one key
/// for a while after each. Now a full scan finds each such value once; the
/// next ones skip it and read the rest in full batches.
#[test]
fn oversized_values_from_a_hostile_writer_are_split_once_not_every_scan() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-oversized");
    let redis = Redis::start(&dir, free_port(), None);
    let db = RedisAt::of(&redis);
    let pods = Pods::start(&dir);
    let big = "x".repeat(1024 * 1024);
    let mut entries: Vec<(String, String)> = (0..200)
        .map(|i| (format!("aibrix:{{prefixcache}}:e:{i}"), "{}".to_string()))
        .collect();
    entries.extend((0..3).map(|i| (format!("aibrix:{{prefixcache}}:e:big{i}"), big.clone())));
    db.setex_many(&entries, 600);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica(
            "a",
            redis.port,
            // Every cycle is a full scan.
            sync_patch(PERIOD, json!({ "full_scan_every": 1 })),
        )],
    );
    let a = &fleet[0];
    a.wait_stat("oversized_values", SLACK * 2, |v| v >= 3);
    // The scan that found the third may still be splitting a batch; the
    // claim is about the scans after it.
    let found = a.stat("cycles_ok");
    a.wait_stat("cycles_ok", SLACK * 2, |v| v > found);
    let ok = a.stat("cycles_ok");
    let (truncations, calls, bytes) = (
        a.stat("truncations"),
        a.stat("calls_sent"),
        a.stat("bytes_received"),
    );
    a.wait_stat("cycles_ok", SLACK * 4, |v| v >= ok + 4);
    let cycles = a.stat("cycles_ok") - ok;
    assert_eq!(
        (a.stat("truncations"), a.stat("oversized_values")),
        (truncations, 3),
        "later scans fetched the large values again\n{}",
        a.sync_stats()
    );
    assert!(
        a.stat("oversized_skipped") >= 3 * cycles,
        "{}",
        a.sync_stats()
    );
    // Per cycle: a SCAN page or two, two MGETs, the podload namespace's
    // reads and pushes; not the 3 MiB and the one-key MGETs of fetching the
    // large values again.
    let per_cycle = (a.stat("calls_sent") - calls) / cycles;
    let bytes_per_cycle = (a.stat("bytes_received") - bytes) / cycles;
    assert!(
        per_cycle <= 10 && bytes_per_cycle < 256 * 1024,
        "{per_cycle} calls and {bytes_per_cycle} bytes per cycle\n{}",
        a.sync_stats()
    );
}

/// Issue 8: replicas whose endpoint lists come in different orders and differ
/// by one pod share one table correctly. Pods travel by name, and each
/// replica's slots are its own: every shared prefix A learned on a pod that B
/// also routes to goes to that same pod on B, as a full match.
#[test]
fn replicas_with_different_endpoint_lists_route_shared_prefixes_to_the_same_pods() {
    const PERIOD: u64 = 500;
    let dir = TestDir::new("sync-endpoint-order");
    let redis = Redis::start(&dir, free_port(), None);
    let pods = Pods::start(&dir);
    let all: Vec<String> = (0..4).map(|i| pods.endpoint_of(&pods.name(i))).collect();
    // B: reversed, and without pod-1.
    let mut b_list: Vec<String> = all[1..].to_vec();
    b_list.reverse();
    let with_endpoints = |list: &[String]| {
        let mut p = sync_patch(PERIOD, json!({}));
        merge_json(&mut p, &json!({ "endpoints": list }));
        p
    };
    let fleet = start_replicas(
        &dir,
        vec![
            pods.replica("a", redis.port, with_endpoints(&all)),
            pods.replica("b", redis.port, with_endpoints(&b_list)),
        ],
    );
    let (a, b) = (&fleet[0], &fleet[1]);
    let learned = learn(a, 7000..7024);
    let shared: Vec<&Learned> = learned
        .iter()
        .filter(|l| b_list.contains(&pods.endpoint_of(&l.pod)))
        .collect();
    assert!(shared.len() >= 10, "too few prefixes on pods B knows");
    // Past the sync bound, each prompt is asked of B exactly once.
    thread::sleep(sync_deadline(PERIOD));
    for l in shared {
        let r = b.complete(&l.prompt);
        assert_eq!(
            (r.expect_pod(), r.match_percent()),
            (l.pod.clone(), 100),
            "a prefix A learned on {} went elsewhere on B\n{}\n{}",
            l.pod,
            a.sync_stats(),
            b.sync_stats()
        );
    }
}

/// Keys of the `prefixcache` namespace in Redis.
fn prefix_keys(redis: &Redis) -> i64 {
    match redis.command(&[
        "EVAL",
        "return #redis.call('keys', ARGV[1])",
        "0",
        "aibrix:{prefixcache}:e:*",
    ]) {
        Ok(Resp::Int(n)) => n,
        _ => -1,
    }
}

/// Issue 9, items 4 and 5: Redis restarted empty. Before, 68 keys became 3
/// (nothing re-pushed what the replica knew), sync waited out a backoff of
/// up to 60 s, and change-log polls stayed off for another cycle.
///
/// The mechanism, read from the singleton's own counters: while cycles
/// fail it probes Redis every 2 s; the first answer after the restart
/// carries a new `run_id` (one `sync.redis_restarts`), so it marks the
/// whole table and starts a cycle at once, and that cycle, the first good
/// one (`sync.cycles_ok` + 1), writes every key back without a single new
/// request; polls resume right after it. One cycle, because after two
/// failed cycles the backoff (4 periods) is longer than the probe period:
/// the probe answers before a backed-off cycle could run. Waits are only
/// safety timeouts; how soon the table is back is not asserted.
#[test]
fn redis_restarted_empty_is_detected_by_its_run_id_and_refilled_by_the_first_good_cycle() {
    const PERIOD: u64 = 3000;
    /// The singleton's probe period while cycles fail.
    const PROBE_FAILING_MS: i64 = 2000;
    /// Generous: nothing here is a latency bound.
    const SAFETY: Duration = Duration::from_secs(60);
    let dir = TestDir::new("sync-redis-restart");
    let port = free_port();
    let mut redis = Redis::start(&dir, port, None);
    let pods = Pods::start(&dir);
    let fleet = start_replicas(
        &dir,
        vec![pods.replica("a", port, sync_patch(PERIOD, json!({})))],
    );
    let a = &fleet[0];
    a.wait_stat("cycles_ok", SLACK * 2, |v| v >= 1);
    let _learned = learn(a, 8000..8010);
    let mut before = 0;
    assert!(
        wait_until(sync_deadline(PERIOD), || {
            before = prefix_keys(&redis);
            before >= 10 * DENSE as i64
        }),
        "the table never reached Redis: {before} keys\n{}",
        a.sync_stats()
    );
    // Let the replica probe once while healthy (it learns Redis's run_id).
    a.wait_stat("probes", SAFETY, |v| v >= 1);
    let restarts = a.stat("redis_restarts");

    redis.kill();
    let failed = a.stat("cycles_failed");
    a.wait_stat("cycles_failed", SAFETY, |v| v >= failed + 2);
    // Nothing succeeds while Redis is down: neither cycles nor polls.
    let (cycles, polls) = (a.stat("cycles_ok"), a.stat("polls_ok"));
    let backoff = a.stat("backoff_ms");
    assert!(
        backoff >= 2 * PROBE_FAILING_MS,
        "backoff {backoff} ms: a backed-off cycle could run before the next probe\n{}",
        a.sync_stats()
    );
    redis = Redis::start(&dir, port, None);
    assert!(
        prefix_keys(&redis) < before,
        "Redis did not come back empty"
    );
    // The probe sees the new run_id ...
    a.wait_stat("redis_restarts", SAFETY, |v| v > restarts);
    // ... and the first good cycle after it writes the table back. (A
    // second cycle starts >= 0.9 period after it: the keys are read first.)
    a.wait_stat("cycles_ok", SAFETY, |v| v > cycles);
    let after = prefix_keys(&redis);
    assert_eq!(
        a.stat("cycles_ok") - cycles,
        1,
        "keys read after a second good cycle\n{}",
        a.sync_stats()
    );
    assert!(
        after >= before,
        "{after} of {before} keys back after the first good cycle\n{}",
        a.sync_stats()
    );
    assert_eq!(
        a.stat("redis_restarts"),
        restarts + 1,
        "one restart, counted once\n{}",
        a.sync_stats()
    );
    // Item 5: change-log polls resume right after the first good cycle (the
    // one that pushed the table back), not a cycle later: that cycle found
    // no log in the empty Redis and reads the one its push created from the
    // start. (Cycles are >= period/2 apart, polls every 175 ms.)
    a.wait_stat("polls_ok", SAFETY, |v| v > polls);
    let cycles_since = a.stat("cycles_ok") - cycles;
    assert_eq!(
        cycles_since,
        1,
        "polls resumed {cycles_since} cycles after Redis came back\n{}",
        a.sync_stats()
    );
    eprintln!(
        "Redis restarted empty: restart seen {} time(s); {after} of {before} keys back after \
         {} good cycle(s); backoff was {backoff} ms",
        a.stat("redis_restarts") - restarts,
        cycles_since,
    );
}
