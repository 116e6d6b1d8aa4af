//! OpenAI-compatible request parsing and response shapes, and SSE framing.
//!
//! Requests are read from `serde_json::Value` by hand so that every accepted
//! shape is explicit and every refusal names what was wrong. Unknown fields
//! are ignored, as vLLM does.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::tokenize::{render_chat, tokenize, ChatMessage};

/// Which inference endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/completions`
    Completion,
    /// `POST /v1/chat/completions`
    Chat,
}

/// One prompt as given by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    pub fn token_ids(&self) -> Vec<u32> {
        match self {
            Prompt::Text(text) => tokenize(text),
            Prompt::Tokens(ids) => ids.clone(),
        }
    }
}

/// Generation parameters read from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenParams {
    pub model: String,
    pub max_tokens: u64,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
}

/// A parsed inference request: the prompts (one per choice) and parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferenceRequest {
    pub kind: Kind,
    pub prompts: Vec<Vec<u32>>,
    pub params: GenParams,
}

const PROMPT_SHAPES: &str =
    "`prompt` must be a string, a list of strings, a list of token ids or a list of token-id lists";

fn token(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn token_list(items: &[Value]) -> Result<Vec<u32>, String> {
    if items.is_empty() {
        return Err("a token-id prompt must not be empty".into());
    }
    items
        .iter()
        .map(|v| {
            token(v).ok_or_else(|| {
                format!("invalid token id {v}: token ids are integers in 0..=4294967295")
            })
        })
        .collect()
}

/// The prompts of a `/v1/completions` body: a string, a list of strings, a
/// list of token ids, or a list of token-id lists. A list of strings or of
/// token-id lists is a batch: one choice per prompt.
pub fn completion_prompts(body: &Value) -> Result<Vec<Prompt>, String> {
    match body.get("prompt") {
        None | Some(Value::Null) => Err("missing field `prompt`".into()),
        Some(Value::String(s)) => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return Err("`prompt` must not be an empty list".into());
            }
            if items.iter().all(Value::is_string) {
                Ok(items
                    .iter()
                    .map(|v| Prompt::Text(v.as_str().unwrap_or_default().to_owned()))
                    .collect())
            } else if items.iter().all(Value::is_number) {
                Ok(vec![Prompt::Tokens(token_list(items)?)])
            } else if items.iter().all(Value::is_array) {
                items
                    .iter()
                    .map(|v| match v {
                        Value::Array(inner) => token_list(inner).map(Prompt::Tokens),
                        _ => Err(PROMPT_SHAPES.to_owned()),
                    })
                    .collect()
            } else {
                Err(PROMPT_SHAPES.into())
            }
        }
        Some(_) => Err(PROMPT_SHAPES.into()),
    }
}

/// Flatten a message `content`: a string, a list of parts (the `text` of each
/// `{"type":"text"}` part, joined by `\n`; other part types are skipped), or
/// null/absent (empty, e.g. an assistant message with tool calls).
fn message_content(content: Option<&Value>, index: usize) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for part in parts {
                let obj = part
                    .as_object()
                    .ok_or_else(|| format!("messages[{index}].content parts must be objects"))?;
                match obj.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = obj.get("text").and_then(Value::as_str).ok_or_else(|| {
                            format!("messages[{index}].content: a text part needs a string `text`")
                        })?;
                        texts.push(text);
                    }
                    Some(_) => {}
                    None => {
                        return Err(format!(
                            "messages[{index}].content: a part needs a string `type`"
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(format!(
            "messages[{index}].content must be a string or a list of parts"
        )),
    }
}

/// The messages of a `/v1/chat/completions` body.
pub fn chat_messages(body: &Value) -> Result<Vec<ChatMessage>, String> {
    let messages = match body.get("messages") {
        None | Some(Value::Null) => return Err("missing field `messages`".into()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err("`messages` must be a list".into()),
    };
    if messages.is_empty() {
        return Err("`messages` must not be empty".into());
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let obj = m
                .as_object()
                .ok_or_else(|| format!("messages[{i}] must be an object"))?;
            let role = obj
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("messages[{i}] needs a string `role`"))?;
            Ok(ChatMessage {
                role: role.to_owned(),
                content: message_content(obj.get("content"), i)?,
            })
        })
        .collect()
}

/// The prompt text of a chat body (messages rendered, see `tokenize`).
pub fn chat_prompt(body: &Value) -> Result<String, String> {
    let messages = chat_messages(body)?;
    let add_generation_prompt = opt_bool(body, "add_generation_prompt")?.unwrap_or(true);
    Ok(render_chat(&messages, add_generation_prompt))
}

fn opt_bool(obj: &Value, field: &str) -> Result<Option<bool>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("`{field}` must be a boolean")),
    }
}

fn opt_count(obj: &Value, field: &str) -> Result<Option<u64>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`{field}` must be a non-negative integer")),
    }
}

/// Generation parameters. `model` defaults to `default_model` (any name is
/// accepted); `max_tokens` (or, for chat, `max_completion_tokens`) to
/// `default_max_tokens`.
pub fn gen_params(
    body: &Value,
    kind: Kind,
    default_model: &str,
    default_max_tokens: u64,
) -> Result<GenParams, String> {
    let model = match body.get("model") {
        None | Some(Value::Null) => default_model.to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("`model` must be a string".into()),
    };
    let mut max_tokens = opt_count(body, "max_tokens")?;
    if kind == Kind::Chat && max_tokens.is_none() {
        max_tokens = opt_count(body, "max_completion_tokens")?;
    }
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(opts @ Value::Object(_)) => opt_bool(opts, "include_usage")?.unwrap_or(false),
        Some(_) => return Err("`stream_options` must be an object".into()),
    };
    Ok(GenParams {
        model,
        max_tokens: max_tokens.unwrap_or(default_max_tokens),
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
    })
}

/// Parse a whole inference request body.
pub fn parse_request(
    body: &Value,
    kind: Kind,
    default_model: &str,
    default_max_tokens: u64,
) -> Result<InferenceRequest, String> {
    if !body.is_object() {
        return Err("the request body must be a JSON object".into());
    }
    let prompts = match kind {
        Kind::Completion => completion_prompts(body)?
            .iter()
            .map(Prompt::token_ids)
            .collect(),
        Kind::Chat => vec![tokenize(&chat_prompt(body)?)],
    };
    let params = gen_params(body, kind, default_model, default_max_tokens)?;
    Ok(InferenceRequest {
        kind,
        prompts,
        params,
    })
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

impl Usage {
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

/// Fields shared by every reply object of one request.
#[derive(Debug, Clone)]
pub struct ReplyMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub served_by: String,
}

impl ReplyMeta {
    fn object(&self, object: &str, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), choices);
        m
    }

    fn finish(&self, mut m: Map<String, Value>, usage: Option<Usage>) -> Value {
        if let Some(u) = usage {
            m.insert("usage".into(), u.to_json());
        }
        m.insert("served_by".into(), json!(self.served_by));
        Value::Object(m)
    }
}

/// Finish reason of every choice: podsim always generates `max_tokens` tokens.
pub const FINISH_REASON: &str = "length";

/// Non-streaming `/v1/completions` reply: one choice per prompt, each `text`.
pub fn completion_response(meta: &ReplyMeta, prompts: usize, text: &str, usage: Usage) -> Value {
    let choices: Vec<Value> = (0..prompts)
        .map(|i| json!({"index": i, "text": text, "logprobs": null, "finish_reason": FINISH_REASON, "stop_reason": null}))
        .collect();
    meta.finish(
        meta.object("text_completion", Value::Array(choices)),
        Some(usage),
    )
}

/// Non-streaming `/v1/chat/completions` reply.
pub fn chat_response(meta: &ReplyMeta, text: &str, usage: Usage) -> Value {
    let choices = json!([{
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": null,
        "finish_reason": FINISH_REASON,
        "stop_reason": null,
    }]);
    meta.finish(meta.object("chat.completion", choices), Some(usage))
}

/// Streaming `/v1/completions` chunk for choice `index`.
pub fn completion_chunk(meta: &ReplyMeta, index: usize, text: &str, finish: Option<&str>) -> Value {
    let choices =
        json!([{"index": index, "text": text, "logprobs": null, "finish_reason": finish}]);
    meta.finish(meta.object("text_completion", choices), None)
}

/// Streaming `/v1/chat/completions` chunk: `role` is set on the first one only.
pub fn chat_chunk(meta: &ReplyMeta, role: Option<&str>, text: &str, finish: Option<&str>) -> Value {
    let delta = match role {
        Some(r) => json!({"role": r, "content": text}),
        None => json!({"content": text}),
    };
    let choices = json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
    meta.finish(meta.object("chat.completion.chunk", choices), None)
}

/// The last streamed chunk when `stream_options.include_usage` is true: no choices, the usage.
pub fn usage_chunk(meta: &ReplyMeta, kind: Kind, usage: Usage) -> Value {
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    meta.finish(meta.object(object, json!([])), Some(usage))
}

/// OpenAI-style error body (plus `served_by`).
pub fn error_body(status: u16, message: &str, served_by: &str) -> Value {
    let kind = match status {
        400 | 413 | 422 => "invalid_request_error",
        404 => "not_found_error",
        405 => "method_not_allowed",
        _ => "internal_server_error",
    };
    json!({
        "error": {"message": message, "type": kind, "param": null, "code": status},
        "served_by": served_by,
    })
}

/// One server-sent event carrying `value`: `data: <json>\n\n`.
pub fn sse_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The event that ends every stream.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn prompts(body: Value) -> Result<Vec<Prompt>, String> {
        completion_prompts(&body)
    }

    #[test]
    fn prompt_string() {
        assert_eq!(
            prompts(json!({"prompt": "hello"})).unwrap(),
            vec![Prompt::Text("hello".into())]
        );
        assert_eq!(
            prompts(json!({"prompt": ""})).unwrap(),
            vec![Prompt::Text(String::new())]
        );
    }

    #[test]
    fn prompt_list_of_strings_is_a_batch() {
        assert_eq!(
            prompts(json!({"prompt": ["a", "b"]})).unwrap(),
            vec![Prompt::Text("a".into()), Prompt::Text("b".into())]
        );
    }

    #[test]
    fn prompt_token_ids() {
        assert_eq!(
            prompts(json!({"prompt": [1, 2, 3]})).unwrap(),
            vec![Prompt::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(
            prompts(json!({"prompt": [[1, 2], [3]]})).unwrap(),
            vec![Prompt::Tokens(vec![1, 2]), Prompt::Tokens(vec![3])]
        );
        assert_eq!(Prompt::Tokens(vec![7, 8]).token_ids(), vec![7, 8]);
    }

    #[test]
    fn prompt_refusals() {
        for bad in [
            json!({}),
            json!({"prompt": null}),
            json!({"prompt": 5}),
            json!({"prompt": []}),
            json!({"prompt": [[]]}),
            json!({"prompt": ["a", 1]}),
            json!({"prompt": [1, -2]}),
            json!({"prompt": [1.5]}),
            json!({"prompt": [4294967296u64]}),
            json!({"prompt": [[1], "a"]}),
            json!({"prompt": {"text": "a"}}),
        ] {
            assert!(prompts(bad.clone()).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn chat_content_string_and_parts() {
        let body = json!({"messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": []},
        ]});
        let msgs = chat_messages(&body).unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[0].content, "S");
        assert_eq!(msgs[1].content, "a\nb");
        assert_eq!(msgs[2].content, "");
        assert_eq!(
            chat_prompt(&body).unwrap(),
            "<|system|>\nS\n<|user|>\na\nb\n<|assistant|>\n\n<|assistant|>\n"
        );
        let no_gen =
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false});
        assert_eq!(chat_prompt(&no_gen).unwrap(), "<|user|>\nx\n");
    }

    #[test]
    fn chat_refusals() {
        for bad in [
            json!({}),
            json!({"messages": []}),
            json!({"messages": "hi"}),
            json!({"messages": [{"content": "no role"}]}),
            json!({"messages": [{"role": "user", "content": 3}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            json!({"messages": [{"role": "user", "content": ["plain"]}]}),
        ] {
            assert!(chat_messages(&bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn params_defaults_and_values() {
        let p = gen_params(&json!({}), Kind::Completion, "sim-model", 16).unwrap();
        assert_eq!(
            p,
            GenParams {
                model: "sim-model".into(),
                max_tokens: 16,
                stream: false,
                include_usage: false,
                ignore_eos: false
            }
        );
        let p = gen_params(
            &json!({"model": "m", "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true}),
            Kind::Completion,
            "sim-model",
            16,
        )
        .unwrap();
        assert_eq!(
            p,
            GenParams {
                model: "m".into(),
                max_tokens: 3,
                stream: true,
                include_usage: true,
                ignore_eos: true
            }
        );
        let p = gen_params(&json!({"max_completion_tokens": 5}), Kind::Chat, "d", 16).unwrap();
        assert_eq!(p.max_tokens, 5);
        let p = gen_params(
            &json!({"max_completion_tokens": 5}),
            Kind::Completion,
            "d",
            16,
        )
        .unwrap();
        assert_eq!(p.max_tokens, 16);
        assert!(gen_params(&json!({"max_tokens": -1}), Kind::Completion, "d", 16).is_err());
        assert!(gen_params(&json!({"stream": "yes"}), Kind::Completion, "d", 16).is_err());
        assert!(gen_params(&json!({"model": 1}), Kind::Completion, "d", 16).is_err());
    }

    #[test]
    fn parse_whole_requests() {
        let r = parse_request(
            &json!({"prompt": ["abcdefgh", "abcd"]}),
            Kind::Completion,
            "d",
            16,
        )
        .unwrap();
        assert_eq!(r.prompts.len(), 2);
        assert_eq!(r.prompts[0].len(), 2);
        assert_eq!(r.prompts[1].len(), 1);
        let r = parse_request(
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
            Kind::Chat,
            "d",
            16,
        )
        .unwrap();
        // "<|user|>\nhi\n<|assistant|>\n" is 26 bytes -> 7 tokens.
        assert_eq!(r.prompts, vec![tokenize("<|user|>\nhi\n<|assistant|>\n")]);
        assert_eq!(r.prompts[0].len(), 7);
        assert!(parse_request(&json!([1, 2]), Kind::Completion, "d", 16).is_err());
    }

    #[test]
    fn usage_shape() {
        let u = Usage {
            prompt_tokens: 10,
            completion_tokens: 4,
            cached_tokens: 8,
        }
        .to_json();
        assert_eq!(
            u,
            json!({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 8}})
        );
    }

    fn meta() -> ReplyMeta {
        ReplyMeta {
            id: "cmpl-1".into(),
            created: 5,
            model: "m".into(),
            served_by: "pod-a".into(),
        }
    }

    #[test]
    fn reply_shapes_name_the_pod() {
        let usage = Usage {
            prompt_tokens: 1,
            completion_tokens: 2,
            cached_tokens: 0,
        };
        let c = completion_response(&meta(), 2, " x y", usage);
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"].as_array().unwrap().len(), 2);
        assert_eq!(c["choices"][1]["index"], 1);
        assert_eq!(c["choices"][0]["text"], " x y");
        assert_eq!(c["served_by"], "pod-a");
        assert_eq!(c["usage"]["total_tokens"], 3);
        let c = chat_response(&meta(), "hi", usage);
        assert_eq!(c["choices"][0]["message"]["content"], "hi");
        assert_eq!(c["served_by"], "pod-a");
        let ch = chat_chunk(&meta(), Some("assistant"), "", None);
        assert_eq!(
            ch["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert!(ch["choices"][0]["finish_reason"].is_null());
        assert!(ch.get("usage").is_none());
        assert_eq!(ch["served_by"], "pod-a");
        let ch = completion_chunk(&meta(), 0, " the", Some("length"));
        assert_eq!(ch["choices"][0]["finish_reason"], "length");
        assert_eq!(ch["served_by"], "pod-a");
        let u = usage_chunk(&meta(), Kind::Chat, usage);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["completion_tokens"], 2);
        assert_eq!(u["served_by"], "pod-a");
        let e = error_body(400, "bad", "pod-a");
        assert_eq!(e["error"]["message"], "bad");
        assert_eq!(e["error"]["code"], 400);
        assert_eq!(e["served_by"], "pod-a");
    }

    #[test]
    fn sse_framing() {
        let ev = sse_event(&json!({"a": 1}));
        assert_eq!(&ev[..], b"data: {\"a\":1}\n\n");
        assert_eq!(SSE_DONE, b"data: [DONE]\n\n");
        // A JSON value never contains a raw newline, so one event is one line.
        let ev = sse_event(&json!({"t": "line1\nline2"}));
        let s = std::str::from_utf8(&ev).unwrap();
        assert_eq!(s.matches('\n').count(), 2);
        assert!(s.ends_with("\n\n"));
    }
}
