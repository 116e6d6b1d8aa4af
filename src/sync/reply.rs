//! Decoding of the Redis replies the engine expects: whole pipelines
//! (AUTH/QUIT stripped, errors surfaced) and stream ranges.

use crate::sync::resp::{parse_pipeline_reply, Frame, ReplyError};

use super::cmd::{LOG_IDS, LOG_ORIGIN};
use super::error::{CallFailed, SyncError};

/// An error reply among `frames` fails them (the first one is named).
pub(crate) fn check_errors(frames: Vec<Frame>) -> Result<Vec<Frame>, SyncError> {
    if let Some(Frame::Error(msg)) = frames.iter().find(|f| matches!(f, Frame::Error(_))) {
        return Err(SyncError::Redis(msg.clone()));
    }
    Ok(frames)
}

/// A Redis Cluster redirection or retry reply to one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// `-MOVED slot host:port`: the slot lives on that node now (an IPv6
    /// host in brackets, as in the slot map).
    Moved { slot: u16, node: String },
    /// `-ASK slot host:port`: the slot is being migrated; ask that node
    /// once (after `ASKING`). The node is written as in `Moved`.
    Ask { node: String },
    /// `-TRYAGAIN`: a multi-key command on a slot half migrated.
    TryAgain,
}

/// The redirection an error frame carries, if any.
pub fn redirect(frame: &Frame) -> Option<Redirect> {
    let Frame::Error(msg) = frame else {
        return None;
    };
    let mut words = msg.split_ascii_whitespace();
    let kind = words.next()?;
    if kind == "TRYAGAIN" {
        return Some(Redirect::TryAgain);
    }
    let slot: u16 = words.next()?.parse().ok()?;
    let node = words.next()?;
    // host:port with a numeric port that is not 0 (as CLUSTER SLOTS is
    // read); the host may be empty (the node that answered) only in CLUSTER
    // SLOTS, never in a redirect.
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    if host.is_empty() || slot >= crate::sync::keys::SLOTS {
        return None;
    }
    // Redis writes an IPv6 node bare (`::1:7001`); kept as the slot map
    // keeps it, bracketed, for `ORIGINAL_DST`'s header.
    let node = crate::sync::topology::node_address(host, port);
    match kind {
        "MOVED" => Some(Redirect::Moved { slot, node }),
        "ASK" => Some(Redirect::Ask { node }),
        _ => None,
    }
}

/// Checks a whole pipeline reply and strips the AUTH, ASKING and QUIT
/// replies; error replies are left in place for the caller (see
/// [`check_errors`], [`redirect`]).
pub(crate) fn decode_raw(
    result: Result<&[u8], CallFailed>,
    expected: usize,
    auth: bool,
    asking: bool,
    command: &'static str,
) -> Result<Vec<Frame>, SyncError> {
    let body = result.map_err(SyncError::Transport)?;
    // Redis answers every command, so a pipeline never has an empty reply:
    // nothing came back at all. Retrying smaller (the truncation path)
    // cannot help; the call failed.
    if body.is_empty() {
        return Err(SyncError::EmptyReply { command });
    }
    let mut frames = parse_pipeline_reply(body, expected).map_err(|e| match e {
        ReplyError::Truncated { .. } => SyncError::Truncated { command },
        ReplyError::Protocol(msg) => SyncError::Protocol(msg),
    })?;
    frames.pop();
    if auth && !frames.is_empty() {
        if let Frame::Error(msg) = frames.remove(0) {
            return Err(SyncError::Auth(msg));
        }
    }
    if asking {
        // [ASKING reply, command reply] pairs: keep the commands'.
        frames = frames.into_iter().skip(1).step_by(2).collect();
    }
    Ok(frames)
}

pub(crate) struct LogEntry {
    pub(crate) id: String,
    pub(crate) origin: Option<String>,
    pub(crate) ids: String,
}

/// Parses an XRANGE/XREVRANGE reply: `[[id, [field, value, ...]], ...]`.
pub(crate) fn log_entries(frame: Frame) -> Result<Vec<LogEntry>, SyncError> {
    let items = match frame {
        Frame::Array(items) => items,
        Frame::NullArray => return Ok(Vec::new()),
        other => return Err(proto(&format!("stream range replied {other:?}"))),
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Frame::Array(mut parts) = item else {
            return Err(proto("stream entry not an array"));
        };
        if parts.len() != 2 {
            return Err(proto("stream entry is not [id, fields]"));
        }
        let fields = parts.pop();
        let id = parts.pop().and_then(|f| {
            f.as_bytes()
                .map(|b| String::from_utf8_lossy(b).into_owned())
        });
        let (Some(id), Some(Frame::Array(fields))) = (id, fields) else {
            return Err(proto("stream entry is not [id, fields]"));
        };
        let mut entry = LogEntry {
            id,
            origin: None,
            ids: String::new(),
        };
        for pair in fields.chunks(2) {
            if let [name, value] = pair {
                let value = value
                    .as_bytes()
                    .map(|b| String::from_utf8_lossy(b).into_owned());
                match (name.as_bytes(), value) {
                    (Some(LOG_ORIGIN), Some(v)) => entry.origin = Some(v),
                    (Some(LOG_IDS), Some(v)) => entry.ids = v,
                    _ => {}
                }
            }
        }
        entries.push(entry);
    }
    Ok(entries)
}

pub(crate) fn proto(msg: &str) -> SyncError {
    SyncError::Protocol(msg.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn err(msg: &str) -> Frame {
        Frame::Error(msg.into())
    }

    #[test]
    fn a_redirect_names_a_slot_and_a_reachable_node() {
        assert_eq!(
            redirect(&err("MOVED 3999 10.0.0.2:7001")),
            Some(Redirect::Moved {
                slot: 3999,
                node: "10.0.0.2:7001".into()
            })
        );
        assert_eq!(
            redirect(&err("ASK 3999 10.0.0.2:7001")),
            Some(Redirect::Ask {
                node: "10.0.0.2:7001".into()
            })
        );
        assert_eq!(
            redirect(&err("TRYAGAIN Multiple keys")),
            Some(Redirect::TryAgain)
        );
        // Redis writes an IPv6 node bare (`"%s:%d"` of its address); it is
        // kept bracketed, as the slot map keeps it from CLUSTER SLOTS, so a
        // MOVED patch names the node the way the next read of the map will.
        let from_slots = crate::sync::topology::SlotMap::parse(
            &Frame::Array(vec![Frame::Array(vec![
                Frame::Integer(0),
                Frame::Integer(16383),
                Frame::Array(vec![Frame::Bulk(b"fd00::2".to_vec()), Frame::Integer(7001)]),
            ])]),
            None,
        )
        .unwrap();
        assert_eq!(from_slots.owner(3999), Some("[fd00::2]:7001"));
        assert_eq!(
            redirect(&err("MOVED 3999 fd00::2:7001")),
            Some(Redirect::Moved {
                slot: 3999,
                node: "[fd00::2]:7001".into()
            })
        );
        assert_eq!(
            redirect(&err("ASK 3999 [fd00::2]:7001")),
            Some(Redirect::Ask {
                node: "[fd00::2]:7001".into()
            })
        );
        // No such slot, no host, no port or port 0 (no node listens there),
        // not an error reply, another error: no redirection.
        for bad in [
            err("MOVED 16384 10.0.0.2:7001"),
            err("MOVED 3999 :7001"),
            err("MOVED 3999 10.0.0.2"),
            err("MOVED 3999 10.0.0.2:x"),
            err("MOVED 3999 10.0.0.2:0"),
            err("ASK 3999 10.0.0.2:0"),
            err("MOVED 3999"),
            err("CLUSTERDOWN The cluster is down"),
            Frame::Simple("MOVED 3999 10.0.0.2:7001".into()),
        ] {
            assert_eq!(redirect(&bad), None, "{bad:?}");
        }
    }
}
