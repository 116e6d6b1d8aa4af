//! Deterministic request workloads: the same seed gives the same requests,
//! byte for byte. Three shapes:
//!
//! - [`shared_prefix`]: SGLang's "generated shared prefix" benchmark shape,
//!   `groups` system prompts, each followed by `prompts_per_group` different
//!   questions (the case prefix-aware routing is for);
//! - [`chat_sessions`]: multi-turn conversations, each turn resending the
//!   whole history (a session's turns share ever longer prefixes);
//! - [`no_sharing`]: unique prompts, the control where routing cannot help.
//!
//! Prompt text is the harness's deterministic filler ([`harness::text`]),
//! seeded from one SplitMix64 stream per workload.

use envoy_prefix_router::rng::SplitMix64;

/// podsim's tokenizer: 4 bytes of text per token.
pub const BYTES_PER_TOKEN: usize = 4;
use serde::Serialize;
use serde_json::{json, Value};

/// Which OpenAI-compatible call a request makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    Completions,
    Chat,
}

impl Api {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        }
    }
}

/// Which call each family of requests uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiMix {
    Only(Api),
    /// Even families completions, odd ones chat.
    Alternate,
}

impl ApiMix {
    fn for_family(self, family: usize) -> Api {
        match self {
            ApiMix::Only(api) => api,
            ApiMix::Alternate if family % 2 == 0 => Api::Completions,
            ApiMix::Alternate => Api::Chat,
        }
    }
}

/// Which requests ask for a streamed (SSE) reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streaming {
    Never,
    Always,
    /// Members with an odd index stream.
    Alternate,
}

impl Streaming {
    fn for_member(self, member: usize) -> bool {
        match self {
            Streaming::Never => false,
            Streaming::Always => true,
            Streaming::Alternate => member % 2 == 1,
        }
    }
}

/// Fields of every body besides the prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct BodyOptions {
    pub model: String,
    pub max_tokens: u32,
    pub streaming: Streaming,
}

impl Default for BodyOptions {
    fn default() -> Self {
        BodyOptions {
            model: "sim-model".into(),
            max_tokens: 16,
            streaming: Streaming::Never,
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub api: Api,
    /// The JSON body.
    pub body: String,
    pub stream: bool,
    /// The group or session whose prefix this request shares; None when it
    /// shares nothing.
    pub family: Option<usize>,
    /// Index inside the family (question number or chat turn), 0 first.
    pub member: usize,
    /// Bytes of prompt text (system + question, or all turns' contents).
    pub prompt_len: usize,
}

/// Order of a shared-prefix workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// All requests shuffled (SGLang's benchmark does this).
    Shuffled,
    /// Wave k holds the k-th question of every group, groups shuffled inside
    /// each wave: every prefix is introduced before it is reused.
    Waves,
    /// Group after group, questions in order.
    Grouped,
}

/// SGLang-style generated shared prefix: `groups` x `prompts_per_group`.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedPrefix {
    pub groups: usize,
    pub prompts_per_group: usize,
    /// Bytes of each group's system prompt.
    pub system_prompt_len: usize,
    /// Bytes of each question.
    pub question_len: usize,
    pub api: ApiMix,
    pub order: Order,
    pub body: BodyOptions,
    pub seed: u64,
}

/// Member `member` of prefix group `group`: completions prompt
/// `system + "\n" + question`, or a chat system message and user message.
fn system_and_question(
    api: Api,
    opts: &BodyOptions,
    group: usize,
    member: usize,
    system: &str,
    question: &str,
) -> Request {
    let stream = opts.streaming.for_member(member);
    let body = match api {
        Api::Completions => completion_body(&format!("{system}\n{question}"), opts, stream),
        Api::Chat => chat_body(&[("system", system), ("user", question)], opts, stream),
    };
    Request {
        api,
        body,
        stream,
        family: Some(group),
        member,
        prompt_len: system.len() + question.len(),
    }
}

/// Builds a [`SharedPrefix`] workload. Completions prompts are
/// `system + "\n" + question`; chat requests send a system and a user message.
pub fn shared_prefix(cfg: &SharedPrefix) -> Vec<Request> {
    let mut rng = SplitMix64::new(cfg.seed);
    let mut by_group: Vec<Vec<Request>> = Vec::with_capacity(cfg.groups);
    for group in 0..cfg.groups {
        let system = harness::text(rng.next_u64(), cfg.system_prompt_len);
        let api = cfg.api.for_family(group);
        let questions = (0..cfg.prompts_per_group)
            .map(|member| {
                let question = harness::text(rng.next_u64(), cfg.question_len);
                system_and_question(api, &cfg.body, group, member, &system, &question)
            })
            .collect();
        by_group.push(questions);
    }
    match cfg.order {
        Order::Grouped => by_group.into_iter().flatten().collect(),
        Order::Shuffled => {
            let mut all: Vec<Request> = by_group.into_iter().flatten().collect();
            rng.shuffle(&mut all);
            all
        }
        Order::Waves => {
            let mut out = Vec::with_capacity(cfg.groups * cfg.prompts_per_group);
            for member in 0..cfg.prompts_per_group {
                let mut wave: Vec<Request> = by_group.iter().map(|g| g[member].clone()).collect();
                rng.shuffle(&mut wave);
                out.extend(wave);
            }
            out
        }
    }
}

/// Multi-turn chat: `sessions` conversations of `turns` user turns each.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatSessions {
    pub sessions: usize,
    pub turns: usize,
    pub system_len: usize,
    pub user_len: usize,
    /// Bytes of each assistant reply written into the history.
    pub assistant_len: usize,
    pub body: BodyOptions,
    pub order: ChatOrder,
    pub seed: u64,
}

/// The order a [`ChatSessions`] workload sends its turns in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatOrder {
    /// Turn 1 of every session, then turn 2, ...: a turn is sent after the
    /// previous one when the concurrency is at most the number of sessions.
    TurnMajor,
    /// Each next request is the next turn of a session drawn at random among
    /// those with turns left: conversations interleave as real chat traffic
    /// does, and a session's next turn may arrive while others are in flight.
    Interleaved,
}

/// Builds a [`ChatSessions`] workload in `cfg.order`. Turn `t` resends the
/// system prompt and turns `1..t` with their (made-up) assistant replies.
pub fn chat_sessions(cfg: &ChatSessions) -> Vec<Request> {
    let mut rng = SplitMix64::new(cfg.seed);
    let mut sessions: Vec<Vec<Request>> = Vec::with_capacity(cfg.sessions);
    for session in 0..cfg.sessions {
        let mut history = vec![("system", harness::text(rng.next_u64(), cfg.system_len))];
        let mut turns = Vec::with_capacity(cfg.turns);
        for turn in 0..cfg.turns {
            if turn > 0 {
                let reply = harness::text(rng.next_u64(), cfg.assistant_len);
                history.push(("assistant", reply));
            }
            history.push(("user", harness::text(rng.next_u64(), cfg.user_len)));
            let messages: Vec<(&str, &str)> =
                history.iter().map(|(r, c)| (*r, c.as_str())).collect();
            let stream = cfg.body.streaming.for_member(turn);
            turns.push(Request {
                api: Api::Chat,
                body: chat_body(&messages, &cfg.body, stream),
                stream,
                family: Some(session),
                member: turn,
                prompt_len: history.iter().map(|(_, c)| c.len()).sum(),
            });
        }
        sessions.push(turns);
    }
    match cfg.order {
        ChatOrder::TurnMajor => (0..cfg.turns)
            .flat_map(|t| sessions.iter().map(move |s| s[t].clone()))
            .collect(),
        ChatOrder::Interleaved => {
            let mut next = vec![0usize; sessions.len()];
            let mut open: Vec<usize> = (0..sessions.len()).filter(|_| cfg.turns > 0).collect();
            let mut out = Vec::with_capacity(sessions.len() * cfg.turns);
            while !open.is_empty() {
                let i = rng.below(open.len());
                let s = open[i];
                out.push(sessions[s][next[s]].clone());
                next[s] += 1;
                if next[s] == cfg.turns {
                    open.swap_remove(i);
                }
            }
            out
        }
    }
}

/// Many distinct prefixes reused with Zipf-distributed popularity: group
/// `k` (0-based) is drawn with probability proportional to `1 / (k+1)^s`.
/// With far more distinct prefix tokens than the pods' caches hold, the
/// popular groups stay cached and the tail keeps evicting.
#[derive(Clone, Debug, PartialEq)]
pub struct ZipfPrefix {
    pub groups: usize,
    pub requests: usize,
    pub exponent: f64,
    pub system_prompt_len: usize,
    pub question_len: usize,
    pub api: ApiMix,
    pub body: BodyOptions,
    pub seed: u64,
}

/// Builds a [`ZipfPrefix`] workload: each request draws its group, then
/// gets a fresh question after the group's system prompt. `member` counts
/// the group's requests so far.
pub fn zipf_prefix(cfg: &ZipfPrefix) -> Vec<Request> {
    let mut rng = SplitMix64::new(cfg.seed);
    let groups = cfg.groups.max(1);
    let systems: Vec<String> = (0..groups)
        .map(|_| harness::text(rng.next_u64(), cfg.system_prompt_len))
        .collect();
    let weights: Vec<f64> = (0..groups)
        .map(|k| 1.0 / ((k + 1) as f64).powf(cfg.exponent))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(groups);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cumulative.push(acc);
    }
    let mut seen = vec![0usize; groups];
    (0..cfg.requests)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let group = cumulative.partition_point(|&c| c < u).min(groups - 1);
            let member = seen[group];
            seen[group] += 1;
            let system = &systems[group];
            let question = harness::text(rng.next_u64(), cfg.question_len);
            let api = cfg.api.for_family(group);
            system_and_question(api, &cfg.body, group, member, system, &question)
        })
        .collect()
}

/// Unique prompts: the control workload.
#[derive(Clone, Debug, PartialEq)]
pub struct NoSharing {
    pub count: usize,
    pub prompt_len: usize,
    pub api: Api,
    pub body: BodyOptions,
    pub seed: u64,
}

/// Builds a [`NoSharing`] workload: every prompt differs from its first byte.
pub fn no_sharing(cfg: &NoSharing) -> Vec<Request> {
    let mut rng = SplitMix64::new(cfg.seed);
    (0..cfg.count)
        .map(|member| {
            let prompt = harness::text(rng.next_u64(), cfg.prompt_len);
            let stream = cfg.body.streaming.for_member(member);
            let body = match cfg.api {
                Api::Completions => completion_body(&prompt, &cfg.body, stream),
                Api::Chat => chat_body(&[("user", &prompt)], &cfg.body, stream),
            };
            Request {
                api: cfg.api,
                body,
                stream,
                family: None,
                member,
                prompt_len: prompt.len(),
            }
        })
        .collect()
}

fn stream_fields(body: &mut Value, stream: bool) {
    if stream {
        body["stream"] = json!(true);
        // The usage (cached tokens) comes in a last chunk only when asked for.
        body["stream_options"] = json!({ "include_usage": true });
    }
}

/// An OpenAI completions body.
pub fn completion_body(prompt: &str, o: &BodyOptions, stream: bool) -> String {
    let mut body = json!({
        "model": o.model,
        "prompt": prompt,
        "max_tokens": o.max_tokens,
        "ignore_eos": true,
    });
    stream_fields(&mut body, stream);
    body.to_string()
}

/// An OpenAI chat completions body from (role, content) messages.
pub fn chat_body(messages: &[(&str, &str)], o: &BodyOptions, stream: bool) -> String {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({ "role": role, "content": content }))
        .collect();
    let mut body = json!({
        "model": o.model,
        "messages": messages,
        "max_tokens": o.max_tokens,
        "ignore_eos": true,
    });
    stream_fields(&mut body, stream);
    body.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gsp(seed: u64, order: Order) -> SharedPrefix {
        SharedPrefix {
            groups: 4,
            prompts_per_group: 3,
            system_prompt_len: 300,
            question_len: 50,
            api: ApiMix::Alternate,
            order,
            body: BodyOptions {
                streaming: Streaming::Alternate,
                ..BodyOptions::default()
            },
            seed,
        }
    }

    fn prompt_of(r: &Request) -> String {
        let v: Value = serde_json::from_str(&r.body).unwrap();
        match r.api {
            Api::Completions => v["prompt"].as_str().unwrap().to_string(),
            Api::Chat => v["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["content"].as_str().unwrap())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn same_seed_same_requests() {
        for order in [Order::Shuffled, Order::Waves, Order::Grouped] {
            assert_eq!(shared_prefix(&gsp(9, order)), shared_prefix(&gsp(9, order)));
        }
        let chat = ChatSessions {
            sessions: 3,
            turns: 4,
            system_len: 100,
            user_len: 20,
            assistant_len: 30,
            body: BodyOptions::default(),
            order: ChatOrder::Interleaved,
            seed: 5,
        };
        assert_eq!(chat_sessions(&chat), chat_sessions(&chat));
        let ns = NoSharing {
            count: 5,
            prompt_len: 64,
            api: Api::Completions,
            body: BodyOptions::default(),
            seed: 5,
        };
        assert_eq!(no_sharing(&ns), no_sharing(&ns));
    }

    #[test]
    fn different_seeds_differ() {
        let a = shared_prefix(&gsp(1, Order::Grouped));
        let b = shared_prefix(&gsp(2, Order::Grouped));
        assert!(a.iter().zip(&b).all(|(x, y)| x.body != y.body));
    }

    #[test]
    fn groups_share_their_system_prompt_and_nothing_else() {
        let reqs = shared_prefix(&gsp(3, Order::Grouped));
        assert_eq!(reqs.len(), 12);
        let prompts: Vec<String> = reqs.iter().map(prompt_of).collect();
        for (i, a) in reqs.iter().enumerate() {
            for (j, b) in reqs.iter().enumerate().skip(i + 1) {
                let common = prompts[i]
                    .bytes()
                    .zip(prompts[j].bytes())
                    .take_while(|(x, y)| x == y)
                    .count();
                if a.family == b.family {
                    assert!(common >= 300, "same group shares the system prompt");
                } else {
                    assert!(common < 10, "different groups share ~nothing");
                }
            }
        }
    }

    #[test]
    fn orders_are_permutations_and_waves_introduce_prefixes_first() {
        let grouped = shared_prefix(&gsp(4, Order::Grouped));
        for order in [Order::Shuffled, Order::Waves] {
            let mut other = shared_prefix(&gsp(4, order));
            assert_ne!(other, grouped);
            other.sort_by_key(|r| (r.family, r.member));
            assert_eq!(other, grouped);
        }
        let waves = shared_prefix(&gsp(4, Order::Waves));
        for (i, r) in waves.iter().enumerate() {
            assert_eq!(r.member, i / 4);
        }
    }

    #[test]
    fn api_and_streaming_mix() {
        let reqs = shared_prefix(&gsp(6, Order::Grouped));
        for r in &reqs {
            let family = r.family.unwrap();
            let expected = if family % 2 == 0 {
                Api::Completions
            } else {
                Api::Chat
            };
            assert_eq!(r.api, expected);
            assert_eq!(r.stream, r.member % 2 == 1);
            let v: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(v["stream"].as_bool().unwrap_or(false), r.stream);
            if r.stream {
                assert_eq!(v["stream_options"]["include_usage"], json!(true));
            }
        }
    }

    #[test]
    fn chat_turns_extend_the_previous_turn() {
        let cfg = ChatSessions {
            sessions: 2,
            turns: 3,
            system_len: 100,
            user_len: 20,
            assistant_len: 30,
            body: BodyOptions::default(),
            order: ChatOrder::TurnMajor,
            seed: 8,
        };
        let reqs = chat_sessions(&cfg);
        assert_eq!(reqs.len(), 6);
        // Turn-major order.
        let order: Vec<(Option<usize>, usize)> =
            reqs.iter().map(|r| (r.family, r.member)).collect();
        assert_eq!(
            order,
            vec![
                (Some(0), 0),
                (Some(1), 0),
                (Some(0), 1),
                (Some(1), 1),
                (Some(0), 2),
                (Some(1), 2)
            ]
        );
        for s in 0..2 {
            let turns: Vec<&Request> = reqs.iter().filter(|r| r.family == Some(s)).collect();
            for w in turns.windows(2) {
                let (a, b) = (prompt_of(w[0]), prompt_of(w[1]));
                assert!(
                    b.starts_with(&a),
                    "turn {} extends turn {}",
                    w[1].member,
                    w[0].member
                );
                assert!(w[1].prompt_len > w[0].prompt_len);
            }
        }
    }

    #[test]
    fn interleaved_chat_keeps_each_sessions_turns_in_order_and_mixes_sessions() {
        let cfg = ChatSessions {
            sessions: 6,
            turns: 5,
            system_len: 40,
            user_len: 8,
            assistant_len: 8,
            body: BodyOptions::default(),
            order: ChatOrder::Interleaved,
            seed: 3,
        };
        let reqs = chat_sessions(&cfg);
        assert_eq!(reqs.len(), 30);
        for s in 0..6 {
            let members: Vec<usize> = reqs
                .iter()
                .filter(|r| r.family == Some(s))
                .map(|r| r.member)
                .collect();
            assert_eq!(members, (0..5).collect::<Vec<_>>(), "session {s}");
        }
        let turn_major = ChatSessions {
            order: ChatOrder::TurnMajor,
            ..cfg.clone()
        };
        let order = |rs: &[Request]| -> Vec<(Option<usize>, usize)> {
            rs.iter().map(|r| (r.family, r.member)).collect()
        };
        assert_ne!(order(&reqs), order(&chat_sessions(&turn_major)));
        // Some session's next turn comes before another's earlier turn.
        let firsts: Vec<usize> = reqs.iter().take(6).map(|r| r.member).collect();
        assert!(firsts.iter().any(|&m| m > 0), "{firsts:?}");
    }

    #[test]
    fn zipf_groups_are_skewed_deterministic_and_share_their_system_prompt() {
        let cfg = ZipfPrefix {
            groups: 64,
            requests: 2000,
            exponent: 1.0,
            system_prompt_len: 64,
            question_len: 16,
            api: ApiMix::Alternate,
            body: BodyOptions::default(),
            seed: 3,
        };
        let a = zipf_prefix(&cfg);
        assert_eq!(a, zipf_prefix(&cfg));
        let count = |g| a.iter().filter(|r| r.family == Some(g)).count();
        // 1/H(64) ~ 21 % of draws for the top group, ~1/64 of that for the last.
        assert!(count(0) > 300 && count(0) < 560, "{}", count(0));
        assert!(count(0) > 8 * count(63).max(1));
        let of_group: Vec<String> = a
            .iter()
            .filter(|r| r.family == Some(0) && r.api == Api::Completions)
            .map(prompt_of)
            .collect();
        assert!(of_group.len() > 2);
        assert!(of_group.iter().all(|p| p[..64] == of_group[0][..64]));
        assert_ne!(of_group[0], of_group[1]);
    }

    #[test]
    fn no_sharing_prompts_are_unique_and_sized() {
        let ns = NoSharing {
            count: 20,
            prompt_len: 64,
            api: Api::Chat,
            body: BodyOptions::default(),
            seed: 11,
        };
        let reqs = no_sharing(&ns);
        let prompts: std::collections::BTreeSet<String> = reqs.iter().map(prompt_of).collect();
        assert_eq!(prompts.len(), 20);
        assert!(reqs
            .iter()
            .all(|r| r.prompt_len == 64 && r.family.is_none()));
    }
}
