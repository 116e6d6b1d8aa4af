//! Request bodies and deterministic prompt text.

use serde_json::Value;

/// A completions request body for any prompt shape (string, list, token ids).
pub fn completion_body(prompt: &Value) -> String {
    serde_json::json!({ "model": "test-model", "prompt": prompt, "max_tokens": 8 }).to_string()
}

/// A chat completions request body from (role, content) turns.
pub fn chat_body(messages: &[(&str, &str)]) -> String {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({ "role": role, "content": content }))
        .collect();
    serde_json::json!({ "model": "test-model", "messages": messages, "max_tokens": 8 }).to_string()
}

/// Deterministic filler text of exactly `len` bytes; different seeds differ
/// from the first word on.
pub fn text(seed: u64, len: usize) -> String {
    const WORDS: &[&str] = &[
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra",
        "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = format!("[{seed}] ");
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
        out.push(' ');
    }
    out.truncate(len);
    out
}

/// `n` prompts sharing a 4 KiB prefix (`text(seed, 4096)`), each ending in
/// a 300-byte question of its own (`text(seed * 100 + i, 300)`).
pub fn shared_prefix_prompts(seed: u64, n: u64) -> Vec<String> {
    let prefix = text(seed, 4096);
    (0..n)
        .map(|i| format!("{prefix}{}", text(seed * 100 + i, 300)))
        .collect()
}

/// Asserts that `pods` (the pods that answered a shared prefix's requests)
/// are one pod, named at least once: the prefix stuck. `what` names the
/// setup in the failure message.
pub fn assert_one_pod(pods: &[String], what: &str) {
    assert!(
        pods.first()
            .is_some_and(|first| pods.iter().all(|p| p == first)),
        "{what}: the prefix moved: {pods:?}"
    );
}

/// Deterministic token ids.
pub fn token_ids(seed: u64, count: usize) -> Vec<u32> {
    let mut state = seed.wrapping_add(1).wrapping_mul(0x2545_F491_4F6C_DD1D);
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 50_000) as u32
        })
        .collect()
}
