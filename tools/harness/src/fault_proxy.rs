//! A TCP proxy that can be told to misbehave, in front of Redis or an admin.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

/// A TCP proxy in front of a server (Redis, Envoy's admin) that can be told to misbehave:
/// hold every chunk of the server's replies for a while (slower than the
/// sync's call timeout), answer garbage instead of forwarding (open
/// connections are closed when garbage is turned on), or close both
/// directions when the client half-closes, as some middleboxes do (what the
/// server had not answered by then is lost). Its threads end with the test
/// process; connections end when either side closes.
pub struct FaultProxy {
    pub port: u16,
    /// Milliseconds each server -> client chunk is held (0 = none).
    delay_ms: std::sync::Arc<AtomicU32>,
    /// Close both directions on the client's half-close (1) instead of
    /// passing it on (0).
    close_on_half_close: std::sync::Arc<AtomicU32>,
    /// When set, the server is never reached: each connection gets this
    /// reply once, then is closed.
    garbage: std::sync::Arc<Mutex<Option<Vec<u8>>>>,
}

impl FaultProxy {
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind fault proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let delay_ms = std::sync::Arc::new(AtomicU32::new(0));
        let close_on_half_close = std::sync::Arc::new(AtomicU32::new(0));
        let garbage = std::sync::Arc::new(Mutex::new(None::<Vec<u8>>));
        let (d, c, g) = (
            delay_ms.clone(),
            close_on_half_close.clone(),
            garbage.clone(),
        );
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (d, c, g) = (d.clone(), c.clone(), g.clone());
                let close = c.load(Ordering::SeqCst) != 0;
                thread::spawn(move || proxy_one(client, upstream, &d, close, &g));
            }
        });
        FaultProxy {
            port,
            delay_ms,
            close_on_half_close,
            garbage,
        }
    }

    /// New connections close both directions on the client's half-close.
    pub fn set_close_on_half_close(&self, on: bool) {
        self.close_on_half_close
            .store(u32::from(on), Ordering::SeqCst);
    }

    pub fn set_delay(&self, delay: Duration) {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn set_garbage(&self, reply: Option<&[u8]>) {
        *self.garbage.lock().expect("garbage lock") = reply.map(<[u8]>::to_vec);
    }
}

fn proxy_one(
    mut client: TcpStream,
    upstream: u16,
    delay: &AtomicU32,
    close_on_half_close: bool,
    garbage: &Mutex<Option<Vec<u8>>>,
) {
    let junk = garbage.lock().map(|g| g.clone()).unwrap_or(None);
    if let Some(junk) = junk {
        let mut buf = [0u8; 4096];
        let _ = client.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = client.read(&mut buf);
        let _ = client.write_all(&junk);
        return;
    }
    let Ok(mut server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream)) else {
        return;
    };
    let (Ok(mut client_w), Ok(mut server_r)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    // client -> server, passing the half-close on as the bridge does (or
    // closing everything, the middlebox that does not).
    let closed = std::sync::Arc::new(AtomicU32::new(0));
    let closed_up = closed.clone();
    let up = thread::spawn(move || {
        let _ = std::io::copy(&mut client, &mut server);
        if close_on_half_close {
            closed_up.store(1, Ordering::SeqCst);
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
        } else {
            let _ = server.shutdown(std::net::Shutdown::Write);
        }
    });
    let mut buf = [0u8; 16 * 1024];
    // Poll so that turning garbage on also ends pooled connections.
    let _ = server_r.set_read_timeout(Some(Duration::from_millis(100)));
    loop {
        match server_r.read(&mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if garbage.lock().map(|g| g.is_some()).unwrap_or(false) {
                    break;
                }
            }
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let ms = delay.load(Ordering::SeqCst);
                if ms > 0 {
                    thread::sleep(Duration::from_millis(u64::from(ms)));
                }
                if closed.load(Ordering::SeqCst) != 0 || client_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = client_w.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}

// A whole setup: pods + Envoy
