//! `prefix-bench run`: the demo. Four podsim pods with a realistic (scaled)
//! latency model behind one Envoy with the filter, or two Envoy replicas
//! syncing through Redis with the client alternating between them; a short
//! shared-prefix workload; then where requests went and why.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::percentiles::Summary;
use crate::report::{num, write_json, Table};
use crate::runner::{Outcome, Pacing, Runner};
use crate::workload::{shared_prefix, ApiMix, BodyOptions, Order, SharedPrefix, Streaming};
use harness::fleet::{sync_patch, Fleet};

/// Options of the demo.
#[derive(Clone, Debug)]
pub struct DemoArgs {
    pub replicas: u8,
    pub seed: u64,
    pub period_ms: u64,
    /// Poisson arrival rate, requests per second.
    pub rate: f64,
}

/// Match-percent buckets of the summary.
const BUCKETS: [(&str, u8, u8); 4] = [
    ("0", 0, 0),
    ("1-49", 1, 49),
    ("50-89", 50, 89),
    ("90-100", 90, 100),
];

/// How a request relates to earlier requests of its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// First request of its group: nothing to match.
    NewPrefix,
    /// Its group was already sent to this replica.
    SameReplica,
    /// Its group was sent before, but only to the other replica: a match
    /// can only come from sync.
    CrossReplica,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::NewPrefix => "first of its group",
            Kind::SameReplica => "group seen on this replica",
            Kind::CrossReplica => "group seen only on the other",
        }
    }
}

pub fn run(rt: &tokio::runtime::Runtime, args: &DemoArgs) {
    let wall = Instant::now();
    let mut fleet = Fleet::new("bench-run");
    fleet.start_pods(&["--time-scale", "0.2"]);
    let sync = sync_patch(
        args.period_ms,
        json!({"write_through": false, "full_scan_every": 6}),
    );
    if args.replicas >= 2 {
        fleet.start_redis();
        let specs = ["replica-a", "replica-b"].map(|name| {
            fleet
                .spec(name, "sync.yaml")
                .concurrency(2)
                .merge(sync.clone())
        });
        fleet.launch_all(specs.into());
        // Let each replica finish its first cycle, so both have a change-log
        // position before the traffic starts.
        for r in &fleet.replicas {
            r.wait_stat(
                "prefix_router.sync.cycles_ok",
                1,
                Duration::from_millis(args.period_ms * 3),
            );
        }
    } else {
        fleet.start_envoy("envoy", "single.yaml", 2, |_| {});
    }
    let workload = shared_prefix(&SharedPrefix {
        groups: 8,
        prompts_per_group: 6,
        system_prompt_len: 2048,
        question_len: 200,
        api: ApiMix::Alternate,
        order: Order::Waves,
        body: BodyOptions {
            model: "sim-model".into(),
            max_tokens: 32,
            streaming: Streaming::Alternate,
        },
        seed: args.seed,
    });
    println!(
        "prefix-bench run: {} requests ({} groups x {} prompts, 2 KB shared system prompt, \
         completions and chat, half streaming), Poisson {} req/s, {} Envoy replica(s){}",
        workload.len(),
        8,
        6,
        args.rate,
        fleet.replicas.len(),
        if args.replicas >= 2 {
            format!(" syncing every {} ms through Redis", args.period_ms)
        } else {
            String::new()
        }
    );
    let urls = fleet.base_urls();
    let meter = crate::procstat::LoadMeter::start();
    let outcomes = rt.block_on(async {
        let runner = Runner::new(urls);
        runner
            .run(
                &workload,
                Pacing::Poisson {
                    rate_per_sec: args.rate,
                    seed: args.seed,
                },
            )
            .await
    });
    let load = meter.finish();
    let families: Vec<Option<usize>> = workload.iter().map(|r| r.family).collect();
    let kinds = classify(&outcomes, &families);
    let names: Vec<String> = fleet.replicas.iter().map(|r| r.name.clone()).collect();
    let stats: Vec<BTreeMap<String, i64>> =
        fleet.replicas.iter().map(|r| r.settled_stats()).collect();
    drop(fleet);

    print_requests(&outcomes);
    print_pods(&outcomes, &names);
    print_matches(&outcomes, &kinds, args.replicas >= 2);
    print_routing(&stats, &names);
    if args.replicas >= 2 {
        print_cross_replica(&outcomes, &kinds, &families);
        print_sync(&stats, &names);
    }
    println!("\n{load}");
    let path = write_json(
        &format!("run-{}r", args.replicas),
        &json!({
            "load": load,
            "replicas": args.replicas,
            "seed": args.seed,
            "sync_period_ms": args.period_ms,
            "rate_per_sec": args.rate,
            "replica_names": names,
            "envoy_stats": stats,
            "kinds": kinds.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>(),
            "outcomes": outcomes,
        }),
    );
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

/// Kind of every request, in send order (outcomes are in workload order and
/// Poisson arrivals keep that order).
fn classify(outcomes: &[Outcome], families: &[Option<usize>]) -> Vec<Kind> {
    let mut seen: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    outcomes
        .iter()
        .map(|o| {
            let Some(family) = families[o.index] else {
                return Kind::NewPrefix;
            };
            let replicas = seen.entry(family).or_default();
            let kind = if replicas.is_empty() {
                Kind::NewPrefix
            } else if replicas.contains(&o.target) {
                Kind::SameReplica
            } else {
                Kind::CrossReplica
            };
            replicas.insert(o.target);
            kind
        })
        .collect()
}

fn print_requests(outcomes: &[Outcome]) {
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok()).collect();
    let latency = Summary::of(&ok.iter().map(|o| o.latency_ms).collect::<Vec<_>>());
    let ttft = Summary::of(&ok.iter().filter_map(|o| o.ttft_ms).collect::<Vec<_>>());
    let prompt: u64 = ok.iter().filter_map(|o| o.prompt_tokens).sum();
    let cached: u64 = ok.iter().filter_map(|o| o.cached_tokens).sum();
    let mut t = Table::new("Requests", &["", "value"]);
    t.row(&["sent".to_string(), outcomes.len().to_string()]);
    t.row(&["ok (2xx)".to_string(), ok.len().to_string()]);
    for o in outcomes.iter().filter(|o| !o.ok()).take(3) {
        t.row(&[
            format!("failed #{}", o.index),
            format!("{} {}", o.status, o.error.clone().unwrap_or_default()),
        ]);
    }
    if let Some(s) = latency {
        t.row(&[
            "latency p50 / p99 (ms)".to_string(),
            format!("{} / {}", num(s.p50, 1), num(s.p99, 1)),
        ]);
    }
    if let Some(s) = ttft {
        t.row(&[
            "TTFT p50 / p99, streaming (ms)".to_string(),
            format!("{} / {}", num(s.p50, 1), num(s.p99, 1)),
        ]);
    }
    t.row(&[
        "pods' cached prompt tokens".to_string(),
        format!(
            "{cached} / {prompt} ({}%)",
            num(100.0 * cached as f64 / prompt.max(1) as f64, 1)
        ),
    ]);
    t.print();
}

fn print_pods(outcomes: &[Outcome], names: &[String]) {
    let mut counts: BTreeMap<String, Vec<usize>> = (1..=4)
        .map(|i| (format!("pod-{i}"), vec![0; names.len()]))
        .collect();
    for o in outcomes {
        let pod = o.pod.clone().unwrap_or_else(|| "(no reply)".into());
        counts.entry(pod).or_insert_with(|| vec![0; names.len()])[o.target] += 1;
    }
    let header: Vec<String> = std::iter::once("pod".to_string())
        .chain(names.iter().map(|n| format!("via {n}")))
        .chain(std::iter::once("total".to_string()))
        .collect();
    let mut t = Table::new("Requests per pod", &header);
    for (pod, per) in &counts {
        let mut row = vec![pod.clone()];
        row.extend(per.iter().map(usize::to_string));
        row.push(per.iter().sum::<usize>().to_string());
        t.row(&row);
    }
    t.print();
}

fn bucket_of(o: &Outcome) -> Option<usize> {
    let m = o.match_percent?;
    BUCKETS
        .iter()
        .position(|(_, lo, hi)| (*lo..=*hi).contains(&m))
}

fn print_matches(outcomes: &[Outcome], kinds: &[Kind], two: bool) {
    let mut header: Vec<&str> = vec!["prefix match % (x-prefix-match)"];
    header.extend(BUCKETS.iter().map(|b| b.0));
    header.push("no header");
    let mut t = Table::new("Prefix match distribution", &header);
    let mut rows: BTreeMap<Kind, [usize; 5]> = BTreeMap::new();
    let mut all = [0usize; 5];
    for (o, k) in outcomes.iter().zip(kinds) {
        let col = bucket_of(o).unwrap_or(4);
        rows.entry(*k).or_default()[col] += 1;
        all[col] += 1;
    }
    let show = |t: &mut Table, label: &str, c: &[usize; 5]| {
        let mut row = vec![label.to_string()];
        row.extend(c.iter().map(usize::to_string));
        t.row(&row);
    };
    show(&mut t, "all requests", &all);
    for (k, c) in &rows {
        if two || *k != Kind::CrossReplica {
            show(&mut t, &format!("  {}", k.label()), c);
        }
    }
    t.print();
}

fn print_routing(stats: &[BTreeMap<String, i64>], names: &[String]) {
    let mut keys: Vec<String> = vec![
        "prefix_router.requests_total".into(),
        "prefix_router.routed.prefix_match".into(),
        "prefix_router.routed.no_match".into(),
        "prefix_router.routed.placed".into(),
        "prefix_router.routed.load_guard".into(),
        "prefix_router.routed.spread".into(),
        "prefix_router.place.failed".into(),
    ];
    let passthrough: BTreeSet<String> = stats
        .iter()
        .flat_map(|s| s.keys())
        .filter(|k| k.starts_with("prefix_router.passthrough."))
        .cloned()
        .collect();
    let mut quiet = Vec::new();
    for k in passthrough {
        if stats.iter().any(|s| s.get(&k).copied().unwrap_or(0) != 0) {
            keys.push(k);
        } else {
            quiet.push(
                k.trim_start_matches("prefix_router.passthrough.")
                    .to_string(),
            );
        }
    }
    let header: Vec<String> = std::iter::once("stat".to_string())
        .chain(names.iter().cloned())
        .collect();
    let mut t = Table::new("Routing reasons (Envoy stats)", &header);
    for k in &keys {
        let mut row = vec![k.clone()];
        row.extend(
            stats
                .iter()
                .map(|s| s.get(k).copied().unwrap_or(0).to_string()),
        );
        t.row(&row);
    }
    if !quiet.is_empty() {
        let label = if keys.len() == 4 {
            format!("prefix_router.passthrough.* (all {} reasons)", quiet.len())
        } else {
            format!("other passthrough reasons ({})", quiet.len())
        };
        let mut row = vec![label];
        row.extend(stats.iter().map(|_| "0".to_string()));
        t.row(&row);
    }
    t.print();
}

fn print_cross_replica(outcomes: &[Outcome], kinds: &[Kind], families: &[Option<usize>]) {
    // When each group was first sent, per replica.
    let mut first: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    for o in outcomes {
        if let Some(f) = families[o.index] {
            first.entry((f, o.target)).or_insert(o.start_ms);
        }
    }
    let mut hits = Vec::new();
    let mut misses = Vec::new();
    for (o, k) in outcomes.iter().zip(kinds) {
        if *k != Kind::CrossReplica {
            continue;
        }
        let Some(f) = families[o.index] else { continue };
        let other = 1 - o.target.min(1);
        let gap = first
            .get(&(f, other))
            .map(|t| o.start_ms - t)
            .unwrap_or(0.0);
        if o.match_percent.unwrap_or(0) > 0 {
            hits.push(gap);
        } else {
            misses.push(gap);
        }
    }
    let mut t = Table::new(
        "Cross-replica hits (request on one replica matching a prefix first seen on the other)",
        &[
            "",
            "requests",
            "gap since the other replica saw the group (ms)",
        ],
    );
    let gaps = |v: &[f64]| {
        Summary::of(v)
            .map(|s| {
                format!(
                    "min {} / p50 {} / max {}",
                    num(s.min, 0),
                    num(s.p50, 0),
                    num(s.max, 0)
                )
            })
            .unwrap_or_else(|| "-".into())
    };
    t.row(&[
        "matched (>0 %)".to_string(),
        hits.len().to_string(),
        gaps(&hits),
    ]);
    t.row(&[
        "not matched (0 %)".to_string(),
        misses.len().to_string(),
        gaps(&misses),
    ]);
    t.print();
}

fn print_sync(stats: &[BTreeMap<String, i64>], names: &[String]) {
    let header: Vec<String> = std::iter::once("prefix_router.sync.".to_string())
        .chain(names.iter().cloned())
        .collect();
    let mut t = Table::new("Sync (Envoy stats)", &header);
    for k in [
        "cycles_ok",
        "cycles_failed",
        "full_scans",
        "incremental_pulls",
        "polls_ok",
        "poll_applied",
        "keys_pulled",
        "applied",
        "pushed",
        "calls_sent",
        "commands_sent",
        "bytes_sent",
    ] {
        let key = format!("prefix_router.sync.{k}");
        let mut row = vec![k.to_string()];
        row.extend(
            stats
                .iter()
                .map(|s| s.get(&key).copied().unwrap_or(0).to_string()),
        );
        t.row(&row);
    }
    t.print();
}
