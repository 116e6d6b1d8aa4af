//! The prompt text AIBrix gateways hash (`"compat": "aibrix"`): a chat
//! request's contents joined by one space, canonical tools JSON first; a
//! completions request's string prompt. Checked against an independent
//! oracle written from AIBrix's Go source (`tools/harness/src/aibrix/`).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{is_true, model_name, ApiKind, PassReason, PromptRequest};

#[derive(Deserialize)]
struct AibrixCompletion<'a> {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default, borrow)]
    prompt: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<Value>,
}

#[derive(Deserialize)]
struct AibrixChat<'a> {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default, borrow)]
    messages: Option<Vec<AibrixMessage<'a>>>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<Value>,
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

pub(super) fn parse_aibrix(kind: ApiKind, body: &[u8]) -> Result<PromptRequest, PassReason> {
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
                stream: is_true(b.stream.as_ref()),
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
                stream: is_true(b.stream.as_ref()),
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
pub(super) fn go_string(s: &str, out: &mut Vec<u8>) {
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
