//! One router on one workload: fresh pods, a fresh router, the workload
//! sent through it, and what the client, the pods and the filter counted.

use std::collections::BTreeMap;
use std::time::Instant;

use super::args::CompareArgs;
use super::results::{FilterCounters, RunResult};
use super::workloads::Built;
use crate::drive::drive;
use crate::metrics::Stats;
use crate::outage::{self, OutageFacts, Timeline};
use crate::peer::peers_installed;
use crate::procstat::LoadMeter;
use crate::scenario::{sum_stat, Gateway, GatewayOptions, PodSet, Router};
use harness::TestDir;

/// Runs `built` through `router` over fresh pods.
pub fn run_one(
    rt: &tokio::runtime::Runtime,
    built: &Built,
    router: Router,
    args: &CompareArgs,
    opts: &GatewayOptions,
) -> RunResult {
    let wall = Instant::now();
    // A live fleet runs the Envoys on EDS-fed pods.
    let opts = &GatewayOptions {
        eds: built.outage.is_some(),
        ..opts.clone()
    };
    let mut result = RunResult::new(router, router.describe_with(opts));
    if router.is_peer() && !peers_installed() {
        result.skipped =
            Some("peers venv missing: run scripts/bench/setup-peers.sh (make bench does)".into());
        return result;
    }
    if let Some(o) = &built.outage {
        if !router.has_eds_variant() {
            result.skipped = Some("no live-fleet variant (no EDS-fed sync config yet)".into());
            return result;
        }
        if o.pod >= args.pods {
            result.skipped = Some(format!("live-fleet needs at least {} pods", o.pod + 1));
            return result;
        }
    }
    let dir = TestDir::new(&format!("cmp-{}-{}", built.kind.key(), router.key()));
    let mut model = args.pod_model();
    if let Some(blocks) = built.kv_blocks {
        model.kv_capacity_blocks = blocks;
    }
    let mut pods = PodSet::start_with_slow(&dir, args.pods, &model, built.slow_pod);
    let gateway = match Gateway::start(router, &pods.ports(), &dir, opts) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("  [{}] could not start: {e}", router.key());
            result.skipped = Some(format!("could not start: {}", first_line(&e)));
            return result;
        }
    };
    let urls = gateway.urls();
    let label = format!("{}/{}", built.kind.key(), router.key());
    // Counters before the traffic (warm-up requests), subtracted below.
    let before = gateway.filter_stats();
    let meter = LoadMeter::start();
    // With an outage: when Envoy's health check and the filter notice it.
    let watch = built.outage.as_ref().and_then(|o| {
        gateway.envoys.first().map(|e| outage::Watch {
            admin: e.admin,
            pod_port: pods.pods[o.pod].port,
            filter_all: router.is_filter().then_some(args.pods as i64),
        })
    });
    let (outcomes, timeline) = match &built.outage {
        Some(o) => outage::drive_with_outage(
            rt,
            &urls,
            &built.requests,
            built.pacing,
            &label,
            args.fresh_connections,
            &mut pods,
            &dir,
            o,
            watch,
        ),
        None => (
            rt.block_on(drive(
                &urls,
                &built.requests,
                built.pacing,
                &label,
                args.fresh_connections,
            )),
            Timeline::default(),
        ),
    };
    result.load = Some(meter.finish());
    if let Some(o) = &built.outage {
        let pod = &pods.pods[o.pod];
        let families: Vec<Option<usize>> = built.requests.iter().map(|r| r.family).collect();
        let mut facts = OutageFacts::of(&outcomes, &families, &pod.name, timeline);
        if let Some(e) = gateway.envoys.first() {
            facts.upstream = outage::upstream_counters(e, pod.port);
        }
        result.live = Some(facts);
    }
    let fs = gateway.filter_stats();
    if router.is_filter() {
        let sum = |n: &str| {
            let name = format!("prefix_router.{n}");
            sum_stat(&fs, &name) - sum_stat(&before, &name)
        };
        result.filter = Some(FilterCounters {
            prefix_match: sum("routed.prefix_match"),
            no_match: sum("routed.no_match"),
            load_guard: sum("routed.load_guard"),
            spread: sum("routed.spread"),
            placed: sum("routed.placed"),
            place_failed: sum("place.failed"),
            passthrough: passthrough(&fs) - passthrough(&before),
            sync_applied: sum("sync.applied"),
            sync_poll_applied: sum("sync.poll_applied"),
            sync_cycles_failed: sum("sync.cycles_failed"),
            cas_exhausted: sum("table.cas_exhausted"),
            passive_cooldowns: sum("fleet.passive_cooldowns"),
            passthrough_reasons: passthrough_reasons(&fs, &before),
            held: sum("hold.held"),
            held_claim: sum("hold.held_claim"),
            hold_timed_out: sum("hold.timed_out"),
        });
    }
    // (A pod restarted in a live-fleet run counts only since its return.)
    result.pod_hit_tokens = pods.metric_sum("vllm:prefix_cache_hits_total");
    result.pod_query_tokens = pods.metric_sum("vllm:prefix_cache_queries_total");
    result.pod_evicted_blocks = pods.metric_sum("podsim_kv_evicted_blocks_total");
    drop(gateway);
    result.stats = Some(Stats::of(&outcomes, &pods.names()));
    drop(pods);
    result.outcomes = outcomes;
    result.wall_s = wall.elapsed().as_secs_f64();
    result
}

/// Requests the filter passed through unrouted, over replicas.
fn passthrough(stats: &[BTreeMap<String, i64>]) -> i64 {
    stats
        .iter()
        .flat_map(|s| s.iter())
        .filter(|(k, _)| k.starts_with("prefix_router.passthrough."))
        .map(|(_, v)| *v)
        .sum()
}

/// Requests passed through unrouted per reason, over replicas, `after` -
/// `before`; reasons with none left out.
fn passthrough_reasons(
    after: &[BTreeMap<String, i64>],
    before: &[BTreeMap<String, i64>],
) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for (stats, sign) in [(after, 1), (before, -1)] {
        for (k, v) in stats.iter().flat_map(|s| s.iter()) {
            if let Some(reason) = k.strip_prefix("prefix_router.passthrough.") {
                *out.entry(reason.to_string()).or_default() += sign * v;
            }
        }
    }
    out.retain(|_, v| *v != 0);
    out
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}
