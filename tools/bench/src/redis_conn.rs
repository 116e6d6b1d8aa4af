//! A minimal blocking Redis connection for benchmarks: pipelined commands
//! over one TCP stream, replies parsed with the filter's own RESP codec.
//! Also writes entities the way a peer replica's sync push does (SETEX
//! chunks, each followed by its change-log entry), so a replica under test
//! sees a realistic peer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use envoy_prefix_router::sync::resp::{encode_command, parse, Frame, ParseError};

/// One connection to `127.0.0.1:<port>`.
pub struct RedisConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RedisConn {
    pub fn connect(port: u16) -> RedisConn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to redis");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("set read timeout");
        let _ = stream.set_nodelay(true);
        RedisConn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `commands` in one write and returns their replies, in order.
    pub fn pipeline(&mut self, commands: &[Vec<Vec<u8>>]) -> Vec<Frame> {
        let mut out = Vec::new();
        for c in commands {
            let args: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
            encode_command(&mut out, &args);
        }
        self.stream.write_all(&out).expect("write to redis");
        let mut replies = Vec::with_capacity(commands.len());
        let mut chunk = vec![0u8; 64 * 1024];
        while replies.len() < commands.len() {
            match parse(&self.buf) {
                Ok((frame, used)) => {
                    self.buf.drain(..used);
                    replies.push(frame);
                }
                Err(ParseError::Incomplete) => {
                    let n = self.stream.read(&mut chunk).expect("read from redis");
                    assert!(n > 0, "redis closed the connection");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(ParseError::Protocol(e)) => panic!("redis reply: {e}"),
            }
        }
        replies
    }

    /// One command.
    pub fn command(&mut self, args: &[&[u8]]) -> Frame {
        let c: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        self.pipeline(&[c]).pop().expect("one reply")
    }
}

/// A command from string-ish parts.
pub fn cmd(parts: &[&[u8]]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.to_vec()).collect()
}

/// The Redis key layout of one namespace (as `src/sync/keys.rs` defines it).
#[derive(Clone, Debug)]
pub struct Namespace {
    pub prefix: String,
    pub ns: String,
}

impl Namespace {
    pub fn entity_key(&self, id: &str) -> String {
        format!("{}:{{{}}}:e:{id}", self.prefix, self.ns)
    }

    pub fn log_key(&self) -> String {
        format!("{}:{{{}}}:log", self.prefix, self.ns)
    }
}

/// Writes `entities` as a peer replica's push does: chunks of `chunk`
/// SETEX, each chunk followed by `XADD log MAXLEN ~ max * o origin i ids`
/// and `EXPIRE log ttl`. Chunks are pipelined `per_write` at a time.
pub fn push_like_a_peer(
    conn: &mut RedisConn,
    ns: &Namespace,
    entities: &[(String, Vec<u8>)],
    ttl_secs: u64,
    origin: &str,
    chunk: usize,
) {
    let ttl = ttl_secs.to_string();
    let log = ns.log_key();
    let mut batch = Vec::new();
    for part in entities.chunks(chunk.max(1)) {
        for (id, payload) in part {
            batch.push(cmd(&[
                b"SETEX",
                ns.entity_key(id).as_bytes(),
                ttl.as_bytes(),
                payload,
            ]));
        }
        let ids: Vec<&str> = part.iter().map(|(id, _)| id.as_str()).collect();
        batch.push(cmd(&[
            b"XADD",
            log.as_bytes(),
            b"MAXLEN",
            b"~",
            b"4096",
            b"*",
            b"o",
            origin.as_bytes(),
            b"i",
            ids.join(",").as_bytes(),
        ]));
        batch.push(cmd(&[b"EXPIRE", log.as_bytes(), ttl.as_bytes()]));
        if batch.len() >= 1000 {
            check(conn.pipeline(&std::mem::take(&mut batch)));
        }
    }
    if !batch.is_empty() {
        check(conn.pipeline(&batch));
    }
}

/// Plain SETEX of many entities (no change log), pipelined 1000 at a time.
pub fn setex_all(
    conn: &mut RedisConn,
    ns: &Namespace,
    entities: &[(String, Vec<u8>)],
    ttl_secs: u64,
) {
    let ttl = ttl_secs.to_string();
    for part in entities.chunks(1000) {
        let batch: Vec<Vec<Vec<u8>>> = part
            .iter()
            .map(|(id, payload)| {
                cmd(&[
                    b"SETEX",
                    ns.entity_key(id).as_bytes(),
                    ttl.as_bytes(),
                    payload,
                ])
            })
            .collect();
        check(conn.pipeline(&batch));
    }
}

fn check(replies: Vec<Frame>) {
    if let Some(Frame::Error(e)) = replies.iter().find(|f| matches!(f, Frame::Error(_))) {
        panic!("redis error: {e}");
    }
}
