//! The closed-loop bursts of `prefix-bench compare`: a client keeping as
//! many requests in flight as there are pods sends a few hundred requests
//! back to back, drawn at random request by request, over caches sized by
//! `--burst-cache` (a fraction of `sessions-burst`'s working set):
//!
//! - `tenants-burst`: [`TENANTS`] shared system prompts of
//!   [`TENANT_TOKENS`] tokens, each request a short question to a tenant
//!   drawn uniformly;
//! - `sessions-burst`: [`SESSIONS`] conversations, each with its own system
//!   prompt, each turn resending the conversation so far (up to about
//!   [`session_tokens`] tokens), turns interleaved at random.
//!
//! At the default 0.67 the tenants fit only if each lives on one pod and
//! the conversations do not all fit: a router that copies or moves a prefix
//! pays a miss and evicts something else. Which pod model they run on
//! (`--slots` at or above the pods' count: load costs nothing; `--slots 1`:
//! requests queue) is the caller's choice.

use crate::workload::{
    chat_sessions, zipf_prefix, ApiMix, BodyOptions, ChatOrder, ChatSessions, Request, ZipfPrefix,
    BYTES_PER_TOKEN,
};

/// What a burst is built from (`compare`'s flags).
#[derive(Clone, Debug)]
pub struct BurstSpec {
    /// `sessions-burst` (else `tenants-burst`).
    pub sessions: bool,
    /// Multiplies request counts (`--scale`).
    pub scale: f64,
    pub pods: usize,
    /// The pods' caches together, as a fraction of the conversations'
    /// working set (`--burst-cache`).
    pub cache: f64,
    /// Tokens per KV block of the pods.
    pub kv_block_tokens: u32,
    pub body: BodyOptions,
    pub seed: u64,
}

/// A burst ready to send: its requests, a line saying what they are, the
/// requests kept in flight, and the pods' KV blocks.
pub struct Burst {
    pub requests: Vec<Request>,
    pub description: String,
    pub concurrency: usize,
    pub kv_blocks: u32,
}

fn scaled(spec: &BurstSpec, n: usize) -> usize {
    ((n as f64 * spec.scale).round() as usize).max(1)
}

/// Tenants of `tenants-burst`, their system prompts and questions (tokens),
/// and its requests (before `--scale`).
pub const TENANTS: usize = 12;
pub const TENANT_TOKENS: usize = 900;
const QUESTION_TOKENS: usize = 32;
const TENANT_REQUESTS: usize = 288;
/// Conversations of `sessions-burst`, their turns and the tokens of each
/// part of a turn.
pub const SESSIONS: usize = 16;
const TURNS: usize = 10;
const SESSION_SYSTEM_TOKENS: usize = 500;
const USER_TOKENS: usize = 40;
const ASSISTANT_TOKENS: usize = 100;

/// The longest turn of a conversation, tokens: its system prompt, every
/// user turn and every reply but the last.
pub const fn session_tokens() -> usize {
    SESSION_SYSTEM_TOKENS + TURNS * USER_TOKENS + (TURNS - 1) * ASSISTANT_TOKENS
}

/// KV blocks per pod for a burst: `fraction` of the conversations' working
/// set, spread over the pods.
pub fn kv_blocks(spec: &BurstSpec) -> u32 {
    let working_set = (scaled(spec, SESSIONS) * session_tokens()) as f64;
    let per_pod = spec.cache.max(0.0) * working_set / spec.pods.max(1) as f64;
    let block = f64::from(spec.kv_block_tokens.max(1));
    ((per_pod / block).ceil() as u32).max(1)
}

/// Builds the burst `spec` names.
pub fn build(spec: &BurstSpec) -> Burst {
    let concurrency = spec.pods.max(1);
    let blocks = kv_blocks(spec);
    let cache = format!(
        "closed loop, {concurrency} in flight (= pods); caches {} tokens per pod ({:.2} of the \
         conversations' working set)",
        blocks * spec.kv_block_tokens,
        spec.cache
    );
    let (requests, what) = if spec.sessions {
        let sessions = scaled(spec, SESSIONS);
        let cfg = ChatSessions {
            sessions,
            turns: TURNS,
            system_len: SESSION_SYSTEM_TOKENS * BYTES_PER_TOKEN,
            user_len: USER_TOKENS * BYTES_PER_TOKEN,
            assistant_len: ASSISTANT_TOKENS * BYTES_PER_TOKEN,
            body: spec.body.clone(),
            order: ChatOrder::Interleaved,
            seed: spec.seed,
        };
        let what = format!(
            "{sessions} conversations x {TURNS} turns interleaved at random, each its own \
             {SESSION_SYSTEM_TOKENS}-token system prompt, {USER_TOKENS}-token user turns, \
             {ASSISTANT_TOKENS}-token replies in the history (up to {} tokens)",
            session_tokens()
        );
        (chat_sessions(&cfg), what)
    } else {
        let count = scaled(spec, TENANT_REQUESTS);
        let cfg = ZipfPrefix {
            groups: TENANTS,
            requests: count,
            exponent: 0.0,
            system_prompt_len: TENANT_TOKENS * BYTES_PER_TOKEN,
            question_len: QUESTION_TOKENS * BYTES_PER_TOKEN,
            api: ApiMix::Alternate,
            body: spec.body.clone(),
            seed: spec.seed,
        };
        let what = format!(
            "{count} requests, {TENANTS} tenants drawn uniformly, each a {TENANT_TOKENS}-token \
             system prompt + {QUESTION_TOKENS}-token question"
        );
        (zipf_prefix(&cfg), what)
    };
    Burst {
        requests,
        description: format!("{what}; {cache}"),
        concurrency,
        kv_blocks: blocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::compare::{build as build_workload, CompareArgs, WorkloadKind};
    use crate::runner::Pacing;

    fn spec(args: &CompareArgs) -> BurstSpec {
        BurstSpec {
            sessions: false,
            scale: args.scale,
            pods: args.pods,
            cache: args.burst_cache,
            kv_block_tokens: args.pod.kv_block_tokens,
            body: BodyOptions::default(),
            seed: args.seed,
        }
    }

    #[test]
    fn default_cache_holds_two_thirds_of_the_conversations_and_every_tenant_once() {
        let args = CompareArgs::defaults();
        let per_pod = (kv_blocks(&spec(&args)) * args.pod.kv_block_tokens) as usize;
        let fleet = per_pod * args.pods;
        let sessions = SESSIONS * session_tokens();
        assert!(fleet < sessions, "{fleet} vs {sessions}");
        assert!(fleet * 3 >= sessions * 2 - 3 * args.pods * 16);
        // Every tenant fits once, not twice.
        let tenants = TENANTS * (TENANT_TOKENS + QUESTION_TOKENS);
        assert!(
            fleet > tenants && fleet < 2 * tenants,
            "{fleet} vs {tenants}"
        );
    }

    #[test]
    fn bursts_run_closed_loop_at_the_pods_count() {
        let args = CompareArgs::defaults();
        for kind in [WorkloadKind::TenantsBurst, WorkloadKind::SessionsBurst] {
            let b = build_workload(kind, &args);
            assert_eq!(
                b.pacing,
                Pacing::Closed {
                    concurrency: args.pods
                }
            );
            assert_eq!(b.kv_blocks, Some(kv_blocks(&spec(&args))));
            assert!(b.requests.len() >= 160, "{}", b.requests.len());
        }
    }
}
