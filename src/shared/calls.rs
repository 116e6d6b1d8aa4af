//! Outgoing HTTP calls through Envoy (`dispatch_http_call`), as the
//! singleton's services see them: a narrow trait to send one, and why a
//! call ends without a reply body. Its replies come back by token, read
//! within a bound the service chooses.

use std::fmt;

/// Sends calls through an Envoy cluster, one `dispatch_http_call` each.
pub(crate) trait HttpCalls {
    /// Sends a request with `headers` (pseudo-headers included) and
    /// `body` to `cluster`, answered within `timeout_ms`; the call's
    /// token, or Envoy's refusal (its status in words).
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Result<u32, String>;
}

/// Why the host could not get a reply body for a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallFailed {
    /// `dispatch_http_call` itself failed.
    Dispatch(String),
    /// The bridge answered with a non-200 status.
    Status(u32),
    /// No answer in time.
    Timeout,
}

impl fmt::Display for CallFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallFailed::Dispatch(why) => write!(f, "dispatch failed: {why}"),
            CallFailed::Status(code) => write!(f, "bridge answered HTTP {code}"),
            CallFailed::Timeout => write!(f, "bridge call timed out"),
        }
    }
}
