//! Loopback ports: the placeholders the shipped configs use, and free ports
//! to put in their place.

use std::collections::BTreeSet;
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Reserved placeholder port numbers used in `envoy/*.yaml` (docs/CONTRACTS.md).
pub const PLACEHOLDER_LISTENER: u16 = 18080;
pub const PLACEHOLDER_ADMIN: u16 = 18901;
pub const PLACEHOLDER_PODS: [u16; 4] = [18001, 18002, 18003, 18004];
pub const PLACEHOLDER_REDIS_BRIDGE: u16 = 18379;
pub const PLACEHOLDER_REDIS: u16 = 16379;

static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// [`free_port`]'s random state (0: not seeded yet).
static PORT_RNG: Mutex<u64> = Mutex::new(0);

/// A loopback port that was free a moment ago and that this process has not
/// handed out before (tests in one binary run in parallel).
///
/// Picked at random below the kernel's ephemeral range when that leaves
/// room (`listen_range`): a port from that range (`bind` to port 0) can
/// be taken, between this call and its server's `bind`, by any outgoing
/// connection on the machine (an Envoy's to its pods), and the server
/// then fails to start.
pub fn free_port() -> u16 {
    let range = listen_range();
    for _ in 0..1_000 {
        let port = match range {
            Some((low, high)) => low + (next_random() % u64::from(high - low)) as u16,
            None => {
                let listener =
                    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
                listener.local_addr().expect("local_addr").port()
            }
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return port;
        }
    }
    panic!("no free loopback port after 1000 tries");
}

/// The ports [`free_port`] picks from: 10000 up to the start of the
/// kernel's ephemeral range (`ip_local_port_range`), if that starts above
/// 12000; else None (ports come from `bind` to port 0).
fn listen_range() -> Option<(u16, u16)> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = text.split_whitespace().next()?.parse().ok()?;
    (low > 12_000).then_some((10_000, low))
}

/// The next of a xorshift sequence seeded by the process id and the time
/// (processes started together are unlikely to pick the same ports; each
/// process keeps only its own from repeating, [`HANDED_OUT`]).
fn next_random() -> u64 {
    let mut state = PORT_RNG.lock().unwrap_or_else(|e| e.into_inner());
    if *state == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        *state = (u64::from(std::process::id()) << 32 ^ nanos) | 1;
    }
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// The ports one Envoy instance and its pods use in a test.
#[derive(Clone, Debug)]
pub struct Ports {
    pub listener: u16,
    pub admin: u16,
    pub pods: [u16; 4],
    pub redis_bridge: u16,
    pub redis: u16,
}

impl Ports {
    /// A fresh free port for every placeholder.
    pub fn free() -> Ports {
        Ports {
            listener: free_port(),
            admin: free_port(),
            pods: [free_port(), free_port(), free_port(), free_port()],
            redis_bridge: free_port(),
            redis: free_port(),
        }
    }

    pub(crate) fn substitution(&self, placeholder: u16) -> Option<u16> {
        match placeholder {
            PLACEHOLDER_LISTENER => Some(self.listener),
            PLACEHOLDER_ADMIN => Some(self.admin),
            PLACEHOLDER_REDIS_BRIDGE => Some(self.redis_bridge),
            PLACEHOLDER_REDIS => Some(self.redis),
            p => PLACEHOLDER_PODS
                .iter()
                .position(|&q| q == p)
                .map(|i| self.pods[i]),
        }
    }
}
