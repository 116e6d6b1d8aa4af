//! A tiny independent RESP2 client for tests (the filter's own codec is
//! under test): one plain TCP connection per pipeline, AUTH first when a password
//! is set, QUIT last.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use super::{resp_command, Redis};

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(n) => *n,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// A bulk string as text (`None` for a nil reply).
    pub fn text(&self) -> Option<String> {
        match self {
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Bulk(None) => None,
            other => panic!("expected a bulk reply, got {other:?}"),
        }
    }

    pub fn items(&self) -> &[Resp] {
        match self {
            Resp::Array(Some(items)) => items,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }
}

fn parse_resp(buf: &[u8], pos: &mut usize) -> Option<Resp> {
    let line_end = buf.get(*pos..)?.windows(2).position(|w| w == b"\r\n")? + *pos;
    let kind = buf[*pos];
    let line = String::from_utf8_lossy(&buf[*pos + 1..line_end]).into_owned();
    *pos = line_end + 2;
    Some(match kind {
        b'+' => Resp::Simple(line),
        b'-' => Resp::Error(line),
        b':' => Resp::Int(line.parse().ok()?),
        b'$' => match line.parse::<i64>().ok()? {
            n if n < 0 => Resp::Bulk(None),
            n => {
                let data = buf.get(*pos..*pos + n as usize)?.to_vec();
                *pos += n as usize + 2;
                Resp::Bulk(Some(data))
            }
        },
        b'*' => match line.parse::<i64>().ok()? {
            n if n < 0 => Resp::Array(None),
            n => {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(parse_resp(buf, pos)?);
                }
                Resp::Array(Some(items))
            }
        },
        _ => return None,
    })
}

/// A Redis on 127.0.0.1:`port` (with its password, if any).
#[derive(Clone, Debug)]
pub struct RedisAt {
    pub port: u16,
    pub password: Option<String>,
}

impl RedisAt {
    pub fn of(redis: &Redis) -> RedisAt {
        RedisAt {
            port: redis.port,
            password: redis.password.clone(),
        }
    }

    /// Sends the commands as one pipeline and returns one reply per
    /// command, error replies included. Panics on I/O errors, a reply that
    /// does not parse, or a failed AUTH.
    pub fn pipeline(&self, commands: &[Vec<String>]) -> Vec<Resp> {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))
            .unwrap_or_else(|e| panic!("connect to redis :{}: {e}", self.port));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut payload = Vec::new();
        if let Some(pw) = &self.password {
            payload.extend(resp_command(&["AUTH", pw]));
        }
        for c in commands {
            let args: Vec<&str> = c.iter().map(String::as_str).collect();
            payload.extend(resp_command(&args));
        }
        payload.extend(resp_command(&["QUIT"]));
        stream.write_all(&payload).expect("write to redis");
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).expect("read from redis");
        let mut pos = 0;
        let mut replies = Vec::new();
        while pos < buf.len() {
            match parse_resp(&buf, &mut pos) {
                Some(r) => replies.push(r),
                None => panic!("unparsable redis reply at byte {pos} of {}", buf.len()),
            }
        }
        if self.password.is_some() {
            let auth = replies.remove(0);
            assert_eq!(auth, Resp::Simple("OK".into()), "AUTH");
        }
        assert_eq!(replies.pop(), Some(Resp::Simple("OK".into())), "QUIT");
        assert_eq!(replies.len(), commands.len(), "one reply per command");
        replies
    }

    /// [`Self::pipeline`], panicking on any error reply.
    pub fn pipeline_ok(&self, commands: &[Vec<String>]) -> Vec<Resp> {
        let replies = self.pipeline(commands);
        for r in &replies {
            if let Resp::Error(e) = r {
                panic!("redis error: {e}");
            }
        }
        replies
    }

    pub fn cmd(&self, args: &[&str]) -> Resp {
        let c: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        self.pipeline(&[c]).remove(0)
    }

    /// How many of `keys` exist.
    pub fn exists(&self, keys: &[String]) -> i64 {
        let mut c = vec!["EXISTS".to_string()];
        c.extend(keys.iter().cloned());
        self.pipeline(&[c])[0].int()
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.cmd(&["GET", key]).text()
    }

    /// MGET in batches of 200 (`redissync.go` `mgetBatchSize`).
    pub fn mget(&self, keys: &[String]) -> Vec<Option<String>> {
        let mut out = Vec::with_capacity(keys.len());
        for batch in keys.chunks(200) {
            let mut c = vec!["MGET".to_string()];
            c.extend(batch.iter().cloned());
            out.extend(self.pipeline_ok(&[c])[0].items().iter().map(Resp::text));
        }
        out
    }

    /// SETEX of many keys in pipelined chunks of 25 (`setexChunkSize`).
    pub fn setex_many(&self, entries: &[(String, String)], ttl_secs: u64) {
        for chunk in entries.chunks(25) {
            let commands: Vec<Vec<String>> = chunk
                .iter()
                .map(|(k, v)| vec!["SETEX".into(), k.clone(), ttl_secs.to_string(), v.clone()])
                .collect();
            self.pipeline_ok(&commands);
        }
    }

    /// Remaining TTL in seconds (-2: no key, -1: no TTL).
    pub fn ttl(&self, key: &str) -> i64 {
        self.cmd(&["TTL", key]).int()
    }

    /// Every key matching `pattern`, by SCAN (COUNT 500, `scanCount`).
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        let mut cursor = "0".to_string();
        let mut keys = Vec::new();
        loop {
            let reply = self.cmd(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "500"]);
            let items = reply.items();
            cursor = items[0].text().expect("SCAN cursor");
            keys.extend(items[1].items().iter().filter_map(Resp::text));
            if cursor == "0" {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }
}
