//! The `live-fleet` workload: a pod leaves and returns mid-run under a
//! steady shared-prefix load with fresh prompts mixed in; its requests, its
//! table and its targets.

use std::time::Duration;

use super::args::CompareArgs;
use super::output::ms;
use super::results::{WorkloadKind, WorkloadResult};
use super::target::{target, Target};
use super::workloads::{body, mean_tokens, shared_prefix_spec, Built};
use crate::metrics::Stats;
use crate::outage::{Outage, OutageFacts};
use crate::report::{num, Table};
use crate::runner::Pacing;
use crate::scenario::Router;
use crate::workload::{no_sharing, shared_prefix, Api, NoSharing, Order, Request, BYTES_PER_TOKEN};

/// The live-fleet requests (Poisson, `--live-rate` for `--live-secs`: 3 in
/// 4 from `--live-groups` shared-prefix groups, 1 in 4 a fresh prompt) and
/// the outage of [`LIVE_FLEET_POD`] from 1/3 to 2/3 of the run.
pub(super) fn build(args: &CompareArgs) -> Built {
    let total = ((args.live_rate * args.live_secs).round() as usize).max(4);
    let fresh_count = total / 4;
    let shared_count = total - fresh_count;
    let groups = args.live_groups.max(1);
    let ppg = shared_count.div_ceil(groups);
    let mut shared = shared_prefix(&shared_prefix_spec(args, groups, ppg, Order::Shuffled));
    shared.truncate(shared_count);
    // Not the shared-prefix seed: its first prompt would start with
    // group 0's system prompt.
    let fresh = no_sharing(&NoSharing {
        count: fresh_count,
        prompt_len: (args.system_tokens + args.question_tokens) * BYTES_PER_TOKEN,
        api: Api::Completions,
        body: body(args),
        seed: args.seed ^ 0x11FE_F1EE_7000_0000,
    });
    let requests = interleave_every_fourth(shared, fresh);
    let secs = args.live_secs;
    let outage = Outage {
        pod: LIVE_FLEET_POD,
        kill_at: Duration::from_secs_f64(secs / 3.0),
        return_at: Duration::from_secs_f64(secs * 2.0 / 3.0),
    };
    Built {
        kind: WorkloadKind::LiveFleet,
        description: format!(
            "{total} requests, Poisson {} req/s (~{secs:.0} s): 3 in 4 from {} shared-prefix \
             groups ({}-token system prompt + {}-token question, shuffled), 1 in 4 a fresh \
             {}-token prompt; pod-{} killed at {:.0} s, restarted on its port (cold cache) \
             at {:.0} s; Envoy on EDS-fed pods with a /health check every 1 s and one \
             retry on connect-failure/refused-stream/reset",
            args.live_rate,
            groups,
            args.system_tokens,
            args.question_tokens,
            args.system_tokens + args.question_tokens,
            LIVE_FLEET_POD + 1,
            outage.kill_at.as_secs_f64(),
            outage.return_at.as_secs_f64(),
        ),
        mean_prompt_tokens: mean_tokens(&requests),
        requests,
        pacing: Pacing::Poisson {
            rate_per_sec: args.live_rate,
            seed: args.seed,
        },
        outage: Some(outage),
        slow_pod: None,
        kv_blocks: None,
    }
}

/// live-fleet: the pod that leaves and returns (index: `pod-2`).
pub const LIVE_FLEET_POD: usize = 1;

/// `shared` with one of `fresh` at every fourth position (3, 7, ...), the
/// rest of either appended.
fn interleave_every_fourth(shared: Vec<Request>, fresh: Vec<Request>) -> Vec<Request> {
    let mut out = Vec::with_capacity(shared.len() + fresh.len());
    let (mut shared, mut fresh) = (shared.into_iter(), fresh.into_iter());
    loop {
        let next = if out.len() % 4 == 3 {
            fresh.next().or_else(|| shared.next())
        } else {
            shared.next().or_else(|| fresh.next())
        };
        match next {
            Some(r) => out.push(r),
            None => return out,
        }
    }
}

/// The table of the live-fleet workload: errors by when they were sent,
/// hit rate by phase, when Envoy's health check and the filter noticed the
/// pod gone and back, where its groups went, what it served after its
/// return (and how much of that were its old groups, whose records in the
/// filter's table outlive its cache), and Envoy's connect failures to it and
/// retries.
pub fn live_table(w: &WorkloadResult, pods: &[String]) -> Table {
    let victim = format!("pod-{}", LIVE_FLEET_POD + 1);
    let mut t = Table::new(
        &format!("{}: {}", w.workload.key(), w.description),
        &[
            "router",
            "ok/sent",
            "err",
            "in flight at kill",
            "after kill",
            ">2 s after",
            "hit rate",
            "before/outage/after",
            "TTFT p50 ms",
            "requests per pod",
            "seen down s (Envoy/filter)",
            &format!("{victim}'s groups: pods each"),
            "seen back s (Envoy/filter)",
            &format!("{victim} after return"),
            "of its old groups (misses)",
            "first after (s)",
            &format!("{victim} connect fails"),
            "retries",
        ],
    );
    let h = |v: Option<f64>| v.map_or("-".into(), |h| num(h, 2));
    let after = |at: Option<f64>, from: f64| at.map_or("-".into(), |v| num((v - from) / 1000.0, 2));
    for r in &w.results {
        let (Some(s), Some(l)) = (&r.stats, &r.live) else {
            t.row(&[r.router.key(), "skipped (see notes)"]);
            continue;
        };
        let up = |k: &str| {
            if r.router.is_peer() {
                "-".to_string()
            } else {
                l.upstream.get(k).copied().unwrap_or(0).to_string()
            }
        };
        let tl = &l.timeline;
        let seen = |envoy: Option<f64>, filter: Option<f64>, from: f64| {
            if r.router.is_filter() {
                format!("{}/{}", after(envoy, from), after(filter, from))
            } else {
                after(envoy, from)
            }
        };
        t.row(&[
            r.router.key().to_string(),
            format!("{}/{}", s.ok, s.sent),
            s.errors.to_string(),
            l.errors_in_flight.to_string(),
            l.errors_after_kill.to_string(),
            l.errors_late.to_string(),
            s.hit_rate.map_or("-".into(), |h| num(h, 3)),
            format!(
                "{}/{}/{}",
                h(l.before.hit_rate),
                h(l.outage.hit_rate),
                h(l.after.hit_rate)
            ),
            ms(&s.ttft_ms, |x| x.p50),
            s.pod_counts_label(pods),
            seen(tl.envoy_down_ms, tl.filter_down_ms, tl.kill_ms),
            l.pods_per_moved_group.map_or("-".into(), |v| {
                format!("{} ({})", num(v, 2), l.groups_moved)
            }),
            seen(tl.envoy_up_ms, tl.filter_up_ms, tl.back_ms),
            l.served_after_return.to_string(),
            format!(
                "{} ({})",
                l.old_groups_back, l.old_group_misses_after_return
            ),
            l.first_after_return_ms
                .map_or("never".into(), |v| num(v / 1000.0, 1)),
            up("cx_connect_fail"),
            up("upstream_rq_retry"),
        ]);
    }
    t
}

/// The live-fleet checks: the filter fails no more than round robin, hits
/// more, fails nothing once the pod could be known gone, and uses the pod
/// again soon after it returns (the 2 s and 5 s bounds).
pub(super) fn live_targets(w: &WorkloadResult) -> Vec<Target> {
    let get = |r: Router| {
        w.results
            .iter()
            .find(|x| x.router == r)
            .and_then(|x| Some((x.stats.as_ref()?, x.live.as_ref()?)))
    };
    let f = get(Router::Filter);
    let rr = get(Router::RoundRobin);
    let f3 = |v: Option<f64>| v.map_or("-".into(), |v| num(v, 3));
    let errs = |x: Option<(&Stats, &OutageFacts)>| {
        x.map_or("-".into(), |(_, l)| l.errors_after_kill.to_string())
    };
    let hit = |x: Option<(&Stats, &OutageFacts)>| x.and_then(|(s, _)| s.hit_rate);
    vec![
        // Requests in flight on the pod when it dies fail under any router
        // (their replies have started): compare what was sent after.
        target(
            "live fleet: filter errors among requests sent after the kill <= round robin's",
            format!("{} vs {}", errs(f), errs(rr)),
            f.zip(rr)
                .map(|((_, a), (_, b))| a.errors_after_kill <= b.errors_after_kill),
        ),
        target(
            "live fleet: filter hit rate > round robin's",
            format!("{} vs {}", f3(hit(f)), f3(hit(rr))),
            hit(f).zip(hit(rr)).map(|(a, b)| a > b),
        ),
        target(
            "live fleet: filter, no failed request sent > 2 s after the kill",
            f.map_or("-".into(), |(_, l)| format!("{} failed", l.errors_late)),
            f.map(|(_, l)| l.errors_late == 0),
        ),
        target(
            "live fleet: filter uses the returned pod within 5 s",
            f.map_or("-".into(), |(_, l)| {
                l.first_after_return_ms.map_or("never".into(), |v| {
                    format!(
                        "after {} s, {} requests",
                        num(v / 1000.0, 1),
                        l.served_after_return
                    )
                })
            }),
            f.map(|(_, l)| l.first_after_return_ms.is_some_and(|v| v <= 5000.0)),
        ),
    ]
}
