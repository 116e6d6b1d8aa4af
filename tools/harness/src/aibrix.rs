//! An independent AIBrix oracle for the integration tests and prefix-bench:
//! what an AIBrix Go gateway (`vllm-project/aibrix`) hashes, writes to and
//! reads from Redis, written from AIBrix's Go source and not from the
//! filter's crate (nothing here calls its request parsing, hashing or sync
//! code). The XXH64 is
//! `twox-hash`, not the `xxhash-rust` the filter uses, so the hash is not
//! checked against itself.
//!
//! Sources (AIBrix repository paths, functions):
//! - text of a chat request: `pkg/plugins/gateway/util.go` `parseChatMessages`
//!   (contents joined by one space; a string content unquoted, any other
//!   content as its raw JSON bytes) and `validateChatRequest`, which sets the
//!   prefix-match text to `combinePrefixText(message, systemText,
//!   canonicalToolsText(tools))`; `systemText` is only for `/v1/messages`.
//!   `canonicalToolsText` / `combinePrefixText` / `canonicalJSON` are in the
//!   gateway package's prefix-text file (env `AIBRIX_PREFIX_CACHE_INCLUDE_TOOLS`,
//!   default true); `pkg/types` `RoutingContext.PrefixText` picks that text
//!   when it is not empty, else the messages text.
//! - text of a completions request: `util.go` `validateCompletionRequest`
//!   (`Prompt string`: any other shape fails the unmarshal, a 400).
//! - tokens: `pkg/utils/tokenizer/local_characters.go` (the default
//!   "character" tokenizer: the text's UTF-8 bytes).
//! - block hashes: `pkg/utils/prefixcacheindexer/hash.go` `getPrefixHashes`
//!   (block size `AIBRIX_PREFIX_CACHE_BLOCK_SIZE`, default 4; an incomplete
//!   last block is not hashed; parent starts as the seed;
//!   `h = XXH64(seed, le64(parent) || block)`), lookup `seqSearchPrefix` +
//!   `matchPods`, write `AddPrefix`.
//! - Redis: `pkg/plugins/gateway/statesync/redissync.go` (`redisKeyForEntity`
//!   `%s:{%s}:e:%s`, prefix `aibrix`, `defaultRecordTTL` 2 minutes, `SETEX`,
//!   pull = SCAN + MGET + `ApplyRemote`, then delta push), and
//!   `pkg/utils/prefixcacheindexer/sync.go` (namespace `prefixcache`, id =
//!   block hash in decimal, `blockWire {"model_to_pods": {model: {pod:
//!   UnixNano}}}` through Go's `json.Marshal`, `ApplyRemoteForSync` merge:
//!   per model and pod the newer time wins, other pods are kept).
//! - pod selection: `pkg/plugins/gateway/algorithms/prefix_cache.go`
//!   `getTargetPodFromMatchedPodsFromCounts` (matched pods shuffled, then
//!   stable-sorted by match percent desc, running requests asc; the first
//!   whose count is within mean + `AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`
//!   (default 1) x stddev of all ready pods' counts).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;
use std::time::{SystemTime, UNIX_EPOCH};

use twox_hash::XxHash64;

pub use crate::redis::RedisAt;

/// `hash.go` `defaultPrefixCacheBlockSize`.
pub const DEFAULT_BLOCK_SIZE: usize = 4;
/// The seed an AIBrix gateway hashes with when statesync is on.
pub const STATESYNC_SEED: u64 = 0;
/// `redissync.go` `defaultKeyPrefix`.
pub const DEFAULT_KEY_PREFIX: &str = "aibrix";
/// `sync.go` `prefixCacheNamespace`.
pub const PREFIX_CACHE_NAMESPACE: &str = "prefixcache";
/// `redissync.go` `defaultRecordTTL` (2 minutes).
pub const DEFAULT_RECORD_TTL_SECS: u64 = 120;
/// `prefix_cache.go` `defaultStandardDeviationFactor`.
pub const DEFAULT_STDDEV_FACTOR: f64 = 1.0;

// ---------------------------------------------------------------------------
// A small JSON reader that keeps every value's byte span (AIBrix writes
// non-string message contents as the raw bytes of the request body) and the
// spelling of numbers (`canonicalJSON` has `UseNumber: true`).
// ---------------------------------------------------------------------------

/// One JSON value and where it sits in the text it was read from.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Null,
    Bool(bool),
    /// The number as spelled in the source.
    Num(String),
    /// The decoded string.
    Str(String),
    Arr(Vec<Node>),
    /// Members in source order, duplicates included.
    Obj(Vec<(String, Node)>),
}

impl Node {
    /// The member `key` of an object; with duplicate keys the last one, as
    /// Go's decoders keep the last.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.kind {
            Kind::Obj(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// This value's bytes in `text` (the text it was parsed from).
    pub fn raw<'t>(&self, text: &'t str) -> &'t str {
        &text[self.start..self.end]
    }
}

/// Parses one JSON document (surrounding whitespace allowed).
pub fn parse_json(text: &str) -> Result<Node, String> {
    let mut p = JsonParser {
        s: text.as_bytes(),
        text,
        pos: 0,
        depth: 0,
    };
    p.ws();
    let node = p.value()?;
    p.ws();
    if p.pos != p.s.len() {
        return Err(format!("trailing bytes at {}", p.pos));
    }
    Ok(node)
}

struct JsonParser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.pos < self.s.len() && matches!(self.s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at {}", b as char, self.pos))
        }
    }

    fn value(&mut self) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > 512 {
            return Err("nesting too deep".into());
        }
        let start = self.pos;
        let kind = match self.peek() {
            Some(b'{') => self.object()?,
            Some(b'[') => self.array()?,
            Some(b'"') => Kind::Str(self.string()?),
            Some(b't') => self.literal("true", Kind::Bool(true))?,
            Some(b'f') => self.literal("false", Kind::Bool(false))?,
            Some(b'n') => self.literal("null", Kind::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            _ => return Err(format!("unexpected byte at {}", self.pos)),
        };
        self.depth -= 1;
        Ok(Node {
            start,
            end: self.pos,
            kind,
        })
    }

    fn literal(&mut self, word: &str, kind: Kind) -> Result<Kind, String> {
        if self.s[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(kind)
        } else {
            Err(format!("bad literal at {}", self.pos))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Kind, String> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(format!("bad number at {start}")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(format!("bad fraction at {start}"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(format!("bad exponent at {start}"));
            }
        }
        Ok(Kind::Num(self.text[start..self.pos].to_string()))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.pos..self.pos + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("bad \\u escape at {}", self.pos))?;
        self.pos += 4;
        Ok(h)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[run..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let e = self.peek().ok_or("unterminated escape")?;
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let ch = if (0xD800..0xDC00).contains(&hi)
                                && self.s[self.pos..].starts_with(b"\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                } else {
                                    self.pos = save;
                                    None
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            // A lone surrogate decodes to U+FFFD, as in Go.
                            out.push(ch.unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(format!("bad escape at {}", self.pos - 1)),
                    }
                }
                _ => return Err(format!("unterminated string at {}", self.pos)),
            }
        }
    }

    fn array(&mut self) -> Result<Kind, String> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Kind::Arr(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Kind::Arr(items));
                }
                _ => return Err(format!("bad array at {}", self.pos)),
            }
        }
    }

    fn object(&mut self) -> Result<Kind, String> {
        self.expect(b'{')?;
        let mut members = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Kind::Obj(members));
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            members.push((key, self.value()?));
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Kind::Obj(members));
                }
                _ => return Err(format!("bad object at {}", self.pos)),
            }
        }
    }
}

/// Go-style JSON string: `"` and `\` escaped, `\b \f \n \r \t` short, other
/// control characters as `\u00XX`; with `escape_html` also `<`, `>`, `&`
/// and U+2028/U+2029 as `\u....` (Go `encoding/json` `json.Marshal`).
///
/// Not verified against sonic (AIBrix's `canonicalJSON`, `EscapeHTML:
/// false`): whether it writes `\b`/`\f` short and whether it escapes
/// U+2028/U+2029. The oracle's tests do not depend on either.
pub fn write_json_string(s: &str, out: &mut String, escape_html: bool) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' if escape_html => {
                out.push_str(&format!("\\u{:04x}", ch as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `canonicalJSON` (sonic `SortMapKeys`, `UseNumber`, `EscapeHTML: false`):
/// compact, object keys sorted bytewise at every level (a Go map: duplicate
/// keys keep the last value), numbers as spelled, HTML not escaped.
pub fn canonical_json(node: &Node, out: &mut String) {
    match &node.kind {
        Kind::Null => out.push_str("null"),
        Kind::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Kind::Num(n) => out.push_str(n),
        Kind::Str(s) => write_json_string(s, out, false),
        Kind::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        Kind::Obj(members) => {
            let mut map: BTreeMap<&[u8], &Node> = BTreeMap::new();
            for (k, v) in members {
                map.insert(k.as_bytes(), v);
            }
            out.push('{');
            for (i, (k, v)) in map.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(&String::from_utf8_lossy(k), out, false);
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
    }
}

// ---------------------------------------------------------------------------
// The text AIBrix hashes
// ---------------------------------------------------------------------------

/// `util.go` `parseChatMessages`: the contents of all messages joined by one
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

// ---------------------------------------------------------------------------
// Hashing
// ---------------------------------------------------------------------------

/// XXH64 of `data` with `seed` (twox-hash).
pub fn xxh64(seed: u64, data: &[u8]) -> u64 {
    XxHash64::oneshot(seed, data)
}

/// `getPrefixHashes`: full blocks of `block_size` tokens (bytes, the
/// character tokenizer), each `XXH64(seed, le64(parent) || block)` with the
/// parent starting as the seed; an incomplete last block is not hashed.
pub fn prefix_hashes(seed: u64, tokens: &[u8], block_size: usize) -> Vec<u64> {
    assert!(block_size > 0, "block size must be positive");
    let mut parent = seed;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let mut digest = XxHash64::with_seed(seed);
            digest.write(&parent.to_le_bytes());
            digest.write(block);
            parent = digest.finish();
            parent
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Redis keys and values
// ---------------------------------------------------------------------------

/// model -> pod -> last access (Unix nanoseconds): `blockWire.ModelToPods`.
pub type ModelToPods = BTreeMap<String, BTreeMap<String, i64>>;

/// `redisKeyForEntity`: `<prefix>:{<namespace>}:e:<id>`.
pub fn entity_key(prefix: &str, namespace: &str, block: u64) -> String {
    format!("{prefix}:{{{namespace}}}:e:{block}")
}

/// `encodeBlock`: Go `json.Marshal(blockWire)` (keys sorted, compact, HTML
/// escaped).
pub fn encode_block(block: &ModelToPods) -> String {
    let mut out = String::from("{\"model_to_pods\":{");
    for (i, (model, pods)) in block.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_string(model, &mut out, true);
        out.push_str(":{");
        for (j, (pod, nanos)) in pods.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            write_json_string(pod, &mut out, true);
            out.push(':');
            out.push_str(&nanos.to_string());
        }
        out.push('}');
    }
    out.push_str("}}");
    out
}

/// `decodeBlock`: Go `json.Unmarshal` into `blockWire` (unknown fields
/// ignored, `model_to_pods` absent or `null` = empty, times must be int64).
pub fn decode_block(data: &str) -> Result<ModelToPods, String> {
    let doc = parse_json(data)?;
    if !matches!(doc.kind, Kind::Obj(_)) {
        return Err("value is not a JSON object".into());
    }
    let mut block = ModelToPods::new();
    let models = match doc.get("model_to_pods").map(|m| &m.kind) {
        None | Some(Kind::Null) => return Ok(block),
        Some(Kind::Obj(models)) => models,
        Some(_) => return Err("model_to_pods is not an object".into()),
    };
    for (model, pods) in models {
        let entry = block.entry(model.clone()).or_default();
        match &pods.kind {
            Kind::Null => {}
            Kind::Obj(pods) => {
                for (pod, t) in pods {
                    let nanos = match &t.kind {
                        Kind::Num(n) => n
                            .parse::<i64>()
                            .map_err(|_| format!("time of {model}/{pod} is not an int64: {n}"))?,
                        _ => return Err(format!("time of {model}/{pod} is not a number")),
                    };
                    entry.insert(pod.clone(), nanos);
                }
            }
            _ => return Err(format!("pods of {model} are not an object")),
        }
    }
    Ok(block)
}

/// `ApplyRemoteForSync`: merge `remote` into `local`, per model and pod the
/// newer time wins, everything else is kept.
pub fn merge_newer(local: &mut ModelToPods, remote: &ModelToPods) {
    for (model, pods) in remote {
        let entry = local.entry(model.clone()).or_default();
        for (pod, &t) in pods {
            let cur = entry.entry(pod.clone()).or_insert(t);
            if t > *cur {
                *cur = t;
            }
        }
    }
}

/// Now as Unix nanoseconds (`time.Now().UnixNano()`).
pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Lookup and pod selection (independent of where blocks are stored)
// ---------------------------------------------------------------------------

/// What `seqSearchPrefix` found for one prompt: per pod, its match percent
/// and the number of leading blocks it holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixMatch {
    pub hashes: Vec<u64>,
    /// pod -> (percent, matched blocks)
    pub pods: BTreeMap<String, (usize, usize)>,
}

/// `seqSearchPrefix` + `matchPods`: walk the blocks in order; at block i,
/// every still-ready pod that holds it (for `model`) gets percent
/// `(i+1)*100/n`, the ready pods that do not are dropped; stop at the first
/// block that is missing, has no pod for the model, or has none of the
/// remaining ready pods.
pub fn seq_search(
    hashes: &[u64],
    model: &str,
    ready: &[&str],
    mut block_of: impl FnMut(usize, u64) -> Option<ModelToPods>,
) -> PrefixMatch {
    let mut ready: BTreeSet<String> = ready.iter().map(|p| p.to_string()).collect();
    let mut found = PrefixMatch {
        hashes: hashes.to_vec(),
        pods: BTreeMap::new(),
    };
    for (i, &h) in hashes.iter().enumerate() {
        let percent = (i + 1) * 100 / hashes.len();
        let Some(block) = block_of(i, h) else { break };
        let Some(pods) = block.get(model).filter(|p| !p.is_empty()) else {
            break;
        };
        let mut matched = false;
        ready.retain(|pod| {
            if pods.contains_key(pod) {
                found.pods.insert(pod.clone(), (percent, i + 1));
                matched = true;
                true
            } else {
                false
            }
        });
        if !matched {
            break;
        }
    }
    found
}

/// `getTargetPodFromMatchedPodsFromCounts`: among the matched pods (`pod ->
/// percent`), sorted by percent desc then running requests asc (ties in a
/// random order), the first whose running requests are within mean +
/// `factor` x stddev of all ready pods' counts. `counts` has one entry per
/// ready pod (a pod missing from it counts 0, as a missing metric does).
pub fn select_target(
    matched: &BTreeMap<String, usize>,
    ready: &[&str],
    counts: &BTreeMap<String, i64>,
    factor: f64,
) -> Option<String> {
    let loads: Vec<f64> = ready
        .iter()
        .map(|p| counts.get(*p).copied().unwrap_or(0) as f64)
        .collect();
    if loads.is_empty() {
        return None;
    }
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    let var = loads.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / loads.len() as f64;
    let bound = mean + factor * var.sqrt();
    let count = |p: &String| counts.get(p).copied().unwrap_or(0);
    let mut pods: Vec<&String> = matched.keys().collect();
    // rand.Shuffle before the stable sort: equal (percent, count) in any order.
    let mut state = (now_nanos() as u64) | 1;
    for i in (1..pods.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        pods.swap(i, (state % (i as u64 + 1)) as usize);
    }
    pods.sort_by(|a, b| matched[*b].cmp(&matched[*a]).then(count(a).cmp(&count(b))));
    pods.into_iter().find(|p| count(p) as f64 <= bound).cloned()
}

// ---------------------------------------------------------------------------
// An AIBrix gateway as seen from Redis
// ---------------------------------------------------------------------------

/// The settings an AIBrix gateway with statesync on runs with.
#[derive(Clone, Debug)]
pub struct AibrixConfig {
    pub block_size: usize,
    pub seed: u64,
    pub key_prefix: String,
    pub namespace: String,
    pub ttl_secs: u64,
}

impl Default for AibrixConfig {
    fn default() -> Self {
        AibrixConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            seed: STATESYNC_SEED,
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            namespace: PREFIX_CACHE_NAMESPACE.into(),
            ttl_secs: DEFAULT_RECORD_TTL_SECS,
        }
    }
}

impl AibrixConfig {
    pub fn hashes(&self, text: &str) -> Vec<u64> {
        prefix_hashes(self.seed, text.as_bytes(), self.block_size)
    }

    pub fn key(&self, block: u64) -> String {
        entity_key(&self.key_prefix, &self.namespace, block)
    }

    pub fn keys(&self, text: &str) -> Vec<String> {
        self.hashes(text).into_iter().map(|h| self.key(h)).collect()
    }
}

/// Writes what an AIBrix gateway writes after routing a prompt to a pod:
/// `AddPrefix` records every block for (model, pod) at now, after its pull
/// merged what Redis held (other pods and models kept, newer time wins); its
/// push SETEXes each block with the record TTL.
pub struct AibrixWriter {
    pub redis: RedisAt,
    pub cfg: AibrixConfig,
}

impl AibrixWriter {
    pub fn new(redis_port: u16) -> AibrixWriter {
        AibrixWriter {
            redis: RedisAt {
                port: redis_port,
                password: None,
            },
            cfg: AibrixConfig::default(),
        }
    }

    /// Records `text` (the hashed text, see [`prefix_text`]) for (model,
    /// pod) at now; returns the block hashes.
    pub fn add_prefix(&self, model: &str, pod: &str, text: &str) -> Vec<u64> {
        self.add_prefix_at(model, pod, text, now_nanos())
    }

    /// Like [`AibrixWriter::add_prefix`] with a given time (Unix nanos).
    pub fn add_prefix_at(&self, model: &str, pod: &str, text: &str, nanos: i64) -> Vec<u64> {
        let hashes = self.cfg.hashes(text);
        let keys: Vec<String> = hashes.iter().map(|&h| self.cfg.key(h)).collect();
        let current = self.redis.mget(&keys);
        let entries: Vec<(String, String)> = keys
            .into_iter()
            .zip(current)
            .map(|(key, value)| {
                // Pull: ApplyRemote (a value that does not decode is skipped
                // and the push then overwrites it with the local block).
                let mut block = value
                    .as_deref()
                    .and_then(|v| decode_block(v).ok())
                    .unwrap_or_default();
                // AddPrefix: blockPods[pod] = time.Now().
                block
                    .entry(model.to_string())
                    .or_default()
                    .insert(pod.to_string(), nanos);
                (key, encode_block(&block))
            })
            .collect();
        self.redis.setex_many(&entries, self.cfg.ttl_secs);
        hashes
    }

    /// SETEX one block's value as given (e.g. an old entry of a pod nobody
    /// else knows) with `ttl_secs`.
    pub fn put_block(&self, block: u64, value: &ModelToPods, ttl_secs: u64) -> String {
        let key = self.cfg.key(block);
        self.redis
            .setex_many(&[(key.clone(), encode_block(value))], ttl_secs);
        key
    }
}

/// Reads Redis the way an AIBrix gateway's lookup sees it after a pull.
pub struct AibrixReader {
    pub redis: RedisAt,
    pub cfg: AibrixConfig,
}

impl AibrixReader {
    pub fn new(redis_port: u16) -> AibrixReader {
        AibrixReader {
            redis: RedisAt {
                port: redis_port,
                password: None,
            },
            cfg: AibrixConfig::default(),
        }
    }

    /// The decoded value of every block of `text` (`None`: no key; a value
    /// that does not decode panics, naming the key).
    pub fn blocks(&self, text: &str) -> Vec<(String, Option<ModelToPods>)> {
        let keys = self.cfg.keys(text);
        let values = self.redis.mget(&keys);
        keys.into_iter()
            .zip(values)
            .map(|(k, v)| {
                let decoded = v.map(|v| {
                    decode_block(&v)
                        .unwrap_or_else(|e| panic!("{k}: AIBrix cannot decode {v:?}: {e}"))
                });
                (k, decoded)
            })
            .collect()
    }

    /// `MatchPrefix` over Redis: per ready pod its match percent and blocks.
    pub fn match_prefix(&self, model: &str, text: &str, ready: &[&str]) -> PrefixMatch {
        let hashes = self.cfg.hashes(text);
        let blocks: Vec<Option<ModelToPods>> =
            self.blocks(text).into_iter().map(|(_, b)| b).collect();
        seq_search(&hashes, model, ready, |i, _| blocks[i].clone())
    }

    /// AIBrix's prefix-cache choice for `text` among `ready` pods, all idle:
    /// `Some((pod, matched blocks, total blocks))`, `None` when no ready pod
    /// holds the first block (AIBrix then falls back to the least loaded).
    pub fn lookup(
        &self,
        model: &str,
        text: &str,
        ready: &[&str],
    ) -> Option<(String, usize, usize)> {
        let found = self.match_prefix(model, text, ready);
        let percents: BTreeMap<String, usize> = found
            .pods
            .iter()
            .map(|(p, &(percent, _))| (p.clone(), percent))
            .collect();
        let pod = select_target(&percents, ready, &BTreeMap::new(), DEFAULT_STDDEV_FACTOR)?;
        let blocks = found.pods[&pod].1;
        Some((pod, blocks, found.hashes.len()))
    }
}
