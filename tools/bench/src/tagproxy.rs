//! A tiny HTTP/1.1 relay that names its backend: every response gets
//! `x-served-by: NAME`. It stands in front of a server that does not say who
//! answered (llama-server), so the benchmark can count requests per pod
//! through any router, the same way for all of them.
//!
//! One request per client connection (both sides get `connection: close`),
//! blocking I/O on a thread per connection, bytes relayed as they arrive (an
//! SSE stream passes chunk by chunk). Request bodies with `content-length`
//! or `transfer-encoding: chunked` are supported. Meant for a few requests
//! per second on loopback, not for load.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// A running relay; stops accepting when dropped.
pub struct TagProxy {
    pub port: u16,
    pub name: String,
    stop: Arc<AtomicBool>,
}

impl TagProxy {
    /// Listens on a free loopback port and relays to `127.0.0.1:upstream`.
    pub fn start(name: &str, upstream: u16) -> io::Result<TagProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, tag) = (stop.clone(), name.to_string());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let tag = tag.clone();
                thread::spawn(move || {
                    let _ = relay(client, upstream, &tag);
                });
            }
        });
        Ok(TagProxy {
            port,
            name: name.to_string(),
            stop,
        })
    }
}

impl Drop for TagProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

/// Reads until the end of an HTTP head (`\r\n\r\n`); returns (head, the bytes
/// read past it). None if the peer closed first.
fn read_head(s: &mut TcpStream) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > 1 << 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Header lines of a head (after the start line), as (lower-case name, value).
fn headers(head: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect()
}

/// The head with hop-by-hop connection headers replaced by
/// `connection: close`, plus `extra` header lines.
fn rewrite_head(head: &[u8], extra: &[String]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut lines: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
    lines.retain(|l| {
        let name = l
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        !matches!(
            name.as_str(),
            "connection" | "keep-alive" | "proxy-connection" | "x-served-by"
        )
    });
    let mut out = lines.join("\r\n");
    out.push_str("\r\nconnection: close");
    for e in extra {
        out.push_str("\r\n");
        out.push_str(e);
    }
    out.push_str("\r\n\r\n");
    out.into_bytes()
}

/// Reads the rest of a request body into `body` (which holds what came
/// with the head).
fn read_body(s: &mut TcpStream, hdrs: &[(String, String)], body: &mut Vec<u8>) -> io::Result<()> {
    let get = |n: &str| hdrs.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let mut chunk = [0u8; 16384];
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        // Raw chunked bytes are relayed as they are; read until the last chunk.
        while !chunked_complete(body) {
            let n = s.read(&mut chunk)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            body.extend_from_slice(&chunk[..n]);
        }
        return Ok(());
    }
    let len: usize = get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while body.len() < len {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Ok(())
}

/// Does `b` hold a complete chunked body (through the zero chunk and its
/// trailer)?
fn chunked_complete(b: &[u8]) -> bool {
    let mut i = 0;
    loop {
        let Some(eol) = find(&b[i..], b"\r\n") else {
            return false;
        };
        let size_text = String::from_utf8_lossy(&b[i..i + eol]);
        let size_text = size_text.split(';').next().unwrap_or("").trim().to_string();
        let Ok(size) = usize::from_str_radix(&size_text, 16) else {
            return false;
        };
        i += eol + 2;
        if size == 0 {
            // Trailers end with an empty line.
            return b[i..].starts_with(b"\r\n") || find(&b[i..], b"\r\n\r\n").is_some();
        }
        if b.len() < i + size + 2 {
            return false;
        }
        i += size + 2;
    }
}

fn relay(mut client: TcpStream, upstream: u16, tag: &str) -> io::Result<()> {
    client.set_nodelay(true)?;
    client.set_read_timeout(Some(Duration::from_secs(600)))?;
    let Some((head, mut body)) = read_head(&mut client)? else {
        return Ok(());
    };
    read_body(&mut client, &headers(&head), &mut body)?;
    let mut up = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream))?;
    up.set_nodelay(true)?;
    up.write_all(&rewrite_head(&head, &[]))?;
    up.write_all(&body)?;
    let Some((resp_head, rest)) = read_head(&mut up)? else {
        return Ok(());
    };
    client.write_all(&rewrite_head(&resp_head, &[format!("x-served-by: {tag}")]))?;
    client.write_all(&rest)?;
    let mut buf = [0u8; 16384];
    loop {
        let n = up.read(&mut buf)?;
        if n == 0 {
            break;
        }
        client.write_all(&buf[..n])?;
    }
    let _ = client.shutdown(Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_rewrite_replaces_connection_headers() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n";
        let out = String::from_utf8(rewrite_head(head, &["x-served-by: a".into()])).unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nconnection: close\r\nx-served-by: a\r\n\r\n"
        );
    }

    #[test]
    fn chunked_body_completion() {
        assert!(!chunked_complete(b"5\r\nhello\r\n"));
        assert!(chunked_complete(b"5\r\nhello\r\n0\r\n\r\n"));
        assert!(!chunked_complete(b"5\r\nhel"));
        assert!(chunked_complete(b"0\r\n\r\n"));
    }

    #[test]
    fn relays_and_tags_a_response() {
        // A one-shot upstream that echoes the request body length.
        let up = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let up_port = up.local_addr().unwrap().port();
        let server = thread::spawn(move || {
            let (mut s, _) = up.accept().unwrap();
            let (head, mut body) = read_head(&mut s).unwrap().unwrap();
            read_body(&mut s, &headers(&head), &mut body).unwrap();
            let text = String::from_utf8_lossy(&head).to_string();
            assert!(text.contains("connection: close"));
            let reply = format!("got {}", body.len());
            write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{reply}",
                reply.len()
            )
            .unwrap();
        });
        let proxy = TagProxy::start("pod-x", up_port).unwrap();
        let mut c = TcpStream::connect((Ipv4Addr::LOCALHOST, proxy.port)).unwrap();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            .unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        server.join().unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("x-served-by: pod-x\r\n"), "{reply}");
        assert!(reply.ends_with("got 5"), "{reply}");
    }
}
