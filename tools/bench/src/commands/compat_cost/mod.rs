//! `prefix-bench compat-cost`: what `"compat": "aibrix"` costs in Redis
//! against the filter's native mode, measured on real processes: one Envoy
//! replica on `envoy/aibrix.yaml` (EDS pods named by hostname, the Redis
//! bridge), podsim pods and redis-server.
//!
//! - native: the same YAML with `compat` and `block_size` removed from the
//!   plugin JSON, so the defaults hold: 128-byte blocks, 32 dense blocks then
//!   8 per doubling, change log with a full scan every 6 cycles, polls.
//! - compat: the YAML as shipped: 4-byte blocks, every block up to 4096
//!   recorded, a full SCAN+MGET of the namespace every cycle.
//!
//! Both run with the same sync period. Envoy's Redis cluster points at a
//! [`RedisMeter`], which relays to redis-server and counts every bridge call
//! by class (`write prefixcache` = the push of prompt blocks; `read ...` =
//! pulls; `... podload` = the replica's load entity) and direction.
//!
//! 1. New prompts: per (mode, size) a fresh replica on a flushed Redis; after
//!    one cycle, N distinct chat prompts (one user message of the size) are
//!    sent, then the run waits until the push is over (two cycles since the
//!    last prompt, no prompt-block write over the last one). Per prompt:
//!    keys created (DBSIZE), the push's calls, commands and bytes, Redis
//!    `used_memory`, the filter's mean `route_time_us`, and (compat) how much
//!    of each prompt an AIBrix gateway's lookup finds in Redis; then
//!    everything the replica exchanged with Redis during that window (pulls
//!    included), beside Redis's own `INFO` count.
//! 2. Holding the namespace: a fresh replica on a flushed Redis gets P prompts
//!    of K KiB; once their push is over, C idle cycles are observed: what one
//!    replica sends and receives per cycle just to keep the namespace in view.
//!
//! No timing is asserted; waits are deadlines.

use std::time::Instant;

use serde_json::json;

use crate::redis_meter::RedisMeter;
use crate::report::write_json_in;
use harness::fleet::Fleet;
use harness::redis::Conn;

mod cells;
mod replica;
mod setup;
mod tables;

use cells::{push_cell, steady_cell};
pub use setup::CompatCostArgs;
use setup::{Mode, PODS};
use tables::{print_push, print_steady};

pub fn run(args: &CompatCostArgs) {
    let wall = Instant::now();
    println!(
        "prefix-bench compat-cost: native vs compat aibrix on envoy/aibrix.yaml, 1 replica, \
         {PODS} podsim pods, redis-server, sync period {} ms; {} chat prompts at each of {:?} \
         KiB; steady state after {} x {} KiB, {} cycles; table_capacity_blocks {}",
        args.period_ms,
        args.prompts,
        args.sizes_kib,
        args.steady_prompts,
        args.steady_kib,
        args.steady_cycles,
        args.table_capacity_blocks
            .map_or("default (200000 native, 2000000 compat)".into(), |c| c
                .to_string())
    );
    let load = crate::procstat::LoadMeter::start();
    let mut fleet = Fleet::new("bench-compat-cost");
    fleet.start_redis();
    fleet.start_pods(&["--time-scale", "0"]);
    let meter = RedisMeter::start(fleet.redis_port).expect("start the Redis meter");
    let mut redis = Conn::connect(fleet.redis_port);
    let mut next_id = 0u64;
    let mut pushes = Vec::new();
    let mut steady = Vec::new();
    for mode in [Mode::Native, Mode::Compat] {
        for &kib in &args.sizes_kib {
            let cell = push_cell(
                &mut fleet,
                &meter,
                &mut redis,
                mode,
                kib,
                args,
                &mut next_id,
            );
            println!(
                "  {} {kib} KiB: {:.1} keys/prompt, window {:.1} s, {} cycles{}",
                mode.name(),
                cell.keys_per_prompt,
                cell.window_s,
                cell.window_cycles,
                if cell.quiet { "" } else { " (NOT QUIET)" }
            );
            pushes.push(cell);
        }
        let cell = steady_cell(&mut fleet, &meter, &mut redis, mode, args, &mut next_id);
        println!(
            "  {} steady: {} keys, {:.0} commands/cycle{}",
            mode.name(),
            cell.keys,
            cell.per_cycle.commands,
            if cell.quiet { "" } else { " (NOT QUIET)" }
        );
        steady.push(cell);
    }
    drop(meter);
    drop(fleet);
    print_push(args, &pushes);
    print_steady(args, &steady);
    let load = load.finish();
    println!("{load}");
    let path = write_json_in(
        args.results_dir.as_deref(),
        "compat-cost",
        &json!({
            "load": load,
            "period_ms": args.period_ms,
            "table_capacity_blocks": args.table_capacity_blocks,
            "prompts": args.prompts,
            "sizes_kib": args.sizes_kib,
            "push": pushes,
            "steady": steady,
        }),
    );
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}
