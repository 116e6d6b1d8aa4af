//! A counting TCP relay in front of redis-server: Envoy's Redis cluster points
//! at it, so every byte of the filter's sync traffic passes through and is
//! parsed as RESP. Redis's own `INFO stats` counts everything (our probes
//! too) and cannot tell a push from a pull; the relay can.
//!
//! One bridge call is one TCP connection (a pipeline ending with `QUIT`).
//! A call is classed by its first command other than `AUTH`: `write`
//! (SETEX, DEL, XADD, EXPIRE, SET) or `read` (SCAN, MGET, XRANGE, ...), and
//! by the namespace in that command's key (`{prefixcache}`, `{podload}`).
//! Requests and replies are counted as they are parsed, before they are
//! relayed, so once the filter has a reply its bytes are already counted.
//!
//! Half-closes are relayed as half-closes (Envoy half-closes after the POST
//! body; closing instead would make every reply look truncated).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use harness::redis::{parse, Resp};
use serde::Serialize;

/// Traffic of one class of calls or one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Traffic {
    /// Bridge calls (connections); for a command, the calls that sent it.
    pub calls: u64,
    /// Commands, `QUIT` and `AUTH` included.
    pub commands: u64,
    /// Bytes into Redis (requests).
    pub bytes_in: u64,
    /// Bytes out of Redis (replies).
    pub bytes_out: u64,
}

impl Traffic {
    fn add(&mut self, o: &Traffic) {
        self.calls += o.calls;
        self.commands += o.commands;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
    }

    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            calls: self.calls - earlier.calls,
            commands: self.commands - earlier.commands,
            bytes_in: self.bytes_in - earlier.bytes_in,
            bytes_out: self.bytes_out - earlier.bytes_out,
        }
    }
}

/// Everything counted so far.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    /// By call class, e.g. `write prefixcache`, `read podload`.
    pub by_class: BTreeMap<String, Traffic>,
    /// By command name (`SETEX`, `MGET`, ...).
    pub by_command: BTreeMap<String, Traffic>,
}

impl Counts {
    /// One class, zero if never seen.
    pub fn class(&self, name: &str) -> Traffic {
        self.by_class.get(name).copied().unwrap_or_default()
    }

    /// All calls.
    pub fn total(&self) -> Traffic {
        let mut t = Traffic::default();
        for c in self.by_class.values() {
            t.add(c);
        }
        t
    }

    /// `self - earlier`, per class and per command.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let diff = |now: &BTreeMap<String, Traffic>, then: &BTreeMap<String, Traffic>| {
            now.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.since(&then.get(k).copied().unwrap_or_default()),
                    )
                })
                .filter(|(_, v)| *v != Traffic::default())
                .collect()
        };
        Counts {
            by_class: diff(&self.by_class, &earlier.by_class),
            by_command: diff(&self.by_command, &earlier.by_command),
        }
    }
}

/// A running relay; stops accepting when dropped (open calls finish).
pub struct RedisMeter {
    pub port: u16,
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<Counts>>,
}

impl RedisMeter {
    /// Listens on a free loopback port and relays to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> io::Result<RedisMeter> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(Counts::default()));
        let (flag, shared) = (stop.clone(), counts.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let shared = shared.clone();
                thread::spawn(move || {
                    let _ = relay(client, upstream, &shared);
                });
            }
        });
        Ok(RedisMeter { port, stop, counts })
    }

    /// A copy of the counts so far.
    pub fn snapshot(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for RedisMeter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

/// What one connection has sent so far: its class once known, and the
/// commands whose replies are still to come.
#[derive(Default)]
struct Call {
    class: Option<String>,
    /// (command, class it was counted in), in sending order.
    pending: VecDeque<(String, String)>,
}

const WRITES: &[&str] = &["SETEX", "SET", "DEL", "XADD", "EXPIRE"];

fn relay(client: TcpStream, upstream: u16, counts: &Arc<Mutex<Counts>>) -> io::Result<()> {
    let server = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream))?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let call = Arc::new(Mutex::new(Call::default()));
    let replies = {
        let (from, to) = (server.try_clone()?, client.try_clone()?);
        let (call, counts) = (call.clone(), counts.clone());
        thread::spawn(move || {
            pump(from, to, &mut |frame, len| {
                on_reply(&call, &counts, frame, len)
            })
        })
    };
    let mut on_request = |frame: &Resp, len: usize| on_request(&call, counts, frame, len);
    let sent = pump(client, server, &mut on_request);
    let _ = replies.join();
    sent
}

/// Relays `from` to `to` until EOF, handing every complete RESP frame (and
/// its wire length) to `seen` before relaying the bytes that complete it;
/// then half-closes `to`. Bytes that do not parse are relayed uncounted.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    seen: &mut dyn FnMut(&Resp, usize),
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut broken = false;
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !broken {
            buf.extend_from_slice(&chunk[..n]);
            loop {
                match parse(&buf) {
                    Ok(Some((frame, used))) => {
                        seen(&frame, used);
                        buf.drain(..used);
                    }
                    Ok(None) => break,
                    Err(_) => {
                        broken = true;
                        buf.clear();
                        break;
                    }
                }
            }
        }
        if to.write_all(&chunk[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    Ok(())
}

fn on_request(call: &Mutex<Call>, counts: &Mutex<Counts>, frame: &Resp, len: usize) {
    let args: Vec<&[u8]> = match frame {
        Resp::Array(Some(items)) => items.iter().filter_map(Resp::bytes).collect(),
        _ => Vec::new(),
    };
    let name = args
        .first()
        .map(|a| String::from_utf8_lossy(a).to_ascii_uppercase())
        .unwrap_or_else(|| "?".into());
    let mut call = call.lock().unwrap_or_else(|e| e.into_inner());
    let first = call.class.is_none() && name != "AUTH";
    if first {
        let kind = if WRITES.contains(&name.as_str()) {
            "write"
        } else {
            "read"
        };
        call.class = Some(format!("{kind} {}", namespace_of(&name, &args)));
    }
    let class = call.class.clone().unwrap_or_else(|| "auth".into());
    call.pending.push_back((name.clone(), class.clone()));
    drop(call);
    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
    let t = Traffic {
        calls: u64::from(first),
        commands: 1,
        bytes_in: len as u64,
        bytes_out: 0,
    };
    c.by_class.entry(class).or_default().add(&t);
    c.by_command.entry(name).or_default().add(&t);
}

fn on_reply(call: &Mutex<Call>, counts: &Mutex<Counts>, _frame: &Resp, len: usize) {
    let (name, class) = call
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pending
        .pop_front()
        .unwrap_or_else(|| ("?".into(), "?".into()));
    let t = Traffic {
        bytes_out: len as u64,
        ..Traffic::default()
    };
    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
    c.by_class.entry(class).or_default().add(&t);
    c.by_command.entry(name).or_default().add(&t);
}

/// The namespace a command's key names: the hash tag between `{` and `}` of
/// its key (for SCAN, of its MATCH pattern); `-` when there is none.
fn namespace_of(name: &str, args: &[&[u8]]) -> String {
    let key = if name == "SCAN" {
        args.iter()
            .position(|a| a.eq_ignore_ascii_case(b"MATCH"))
            .and_then(|i| args.get(i + 1))
    } else {
        args.get(1)
    };
    let Some(key) = key else {
        return "-".into();
    };
    let key = String::from_utf8_lossy(key);
    match (key.find('{'), key.find('}')) {
        (Some(a), Some(b)) if a < b => key[a + 1..b].to_string(),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness::redis::encode;

    #[test]
    fn namespace_comes_from_the_hash_tag_of_the_key_or_the_scan_pattern() {
        let scan: Vec<&[u8]> = vec![b"SCAN", b"0", b"MATCH", b"aibrix:{prefixcache}:e:*"];
        assert_eq!(namespace_of("SCAN", &scan), "prefixcache");
        let setex: Vec<&[u8]> = vec![b"SETEX", b"aibrix:{podload}:e:r1", b"120", b"v"];
        assert_eq!(namespace_of("SETEX", &setex), "podload");
        assert_eq!(namespace_of("QUIT", &[b"QUIT".as_slice()]), "-");
    }

    #[test]
    fn calls_are_classed_by_their_first_command_and_counted_both_ways() {
        let (call, counts) = (Mutex::new(Call::default()), Mutex::new(Counts::default()));
        for args in [
            vec![b"AUTH".as_slice(), b"pw"],
            vec![b"SETEX", b"p:{prefixcache}:e:1", b"120", b"{}"],
            vec![b"QUIT"],
        ] {
            let mut wire = Vec::new();
            encode(&mut wire, &args);
            let (frame, used) = parse(&wire).unwrap().unwrap();
            on_request(&call, &counts, &frame, used);
        }
        for _ in 0..3 {
            on_reply(&call, &counts, &Resp::Simple("OK".into()), 5);
        }
        let c = counts.lock().unwrap();
        let w = c.class("write prefixcache");
        assert_eq!((w.calls, w.commands, w.bytes_out), (1, 2, 10));
        assert_eq!(c.class("auth").commands, 1);
        assert_eq!(c.total().bytes_out, 15);
        assert_eq!(c.by_command["SETEX"].commands, 1);
    }
}
