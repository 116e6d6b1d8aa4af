//! Request parsing: which OpenAI-compatible call this is, which model it asks
//! for, and the prompt as the bytes that get block-hashed.
//!
//! Every chat turn and its role shape the bytes (routing on the first message
//! alone sends different conversations with one system prompt to one pod and
//! ignores the turns that actually fill the KV cache). Anything we cannot read
//! is a [`PassReason`]: the request goes on untouched and a stat counts why.

use serde::Deserialize;
use serde_json::Value;

/// The two OpenAI-compatible calls that carry a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    Completions,
    ChatCompletions,
}

/// Why a request is passed through without routing. `as_str` names the stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    Method,
    Path,
    NotJson,
    NoPrompt,
    BodyTooLarge,
    NoEndpoints,
    InternalError,
}

impl PassReason {
    pub const ALL: [PassReason; 7] = [
        PassReason::Method,
        PassReason::Path,
        PassReason::NotJson,
        PassReason::NoPrompt,
        PassReason::BodyTooLarge,
        PassReason::NoEndpoints,
        PassReason::InternalError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PassReason::Method => "method",
            PassReason::Path => "path",
            PassReason::NotJson => "not_json",
            PassReason::NoPrompt => "no_prompt",
            PassReason::BodyTooLarge => "body_too_large",
            PassReason::NoEndpoints => "no_endpoints",
            PassReason::InternalError => "internal_error",
        }
    }
}

/// What routing needs from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptRequest {
    /// `model` from the body; empty when absent (served by the default pool).
    pub model: String,
    /// The prompt as bytes to hash, see [`prompt_bytes`] for the layout.
    pub prompt: Vec<u8>,
}

/// Decides from method and path whether a request is one we route.
/// The query string is ignored.
pub fn classify(method: &str, path: &str) -> Result<ApiKind, PassReason> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let kind = match path.trim_end_matches('/') {
        "/v1/completions" => ApiKind::Completions,
        "/v1/chat/completions" => ApiKind::ChatCompletions,
        _ => return Err(PassReason::Path),
    };
    if !method.eq_ignore_ascii_case("POST") {
        return Err(PassReason::Method);
    }
    Ok(kind)
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    prompt: Option<Value>,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
}

/// Parses a complete request body of the given kind.
pub fn parse_body(kind: ApiKind, body: &[u8]) -> Result<PromptRequest, PassReason> {
    // serde would also read a struct from a JSON array, positionally.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(PassReason::NotJson);
    }
    match kind {
        ApiKind::Completions => {
            let b: CompletionBody =
                serde_json::from_slice(body).map_err(|_| PassReason::NotJson)?;
            let mut prompt = Vec::new();
            completion_prompt_bytes(b.prompt.as_ref().ok_or(PassReason::NoPrompt)?, &mut prompt)?;
            Ok(PromptRequest {
                model: model_name(b.model),
                prompt,
            })
        }
        ApiKind::ChatCompletions => {
            let b: ChatBody = serde_json::from_slice(body).map_err(|_| PassReason::NotJson)?;
            let messages = b.messages.ok_or(PassReason::NoPrompt)?;
            if messages.is_empty() {
                return Err(PassReason::NoPrompt);
            }
            let mut prompt = Vec::new();
            for m in &messages {
                chat_message_bytes(m, &mut prompt)?;
            }
            Ok(PromptRequest {
                model: model_name(b.model),
                prompt,
            })
        }
    }
}

fn model_name(v: Option<Value>) -> String {
    match v {
        Some(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// Completions prompt layout:
/// - string: its UTF-8 bytes (AIBrix's "character" tokenizer);
/// - list of strings: each string followed by `\n`;
/// - token ids: each id as 4 little-endian bytes (so 128-byte blocks = 32 tokens);
/// - list of token lists: each list's ids, then the separator `ff ff ff ff`.
///
/// A batch (list) is routed as one prompt: the pod that holds the first
/// prompt's prefix is the best single destination for the whole batch.
fn completion_prompt_bytes(v: &Value, out: &mut Vec<u8>) -> Result<(), PassReason> {
    match v {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(items) if items.is_empty() => return Err(PassReason::NoPrompt),
        Value::Array(items) => match &items[0] {
            Value::String(_) => {
                for item in items {
                    let s = item.as_str().ok_or(PassReason::NoPrompt)?;
                    out.extend_from_slice(s.as_bytes());
                    out.push(b'\n');
                }
            }
            Value::Number(_) => token_bytes(items, out)?,
            Value::Array(_) => {
                for item in items {
                    token_bytes(item.as_array().ok_or(PassReason::NoPrompt)?, out)?;
                    out.extend_from_slice(&[0xff; 4]);
                }
            }
            _ => return Err(PassReason::NoPrompt),
        },
        _ => return Err(PassReason::NoPrompt),
    }
    Ok(())
}

fn token_bytes(ids: &[Value], out: &mut Vec<u8>) -> Result<(), PassReason> {
    out.reserve(ids.len() * 4);
    for id in ids {
        let id = id
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or(PassReason::NoPrompt)?;
        out.extend_from_slice(&id.to_le_bytes());
    }
    Ok(())
}

/// Chat layout, per message in order: `<|role|>` then each text part, then
/// `\n`. The role is part of the key: the same text as `system` and as `user`
/// fills a different KV cache. Non-text parts (images, audio) add nothing.
fn chat_message_bytes(m: &Value, out: &mut Vec<u8>) -> Result<(), PassReason> {
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or(PassReason::NoPrompt)?;
    out.extend_from_slice(b"<|");
    out.extend_from_slice(role.as_bytes());
    out.extend_from_slice(b"|>");
    match m.get("content") {
        Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
        Some(Value::Array(parts)) => {
            for part in parts {
                if part.get("type").and_then(Value::as_str) == Some("text") {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        out.extend_from_slice(text.as_bytes());
                    }
                }
            }
        }
        // Assistant turns that only carry tool calls have null content.
        Some(Value::Null) | None => {}
        Some(_) => return Err(PassReason::NoPrompt),
    }
    out.push(b'\n');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn completions(body: &str) -> Result<PromptRequest, PassReason> {
        parse_body(ApiKind::Completions, body.as_bytes())
    }
    fn chat(body: &str) -> Result<PromptRequest, PassReason> {
        parse_body(ApiKind::ChatCompletions, body.as_bytes())
    }

    #[test]
    fn classify_paths_and_methods() {
        assert_eq!(
            classify("POST", "/v1/completions"),
            Ok(ApiKind::Completions)
        );
        assert_eq!(
            classify("post", "/v1/chat/completions?x=1"),
            Ok(ApiKind::ChatCompletions)
        );
        assert_eq!(
            classify("POST", "/v1/chat/completions/"),
            Ok(ApiKind::ChatCompletions)
        );
        assert_eq!(classify("GET", "/v1/completions"), Err(PassReason::Method));
        assert_eq!(classify("POST", "/v1/embeddings"), Err(PassReason::Path));
        assert_eq!(classify("GET", "/health"), Err(PassReason::Path));
    }

    #[test]
    fn completion_string_prompt_is_its_bytes() {
        let r = completions(r#"{"model":"m","prompt":"héllo"}"#).unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(r.prompt, "héllo".as_bytes());
    }

    #[test]
    fn completion_string_list_joins_with_newline() {
        let r = completions(r#"{"prompt":["a","b"]}"#).unwrap();
        assert_eq!(r.prompt, b"a\nb\n");
        assert_eq!(r.model, "");
    }

    #[test]
    fn completion_token_ids_are_le_u32() {
        let r = completions(r#"{"model":"m","prompt":[1,258]}"#).unwrap();
        assert_eq!(r.prompt, vec![1, 0, 0, 0, 2, 1, 0, 0]);
    }

    #[test]
    fn completion_token_id_lists_are_separated() {
        let r = completions(r#"{"prompt":[[1],[2]]}"#).unwrap();
        assert_eq!(
            r.prompt,
            vec![1, 0, 0, 0, 255, 255, 255, 255, 2, 0, 0, 0, 255, 255, 255, 255]
        );
    }

    #[test]
    fn completion_bad_prompts_pass_through() {
        assert_eq!(completions(r#"{"model":"m"}"#), Err(PassReason::NoPrompt));
        assert_eq!(completions(r#"{"prompt":[]}"#), Err(PassReason::NoPrompt));
        assert_eq!(completions(r#"{"prompt":5}"#), Err(PassReason::NoPrompt));
        assert_eq!(completions(r#"{"prompt":[-1]}"#), Err(PassReason::NoPrompt));
        assert_eq!(
            completions(r#"{"prompt":[1,"a"]}"#),
            Err(PassReason::NoPrompt)
        );
        assert_eq!(
            completions(r#"{"prompt":[{"a":1}]}"#),
            Err(PassReason::NoPrompt)
        );
        assert_eq!(
            completions(r#"{"prompt":[5000000000]}"#),
            Err(PassReason::NoPrompt)
        );
    }

    #[test]
    fn malformed_truncated_and_empty_bodies_are_not_json() {
        for body in [
            "",
            "not json",
            r#"{"prompt":"abc"#,
            r#"["prompt"]"#,
            "\u{0}\u{1}",
            "{\"prompt\":\"\\ud800\"}",
        ] {
            assert_eq!(completions(body), Err(PassReason::NotJson), "{body:?}");
        }
        assert_eq!(
            chat(r#"{"messages":[{"role":"user","content":"x"}"#),
            Err(PassReason::NotJson)
        );
    }

    #[test]
    fn chat_every_turn_and_role_shape_the_bytes() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"},{"role":"assistant","content":null},{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"B"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            b"<|system|>S\n<|user|>U\n<|assistant|>\n<|user|>AB\n"
        );
        let as_user = chat(r#"{"messages":[{"role":"user","content":"S"}]}"#).unwrap();
        let as_system = chat(r#"{"messages":[{"role":"system","content":"S"}]}"#).unwrap();
        assert_ne!(as_user.prompt, as_system.prompt);
    }

    #[test]
    fn chat_later_turns_extend_earlier_prefix() {
        let one = chat(
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"}]}"#,
        )
        .unwrap();
        let two = chat(
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]}"#,
        )
        .unwrap();
        assert!(two.prompt.starts_with(&one.prompt));
    }

    #[test]
    fn chat_bad_shapes_pass_through() {
        assert_eq!(chat(r#"{"model":"m"}"#), Err(PassReason::NoPrompt));
        assert_eq!(chat(r#"{"messages":[]}"#), Err(PassReason::NoPrompt));
        assert_eq!(
            chat(r#"{"messages":[{"content":"x"}]}"#),
            Err(PassReason::NoPrompt)
        );
        assert_eq!(
            chat(r#"{"messages":[{"role":"user","content":5}]}"#),
            Err(PassReason::NoPrompt)
        );
        assert_eq!(chat(r#"{"messages":"hi"}"#), Err(PassReason::NotJson));
    }

    #[test]
    fn non_string_model_is_ignored() {
        assert_eq!(
            completions(r#"{"model":7,"prompt":"x"}"#).unwrap().model,
            ""
        );
    }

    #[test]
    fn huge_prompt_parses() {
        let big = "x".repeat(400 * 1024);
        let body = format!(r#"{{"model":"m","prompt":"{big}"}}"#);
        assert_eq!(completions(&body).unwrap().prompt.len(), 400 * 1024);
    }

    #[test]
    fn deeply_nested_json_is_refused_not_overflowed() {
        let body = format!(
            r#"{{"prompt":{}1{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(completions(&body).is_err());
    }
}
