//! RESP2 codec: encodes Redis commands and parses Redis replies, incrementally
//! and with hard limits, so the sync engine can speak raw RESP through the
//! Envoy HTTP-to-TCP bridge without any Redis client library.
//!
//! Wire format (RESP2), every line ends in `\r\n`:
//! - `+OK` simple string, `-ERR msg` error, `:-12` signed 64-bit integer;
//! - `$5\r\nhello` bulk string of exactly 5 bytes, `$-1` null bulk;
//! - `*2` array of 2 frames that follow, `*-1` null array.
//!
//! A command is an array of bulk strings. The parser never trusts a length
//! prefix: bulk and array lengths and the nesting depth are capped (like
//! redis-rs's `MAX_RECURSE_DEPTH`) so a corrupt or hostile reply costs a
//! protocol error, not memory or stack.

use std::fmt;

/// Largest bulk string accepted. Our replies stay under 64 KiB (the bridge
/// truncates beyond that), so anything near this is corruption.
pub const MAX_BULK_LEN: usize = 16 * 1024 * 1024;
/// Largest array accepted.
pub const MAX_ARRAY_LEN: usize = 1024 * 1024;
/// Deepest array nesting accepted (SCAN and XRANGE replies nest 3 deep).
pub const MAX_DEPTH: usize = 16;
/// Longest header line (`+`, `-`, `:`, `$`, `*` lines) accepted; beyond it a
/// missing `\r\n` is a protocol error rather than "need more bytes".
pub(crate) const MAX_LINE_LEN: usize = 64 * 1024;

/// One RESP2 value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// `+text`
    Simple(String),
    /// `-text`
    Error(String),
    /// `:n`, signed as Redis sends negative integers (e.g. `TTL` gives -2).
    Integer(i64),
    /// `$len` followed by `len` raw bytes.
    Bulk(Vec<u8>),
    /// `$-1`: a missing value, e.g. an MGET slot whose key expired.
    Null,
    /// `*n` followed by `n` frames.
    Array(Vec<Frame>),
    /// `*-1`
    NullArray,
}

/// Why [`parse`] could not produce a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The buffer ends before the frame does; more bytes may complete it.
    Incomplete,
    /// The bytes can never form a valid frame (or break a limit).
    Protocol(String),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Incomplete => write!(f, "incomplete RESP frame"),
            ParseError::Protocol(msg) => write!(f, "RESP protocol error: {msg}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Why a whole pipeline reply was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyError {
    /// Fewer complete replies than commands, or the final `+OK` of `QUIT` is
    /// missing: the bridge cut Redis's output. None of it may be applied.
    Truncated {
        /// Complete replies found before the cut.
        complete: usize,
        /// Replies expected (commands sent, `QUIT` included).
        expected: usize,
    },
    /// The reply is malformed, has trailing bytes, or `QUIT` did not say OK.
    Protocol(String),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Truncated { complete, expected } => {
                write!(
                    f,
                    "truncated pipeline reply: {complete} of {expected} replies"
                )
            }
            ReplyError::Protocol(msg) => write!(f, "bad pipeline reply: {msg}"),
        }
    }
}

impl std::error::Error for ReplyError {}

impl Frame {
    /// Appends this frame's wire form to `out` (used by the Redis test double,
    /// so built for tests and the `testkit` feature only).
    #[cfg(any(test, feature = "testkit"))]
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Frame::Simple(s) => line(out, b'+', s.as_bytes()),
            Frame::Error(s) => line(out, b'-', s.as_bytes()),
            Frame::Integer(n) => line(out, b':', n.to_string().as_bytes()),
            Frame::Bulk(b) => {
                line(out, b'$', b.len().to_string().as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Frame::Null => out.extend_from_slice(b"$-1\r\n"),
            Frame::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                for item in items {
                    item.encode(out);
                }
            }
            Frame::NullArray => out.extend_from_slice(b"*-1\r\n"),
        }
    }

    /// Length of this frame's wire form (what [`parse`] consumed for it).
    pub(crate) fn wire_len(&self) -> usize {
        // `tag`, the line, CRLF.
        fn line(body: usize) -> usize {
            body + 3
        }
        fn digits(n: usize) -> usize {
            n.checked_ilog10().map_or(1, |d| d as usize + 1)
        }
        match self {
            Frame::Simple(s) | Frame::Error(s) => line(s.len()),
            Frame::Integer(n) => line(n.to_string().len()),
            Frame::Bulk(b) => line(digits(b.len())) + b.len() + 2,
            Frame::Null | Frame::NullArray => 5,
            Frame::Array(items) => {
                line(digits(items.len())) + items.iter().map(Frame::wire_len).sum::<usize>()
            }
        }
    }

    /// The frame as bytes when it is a bulk or simple string.
    pub(crate) fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Frame::Bulk(b) => Some(b),
            Frame::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
}

fn line(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
}

/// Appends one command (an array of bulk strings) to `out`.
pub(crate) fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    line(out, b'*', args.len().to_string().as_bytes());
    for arg in args {
        line(out, b'$', arg.len().to_string().as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// A batch of commands sent in one bridge call. [`Pipeline::finish`] appends
/// `QUIT`, whose `+OK` marks a complete (untruncated) reply.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pipeline {
    buf: Vec<u8>,
    commands: usize,
    /// Every command pushed from now on is preceded by `ASKING` (Redis
    /// Cluster: the next command may touch a slot being imported).
    asking: bool,
}

impl Pipeline {
    /// An empty pipeline.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends one command (after an `ASKING` in asking mode).
    pub(crate) fn push(&mut self, args: &[&[u8]]) {
        if self.asking {
            encode_command(&mut self.buf, &[b"ASKING"]);
            self.commands += 1;
        }
        encode_command(&mut self.buf, args);
        self.commands += 1;
    }

    /// From now on, precede every command with `ASKING` (not `QUIT`).
    pub(crate) fn set_asking(&mut self, asking: bool) {
        self.asking = asking;
    }

    /// Commands so far (without the final `QUIT`).
    pub(crate) fn len(&self) -> usize {
        self.commands
    }

    /// True when no command was pushed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.commands == 0
    }

    /// Appends `QUIT` and returns the body and the number of replies to
    /// expect (commands + 1), for [`parse_pipeline_reply`].
    pub(crate) fn finish(mut self) -> (Vec<u8>, usize) {
        self.asking = false;
        self.push(&[b"QUIT"]);
        (self.buf, self.commands)
    }
}

/// Parses one frame at the start of `buf`; returns it and the bytes consumed.
pub fn parse(buf: &[u8]) -> Result<(Frame, usize), ParseError> {
    let mut pos = 0;
    let frame = parse_at(buf, &mut pos, 0)?;
    Ok((frame, pos))
}

/// Parses the reply to a pipeline of `expected` commands whose last command
/// is `QUIT`. Either every reply is returned (QUIT's `+OK` included) or an
/// error: a caller can never see a prefix of a truncated reply.
pub fn parse_pipeline_reply(buf: &[u8], expected: usize) -> Result<Vec<Frame>, ReplyError> {
    if expected == 0 {
        return Err(ReplyError::Protocol(
            "a pipeline ends with QUIT, so expects >= 1 reply".into(),
        ));
    }
    let mut frames = Vec::with_capacity(expected.min(1024));
    let mut pos = 0;
    while frames.len() < expected {
        match parse(&buf[pos..]) {
            Ok((frame, used)) => {
                frames.push(frame);
                pos += used;
            }
            Err(ParseError::Incomplete) => {
                return Err(ReplyError::Truncated {
                    complete: frames.len(),
                    expected,
                })
            }
            Err(ParseError::Protocol(msg)) => return Err(ReplyError::Protocol(msg)),
        }
    }
    if pos != buf.len() {
        return Err(ReplyError::Protocol(format!(
            "{} bytes after the QUIT reply",
            buf.len() - pos
        )));
    }
    match frames.last() {
        Some(Frame::Simple(s)) if s == "OK" => Ok(frames),
        other => Err(ReplyError::Protocol(format!(
            "QUIT replied {other:?}, not +OK"
        ))),
    }
}

fn parse_at(buf: &[u8], pos: &mut usize, depth: usize) -> Result<Frame, ParseError> {
    if depth > MAX_DEPTH {
        return Err(ParseError::Protocol(format!(
            "nesting deeper than {MAX_DEPTH}"
        )));
    }
    let tag = *buf.get(*pos).ok_or(ParseError::Incomplete)?;
    *pos += 1;
    match tag {
        b'+' => Ok(Frame::Simple(utf8(read_line(buf, pos)?)?)),
        b'-' => Ok(Frame::Error(utf8(read_line(buf, pos)?)?)),
        b':' => Ok(Frame::Integer(integer(read_line(buf, pos)?)?)),
        b'$' => {
            let len = integer(read_line(buf, pos)?)?;
            if len == -1 {
                return Ok(Frame::Null);
            }
            let len = checked_len(len, MAX_BULK_LEN, "bulk")?;
            let end = *pos + len;
            if buf.len() < end + 2 {
                return Err(ParseError::Incomplete);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ParseError::Protocol(
                    "bulk string not followed by CRLF".into(),
                ));
            }
            let data = buf[*pos..end].to_vec();
            *pos = end + 2;
            Ok(Frame::Bulk(data))
        }
        b'*' => {
            let len = integer(read_line(buf, pos)?)?;
            if len == -1 {
                return Ok(Frame::NullArray);
            }
            let len = checked_len(len, MAX_ARRAY_LEN, "array")?;
            // Capacity is capped: the length prefix is not trusted until the
            // elements actually arrive.
            let mut items = Vec::with_capacity(len.min(1024));
            for _ in 0..len {
                items.push(parse_at(buf, pos, depth + 1)?);
            }
            Ok(Frame::Array(items))
        }
        other => Err(ParseError::Protocol(format!(
            "unknown frame type byte 0x{other:02x}"
        ))),
    }
}

fn checked_len(len: i64, max: usize, what: &str) -> Result<usize, ParseError> {
    let len = usize::try_from(len)
        .map_err(|_| ParseError::Protocol(format!("negative {what} length {len}")))?;
    if len > max {
        return Err(ParseError::Protocol(format!(
            "{what} length {len} exceeds limit {max}"
        )));
    }
    Ok(len)
}

fn read_line<'a>(buf: &'a [u8], pos: &mut usize) -> Result<&'a [u8], ParseError> {
    let start = *pos;
    let rest = &buf[start..];
    match rest.iter().position(|&b| b == b'\r') {
        Some(i) if i > MAX_LINE_LEN => Err(ParseError::Protocol("line too long".into())),
        Some(i) => match rest.get(i + 1) {
            None => Err(ParseError::Incomplete),
            Some(b'\n') => {
                *pos = start + i + 2;
                Ok(&rest[..i])
            }
            Some(_) => Err(ParseError::Protocol("CR not followed by LF".into())),
        },
        None if rest.len() > MAX_LINE_LEN => Err(ParseError::Protocol("line too long".into())),
        None => Err(ParseError::Incomplete),
    }
}

fn utf8(bytes: &[u8]) -> Result<String, ParseError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| ParseError::Protocol("simple string is not UTF-8".into()))
}

fn integer(bytes: &[u8]) -> Result<i64, ParseError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            ParseError::Protocol(format!("bad integer {:?}", String::from_utf8_lossy(bytes)))
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn enc(frame: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        frame.encode(&mut out);
        out
    }

    fn sample_frames() -> Vec<Frame> {
        vec![
            Frame::Simple("OK".into()),
            Frame::Error("ERR wrong number of arguments".into()),
            Frame::Integer(42),
            Frame::Integer(-2),
            Frame::Integer(i64::MIN),
            Frame::Bulk(b"hello\r\nworld".to_vec()),
            Frame::Bulk(Vec::new()),
            Frame::Null,
            Frame::NullArray,
            Frame::Array(vec![]),
            Frame::Array(vec![
                Frame::Bulk(b"17".to_vec()),
                Frame::Array(vec![
                    Frame::Bulk(b"k1".to_vec()),
                    Frame::Null,
                    Frame::Integer(-1),
                ]),
            ]),
        ]
    }

    #[test]
    fn wire_len_is_the_encoded_length() {
        for frame in sample_frames() {
            assert_eq!(frame.wire_len(), enc(&frame).len(), "{frame:?}");
        }
    }

    #[test]
    fn every_frame_type_round_trips() {
        for frame in sample_frames() {
            let bytes = enc(&frame);
            assert_eq!(parse(&bytes), Ok((frame.clone(), bytes.len())), "{frame:?}");
        }
    }

    #[test]
    fn wire_forms_are_exact() {
        assert_eq!(enc(&Frame::Integer(-2)), b":-2\r\n");
        assert_eq!(enc(&Frame::Null), b"$-1\r\n");
        assert_eq!(enc(&Frame::NullArray), b"*-1\r\n");
        assert_eq!(
            parse(b":-9223372036854775808\r\n"),
            Ok((Frame::Integer(i64::MIN), 23))
        );
        let mut cmd = Vec::new();
        encode_command(&mut cmd, &[b"SETEX", b"k", b"120", b"v"]);
        assert_eq!(
            cmd,
            b"*4\r\n$5\r\nSETEX\r\n$1\r\nk\r\n$3\r\n120\r\n$1\r\nv\r\n"
        );
    }

    #[test]
    fn incomplete_at_every_byte_offset() {
        for frame in sample_frames() {
            let bytes = enc(&frame);
            for cut in 0..bytes.len() {
                assert_eq!(
                    parse(&bytes[..cut]),
                    Err(ParseError::Incomplete),
                    "{frame:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn parse_reports_consumed_and_ignores_following_bytes() {
        assert_eq!(parse(b"+OK\r\n:1\r\n"), Ok((Frame::Simple("OK".into()), 5)));
    }

    #[test]
    fn protocol_errors_are_not_incomplete() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b"$3\r\nabcd\r\n",
            b"$-5\r\n",
            b"*-2\r\n",
            b"+OK\rX",
            b"+\xff\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(ParseError::Protocol(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn limits_return_protocol_errors() {
        let big_bulk = format!("${}\r\n", MAX_BULK_LEN + 1);
        assert!(matches!(
            parse(big_bulk.as_bytes()),
            Err(ParseError::Protocol(_))
        ));
        let big_array = format!("*{}\r\n", MAX_ARRAY_LEN + 1);
        assert!(matches!(
            parse(big_array.as_bytes()),
            Err(ParseError::Protocol(_))
        ));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
        assert!(matches!(
            parse(deep.as_bytes()),
            Err(ParseError::Protocol(_))
        ));
        let ok_deep = format!("{}:1\r\n", "*1\r\n".repeat(MAX_DEPTH));
        assert!(parse(ok_deep.as_bytes()).is_ok());
        let long_line = vec![b'+'; MAX_LINE_LEN + 10];
        assert!(matches!(parse(&long_line), Err(ParseError::Protocol(_))));
    }

    #[test]
    fn pipeline_appends_quit_and_counts_replies() {
        let mut p = Pipeline::new();
        assert!(p.is_empty());
        p.push(&[b"GET", b"a"]);
        assert_eq!(p.len(), 1);
        let (body, n) = p.finish();
        assert_eq!(n, 2);
        assert!(body.ends_with(b"*1\r\n$4\r\nQUIT\r\n"));
    }

    #[test]
    fn pipeline_reply_complete() {
        let reply = b"$1\r\nv\r\n:-1\r\n+OK\r\n";
        let frames = parse_pipeline_reply(reply, 3);
        assert_eq!(
            frames,
            Ok(vec![
                Frame::Bulk(b"v".to_vec()),
                Frame::Integer(-1),
                Frame::Simple("OK".into())
            ])
        );
    }

    #[test]
    fn pipeline_reply_truncated_at_every_offset() {
        let reply = b"*2\r\n$2\r\nab\r\n$-1\r\n+OK\r\n+OK\r\n";
        assert!(parse_pipeline_reply(reply, 3).is_ok());
        for cut in 0..reply.len() {
            assert!(
                matches!(
                    parse_pipeline_reply(&reply[..cut], 3),
                    Err(ReplyError::Truncated { .. })
                ),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn pipeline_reply_rejects_trailing_bytes_and_non_ok_quit() {
        assert!(matches!(
            parse_pipeline_reply(b"+OK\r\n+OK\r\n", 1),
            Err(ReplyError::Protocol(_))
        ));
        assert!(matches!(
            parse_pipeline_reply(b":1\r\n", 1),
            Err(ReplyError::Protocol(_))
        ));
        assert!(matches!(
            parse_pipeline_reply(b"", 0),
            Err(ReplyError::Protocol(_))
        ));
    }
}
