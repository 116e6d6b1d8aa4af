//! Routing behaviour through a real Envoy in front of four podsim pods:
//! prefix stickiness, spreading of new prefixes, every request shape, the
//! match-percent response header, and the decision lines at Envoy's debug
//! level.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::thread;
use std::time::Duration;

use envoy_prefix_router::shared::registry::MAX_SLOTS;
use harness::{send, text, token_ids, wait_until, Setup, CLIENT_TIMEOUT};
use serde_json::json;

#[test]
fn long_shared_prefix_sticks_to_one_pod() {
    let run = Setup::new("single.yaml").start();
    let prefix = text(1, 4096);
    let first = run
        .complete(&json!(format!("{prefix}{}", text(1000, 300))))
        .expect_pod();
    for i in 0..20 {
        let reply = run.complete(&json!(format!("{prefix}{}", text(2000 + i, 300))));
        assert_eq!(
            reply.expect_pod(),
            first,
            "request {i} left the prefix's pod"
        );
        assert!(reply.match_percent() > 0, "request {i}: {reply:?}");
    }
    assert!(
        run.envoy
            .router_stat_reaching("prefix_router.routed.prefix_match", 20)
            >= 20
    );
}

#[test]
fn large_prompt_is_buffered_and_routed() {
    // Above Envoy's default 1 MiB buffer, below the default max_body_bytes.
    let run = Setup::new("single.yaml").start();
    let prefix = text(3, 1_500_000);
    let first = run
        .complete(&json!(format!("{prefix}{}", text(3001, 500))))
        .expect_pod();
    let again = run.complete(&json!(format!("{prefix}{}", text(3002, 500))));
    assert_eq!(again.expect_pod(), first);
    assert!(again.match_percent() > 0, "{:?}", again.headers);
}

#[test]
fn distinct_prefixes_spread() {
    let run = Setup::new("single.yaml").start();
    let mut pods = BTreeSet::new();
    for i in 0..24 {
        let reply = run.complete(&json!(text(5000 + i, 2048)));
        assert_eq!(reply.match_percent(), 0, "unrelated prompt {i} matched");
        pods.insert(reply.expect_pod());
    }
    assert!(pods.len() >= 3, "24 new prefixes landed on only {pods:?}");
}

#[test]
fn chat_and_completions_both_route() {
    let run = Setup::new("single.yaml").start();

    // Chat: a conversation growing turn by turn stays on its pod.
    let system = "You are a helpful assistant.";
    let (u1, a1, u2) = (text(11, 3000), text(12, 600), text(13, 300));
    let turns = [
        ("system", system),
        ("user", u1.as_str()),
        ("assistant", a1.as_str()),
        ("user", u2.as_str()),
    ];
    let pod = run.chat(&turns[..2]).expect_pod();
    let longer = run.chat(&turns);
    assert_eq!(
        longer.expect_pod(),
        pod,
        "follow-up turn left the conversation's pod"
    );
    assert!(longer.match_percent() > 0);

    // A different first message, or the same text under another role, is
    // another conversation: nothing of it is cached anywhere.
    let other_first = text(14, 3000);
    let mut changed = turns;
    changed[0] = ("user", other_first.as_str());
    assert_eq!(
        run.chat(&changed).match_percent(),
        0,
        "first message changed"
    );
    let mut role_changed = turns;
    role_changed[0] = ("user", system);
    assert_eq!(
        run.chat(&role_changed).match_percent(),
        0,
        "first role changed"
    );

    // Completions, each prompt shape: learn, then extend.
    let string_prefix = text(21, 3000);
    let shapes = [
        (
            "string",
            json!(string_prefix.clone()),
            json!(format!("{string_prefix}{}", text(22, 400))),
        ),
        (
            "list of strings",
            json!([text(23, 3000)]),
            json!([format!("{}{}", text(23, 3000), text(24, 400))]),
        ),
        ("token ids", json!(token_ids(25, 1500)), {
            let mut ids = token_ids(25, 1500);
            ids.extend(token_ids(26, 200));
            json!(ids)
        }),
    ];
    for (shape, learn, extend) in shapes {
        let pod = run.complete(&learn).expect_pod();
        let reply = run.complete(&extend);
        assert_eq!(reply.expect_pod(), pod, "{shape}: extension left the pod");
        assert!(reply.match_percent() > 0, "{shape}: {reply:?}");
    }
}

#[test]
fn match_header_reports_percent() {
    let run = Setup::new("single.yaml").start();
    let prompt = json!(text(30, 2048));
    let first = run.complete(&prompt);
    assert_eq!(first.match_percent(), 0);
    let repeat = run.complete(&prompt);
    assert_eq!(repeat.match_percent(), 100);
    assert_eq!(repeat.expect_pod(), first.expect_pod());

    // Half the prompt shared: strictly between.
    let head = text(31, 2048);
    run.complete(&json!(format!("{head}{}", text(32, 2048))))
        .expect_pod();
    let half = run
        .complete(&json!(format!("{head}{}", text(33, 2048))))
        .match_percent();
    assert!(
        (1..100).contains(&half),
        "half-shared prompt matched {half}%"
    );
}

#[test]
fn original_dst_cluster_routes_by_header() {
    let run = Setup::new("single-original-dst.yaml").start();
    let prefix = text(40, 4096);
    let first = run
        .complete(&json!(format!("{prefix}{}", text(4001, 200))))
        .expect_pod();
    for i in 0..5 {
        let reply = run.complete(&json!(format!("{prefix}{}", text(4002 + i, 200))));
        assert_eq!(reply.expect_pod(), first);
    }
    let mut pods = BTreeSet::new();
    for i in 0..12 {
        pods.insert(run.complete(&json!(text(4100 + i, 1024))).expect_pod());
    }
    assert!(pods.len() >= 2, "new prefixes all went to {pods:?}");
    // ORIGINAL_DST has no fallback of its own: requests the filter does not
    // route must still be given a pod, or Envoy answers 503 itself.
    for (method, path, body) in [
        ("POST", "/v1/completions", Some(&b"not json"[..])),
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", Some(&br#"{"model":"m"}"#[..])),
    ] {
        let reply = send(method, &run.envoy.url(path), &[], body, CLIENT_TIMEOUT).unwrap();
        assert!(
            reply.header("x-served-by").is_some(),
            "{method} {path} did not reach a pod: {reply:?}"
        );
    }
}

#[test]
fn stats_are_exported_for_prometheus() {
    let run = Setup::new("single.yaml").start();
    let prompt = text(50, 2048);
    run.complete(&json!(prompt)).expect_pod();
    run.complete(&json!(prompt)).expect_pod();
    // The request path's stats reach Envoy on the workers' tick.
    std::thread::sleep(harness::STATS_FLUSH * 3);
    let reply = send(
        "GET",
        &run.envoy.admin_url("/stats/prometheus"),
        &[],
        None,
        CLIENT_TIMEOUT,
    )
    .unwrap();
    assert_eq!(reply.status, 200);
    // Envoy drops the `wasmcustom.` prefix and turns dots into underscores.
    for (name, at_least) in [
        ("prefix_router_requests_total", 2),
        ("prefix_router_routed_prefix_match", 1),
        ("prefix_router_routed_no_match", 1),
    ] {
        let value = reply
            .body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                // `name{labels} value`
                let (series, value) = l.split_once(' ')?;
                let this = series.split('{').next() == Some(name);
                this.then(|| value.trim().parse::<f64>().ok()).flatten()
            })
            .unwrap_or_else(|| panic!("{name} missing from /stats/prometheus"));
        assert!(value >= f64::from(at_least), "{name} = {value}");
    }
    assert!(
        reply.body.contains("prefix_router_table_slots_used"),
        "occupancy gauge missing"
    );
}

/// The decision lines follow Envoy's `wasm` log level, changed at run time
/// through the admin's `/logging`: none at `info`, one per routed request
/// naming the pod it went to at `debug`, none again back at `info`.
#[test]
fn decision_lines_follow_envoys_wasm_log_level() {
    let run = Setup::new("single.yaml").start();
    let decisions = || {
        run.envoy
            .log_text()
            .lines()
            .filter(|l| l.contains("prefix_router: decision"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let set_level = |level: &str| {
        let url = run.envoy.admin_url(&format!("/logging?wasm={level}"));
        let reply = send("POST", &url, &[], None, CLIENT_TIMEOUT).unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
    };
    let address = |pod: &str| format!("127.0.0.1:{}", run.pod_named(pod).port);

    // At info (the harness's level): nothing, even after a tick.
    run.complete(&json!(text(40, 2048))).expect_pod();
    std::thread::sleep(Duration::from_millis(600));
    run.complete(&json!(text(41, 2048))).expect_pod();
    std::thread::sleep(Duration::from_millis(300));
    assert!(decisions().is_empty(), "{:?}", decisions());

    // At debug, from the worker's next tick: a new prompt, then the same
    // prefix again, each line naming the pod that answered.
    set_level("debug");
    assert!(
        wait_until(Duration::from_secs(10), || {
            run.complete(&json!(text(42, 512))).expect_pod();
            !decisions().is_empty()
        }),
        "no decision line after the switch to debug:\n{}",
        run.envoy.log_text()
    );
    let head = text(43, 4096);
    let first = run.complete(&json!(format!("{head}{}", text(44, 300))));
    let pod = address(&first.expect_pod());
    let again = run.complete(&json!(format!("{head}{}", text(45, 300))));
    assert_eq!(address(&again.expect_pod()), pod);
    let seen = |needle: &str| {
        wait_until(Duration::from_secs(5), || {
            decisions().iter().any(|l| l.contains(needle))
        })
    };
    let matched = format!("-> {pod} (prefix_match, match {}%)", again.match_percent());
    assert!(seen(&matched), "no line {matched:?} in {:#?}", decisions());
    // Each line lists the pool with what the policy weighed of each pod.
    let line = decisions()
        .into_iter()
        .rev()
        .find(|l| l.contains(&matched))
        .unwrap();
    for p in &run.pods {
        assert!(
            line.contains(&format!(" | {} match=", address(&p.name))),
            "{line}"
        );
    }
    assert!(
        line.contains("policy=load_aware") && line.contains(" inflight="),
        "{line}"
    );

    // A request passed through says why.
    run.post("/v1/completions", "not json");
    assert!(
        wait_until(Duration::from_secs(5), || run
            .envoy
            .log_text()
            .contains("prefix_router: pass-through (not_json)")),
        "no pass-through line"
    );

    // Back at info: the lines stop from the next tick.
    set_level("info");
    std::thread::sleep(Duration::from_millis(600));
    let before = decisions().len();
    for i in 0..3 {
        run.complete(&json!(text(50 + i, 1024))).expect_pod();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(decisions().len(), before, "{:#?}", decisions());
}

/// A flood of client `model` names, more distinct names than the model
/// registry has slots, each named once, leaves a model that comes after it
/// routed by prefix: clients' names fill only their share of the registry,
/// and a name past it routes under a local id (`src/shared/registry.rs`).
/// Before, the flood filled the registry and the new model was never
/// matched until the flood's names retired (20 minutes here).
#[test]
fn a_flood_of_model_names_leaves_a_new_model_routed_by_prefix() {
    const CLIENTS: usize = 4;
    let flood = MAX_SLOTS + 100;
    let run = Setup::new("single.yaml").start();
    let post = |model: &str, prompt: &str| {
        let body = json!({ "model": model, "prompt": prompt, "max_tokens": 1 }).to_string();
        run.envoy
            .post_json("/v1/completions", &body, &[])
            .unwrap_or_else(|e| panic!("{e}"))
    };
    thread::scope(|s| {
        for client in 0..CLIENTS {
            let post = &post;
            s.spawn(move || {
                for i in (client..flood).step_by(CLIENTS) {
                    let r = post(&format!("flood-{i}"), &text(i as u64, 256));
                    r.expect_pod();
                    assert!(
                        r.header("x-prefix-match").is_some(),
                        "flood request {i} not routed by the filter: {r:?}"
                    );
                }
            });
        }
    });
    let model = "a-real-model-after-the-flood";
    let prefix = text(9, 4096);
    let first = post(model, &format!("{prefix}{}", text(10, 300))).expect_pod();
    let second = post(model, &format!("{prefix}{}", text(11, 300)));
    assert_eq!(
        second.expect_pod(),
        first,
        "the new model's shared prefix went to another pod"
    );
    assert!(
        second.match_percent() > 0,
        "the new model's second request matched nothing: {second:?}"
    );
}
