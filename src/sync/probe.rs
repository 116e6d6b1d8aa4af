//! A small health probe of Redis, outside the sync cycles: `INFO server`
//! (after `AUTH` when configured). The singleton's loop
//! ([`super::supervisor`]) sends it every few seconds while sync is backing
//! off, so a recovered Redis is used at once instead of after up to 60 s of
//! backoff, and now and then while healthy. Its `run_id` changes when Redis
//! restarts: Redis may then have lost every key, so the loop re-marks the
//! local table for a full push.

use crate::sync::resp::{parse_pipeline_reply, Frame, Pipeline};

use super::cmd;
use super::settings::SyncSettings;

/// The probe pipeline and the number of replies to expect.
pub(crate) fn body(settings: &SyncSettings) -> (Vec<u8>, usize) {
    let mut p = Pipeline::new();
    if let Some(pw) = &settings.auth_password {
        cmd::auth(&mut p, settings.auth_username.as_deref(), pw);
    }
    p.push(&[b"INFO", b"server"]);
    p.finish()
}

/// The server's `run_id` from a complete probe reply; None for anything
/// else (error, truncation, garbage).
pub(crate) fn run_id(reply: &[u8], expected: usize) -> Option<String> {
    let frames = parse_pipeline_reply(reply, expected).ok()?;
    // The INFO reply is the one before QUIT's +OK.
    let info = match frames.get(expected.checked_sub(2)?)? {
        Frame::Bulk(b) => b.as_slice(),
        _ => return None,
    };
    let text = std::str::from_utf8(info).ok()?;
    let id = text.lines().find_map(|l| l.strip_prefix("run_id:"))?.trim();
    (!id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn bulk(s: &str) -> String {
        format!("${}\r\n{s}\r\n", s.len())
    }

    #[test]
    fn run_id_is_read_from_a_complete_reply_only() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:4a1b2c3d\r\ntcp_port:6379\r\n";
        let reply = format!("{}+OK\r\n", bulk(info));
        assert_eq!(run_id(reply.as_bytes(), 2), Some("4a1b2c3d".into()));
        // With AUTH first.
        let reply = format!("+OK\r\n{}+OK\r\n", bulk(info));
        assert_eq!(run_id(reply.as_bytes(), 3), Some("4a1b2c3d".into()));
        // Truncated (no final +OK), an error, garbage, a hostile id.
        assert_eq!(run_id(bulk(info).as_bytes(), 2), None);
        assert_eq!(
            run_id(b"-NOAUTH Authentication required.\r\n+OK\r\n", 2),
            None
        );
        assert_eq!(run_id(b"\x00\xffgarbage", 2), None);
        let odd = format!("{}+OK\r\n", bulk("run_id:../../etc\r\n"));
        assert_eq!(run_id(odd.as_bytes(), 2), None);
        assert_eq!(run_id(b"+OK\r\n", 0), None);
    }

    #[test]
    fn body_authenticates_first_when_configured() {
        let mut s = SyncSettings::default();
        assert_eq!(body(&s).1, 2);
        s.auth_password = Some("pw".into());
        let (b, n) = body(&s);
        assert_eq!(n, 3);
        assert!(b.starts_with(b"*2\r\n$4\r\nAUTH\r\n"));
    }
}
