//! Table inspection (issue 51) on a real Envoy with real pods: two listeners
//! delivered by LDS run the filter with one configuration, `inspect` naming
//! the second's filter chain (`admin_debug`). Requests routed on the traffic listener show
//! up in the answer on `admin_debug` with the numbers that were sent; the
//! same path on the traffic listener is an ordinary request, forwarded to a
//! pod.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{
    free_port, get, lds_listener, render_lds, send, text, wait_until, write_lds_listeners, Envoy,
    EnvoyOptions, Pod, Ports, TestDir, CLIENT_TIMEOUT,
};
use serde_json::{json, Value};

const PATH: &str = "/debug/prefix-table";
/// Buckets of the table below (8,192 records of 64 per bucket).
const BUCKETS: u64 = 128;
/// Buckets one answer reads: two pages cover the table.
const PAGE: u64 = 100;
/// 32 blocks of 128 bytes.
const PROMPT_LEN: usize = 4096;

struct Fleet {
    envoy: Envoy,
    debug_port: u16,
    ports: Ports,
    _pods: Vec<Pod>,
    _dir: TestDir,
}

fn start() -> Fleet {
    let dir = TestDir::new("inspect");
    let ports = Ports::free();
    let (path, listener_file) = render_lds(&dir, &ports);
    let debug_port = free_port();
    let mut patch = |config: &mut Value| {
        config["table_capacity_blocks"] = json!(BUCKETS * 64);
        config["inspect"] =
            json!({ "path": PATH, "filter_chain": "admin_debug", "max_buckets": PAGE });
    };
    let module = harness::wasm_module();
    write_lds_listeners(
        &listener_file,
        &[
            lds_listener(&ports, "ingress", ports.listener, &module, &mut patch),
            lds_listener(&ports, "admin_debug", debug_port, &module, &mut patch),
        ],
    );
    let pods = ports
        .pods
        .iter()
        .enumerate()
        .map(|(i, &port)| Pod::start(&dir, &format!("pod-{}", i + 1), port))
        .collect();
    let envoy = Envoy::start(
        &path,
        &ports,
        dir.join("envoy.log"),
        &EnvoyOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        wait_until(Duration::from_secs(10), || get(&format!(
            "http://127.0.0.1:{debug_port}{PATH}"
        ))
        .is_ok()),
        "the admin_debug listener never accepted"
    );
    Fleet {
        envoy,
        debug_port,
        ports,
        _pods: pods,
        _dir: dir,
    }
}

impl Fleet {
    fn complete(&self, seed: u64) -> harness::Reply {
        self.envoy
            .complete(&json!(text(seed, PROMPT_LEN)))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn inspect(&self, query: &str) -> Value {
        let r = get(&format!(
            "http://127.0.0.1:{}{PATH}{query}",
            self.debug_port
        ))
        .unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-served-by"), None, "a pod answered: {r:?}");
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
    }

    /// The table's address of the pod podsim calls `pod-<i>`.
    fn address_of(&self, served_by: &str) -> String {
        let i: usize = served_by.trim_start_matches("pod-").parse().unwrap();
        format!("127.0.0.1:{}", self.ports.pods[i - 1])
    }
}

/// Sums `records` by `name` over pages.
fn add_counts(into: &mut BTreeMap<String, u64>, list: &Value) {
    for c in list.as_array().unwrap() {
        *into
            .entry(c["name"].as_str().unwrap().to_string())
            .or_default() += c["records"].as_u64().unwrap();
    }
}

#[test]
fn the_named_chain_answers_the_table_as_routed_and_the_traffic_listener_forwards_the_path() {
    let f = start();
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    let prompts = 12;
    for seed in 0..prompts {
        let pod = f.complete(seed).expect_pod();
        *sent.entry(f.address_of(&pod)).or_default() += 1;
    }
    // Routed again: matches, refreshes its records, adds none.
    assert_eq!(f.complete(0).match_percent(), 100);
    let slots_used = f
        .envoy
        .router_stat_reaching("prefix_router.table.slots_used", 1);

    // Two pages: the cap holds, and the second starts where the first ended.
    let first = f.inspect("");
    assert_eq!(first["read"]["buckets_read"], PAGE);
    assert_eq!(first["read"]["max_buckets_per_request"], PAGE);
    assert_eq!(first["read"]["next_from"], PAGE);
    assert_eq!(first["read"]["complete"], false);
    assert_eq!(first["bounds"]["buckets"], BUCKETS);
    assert_eq!(first["bounds"]["capacity_records"], BUCKETS * 64);
    let second = f.inspect(&format!("?from={PAGE}"));
    assert_eq!(second["read"]["buckets_read"], BUCKETS - PAGE);
    assert_eq!(second["read"]["next_from"], Value::Null);

    let mut per_pod = BTreeMap::new();
    let mut per_model = BTreeMap::new();
    let mut live = 0;
    for page in [&first, &second] {
        add_counts(&mut per_pod, &page["per_pod"]);
        add_counts(&mut per_model, &page["per_model"]);
        live += page["occupancy"]["live_records"].as_u64().unwrap();
        assert_eq!(page["occupancy"]["expired_records"], 0);
        assert_eq!(page["occupancy"]["other_layout_buckets"], 0);
    }
    // Every record the filter filled is in the answer, under the pods that
    // served the prompts, in proportion to the prompts each served (every
    // prompt has the same length, so records the same number of blocks).
    assert_eq!(
        live,
        u64::try_from(slots_used).unwrap(),
        "records vs table.slots_used"
    );
    assert_eq!(
        per_model,
        BTreeMap::from([("test-model".to_string(), live)])
    );
    assert_eq!(
        per_pod.keys().collect::<Vec<_>>(),
        sent.keys().collect::<Vec<_>>()
    );
    assert_eq!(live % prompts, 0, "{live} records for {prompts} prompts");
    let per_prompt = live / prompts;
    for (pod, n) in &sent {
        assert_eq!(per_pod[pod], n * per_prompt, "records of {pod}");
    }
    // The oldest and newest records, and the anchor holding the most.
    let newest = [&first, &second]
        .iter()
        .filter_map(|p| p["newest"]["last_access"].as_u64())
        .max()
        .unwrap();
    let oldest = [&first, &second]
        .iter()
        .filter_map(|p| p["oldest"]["last_access"].as_u64())
        .min()
        .unwrap();
    let now = second["now"].as_u64().unwrap();
    assert!(oldest <= newest && newest <= now && now - oldest < 120);
    let top = &first["top_anchors"][0];
    assert!(top["records"].as_u64().unwrap() >= 1, "{top}");
    assert!(first["hits"].as_str().unwrap().starts_with("not tracked"));

    // Any other method on the path there: refused by the filter, not forwarded.
    let post = send(
        "POST",
        &format!("http://127.0.0.1:{}{PATH}", f.debug_port),
        &[],
        Some(b"{}"),
        CLIENT_TIMEOUT,
    )
    .unwrap();
    assert_eq!(post.status, 405, "{post:?}");
    assert_eq!(post.header("x-served-by"), None);

    // The same path on the traffic listener: an ordinary request, passed
    // through to a pod (podsim answers 404 for it).
    let passed = f
        .envoy
        .settled_router_stat("prefix_router.passthrough.path");
    let r = get(&f.envoy.url(PATH)).unwrap();
    assert!(r.header("x-served-by").is_some(), "not forwarded: {r:?}");
    assert_eq!(r.status, 404, "{r:?}");
    assert!(!r.body.contains("top_anchors"));
    assert_eq!(
        f.envoy
            .router_stat_reaching("prefix_router.passthrough.path", passed + 1),
        passed + 1
    );
}
