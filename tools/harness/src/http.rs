//! A small HTTP client: one request per connection, any status a reply.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;

/// Generous: the tests assert outcomes, never latencies.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A response of any status.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The pod that answered (`x-served-by`).
    pub fn served_by(&self) -> String {
        self.header("x-served-by")
            .unwrap_or_else(|| panic!("no x-served-by header: {self:?}"))
            .to_string()
    }

    /// The prompt tokens the pod reported cached
    /// (`usage.prompt_tokens_details.cached_tokens` of a non-streamed answer).
    pub fn cached_tokens(&self) -> u64 {
        let v: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("answer not JSON ({e}): {}", self.body));
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens in {}", self.body))
    }

    /// The filter's match percent (`x-prefix-match`, the header the configs set).
    pub fn match_percent(&self) -> u32 {
        let raw = self
            .header("x-prefix-match")
            .unwrap_or_else(|| panic!("no x-prefix-match header: {self:?}"));
        raw.trim()
            .parse()
            .unwrap_or_else(|_| panic!("x-prefix-match not an integer: {raw:?}"))
    }

    /// Asserts a 200 from a pod and returns the pod's name.
    pub fn expect_pod(&self) -> String {
        assert_eq!(self.status, 200, "expected 200 from a pod, got {self:?}");
        self.served_by()
    }
}

/// Sends one request on a new connection. 4xx/5xx are replies, not errors;
/// transport failures (refused, reset, timeout) are errors.
pub fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Reply, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(timeout)
        .max_idle_connections(0)
        .build();
    let mut request = agent.request(method, url);
    for (k, v) in headers {
        request = request.set(k, v);
    }
    let result = match body {
        Some(bytes) => request.send_bytes(bytes),
        None => request.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(t)) => return Err(t.to_string()),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .filter_map(|name| {
            let value = response.header(&name)?.to_string();
            Some((name.to_ascii_lowercase(), value))
        })
        .collect();
    let mut body = String::new();
    response
        .into_reader()
        .read_to_string(&mut body)
        .map_err(|e| format!("read body: {e}"))?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// GET with the default timeout.
pub fn get(url: &str) -> Result<Reply, String> {
    send("GET", url, &[], None, Duration::from_secs(5))
}
