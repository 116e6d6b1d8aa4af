//! `prefix-bench place-wait`: what placing a new prompt through Redis
//! (`sync.place_new`) adds to its request, and where the time goes.
//!
//! One `sync.yaml` replica, a real `redis-server` and 4 podsim pods at
//! `--time-scale 0` (they answer at once). The same `--requests` prompts,
//! each new (nothing shared), are sent one at a time with `--gap-ms` between
//! them, first through a replica with `place_new` on, then through a fresh
//! one (fresh Redis and pods) with it off. Printed per side: the client's
//! latency quantiles; with placement, the worker's own timing of each
//! placement (`place.wait_us`, Envoy's histogram), Redis's time per script
//! (`INFO commandstats`: `EVAL`, placements and tick releases alike) and
//! the bridge's connections (one to Redis per call).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::percentiles::percentile;
use crate::report::{num, Table};
use harness::fleet::{sync_patch, Fleet};
use harness::redis::RedisAt;

#[derive(Clone, Debug)]
pub struct PlaceWaitArgs {
    pub requests: usize,
    pub gap_ms: u64,
}

/// One side's figures.
struct Side {
    client_us: Vec<f64>,
    wait_us: Vec<(f64, f64)>,
    eval_calls: u64,
    eval_us_per_call: f64,
    redis_connections: i64,
    bridge_calls: i64,
    failed: usize,
}

pub fn run(args: &PlaceWaitArgs) {
    println!(
        "prefix-bench place-wait: {} new prompts (~720 bytes, nothing shared), one at a time, \
         {} ms apart, through one sync.yaml replica (Redis, 4 podsim pods at --time-scale 0), \
         with sync.place_new and without it",
        args.requests, args.gap_ms
    );
    let on = side(args, true);
    let off = side(args, false);
    let q = |v: &[f64], p: f64| percentile(v, p).map_or("-".into(), |x| num(x, 0));
    let mut t = Table::new(
        "Client latency per request (us), and each placement's wait as the worker timed it",
        &["", "p50", "p90", "p99", "failed"],
    );
    for (name, s) in [("place_new on", &on), ("place_new off", &off)] {
        t.row(&[
            name.to_string(),
            q(&s.client_us, 50.0),
            q(&s.client_us, 90.0),
            q(&s.client_us, 99.0),
            s.failed.to_string(),
        ]);
    }
    let wait = |p: f64| {
        on.wait_us
            .iter()
            .find(|(x, _)| *x == p)
            .map_or("-".into(), |(_, v)| num(*v, 0))
    };
    t.row(&[
        "place.wait_us (on)".to_string(),
        wait(50.0),
        wait(90.0),
        wait(99.0),
        "-".to_string(),
    ]);
    t.print();
    if let (Some(a), Some(b)) = (
        percentile(&on.client_us, 50.0),
        percentile(&off.client_us, 50.0),
    ) {
        println!(
            "added per new prompt (client p50, on - off): {} us",
            num(a - b, 0)
        );
    }
    println!(
        "Redis, place_new on: {} EVAL calls (placements and tick releases) at {} us each; \
         {} connections for {} bridge calls",
        on.eval_calls,
        num(on.eval_us_per_call, 1),
        on.redis_connections,
        on.bridge_calls
    );
}

fn side(args: &PlaceWaitArgs, place: bool) -> Side {
    let mut f = Fleet::new(if place {
        "bench-place-wait-on"
    } else {
        "bench-place-wait-off"
    });
    f.start_pods(&["--time-scale", "0"]);
    f.start_redis();
    // A long period: the only Redis calls are placements and releases.
    let spec = f.spec("a", "sync.yaml").merge(sync_patch(
        60_000,
        json!({"place_new": place, "poll_ms": 0}),
    ));
    f.launch_all(vec![spec]);
    let redis = RedisAt::of(f.redis.as_ref().expect("redis started"));
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    let replica = &f.replicas[0];
    let bridge_before = bridge_calls(replica);
    let url = format!("{}/v1/completions", replica.base_url());
    let mut client_us = Vec::with_capacity(args.requests);
    let mut failed = 0;
    for i in 0..args.requests {
        let prompt = format!(
            "{i:06} {}",
            "a fresh prompt with nothing shared. ".repeat(20)
        );
        let body = harness::completion_body(&json!(prompt));
        let t = Instant::now();
        let reply = harness::send(
            "POST",
            &url,
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
            Duration::from_secs(10),
        );
        let us = t.elapsed().as_secs_f64() * 1e6;
        match reply {
            Ok(r) if r.status == 200 => client_us.push(us),
            _ => failed += 1,
        }
        std::thread::sleep(Duration::from_millis(args.gap_ms));
    }
    client_us.sort_by(f64::total_cmp);
    // Envoy computes histogram quantiles on its stats flush (every 5 s),
    // and the last releases go on the worker's next tick.
    std::thread::sleep(Duration::from_millis(5_500));
    let wait_us = replica.histogram("prefix_router.place.wait_us");
    let info = redis
        .cmd(&["INFO", "commandstats"])
        .text()
        .unwrap_or_default();
    let (eval_calls, eval_us_per_call) = eval_stats(&info);
    let stats = redis.cmd(&["INFO", "stats"]).text().unwrap_or_default();
    let redis_connections = stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(0);
    Side {
        client_us,
        wait_us,
        eval_calls,
        eval_us_per_call,
        redis_connections,
        bridge_calls: bridge_calls(replica) - bridge_before,
        failed,
    }
}

fn bridge_calls(replica: &harness::fleet::Replica) -> i64 {
    replica
        .envoy
        .stats_matching(r"^cluster\.redis_bridge\.upstream_rq_total$")
        .values()
        .sum()
}

/// `calls` and `usec_per_call` of `cmdstat_eval` in `INFO commandstats`.
fn eval_stats(info: &str) -> (u64, f64) {
    let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_eval:")) else {
        return (0, 0.0);
    };
    let field = |k: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or("0")
    };
    (
        field("calls").parse().unwrap_or(0),
        field("usec_per_call").parse().unwrap_or(0.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_evals_from_commandstats() {
        let info = "# Commandstats\r\ncmdstat_zadd:calls=898,usec=2684,usec_per_call=2.99\r\n\
                    cmdstat_eval:calls=598,usec=28000,usec_per_call=46.82,rejected_calls=0\r\n";
        assert_eq!(eval_stats(info), (598, 46.82));
        assert_eq!(eval_stats("# Commandstats\r\n"), (0, 0.0));
    }
}
