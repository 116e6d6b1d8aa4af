//! Request parsing: which OpenAI-compatible call this is, which model it asks
//! for, and the prompt as the bytes that get block-hashed.
//!
//! Every chat turn and its role shape the bytes (routing on the first message
//! alone sends different conversations with one system prompt to one pod and
//! ignores the turns that actually fill the KV cache). Anything we cannot read
//! is a [`PassReason`]: the request goes on untouched and a stat counts why.

mod aibrix;
mod scan;

use serde::Deserialize;
use serde_json::Value;

/// How a prompt becomes the bytes that are hashed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Render {
    /// This filter's layout: roles and turns shape the bytes
    /// ([`chat_message_bytes`], [`completion_prompt_bytes`]).
    #[default]
    Native,
    /// AIBrix's: chat message contents joined by one space, no roles, tools
    /// first; a completions prompt only as a string (see the `aibrix` module).
    Aibrix,
}

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
    pub(crate) const ALL: [PassReason; 7] = [
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
    /// The prompt as bytes to hash: the layout of [`completion_prompt_bytes`]
    /// or [`chat_message_bytes`] (native), or AIBrix's text (`aibrix`).
    pub prompt: Vec<u8>,
    /// `"stream": true`: the answer is streamed, so its first chunk comes
    /// when the prefill is done (what `hold` waits for).
    pub(crate) stream: bool,
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
    #[serde(default)]
    stream: Option<Value>,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    stream: Option<Value>,
}

#[cfg(any(test, feature = "testkit"))]
/// Parses a complete request body of the given kind, native layout.
pub fn parse_body(kind: ApiKind, body: &[u8]) -> Result<PromptRequest, PassReason> {
    parse_body_as(kind, body, Render::Native)
}

/// The fast path (see the `scan` module): the common shapes in one pass,
/// or None to let the `Value` path decide.
fn fast_native(kind: ApiKind, body: &[u8]) -> Option<PromptRequest> {
    scan::scan_native(kind, body)
}

/// Parses a complete request body of the given kind, rendered as `render`.
pub(crate) fn parse_body_as(
    kind: ApiKind,
    body: &[u8],
    render: Render,
) -> Result<PromptRequest, PassReason> {
    // serde would also read a struct from a JSON array, positionally.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(PassReason::NotJson);
    }
    if render == Render::Aibrix {
        return aibrix::parse_aibrix(kind, body);
    }
    if let Some(req) = fast_native(kind, body) {
        return Ok(req);
    }
    parse_native_value(kind, body)
}

/// The native layout through a `Value` tree: every shape, and the verdict
/// on everything the fast path leaves.
fn parse_native_value(kind: ApiKind, body: &[u8]) -> Result<PromptRequest, PassReason> {
    match kind {
        ApiKind::Completions => {
            let b: CompletionBody =
                serde_json::from_slice(body).map_err(|_| PassReason::NotJson)?;
            let mut prompt = Vec::new();
            completion_prompt_bytes(b.prompt.as_ref().ok_or(PassReason::NoPrompt)?, &mut prompt)?;
            Ok(PromptRequest {
                model: model_name(b.model),
                prompt,
                stream: is_true(b.stream.as_ref()),
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
                stream: is_true(b.stream.as_ref()),
            })
        }
    }
}

/// Whether a member is the JSON `true`.
pub(super) fn is_true(v: Option<&Value>) -> bool {
    matches!(v, Some(Value::Bool(true)))
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
mod tests;
