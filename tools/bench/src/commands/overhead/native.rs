//! The filter's pure logic timed natively (host build, in-memory store) on
//! the benchmark's own bodies, beside the in-Envoy numbers: what is compute
//! and what is wasm and hostcalls.

use std::time::Instant;

use envoy_prefix_router::config::Settings;
use envoy_prefix_router::rng::SplitMix64;
use envoy_prefix_router::route::request::{parse_body, ApiKind, PromptRequest};
use envoy_prefix_router::route::router::Router;
use envoy_prefix_router::shared::store::MemStore;
use serde_json::Value;

use crate::workload::{Api, Request};

/// Host-native timings of the filter's pure logic (parse, hash, route on an
/// in-memory store) over the benchmark's own bodies, in microseconds, and the
/// shared-data operations a request costs (each one a hostcall in Envoy).
#[derive(Clone, Copy, Default)]
pub struct Native {
    pub parse_us: f64,
    pub hash_us: f64,
    pub route_us: f64,
    pub store_ops: f64,
}

/// Mean time of parse, hash and route (+ release) per request over
/// `measured` in order on a store that has seen `primed` first, and
/// shared-data gets + sets per route + release.
fn native_pass(settings: &Settings, primed: &[Request], measured: &[Request]) -> Native {
    let hasher = envoy_prefix_router::route::hashing::BlockHasher::new(
        settings.block_size,
        settings.hash_seed,
    );
    let router = Router::new(settings.clone());
    let store = MemStore::new();
    let mut rng = SplitMix64::new(1);
    let kind = |r: &Request| match r.api {
        Api::Completions => ApiKind::Completions,
        Api::Chat => ApiKind::ChatCompletions,
    };
    // Routes a parsed request and releases it at once.
    let route_and_release = |req: &PromptRequest, rng: &mut SplitMix64| {
        if let Ok(routed) = router.route(&store, req, 1_000_000, rng) {
            router.release(&store, routed.ticket, routed.is_hit(), 1_000_000_000);
        }
    };
    for r in primed {
        let req = parse_body(kind(r), r.body.as_bytes()).expect("parse body");
        route_and_release(&req, &mut rng);
    }
    let mut n = Native::default();
    let mut ops = 0u64;
    for r in measured.iter() {
        let t = Instant::now();
        let req = parse_body(kind(r), r.body.as_bytes()).expect("parse body");
        n.parse_us += t.elapsed().as_secs_f64();
        let t = Instant::now();
        std::hint::black_box(hasher.hash(&req.prompt));
        n.hash_us += t.elapsed().as_secs_f64();
        let (g0, s0) = store.op_counts();
        let t = Instant::now();
        route_and_release(&req, &mut rng);
        n.route_us += t.elapsed().as_secs_f64();
        let (g1, s1) = store.op_counts();
        ops += (g1 - g0) + (s1 - s0);
    }
    let count = measured.len().max(1) as f64;
    Native {
        parse_us: n.parse_us * 1e6 / count,
        hash_us: n.hash_us * 1e6 / count,
        route_us: n.route_us * 1e6 / count,
        store_ops: ops as f64 / count,
    }
}

/// Native timings of the three workloads: matched 8 KB (the store primed
/// with `primers`, the groups' first requests), new 8 KB, new 400 KiB.
pub fn native_reference(
    primers: &[Request],
    matched: &[Request],
    fresh: &[Request],
    big: &[Request],
) -> [Native; 3] {
    let yaml = harness::envoy_template("single.yaml");
    let mut config = None;
    harness::patch_plugin_json(&yaml, &mut |v: &mut Value| config = Some(v.clone()));
    let config = config.expect("plugin JSON in single.yaml");
    let settings = Settings::from_json(config.to_string().as_bytes()).expect("valid settings");
    [
        native_pass(&settings, primers, &matched[..matched.len().min(1000)]),
        native_pass(&settings, &[], &fresh[..fresh.len().min(1000)]),
        native_pass(&settings, &[], &big[..big.len().min(20)]),
    ]
}
