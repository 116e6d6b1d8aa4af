//! Requests the filter cannot route (bad bodies, other methods and paths, too
//! large) still reach a pod, and each is counted under its passthrough reason.
//! The filter never answers or drops a request itself: the pod decides.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{chat_body, completion_body, send, text, wait_until, Setup, CLIENT_TIMEOUT};
use serde_json::json;

fn passthrough_total(stats: &BTreeMap<String, i64>) -> i64 {
    stats
        .iter()
        .filter(|(k, _)| k.starts_with("prefix_router.passthrough."))
        .map(|(_, v)| v)
        .sum()
}

/// One request the filter must pass through, and the reason it must count
/// (`None`: any passthrough reason).
struct Case {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    body: Option<Vec<u8>>,
    reason: Option<&'static str>,
}

impl Case {
    fn post(
        what: &'static str,
        path: &'static str,
        body: &[u8],
        reason: Option<&'static str>,
    ) -> Case {
        Case {
            what,
            method: "POST",
            path,
            body: Some(body.to_vec()),
            reason,
        }
    }
}

#[test]
fn malformed_bodies_still_reach_a_pod() {
    let run = Setup::new("single.yaml")
        .plugin_field("max_body_bytes", json!(4096))
        .start();
    let huge = completion_body(&json!(text(60, 10_000)));
    let cases = [
        Case::post(
            "non-JSON",
            "/v1/completions",
            b"hello, not json",
            Some("not_json"),
        ),
        Case::post(
            "truncated JSON",
            "/v1/completions",
            br#"{"model":"m","prompt":"abc"#,
            Some("not_json"),
        ),
        Case::post(
            "invalid UTF-8",
            "/v1/completions",
            &[0xff, 0xfe, 0x00, 0x7b],
            Some("not_json"),
        ),
        Case::post(
            "missing prompt",
            "/v1/completions",
            br#"{"model":"m","max_tokens":4}"#,
            Some("no_prompt"),
        ),
        Case::post(
            "chat without messages",
            "/v1/chat/completions",
            br#"{"model":"m"}"#,
            Some("no_prompt"),
        ),
        Case {
            what: "GET on an inference path",
            method: "GET",
            path: "/v1/completions",
            body: None,
            reason: Some("method"),
        },
        Case::post(
            "unknown path",
            "/not/an/inference/path",
            completion_body(&json!("hi")).as_bytes(),
            Some("path"),
        ),
        // Either not_json or no_prompt is a fair reading of an empty body.
        Case::post("empty body", "/v1/completions", b"", None),
        Case::post(
            "body over max_body_bytes",
            "/v1/completions",
            huge.as_bytes(),
            Some("body_too_large"),
        ),
    ];
    for Case {
        what,
        method,
        path,
        body,
        reason,
    } in cases
    {
        let before = run.envoy.settled_router_stats();
        let url = run.envoy.url(path);
        let reply = send(
            method,
            &url,
            &[("content-type", "application/json")],
            body.as_deref(),
            CLIENT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        // podsim answers bad requests like a real server (400, 404, ...); what
        // matters is that a pod answered, not Envoy (503, 413) or the filter.
        assert!(
            reply.header("x-served-by").is_some() && reply.status < 500,
            "{what}: did not reach a pod: {reply:?}"
        );
        // One request, one pass-through count, flushed on the next tick.
        let mut after = run.envoy.router_stats();
        wait_until(Duration::from_secs(5), || {
            after = run.envoy.router_stats();
            passthrough_total(&after) > passthrough_total(&before)
        });
        assert!(
            passthrough_total(&after) > passthrough_total(&before),
            "{what}: no passthrough counted: {after:?}"
        );
        if let Some(reason) = reason {
            let name = format!("prefix_router.passthrough.{reason}");
            let (b, a) = (
                before.get(&name).copied().unwrap_or(0),
                after.get(&name).copied().unwrap_or(0),
            );
            assert!(a > b, "{what}: {name} did not move: {after:?}");
        }
    }
}

/// Issue 9, item 6: with Envoy's default 1 MiB buffer limit and the filter's
/// default `max_body_bytes`, a 3.3 MB chat body must get what plain Envoy
/// gives it (200), not a 413 from buffering it for routing.
#[test]
fn a_body_above_envoys_default_buffer_limit_passes_through() {
    let run = Setup::new("single.yaml")
        .patch(|config| {
            config.as_object_mut().unwrap().remove("max_body_bytes");
        })
        .edit_yaml(
            "      per_connection_buffer_limit_bytes: 16777216\n      filter_chains:",
            "      filter_chains:",
        )
        .start();
    let long = text(61, 3_300_000);
    let body = chat_body(&[("user", long.as_str())]);
    let reply = run.post("/v1/chat/completions", &body);
    assert_eq!(
        reply.status,
        200,
        "{}",
        &reply.body[..reply.body.len().min(300)]
    );
    assert_eq!(
        run.envoy
            .router_stat_reaching("prefix_router.passthrough.body_too_large", 1),
        1
    );
}
