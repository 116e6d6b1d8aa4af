//! `prefix-bench overhead`: what the filter costs per request, priced against
//! the floor that any body-routing wasm filter pays in this Envoy.
//!
//! Four Envoys (`--concurrency 1` each) in front of the same pods answering
//! at once (`--time-scale 0`), all measured in one run:
//! - plain: no filter (`envoy/plain.yaml`, round robin);
//! - reference: the minimal body-routing filter (`envoy/reference.yaml`,
//!   `tools/reffilter`): pause at the headers, read the whole body, set
//!   `x-gateway-destination-endpoint` to one of the pods, drawn at random
//!   per request (a router spreads requests, and Envoy's cost of talking to
//!   several upstreams is not the router's: one fixed pod measured ~30 us
//!   less Envoy CPU per 8 KB request), continue;
//! - this filter (`envoy/single.yaml`);
//! - diagnostic: this filter passing every request at the headers
//!   (`max_body_bytes: 1`), so no buffering and no routing; or, with
//!   `--variant <module.wasm>`, another build of this filter routing as the
//!   filter does (an A/B of two builds in one run).
//!
//! The headline is *this − reference*: what the router's own work costs above
//! the floor (V8 per stream, the paused headers, the body copy into the VM,
//! one header naming one of the pods). Each round sends the same requests to every Envoy, one after
//! another, and the order rotates each round, so drift hits all alike.
//!
//! Workloads: (a) 8 KB chat bodies whose 6 KB system prompt the filter has
//! seen (matched prefix), then 8 KB chat bodies sharing nothing (new prefix),
//! closed loop at concurrency 1 on keep-alive connections; (b) 400 KiB
//! completions prompts sharing nothing. Envoy CPU
//! per request is read from `/proc/<pid>/task/*/schedstat` around each turn.
//!
//! A native (host, no wasm) timing of the filter's pure logic on the same
//! bodies is printed beside, to tell compute from wasm/host-call overhead.

mod native;
mod report;
mod sides;

use native::native_reference;
use report::report;
pub use sides::OverheadArgs;
use sides::{Phase, FILTER};

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::procstat::LoadMeter;
use crate::report::write_json;
use crate::runner::Runner;
use crate::workload::{
    completion_body, shared_prefix, Api, ApiMix, BodyOptions, Order, Request, SharedPrefix,
};
use harness::fleet::Fleet;

/// One load runner per Envoy (each keeps its own keep-alive connection).
fn runners(urls: &[String]) -> Vec<Runner> {
    urls.iter().map(|u| Runner::new(vec![u.clone()])).collect()
}

/// This filter's `route_time_us` quantiles (cumulative), after the stats
/// flush (every 5 s) that includes the requests sent so far.
fn route_time(fleet: &Fleet) -> Vec<(f64, f64)> {
    std::thread::sleep(Duration::from_millis(5500));
    fleet.replicas[FILTER].histogram("prefix_router.route_time_us")
}

pub fn run(rt: &tokio::runtime::Runtime, args: &OverheadArgs) {
    let wall = Instant::now();
    let mut fleet = Fleet::new("bench-overhead");
    fleet.start_pods(&["--time-scale", "0"]);
    // Start order = side indices (PLAIN, REFERENCE, FILTER, PASSING).
    fleet.start_envoy("plain", "plain.yaml", 1, |_| {});
    fleet.start_envoy("reference", "reference.yaml", 1, |_| {});
    fleet.start_envoy("with-filter", "single.yaml", 1, |_| {});
    if args.has_variant() {
        let mut spec = fleet.spec("variant", "single.yaml").concurrency(1);
        if let Some(module) = &args.variant {
            spec = spec.module(module);
        }
        if let Some(patch) = &args.variant_patch {
            spec = spec.merge(patch.clone());
        }
        fleet.launch(spec);
    } else {
        fleet.start_envoy("filter-passing", "single.yaml", 1, |c| {
            c["max_body_bytes"] = json!(1);
        });
    }
    let urls = fleet.base_urls();
    let pids: Vec<u32> = fleet.replicas.iter().map(|r| r.pid).collect();
    println!(
        "prefix-bench overhead: plain Envoy (plain.yaml), the reference filter (reference.yaml: \
         pause, read the body, name a pod drawn at random), this filter (single.yaml), and {}; \
         --concurrency 1 each, 4 podsim pods at --time-scale 0, rotating rounds",
        if args.has_variant() {
            format!(
                "a variant: {} with {}",
                args.variant
                    .as_ref()
                    .map_or("this build".to_string(), |m| m.display().to_string()),
                args.variant_patch
                    .as_ref()
                    .map_or("single.yaml".to_string(), |p| format!("single.yaml + {p}"))
            )
        } else {
            "this filter passing every request at the headers (diagnostic)".to_string()
        }
    );

    // (a) 8 KB: matched prefixes, then new ones (each workload's rounds
    // rotate over every side; the new prefixes come second so that their
    // records cannot evict the primed prefixes while those are measured).
    let n = args.requests + args.warmup;
    let (primers, matched) = matched_workload(n, args.seed);
    let fresh = new_workload(n, args.seed);
    let (matched_warmup, matched) = matched.split_at(args.warmup.min(matched.len()));
    let (fresh_warmup, fresh) = fresh.split_at(args.warmup.min(fresh.len()));
    // Every group's system prompt once first: later members match it.
    let matched_warmup: Vec<Request> = primers.iter().chain(matched_warmup).cloned().collect();
    let mut matched_phase = Phase::new("8 KB chat, matched prefix", "matched_8kb");
    let mut new_phase = Phase::new("8 KB chat, new prefix", "new_8kb");
    let meter = LoadMeter::start();
    rt.block_on(async {
        let runners = runners(&urls);
        matched_phase
            .measure(&runners, &pids, &matched_warmup, matched, args.rounds)
            .await;
    });
    // Envoy flushes histograms every 5 s; the filter's own routing time.
    let route_time_matched = route_time(&fleet);
    rt.block_on(async {
        let runners = runners(&urls);
        new_phase
            .measure(&runners, &pids, fresh_warmup, fresh, args.rounds)
            .await;
    });
    let load_a = meter.finish();
    let route_time_all = route_time(&fleet);

    // (b) 400 KiB, new prompts; one extra request per side warms up.
    let big = big_workload(args.big_requests + 1, args.big_kib, args.seed);
    let (big_warmup, big) = big.split_at(1);
    let mut big_phase = Phase::new("400 KiB completions, new prompt", "new_big");
    let meter = LoadMeter::start();
    rt.block_on(async {
        let runners = runners(&urls);
        big_phase
            .measure(&runners, &pids, big_warmup, big, args.big_rounds)
            .await;
    });
    let load_b = meter.finish();
    let stats = fleet.replicas[FILTER].settled_stats();
    drop(fleet);

    let native = native_reference(&primers, matched, fresh, big);
    let mut result = report(
        args,
        [&matched_phase, &new_phase, &big_phase],
        [&route_time_matched, &route_time_all],
        &native,
    );
    println!("\n(a) {load_a}\n(b) {load_b}");
    result["load"] = json!({ "a": load_a, "b": load_b });
    result["filter_stats"] = json!(stats);
    let path = write_json("overhead", &result);
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

/// 8 KB chat bodies (6 KB system prompts shared by groups of 16, 2 KB
/// questions), shuffled: the first request of each group (the primers, sent
/// before anything is measured) and `n` of the others, each of which then
/// matches its group's system prompt.
fn matched_workload(n: usize, seed: u64) -> (Vec<Request>, Vec<Request>) {
    let all = chat_8kb(n.div_ceil(15), 16, seed);
    let mut seen = BTreeSet::new();
    let (primers, mut rest): (Vec<Request>, Vec<Request>) =
        all.into_iter().partition(|r| seen.insert(r.family));
    rest.truncate(n);
    (primers, rest)
}

/// `n` 8 KB chat bodies that share nothing with each other or with
/// [`matched_workload`] (own seed, so other system prompts).
fn new_workload(n: usize, seed: u64) -> Vec<Request> {
    chat_8kb(n, 1, seed ^ 0x6E65_775F_7072_6566)
}

fn chat_8kb(groups: usize, prompts_per_group: usize, seed: u64) -> Vec<Request> {
    shared_prefix(&SharedPrefix {
        groups,
        prompts_per_group,
        system_prompt_len: 6 * 1024,
        question_len: 2 * 1024 - 100,
        api: ApiMix::Only(Api::Chat),
        order: Order::Shuffled,
        body: BodyOptions {
            max_tokens: 4,
            ..BodyOptions::default()
        },
        seed,
    })
}

/// `n` distinct completions prompts of `kib` KiB (one shared text, each with
/// its own first bytes, so none matches another).
fn big_workload(n: usize, kib: usize, seed: u64) -> Vec<Request> {
    let base = harness::text(seed, kib * 1024);
    let o = BodyOptions {
        max_tokens: 4,
        ..BodyOptions::default()
    };
    (0..n)
        .map(|i| {
            let prompt = format!("[big {i:06}] {base}");
            Request {
                api: Api::Completions,
                body: completion_body(&prompt, &o, false),
                stream: false,
                family: None,
                member: i,
                prompt_len: prompt.len(),
            }
        })
        .collect()
}
