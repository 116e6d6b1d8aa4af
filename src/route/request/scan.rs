//! The fast path of [`super::parse_body_as`] (native layout): a one-pass
//! scanner over the body for the shapes nearly every request has, a string
//! completions `prompt`, or chat `messages` that are objects with a string
//! `role` and string or null `content`. It copies the prompt text straight
//! into the bytes that get hashed: no `Value` tree, no serde machinery,
//! strings scanned eight bytes at a time.
//!
//! It answers only when it is sure: anything else (another shape, a
//! duplicate field, bad JSON, a lone surrogate, nesting past
//! [`MAX_DEPTH`]) is `None`, and the `Value` path decides. A test holds
//! its answers equal to the `Value` path's on every body it tries.

use super::{ApiKind, PromptRequest};

/// Deepest nesting the scanner skips; deeper values go to the `Value` path
/// (which refuses past 128 levels, as serde_json does).
const MAX_DEPTH: usize = 128;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether any byte of `w` is `"`, `\` or below 0x20 (SWAR: each test sets
/// the high bit of a byte that matches; false positives are impossible for
/// these constants).
#[inline]
fn special_in(w: u64) -> bool {
    let quote = w ^ (ONES * u64::from(b'"'));
    let slash = w ^ (ONES * u64::from(b'\\'));
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    (zero_in(quote) | zero_in(slash) | control) != 0
}

/// A string as it stands in the body, between its quotes.
struct RawString<'a> {
    raw: &'a [u8],
    escaped: bool,
    ascii: bool,
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    /// Skips whitespace, then consumes `c`.
    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// The raw bytes of a string starting at its opening quote (escapes
    /// left as they are), whether it has escapes, and whether it is all
    /// ASCII; the cursor ends past the closing quote. None on a control
    /// character or no closing quote.
    fn raw_string(&mut self) -> Option<RawString<'a>> {
        self.eat(b'"')?;
        let start = self.i;
        let mut escaped = false;
        let mut high = 0u64;
        loop {
            // Eight bytes at a time while none of them needs a look.
            while let Some(chunk) = self.b.get(self.i..self.i + 8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                let w = u64::from_le_bytes(word);
                if special_in(w) {
                    break;
                }
                high |= w;
                self.i += 8;
            }
            match self.peek()? {
                b'"' => {
                    let raw = self.b.get(start..self.i)?;
                    self.i += 1;
                    return Some(RawString {
                        raw,
                        escaped,
                        // Bytes checked one at a time are folded in here.
                        ascii: high & HIGHS == 0,
                    });
                }
                b'\\' => {
                    escaped = true;
                    // The escaped byte is checked when decoding; here it
                    // only must not end the string.
                    self.i += 2;
                }
                c if c < 0x20 => return None,
                c => {
                    high |= u64::from(c);
                    self.i += 1;
                }
            }
        }
    }

    /// A string's raw bytes, checked as the `Value` path checks them: valid
    /// UTF-8 (escapes are ASCII, so the raw bytes are valid exactly when the
    /// decoded ones are) and valid escapes.
    fn checked_string(&mut self) -> Option<RawString<'a>> {
        let s = self.raw_string()?;
        if !s.ascii {
            std::str::from_utf8(s.raw).ok()?;
        }
        Some(s)
    }

    /// A string, decoded and appended to `out`.
    fn string_into(&mut self, out: &mut Vec<u8>) -> Option<()> {
        let s = self.checked_string()?;
        if s.escaped {
            unescape(s.raw, out)
        } else {
            out.extend_from_slice(s.raw);
            Some(())
        }
    }

    fn string(&mut self) -> Option<String> {
        let mut out = Vec::new();
        self.string_into(&mut out)?;
        String::from_utf8(out).ok()
    }

    /// Skips one value of any kind, checking it is well-formed JSON.
    fn skip_value(&mut self) -> Option<()> {
        // Open containers, innermost last: true for an object.
        let mut open = [false; MAX_DEPTH];
        let mut depth = 0usize;
        loop {
            // A value.
            self.ws();
            match self.peek()? {
                b'{' | b'[' => {
                    let object = self.peek()? == b'{';
                    *open.get_mut(depth)? = object;
                    depth += 1;
                    self.i += 1;
                    self.ws();
                    let close = if object { b'}' } else { b']' };
                    if self.peek()? == close {
                        self.i += 1;
                        depth -= 1;
                    } else {
                        if object {
                            self.skip_string()?;
                            self.eat(b':')?;
                        }
                        continue;
                    }
                }
                b'"' => self.skip_string()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => self.number()?,
            }
            // After a value: close containers, or go on to the next member.
            loop {
                if depth == 0 {
                    return Some(());
                }
                let object = *open.get(depth - 1)?;
                self.ws();
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        if object {
                            self.skip_string()?;
                            self.eat(b':')?;
                        }
                        break;
                    }
                    b'}' if object => {
                        self.i += 1;
                        depth -= 1;
                    }
                    b']' if !object => {
                        self.i += 1;
                        depth -= 1;
                    }
                    _ => return None,
                }
            }
        }
    }

    /// Skips a string, checking it as [`Scan::string_into`] would.
    fn skip_string(&mut self) -> Option<()> {
        let s = self.checked_string()?;
        if s.escaped {
            unescape(s.raw, &mut Vec::new())?;
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits()?,
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.digits()?;
        }
        Some(())
    }

    /// One or more ASCII digits.
    fn digits(&mut self) -> Option<()> {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        (self.i > start).then_some(())
    }

    /// An object's members: calls `member` with each key (decoded) and the
    /// cursor before its value; `member` consumes the value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            let key = self.key()?;
            self.eat(b':')?;
            member(self, &key)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A member name, borrowed unless it has escapes.
    fn key(&mut self) -> Option<std::borrow::Cow<'a, str>> {
        let s = self.checked_string()?;
        if !s.escaped {
            return std::str::from_utf8(s.raw).ok().map(Into::into);
        }
        let mut out = Vec::new();
        unescape(s.raw, &mut out)?;
        String::from_utf8(out).ok().map(Into::into)
    }

    /// Nothing but whitespace left.
    fn end(&mut self) -> Option<()> {
        self.ws();
        (self.i == self.b.len()).then_some(())
    }
}

/// Decodes a string's raw bytes (between the quotes) into `out`. None on an
/// unknown escape or a surrogate that is not a proper pair.
fn unescape(raw: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut i = 0;
    while i < raw.len() {
        let plain_end = raw[i..]
            .iter()
            .position(|&c| c == b'\\')
            .map_or(raw.len(), |p| i + p);
        out.extend_from_slice(raw.get(i..plain_end)?);
        i = plain_end;
        if i >= raw.len() {
            break;
        }
        let c = *raw.get(i + 1)?;
        i += 2;
        let byte = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let hi = hex4(raw.get(i..i + 4)?)?;
                i += 4;
                let code = match hi {
                    0xD800..=0xDBFF => {
                        if raw.get(i..i + 2)? != b"\\u" {
                            return None;
                        }
                        let lo = hex4(raw.get(i + 2..i + 6)?)?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return None;
                        }
                        i += 6;
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => hi,
                };
                let ch = char::from_u32(code)?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                continue;
            }
            _ => return None,
        };
        out.push(byte);
    }
    Some(())
}

fn hex4(h: &[u8]) -> Option<u32> {
    h.iter().try_fold(0u32, |acc, &c| {
        let d = char::from(c).to_digit(16)?;
        Some(acc * 16 + d)
    })
}

/// The native layout of the common shapes in one pass, or None to let the
/// `Value` path decide.
pub(super) fn scan_native(kind: ApiKind, body: &[u8]) -> Option<PromptRequest> {
    let mut s = Scan { b: body, i: 0 };
    let mut model: Option<String> = None;
    let mut prompt: Option<Vec<u8>> = None;
    let mut stream: Option<bool> = None;
    let wanted = match kind {
        ApiKind::Completions => "prompt",
        ApiKind::ChatCompletions => "messages",
    };
    s.object(|s, key| {
        if key == "model" {
            if model.is_some() {
                return None;
            }
            s.ws();
            model = Some(if s.peek()? == b'"' {
                s.string()?
            } else {
                s.skip_value()?;
                String::new()
            });
            Some(())
        } else if key == wanted {
            if prompt.is_some() {
                return None;
            }
            prompt = Some(match kind {
                ApiKind::Completions => {
                    let mut out = Vec::new();
                    s.string_into(&mut out)?;
                    out
                }
                ApiKind::ChatCompletions => messages(s, body.len())?,
            });
            Some(())
        } else if key == "stream" {
            // A duplicate is serde's error: left to the Value path.
            if stream.is_some() {
                return None;
            }
            s.ws();
            stream = Some(if s.peek()? == b't' {
                s.literal(b"true")?;
                true
            } else {
                s.skip_value()?;
                false
            });
            Some(())
        } else {
            s.skip_value()
        }
    })?;
    s.end()?;
    Some(PromptRequest {
        model: model.unwrap_or_default(),
        prompt: prompt?,
        stream: stream.unwrap_or(false),
    })
}

/// Where a message's role went in the output.
enum Role {
    /// Written in place as `<|role|>` (the role came before any content).
    InPlace,
    /// Decoded at this range after the content; moved in front at the end.
    After(usize, usize),
}

/// A non-empty `messages` array of `{role: string, content: string|null}`
/// objects (other members skipped), as the chat layout.
fn messages(s: &mut Scan<'_>, capacity: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(capacity);
    s.eat(b'[')?;
    loop {
        let start = out.len();
        let mut role: Option<Role> = None;
        let mut content: Option<(usize, usize)> = None;
        let mut content_seen = false;
        s.object(|s, key| match key {
            "role" => {
                if role.is_some() {
                    return None;
                }
                if content.is_none() {
                    out.extend_from_slice(b"<|");
                    s.string_into(&mut out)?;
                    out.extend_from_slice(b"|>");
                    role = Some(Role::InPlace);
                } else {
                    let at = out.len();
                    s.string_into(&mut out)?;
                    role = Some(Role::After(at, out.len()));
                }
                Some(())
            }
            "content" => {
                if content_seen {
                    return None;
                }
                content_seen = true;
                s.ws();
                if s.peek()? == b'n' {
                    return s.literal(b"null");
                }
                let at = out.len();
                s.string_into(&mut out)?;
                content = Some((at, out.len()));
                Some(())
            }
            _ => s.skip_value(),
        })?;
        match role? {
            Role::InPlace => {}
            Role::After(r0, r1) => {
                // [content][role] -> <|role|>[content] (rare: content first).
                let decoded = out.split_off(start);
                let (c0, c1) = content?;
                out.extend_from_slice(b"<|");
                out.extend_from_slice(decoded.get(r0 - start..r1 - start)?);
                out.extend_from_slice(b"|>");
                out.extend_from_slice(decoded.get(c0 - start..c1 - start)?);
            }
        }
        out.push(b'\n');
        s.ws();
        match s.peek()? {
            b',' => s.i += 1,
            b']' => {
                s.i += 1;
                return Some(out);
            }
            _ => return None,
        }
    }
}
