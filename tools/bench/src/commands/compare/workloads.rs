//! The workloads of a comparison but `live-fleet` (its own module):
//! each one's requests, pacing and description, from the options; the
//! default Poisson rate from `--load` ([`derived_rate_at`]).

use super::args::CompareArgs;
use super::results::WorkloadKind;
use crate::commands::bursts::{self, BurstSpec};
use crate::outage::Outage;
use crate::runner::Pacing;
use crate::workload::{
    chat_sessions, no_sharing, shared_prefix, zipf_prefix, Api, ApiMix, BodyOptions, ChatOrder,
    ChatSessions, NoSharing, Order, Request, SharedPrefix, Streaming, ZipfPrefix, BYTES_PER_TOKEN,
};

/// Tenants of the `tenants` workload, and its requests (before `--scale`).
const TENANTS: usize = 16;
const TENANT_REQUESTS: usize = 512;

/// A workload ready to send.
pub struct Built {
    pub kind: WorkloadKind,
    pub requests: Vec<Request>,
    pub pacing: Pacing,
    pub description: String,
    /// Mean prompt, tokens (podsim's 4 bytes per token).
    pub mean_prompt_tokens: f64,
    /// A pod that leaves and returns during the run (live-fleet).
    pub outage: Option<Outage>,
    /// (pod index, time scale factor): one pod slower than the others.
    pub slow_pod: Option<(usize, f64)>,
    /// KV blocks per pod where the workload sizes the caches itself
    /// (the bursts); None = the pod model's.
    pub kv_blocks: Option<u32>,
}

pub(super) fn body(args: &CompareArgs) -> BodyOptions {
    BodyOptions {
        model: "sim-model".into(),
        max_tokens: args.output_tokens,
        streaming: Streaming::Always,
    }
}

pub(super) fn mean_tokens(requests: &[Request]) -> f64 {
    let total: usize = requests.iter().map(|r| r.prompt_len).sum();
    total as f64 / requests.len().max(1) as f64 / BYTES_PER_TOKEN as f64
}

/// The derived Poisson rate at utilisation `load`: `load` x slots of the
/// fleet / the service time of the mean prompt with nothing cached.
pub(super) fn derived_rate_at(args: &CompareArgs, mean_prompt_tokens: f64, load: f64) -> f64 {
    let service = args
        .pod
        .service_s(mean_prompt_tokens, f64::from(args.output_tokens));
    let slots = (args.pods as f64) * f64::from(args.pod.slots);
    if service <= 0.0 {
        return 50.0;
    }
    (load * slots / service * 10.0).round() / 10.0
}

/// The shared-prefix shape (SGLang's generated-shared-prefix): `groups` x
/// `prompts` of the options' system prompt and question lengths.
pub(super) fn shared_prefix_spec(
    args: &CompareArgs,
    groups: usize,
    prompts: usize,
    order: Order,
) -> SharedPrefix {
    SharedPrefix {
        groups,
        prompts_per_group: prompts,
        system_prompt_len: args.system_tokens * BYTES_PER_TOKEN,
        question_len: args.question_tokens * BYTES_PER_TOKEN,
        api: ApiMix::Alternate,
        order,
        body: body(args),
        seed: args.seed,
    }
}

/// The pacing of an open-loop workload at utilisation `load` (closed loop
/// when `--concurrency` is given), and how it reads in the description.
fn open_at(args: &CompareArgs, requests: &[Request], load: f64) -> (Pacing, String) {
    if let Some(c) = args.concurrency {
        return (
            Pacing::Closed { concurrency: c },
            format!("closed loop, {c} in flight"),
        );
    }
    let rate = args
        .rate
        .unwrap_or_else(|| derived_rate_at(args, mean_tokens(requests), load));
    (
        Pacing::Poisson {
            rate_per_sec: rate,
            seed: args.seed,
        },
        format!(
            "Poisson {rate} req/s{}",
            if args.rate.is_none() {
                format!(" (pods {:.0} % busy if nothing hit)", load * 100.0)
            } else {
                String::new()
            }
        ),
    )
}

/// [`open_at`] at `--load`.
fn open(args: &CompareArgs, requests: &[Request]) -> (Pacing, String) {
    open_at(args, requests, args.load)
}

/// Requests drawing their group's system prompt Zipf(s = --zipf-exponent).
fn zipf(args: &CompareArgs, groups: usize, requests: usize) -> Vec<Request> {
    zipf_prefix(&ZipfPrefix {
        groups,
        requests,
        exponent: args.zipf_exponent,
        system_prompt_len: args.system_tokens * BYTES_PER_TOKEN,
        question_len: args.question_tokens * BYTES_PER_TOKEN,
        api: ApiMix::Alternate,
        body: body(args),
        seed: args.seed,
    })
}

/// An open-loop workload: no outage, no slow pod, the pod model's caches.
fn plain(kind: WorkloadKind, requests: Vec<Request>, pacing: Pacing, description: String) -> Built {
    Built {
        kind,
        description,
        mean_prompt_tokens: mean_tokens(&requests),
        requests,
        pacing,
        outage: None,
        slow_pod: None,
        kv_blocks: None,
    }
}

/// `tenants-burst` and `sessions-burst` (see [`bursts`]).
pub(super) fn burst(kind: WorkloadKind, args: &CompareArgs) -> Built {
    let b = bursts::build(&BurstSpec {
        sessions: kind == WorkloadKind::SessionsBurst,
        scale: args.scale,
        pods: args.pods,
        cache: args.burst_cache,
        kv_block_tokens: args.pod.kv_block_tokens,
        body: body(args),
        seed: args.seed,
    });
    Built {
        kind,
        description: b.description,
        mean_prompt_tokens: mean_tokens(&b.requests),
        requests: b.requests,
        pacing: Pacing::Closed {
            concurrency: b.concurrency,
        },
        outage: None,
        slow_pod: None,
        kv_blocks: Some(b.kv_blocks),
    }
}

/// `shared-prefix`: groups x prompts, shuffled, Poisson at `--load`.
pub(super) fn shared(args: &CompareArgs) -> Built {
    let ppg = args.scaled(args.prompts_per_group);
    let requests = shared_prefix(&shared_prefix_spec(args, args.groups, ppg, Order::Shuffled));
    let (pacing, how) = open(args, &requests);
    let description = format!(
        "{} groups x {ppg} prompts, {}-token system prompt + {}-token question, {} output tokens, \
         shuffled, completions and chat alternating by group, all streaming; {how}",
        args.groups, args.system_tokens, args.question_tokens, args.output_tokens
    );
    plain(WorkloadKind::SharedPrefix, requests, pacing, description)
}

/// `high-load` (the shared-prefix shape at `--high-load`) and
/// `hetero-fleet` (at `--load`, pod-1 `--slow-factor` times slower).
pub(super) fn loaded(kind: WorkloadKind, args: &CompareArgs) -> Built {
    let ppg = args.scaled(args.prompts_per_group);
    let requests = shared_prefix(&shared_prefix_spec(args, args.groups, ppg, Order::Shuffled));
    let hetero = kind == WorkloadKind::HeteroFleet;
    let load = if hetero { args.load } else { args.high_load };
    let (pacing, how) = open_at(args, &requests, load);
    let slow = if hetero {
        format!(
            "; pod-1 {}x slower (podsim --time-scale), the rate is of the all-fast fleet",
            args.slow_factor
        )
    } else {
        String::new()
    };
    let description = format!(
        "shared-prefix shape, {} groups x {ppg} prompts, {}-token system prompt + {}-token \
         question, {} output tokens, shuffled; {how}{slow}",
        args.groups, args.system_tokens, args.question_tokens, args.output_tokens
    );
    Built {
        slow_pod: hetero.then_some((0, args.slow_factor)),
        ..plain(kind, requests, pacing, description)
    }
}

/// `cache-pressure`: many system prompts, far more distinct prefix tokens
/// than a pod's cache, each request's group drawn Zipf.
pub(super) fn cache_pressure(args: &CompareArgs) -> Built {
    let count = args.scaled(args.pressure_requests);
    let requests = zipf(args, args.pressure_groups, count);
    let (pacing, how) = open(args, &requests);
    let m = args.pod_model();
    let distinct = args.pressure_groups * args.system_tokens;
    let cache = (m.kv_capacity_blocks * m.kv_block_tokens) as usize;
    let description = format!(
        "{count} requests over {} system prompts of {} tokens (+ {}-token question), \
         group drawn Zipf(s = {}); distinct prefix tokens = {:.1} x one pod's cache; {how}",
        args.pressure_groups,
        args.system_tokens,
        args.question_tokens,
        args.zipf_exponent,
        distinct as f64 / cache.max(1) as f64
    );
    plain(WorkloadKind::CachePressure, requests, pacing, description)
}

/// `tenants`: tenants of uneven size, each with its own system prompt (all
/// of them more than one pod's cache holds, a third of the fleet's): how
/// evenly a router spreads requests over pods while keeping each tenant's
/// prefix hot.
pub(super) fn tenants(args: &CompareArgs) -> Built {
    let count = args.scaled(TENANT_REQUESTS);
    let requests = zipf(args, TENANTS, count);
    let (pacing, how) = open(args, &requests);
    let description = format!(
        "{count} requests of {TENANTS} tenants, each with its own {}-token system prompt \
         (+ {}-token question), tenant drawn Zipf(s = {}): the largest sends {:.0} %; {how}",
        args.system_tokens,
        args.question_tokens,
        args.zipf_exponent,
        100.0
            / (1..=TENANTS)
                .map(|k| 1.0 / (k as f64).powf(args.zipf_exponent))
                .sum::<f64>()
    );
    plain(WorkloadKind::Tenants, requests, pacing, description)
}

/// `concurrency-1`: the groups, two prompts each in two waves, one request
/// at a time.
pub(super) fn concurrency_1(args: &CompareArgs) -> Built {
    let requests = shared_prefix(&shared_prefix_spec(args, args.groups, 2, Order::Waves));
    let description = format!(
        "{} groups x 2 prompts in two waves (every prefix new in wave 1, reused in wave 2), \
         same prompt shape; closed loop, 1 in flight",
        args.groups
    );
    plain(
        WorkloadKind::Concurrency1,
        requests,
        Pacing::Closed { concurrency: 1 },
        description,
    )
}

/// `chat`: multi-turn sessions resending a growing history.
pub(super) fn chat(args: &CompareArgs) -> Built {
    let sessions = args.scaled(args.sessions);
    let cfg = ChatSessions {
        sessions,
        turns: args.turns,
        system_len: args.system_tokens / 2 * BYTES_PER_TOKEN,
        user_len: 64 * BYTES_PER_TOKEN,
        assistant_len: 192 * BYTES_PER_TOKEN,
        body: body(args),
        order: ChatOrder::TurnMajor,
        seed: args.seed,
    };
    let requests = chat_sessions(&cfg);
    let (pacing, how) = open(args, &requests);
    let description = format!(
        "{sessions} chat sessions x {} turns (turn-major), {}-token system prompt, \
         64-token user turns, 192-token assistant turns in the history, each turn resends \
         the whole history; {how}",
        args.turns,
        args.system_tokens / 2
    );
    plain(WorkloadKind::Chat, requests, pacing, description)
}

/// `no-sharing`: unique prompts, the control.
pub(super) fn unshared(args: &CompareArgs) -> Built {
    let count = args.scaled(256);
    let cfg = NoSharing {
        count,
        prompt_len: (args.system_tokens + args.question_tokens) * BYTES_PER_TOKEN,
        api: Api::Completions,
        body: body(args),
        seed: args.seed,
    };
    let requests = no_sharing(&cfg);
    let (pacing, how) = open(args, &requests);
    let description = format!(
        "{count} unique {}-token prompts (nothing to share: the control); {how}",
        args.system_tokens + args.question_tokens
    );
    plain(WorkloadKind::NoSharing, requests, pacing, description)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_rate_follows_the_pod_model() {
        let args = CompareArgs::defaults();
        // 4224 tokens x 50 us + 31 x 3 ms = 304.2 ms; 0.75 x 16 slots / 0.3042 s.
        let r = derived_rate_at(&args, 4224.0, args.load);
        assert!((r - 39.4).abs() < 0.1, "{r}");
    }
}
