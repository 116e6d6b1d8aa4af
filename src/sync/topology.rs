//! Redis Cluster topology: which master owns which slot, read from
//! `CLUSTER SLOTS` in every cycle (cluster mode) and patched by
//! `MOVED` replies in between.

use crate::sync::keys::SLOTS;
use crate::sync::resp::Frame;

/// Most slot ranges kept from one `CLUSTER SLOTS` reply (a cluster can have
/// at most one range per slot).
const MAX_RANGES: usize = SLOTS as usize;

/// Owner of every slot that has one: `ranges` sorted by start, disjoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotMap {
    /// `(first slot, last slot, master "host:port")`.
    ranges: Vec<(u16, u16, String)>,
}

impl SlotMap {
    /// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ...],
    /// replicas...], ...]`. A master with an empty host (Redis: "the node
    /// that answered") is `asked`'s host. None for a malformed reply or one
    /// that names no usable master.
    pub fn parse(frame: &Frame, asked: Option<&str>) -> Option<Self> {
        let Frame::Array(entries) = frame else {
            return None;
        };
        let mut ranges = Vec::with_capacity(entries.len().min(MAX_RANGES));
        for entry in entries.iter().take(MAX_RANGES) {
            let Frame::Array(parts) = entry else {
                return None;
            };
            let (Some(Frame::Integer(start)), Some(Frame::Integer(end)), Some(master)) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                return None;
            };
            let (start, end) = (u16::try_from(*start).ok()?, u16::try_from(*end).ok()?);
            if start > end || end >= SLOTS {
                return None;
            }
            let Frame::Array(master) = master else {
                return None;
            };
            let host = master.first().and_then(Frame::as_bytes)?;
            let host = std::str::from_utf8(host).ok()?;
            let Some(Frame::Integer(port)) = master.get(1) else {
                return None;
            };
            let port = u16::try_from(*port).ok().filter(|p| *p > 0)?;
            let host = match host {
                "" | "?" => asked.and_then(|a| a.rsplit_once(':')).map(|(h, _)| h)?,
                h => h,
            };
            if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return None;
            }
            ranges.push((start, end, node_address(host, port)));
        }
        ranges.sort_by_key(|r| r.0);
        if ranges.is_empty() || ranges.windows(2).any(|w| w[0].1 >= w[1].0) {
            return None;
        }
        Some(Self { ranges })
    }

    /// The master owning `slot`, if known.
    pub fn owner(&self, slot: u16) -> Option<&str> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (start, end, node) = &self.ranges[i];
        (*start <= slot && slot <= *end).then_some(node.as_str())
    }

    /// A `MOVED` reply: `slot` is `node`'s now (until the next `CLUSTER
    /// SLOTS` read tells the whole picture).
    pub fn set_owner(&mut self, slot: u16, node: &str) {
        let mut out = Vec::with_capacity(self.ranges.len() + 2);
        for (start, end, owner) in self.ranges.drain(..) {
            if slot < start || slot > end {
                out.push((start, end, owner));
                continue;
            }
            if start < slot {
                out.push((start, slot - 1, owner.clone()));
            }
            if slot < end {
                out.push((slot + 1, end, owner));
            }
        }
        out.push((slot, slot, node.to_owned()));
        out.sort_by_key(|r| r.0);
        self.ranges = out;
    }

    /// The distinct masters, in slot order of their first range.
    pub fn nodes(&self) -> Vec<&str> {
        let mut nodes: Vec<&str> = Vec::new();
        for (_, _, node) in &self.ranges {
            if !nodes.contains(&node.as_str()) {
                nodes.push(node);
            }
        }
        nodes
    }
}

/// `host:port`, with an IPv6 host in brackets (what Envoy's `ORIGINAL_DST`
/// header expects).
pub(crate) fn node_address(host: &str, port: u16) -> String {
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Frame {
        Frame::Array(vec![
            Frame::Integer(start),
            Frame::Integer(end),
            Frame::Array(vec![
                Frame::Bulk(host.as_bytes().to_vec()),
                Frame::Integer(port),
                Frame::Bulk(b"id".to_vec()),
            ]),
            // A replica: ignored.
            Frame::Array(vec![
                Frame::Bulk(b"10.0.0.9".to_vec()),
                Frame::Integer(1),
                Frame::Bulk(b"id2".to_vec()),
            ]),
        ])
    }

    #[test]
    fn parses_cluster_slots_and_finds_owners() {
        let reply = Frame::Array(vec![
            range(5461, 10922, "127.0.0.1", 7001),
            range(0, 5460, "127.0.0.1", 7000),
            range(10923, 16383, "", 7002),
        ]);
        let map = SlotMap::parse(&reply, Some("10.1.1.1:7000")).unwrap();
        assert_eq!(map.owner(0), Some("127.0.0.1:7000"));
        assert_eq!(map.owner(5461), Some("127.0.0.1:7001"));
        assert_eq!(map.owner(16383), Some("10.1.1.1:7002"));
        assert_eq!(
            map.nodes(),
            vec!["127.0.0.1:7000", "127.0.0.1:7001", "10.1.1.1:7002"]
        );
        let v6 = SlotMap::parse(&Frame::Array(vec![range(0, 16383, "::1", 7000)]), None).unwrap();
        assert_eq!(v6.owner(9), Some("[::1]:7000"));
    }

    #[test]
    fn moved_patches_one_slot() {
        let reply = Frame::Array(vec![range(0, 16383, "127.0.0.1", 7000)]);
        let mut map = SlotMap::parse(&reply, None).unwrap();
        map.set_owner(100, "127.0.0.1:7001");
        assert_eq!(map.owner(99), Some("127.0.0.1:7000"));
        assert_eq!(map.owner(100), Some("127.0.0.1:7001"));
        assert_eq!(map.owner(101), Some("127.0.0.1:7000"));
        map.set_owner(100, "127.0.0.1:7002");
        assert_eq!(map.owner(100), Some("127.0.0.1:7002"));
        map.set_owner(0, "127.0.0.1:7002");
        assert_eq!(map.owner(0), Some("127.0.0.1:7002"));
        assert_eq!(map.owner(1), Some("127.0.0.1:7000"));
    }

    #[test]
    fn malformed_replies_are_refused() {
        let bad = [
            Frame::Error("ERR This instance has cluster support disabled".into()),
            Frame::Array(vec![]),
            Frame::Array(vec![range(0, 16384, "h", 1)]),
            Frame::Array(vec![range(10, 5, "h", 1)]),
            Frame::Array(vec![range(0, 10, "h", 0)]),
            Frame::Array(vec![range(0, 10, "h", 1), range(5, 20, "h", 2)]),
            Frame::Array(vec![range(0, 10, "", 1)]),
            Frame::Array(vec![Frame::Integer(1)]),
        ];
        for frame in bad {
            assert_eq!(SlotMap::parse(&frame, None), None, "{frame:?}");
        }
    }
}
