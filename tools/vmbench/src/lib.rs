//! `make bench-compute`: the filter's request-path compute, parse, block
//! hashing and routing over the in-memory store, compiled for
//! `wasm32-unknown-unknown` and timed by `scripts/bench/vm-compute.js` under
//! node's V8 (TurboFan, as Envoy's V8 is configured). No hostcalls, no
//! Envoy: what the filter's own code costs in a V8 wasm VM, on the
//! benchmark's body shapes (those of `prefix-bench overhead`).
//!
//! The module builds its bodies itself ([`prepare`]); the script times
//! [`run`] over them, and [`run_one`] one body at a time with the CPU
//! caches flushed before each (the request path in Envoy runs cold, after
//! Envoy's own work). The global allocator counts allocations
//! ([`allocations`]). Exports take and return plain integers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

use envoy_prefix_router::config::Settings;
use envoy_prefix_router::rng::SplitMix64;
use envoy_prefix_router::route::hashing::BlockHasher;
use envoy_prefix_router::route::request::{parse_body, ApiKind};
use envoy_prefix_router::route::router::Router;
use envoy_prefix_router::shared::store::MemStore;

/// `envoy/single.yaml`'s plugin configuration.
const CONFIG: &str = r#"{
  "endpoints": ["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003", "127.0.0.1:18004"],
  "block_size": 128, "hash_seed": 0, "table_capacity_blocks": 200000,
  "table_idle_expiry_secs": 1200, "dense_prefix_blocks": 32, "imbalance_abs_count": 16,
  "stddev_factor": 2.0, "match_header": "x-prefix-match", "max_body_bytes": 8388608,
  "policy": { "mode": "load_aware" },
  "signals": { "enabled": true, "cluster": "pods", "interval_ms": 250 },
  "sync": { "enabled": false }
}"#;

struct Bench {
    router: Router,
    store: MemStore,
    rng: SplitMix64,
    hasher: BlockHasher,
    /// Per workload (0: 8 KB chat bodies whose 6 KB system prompt was
    /// routed before, 1: 8 KB chat bodies sharing nothing, 2: 400 KiB
    /// completions): its kind and bodies.
    bodies: Vec<(ApiKind, Vec<String>)>,
    /// One body per group's system prompt, routed first.
    primers: Vec<String>,
    settings: Settings,
}

thread_local! {
    static BENCH: RefCell<Option<Bench>> = const { RefCell::new(None) };
}

/// Filler text of `len` bytes (words, as `harness::text`).
fn text(rng: &mut SplitMix64, len: usize) -> String {
    const WORDS: &[&str] = &[
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    ];
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        out.push_str(WORDS[rng.below(WORDS.len())]);
        out.push(' ');
    }
    out.truncate(len);
    out
}

fn chat(system: &str, question: &str) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{question}"}}],"max_tokens":16}}"#
    )
}

/// Builds the bodies (`n` per 8 KB workload, `big` of 400 KiB) and a fresh
/// router whose table has seen every matched group's system prompt once.
/// Returns 1, or 0 if the configuration is refused.
#[no_mangle]
pub extern "C" fn prepare(n: u32, big: u32) -> u32 {
    let Ok(settings) = Settings::from_json(CONFIG.as_bytes()) else {
        return 0;
    };
    let mut rng = SplitMix64::new(7);
    let groups: Vec<String> = (0..200).map(|_| text(&mut rng, 6 * 1024)).collect();
    let n = n as usize;
    let matched: Vec<String> = (0..n)
        .map(|i| chat(&groups[i % groups.len()], &text(&mut rng, 2048)))
        .collect();
    let fresh: Vec<String> = (0..n)
        .map(|_| chat(&text(&mut rng, 6 * 1024), &text(&mut rng, 2048)))
        .collect();
    let large: Vec<String> = (0..big)
        .map(|_| {
            format!(
                r#"{{"model":"m","prompt":"{}","max_tokens":16}}"#,
                text(&mut rng, 400 * 1024)
            )
        })
        .collect();
    let mut bench = Bench {
        hasher: BlockHasher::new(settings.block_size, settings.hash_seed),
        router: Router::new(settings.clone()),
        store: MemStore::new(),
        rng: SplitMix64::new(1),
        bodies: vec![
            (ApiKind::ChatCompletions, matched),
            (ApiKind::ChatCompletions, fresh),
            (ApiKind::Completions, large),
        ],
        primers: groups.iter().map(|g| chat(g, "primer")).collect(),
        settings,
    };
    prime(&mut bench);
    BENCH.with(|b| *b.borrow_mut() = Some(bench));
    1
}

/// A fresh router and table that has seen every group's system prompt.
fn prime(b: &mut Bench) {
    b.router = Router::new(b.settings.clone());
    b.store = MemStore::new();
    b.rng = SplitMix64::new(1);
    let primers = std::mem::take(&mut b.primers);
    for p in &primers {
        route_one(b, ApiKind::ChatCompletions, p.as_bytes());
    }
    b.primers = primers;
}

/// Starts the table over (only the primers seen): the next routing pass
/// meets new prefixes as new, and matched bodies' questions as new too.
#[no_mangle]
pub extern "C" fn reset() {
    BENCH.with(|cell| {
        if let Some(b) = cell.borrow_mut().as_mut() {
            prime(b);
        }
    });
}

/// Routes one body and releases it; false if it did not route.
fn route_one(b: &mut Bench, kind: ApiKind, body: &[u8]) -> bool {
    let Ok(req) = parse_body(kind, body) else {
        return false;
    };
    match b.router.route(&b.store, &req, 1_000_000, &mut b.rng) {
        Ok(routed) => {
            b.router
                .release(&b.store, routed.ticket, routed.is_hit(), 1_000_000_000);
            true
        }
        Err(_) => false,
    }
}

/// Runs `stage` (0 parse, 1 parse + hash, 2 parse + route + release) on one
/// body; whether it succeeded.
fn stage_one(b: &mut Bench, stage: u32, kind: ApiKind, body: &[u8]) -> bool {
    match stage {
        0 => parse_body(kind, body).is_ok(),
        1 => parse_body(kind, body)
            .map(|r| std::hint::black_box(b.hasher.hash(&r.prompt)).len())
            .is_ok(),
        _ => route_one(b, kind, body),
    }
}

/// Runs `stage` on the bodies of `workload` in `range`, in order; returns
/// how many succeeded.
fn run_range(stage: u32, workload: u32, range: std::ops::Range<usize>) -> u32 {
    BENCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        let Some(b) = guard.as_mut() else {
            return 0;
        };
        let Some((kind, bodies)) = b.bodies.get_mut(workload as usize) else {
            return 0;
        };
        let kind = *kind;
        // Out of `b` while `b` routes (put back below): no copy.
        let bodies = std::mem::take(bodies);
        let end = range.end.min(bodies.len());
        let ok = bodies
            .get(range.start.min(end)..end)
            .unwrap_or_default()
            .iter()
            .map(|body| u32::from(stage_one(b, stage, kind, body.as_bytes())))
            .sum();
        if let Some(slot) = b.bodies.get_mut(workload as usize) {
            slot.1 = bodies;
        }
        ok
    })
}

/// Runs `stage` (0 parse, 1 parse + hash, 2 parse + route + release) over
/// every body of `workload`, in order; returns how many succeeded.
#[no_mangle]
pub extern "C" fn run(stage: u32, workload: u32) -> u32 {
    run_range(stage, workload, 0..usize::MAX)
}

/// Runs `stage` on body `index` of `workload` alone; 1 if it succeeded.
#[no_mangle]
pub extern "C" fn run_one(stage: u32, workload: u32, index: u32) -> u32 {
    let i = index as usize;
    run_range(stage, workload, i..i + 1)
}

/// Bodies in `workload` (for the script's per-request division).
#[no_mangle]
pub extern "C" fn bodies(workload: u32) -> u32 {
    BENCH.with(|cell| {
        cell.borrow()
            .as_ref()
            .and_then(|b| b.bodies.get(workload as usize))
            .map_or(0, |(_, v)| v.len() as u32)
    })
}

/// Allocations (and reallocations) since the last call.
#[no_mangle]
pub extern "C" fn allocations() -> u32 {
    ALLOCATIONS.swap(0, Ordering::Relaxed)
}

static ALLOCATIONS: AtomicU32 = AtomicU32::new(0);

/// The system allocator, counting calls (Rust's dlmalloc on this target;
/// the filter, on `wasm32-wasip1`, has wasi-libc's, also a dlmalloc).
struct Counting;

// SAFETY: forwards every call unchanged to `System`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;
