//! A mixed fleet with AIBrix Go gateways (issue 10, item 3): one filter
//! replica on `envoy/aibrix.yaml` (`"compat": "aibrix"`, block size 4, seed
//! 0, pods named by their EDS hostname) against a real `redis-server` and real
//! podsim pods, with an independent AIBrix oracle (`tools/harness/src/aibrix/`,
//! written from AIBrix's Go source) standing in for the AIBrix gateways:
//! - a prompt an AIBrix gateway wrote for a pod is routed there by the filter
//!   at a 100 % match, after one sync period (chat and completions);
//! - a prompt the filter routed is found by AIBrix's lookup on the same pod,
//!   the whole prompt matched;
//! - a push of the filter keeps the entries AIBrix wrote for pods it does not
//!   know (the newer time wins per model and pod);
//! - a key whose pods are all unknown to the filter and old is left to its TTL.
//!
//! `mod oracle` tests the oracle itself (`cargo test --test aibrix oracle`):
//! hashing vectors, AIBrix's own hash-table test, rendering of AIBrix's own
//! examples, the Redis value.
//!
//! Timing: waits are deadlines derived from the 1 s sync period, never
//! latency assertions.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use harness::aibrix::{
    decode_block, now_nanos, prefix_text, AibrixReader, AibrixWriter, ModelToPods,
};
use harness::{
    free_port, send, tail, text, wait_until, write_eds, Envoy, EnvoyOptions, Pod, Redis, Reply,
    Setup, TestDir, CLIENT_TIMEOUT,
};
use serde_json::json;

/// The model every request names.
const MODEL: &str = "llama-3-8b-instruct";
/// The pods in EDS (Kubernetes pod names: no `:`).
const PODS: [&str; 3] = ["vllm-llama-a", "vllm-llama-b", "vllm-llama-c"];
/// Sync period of envoy/aibrix.yaml.
const PERIOD: Duration = Duration::from_millis(1000);
/// Generous deadline for anything that takes a few sync periods.
const DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// One request: a label for messages, its path and body.
#[derive(Clone, Debug)]
struct Case {
    label: &'static str,
    path: &'static str,
    body: String,
}

impl Case {
    /// The text an AIBrix gateway hashes for it (the oracle's rendering).
    fn aibrix_text(&self) -> String {
        prefix_text(self.path, &self.body)
            .unwrap_or_else(|e| panic!("{}: AIBrix refuses the body: {e}", self.label))
    }
}

/// `len` bytes of prompt text whose first byte differs for seeds less than 26
/// apart (with 4-byte blocks, texts sharing a first block would share a
/// partial match).
fn fresh(seed: u64, len: usize) -> String {
    let lead = char::from(b'A' + (seed % 26) as u8);
    format!("{lead}{}", text(seed, len - 1))
}

/// Three requests on fresh prompts (`seed` apart from any other call):
/// completions, chat with string contents, and chat with an array content
/// and tools (AIBrix hashes the raw bytes of the array, and the tools
/// canonicalized: sorted keys, compact, no HTML escaping, before the
/// messages).
fn cases(seed: u64) -> Vec<Case> {
    let completion = json!({ "model": MODEL, "prompt": fresh(seed, 400), "max_tokens": 8 });
    let chat = json!({
        "model": MODEL,
        "messages": [
            { "role": "system", "content": fresh(seed + 1, 160) },
            { "role": "user", "content": fresh(seed + 2, 240) },
        ],
        "max_tokens": 8,
    });
    // Written by hand: the array content's bytes (spaces included) and the
    // tools' key order are part of what is tested.
    let rich = format!(
        r#"{{"model": "{MODEL}", "max_tokens": 8,
  "messages": [
    {{"role": "system", "content": "{sys}"}},
    {{"role": "user", "content": [ {{"type": "text", "text": "{user}"}} ]}}
  ],
  "tools": [ {{"type": "function", "function": {{"name": "get_weather",
    "parameters": {{"type": "object", "properties": {{"city": {{"type": "string"}},
      "days": {{"type": "integer", "maximum": 1e1}}}}}},
    "description": "Weather <today> & tomorrow"}}}} ]
}}"#,
        sys = fresh(seed + 3, 120),
        user = fresh(seed + 4, 200),
    );
    vec![
        Case {
            label: "completions",
            path: "/v1/completions",
            body: completion.to_string(),
        },
        Case {
            label: "chat",
            path: "/v1/chat/completions",
            body: chat.to_string(),
        },
        Case {
            label: "chat with array content and tools",
            path: "/v1/chat/completions",
            body: rich,
        },
    ]
}

// ---------------------------------------------------------------------------
// The fleet: Redis, pods named by EDS hostname, one Envoy replica
// ---------------------------------------------------------------------------

/// Fields drop in order: Envoy first, the scratch dir last.
struct Fleet {
    envoy: Envoy,
    _redis: Redis,
    _pods: Vec<Pod>,
    writer: AibrixWriter,
    reader: AibrixReader,
    _eds: PathBuf,
    _dir: TestDir,
}

impl Fleet {
    fn start() -> Fleet {
        let (dir, ports, path) = Setup::new("aibrix.yaml").render();
        let redis = Redis::start(&dir, ports.redis, None);
        let pods: Vec<Pod> = PODS
            .iter()
            .map(|n| Pod::start(&dir, n, free_port()))
            .collect();
        let eds = dir.join("eds-pods.yaml");
        write_eds(
            &eds,
            &pods
                .iter()
                .map(|p| (p.name.clone(), p.port, "HEALTHY"))
                .collect::<Vec<_>>(),
        );
        let config = fs::read_to_string(&path).unwrap();
        assert!(config.contains("envoy/eds/aibrix-pods.yaml"));
        fs::write(
            &path,
            config.replace("envoy/eds/aibrix-pods.yaml", &eds.display().to_string()),
        )
        .unwrap();
        let envoy = Envoy::start(
            &path,
            &ports,
            dir.join("envoy.log"),
            &EnvoyOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let fleet = Fleet {
            envoy,
            _redis: redis,
            _pods: pods,
            writer: AibrixWriter::new(ports.redis),
            reader: AibrixReader::new(ports.redis),
            _eds: eds,
            _dir: dir,
        };
        let n = PODS.len() as i64;
        let members = wait_until(DEADLINE, || {
            fleet.stat("membership.members") == n && fleet.stat("membership.healthy") == n
        });
        assert!(
            members,
            "membership not {n}/{n}: members {} healthy {}\n{}",
            fleet.stat("membership.members"),
            fleet.stat("membership.healthy"),
            tail(&fleet.envoy.log, 20)
        );
        // Blocks routed before the singleton's first tick would never be
        // pushed: wait for it (its stats exist) and one good cycle.
        fleet.wait_cycles(1);
        fleet
    }

    /// A `prefix_router.<name>` stat (0 while not defined).
    fn stat(&self, name: &str) -> i64 {
        self.envoy.router_stat(&format!("prefix_router.{name}"))
    }

    fn sync_stats(&self) -> String {
        let stats: BTreeMap<String, i64> = self
            .envoy
            .router_stats()
            .into_iter()
            .filter(|(k, _)| k.starts_with("prefix_router.sync."))
            .collect();
        format!("{stats:?}\n{}", tail(&self.envoy.log, 20))
    }

    /// Waits until `n` more sync cycles completed (a cycle that started after
    /// the call pulled everything written before it).
    fn wait_cycles(&self, n: i64) {
        let start = self.stat("sync.cycles_ok");
        let ok = wait_until(DEADLINE, || self.stat("sync.cycles_ok") >= start + n);
        assert!(
            ok,
            "no {n} sync cycles in {DEADLINE:?}: {}",
            self.sync_stats()
        );
    }

    fn post(&self, case: &Case) -> Reply {
        send(
            "POST",
            &self.envoy.url(case.path),
            &[("content-type", "application/json")],
            Some(case.body.as_bytes()),
            CLIENT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{}: POST: {e}", case.label))
    }

    /// What Redis holds for the first and last block of `text`, for failure
    /// messages.
    fn redis_summary(&self, text: &str) -> String {
        let blocks = self.reader.blocks(text);
        let present = blocks.iter().filter(|(_, b)| b.is_some()).count();
        let show = |i: usize| -> String {
            blocks
                .get(i)
                .map(|(k, b)| format!("{k} = {b:?}"))
                .unwrap_or_default()
        };
        format!(
            "{present} of {} block keys present; first: {}; last: {}",
            blocks.len(),
            show(0),
            show(blocks.len().saturating_sub(1))
        )
    }
}

fn match_percent(reply: &Reply) -> Option<u32> {
    reply.header("x-prefix-match")?.trim().parse().ok()
}

// ---------------------------------------------------------------------------
// Integration tests
// ---------------------------------------------------------------------------

#[test]
fn prompt_written_by_aibrix_routes_to_its_pod_at_full_match() {
    let f = Fleet::start();
    let cases = cases(1000);
    // An AIBrix gateway routed each prompt to a pod (vllm-llama-a first).
    let targets: Vec<&str> = (0..cases.len()).map(|i| PODS[i % PODS.len()]).collect();
    for (case, pod) in cases.iter().zip(&targets) {
        let hashes = f.writer.add_prefix(MODEL, pod, &case.aibrix_text());
        assert!(
            hashes.len() > 50,
            "{}: only {} blocks",
            case.label,
            hashes.len()
        );
    }
    // The filter pulls the table every cycle: after two it has all of it.
    // (No request is sent before: a miss would record the prompt for
    // whatever pod the filter picked, at a local 100 % match.)
    f.wait_cycles(2);
    let mut failures = Vec::new();
    for (case, pod) in cases.iter().zip(&targets) {
        let reply = f.post(case);
        let served = reply.header("x-served-by").unwrap_or("").to_string();
        let percent = match_percent(&reply);
        if reply.status != 200 || served != *pod || percent != Some(100) {
            failures.push(format!(
                "{}: AIBrix wrote it for {pod}; the filter answered {} from {served:?} with \
                 x-prefix-match {percent:?}\n  AIBrix text starts {:?}\n  Redis: {}",
                case.label,
                reply.status,
                &case.aibrix_text()[..80],
                f.redis_summary(&case.aibrix_text())
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nsync stats: {}",
        failures.join("\n"),
        f.sync_stats()
    );
}

#[test]
fn prompt_routed_by_the_filter_is_found_by_aibrix_on_the_same_pod() {
    let f = Fleet::start();
    let cases = cases(2000);
    let mut routed = Vec::new();
    for case in &cases {
        let reply = f.post(case);
        routed.push((reply.expect_pod(), match_percent(&reply)));
    }
    // The filter pushes what it recorded on its next cycle.
    let expected: Vec<(String, usize, usize)> = cases
        .iter()
        .zip(&routed)
        .map(|(case, (pod, _))| {
            let n = f.reader.cfg.hashes(&case.aibrix_text()).len();
            (pod.clone(), n, n)
        })
        .collect();
    let lookup = |case: &Case| f.reader.lookup(MODEL, &case.aibrix_text(), &PODS);
    let all_found = wait_until(DEADLINE, || {
        cases
            .iter()
            .zip(&expected)
            .all(|(case, want)| lookup(case).as_ref() == Some(want))
    });
    if !all_found {
        let report: Vec<String> = cases
            .iter()
            .zip(&expected)
            .zip(&routed)
            .map(|((case, want), (pod, percent))| {
                format!(
                    "{}: filter routed to {pod} (x-prefix-match {percent:?}); AIBrix lookup \
                     (pod, matched, total) = {:?}, want {want:?}\n  Redis: {}",
                    case.label,
                    lookup(case),
                    f.redis_summary(&case.aibrix_text())
                )
            })
            .collect();
        panic!("{}\nsync stats: {}", report.join("\n"), f.sync_stats());
    }
}

#[test]
fn aibrix_entries_of_pods_the_filter_does_not_know_survive_its_pushes() {
    let f = Fleet::start();
    let cases = cases(3000);
    let other = "vllm-other-z"; // a pod behind an AIBrix gateway only
    let t0 = now_nanos();
    for case in &cases {
        f.writer
            .add_prefix_at(MODEL, other, &case.aibrix_text(), t0);
    }
    f.wait_cycles(2); // pulled: facts about a pod the filter does not know
    let mut routed = Vec::new();
    for case in &cases {
        routed.push(f.post(case).expect_pod());
    }
    // Wait until the filter pushed every block of every prompt for its pod.
    let has_pod = |case: &Case, pod: &str| -> bool {
        f.reader.blocks(&case.aibrix_text()).iter().all(|(_, b)| {
            b.as_ref()
                .and_then(|b| b.get(MODEL))
                .is_some_and(|pods| pods.contains_key(pod))
        })
    };
    let pushed = wait_until(DEADLINE, || {
        cases.iter().zip(&routed).all(|(c, pod)| has_pod(c, pod))
    });
    assert!(
        pushed,
        "the filter did not push its pod into every block key:\n{}\nsync stats: {}",
        cases
            .iter()
            .zip(&routed)
            .map(|(c, pod)| format!("{} ({pod}): {}", c.label, f.redis_summary(&c.aibrix_text())))
            .collect::<Vec<_>>()
            .join("\n"),
        f.sync_stats()
    );
    // One more cycle: any later push of the same keys is in, too.
    f.wait_cycles(1);
    let mut failures = Vec::new();
    for (case, pod) in cases.iter().zip(&routed) {
        for (key, block) in f.reader.blocks(&case.aibrix_text()) {
            let pods = block
                .as_ref()
                .and_then(|b| b.get(MODEL))
                .cloned()
                .unwrap_or_default();
            // The filter's own time may be coarser (whole seconds): only its
            // presence is checked; AIBrix's entry must be exactly as written.
            let ok = pods.get(other) == Some(&t0) && pods.contains_key(pod);
            if !ok {
                failures.push(format!(
                    "{} {key}: want {other}={t0} and {pod}, got {block:?}",
                    case.label
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the block keys lost AIBrix's entry or the filter's:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[test]
fn old_keys_of_pods_the_filter_does_not_know_leave_by_ttl_only() {
    let f = Fleet::start();
    // An AIBrix gateway's entry from 30 minutes ago (older than any idle
    // expiry) for a pod that is not in this Envoy's EDS.
    let old = now_nanos() - 30 * 60 * 1_000_000_000;
    let value: ModelToPods = BTreeMap::from([(
        MODEL.to_string(),
        BTreeMap::from([("vllm-other-y".to_string(), old)]),
    )]);
    let hashes = f.reader.cfg.hashes(&text(4000, 64));
    let ttl = 10;
    let written = Instant::now();
    let keys: Vec<String> = hashes
        .iter()
        .map(|&h| f.writer.put_block(h, &value, ttl))
        .collect();
    let stored: Vec<Option<String>> = f.reader.redis.mget(&keys);
    // Three pulls see the keys (every cycle is a full scan).
    f.wait_cycles(3);
    let elapsed = written.elapsed().as_secs() as i64;
    assert!(
        elapsed + 2 < ttl as i64,
        "cycles took {elapsed} s, too long for this test's {ttl} s TTL"
    );
    let now: Vec<Option<String>> = f.reader.redis.mget(&keys);
    assert_eq!(
        now,
        stored,
        "the filter deleted or rewrote keys it holds no pod of\nsync stats: {}",
        f.sync_stats()
    );
    for key in &keys {
        let left = f.reader.redis.ttl(key);
        assert!(
            left > 0 && left <= ttl as i64 - elapsed + 1,
            "{key}: TTL {left} s after {elapsed} s of a {ttl} s TTL: refreshed"
        );
    }
    for v in now.iter().flatten() {
        assert_eq!(decode_block(v).unwrap(), value);
    }
    // Nobody refreshes them: they expire with their TTL.
    let gone = wait_until(Duration::from_secs(ttl + 5), || {
        f.reader.redis.mget(&keys).iter().all(Option::is_none)
    });
    assert!(
        gone,
        "keys still there {:?} after their TTL",
        written.elapsed()
    );
    thread::sleep(PERIOD); // one more cycle must not bring them back
    assert!(f.reader.redis.mget(&keys).iter().all(Option::is_none));
}

// ---------------------------------------------------------------------------
// The oracle itself
// ---------------------------------------------------------------------------

mod oracle {
    use std::collections::{BTreeMap, HashMap};
    use std::hash::Hasher;

    use harness::aibrix::{
        canonical_tools_text, chat_messages_text, chat_prefix_text, completion_prefix_text,
        decode_block, encode_block, entity_key, merge_newer, parse_json, prefix_hashes,
        select_target, seq_search, xxh64, AibrixConfig, ModelToPods, PrefixMatch,
    };

    // -- XXH64 -------------------------------------------------------------

    const PRIME32: u64 = 2_654_435_761;
    const PRIME64: u64 = 11_400_714_785_074_694_797;

    /// xxHash's own sanity buffer (`xsum_sanity_check.c`): byte i is the top
    /// byte of PRIME32 * PRIME64^i.
    fn sanity_buffer(len: usize) -> Vec<u8> {
        let mut gen = PRIME32;
        (0..len)
            .map(|_| {
                let b = (gen >> 56) as u8;
                gen = gen.wrapping_mul(PRIME64);
                b
            })
            .collect()
    }

    #[test]
    fn oracle_xxh64_matches_reference_vectors() {
        // xxHash's sanity check vectors for XXH64 (seed 0 and PRIME32).
        let buf = sanity_buffer(222);
        let vectors: [(usize, u64, u64); 8] = [
            (0, 0, 0xEF46_DB37_51D8_E999),
            (0, PRIME32, 0xAC75_FDA2_929B_17EF),
            (1, 0, 0xE934_A84A_DB05_2768),
            (1, PRIME32, 0x5014_6076_43A9_B4C3),
            (14, 0, 0x8282_DCC4_994E_35C8),
            (14, PRIME32, 0xC3BD_6BF6_3DEB_6DF0),
            (222, 0, 0xB641_AE8C_B691_C174),
            (222, PRIME32, 0x20CB_8AB7_AE10_C14A),
        ];
        for (len, seed, want) in vectors {
            assert_eq!(xxh64(seed, &buf[..len]), want, "len {len} seed {seed}");
        }
        // Well-known string vectors.
        assert_eq!(xxh64(0, b"a"), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(0, b"abc"), 0x44BC_2CF5_AD77_0999);
        assert_eq!(
            xxh64(0, b"Nobody inspects the spammish repetition"),
            0xFBCE_A83C_8A37_8BF1
        );
        // The streaming digest (as Go's xxhash.Digest: two writes) equals
        // one shot over the concatenation.
        let mut d = twox_hash::XxHash64::with_seed(7);
        d.write(&buf[..8]);
        d.write(&buf[8..222]);
        assert_eq!(d.finish(), xxh64(7, &buf[..222]));
    }

    #[test]
    fn oracle_chain_is_seeded_parent_le_then_block_and_drops_the_tail() {
        let tokens = b"abcdefghij"; // 2 full blocks of 4, tail "ij" not hashed
        let hashes = prefix_hashes(0, tokens, 4);
        assert_eq!(hashes.len(), 2);
        let mut first = 0u64.to_le_bytes().to_vec(); // parent = seed
        first.extend_from_slice(b"abcd");
        assert_eq!(hashes[0], xxh64(0, &first));
        let mut second = hashes[0].to_le_bytes().to_vec();
        second.extend_from_slice(b"efgh");
        assert_eq!(hashes[1], xxh64(0, &second));
        // The seed is both the hash seed and the first parent.
        let mut seeded = 5u64.to_le_bytes().to_vec();
        seeded.extend_from_slice(b"abcd");
        assert_eq!(prefix_hashes(5, tokens, 4)[0], xxh64(5, &seeded));
        assert!(prefix_hashes(0, b"abc", 4).is_empty());
        assert_eq!(prefix_hashes(0, b"abcdefgh", 4), hashes);
    }

    /// `hash.go` `Test_HashChaining`: same prefix, same hashes; a change in
    /// a block changes it and every later one, never an earlier one.
    #[test]
    fn oracle_hash_chaining_as_aibrix_tests_it() {
        let h1 = prefix_hashes(0, &[1, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_eq!(h1, prefix_hashes(0, &[1, 2, 3, 4, 5, 6, 7, 8], 4));
        let h3 = prefix_hashes(0, &[1, 2, 3, 4, 5, 6, 7, 9], 4);
        assert_eq!(h1[0], h3[0]);
        assert_ne!(h1[1], h3[1]);
        let h5 = prefix_hashes(0, &[0, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_ne!(h1[0], h5[0]);
        assert_ne!(h1[1], h5[1]);
    }

    // -- AIBrix's hash table test, on an in-memory store --------------------

    /// `PrefixHashTable` (AddPrefix / MatchPrefix) over a map.
    #[derive(Default)]
    struct MemTable {
        blocks: HashMap<u64, ModelToPods>,
        clock: i64,
    }

    impl MemTable {
        fn add(&mut self, hashes: &[u64], model: &str, pod: &str) {
            self.clock += 1;
            for &h in hashes {
                self.blocks
                    .entry(h)
                    .or_default()
                    .entry(model.into())
                    .or_default()
                    .insert(pod.into(), self.clock);
            }
        }

        fn matches(&self, tokens: &[u8], model: &str) -> PrefixMatch {
            let hashes = prefix_hashes(0, tokens, 4);
            seq_search(&hashes, model, &["p1", "p2", "p3"], |_, h| {
                self.blocks.get(&h).cloned()
            })
        }
    }

    fn percents(m: &PrefixMatch) -> BTreeMap<String, usize> {
        m.pods.iter().map(|(p, &(pc, _))| (p.clone(), pc)).collect()
    }

    /// `hash_test.go` `Test_PrefixHashTableE2E`, step by step.
    #[test]
    fn oracle_reproduces_aibrix_prefix_hash_table_e2e() {
        let mut t = MemTable::default();
        let seq = |n: u8| (1..=n).collect::<Vec<u8>>();
        let m = t.matches(&seq(9), "m1");
        assert!(m.pods.is_empty());
        assert_eq!(m.hashes.len(), 2);
        t.add(&m.hashes, "m1", "p1");

        for (tokens, blocks) in [(seq(7), 1), (seq(8), 2), (seq(9), 2), (seq(13), 3)] {
            let m = t.matches(&tokens, "m1");
            assert_eq!(m.pods.keys().collect::<Vec<_>>(), ["p1"], "{tokens:?}");
            assert_eq!(m.hashes.len(), blocks);
        }
        // No prefix match from the middle, though those blocks were added.
        let m = t.matches(&[5, 6, 7, 8, 9, 10, 11, 12, 13], "m1");
        assert!(m.pods.is_empty());
        assert_eq!(m.hashes.len(), 2);
        // Another model with the same prefix.
        let m = t.matches(&seq(13), "m2");
        assert!(m.pods.is_empty());
        assert_eq!(m.hashes.len(), 3);
        let hashes = m.hashes;
        t.add(&hashes, "m2", "p1");
        t.add(&hashes[..2], "m2", "p2");
        let m = t.matches(&seq(8), "m2");
        assert_eq!(m.pods.len(), 2);
        let m = t.matches(&seq(13), "m2");
        assert_eq!(
            percents(&m),
            BTreeMap::from([("p1".into(), 100), ("p2".into(), 66)])
        );
        assert_eq!(m.pods["p2"].1, 2);
        // The longest match wins when loads are equal.
        let ready = ["p1", "p2", "p3"];
        assert_eq!(
            select_target(&percents(&m), &ready, &BTreeMap::new(), 1.0).as_deref(),
            Some("p1")
        );
        // A pod that is not ready is not matched.
        let only_p2 = seq_search(&hashes, "m2", &["p2", "p3"], |_, h| {
            t.blocks.get(&h).cloned()
        });
        assert_eq!(percents(&only_p2), BTreeMap::from([("p2".into(), 66)]));
    }

    #[test]
    fn oracle_selection_skips_a_matched_pod_above_mean_plus_stddev() {
        let matched = BTreeMap::from([("a".to_string(), 100), ("b".to_string(), 50)]);
        let ready = ["a", "b", "c", "d"];
        // Loads 10,0,0,0: mean 2.5, stddev ~4.33: a (10) is out, b is in.
        let counts = BTreeMap::from([("a".to_string(), 10)]);
        assert_eq!(
            select_target(&matched, &ready, &counts, 1.0).as_deref(),
            Some("b")
        );
        assert_eq!(
            select_target(&matched, &ready, &BTreeMap::new(), 1.0).as_deref(),
            Some("a")
        );
        assert_eq!(select_target(&BTreeMap::new(), &ready, &counts, 1.0), None);
    }

    // -- Rendering: AIBrix's own examples (gateway prefix-text tests) -------

    const MESSAGES: &str = r#""messages":[{"role":"system","content":"you are a helpful assistant"},{"role":"user","content":[{"type":"text","text":"what is the weather?"}]}]"#;
    const MESSAGES_TEXT: &str =
        r#"you are a helpful assistant [{"type":"text","text":"what is the weather?"}]"#;
    const WEATHER: &str = r#"[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","maximum":1e1}}}}}]"#;
    const WEATHER_CANONICAL: &str = r#"[{"function":{"description":"Get the weather","name":"get_weather","parameters":{"properties":{"city":{"type":"string"},"days":{"maximum":1e1,"type":"integer"}},"type":"object"}},"type":"function"}]"#;

    #[test]
    fn oracle_chat_without_tools_is_the_messages_text() {
        for (name, body) in [
            ("absent", format!(r#"{{"model":"m",{MESSAGES}}}"#)),
            (
                "null",
                format!(r#"{{"model":"m",{MESSAGES},"tools":null}}"#),
            ),
            ("empty", format!(r#"{{"model":"m",{MESSAGES},"tools":[]}}"#)),
            (
                "empty ws",
                format!(r#"{{"model":"m",{MESSAGES},"tools":[ ]}}"#),
            ),
            (
                "before",
                format!(r#"{{"model":"m","tools":[],{MESSAGES}}}"#),
            ),
            (
                "object",
                format!(r#"{{"model":"m",{MESSAGES},"tools":{{}}}}"#),
            ),
            (
                "string",
                format!(r#"{{"model":"m",{MESSAGES},"tools":"x"}}"#),
            ),
        ] {
            assert_eq!(chat_messages_text(&body).unwrap(), MESSAGES_TEXT, "{name}");
            assert_eq!(
                chat_prefix_text(&body, true).unwrap(),
                MESSAGES_TEXT,
                "{name}"
            );
        }
    }

    #[test]
    fn oracle_chat_tools_canonical_then_space_then_messages() {
        let body = format!(r#"{{"model":"m",{MESSAGES},"tools":{WEATHER}}}"#);
        assert_eq!(
            chat_prefix_text(&body, true).unwrap(),
            format!("{WEATHER_CANONICAL} {MESSAGES_TEXT}")
        );
        // AIBRIX_PREFIX_CACHE_INCLUDE_TOOLS=false: the messages alone.
        assert_eq!(chat_prefix_text(&body, false).unwrap(), MESSAGES_TEXT);
        // Anthropic-style tools render the same way (schema-agnostic).
        let anthropic = r#"[{"name":"get_weather","input_schema":{"type":"object"},"description":"Get the weather"}]"#;
        assert_eq!(
            canonical_tools_text(anthropic, true),
            r#"[{"description":"Get the weather","input_schema":{"type":"object"},"name":"get_weather"}]"#
        );
        // HTML characters are not escaped.
        let html =
            r#"[{"type":"function","function":{"name":"f","description":"a < b && c > d"}}]"#;
        let text = canonical_tools_text(html, true);
        assert!(text.contains(r#""a < b && c > d""#), "{text}");
        // Invalid JSON falls back to the trimmed raw bytes.
        assert_eq!(canonical_tools_text(r#" [{"type": "#, true), r#"[{"type":"#);
        // Key order and whitespace do not matter.
        let shuffled = r#"[ {"function" : {"parameters": {"properties": {"days": {"maximum": 1e1, "type": "integer"},
            "city": {"type": "string"}}, "type": "object"}, "description": "Get the weather",
            "name": "get_weather"}, "type": "function"} ]"#;
        assert_eq!(canonical_tools_text(shuffled, true), WEATHER_CANONICAL);
    }

    #[test]
    fn oracle_chat_contents_string_unquoted_array_raw() {
        let body = r#"{"model":"m","messages":[
            {"role":"system","content":"say \"hi\"\n\u00e9\ud83d\ude00"},
            {"role":"user","content": [ {"type": "text",  "text": "x"} ] },
            {"role":"assistant"},
            {"role":"user","content":{"k" : 1}},
            {"role":"user","content":null}]}"#;
        assert_eq!(
            chat_messages_text(body).unwrap(),
            "say \"hi\"\n\u{e9}\u{1F600} [ {\"type\": \"text\",  \"text\": \"x\"} ]  {\"k\" : 1} null"
        );
        assert!(chat_messages_text(r#"{"model":"m","messages":[]}"#).is_err());
        assert!(chat_messages_text(r#"{"model":"m"}"#).is_err());
        assert!(chat_messages_text(r#"{"model":"m","messages":"x"}"#).is_err());
    }

    #[test]
    fn oracle_completions_prompt_must_be_a_string() {
        assert_eq!(
            completion_prefix_text(r#"{"model":"m","prompt":"a\tb"}"#).unwrap(),
            "a\tb"
        );
        assert_eq!(completion_prefix_text(r#"{"model":"m"}"#).unwrap(), "");
        assert!(completion_prefix_text(r#"{"model":"m","prompt":["a","b"]}"#).is_err());
        assert!(completion_prefix_text(r#"{"model":"m","prompt":[1,2]}"#).is_err());
    }

    #[test]
    fn oracle_json_reader_keeps_spans_and_number_spelling() {
        let doc = parse_json(r#" {"a": [1.50, -0, 2E+3], "a": "last"} "#).unwrap();
        assert_eq!(
            doc.get("a")
                .unwrap()
                .raw(r#" {"a": [1.50, -0, 2E+3], "a": "last"} "#),
            r#""last""#
        );
        for bad in ["", "{", "[1,]", "01", "1.", "\"\u{1}\"", "{} x", "tru"] {
            assert!(parse_json(bad).is_err(), "{bad:?} parsed");
        }
    }

    // -- Redis keys and values ------------------------------------------------

    #[test]
    fn oracle_key_and_value_round_trip() {
        let cfg = AibrixConfig::default();
        assert_eq!((cfg.block_size, cfg.seed, cfg.ttl_secs), (4, 0, 120));
        assert_eq!(cfg.key(123), "aibrix:{prefixcache}:e:123");
        assert_eq!(
            entity_key("p", "ns", u64::MAX),
            "p:{ns}:e:18446744073709551615"
        );
        let block: ModelToPods = BTreeMap::from([
            (
                "m2".to_string(),
                BTreeMap::from([("pod-b".to_string(), 2), ("pod-a".to_string(), -1)]),
            ),
            (
                "m1".to_string(),
                BTreeMap::from([("a<b".to_string(), 1_700_000_000_123_456_789)]),
            ),
        ]);
        let wire = encode_block(&block);
        // Go json.Marshal: keys sorted, compact, HTML escaped.
        assert_eq!(
            wire,
            r#"{"model_to_pods":{"m1":{"a\u003cb":1700000000123456789},"m2":{"pod-a":-1,"pod-b":2}}}"#
        );
        assert_eq!(decode_block(&wire).unwrap(), block);
        // Unknown fields ignored, absent or null model_to_pods = empty.
        assert_eq!(
            decode_block(r#"{"x":1,"model_to_pods":{"m":{"p":5}}}"#).unwrap(),
            BTreeMap::from([("m".into(), BTreeMap::from([("p".into(), 5)]))])
        );
        assert!(decode_block("{}").unwrap().is_empty());
        assert!(decode_block(r#"{"model_to_pods":null}"#)
            .unwrap()
            .is_empty());
        assert!(decode_block(r#"{"model_to_pods":{"m":{"p":1.5}}}"#).is_err());
        assert!(decode_block("not-json").is_err());
    }

    #[test]
    fn oracle_merge_keeps_others_and_the_newer_time() {
        let mut local: ModelToPods = BTreeMap::from([(
            "m".into(),
            BTreeMap::from([("a".into(), 10), ("b".into(), 30)]),
        )]);
        let remote: ModelToPods = BTreeMap::from([
            (
                "m".into(),
                BTreeMap::from([("a".into(), 20), ("b".into(), 5), ("z".into(), 1)]),
            ),
            ("m2".into(), BTreeMap::from([("q".into(), 7)])),
        ]);
        merge_newer(&mut local, &remote);
        assert_eq!(
            local,
            BTreeMap::from([
                (
                    "m".into(),
                    BTreeMap::from([("a".into(), 20), ("b".into(), 30), ("z".into(), 1)])
                ),
                ("m2".into(), BTreeMap::from([("q".into(), 7)])),
            ])
        );
    }
}
