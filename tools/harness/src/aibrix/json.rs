//! A small JSON reader that keeps every value's byte span (AIBrix writes
//! non-string message contents as the raw bytes of the request body) and the
//! spelling of numbers (`canonicalJSON` has `UseNumber: true`); and Go's
//! `json.Marshal` string escaping.

use std::collections::BTreeMap;

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
