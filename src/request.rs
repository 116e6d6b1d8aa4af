//! Request parsing: which OpenAI-compatible call this is, which model it asks
//! for, and the prompt as the bytes that get block-hashed.
//!
//! Every chat turn and its role shape the bytes (routing on the first message
//! alone sends different conversations with one system prompt to one pod and
//! ignores the turns that actually fill the KV cache). Anything we cannot read
//! is a [`PassReason`]: the request goes on untouched and a stat counts why.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// How a prompt becomes the bytes that are hashed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Render {
    /// This filter's layout: roles and turns shape the bytes
    /// ([`chat_message_bytes`], [`completion_prompt_bytes`]).
    #[default]
    Native,
    /// AIBrix's: chat message contents joined by one space, no roles, tools
    /// first; a completions prompt only as a string ([`aibrix_chat_text`]).
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

/// Parses a complete request body of the given kind, native layout.
pub fn parse_body(kind: ApiKind, body: &[u8]) -> Result<PromptRequest, PassReason> {
    parse_body_as(kind, body, Render::Native)
}

// The fast path: the shapes nearly every request has (a string prompt;
// messages with a string role and string or null content), read from
// borrowed slices of the body instead of a `Value` tree. Anything else, or
// anything it cannot read, goes to the `Value` path, which decides. A test
// holds the two equal on every input it tries, but one: an unknown field of
// a message nested past 128 levels, which the `Value` tree refuses and the
// fast path skips (as both skip unknown top-level fields at any depth).

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

#[derive(Deserialize)]
struct FastCompletion<'a> {
    #[serde(default)]
    model: Option<Value>,
    #[serde(borrow)]
    prompt: Text<'a>,
}

#[derive(Deserialize)]
struct FastChat<'a> {
    #[serde(default)]
    model: Option<Value>,
    /// Raw, to see each is an object (serde reads a struct from an array too).
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct FastMessage<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(default, borrow)]
    content: Option<Text<'a>>,
}

/// The native layout of the common shapes, in one pass over the body, or
/// None to let the `Value` path decide.
fn fast_native(kind: ApiKind, body: &[u8]) -> Option<PromptRequest> {
    match kind {
        ApiKind::Completions => {
            let b: FastCompletion = serde_json::from_slice(body).ok()?;
            Some(PromptRequest {
                model: model_name(b.model),
                prompt: b.prompt.0.as_bytes().to_vec(),
            })
        }
        ApiKind::ChatCompletions => {
            let b: FastChat = serde_json::from_slice(body).ok()?;
            if b.messages.is_empty() {
                return None;
            }
            let mut prompt = Vec::with_capacity(body.len());
            for raw in &b.messages {
                if !raw.get().starts_with('{') {
                    return None;
                }
                let m: FastMessage = serde_json::from_str(raw.get()).ok()?;
                prompt.extend_from_slice(b"<|");
                prompt.extend_from_slice(m.role.0.as_bytes());
                prompt.extend_from_slice(b"|>");
                if let Some(c) = &m.content {
                    prompt.extend_from_slice(c.0.as_bytes());
                }
                prompt.push(b'\n');
            }
            Some(PromptRequest {
                model: model_name(b.model),
                prompt,
            })
        }
    }
}

/// Parses a complete request body of the given kind, rendered as `render`.
pub fn parse_body_as(
    kind: ApiKind,
    body: &[u8],
    render: Render,
) -> Result<PromptRequest, PassReason> {
    // serde would also read a struct from a JSON array, positionally.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(PassReason::NotJson);
    }
    if render == Render::Aibrix {
        return parse_aibrix(kind, body);
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

#[derive(Deserialize)]
struct AibrixCompletion<'a> {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default, borrow)]
    prompt: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct AibrixChat<'a> {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default, borrow)]
    messages: Option<Vec<AibrixMessage<'a>>>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct AibrixMessage<'a> {
    #[serde(default, borrow)]
    content: Content<'a>,
}

/// A message's `content` as raw JSON; a JSON `null` is kept as the text
/// `null` (Go's `json.RawMessage` receives it), an absent one is empty.
#[derive(Default)]
struct Content<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|r| Content(Some(r)))
    }
}

fn parse_aibrix(kind: ApiKind, body: &[u8]) -> Result<PromptRequest, PassReason> {
    match kind {
        ApiKind::Completions => {
            let b: AibrixCompletion =
                serde_json::from_slice(body).map_err(|_| PassReason::NotJson)?;
            // AIBrix refuses any prompt but a string (400): pass it on.
            let prompt: String = b
                .prompt
                .and_then(|p| serde_json::from_str(p.get()).ok())
                .ok_or(PassReason::NoPrompt)?;
            Ok(PromptRequest {
                model: model_name(b.model),
                prompt: prompt.into_bytes(),
            })
        }
        ApiKind::ChatCompletions => {
            let b: AibrixChat = serde_json::from_slice(body).map_err(|_| PassReason::NotJson)?;
            let messages = b.messages.ok_or(PassReason::NoPrompt)?;
            if messages.is_empty() {
                return Err(PassReason::NoPrompt);
            }
            let mut prompt = Vec::new();
            aibrix_chat_text(&messages, b.tools, &mut prompt);
            Ok(PromptRequest {
                model: model_name(b.model),
                prompt,
            })
        }
    }
}

/// AIBrix's prefix-match text of a chat request (`pkg/plugins/gateway`:
/// `parseChatMessages`, `prefixMatchText`): when `tools` is a non-empty
/// array, its canonical JSON (keys sorted, compact, numbers as written, no
/// HTML escaping) and one space come first; then every message's content,
/// joined by one space: a string unquoted, anything else as its raw JSON
/// text from the body.
fn aibrix_chat_text(messages: &[AibrixMessage], tools: Option<&RawValue>, out: &mut Vec<u8>) {
    if let Some(tools) = tools.map(|t| t.get().trim()) {
        if tools.starts_with('[') {
            let start = out.len();
            match canonical_json(tools, out) {
                Some(()) if out.len() - start > 2 => out.push(b' '),
                // `[]` contributes nothing.
                Some(()) => out.truncate(start),
                None => {
                    out.truncate(start);
                    out.extend_from_slice(tools.as_bytes());
                    out.push(b' ');
                }
            }
        }
    }
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        let Some(raw) = m.content.0 else { continue };
        let raw = raw.get();
        if raw.starts_with('"') {
            if let Ok(s) = serde_json::from_str::<String>(raw) {
                out.extend_from_slice(s.as_bytes());
                continue;
            }
        }
        out.extend_from_slice(raw.as_bytes());
    }
}

/// Re-encodes valid JSON text deterministically as AIBrix does for tools:
/// object keys sorted (byte order; the last of a repeated key wins),
/// compact, numbers as written, strings escaped as Go's encoder without HTML
/// escaping. None if the text is not JSON.
fn canonical_json(text: &str, out: &mut Vec<u8>) -> Option<()> {
    let v: &RawValue = serde_json::from_str(text).ok()?;
    canonical_value(v.get(), out, 0)
}

fn canonical_value(text: &str, out: &mut Vec<u8>, depth: usize) -> Option<()> {
    // serde_json already refuses nesting beyond 128 levels.
    if depth > 128 {
        return None;
    }
    match text.as_bytes().first()? {
        b'{' => {
            let map: Vec<(String, &RawValue)> = serde_json::from_str::<ObjectEntries>(text).ok()?.0;
            let mut sorted: Vec<(String, &RawValue)> = Vec::with_capacity(map.len());
            for (k, v) in map {
                match sorted.iter_mut().find(|(sk, _)| *sk == k) {
                    Some(slot) => slot.1 = v,
                    None => sorted.push((k, v)),
                }
            }
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in sorted.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                go_string(k, out);
                out.push(b':');
                canonical_value(v.get(), out, depth + 1)?;
            }
            out.push(b'}');
        }
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_value(v.get(), out, depth + 1)?;
            }
            out.push(b']');
        }
        b'"' => go_string(&serde_json::from_str::<String>(text).ok()?, out),
        // Numbers keep their spelling; true, false, null as they are.
        _ => out.extend_from_slice(text.trim().as_bytes()),
    }
    Some(())
}

/// An object's entries in order, raw values borrowed.
struct ObjectEntries<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for ObjectEntries<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = ObjectEntries<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'a RawValue>()? {
                    out.push(entry);
                }
                Ok(ObjectEntries(out))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A JSON string as Go's `encoding/json` writes it with HTML escaping off:
/// `"` and `\` escaped, `\n` `\r` `\t` short, other control characters and
/// U+2028/U+2029 as `\u00XX`/`\u2028`.
fn go_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
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

    fn aibrix(kind: ApiKind, body: &str) -> Result<String, PassReason> {
        parse_body_as(kind, body.as_bytes(), Render::Aibrix)
            .map(|r| String::from_utf8(r.prompt).unwrap())
    }

    #[test]
    fn aibrix_chat_joins_contents_with_one_space_and_no_roles() {
        let body = r#"{"model":"m","messages":[
            {"role":"system","content":"You are \"kind\"."},
            {"role":"user","content":[ {"type":"text", "text":"hi"} ]},
            {"role":"assistant","content":null},
            {"role":"tool"},
            {"role":"user","content":"bye"}]}"#;
        assert_eq!(
            aibrix(ApiKind::ChatCompletions, body).unwrap(),
            // Array content is its raw JSON text as sent, null is `null`,
            // an absent content is empty but keeps its separator.
            r#"You are "kind". [ {"type":"text", "text":"hi"} ] null  bye"#
        );
    }

    #[test]
    fn aibrix_chat_puts_canonical_tools_first() {
        let body = r#"{"messages":[{"role":"user","content":"q"}],
            "tools":[{"type":"function","function":{"parameters":{"b":1.50,"a":1e2},"name":"f<x>"}}]}"#;
        assert_eq!(
            aibrix(ApiKind::ChatCompletions, body).unwrap(),
            r#"[{"function":{"name":"f<x>","parameters":{"a":1e2,"b":1.50}},"type":"function"}] q"#
        );
        // Empty, null or non-array tools contribute nothing.
        for tools in ["[]", "null", r#"{"a":1}"#, r#""x""#] {
            let body = format!(r#"{{"messages":[{{"content":"q"}}],"tools":{tools}}}"#);
            assert_eq!(
                aibrix(ApiKind::ChatCompletions, &body).unwrap(),
                "q",
                "{tools}"
            );
        }
    }

    #[test]
    fn aibrix_completions_take_only_a_string_prompt() {
        assert_eq!(
            aibrix(ApiKind::Completions, r#"{"model":"m","prompt":"héllo"}"#).unwrap(),
            "héllo"
        );
        for body in [
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":[1,2,3]}"#,
            r#"{"prompt":null}"#,
            r#"{"model":"m"}"#,
        ] {
            assert_eq!(
                aibrix(ApiKind::Completions, body),
                Err(PassReason::NoPrompt),
                "{body}"
            );
        }
        assert_eq!(
            aibrix(ApiKind::ChatCompletions, r#"{"messages":["x"]}"#),
            Err(PassReason::NotJson)
        );
        assert_eq!(
            aibrix(ApiKind::ChatCompletions, r#"{"messages":[]}"#),
            Err(PassReason::NoPrompt)
        );
    }

    #[test]
    fn go_strings_escape_like_encoding_json_without_html() {
        let mut out = Vec::new();
        go_string("a\"\\\n\u{1}<&>\u{2028}é", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#""a\"\\\n\u0001<&>\u2028é""#
        );
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

    /// The fast path decides only what the `Value` path decides the same
    /// way: on every body here, from the generator and the fuzz corpus,
    /// when it answers it equals the `Value` path's answer.
    #[test]
    fn fast_path_agrees_with_the_value_path() {
        let pieces: &[&str] = &[
            r#""hello""#,
            r#""a\"b\\c\n""#,
            r#""\u00e9t\u00e9 \ud83d\ude00""#,
            "null",
            "1",
            "[]",
            r#"[1,2]"#,
            r#"["a","b"]"#,
            r#"[[1],[2]]"#,
            "{}",
            "true",
            r#"[{"type":"text","text":"x"}]"#,
            r#""""#,
            r#""\/""#,
        ];
        let keys: &[&str] = &["role", "content", "name", "role", "tool_calls"];
        let mut rng = crate::rng::SplitMix64::new(11);
        let mut bodies: Vec<(ApiKind, String)> = Vec::new();
        for _ in 0..3000 {
            let mut pick = |xs: &[&str]| xs[rng.below(xs.len())].to_string();
            let n = 1 + (pick(&["0", "1", "2"]).parse::<usize>().unwrap());
            let mut msgs = Vec::new();
            for _ in 0..n {
                let fields: Vec<String> = (0..3)
                    .map(|_| format!(r#""{}":{}"#, pick(keys), pick(pieces)))
                    .collect();
                msgs.push(if pick(&["o", "o", "o", "x"]) == "o" {
                    format!("{{{}}}", fields.join(","))
                } else {
                    pick(pieces)
                });
            }
            let model = pick(&[r#""m""#, "1", "null", r#""\u006d""#]);
            bodies.push((
                ApiKind::ChatCompletions,
                format!(r#"{{"model":{model},"messages":[{}]}}"#, msgs.join(" , ")),
            ));
            bodies.push((
                ApiKind::Completions,
                format!(
                    r#"{{ "model":{model}, "prompt":{} , "max_tokens":{} }}"#,
                    pick(pieces),
                    pick(pieces)
                ),
            ));
        }
        // Deep nesting beside a fast-path shape.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        bodies.push((
            ApiKind::ChatCompletions,
            format!(r#"{{"messages":[{{"role":"user","content":"x","extra":{deep}}}]}}"#),
        ));
        bodies.push((
            ApiKind::Completions,
            format!(r#"{{"prompt":"x","extra":{deep}}}"#),
        ));
        #[cfg(not(target_arch = "wasm32"))]
        for (dir, kind) in [
            ("parse_body_chat", ApiKind::ChatCompletions),
            ("parse_body_completions", ApiKind::Completions),
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fuzz/corpus")
                .join(dir);
            for e in std::fs::read_dir(path).unwrap() {
                let text = String::from_utf8_lossy(&std::fs::read(e.unwrap().path()).unwrap())
                    .into_owned();
                bodies.push((kind, text));
            }
        }
        let mut fast = 0;
        let mut deeper = 0;
        for (kind, body) in &bodies {
            if let Some(req) = fast_native(*kind, body.as_bytes()) {
                fast += 1;
                match parse_native_value(*kind, body.as_bytes()) {
                    Ok(want) => assert_eq!(req, want, "{kind:?} {body}"),
                    // The one difference: a `Value` tree stops at 128 levels,
                    // which a message's unknown field may pass (the fast path
                    // skips it, as both paths skip unknown top-level fields).
                    Err(PassReason::NotJson) => {
                        deeper += 1;
                        assert!(body.contains(&"[".repeat(129)), "{kind:?} {body}");
                    }
                    Err(e) => panic!("{kind:?} {body}: fast path routed, Value path {e:?}"),
                }
            }
        }
        assert_eq!(deeper, 1, "only the deep message field differs");
        assert!(
            fast > bodies.len() / 10,
            "the fast path took {fast} of {}",
            bodies.len()
        );
    }
}
