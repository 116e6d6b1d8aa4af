//! A small RESP2 client of its own, independent of the filter's codec (which
//! is what the tests check): commands encoded as arrays of bulk strings,
//! replies parsed incrementally. [`Conn`] keeps one connection open (AUTH
//! first when a password is set) for pipelines of binary commands, as the
//! bench's loaders and peers need; [`RedisAt`] opens one per pipeline and ends
//! it with QUIT, as the tests' checks do.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use std::process::{Command, Stdio};

use crate::paths::redis_server_bin;
use crate::process::{spawn_owned, tail, wait_until, Owned, STARTUP_TIMEOUT};
use crate::test_dir::TestDir;

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

    /// The bytes of a bulk or simple string (`None` for anything else).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Resp::Bulk(Some(b)) => Some(b),
            Resp::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    pub fn items(&self) -> &[Resp] {
        match self {
            Resp::Array(Some(items)) => items,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }
}

/// Appends one command, an array of bulk strings, to `out`.
pub fn encode<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) {
    out.extend(format!("*{}\r\n", args.len()).into_bytes());
    for a in args {
        let a = a.as_ref();
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one frame at the start of `buf`: `Ok(Some((frame, bytes used)))`,
/// `Ok(None)` while it is incomplete, `Err` when it is not RESP2.
pub fn parse(buf: &[u8]) -> Result<Option<(Resp, usize)>, String> {
    let mut pos = 0;
    Ok(parse_at(buf, &mut pos)?.map(|frame| (frame, pos)))
}

fn parse_at(buf: &[u8], pos: &mut usize) -> Result<Option<Resp>, String> {
    let rest = buf.get(*pos..).unwrap_or_default();
    let Some(line_len) = rest.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, line)) = rest[..line_len].split_first() else {
        return Err(format!("empty line at byte {pos}"));
    };
    let line = String::from_utf8_lossy(line).into_owned();
    let number = |line: &str| {
        line.parse::<i64>()
            .map_err(|_| format!("bad length or integer {line:?}"))
    };
    *pos += line_len + 2;
    Ok(Some(match kind {
        b'+' => Resp::Simple(line),
        b'-' => Resp::Error(line),
        b':' => Resp::Int(number(&line)?),
        b'$' => match usize::try_from(number(&line)?) {
            Err(_) => Resp::Bulk(None),
            Ok(n) => {
                let Some(data) = buf.get(*pos..*pos + n + 2) else {
                    return Ok(None);
                };
                if !data.ends_with(b"\r\n") {
                    return Err(format!("bulk string of {n} bytes not ended by CRLF"));
                }
                *pos += n + 2;
                Resp::Bulk(Some(data[..n].to_vec()))
            }
        },
        b'*' => match usize::try_from(number(&line)?) {
            Err(_) => Resp::Array(None),
            Ok(n) => {
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    match parse_at(buf, pos)? {
                        Some(item) => items.push(item),
                        None => return Ok(None),
                    }
                }
                Resp::Array(Some(items))
            }
        },
        other => return Err(format!("unknown frame type {:?}", other as char)),
    }))
}

/// One open connection to a Redis on 127.0.0.1.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Connects (and AUTHs, when `password` is set).
    pub fn open(port: u16, password: Option<&str>) -> io::Result<Conn> {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
        };
        if let Some(pw) = password {
            let reply = conn.send(&[cmd(&[b"AUTH", pw.as_bytes()])])?;
            if reply != [Resp::Simple("OK".into())] {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("AUTH: {reply:?}"),
                ));
            }
        }
        Ok(conn)
    }

    /// [`Conn::open`] without a password, panicking when it fails.
    pub fn connect(port: u16) -> Conn {
        Conn::open(port, None).unwrap_or_else(|e| panic!("connect to redis :{port}: {e}"))
    }

    /// Sends `commands` in one write and reads one reply per command, in
    /// order (error replies included).
    pub fn send(&mut self, commands: &[Vec<Vec<u8>>]) -> io::Result<Vec<Resp>> {
        let mut out = Vec::new();
        for c in commands {
            encode(&mut out, c);
        }
        self.stream.write_all(&out)?;
        let mut replies = Vec::with_capacity(commands.len());
        let mut chunk = vec![0u8; 64 * 1024];
        while replies.len() < commands.len() {
            match parse(&self.buf) {
                Ok(Some((frame, used))) => {
                    self.buf.drain(..used);
                    replies.push(frame);
                }
                Ok(None) => {
                    let n = self.stream.read(&mut chunk)?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
        Ok(replies)
    }

    /// [`Conn::send`], panicking on an I/O or protocol error.
    pub fn pipeline(&mut self, commands: &[Vec<Vec<u8>>]) -> Vec<Resp> {
        self.send(commands)
            .unwrap_or_else(|e| panic!("redis pipeline: {e}"))
    }

    /// [`Conn::pipeline`], panicking on any error reply too.
    pub fn pipeline_ok(&mut self, commands: &[Vec<Vec<u8>>]) -> Vec<Resp> {
        let replies = self.pipeline(commands);
        if let Some(Resp::Error(e)) = replies.iter().find(|r| matches!(r, Resp::Error(_))) {
            panic!("redis error: {e}");
        }
        replies
    }

    /// One command.
    pub fn command(&mut self, args: &[&[u8]]) -> Resp {
        self.pipeline(&[cmd(args)]).remove(0)
    }
}

/// A command from its parts, as [`Conn::send`] takes it.
pub fn cmd(parts: &[&[u8]]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.to_vec()).collect()
}

/// A command from text parts.
pub fn text_cmd<S: AsRef<str>>(parts: &[S]) -> Vec<Vec<u8>> {
    parts
        .iter()
        .map(|p| p.as_ref().as_bytes().to_vec())
        .collect()
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

    /// An open connection (AUTHed when a password is set).
    pub fn connect(&self) -> Conn {
        Conn::open(self.port, self.password.as_deref())
            .unwrap_or_else(|e| panic!("connect to redis :{}: {e}", self.port))
    }

    /// Sends the commands as one pipeline on a connection of its own, QUIT
    /// last, and returns one reply per command, error replies included.
    /// Panics on I/O errors, a reply that does not parse, or a failed AUTH.
    pub fn pipeline(&self, commands: &[Vec<String>]) -> Vec<Resp> {
        let mut all: Vec<Vec<Vec<u8>>> = commands.iter().map(|c| text_cmd(c)).collect();
        all.push(cmd(&[b"QUIT"]));
        let mut replies = self.connect().pipeline(&all);
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

/// A running `redis-server` with no persistence.
pub struct Redis {
    proc: Owned,
    pub port: u16,
    pub password: Option<String>,
}

impl Redis {
    pub fn start(dir: &TestDir, port: u16, password: Option<&str>) -> Redis {
        Redis::start_with(dir, port, password, &[])
    }

    /// [`Redis::start`] with more redis-server arguments (e.g. a TLS port);
    /// ready when `port` answers PING.
    pub fn start_with(dir: &TestDir, port: u16, password: Option<&str>, extra: &[&str]) -> Redis {
        let mut cmd = Command::new(redis_server_bin());
        cmd.current_dir(dir.path())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--logfile", "redis.log"]);
        if let Some(pw) = password {
            cmd.args(["--requirepass", pw]);
        }
        cmd.args(extra);
        let child = spawn_owned(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .unwrap_or_else(|e| panic!("spawn {}: {e}", redis_server_bin().display()));
        let mut redis = Redis {
            proc: Owned { child },
            port,
            password: password.map(str::to_string),
        };
        let up = wait_until(STARTUP_TIMEOUT, || {
            redis.proc.exited().is_some()
                || redis
                    .command(&["PING"])
                    .is_ok_and(|r| r == Resp::Simple("PONG".into()))
        });
        assert!(
            up && redis.proc.exited().is_none(),
            "redis-server not ready on port {port}:\n{}",
            tail(&dir.join("redis.log"), 30)
        );
        redis
    }

    /// Sends one command (after AUTH when a password is set) on a
    /// connection of its own and returns its reply.
    pub fn command(&self, args: &[&str]) -> std::io::Result<Resp> {
        let mut conn = Conn::open(self.port, self.password.as_deref())?;
        Ok(conn.send(&[text_cmd(args)])?.remove(0))
    }

    /// Keys in the database (`DBSIZE`); 0 while the server does not answer.
    pub fn dbsize(&self) -> i64 {
        self.command(&["DBSIZE"]).map(|r| r.int()).unwrap_or(0)
    }

    /// Kills the server now (e.g. to test sync when Redis goes away).
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_whole_or_not_at_all() {
        let wire = b"*3\r\n$3\r\nSET\r\n$-1\r\n:42\r\n+OK\r\n";
        let array = Resp::Array(Some(vec![
            Resp::Bulk(Some(b"SET".to_vec())),
            Resp::Bulk(None),
            Resp::Int(42),
        ]));
        assert_eq!(parse(wire), Ok(Some((array, wire.len() - 5))));
        for cut in 0..wire.len() - 5 {
            assert_eq!(parse(&wire[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$2\r\nabcd").is_err());
    }

    #[test]
    fn commands_encode_as_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &cmd(&[b"GET", b"k\r\n"]));
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$3\r\nk\r\n\r\n");
        let (frame, used) = parse(&out).unwrap().unwrap();
        assert_eq!(used, out.len());
        assert_eq!(frame.items()[1].bytes(), Some(&b"k\r\n"[..]));
    }
}
