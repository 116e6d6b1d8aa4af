//! An in-memory Redis double that executes the RESP pipelines the sync
//! engine emits, with a fake clock for TTLs and a switch that truncates
//! replies like the Envoy bridge does. Used by the unit tests and by
//! benchmarks (hence `pub`, behind the `testkit` feature); never built into
//! the filter.
//!
//! Supported: AUTH, QUIT, SETEX, SET, MGET, GET, DEL, EXPIRE, SCAN (cursor,
//! MATCH, COUNT), XADD (MAXLEN [~] N, `*` ids), XRANGE, XREVRANGE. SCAN's
//! cursor is an index into the sorted key space and COUNT is the number of
//! keys examined, which is close enough to Redis for paging tests.

use std::collections::BTreeMap;

use crate::sync::resp::{parse, Frame};

type StreamId = (u64, u64);
type Fields = Vec<(Vec<u8>, Vec<u8>)>;
type StreamEntry = (StreamId, Fields);

#[derive(Clone, Debug, Default)]
struct Stream {
    entries: Vec<StreamEntry>,
    last: StreamId,
}

#[derive(Clone, Debug)]
enum Value {
    Str(Vec<u8>),
    Stream(Stream),
}

#[derive(Clone, Debug)]
struct Entry {
    value: Value,
    expires_ms: Option<u64>,
}

/// The Redis double. See the module docs.
#[derive(Clone, Debug, Default)]
pub(crate) struct MemRedis {
    now_ms: u64,
    data: BTreeMap<Vec<u8>, Entry>,
    password: Option<String>,
    /// Cut every reply after this many bytes (the bridge's behaviour).
    pub(crate) truncate_at: Option<usize>,
    /// Keep every executed command (args) in `log`.
    pub(crate) record: bool,
    /// Executed commands when `record` is set.
    pub(crate) log: Vec<Vec<Vec<u8>>>,
    /// Commands executed in total.
    pub(crate) commands_executed: u64,
    /// Pipelines (calls) executed in total.
    pub(crate) calls: u64,
    /// Count keys per hash tag in `keys_by_tag` (off by default).
    pub(crate) count_tags: bool,
    /// With `count_tags`: keys returned by SCAN and read by MGET, per hash
    /// tag (the text between the key's first `{` and `}`; the whole key
    /// without one).
    pub(crate) keys_read_by_tag: BTreeMap<Vec<u8>, u64>,
    /// With `count_tags`: keys written by SETEX, per hash tag.
    pub(crate) keys_written_by_tag: BTreeMap<Vec<u8>, u64>,
}

impl MemRedis {
    /// An empty Redis at time 0 that records commands.
    pub(crate) fn new() -> Self {
        Self {
            record: true,
            ..Default::default()
        }
    }

    /// Sets the fake clock.
    pub(crate) fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
    }

    /// Requires `AUTH password` on every connection (call).
    pub(crate) fn require_password(&mut self, password: &str) {
        self.password = Some(password.to_owned());
    }

    /// Value of a live string key.
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        match self.live(key.as_bytes()).map(|e| &e.value) {
            Some(Value::Str(v)) => Some(v.clone()),
            _ => None,
        }
    }

    /// Writes a string key directly (e.g. as a peer that writes no log,
    /// like AIBrix's Go gateway).
    pub(crate) fn setex(&mut self, key: &str, ttl_secs: u64, value: &[u8]) {
        let expires_ms = Some(self.now_ms + ttl_secs * 1000);
        self.data.insert(
            key.as_bytes().to_vec(),
            Entry {
                value: Value::Str(value.to_vec()),
                expires_ms,
            },
        );
    }

    /// Remaining TTL in ms of a live key (None: missing or no TTL).
    pub(crate) fn ttl_ms(&self, key: &str) -> Option<u64> {
        self.live(key.as_bytes())
            .and_then(|e| e.expires_ms)
            .map(|t| t - self.now_ms)
    }

    /// Live keys matching a glob pattern, sorted.
    pub(crate) fn keys(&self, pattern: &str) -> Vec<String> {
        self.data
            .iter()
            .filter(|(k, e)| self.is_live(e) && glob_match(pattern.as_bytes(), k))
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    /// Entries in a live stream.
    pub(crate) fn stream_len(&self, key: &str) -> usize {
        match self.live(key.as_bytes()).map(|e| &e.value) {
            Some(Value::Stream(s)) => s.entries.len(),
            _ => 0,
        }
    }

    /// Trims a stream to its newest `keep` entries (simulates MAXLEN).
    pub(crate) fn trim_stream(&mut self, key: &str, keep: usize) {
        if let Some(Entry {
            value: Value::Stream(s),
            ..
        }) = self.data.get_mut(key.as_bytes())
        {
            let drop = s.entries.len().saturating_sub(keep);
            s.entries.drain(..drop);
        }
    }

    /// Removes a key outright.
    pub(crate) fn remove(&mut self, key: &str) {
        self.data.remove(key.as_bytes());
    }

    /// Executed commands whose name is `name` (needs `record`).
    pub(crate) fn count(&self, name: &str) -> usize {
        self.log
            .iter()
            .filter(|c| {
                c.first()
                    .is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes()))
            })
            .count()
    }

    /// Names of recorded commands, in order.
    pub(crate) fn command_names(&self) -> Vec<String> {
        self.log
            .iter()
            .filter_map(|c| c.first())
            .map(|n| String::from_utf8_lossy(n).to_ascii_uppercase())
            .collect()
    }

    /// Executes one call's pipeline and returns the reply bytes (truncated
    /// when `truncate_at` is set). Each call is a fresh connection: AUTH
    /// state does not carry over.
    pub(crate) fn execute(&mut self, body: &[u8]) -> Vec<u8> {
        self.calls += 1;
        let mut out = Vec::new();
        let mut pos = 0;
        let mut authed = self.password.is_none();
        while pos < body.len() {
            let (frame, used) = match parse(&body[pos..]) {
                Ok(x) => x,
                Err(e) => {
                    Frame::Error(format!("ERR Protocol error: {e}")).encode(&mut out);
                    break;
                }
            };
            pos += used;
            let args: Vec<Vec<u8>> = match frame {
                Frame::Array(items) => items
                    .into_iter()
                    .filter_map(|f| f.as_bytes().map(<[u8]>::to_vec))
                    .collect(),
                _ => Vec::new(),
            };
            self.commands_executed += 1;
            if self.record {
                self.log.push(args.clone());
            }
            let name = args
                .first()
                .map(|n| n.to_ascii_uppercase())
                .unwrap_or_default();
            let reply = if name == b"QUIT" {
                Frame::Simple("OK".into())
            } else if name == b"AUTH" {
                let given = args.last().map(|p| String::from_utf8_lossy(p).into_owned());
                match &self.password {
                    Some(pw) if given.as_deref() == Some(pw.as_str()) && args.len() >= 2 => {
                        authed = true;
                        Frame::Simple("OK".into())
                    }
                    Some(_) => Frame::Error("WRONGPASS invalid username-password pair".into()),
                    None => Frame::Error(
                        "ERR AUTH <password> called without any password configured".into(),
                    ),
                }
            } else if !authed {
                Frame::Error("NOAUTH Authentication required.".into())
            } else {
                self.command(&name, &args[1..])
            };
            if self.count_tags {
                self.count_keys(&name, &args, &reply);
            }
            reply.encode(&mut out);
            if name == b"QUIT" {
                break;
            }
        }
        if let Some(n) = self.truncate_at {
            out.truncate(n);
        }
        out
    }

    fn count_keys(&mut self, name: &[u8], args: &[Vec<u8>], reply: &Frame) {
        let written = name == b"SETEX";
        let mut keys: Vec<&[u8]> = match name {
            b"SETEX" => args.get(1).map(Vec::as_slice).into_iter().collect(),
            b"MGET" => args.iter().skip(1).map(Vec::as_slice).collect(),
            _ => Vec::new(),
        };
        if name == b"SCAN" {
            if let Frame::Array(parts) = reply {
                if let Some(Frame::Array(found)) = parts.get(1) {
                    keys.extend(found.iter().filter_map(Frame::as_bytes));
                }
            }
        }
        for key in keys {
            let tag = key
                .iter()
                .position(|&b| b == b'{')
                .and_then(|open| {
                    let rest = &key[open + 1..];
                    rest.iter()
                        .position(|&b| b == b'}')
                        .map(|close| &rest[..close])
                })
                .unwrap_or(key);
            let counts = if written {
                &mut self.keys_written_by_tag
            } else {
                &mut self.keys_read_by_tag
            };
            *counts.entry(tag.to_vec()).or_default() += 1;
        }
    }

    fn is_live(&self, e: &Entry) -> bool {
        !matches!(e.expires_ms, Some(t) if t <= self.now_ms)
    }

    fn live(&self, key: &[u8]) -> Option<&Entry> {
        self.data.get(key).filter(|e| self.is_live(e))
    }

    fn purge(&mut self, key: &[u8]) {
        let now = self.now_ms;
        if self
            .data
            .get(key)
            .is_some_and(|e| e.expires_ms.is_some_and(|t| t <= now))
        {
            self.data.remove(key);
        }
    }

    fn command(&mut self, name: &[u8], args: &[Vec<u8>]) -> Frame {
        let wrong_args = || Frame::Error("ERR wrong number of arguments".into());
        match name {
            b"SETEX" => {
                let [key, ttl, value] = args else {
                    return wrong_args();
                };
                let Some(ttl) = num(ttl).filter(|t| *t > 0) else {
                    return Frame::Error("ERR invalid expire time in 'setex' command".into());
                };
                let expires_ms = Some(self.now_ms + ttl * 1000);
                self.data.insert(
                    key.clone(),
                    Entry {
                        value: Value::Str(value.clone()),
                        expires_ms,
                    },
                );
                Frame::Simple("OK".into())
            }
            b"SET" => {
                let [key, value] = args else {
                    return wrong_args();
                };
                self.data.insert(
                    key.clone(),
                    Entry {
                        value: Value::Str(value.clone()),
                        expires_ms: None,
                    },
                );
                Frame::Simple("OK".into())
            }
            b"GET" => {
                let [key] = args else { return wrong_args() };
                match self.live(key).map(|e| &e.value) {
                    Some(Value::Str(v)) => Frame::Bulk(v.clone()),
                    Some(_) => wrongtype(),
                    None => Frame::Null,
                }
            }
            b"MGET" => Frame::Array(
                args.iter()
                    .map(|k| match self.live(k).map(|e| &e.value) {
                        Some(Value::Str(v)) => Frame::Bulk(v.clone()),
                        _ => Frame::Null,
                    })
                    .collect(),
            ),
            b"DEL" => {
                let mut n = 0;
                for k in args {
                    self.purge(k);
                    if self.data.remove(k).is_some() {
                        n += 1;
                    }
                }
                Frame::Integer(n)
            }
            b"EXPIRE" => {
                let [key, secs] = args else {
                    return wrong_args();
                };
                let Some(secs) = num(secs) else {
                    return Frame::Error("ERR not an integer".into());
                };
                self.purge(key);
                let now = self.now_ms;
                match self.data.get_mut(key) {
                    Some(e) => {
                        e.expires_ms = Some(now + secs * 1000);
                        Frame::Integer(1)
                    }
                    None => Frame::Integer(0),
                }
            }
            b"SCAN" => self.scan(args),
            b"XADD" => self.xadd(args),
            b"XRANGE" | b"XREVRANGE" => self.xrange(args, name == b"XREVRANGE"),
            _ => Frame::Error(format!(
                "ERR unknown command '{}'",
                String::from_utf8_lossy(name)
            )),
        }
    }

    fn scan(&mut self, args: &[Vec<u8>]) -> Frame {
        let Some(cursor) = args.first().and_then(|c| num(c)) else {
            return Frame::Error("ERR invalid cursor".into());
        };
        let mut pattern: &[u8] = b"*";
        let mut count = 10;
        let mut i = 1;
        while i + 1 < args.len() {
            match args[i].to_ascii_uppercase().as_slice() {
                b"MATCH" => pattern = &args[i + 1],
                b"COUNT" => count = num(&args[i + 1]).unwrap_or(10).max(1),
                _ => return Frame::Error("ERR syntax error".into()),
            }
            i += 2;
        }
        let keys: Vec<&Vec<u8>> = self.data.keys().collect();
        let start = usize::try_from(cursor)
            .unwrap_or(usize::MAX)
            .min(keys.len());
        let end = start
            .saturating_add(usize::try_from(count).unwrap_or(usize::MAX))
            .min(keys.len());
        let found: Vec<Frame> = keys[start..end]
            .iter()
            .filter(|k| self.live(k).is_some() && glob_match(pattern, k))
            .map(|k| Frame::Bulk(k.to_vec()))
            .collect();
        let next = if end >= keys.len() { 0 } else { end };
        Frame::Array(vec![
            Frame::Bulk(next.to_string().into_bytes()),
            Frame::Array(found),
        ])
    }

    fn xadd(&mut self, args: &[Vec<u8>]) -> Frame {
        let Some(key) = args.first() else {
            return Frame::Error("ERR wrong number of arguments".into());
        };
        let mut i = 1;
        let mut maxlen = None;
        if args
            .get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(b"MAXLEN"))
        {
            i += 1;
            if args.get(i).is_some_and(|a| a == b"~" || a == b"=") {
                i += 1;
            }
            maxlen = args.get(i).and_then(|n| num(n));
            i += 1;
        }
        if args.get(i).map(Vec::as_slice) != Some(b"*") {
            return Frame::Error("ERR only '*' ids are supported by the double".into());
        }
        let fields = &args[i + 1..];
        if fields.is_empty() || fields.len() % 2 != 0 {
            return Frame::Error("ERR wrong number of arguments for 'xadd' command".into());
        }
        self.purge(key);
        let now = self.now_ms;
        let entry = self.data.entry(key.clone()).or_insert_with(|| Entry {
            value: Value::Stream(Stream::default()),
            expires_ms: None,
        });
        let Value::Stream(stream) = &mut entry.value else {
            return wrongtype();
        };
        let id = if now > stream.last.0 {
            (now, 0)
        } else {
            (stream.last.0, stream.last.1 + 1)
        };
        stream.last = id;
        let pairs = fields
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect();
        stream.entries.push((id, pairs));
        if let Some(max) = maxlen.and_then(|m| usize::try_from(m).ok()) {
            let drop = stream.entries.len().saturating_sub(max);
            stream.entries.drain(..drop);
        }
        Frame::Bulk(format!("{}-{}", id.0, id.1).into_bytes())
    }

    fn xrange(&mut self, args: &[Vec<u8>], reverse: bool) -> Frame {
        let (Some(key), Some(a), Some(b)) = (args.first(), args.get(1), args.get(2)) else {
            return Frame::Error("ERR wrong number of arguments".into());
        };
        let (lo, hi) = if reverse { (b, a) } else { (a, b) };
        let (Some(lo), Some(hi)) = (bound(lo, (0, 0)), bound(hi, (u64::MAX, u64::MAX))) else {
            return Frame::Error(
                "ERR Invalid stream ID specified as stream command argument".into(),
            );
        };
        let count = match (args.get(3), args.get(4)) {
            (Some(c), Some(n)) if c.eq_ignore_ascii_case(b"COUNT") => {
                num(n).and_then(|n| usize::try_from(n).ok())
            }
            _ => None,
        };
        let stream = match self.live(key).map(|e| &e.value) {
            Some(Value::Stream(s)) => s,
            Some(_) => return wrongtype(),
            None => return Frame::Array(Vec::new()),
        };
        let mut selected: Vec<&StreamEntry> = stream
            .entries
            .iter()
            .filter(|(id, _)| *id >= lo && *id <= hi)
            .collect();
        if reverse {
            selected.reverse();
        }
        if let Some(n) = count {
            selected.truncate(n);
        }
        Frame::Array(
            selected
                .into_iter()
                .map(|(id, fields)| {
                    let flat = fields
                        .iter()
                        .flat_map(|(f, v)| [Frame::Bulk(f.clone()), Frame::Bulk(v.clone())])
                        .collect();
                    Frame::Array(vec![
                        Frame::Bulk(format!("{}-{}", id.0, id.1).into_bytes()),
                        Frame::Array(flat),
                    ])
                })
                .collect(),
        )
    }
}

fn wrongtype() -> Frame {
    Frame::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
}

fn num(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

fn bound(b: &[u8], special: StreamId) -> Option<StreamId> {
    if b == b"-" || b == b"+" {
        return Some(special);
    }
    let s = std::str::from_utf8(b).ok()?;
    match s.split_once('-') {
        Some((ms, seq)) => Some((ms.parse().ok()?, seq.parse().ok()?)),
        None => Some((s.parse().ok()?, if special.0 == 0 { 0 } else { u64::MAX })),
    }
}

/// Redis glob subset: `*`, `?` and `\` escapes (what the engine emits).
pub(crate) fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    match pattern.first() {
        None => s.is_empty(),
        Some(b'*') => (0..=s.len()).any(|i| glob_match(&pattern[1..], &s[i..])),
        Some(b'?') => !s.is_empty() && glob_match(&pattern[1..], &s[1..]),
        Some(b'\\') if pattern.len() > 1 => {
            s.first() == Some(&pattern[1]) && glob_match(&pattern[2..], &s[1..])
        }
        Some(c) => s.first() == Some(c) && glob_match(&pattern[1..], &s[1..]),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::sync::resp::{parse_pipeline_reply, Pipeline};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn run(r: &mut MemRedis, cmds: &[&[&[u8]]]) -> Vec<Frame> {
        let mut p = Pipeline::new();
        for c in cmds {
            p.push(c);
        }
        let (body, n) = p.finish();
        parse_pipeline_reply(&r.execute(&body), n).unwrap()
    }

    #[test]
    fn setex_expires_on_the_fake_clock() {
        let mut r = MemRedis::new();
        run(&mut r, &[&[b"SETEX", b"k", b"2", b"v"]]);
        assert_eq!(r.ttl_ms("k"), Some(2000));
        r.set_now(1999);
        assert_eq!(r.get("k"), Some(b"v".to_vec()));
        r.set_now(2000);
        assert_eq!(r.get("k"), None);
    }

    #[test]
    fn scan_pages_and_matches() {
        let mut r = MemRedis::new();
        for i in 0..25 {
            r.setex(&format!("p:{{n}}:e:{i:02}"), 100, b"x");
        }
        r.setex("other", 100, b"x");
        let mut cursor = b"0".to_vec();
        let mut found = 0;
        loop {
            let f = run(
                &mut r,
                &[&[b"SCAN", &cursor, b"MATCH", b"p:{n}:e:*", b"COUNT", b"10"]],
            );
            let Frame::Array(parts) = &f[0] else { panic!() };
            let Frame::Array(keys) = &parts[1] else {
                panic!()
            };
            found += keys.len();
            cursor = parts[0].as_bytes().unwrap().to_vec();
            if cursor == b"0" {
                break;
            }
        }
        assert_eq!(found, 25);
    }

    #[test]
    fn streams_add_trim_and_range() {
        let mut r = MemRedis::new();
        r.set_now(5);
        for _ in 0..5 {
            run(
                &mut r,
                &[&[b"XADD", b"s", b"MAXLEN", b"~", b"3", b"*", b"i", b"a"]],
            );
        }
        assert_eq!(r.stream_len("s"), 3);
        let f = run(&mut r, &[&[b"XRANGE", b"s", b"5-3", b"+", b"COUNT", b"10"]]);
        let Frame::Array(entries) = &f[0] else {
            panic!()
        };
        assert_eq!(entries.len(), 2);
        let f = run(&mut r, &[&[b"XREVRANGE", b"s", b"+", b"-", b"COUNT", b"1"]]);
        let Frame::Array(entries) = &f[0] else {
            panic!()
        };
        let Frame::Array(e) = &entries[0] else {
            panic!()
        };
        assert_eq!(e[0], Frame::Bulk(b"5-4".to_vec()));
    }

    #[test]
    fn auth_is_required_per_call_and_truncation_cuts_replies() {
        let mut r = MemRedis::new();
        r.require_password("pw");
        let f = run(&mut r, &[&[b"GET", b"k"]]);
        assert!(matches!(&f[0], Frame::Error(e) if e.starts_with("NOAUTH")));
        let f = run(&mut r, &[&[b"AUTH", b"pw"], &[b"GET", b"k"]]);
        assert_eq!(f[1], Frame::Null);
        r.truncate_at = Some(3);
        let mut p = Pipeline::new();
        p.push(&[b"AUTH", b"pw"]);
        let (body, _) = p.finish();
        assert_eq!(r.execute(&body), b"+OK".to_vec());
    }

    #[test]
    fn glob_subset() {
        assert!(glob_match(b"a\\*b:*", b"a*b:xyz"));
        assert!(!glob_match(b"a\\*b:*", b"aXb:xyz"));
        assert!(glob_match(b"a?c", b"abc"));
    }
}
