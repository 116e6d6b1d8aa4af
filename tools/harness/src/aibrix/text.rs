//! The text AIBrix hashes: of a chat request (its messages, and tools when
//! included) and of a completions request.

use super::json::{canonical_json, parse_json, Kind, Node};

/// space, no roles; a content that starts with `"` is JSON-unquoted, any
/// other content (array, object, number, `null`) is written as its raw JSON
/// bytes from the body; a message without `content` adds nothing (but its
/// separating space). No messages is a 400.
pub fn chat_messages_text(body: &str) -> Result<String, String> {
    let doc = parse_json(body)?;
    if !matches!(doc.kind, Kind::Obj(_)) {
        return Err("body is not a JSON object".into());
    }
    let messages = match doc.get("messages").map(|m| &m.kind) {
        None | Some(Kind::Null) => return Err("no messages in the request body".into()),
        Some(Kind::Arr(items)) => items,
        Some(_) => return Err("messages is not an array".into()),
    };
    if messages.is_empty() {
        return Err("no messages in the request body".into());
    }
    let mut text = String::new();
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        match &m.kind {
            Kind::Obj(_) => {}
            Kind::Null => continue,
            _ => return Err(format!("messages[{i}] is not an object")),
        }
        match m.get("content") {
            None => {}
            Some(Node {
                kind: Kind::Str(s), ..
            }) => text.push_str(s),
            Some(other) => text.push_str(other.raw(body)),
        }
    }
    Ok(text)
}

/// `canonicalToolsText`: `""` when tools must not contribute (turned off,
/// absent, `null`, not an array, an empty array); JSON that does not parse
/// falls back to the trimmed raw bytes; else `canonicalJSON` of the array.
pub fn canonical_tools_text(raw: &str, include_tools: bool) -> String {
    if !include_tools {
        return String::new();
    }
    let raw = raw.trim_matches(|c: char| c.is_ascii_whitespace());
    if !raw.starts_with('[') {
        return String::new();
    }
    match parse_json(raw) {
        Err(_) => raw.to_string(),
        Ok(Node {
            kind: Kind::Arr(items),
            ..
        }) if items.is_empty() => String::new(),
        Ok(node) => {
            let mut out = String::new();
            canonical_json(&node, &mut out);
            out
        }
    }
}

/// `combinePrefixText(message, fields...)`: the non-empty fields, then the
/// message, joined by one space; `""` when no field is non-empty (then the
/// router hashes the message itself, `RoutingContext.PrefixText`).
pub fn combine_prefix_text(message: &str, fields: &[&str]) -> String {
    let mut parts: Vec<&str> = fields.iter().copied().filter(|f| !f.is_empty()).collect();
    if parts.is_empty() {
        return String::new();
    }
    parts.push(message);
    parts.join(" ")
}

/// The text an AIBrix prefix-cache router hashes for a `/v1/chat/completions`
/// body: `PrefixText()` = the tools-prefixed text when tools contribute,
/// else the messages text.
pub fn chat_prefix_text(body: &str, include_tools: bool) -> Result<String, String> {
    let message = chat_messages_text(body)?;
    let doc = parse_json(body)?;
    let tools = doc
        .get("tools")
        .map(|t| canonical_tools_text(t.raw(body), include_tools))
        .unwrap_or_default();
    let combined = combine_prefix_text(&message, &[&tools]);
    Ok(if combined.is_empty() {
        message
    } else {
        combined
    })
}

/// `validateCompletionRequest`: `prompt` must be a string (absent = "");
/// any other shape fails Go's unmarshal into `Prompt string` (a 400).
pub fn completion_prefix_text(body: &str) -> Result<String, String> {
    let doc = parse_json(body)?;
    if !matches!(doc.kind, Kind::Obj(_)) {
        return Err("body is not a JSON object".into());
    }
    match doc.get("prompt").map(|p| &p.kind) {
        None | Some(Kind::Null) => Ok(String::new()),
        Some(Kind::Str(s)) => Ok(s.clone()),
        Some(_) => Err("prompt is not a string".into()),
    }
}

/// The hashed text of a request by path (`/v1/completions` or
/// `/v1/chat/completions`), tools included as AIBrix does by default.
pub fn prefix_text(path: &str, body: &str) -> Result<String, String> {
    match path {
        "/v1/completions" => completion_prefix_text(body),
        "/v1/chat/completions" => chat_prefix_text(body, true),
        other => Err(format!("not a prefix-cache path: {other}")),
    }
}
