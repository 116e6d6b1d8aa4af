//! `prefix-bench memory`: Envoy's resident memory (`VmRSS`) under the inputs
//! that could grow it, with the filter beside plain Envoy (issue 9, item 7).
//!
//! 1. Large bodies: the same chat bodies of `--body-mib` MiB through
//!    `plain.yaml` and `single.yaml` (which buffers and parses them), one
//!    worker each; RSS before, after every tenth request and at the end.
//! 2. Hostile Redis values: a replica on `sync.yaml` (1 s period) pulls
//!    `--hostile-values` values naming `--names-per-value` distinct unknown
//!    pods each, then as many naming that many distinct models each (the
//!    flood the issue measured at 54 MB that never came back); RSS before,
//!    after each flood has been pulled for 3 cycles, and after the keys are
//!    deleted and 3 more cycles ran.

use std::time::Duration;

use serde_json::json;

use crate::redis_writer::{setex_all, Namespace};
use crate::report::{num, Table};
use harness::fleet::{sync_patch, Fleet, Replica};
use harness::redis::Conn;
use harness::{self, send, CLIENT_TIMEOUT};

#[derive(Clone, Debug)]
pub struct MemoryArgs {
    pub bodies: usize,
    pub body_mib: usize,
    pub hostile_values: usize,
    pub names_per_value: usize,
}

/// `VmRSS` of a process, MiB (0 if unreadable).
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

pub fn run(args: &MemoryArgs) {
    println!(
        "prefix-bench memory: Envoy VmRSS (MiB), one worker; {} chat bodies of {} MiB through \
         plain Envoy and the filter; then a synced replica pulling {} values naming {} unknown \
         pods each, and {} naming {} models each",
        args.bodies,
        args.body_mib,
        args.hostile_values,
        args.names_per_value,
        args.hostile_values,
        args.names_per_value
    );
    bodies(args);
    hostile(args);
}

fn bodies(args: &MemoryArgs) {
    let mut fleet = Fleet::new("bench-memory");
    fleet.start_pods(&["--time-scale", "0"]);
    let plain = fleet.start_envoy("plain", "plain.yaml", 1, |_| {});
    let filter = fleet.start_envoy("filter", "single.yaml", 1, |_| {});
    let text = harness::text(91, args.body_mib * 1024 * 1024);
    let mut t = Table::new(
        &format!(
            "Large bodies: {} chat requests of {} MiB each (distinct prompts)",
            args.bodies, args.body_mib
        ),
        &[
            "Envoy",
            "RSS before",
            "after 10",
            "at the end",
            "growth",
            "failed",
        ],
    );
    for (name, i) in [("plain", plain), ("filter", filter)] {
        let r = &fleet.replicas[i];
        let before = rss_mib(r.pid);
        let mut after10 = before;
        let mut failed = 0;
        for n in 0..args.bodies {
            let body = json!({
                "model": "sim-model",
                "max_tokens": 1,
                "messages": [{"role": "user", "content": format!("{n} {text}")}],
            })
            .to_string();
            let url = format!("{}/v1/chat/completions", r.base_url());
            let ok = send(
                "POST",
                &url,
                &[("content-type", "application/json")],
                Some(body.as_bytes()),
                CLIENT_TIMEOUT,
            )
            .is_ok_and(|reply| reply.status == 200);
            failed += usize::from(!ok);
            if n + 1 == 10 {
                after10 = rss_mib(r.pid);
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        let end = rss_mib(r.pid);
        t.row(&[
            name.to_string(),
            num(before, 1),
            num(after10, 1),
            num(end, 1),
            num(end - before, 1),
            failed.to_string(),
        ]);
    }
    t.print();
}

fn wait_cycles(r: &Replica, n: i64) {
    let start = r.stat("prefix_router.sync.cycles_ok");
    let ok = r.wait_stat(
        "prefix_router.sync.cycles_ok",
        start + n,
        Duration::from_secs(30 * n as u64),
    );
    assert!(ok, "replica's sync stalled: {:?}", r.stats());
}

fn hostile(args: &MemoryArgs) {
    let mut fleet = Fleet::new("bench-memory-sync");
    fleet.start_pods(&["--time-scale", "0"]);
    fleet.start_redis();
    let patch = sync_patch(1000, json!({"write_through": false, "full_scan_every": 6}));
    let spec = fleet.spec("sync", "sync.yaml").merge(patch);
    let i = fleet.launch(spec);
    let r = &fleet.replicas[i];
    wait_cycles(r, 2);
    let ns = Namespace {
        prefix: "aibrix".into(),
        ns: "prefixcache".into(),
    };
    let mut conn = Conn::connect(fleet.redis_port);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let flood = |kind: &str| -> Vec<(String, Vec<u8>)> {
        (0..args.hostile_values)
            .map(|v| {
                let names: serde_json::Map<String, serde_json::Value> = (0..args.names_per_value)
                    .map(|k| (format!("{kind}-{v}-{k}"), json!(nanos)))
                    .collect();
                let payload = if kind == "pod" {
                    json!({"model_to_pods": {"sim-model": names}})
                } else {
                    let models: serde_json::Map<String, serde_json::Value> = names
                        .keys()
                        .map(|m| (m.clone(), json!({"127.0.0.1:1": nanos})))
                        .collect();
                    json!({ "model_to_pods": models })
                };
                (
                    format!(
                        "{}",
                        0x5eed_0000_0000_u64 + (v as u64) * 2 + u64::from(kind == "model")
                    ),
                    payload.to_string().into_bytes(),
                )
            })
            .collect()
    };
    let mut t = Table::new(
        "Hostile Redis values pulled by one synced replica (sync.yaml, 1 s period)",
        &[
            "step",
            "RSS",
            "growth",
            "sync.rejected",
            "sync.facts_ignored",
            "sync.foreign_entries",
        ],
    );
    let base = rss_mib(r.pid);
    let row = |t: &mut Table, step: &str| {
        let s = r.stats();
        let get = |n: &str| {
            s.get(&format!("prefix_router.sync.{n}"))
                .copied()
                .unwrap_or(0)
        };
        let rss = rss_mib(r.pid);
        t.row(&[
            step.to_string(),
            num(rss, 1),
            num(rss - base, 1),
            get("rejected").to_string(),
            get("facts_ignored").to_string(),
            get("foreign_entries").to_string(),
        ]);
    };
    row(&mut t, "before");
    for kind in ["pod", "model"] {
        setex_all(&mut conn, &ns, &flood(kind), 3600);
        wait_cycles(r, 3);
        row(
            &mut t,
            &format!(
                "{} values naming {} {kind}s each",
                args.hostile_values, args.names_per_value
            ),
        );
    }
    conn.command(&[b"FLUSHALL"]);
    wait_cycles(r, 3);
    row(&mut t, "keys deleted, 3 cycles later");
    t.print();
}
