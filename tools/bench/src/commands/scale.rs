//! `prefix-bench scale`: what sync costs Redis for a whole fleet (issue 13),
//! from the engine's own cost model.
//!
//! For each table size, `sync::testkit::steady_state_cost_with` drives two
//! real sync engines (a writer holding the table and changing
//! `churn_per_mille` of it per period, and a reader) over the in-memory Redis
//! on a fake clock, and counts every command, key and byte. The fleet figure
//! is then `replicas` readers plus one writer's pushes: every replica reads
//! every change and does its own anti-entropy, while the churn is written
//! once whoever writes it. Two anti-entropy modes are modelled: a full scan
//! every `full_scan_every` cycles (the default), and the rotating scan of
//! `sync.scan_keys_per_cycle`. `prefix-bench sync-cost` checks the same cost
//! model against real Redis and a real Envoy replica at 200k entities.
//!
//! With one hash tag (`sync.hash_tags` 1, the default) all keys sit in one
//! Redis Cluster slot, so one shard takes the whole load. The per-shard
//! table models `--hash-tags` K: the rotating mode is run again with K tags
//! against one in-memory Redis per tag (so a part's SCAN walks its own keys),
//! which count the keys of every tag (the reader's reads, the writer's
//! writes), and each tag's load goes to the master owning its slot among N
//! masters with equal contiguous slot ranges (what `redis-cli --cluster
//! create` assigns).

use std::time::Instant;

use envoy_prefix_router::sync::testkit::{
    steady_state_cost_per_tag, steady_state_cost_with, CostModel, CycleCost, TagLoad,
};
use envoy_prefix_router::sync::SyncSettings;
use serde_json::json;

use crate::report::{num, write_json, Table};

#[derive(Clone, Debug)]
pub struct ScaleArgs {
    pub replicas: Vec<usize>,
    pub entities: Vec<usize>,
    pub churn_per_mille: usize,
    pub period_ms: u64,
    pub full_scan_every: u32,
    pub scan_keys_per_cycle: usize,
    pub shard_keys_per_s: f64,
    pub hash_tags: usize,
    pub shards: Vec<usize>,
}

/// Redis Cluster slots.
const SLOTS: usize = 16_384;

/// One modelled mode at one table size.
struct Modelled {
    mode: String,
    entities: usize,
    cost: CycleCost,
    /// Worst-case delay for a change the change log missed, in periods.
    missed_change_periods: f64,
}

pub fn run(args: &ScaleArgs) {
    let wall = Instant::now();
    println!(
        "prefix-bench scale: {} per mille churn per {} ms period, change-log polls every {} ms; \
         replicas {:?}, entities {:?}",
        args.churn_per_mille,
        args.period_ms,
        SyncSettings::default().poll_ms,
        args.replicas,
        args.entities
    );
    let period_s = args.period_ms as f64 / 1000.0;
    let every = args.full_scan_every.max(2);
    let mut modelled = Vec::new();
    for &entities in &args.entities {
        let base = CostModel {
            entities,
            churn_per_mille: args.churn_per_mille,
            full_scan_every: every,
            cycles: every as usize,
            period_ms: args.period_ms,
            poll_ms: SyncSettings::default().poll_ms,
            scan_keys_per_cycle: 0,
            hash_tags: 1,
        };
        let started = Instant::now();
        let periodic = steady_state_cost_with(&base);
        modelled.push(Modelled {
            mode: format!("full scan every {every}"),
            entities,
            cost: periodic,
            missed_change_periods: f64::from(every),
        });
        let budget = args.scan_keys_per_cycle.max(1);
        let rotating = steady_state_cost_with(&CostModel {
            scan_keys_per_cycle: budget,
            ..base
        });
        // The keyspace a pass walks: the namespace's keys (the change log
        // and the other namespace are a handful).
        modelled.push(Modelled {
            mode: format!("rotating, {budget} keys/cycle"),
            entities,
            cost: rotating,
            missed_change_periods: (entities as f64 / budget as f64).ceil() + 1.0,
        });
        eprintln!(
            "  modelled {entities} entities in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    let mut per_replica = Table::new(
        "Per replica and period (cost model: reader engine; the writer's pushes separately)",
        &[
            "entities",
            "anti-entropy",
            "reader cmds",
            "reader keys read",
            "reader KB",
            "writer keys written",
            "missed change reaches all within",
        ],
    );
    for m in &modelled {
        per_replica.row(&[
            num(m.entities as f64, 0),
            m.mode.clone(),
            num(m.cost.commands, 0),
            num(m.cost.keys_read, 0),
            num((m.cost.bytes_sent + m.cost.bytes_received) / 1024.0, 0),
            num(m.cost.writer_keys_written, 0),
            format!("{} s", num(m.missed_change_periods * period_s, 0)),
        ]);
    }
    print!("\n{}", per_replica.render());

    let mut fleet = Table::new(
        "Fleet-wide Redis load (one slot: all of it on one shard)",
        &[
            "replicas",
            "entities",
            "anti-entropy",
            "commands/s",
            "keys/s",
            "MB/s",
            "shards at budget",
        ],
    );
    let mut rows = Vec::new();
    for m in &modelled {
        for &r in &args.replicas {
            let r_f = r as f64;
            let c = &m.cost;
            // Writes: SETEX per key plus XADD and EXPIRE per chunk.
            let chunk = SyncSettings::default().setex_chunk as f64;
            let writes = c.writer_keys_written * (1.0 + 2.0 / chunk);
            let commands = (r_f * c.commands + writes) / period_s;
            let keys = (r_f * c.keys_read + c.writer_keys_written) / period_s;
            let bytes = (r_f * (c.bytes_sent + c.bytes_received) + c.writer_bytes_sent) / period_s;
            let shards = (keys / args.shard_keys_per_s).ceil().max(1.0);
            fleet.row(&[
                r.to_string(),
                num(m.entities as f64, 0),
                m.mode.clone(),
                num(commands, 0),
                num(keys, 0),
                num(bytes / 1e6, 2),
                num(shards, 0),
            ]);
            rows.push(json!({
                "replicas": r,
                "entities": m.entities,
                "mode": m.mode,
                "commands_per_s": commands,
                "keys_per_s": keys,
                "bytes_per_s": bytes,
                "shards_at_budget": shards,
                "missed_change_s": m.missed_change_periods * period_s,
            }));
        }
    }
    print!("\n{}", fleet.render());
    println!(
        "(keys/s counts keys returned by SCAN or fetched by MGET plus keys written; \
         \"shards at budget\" = keys/s / {} rounded up, if the keys could be spread)",
        num(args.shard_keys_per_s, 0)
    );
    let per_shard = if args.hash_tags > 1 {
        per_shard_table(args, &modelled, period_s)
    } else {
        Vec::new()
    };
    let path = write_json(
        "scale",
        &json!({
            "churn_per_mille": args.churn_per_mille,
            "period_ms": args.period_ms,
            "full_scan_every": every,
            "scan_keys_per_cycle": args.scan_keys_per_cycle,
            "shard_keys_per_s": args.shard_keys_per_s,
            "per_replica": modelled.iter().map(|m| json!({
                "entities": m.entities,
                "mode": m.mode,
                "reader_commands": m.cost.commands,
                "reader_keys_read": m.cost.keys_read,
                "reader_bytes": m.cost.bytes_sent + m.cost.bytes_received,
                "writer_keys_written": m.cost.writer_keys_written,
                "missed_change_periods": m.missed_change_periods,
            })).collect::<Vec<_>>(),
            "fleet": rows,
            "hash_tags": args.hash_tags,
            "per_shard": per_shard,
        }),
    );
    println!(
        "\nresults: {}\nwall time: {:.1} s",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
}

/// Models the rotating mode with `args.hash_tags` tags at every table size
/// and prints the load of each of N masters; returns the rows as JSON.
fn per_shard_table(
    args: &ScaleArgs,
    modelled: &[Modelled],
    period_s: f64,
) -> Vec<serde_json::Value> {
    let k = args.hash_tags;
    let mut table = Table::new(
        &format!(
            "Per shard, rotating anti-entropy ({} keys/cycle), namespace over {k} hash tags, \
             N masters with equal slot ranges",
            args.scan_keys_per_cycle.max(1)
        ),
        &[
            "replicas",
            "entities",
            "masters",
            "keys/s total",
            "mean keys/s per shard",
            "max",
            "max/mean",
            "max <= budget",
            "max/mean <= 1.5",
            "commands/s per shard, max",
        ],
    );
    let mut rows = Vec::new();
    let sizes: Vec<usize> = {
        let mut v: Vec<usize> = modelled.iter().map(|m| m.entities).collect();
        v.dedup();
        v
    };
    for entities in sizes {
        let started = Instant::now();
        let (_, tags) = steady_state_cost_per_tag(&CostModel {
            entities,
            churn_per_mille: args.churn_per_mille,
            full_scan_every: args.full_scan_every.max(2),
            cycles: args.full_scan_every.max(2) as usize,
            period_ms: args.period_ms,
            poll_ms: SyncSettings::default().poll_ms,
            scan_keys_per_cycle: args.scan_keys_per_cycle.max(1),
            hash_tags: k,
        });
        eprintln!(
            "  modelled {entities} entities over {k} tags in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        for &r in &args.replicas {
            for &n in &args.shards {
                let n = n.max(1);
                let loads = shard_loads(&tags, r as f64, n, period_s);
                let total: f64 = loads.iter().sum();
                let mean = total / n as f64;
                let max = loads.iter().copied().fold(0.0, f64::max);
                let ratio = if mean > 0.0 { max / mean } else { 0.0 };
                let verdict = |ok: bool| if ok { "PASS" } else { "MISS" }.to_string();
                let commands = shard_commands(&tags, r as f64, n, period_s);
                let max_commands = commands.iter().copied().fold(0.0, f64::max);
                table.row(&[
                    r.to_string(),
                    num(entities as f64, 0),
                    n.to_string(),
                    num(total, 0),
                    num(mean, 0),
                    num(max, 0),
                    num(ratio, 2),
                    verdict(max <= args.shard_keys_per_s),
                    verdict(ratio <= 1.5),
                    num(max_commands, 0),
                ]);
                rows.push(json!({
                    "replicas": r,
                    "entities": entities,
                    "hash_tags": k,
                    "masters": n,
                    "keys_per_s": total,
                    "per_shard_keys_per_s": loads,
                    "max_over_mean": ratio,
                    "per_shard_commands_per_s": commands,
                }));
            }
        }
    }
    print!("\n{}", table.render());
    println!(
        "(each tag's keys/s = replicas x the reader's + the writer's, counted per tag by the \
         in-memory Redis; a tag's slot belongs to master floor(slot x N / {SLOTS}))"
    );
    rows
}

/// Keys/s on each of `n` masters: every tag's load on its slot's owner.
fn shard_loads(tags: &[TagLoad], replicas: f64, n: usize, period_s: f64) -> Vec<f64> {
    let mut loads = vec![0.0; n];
    for t in tags {
        let shard = usize::from(t.slot) * n / SLOTS;
        loads[shard] += (replicas * t.reader_keys + t.writer_keys) / period_s;
    }
    loads
}

/// Commands/s on each of `n` masters: the readers' per tag, plus the
/// writer's writes (SETEX per key, XADD and EXPIRE per chunk).
fn shard_commands(tags: &[TagLoad], replicas: f64, n: usize, period_s: f64) -> Vec<f64> {
    let chunk = SyncSettings::default().setex_chunk as f64;
    let mut loads = vec![0.0; n];
    for t in tags {
        let shard = usize::from(t.slot) * n / SLOTS;
        let writes = t.writer_keys * (1.0 + 2.0 / chunk);
        loads[shard] += (replicas * t.reader_commands + writes) / period_s;
    }
    loads
}
