//! The overhead benchmark's tables (the headline *this − reference* against
//! the targets, then each workload in detail) and its JSON.

use serde_json::{json, Value};

use super::native::Native;
use super::sides::{
    side_keys, side_names, Measure, OverheadArgs, Phase, Side, Stat, FILTER, PASSING, PLAIN,
    REFERENCE, SIDES, TARGET_BIG_CPU_US, TARGET_MATCHED_US, TARGET_NEW_US,
};
use crate::report::{num, verdict, Table};

/// This filter's `route_time_us` quantiles (`(percent, µs)`, cumulative as
/// Envoy keeps them): after the matched 8 KB workload, after the new one.
pub type RouteTime<'a> = [&'a [(f64, f64)]; 2];

fn percentile_of(values: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    crate::percentiles::percentile(&v, p).unwrap_or(f64::NAN)
}

/// "median (p10..p90)" of per-round differences.
fn spread(diffs: &[f64], decimals: usize) -> String {
    format!(
        "{} ({}..{})",
        num(percentile_of(diffs, 50.0), decimals),
        num(percentile_of(diffs, 10.0), decimals),
        num(percentile_of(diffs, 90.0), decimals)
    )
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Prints the tables; returns the JSON of the run.
pub fn report(
    args: &OverheadArgs,
    phases: [&Phase; 3],
    route_time: RouteTime,
    native: &[Native; 3],
) -> Value {
    let [matched, fresh, big] = phases;

    // The headline: this − reference against the targets.
    let mut t = Table::new(
        "This filter minus the reference filter (same run, rotating rounds), us per request",
        &[
            "us",
            "plain",
            "reference",
            "this filter",
            "this - reference",
            "target",
            "",
            "this - plain",
            "reference - plain",
        ],
    );
    let headline: [(&Phase, &str, Measure, Option<f64>); 6] = [
        (matched, "p50 latency", Phase::p50, Some(TARGET_MATCHED_US)),
        (matched, "Envoy CPU", Phase::cpu_us, Some(TARGET_MATCHED_US)),
        (fresh, "p50 latency", Phase::p50, Some(TARGET_NEW_US)),
        (fresh, "Envoy CPU", Phase::cpu_us, Some(TARGET_NEW_US)),
        (big, "Envoy CPU", Phase::cpu_us, Some(TARGET_BIG_CPU_US)),
        (big, "p50 latency", Phase::p50, None),
    ];
    let mut headline_json = Vec::new();
    for (phase, what, f, target) in headline {
        let v: Vec<f64> = (0..SIDES).map(|s| f(phase, s)).collect();
        let d = v[FILTER] - v[REFERENCE];
        let met = target.map(|x| d <= x);
        t.row(&[
            format!("{}: {what}", phase.label),
            num(v[PLAIN], 1),
            num(v[REFERENCE], 1),
            num(v[FILTER], 1),
            num(d, 1),
            target.map_or(String::new(), |x| format!("<= {x}")),
            met.map_or(String::new(), |m| verdict(m).to_string()),
            num(v[FILTER] - v[PLAIN], 1),
            num(v[REFERENCE] - v[PLAIN], 1),
        ]);
        headline_json.push(json!({
            "workload": phase.key, "measure": what, "target_us": target, "met": met,
            "plain": v[PLAIN], "reference": v[REFERENCE], "with_filter": v[FILTER],
            (side_keys(args)[PASSING]): v[PASSING],
            "this_minus_reference": d, "this_minus_plain": v[FILTER] - v[PLAIN],
            "reference_minus_plain": v[REFERENCE] - v[PLAIN],
        }));
    }
    t.print();

    for phase in [matched, fresh] {
        detail_8kb(args, phase).print();
    }
    detail_big(args, big).print();
    where_time_goes(phases, route_time, native, args.has_variant()).print();

    let phase_json = |p: &Phase| {
        let by_side = |f: &dyn Fn(&Side) -> Value| {
            Value::Object(
                side_keys(args)
                    .iter()
                    .zip(&p.sides)
                    .map(|(k, s)| (k.to_string(), f(s)))
                    .collect(),
            )
        };
        json!({
            "latency_us": by_side(&|s| json!(s.summary())),
            "cpu_us_per_request": by_side(&|s| json!({ "sched": s.cpu_us(), "stat": s.cpu_stat_us() })),
            "failures": by_side(&|s| json!(s.failures)),
            "match_percent_mean": by_side(&|s| json!((!s.match_percent.is_empty()).then(|| mean(&s.match_percent)))),
            "round_p50_this_minus_reference_us": p.round_p50_vs_reference,
            "round_p50_this_minus_plain_us": p.round_p50_vs_plain,
            "latency_series_us": by_side(&|s| json!(s.latencies_us)),
        })
    };
    let native_json = |n: &Native| json!({ "parse_us": n.parse_us, "hash_us": n.hash_us, "route_us": n.route_us, "store_ops": n.store_ops });
    json!({
        "args": {
            "requests": args.requests, "rounds": args.rounds, "warmup": args.warmup,
            "big_requests": args.big_requests, "big_rounds": args.big_rounds,
            "big_kib": args.big_kib, "seed": args.seed,
            "variant": args.variant.as_ref().map(|m| m.display().to_string()),
            "variant_patch": args.variant_patch,
        },
        "targets_this_minus_reference_us": {
            "matched_8kb_p50_and_cpu": TARGET_MATCHED_US,
            "new_8kb_p50_and_cpu": TARGET_NEW_US,
            "new_big_cpu": TARGET_BIG_CPU_US,
        },
        "headline": headline_json,
        "matched_8kb": phase_json(matched),
        "new_8kb": phase_json(fresh),
        "new_big": phase_json(big),
        "route_time_us_quantiles": {
            "after_matched_8kb": route_time[0], "after_new_8kb": route_time[1],
        },
        "native": {
            "matched_8kb": native_json(&native[0]),
            "new_8kb": native_json(&native[1]),
            "new_big": native_json(&native[2]),
        },
    })
}

/// Columns of the detail tables: every side, then the differences.
fn detail_header(args: &OverheadArgs, unit: &str) -> Vec<String> {
    let mut h = vec![unit.to_string()];
    h.extend(side_names(args).iter().map(|s| s.to_string()));
    h.extend(["this - reference".to_string(), "this - plain".to_string()]);
    h
}

/// A detail row: one value per side, then this − reference, this − plain.
fn detail_row(name: &str, v: [f64; SIDES], decimals: usize) -> Vec<String> {
    let mut row = vec![name.to_string()];
    row.extend(v.iter().map(|x| num(*x, decimals)));
    row.push(num(v[FILTER] - v[REFERENCE], decimals));
    row.push(num(v[FILTER] - v[PLAIN], decimals));
    row
}

fn detail_8kb(args: &OverheadArgs, p: &Phase) -> Table {
    let mut t = Table::new(
        &format!(
            "(a) {}: {} requests per side in {} rotating rounds (+{} warmup), concurrency 1, keep-alive",
            p.label, args.requests, args.rounds, args.warmup
        ),
        &detail_header(args, "us"),
    );
    let stats: [(&str, Stat); 5] = [
        ("p50", |s| s.p50),
        ("p90", |s| s.p90),
        ("p99", |s| s.p99),
        ("mean", |s| s.mean),
        ("max", |s| s.max),
    ];
    for (name, f) in stats {
        t.row(&detail_row(name, p.sides.each_ref().map(|s| s.stat(f)), 1));
    }
    t.row(&detail_row(
        "Envoy CPU per request",
        p.sides.each_ref().map(Side::cpu_us),
        1,
    ));
    let mut row = vec!["p50 difference: median (p10..p90) of rounds".to_string()];
    row.extend(vec![String::new(); SIDES]);
    row.push(spread(&p.round_p50_vs_reference, 1));
    row.push(spread(&p.round_p50_vs_plain, 1));
    t.row(&row);
    let count = |f: &dyn Fn(&Side) -> String| {
        std::iter::once(String::new())
            .chain(p.sides.iter().map(f))
            .collect::<Vec<_>>()
    };
    let mut row = count(&|s| {
        if s.match_percent.is_empty() {
            "-".to_string()
        } else {
            num(mean(&s.match_percent), 1)
        }
    });
    row[0] = "x-prefix-match mean, %".to_string();
    t.row(&row);
    let mut row = count(&|s| {
        s.latencies_us
            .iter()
            .filter(|&&v| v > 2000.0)
            .count()
            .to_string()
    });
    row[0] = "requests over 2 ms".to_string();
    t.row(&row);
    let mut row = count(&|s| s.failures.to_string());
    row[0] = "failed requests".to_string();
    t.row(&row);
    t
}

fn detail_big(args: &OverheadArgs, p: &Phase) -> Table {
    let mut t = Table::new(
        &format!(
            "(b) {}: {} KiB, {} requests per side in {} rotating rounds",
            p.label, args.big_kib, args.big_requests, args.big_rounds
        ),
        &detail_header(args, "us per request"),
    );
    t.row(&detail_row(
        "Envoy CPU (schedstat, ns clock)",
        p.sides.each_ref().map(Side::cpu_us),
        1,
    ));
    t.row(&detail_row(
        "Envoy CPU (utime+stime, 10 ms ticks)",
        p.sides.each_ref().map(Side::cpu_stat_us),
        1,
    ));
    t.row(&detail_row(
        "latency p50 (client)",
        p.sides.each_ref().map(|s| s.stat(|x| x.p50)),
        1,
    ));
    let mut row = vec!["failed requests".to_string()];
    row.extend(p.sides.iter().map(|s| s.failures.to_string()));
    t.row(&row);
    t
}

/// `p50 / p99` of a quantile list as Envoy reports it.
fn p50_p99(quantiles: &[(f64, f64)]) -> String {
    let q = |p: f64| {
        quantiles
            .iter()
            .find(|(x, _)| (*x - p).abs() < 1e-9)
            .map_or("-".to_string(), |(_, v)| num(*v, 1))
    };
    format!("{} / {}", q(50.0), q(99.0))
}

fn where_time_goes(
    phases: [&Phase; 3],
    route_time: RouteTime,
    native: &[Native; 3],
    variant: bool,
) -> Table {
    let mut t = Table::new(
        "Where the time goes: the filter's logic natively (host build, in-memory store, same bodies) and in Envoy",
        &["us", "8 KB matched", "8 KB new", "400 KiB new"],
    );
    let row = |name: &str, f: &dyn Fn(usize) -> String| {
        let mut r = vec![name.to_string()];
        r.extend((0..3).map(f));
        r
    };
    t.row(&row("native parse_body", &|i| num(native[i].parse_us, 1)));
    t.row(&row("native block hashing", &|i| num(native[i].hash_us, 1)));
    t.row(&row(
        "native route + release (hash, table, policy, record, in-flight)",
        &|i| num(native[i].route_us, 1),
    ));
    t.row(&row(
        "native shared-data gets + sets per request (hostcalls in Envoy)",
        &|i| num(native[i].store_ops, 1),
    ));
    // Envoy's histogram is cumulative: read after the matched workload, and
    // after both 8 KB workloads.
    t.row(&row(
        "in Envoy: route_time_us p50 / p99, cumulative (1 in 8 sampled; parse to headers set)",
        &|i| match i {
            0 => p50_p99(route_time[0]),
            1 => format!("{} (with matched)", p50_p99(route_time[1])),
            _ => "-".to_string(),
        },
    ));
    t.row(&row("in Envoy: CPU, reference - plain", &|i| {
        num(phases[i].cpu_us(REFERENCE) - phases[i].cpu_us(PLAIN), 1)
    }));
    let last = if variant {
        "variant"
    } else {
        "passing at headers"
    };
    t.row(&row(&format!("in Envoy: CPU, {last} - plain"), &|i| {
        num(phases[i].cpu_us(PASSING) - phases[i].cpu_us(PLAIN), 1)
    }));
    t.row(&row("in Envoy: CPU, this - reference", &|i| {
        num(phases[i].cpu_us(FILTER) - phases[i].cpu_us(REFERENCE), 1)
    }));
    t
}
