//! The Redis commands the sync engine sends, one function each, appended to
//! a [`Pipeline`] (mini-redis keeps one module per command; these are a few
//! lines each, so one file). `QUIT` is not here: [`Pipeline::finish`]
//! appends it, and its `+OK` is how a truncated reply is told apart.

use crate::sync::resp::Pipeline;

/// Change-log entry field naming the replica that wrote the entry.
pub(crate) const LOG_ORIGIN: &[u8] = b"o";
/// Change-log entry field listing the changed ids, comma-separated.
pub(crate) const LOG_IDS: &[u8] = b"i";

/// `AUTH [username] password`: first in every pipeline when configured.
pub(crate) fn auth(p: &mut Pipeline, username: Option<&str>, password: &str) {
    match username {
        Some(user) => p.push(&[b"AUTH", user.as_bytes(), password.as_bytes()]),
        None => p.push(&[b"AUTH", password.as_bytes()]),
    }
}

/// `SCAN cursor MATCH pattern COUNT count`: one page of keys.
pub(crate) fn scan(p: &mut Pipeline, cursor: &str, pattern: &str, count: usize) {
    let count = count.to_string();
    p.push(&[
        b"SCAN",
        cursor.as_bytes(),
        b"MATCH",
        pattern.as_bytes(),
        b"COUNT",
        count.as_bytes(),
    ]);
}

/// `XREVRANGE log + - COUNT 1`: the newest change-log entry, read with the
/// first page of a full scan so the next pull can start from it.
pub(crate) fn xrevrange_newest(p: &mut Pipeline, log: &str) {
    p.push(&[b"XREVRANGE", log.as_bytes(), b"+", b"-", b"COUNT", b"1"]);
}

/// `XRANGE log from + COUNT count`. The start is inclusive: the first entry
/// must be `from` itself, which is how a trimmed log is detected.
pub(crate) fn xrange(p: &mut Pipeline, log: &str, from: &str, count: usize) {
    let count = count.to_string();
    p.push(&[
        b"XRANGE",
        log.as_bytes(),
        from.as_bytes(),
        b"+",
        b"COUNT",
        count.as_bytes(),
    ]);
}

/// `CLUSTER SLOTS`: which master owns which slot range.
pub(crate) fn cluster_slots(p: &mut Pipeline) {
    p.push(&[b"CLUSTER", b"SLOTS"]);
}

/// `MGET key...`
pub(crate) fn mget(p: &mut Pipeline, keys: &[String]) {
    with_keys(p, b"MGET", keys);
}

/// `DEL key...`
pub(crate) fn del(p: &mut Pipeline, keys: &[String]) {
    with_keys(p, b"DEL", keys);
}

/// `SETEX key ttl_secs value`
pub(crate) fn setex(p: &mut Pipeline, key: &str, ttl_secs: i64, value: &[u8]) {
    let ttl = ttl_secs.to_string();
    p.push(&[b"SETEX", key.as_bytes(), ttl.as_bytes(), value]);
}

/// `XADD log MAXLEN ~ max_entries * o origin i ids`: one change-log entry,
/// the stream trimmed to about `max_entries`.
pub(crate) fn xadd(p: &mut Pipeline, log: &str, max_entries: usize, origin: &str, ids: &str) {
    let max_entries = max_entries.to_string();
    p.push(&[
        b"XADD",
        log.as_bytes(),
        b"MAXLEN",
        b"~",
        max_entries.as_bytes(),
        b"*",
        LOG_ORIGIN,
        origin.as_bytes(),
        LOG_IDS,
        ids.as_bytes(),
    ]);
}

/// `EXPIRE key ttl_secs`
pub(crate) fn expire(p: &mut Pipeline, key: &str, ttl_secs: i64) {
    let ttl = ttl_secs.to_string();
    p.push(&[b"EXPIRE", key.as_bytes(), ttl.as_bytes()]);
}

fn with_keys(p: &mut Pipeline, command: &'static [u8], keys: &[String]) {
    let mut args: Vec<&[u8]> = Vec::with_capacity(keys.len() + 1);
    args.push(command);
    args.extend(keys.iter().map(|k| k.as_bytes()));
    p.push(&args);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::sync::resp::{parse, Frame};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The commands of a finished pipeline, as argument lists (QUIT included).
    fn commands(p: Pipeline) -> Vec<Vec<String>> {
        let (body, expected) = p.finish();
        let mut rest = &body[..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let (frame, used) = parse(rest).unwrap();
            rest = &rest[used..];
            let Frame::Array(args) = frame else {
                panic!("command is not an array: {frame:?}")
            };
            let args = args.iter().map(|a| a.as_bytes().unwrap());
            out.push(
                args.map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect(),
            );
        }
        assert_eq!(out.len(), expected);
        out
    }

    #[test]
    fn every_command_has_the_documented_wire_form() {
        let mut p = Pipeline::new();
        auth(&mut p, None, "pw");
        auth(&mut p, Some("u"), "pw");
        scan(&mut p, "0", "a:{n}:e:*", 500);
        xrevrange_newest(&mut p, "a:{n}:log");
        xrange(&mut p, "a:{n}:log", "1-0", 64);
        mget(&mut p, &["k1".into(), "k2".into()]);
        del(&mut p, &["k1".into()]);
        setex(&mut p, "k1", 120, b"v");
        xadd(&mut p, "a:{n}:log", 4096, "ab12", "1,2");
        expire(&mut p, "a:{n}:log", 120);
        let want: Vec<Vec<&str>> = vec![
            vec!["AUTH", "pw"],
            vec!["AUTH", "u", "pw"],
            vec!["SCAN", "0", "MATCH", "a:{n}:e:*", "COUNT", "500"],
            vec!["XREVRANGE", "a:{n}:log", "+", "-", "COUNT", "1"],
            vec!["XRANGE", "a:{n}:log", "1-0", "+", "COUNT", "64"],
            vec!["MGET", "k1", "k2"],
            vec!["DEL", "k1"],
            vec!["SETEX", "k1", "120", "v"],
            vec![
                "XADD",
                "a:{n}:log",
                "MAXLEN",
                "~",
                "4096",
                "*",
                "o",
                "ab12",
                "i",
                "1,2",
            ],
            vec!["EXPIRE", "a:{n}:log", "120"],
            vec!["QUIT"],
        ];
        assert_eq!(commands(p), want);
    }
}
