//! The two measurements as tables.

use super::cells::{PushCell, SteadyCell};
use super::setup::CompatCostArgs;
use crate::report::{num, Table};

/// `12,345`.
pub(super) fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.round());
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    format!("{sign}{out}")
}

pub(super) fn print_push(args: &CompatCostArgs, cells: &[PushCell]) {
    let mut t = Table::new(
        &format!(
            "New prompts: cost per prompt ({} distinct chat prompts per row; fresh replica and \
             Redis per row). push = the replica's calls that write prompt blocks (SETEX; + XADD \
             and EXPIRE of the change log in native). AIBrix lookup = the share of each prompt \
             an AIBrix gateway's in-order walk matches in Redis afterwards \
             (tools/harness/src/aibrix/), and how many prompts it finds whole",
            args.prompts
        ),
        &[
            "mode",
            "prompt",
            "keys (blocks to record)",
            "push calls",
            "push commands",
            "push bytes in",
            "push bytes out",
            "Redis memory",
            "route_time_us mean",
            "AIBrix lookup: mean % (whole)",
        ],
    );
    for c in cells {
        t.row(&[
            c.mode.name().to_string(),
            format!("{} KiB", c.kib),
            format!("{} ({})", num(c.keys_per_prompt, 1), c.expected_keys),
            num(c.push.calls, 1),
            thousands(c.push.commands),
            thousands(c.push.bytes_in),
            thousands(c.push.bytes_out),
            thousands(c.used_memory_per_prompt),
            c.route_time_us_mean.map_or("-".into(), |v| num(v, 0)),
            c.aibrix_match_percent.as_ref().map_or("-".into(), |m| {
                let mean = m.iter().sum::<f64>() / m.len().max(1) as f64;
                let whole = m.iter().filter(|&&p| p >= 100.0).count();
                format!("{} ({whole}/{})", num(mean, 1), m.len())
            }),
        ]);
    }
    t.print();
    let mut w = Table::new(
        "Same rows, everything the replica exchanged with Redis from the first prompt until the \
         push was over (pushes, pulls, polls, podload), per prompt; Redis INFO = \
         total_commands_processed over the same window (+2 commands of ours)",
        &[
            "mode",
            "prompt",
            "window s",
            "cycles",
            "calls",
            "commands",
            "bytes in",
            "bytes out",
            "Redis INFO commands",
        ],
    );
    for c in cells {
        w.row(&[
            c.mode.name().to_string(),
            format!("{} KiB", c.kib),
            num(c.window_s, 1),
            c.window_cycles.to_string(),
            num(c.window.calls, 1),
            thousands(c.window.commands),
            thousands(c.window.bytes_in),
            thousands(c.window.bytes_out),
            thousands(
                c.redis
                    .get("total_commands_processed")
                    .copied()
                    .unwrap_or(0.0)
                    / c.prompts.max(1) as f64,
            ),
        ]);
    }
    w.print();
}

pub(super) fn print_steady(args: &CompatCostArgs, cells: &[SteadyCell]) {
    let mut t = Table::new(
        &format!(
            "Holding the namespace: per sync cycle of one idle replica (period {} ms; the cycle \
             plus the polls since the previous one), after {} prompts of {} KiB; mean of {} cycles. \
             Envoy CPU: the whole process (sync singleton, health checks, admin reads)",
            args.period_ms, args.steady_prompts, args.steady_kib, args.steady_cycles
        ),
        &[
            "mode",
            "keys in Redis (blocks to record)",
            "Redis memory (above empty)",
            "calls",
            "commands",
            "bytes in",
            "bytes out",
            "bytes/s in+out",
            "bytes in+out per key",
            "Envoy CPU ms",
            "s per cycle",
        ],
    );
    for c in cells {
        t.row(&[
            c.mode.name().to_string(),
            format!(
                "{} ({})",
                thousands(c.keys as f64),
                thousands(c.blocks as f64)
            ),
            thousands(c.used_memory),
            num(c.per_cycle.calls, 1),
            thousands(c.per_cycle.commands),
            thousands(c.per_cycle.bytes_in),
            thousands(c.per_cycle.bytes_out),
            thousands(
                (c.per_cycle.bytes_in + c.per_cycle.bytes_out) / c.seconds_per_cycle.max(1e-3),
            ),
            num(
                (c.per_cycle.bytes_in + c.per_cycle.bytes_out) / c.keys.max(1) as f64,
                1,
            ),
            num(c.envoy_cpu_ms_per_cycle, 1),
            num(c.seconds_per_cycle, 2),
        ]);
    }
    t.print();
}
