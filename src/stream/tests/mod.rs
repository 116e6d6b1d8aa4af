//! The filter's callbacks below Envoy: a host double that records every
//! hostcall, so pause, pass-through reasons, trailers, the in-flight release
//! and the hostcall budget of a routed request are pinned down here (the
//! same paths run against real Envoy in `tests/`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use super::*;
use crate::config::Settings;
use crate::shared::metrics::{MetricKind, MetricSink};
use crate::shared::store::{MemStore, SharedStore, StoreError, Versioned};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Envoy as the filter sees it, counting each hostcall by name.
#[derive(Default)]
struct TestHost {
    store: MemStore,
    headers: RefCell<Vec<(String, Vec<u8>)>>,
    response_headers: RefCell<Vec<(String, String)>>,
    body: RefCell<Vec<u8>>,
    /// The answer chunk passing now.
    answer: RefCell<Vec<u8>>,
    properties: RefCell<BTreeMap<String, Vec<u8>>>,
    now: Cell<u64>,
    calls: RefCell<BTreeMap<&'static str, u32>>,
    /// Streams resumed, with the context made current again after each.
    resumed: RefCell<Vec<(u32, u32)>>,
    stats: RefCell<BTreeMap<u32, (String, i64)>>,
    unreadable_headers: Cell<bool>,
    /// Bodies sent to the Redis bridge, and whether the host refuses them.
    bridge_calls: RefCell<Vec<Vec<u8>>>,
    /// The Redis Cluster node each bridge call named.
    bridge_nodes: RefCell<Vec<Option<String>>>,
    bridge_refuses: Cell<bool>,
}

impl TestHost {
    fn call(&self, name: &'static str) {
        *self.calls.borrow_mut().entry(name).or_default() += 1;
    }

    fn total_calls(&self) -> u32 {
        self.calls.borrow().values().sum()
    }

    fn reset_calls(&self) {
        self.calls.borrow_mut().clear();
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .borrow()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    fn stat(&self, name: &str) -> i64 {
        self.stats
            .borrow()
            .values()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// A new request: its headers and body (the previous ones are gone).
    fn request(&self, method: &str, path: &str, body: &[u8]) {
        *self.headers.borrow_mut() = vec![
            (":method".into(), method.as_bytes().to_vec()),
            (":path".into(), path.as_bytes().to_vec()),
            (":authority".into(), b"gw".to_vec()),
            ("content-type".into(), b"application/json".to_vec()),
            ("content-length".into(), body.len().to_string().into_bytes()),
        ];
        *self.body.borrow_mut() = body.to_vec();
        self.response_headers.borrow_mut().clear();
    }
}

/// The proxy-wasm header map encoding.
fn encode_pairs(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (n, v) in pairs {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (n, v) in pairs {
        out.extend_from_slice(n.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

impl SharedStore for TestHost {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        self.call("get_shared_data");
        if std::env::var("SHOW_KEYS").is_ok() {
            eprintln!("get {key}");
        }
        self.store.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.call("set_shared_data");
        if std::env::var("SHOW_KEYS").is_ok() {
            eprintln!("set {key} ({} bytes, cas {cas:?})", value.len());
        }
        self.store.set(key, value, cas)
    }
}

impl MetricSink for TestHost {
    fn define_metric(&self, _kind: MetricKind, name: &str) -> u32 {
        self.call("define_metric");
        let mut s = self.stats.borrow_mut();
        let id = s.len() as u32 + 1;
        s.insert(id, (name.to_string(), 0));
        id
    }
    fn increment_metric(&self, id: u32, by: i64) {
        self.call("increment_metric");
        if let Some((_, v)) = self.stats.borrow_mut().get_mut(&id) {
            *v += by;
        }
    }
    fn record_metric(&self, id: u32, value: u64) {
        self.call("record_metric");
        if let Some((_, v)) = self.stats.borrow_mut().get_mut(&id) {
            *v = value as i64;
        }
    }
}

impl Host for TestHost {
    fn now_nanos(&self) -> u64 {
        self.call("get_current_time");
        self.now.get()
    }
    fn request_headers(&self) -> Option<Vec<u8>> {
        self.call("get_header_map_pairs");
        (!self.unreadable_headers.get()).then(|| encode_pairs(&self.headers.borrow()))
    }
    fn set_request_header(&self, name: &str, value: &str) -> bool {
        self.call("replace_header_map_value");
        let mut h = self.headers.borrow_mut();
        h.retain(|(n, _)| n != name);
        h.push((name.to_string(), value.as_bytes().to_vec()));
        true
    }
    fn remove_request_header(&self, name: &str) {
        self.call("remove_header_map_value");
        self.headers.borrow_mut().retain(|(n, _)| n != name);
    }
    fn set_response_header(&self, name: &str, value: &str) {
        self.call("replace_header_map_value");
        self.response_headers
            .borrow_mut()
            .push((name.to_string(), value.to_string()));
    }
    fn request_body(&self, max: usize) -> Option<Vec<u8>> {
        self.call("get_buffer_bytes");
        let b = self.body.borrow();
        Some(b[..b.len().min(max)].to_vec())
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.call("get_property");
        self.properties.borrow().get(&path.join(".")).cloned()
    }
    fn resolve_queue(&self, _vm_id: &str, _name: &str) -> Option<u32> {
        self.call("resolve_shared_queue");
        None
    }
    fn enqueue(&self, _queue: u32, _message: &[u8]) -> bool {
        self.call("enqueue_shared_queue");
        false
    }
    fn resume_request(&self, stream: u32, current: u32) -> bool {
        self.call("set_effective_context");
        self.call("resume_http_request");
        self.call("set_effective_context");
        self.resumed.borrow_mut().push((stream, current));
        true
    }
    fn call_bridge(
        &self,
        _sync: &crate::sync::SyncSettings,
        node: Option<&str>,
        body: &[u8],
        _timeout_ms: u64,
    ) -> Option<u32> {
        self.call("dispatch_http_call");
        self.bridge_nodes.borrow_mut().push(node.map(str::to_owned));
        let mut calls = self.bridge_calls.borrow_mut();
        calls.push(body.to_vec());
        (!self.bridge_refuses.get()).then(|| u32::try_from(calls.len()).unwrap_or(u32::MAX))
    }
}

const PODS: [&str; 2] = ["10.0.0.1:8000", "10.0.0.2:8000"];

fn worker_on(host: &TestHost, extra: &str) -> Worker {
    host.now.set(1_700_000_000_000_000_000);
    let json = format!(
        r#"{{"endpoints":["{}","{}"],"match_header":"x-prefix-match"{extra}}}"#,
        PODS[0], PODS[1]
    );
    let w = Worker::new(
        Settings::from_json(json.as_bytes()).unwrap(),
        host,
        "vm".into(),
        7,
    );
    // Steady state: the first tick built the fleet view.
    w.on_tick(host);
    w
}

/// A chat body of about `bytes` bytes: a system prompt made of `seed`, then
/// a short user turn.
fn chat(seed: &str, bytes: usize, user: &str) -> Vec<u8> {
    let system: String = seed.chars().cycle().take(bytes).collect();
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
    }))
    .unwrap()
}

const CHAT: &str = "/v1/chat/completions";

/// Runs one whole stream; returns the callbacks' verdicts (headers, body).
fn run(w: &Worker, host: &TestHost, body: &[u8]) -> (Verdict, Verdict) {
    host.request("POST", CHAT, body);
    let mut s = Stream::default();
    let a = s.on_request_headers(w, host, false);
    let b = s.on_request_body(w, host, body.len(), true);
    // The whole stream, answer included: headers, three chunks, the end.
    s.on_response_headers(w, host);
    for _ in 0..3 {
        s.on_response_body(w, host, 10);
    }
    s.on_done(w, host);
    s.on_log(w, host);
    (a, b)
}

fn calls_of(w: &Worker, host: &TestHost, body: &[u8]) -> (u32, BTreeMap<&'static str, u32>) {
    host.reset_calls();
    if std::env::var("SHOW_KEYS").is_ok() {
        eprintln!("--- request of {} bytes", body.len());
    }
    run(w, host, body);
    (host.total_calls(), host.calls.borrow().clone())
}

#[test]
fn headers_pause_then_the_body_names_a_pod() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let body = chat("You are a helpful assistant. ", 2000, "hi");
    host.request("POST", CHAT, &body);
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, false), Verdict::Pause);
    assert_eq!(
        s.on_request_body(&w, &host, body.len() / 2, false),
        Verdict::Pause,
        "a body still arriving is held"
    );
    assert_eq!(
        s.on_request_body(&w, &host, body.len(), true),
        Verdict::Continue
    );
    let dest = host.header(DESTINATION_HEADER).expect("destination set");
    assert!(PODS.contains(&dest.as_str()), "{dest}");
    assert_eq!(host.header(ORIGINAL_DST_HEADER), None, "not configured");
    s.on_response_headers(&w, &host);
    assert_eq!(
        host.response_headers.borrow().as_slice(),
        &[("x-prefix-match".to_string(), "0".to_string())]
    );
}

#[test]
fn a_client_never_picks_the_upstream() {
    let host = TestHost::default();
    let w = worker_on(&host, r#","original_dst_header":true"#);
    host.request("GET", "/healthz", b"");
    host.headers
        .borrow_mut()
        .push((DESTINATION_HEADER.into(), b"6.6.6.6:1".to_vec()));
    host.headers
        .borrow_mut()
        .push((ORIGINAL_DST_HEADER.into(), b"6.6.6.6:1".to_vec()));
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, true), Verdict::Continue);
    assert_eq!(host.header(DESTINATION_HEADER), None);
    // Not routed, but an ORIGINAL_DST cluster still gets one of our pods.
    let fallback = host.header(ORIGINAL_DST_HEADER).unwrap();
    assert!(PODS.contains(&fallback.as_str()), "{fallback}");
}

#[test]
fn each_pass_reason_is_counted_and_the_request_continues() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let cases: [(&str, &str, &[u8], bool, PassReason); 5] = [
        ("GET", CHAT, b"", true, PassReason::Method),
        ("POST", "/v1/embeddings", b"{}", false, PassReason::Path),
        ("POST", CHAT, b"", true, PassReason::NoPrompt),
        ("POST", CHAT, b"not json", false, PassReason::NotJson),
        (
            "POST",
            CHAT,
            br#"{"model":"m"}"#,
            false,
            PassReason::NoPrompt,
        ),
    ];
    for (method, path, body, eos, reason) in cases {
        host.request(method, path, body);
        let mut s = Stream::default();
        let v = s.on_request_headers(&w, &host, eos);
        if v == Verdict::Pause {
            assert_eq!(
                s.on_request_body(&w, &host, body.len(), true),
                Verdict::Continue
            );
        }
        assert_eq!(w.meter.pending(Count::Pass(reason)), 1, "{reason:?}");
        assert_eq!(host.header(DESTINATION_HEADER), None, "{reason:?}");
        w.meter.flush(&host);
    }
    // Too large, by content-length and by what arrived.
    let big = chat("x", 2000, "hi");
    let small = worker_on(&host, r#","max_body_bytes":1000"#);
    host.request("POST", CHAT, &big);
    assert_eq!(
        Stream::default().on_request_headers(&small, &host, false),
        Verdict::Continue
    );
    host.headers
        .borrow_mut()
        .retain(|(n, _)| n != "content-length");
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&small, &host, false), Verdict::Pause);
    assert_eq!(
        s.on_request_body(&small, &host, big.len(), false),
        Verdict::Continue
    );
    assert_eq!(
        small.meter.pending(Count::Pass(PassReason::BodyTooLarge)),
        2
    );
}

#[test]
fn unreadable_headers_pass_and_both_destinations_are_removed() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    host.request("POST", CHAT, b"{}");
    host.unreadable_headers.set(true);
    host.reset_calls();
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, false), Verdict::Continue);
    assert_eq!(host.calls.borrow()["remove_header_map_value"], 2);
    assert_eq!(w.meter.pending(Count::Pass(PassReason::InternalError)), 1);
}

#[test]
fn a_body_ended_by_trailers_is_routed() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let body = chat("trailers ", 1000, "hi");
    host.request("POST", CHAT, &body);
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, false), Verdict::Pause);
    assert_eq!(
        s.on_request_body(&w, &host, body.len(), false),
        Verdict::Pause
    );
    assert_eq!(s.on_request_trailers(&w, &host), Verdict::Continue);
    assert!(host.header(DESTINATION_HEADER).is_some());
    assert_eq!(
        w.meter
            .pending(Count::Routed(crate::route::policy::Reason::NoMatch)),
        1
    );
}

#[test]
fn in_flight_is_released_exactly_once_however_the_stream_ends() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    // This VM's counts, as its next tick publishes them.
    let counts = || w.router.refresh_load(&host.store, 0).unwrap();
    let body = chat("release ", 1000, "hi");
    // Ends normally: on_done then on_log.
    run(&w, &host, &body);
    assert_eq!(counts(), vec![0, 0]);
    // Aborted after routing: only on_log, or only on_done.
    for end in 0..2 {
        host.request("POST", CHAT, &body);
        let mut s = Stream::default();
        s.on_request_headers(&w, &host, false);
        s.on_request_body(&w, &host, body.len(), true);
        assert_eq!(counts().iter().sum::<u32>(), 1);
        if end == 0 {
            s.on_log(&w, &host);
        } else {
            s.on_done(&w, &host);
        }
        s.on_done(&w, &host);
        s.on_log(&w, &host);
        assert_eq!(counts(), vec![0, 0], "end {end}");
    }
    // Aborted before the body: nothing was counted, nothing is released.
    host.request("POST", CHAT, &body);
    let mut open = Stream::default();
    open.on_request_headers(&w, &host, false);
    open.on_request_body(&w, &host, body.len(), true);
    host.request("POST", CHAT, &body);
    let mut s = Stream::default();
    s.on_request_headers(&w, &host, false);
    s.on_done(&w, &host);
    s.on_log(&w, &host);
    assert_eq!(
        counts().iter().sum::<u32>(),
        1,
        "another stream's count is untouched"
    );
    open.on_log(&w, &host);
    assert_eq!(counts(), vec![0, 0]);
}

#[test]
fn stats_reach_envoy_on_the_tick() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let body = chat("stats ", 1000, "hi");
    run(&w, &host, &body);
    run(&w, &host, &body);
    assert_eq!(host.stat("prefix_router.requests_total"), 0);
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.requests_total"), 2);
    assert_eq!(host.stat("prefix_router.routed.no_match"), 1);
    assert_eq!(host.stat("prefix_router.routed.prefix_match"), 1);
    // The in-flight gauges exist for both pods, back at 0.
    for pod in PODS {
        let name = format!("prefix_router.inflight.{}", pod.replace(['.', ':'], "_"));
        assert!(
            host.stats.borrow().values().any(|(n, _)| *n == name),
            "{name}"
        );
        assert_eq!(host.stat(&name), 0);
    }
}

/// The hostcalls of one whole stream (request, answer in chunks, end), by
/// kind of request, held to the budgets: 12 for a matched 8 KB request, 16
/// for a new 8 KB prefix, 24 for a new 400 KiB prompt. The table writes one
/// bucket per segment a request records (a get and a set, the get saved
/// when the probe read that bucket): a new 8 KB prefix spans 4 segments, a
/// 400 KiB one 6 (see [`crate::route::table::Layout`]). The first request of
/// a model also registers it (one get and one set more). A match minutes
/// old costs what a fresh one does: the answer is never read.
#[test]
fn hostcall_budget_of_one_routed_request() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let (first_of_model, _) = calls_of(&w, &host, &chat("warm up ", 8 * 1024, "zero"));
    let sys = "You are a careful assistant. Answer briefly and cite sources. ";
    let (new_8k, new_calls) = calls_of(&w, &host, &chat(sys, 8 * 1024, "first"));
    // The first match of a prefix gallops; from then on the VM's hint
    // confirms it in three segment reads (a system prompt repeats all day).
    let (first_match, _) = calls_of(&w, &host, &chat(sys, 8 * 1024, "second"));
    let (matched_8k, matched_calls) = calls_of(&w, &host, &chat(sys, 8 * 1024, "third"));
    let (new_400k, _) = calls_of(&w, &host, &chat("long context ", 400 * 1024, "q"));
    // Three minutes on: the match is old, its blocks are rewritten once
    // (the touch interval), then it costs what a fresh match does.
    host.now.set(host.now.get() + 180_000_000_000);
    w.on_tick(&host);
    let (old_touched, old_touched_calls) = calls_of(&w, &host, &chat(sys, 8 * 1024, "later"));
    let (old_match, old_calls) = calls_of(&w, &host, &chat(sys, 8 * 1024, "later again"));
    // The benchmark's matched shape: a known 6 KB system prompt, a new 2 KB
    // question whose sampled blocks are recorded (a get and a set each).
    let question = |q: &str| -> String { q.chars().cycle().take(2048).collect() };
    calls_of(&w, &host, &chat(sys, 6 * 1024, &question("warm up ")));
    let (new_question, question_calls) =
        calls_of(&w, &host, &chat(sys, 6 * 1024, &question("what next? ")));
    eprintln!(
        "hostcalls per request: matched 8 KB {matched_8k} {matched_calls:?} (first match \
         {first_match}); matched 6 KB + new 2 KB question {new_question} {question_calls:?}; \
         new 8 KB {new_8k} {new_calls:?} (first of its model {first_of_model}); new 400 KiB \
         {new_400k}"
    );
    assert!(
        new_question <= QUESTION_BUDGET,
        "matched 6 KB + new 2 KB: {new_question} {question_calls:?}"
    );
    assert!(
        matched_8k <= MATCHED_8K_BUDGET,
        "matched 8 KB: {matched_8k} {matched_calls:?}"
    );
    assert!(new_8k <= NEW_8K_BUDGET, "new 8 KB: {new_8k} {new_calls:?}");
    assert!(
        first_of_model <= NEW_8K_BUDGET + 2,
        "first request of a model: {first_of_model}"
    );
    assert!(new_400k <= NEW_400K_BUDGET, "new 400 KiB: {new_400k}");
    assert!(
        old_touched <= NEW_8K_BUDGET,
        "old match rewritten: {old_touched} {old_touched_calls:?}"
    );
    assert_eq!(old_match, matched_8k, "old match: {old_calls:?}");
    // A repeated prompt reads the segments its hint names (first block,
    // the hint and the index after it: two buckets for this prompt); a new
    // question after a known system prompt writes its new blocks' two
    // buckets, reusing the probe's reads.
    assert_eq!(
        matched_calls.get("get_shared_data"),
        Some(&2),
        "{matched_calls:?}"
    );
    assert_eq!(
        question_calls.get("set_shared_data"),
        Some(&2),
        "{question_calls:?}"
    );
    // No stat call on the request path.
    assert!(!matched_calls.contains_key("increment_metric"));
    assert!(!matched_calls.contains_key("record_metric"));
}

/// Every request of a sampling cycle holds the budgets, the timed one (two
/// clock reads) and the one whose passive check reads the upstream address
/// included: the two samples never fall on the same request.
#[test]
fn every_request_of_a_sampling_cycle_holds_the_budget() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let sys = "You are a careful assistant. Answer briefly and cite sources. ";
    let question = |q: &str| -> String { q.chars().cycle().take(2048).collect() };
    calls_of(&w, &host, &chat(sys, 6 * 1024, &question("warm up ")));
    let n = crate::route::meter::SAMPLE_EVERY as usize;
    let mut questions = Vec::new();
    let mut new_prefixes = Vec::new();
    for i in 0..n {
        let body = chat(sys, 6 * 1024, &question(&format!("question {i} ")));
        questions.push(calls_of(&w, &host, &body));
    }
    for i in 0..n {
        let body = chat(&format!("prefix {i} "), 8 * 1024, "q");
        new_prefixes.push(calls_of(&w, &host, &body));
    }
    for (calls, by_kind) in &questions {
        assert!(*calls <= QUESTION_BUDGET, "{calls} {by_kind:?}");
    }
    for (calls, by_kind) in &new_prefixes {
        assert!(*calls <= NEW_8K_BUDGET, "{calls} {by_kind:?}");
    }
    let of = |v: &[(u32, BTreeMap<&'static str, u32>)], kind: &str| -> Vec<u32> {
        v.iter()
            .map(|(_, m)| m.get(kind).copied().unwrap_or(0))
            .collect()
    };
    // One timed request and one address check per cycle, never together.
    for v in [&questions, &new_prefixes] {
        let clock = of(v, "get_current_time");
        let props = of(v, "get_property");
        assert_eq!(clock.iter().filter(|&&c| c > 0).count(), 1, "{clock:?}");
        assert_eq!(props.iter().filter(|&&p| p == 3).count(), 1, "{props:?}");
        assert!(clock.iter().zip(&props).all(|(c, p)| *c == 0 || *p == 2));
    }
}

/// The request path reads the clock only for the 1 request in 8 it times
/// (at its start and end); the others take the last tick's, at most a tick
/// old (the table keeps whole seconds). Before the first tick, the host's.
#[test]
fn only_timed_requests_read_the_clock() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let mut reads = 0;
    for i in 0..16 {
        let (_, calls) = calls_of(&w, &host, &chat("sys ", 2048, &format!("q{i}")));
        reads += calls.get("get_current_time").copied().unwrap_or(0);
    }
    assert_eq!(reads, 2 * 2, "2 of 16 requests timed, 2 reads each");

    let json = format!(r#"{{"endpoints":["{}"]}}"#, PODS[0]);
    let settings = Settings::from_json(json.as_bytes()).unwrap();
    let fresh = Worker::new(settings, &host, "vm".into(), 7);
    host.now.set(5_000_000_000);
    assert_eq!(fresh.clock_nanos(&host), 5_000_000_000, "no tick yet");
    fresh.on_tick(&host);
    host.now.set(5_200_000_000);
    host.reset_calls();
    assert_eq!(fresh.clock_nanos(&host), 5_000_000_000, "the tick's");
    assert_eq!(host.total_calls(), 0);
}

/// Passive health at the end of a routed request: a 502/503, or a retry that
/// another host answered, cools the chosen pod down; a retry the chosen pod
/// itself answered is no failure. The address (the dear property) is read
/// only after a retry, or on a sampled request (`check_address`), which
/// also finds a first attempt another host answered.
#[test]
fn passive_health_reads_the_address_only_after_a_retry_or_when_sampled() {
    let int = |n: i64| n.to_le_bytes().to_vec();
    // (response.code, attempts, upstream.address is the chosen pod's,
    //  check_address) -> (cooled down, property reads)
    type Case = ((i64, Option<i64>, Option<bool>, bool), (bool, u32));
    let cases: [Case; 10] = [
        ((200, Some(1), Some(true), false), (false, 2)),
        ((200, Some(1), Some(false), false), (false, 2)),
        ((200, Some(1), Some(true), true), (false, 3)),
        ((200, Some(1), Some(false), true), (true, 3)),
        ((200, None, None, false), (false, 2)),
        ((503, Some(1), Some(true), false), (true, 1)),
        ((502, None, None, true), (true, 1)),
        ((200, Some(2), Some(false), false), (true, 3)),
        ((200, Some(2), Some(true), false), (false, 3)),
        ((200, Some(3), None, false), (false, 3)),
    ];
    for ((code, attempts, same, check), (cooled, reads)) in cases {
        let host = TestHost::default();
        let w = worker_on(&host, "");
        let pod = crate::shared::registry::PodSlot::new(0);
        let chosen = w.router.fleet().address(pod).unwrap().to_string();
        let other = PODS.iter().find(|p| **p != chosen).unwrap().to_string();
        let mut props = host.properties.borrow_mut();
        props.insert("response.code".into(), int(code));
        if let Some(n) = attempts {
            props.insert("upstream.request_attempt_count".into(), int(n));
        }
        if let Some(same) = same {
            let addr = if same { chosen.clone() } else { other };
            props.insert("upstream.address".into(), addr.into_bytes());
        }
        drop(props);
        host.reset_calls();
        w.observe_outcome(&host, pod, &chosen, check);
        let case =
            format!("code {code}, attempts {attempts:?}, same host {same:?}, sampled {check}");
        let calls = host
            .calls
            .borrow()
            .get("get_property")
            .copied()
            .unwrap_or(0);
        assert_eq!(calls, reads, "property reads: {case}");
        w.on_tick(&host);
        let n = host.stat("prefix_router.fleet.passive_cooldowns");
        assert_eq!(n, i64::from(cooled), "cooldowns: {case}");
    }
}

const MATCHED_8K_BUDGET: u32 = 12;
const QUESTION_BUDGET: u32 = 14;
const NEW_8K_BUDGET: u32 = 16;
const NEW_400K_BUDGET: u32 = 24;

#[test]
fn every_vm_gets_its_own_number() {
    let host = TestHost::default();
    let n: Vec<u64> = (0..5)
        .map(|_| crate::worker::vm_number(&host).unwrap())
        .collect();
    assert_eq!(n, vec![1, 2, 3, 4, 5]);
    host.store.interfere_next(3);
    assert_eq!(
        crate::worker::vm_number(&host),
        Some(6),
        "a lost race is retried"
    );
}

#[test]
fn header_maps_decode_and_malformed_ones_never_panic() {
    let pairs = vec![
        (":method".to_string(), b"POST".to_vec()),
        (":path".to_string(), b"/v1/completions".to_vec()),
        ("content-length".to_string(), b"42".to_vec()),
        (DESTINATION_HEADER.to_string(), b"\xff\xfe".to_vec()),
    ];
    let bytes = encode_pairs(&pairs);
    assert_eq!(
        RequestHead::decode(&bytes),
        Some(RequestHead {
            method: "POST".into(),
            path: "/v1/completions".into(),
            content_length: Some(42),
            has_destination: true,
            has_original_dst: false,
        })
    );
    assert_eq!(RequestHead::decode(&[]), Some(RequestHead::default()));
    // Every truncation and a sweep of corruptions: decoded or refused.
    for cut in 0..bytes.len() {
        let _ = RequestHead::decode(&bytes[..cut]);
    }
    let mut rng = crate::rng::SplitMix64::new(3);
    for _ in 0..5000 {
        let mut b = bytes.clone();
        let i = rng.below(b.len());
        b[i] = rng.next_u64() as u8;
        let _ = RequestHead::decode(&b);
    }
    assert_eq!(RequestHead::decode(&[0xff, 0xff, 0xff, 0xff]), None);
}

/// Pod signals cost the request path nothing: the same requests make the
/// same hostcalls with signals on (and published) as with them off; the
/// worker reads them once per tick.
#[test]
fn pod_signals_add_no_hostcall_to_a_request_and_one_read_per_tick() {
    let sys = "You are a careful assistant. Answer briefly and cite sources. ";
    let mut counts = Vec::new();
    for extra in ["", r#","signals":{"enabled":true,"cluster":"pods"}"#] {
        let host = TestHost::default();
        let w = worker_on(&host, extra);
        let record = crate::signals::Record {
            slot: crate::shared::registry::PodSlot::new(0),
            at_ms: host.now.get() / 1_000_000,
            signals: crate::signals::PodSignals {
                waiting: 1,
                running: 2,
                token_us: None,
            },
        };
        host.store
            .set(
                crate::signals::KEY,
                &crate::signals::encode(&[record]),
                None,
            )
            .unwrap();
        host.reset_calls();
        w.on_tick(&host);
        let reads = |calls: &BTreeMap<&'static str, u32>| calls.get("get_shared_data").copied();
        let tick = reads(&host.calls.borrow().clone());
        let per_request: Vec<u32> = ["first", "second", "third"]
            .iter()
            .map(|q| calls_of(&w, &host, &chat(sys, 8 * 1024, q)).0)
            .collect();
        counts.push((tick, per_request));
    }
    assert_eq!(counts[0].1, counts[1].1, "per-request hostcalls differ");
    assert_eq!(
        counts[1].0.unwrap_or(0),
        counts[0].0.unwrap_or(0) + 1,
        "the tick reads the signals once"
    );
}

/// The slowness gauges show what the policy takes each pod's speed to be:
/// 0 while nothing is measured, then the reported time per output token
/// against the fastest member's (of two reporting), in thousandths.
#[test]
fn slowness_gauges_follow_the_reported_token_latency() {
    let host = TestHost::default();
    let w = worker_on(&host, r#","signals":{"enabled":true,"cluster":"pods"}"#);
    let gauge = |pod: &str| format!("prefix_router.slowness.{}", pod.replace(['.', ':'], "_"));
    w.on_tick(&host);
    for pod in PODS {
        assert_eq!(host.stat(&gauge(pod)), 0, "nothing measured yet");
    }
    let records: Vec<crate::signals::Record> = [(0, 3_000), (1, 9_000)]
        .iter()
        .map(|&(slot, us)| crate::signals::Record {
            slot: crate::shared::registry::PodSlot::new(slot),
            at_ms: host.now.get() / 1_000_000,
            signals: crate::signals::PodSignals {
                waiting: 0,
                running: 1,
                token_us: Some(us),
            },
        })
        .collect();
    host.store
        .set(crate::signals::KEY, &crate::signals::encode(&records), None)
        .unwrap();
    w.on_tick(&host);
    let slot_of = |pod: &str| {
        w.router
            .fleet()
            .all()
            .find(|(_, _, a)| *a == pod)
            .map(|(s, _, _)| s.index())
            .unwrap()
    };
    for pod in PODS {
        let want = if slot_of(pod) == 0 { 1000 } else { 3000 };
        assert_eq!(host.stat(&gauge(pod)), want, "{pod}");
    }
}

#[test]
fn a_second_worker_vm_sees_each_request_at_once_for_one_get_and_two_sets() {
    // hold's own calls are counted in the test after this one.
    let host = TestHost::default();
    let a = worker_on(&host, HOLD_OFF);
    let sys = "You are a careful assistant. Answer briefly and cite sources. ";
    run(&a, &host, &chat(sys, 8 * 1024, "warm up"));
    // The first match gallops; the ones compared below follow its hint.
    run(&a, &host, &chat(sys, 8 * 1024, "first match"));
    let (_, lone) = calls_of(&a, &host, &chat(sys, 8 * 1024, "alone"));
    // A second worker VM of the replica; each sees the other on its tick.
    let b = worker_on(&host, HOLD_OFF);
    a.on_tick(&host);
    b.on_tick(&host);
    let (_, paired) = calls_of(&a, &host, &chat(sys, 8 * 1024, "paired"));
    let n = |calls: &BTreeMap<&str, u32>, k: &str| calls.get(k).copied().unwrap_or(0);
    assert_eq!(
        n(&paired, "get_shared_data"),
        n(&lone, "get_shared_data") + 1,
        "lone {lone:?}, paired {paired:?}"
    );
    assert_eq!(
        n(&paired, "set_shared_data"),
        n(&lone, "set_shared_data") + 2,
        "lone {lone:?}, paired {paired:?}"
    );
    // While A's request is open, B's next routing weighs it, before any
    // tick; once it ends, B's next routing sees it gone.
    let in_flight_on_b = || {
        run(&b, &host, &chat("other ", 1000, "probe"));
        b.router.replica_load()
    };
    let body = chat(sys, 8 * 1024, "open");
    host.request("POST", CHAT, &body);
    let mut s = Stream::default();
    s.on_request_headers(&a, &host, false);
    s.on_request_body(&a, &host, body.len(), true);
    assert_eq!(in_flight_on_b().iter().sum::<u32>(), 1);
    s.on_done(&a, &host);
    s.on_log(&a, &host);
    assert_eq!(in_flight_on_b().iter().sum::<u32>(), 0);
}

/// A streamed chat body: `chat` with `"stream": true`.
fn streamed_chat(seed: &str, bytes: usize, user: &str) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&chat(seed, bytes, user)).unwrap();
    v["stream"] = serde_json::json!(true);
    serde_json::to_vec(&v).unwrap()
}

/// Starts stream `id` and reads its whole body; returns the body's verdict.
fn start_stream(w: &Worker, host: &TestHost, id: u32, body: &[u8]) -> (Stream, Verdict) {
    host.request("POST", CHAT, body);
    let mut s = Stream::new(id);
    assert_eq!(s.on_request_headers(w, host, false), Verdict::Pause);
    let v = s.on_request_body(w, host, body.len(), true);
    (s, v)
}

const HOLD_ON: &str = r#","hold":{"enabled":true,"max_ms":1000}"#;
const HOLD_OFF: &str = r#","hold":{"enabled":false}"#;

#[test]
fn a_request_for_a_prefix_in_prefill_waits_for_its_first_answer_bytes() {
    let host = TestHost::default();
    let w = worker_on(&host, HOLD_ON);
    let seed = "You are a careful assistant. ";
    let (mut first, v) = start_stream(&w, &host, 10, &streamed_chat(seed, 4000, "one"));
    assert_eq!(v, Verdict::Continue, "nothing computes this prefix yet");
    let pod = host.header(DESTINATION_HEADER).unwrap();
    // Same prefix, another question, while the first is in prefill.
    let (mut second, v) = start_stream(&w, &host, 11, &chat(seed, 4000, "two"));
    assert_eq!(v, Verdict::Pause, "held for the first's prefill");
    assert_eq!(host.header(DESTINATION_HEADER).unwrap(), pod, "same pod");
    assert_eq!(w.meter.pending(Count::Held), 1);
    // Response headers alone do not end a prefill (vLLM sends them first).
    first.on_response_headers(&w, &host);
    assert!(host.resumed.borrow().is_empty());
    *host.answer.borrow_mut() = b"data: {}\n\n".to_vec();
    first.on_response_body(&w, &host, 10);
    assert_eq!(host.resumed.borrow().as_slice(), &[(11, 10)]);
    assert_eq!(w.meter.pending(Count::HoldAnswered), 1);
    // Later chunks and the end resume nothing more.
    first.on_response_body(&w, &host, 10);
    first.on_done(&w, &host);
    second.on_response_headers(&w, &host);
    second.on_done(&w, &host);
    assert_eq!(host.resumed.borrow().len(), 1);
    // Once answered, the prefix is cached: a third request goes on at once.
    let (_third, v) = start_stream(&w, &host, 12, &chat(seed, 4000, "three"));
    assert_eq!(v, Verdict::Continue);
}

#[test]
fn a_held_request_is_not_timed_as_a_hit() {
    // Its wait for another's prefill is not its pod's speed: timed, it made
    // the pod taking new prefixes read slower and lose ties on its matches.
    let host = TestHost::default();
    let w = worker_on(&host, HOLD_ON);
    let seed = "Reply in one line. ";
    let (mut first, _) = start_stream(&w, &host, 10, &streamed_chat(seed, 4000, "one"));
    let slot = |h: &TestHost| {
        let address = h.header(DESTINATION_HEADER).unwrap();
        let fleet = w.router.fleet();
        let member = fleet.all().find(|&(_, _, a)| a == address);
        member.map(|(slot, _, _)| slot).unwrap()
    };
    let pod = slot(&host);
    let (mut second, v) = start_stream(&w, &host, 11, &chat(seed, 4000, "two"));
    assert_eq!(v, Verdict::Pause);
    assert_eq!(w.router.hits_timed(pod), (0, 0), "a held hit is not timed");
    *host.answer.borrow_mut() = b"data: {}\n\n".to_vec();
    first.on_response_body(&w, &host, 10);
    first.on_done(&w, &host);
    second.on_done(&w, &host);
    assert_eq!(w.router.hits_timed(pod), (0, 0), "nor counted at its end");
    // A hit that does not wait is timed from routing to its end.
    let (mut third, v) = start_stream(&w, &host, 12, &chat(seed, 4000, "three"));
    assert_eq!(v, Verdict::Continue);
    assert_eq!(slot(&host), pod);
    assert_eq!(w.router.hits_timed(pod), (1, 0));
    third.on_done(&w, &host);
    assert_eq!(w.router.hits_timed(pod), (0, 1));
}

#[test]
fn only_a_streamed_prefill_is_waited_for_and_only_with_hold_on() {
    let seed = "Answer in French, briefly. ";
    for (extra, streamed) in [(HOLD_ON, false), (r#","hold":{"enabled":false}"#, true)] {
        let host = TestHost::default();
        let w = worker_on(&host, extra);
        let body = if streamed {
            streamed_chat(seed, 4000, "one")
        } else {
            chat(seed, 4000, "one")
        };
        let (_first, v) = start_stream(&w, &host, 1, &body);
        assert_eq!(v, Verdict::Continue);
        let (_second, v) = start_stream(&w, &host, 2, &chat(seed, 4000, "two"));
        assert_eq!(v, Verdict::Continue, "{extra} streamed={streamed}");
        assert_eq!(w.meter.pending(Count::Held), 0);
    }
}

#[test]
fn a_held_request_goes_on_when_its_time_is_up_or_the_prefill_ends_unanswered() {
    let host = TestHost::default();
    let w = worker_on(&host, HOLD_ON);
    w.set_root_context(1);
    let seed = "Summarise the following. ";
    let (mut first, _) = start_stream(&w, &host, 10, &streamed_chat(seed, 4000, "a"));
    let (mut second, v) = start_stream(&w, &host, 11, &chat(seed, 4000, "b"));
    assert_eq!(v, Verdict::Pause);
    // A tick before max_ms resumes nothing; one past it resumes the stream
    // with the root context current again.
    host.now.set(host.now.get() + 500_000_000);
    w.on_tick(&host);
    assert!(host.resumed.borrow().is_empty());
    host.now.set(host.now.get() + 600_000_000);
    w.on_tick(&host);
    assert_eq!(host.resumed.borrow().as_slice(), &[(11, 1)]);
    assert_eq!(host.stat("prefix_router.hold.timed_out"), 1);
    second.on_done(&w, &host);
    // A new waiter for the same prefill; the prefill's stream then ends
    // without an answer (a reset): the waiter goes on at once.
    let (mut third, v) = start_stream(&w, &host, 12, &chat(seed, 4000, "c"));
    assert_eq!(v, Verdict::Pause);
    first.on_done(&w, &host);
    assert_eq!(host.resumed.borrow().last(), Some(&(12, 10)));
    // A held client that leaves is forgotten: no resume later.
    let (mut fourth, _) = start_stream(&w, &host, 20, &streamed_chat(seed, 9000, "d"));
    let (mut fifth, v) = start_stream(&w, &host, 21, &chat(seed, 9000, "e"));
    assert_eq!(v, Verdict::Pause);
    fifth.on_done(&w, &host);
    let before = host.resumed.borrow().len();
    fourth.on_response_body(&w, &host, 10);
    host.now.set(host.now.get() + 5_000_000_000);
    w.on_tick(&host);
    assert_eq!(host.resumed.borrow().len(), before);
    third.on_done(&w, &host);
    fourth.on_done(&w, &host);
}

#[test]
fn a_request_waits_for_another_worker_vms_prefill_and_its_tick_resumes_it() {
    let host = TestHost::default();
    let a = worker_on(&host, HOLD_ON);
    let b = worker_on(&host, HOLD_ON);
    b.set_root_context(2);
    for w in [&a, &b, &a] {
        w.on_tick(&host);
    }
    assert_eq!(
        a.tick_ms(),
        crate::worker::FAST_TICK_MS,
        "another VM is live"
    );
    let seed = "Translate the following into Dutch. ";
    // VM a routes a new 8 KB prefix, streamed: listed for the other VMs
    // (one get and one set more than with hold off).
    host.reset_calls();
    let (mut first, v) = start_stream(&a, &host, 10, &streamed_chat(seed, 8 * 1024, "one"));
    assert_eq!(v, Verdict::Continue);
    let listed = host.calls.borrow().clone();
    let pod = host.header(DESTINATION_HEADER).unwrap();
    // VM b gets the same prefix while a's prefill runs: held.
    let (mut second, v) = start_stream(&b, &host, 11, &chat(seed, 8 * 1024, "two"));
    assert_eq!(v, Verdict::Pause, "held for VM a's prefill");
    assert_eq!(host.header(DESTINATION_HEADER).unwrap(), pod);
    assert_eq!(b.meter.pending(Count::HeldForOtherVm), 1);
    // b's tick polls: still listed, nothing resumes.
    b.on_tick(&host);
    assert!(host.resumed.borrow().is_empty());
    // a's first answer bytes withdraw it; b's next tick resumes its stream.
    host.reset_calls();
    first.on_response_body(&a, &host, 10);
    let withdrawn = host.calls.borrow().clone();
    assert!(host.resumed.borrow().is_empty(), "a resumes nothing of b's");
    b.on_tick(&host);
    assert_eq!(host.resumed.borrow().as_slice(), &[(11, 2)]);
    first.on_done(&a, &host);
    second.on_done(&b, &host);
    // The same with hold off, for the calls hold adds.
    let off = TestHost::default();
    let c = worker_on(&off, HOLD_OFF);
    let d = worker_on(&off, HOLD_OFF);
    for w in [&c, &d, &c] {
        w.on_tick(&off);
    }
    assert_eq!(c.tick_ms(), crate::worker::TICK_MS);
    off.reset_calls();
    let (_s, _) = start_stream(&c, &off, 10, &streamed_chat(seed, 8 * 1024, "one"));
    let plain = off.calls.borrow().clone();
    let n = |calls: &BTreeMap<&str, u32>, k: &str| calls.get(k).copied().unwrap_or(0);
    for k in ["get_shared_data", "set_shared_data"] {
        assert_eq!(
            n(&listed, k),
            n(&plain, k) + 1,
            "{k}: {listed:?} vs {plain:?}"
        );
        assert_eq!(n(&withdrawn, k), 1, "{k}: {withdrawn:?}");
    }
}

/// A streamed new prefix sent to a pod with a free slot is timed from
/// routing to its first answer bytes: one clock read at each end, and the
/// VM ticks fast meanwhile. A pod whose open prefill has run 2.5x as long
/// as the other pod's took reads slow at once, before it answers: the
/// next new prefix goes to the other pod, though that one is busier.
#[test]
fn a_new_prefix_avoids_a_pod_whose_prefill_is_overdue() {
    let host = TestHost::default();
    let w = worker_on(&host, "");
    let slot_of = |address: &str| {
        let fleet = w.router.fleet();
        let member = fleet.all().find(|&(_, _, a)| a == address);
        member.map(|(slot, _, _)| slot).unwrap()
    };
    let t0 = host.now.get();
    let ms = |n: u64| t0 + n * 1_000_000;
    host.reset_calls();
    let (mut a, _) = start_stream(&w, &host, 10, &streamed_chat("alpha ", 8 * 1024, "q"));
    let x = host.header(DESTINATION_HEADER).unwrap();
    assert!(a.timing.prefill);
    let clock = |h: &TestHost| {
        h.calls
            .borrow()
            .get("get_current_time")
            .copied()
            .unwrap_or(0)
    };
    // The first request of the VM's sampling cycle is timed (two reads)
    // and the prefill start is one more.
    assert_eq!(clock(&host), 3);
    assert_eq!(
        w.tick_ms(),
        crate::worker::FAST_TICK_MS,
        "a prefill is timed"
    );
    let (mut b, _) = start_stream(&w, &host, 11, &streamed_chat("beta ", 8 * 1024, "q"));
    let y = host.header(DESTINATION_HEADER).unwrap();
    assert_ne!(x, y, "the idle pod");
    assert!(b.timing.prefill);
    // A's 200 (one property read) and first bytes at 200 ms (one clock
    // read); it goes on decoding.
    host.now.set(ms(200));
    host.reset_calls();
    let ok = 200i64.to_le_bytes().to_vec();
    host.properties
        .borrow_mut()
        .insert("response.code".into(), ok);
    a.on_response_headers(&w, &host);
    assert_eq!(host.calls.borrow().get("get_property"), Some(&1));
    *host.answer.borrow_mut() = b"data: {}\n\n".to_vec();
    a.on_response_body(&w, &host, 10);
    assert_eq!(clock(&host), 1);
    assert!(!a.timing.prefill);
    a.on_response_body(&w, &host, 10);
    assert_eq!(clock(&host), 1, "later chunks read nothing");
    // A hit on x: x now runs two requests, y one.
    let (mut d, _) = start_stream(&w, &host, 12, &chat("alpha ", 8 * 1024, "q2"));
    assert_eq!(host.header(DESTINATION_HEADER).unwrap(), x);
    assert!(!d.timing.prefill, "a hit has nothing to prefill");
    // At 500 ms B has run 2.5x as long as A's prefill took.
    host.now.set(ms(500));
    w.on_tick(&host);
    let slow = w.router.member_slowness();
    assert!(slow[slot_of(&y).index()] >= 2400, "{slow:?}");
    let (mut c, _) = start_stream(&w, &host, 13, &streamed_chat("gamma ", 8 * 1024, "q"));
    assert_eq!(
        host.header(DESTINATION_HEADER).unwrap(),
        x,
        "not the overdue pod"
    );
    assert!(
        !c.timing.prefill,
        "x had no free slot as far as the VM knew"
    );
    // B ends without answering: its prefill is no longer timed, and the
    // VM ticks slowly again.
    for (s, _) in [(&mut a, 0), (&mut b, 1), (&mut c, 2), (&mut d, 3)] {
        s.on_done(&w, &host);
    }
    assert!(!w.router.prefills_open());
    w.on_tick(&host);
    assert_eq!(w.tick_ms(), crate::worker::TICK_MS);
    // An error answer's first bytes come at once: not timed.
    let (mut e, _) = start_stream(&w, &host, 14, &streamed_chat("delta ", 8 * 1024, "q"));
    assert!(e.timing.prefill);
    let busy = 503i64.to_le_bytes().to_vec();
    host.properties
        .borrow_mut()
        .insert("response.code".into(), busy);
    e.on_response_headers(&w, &host);
    assert!(!e.timing.prefill && !w.router.prefills_open());
    e.on_done(&w, &host);
}

/// With two worker VMs, what one VM's prefill timing reads reaches the
/// other on their ticks (one get per tick each, and one set by the VM
/// whose reading is new): B, which timed nothing, reads the overdue pod
/// slow too.
#[test]
fn a_pod_one_worker_vm_reads_slow_reads_slow_in_the_other() {
    let host = TestHost::default();
    let a = worker_on(&host, "");
    let b = worker_on(&host, "");
    b.set_root_context(2);
    for w in [&a, &b, &a] {
        w.on_tick(&host);
    }
    let t0 = host.now.get();
    let ms = |n: u64| t0 + n * 1_000_000;
    // A times a prefill on each pod; the first answers at 200 ms.
    let (mut x, _) = start_stream(&a, &host, 10, &streamed_chat("alpha ", 8 * 1024, "q"));
    let (mut y, _) = start_stream(&a, &host, 11, &streamed_chat("beta ", 8 * 1024, "q"));
    let slow_pod = host.header(DESTINATION_HEADER).unwrap();
    host.now.set(ms(200));
    *host.answer.borrow_mut() = b"data: {}\n\n".to_vec();
    x.on_response_body(&a, &host, 10);
    host.now.set(ms(500));
    host.reset_calls();
    a.on_tick(&host);
    let a_calls = host.calls.borrow().clone();
    host.reset_calls();
    b.on_tick(&host);
    let b_calls = host.calls.borrow().clone();
    let slot = {
        let fleet = b.router.fleet();
        let member = fleet.all().find(|&(_, _, addr)| addr == slow_pod);
        member.map(|(slot, _, _)| slot).unwrap()
    };
    let slow = b.router.member_slowness();
    assert!(
        slow.get(slot.index()).copied().unwrap_or(0) >= 2400,
        "{slow:?}"
    );
    let n = |calls: &BTreeMap<&str, u32>, k: &str| calls.get(k).copied().unwrap_or(0);
    // A's set is its reading (the tick's other sets are the in-flight
    // exchange and stats, the same for both).
    assert_eq!(
        n(&a_calls, "set_shared_data"),
        n(&b_calls, "set_shared_data") + 1
    );
    for s in [&mut x, &mut y] {
        s.on_done(&a, &host);
    }
}

mod place;

const INSPECT: &str =
    r#","inspect":{"path":"/debug/t","filter_chain":"admin_debug","max_buckets":4}"#;

#[test]
fn the_inspect_path_is_answered_on_the_named_filter_chain_only() {
    let host = TestHost::default();
    let w = worker_on(&host, INSPECT);
    // One routed request, so the table holds records of one pod.
    let (_, routed) = run(
        &w,
        &host,
        &chat("You are a helpful assistant. ", 2000, "hi"),
    );
    assert_eq!(routed, Verdict::Continue);
    host.properties
        .borrow_mut()
        .insert("xds.filter_chain_name".into(), b"admin_debug".to_vec());
    host.request("GET", "/debug/t?from=0", b"");
    host.reset_calls();
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, true), Verdict::Pause);
    let answer = s.take_answer().expect("answered by the filter");
    assert_eq!(answer.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(v["read"]["buckets_read"], 4);
    assert_eq!(v["read"]["max_buckets_per_request"], 4);
    assert_eq!(host.header(DESTINATION_HEADER), None, "never routed");
    // The listener's name, 4 buckets and the two registries; nothing written.
    let calls = host.calls.borrow().clone();
    assert_eq!(calls.get("get_property"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("get_shared_data"), Some(&6), "{calls:?}");
    assert_eq!(calls.get("set_shared_data"), None, "{calls:?}");
    assert!(s.take_answer().is_none(), "taken once");

    // Another method there: refused by the filter, still not forwarded.
    host.request("POST", "/debug/t", b"{}");
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, false), Verdict::Pause);
    assert_eq!(s.take_answer().map(|a| a.status), Some(405));

    // The same path on another chain: an ordinary request.
    host.properties
        .borrow_mut()
        .insert("xds.filter_chain_name".into(), b"ingress".to_vec());
    host.request("GET", "/debug/t", b"");
    let mut s = Stream::default();
    assert_eq!(s.on_request_headers(&w, &host, true), Verdict::Continue);
    assert!(s.take_answer().is_none());
    assert_eq!(
        host.stat("prefix_router.passthrough.path"),
        0,
        "counted on tick"
    );
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.passthrough.path"), 1);
}

#[test]
fn inspection_costs_other_requests_no_hostcall() {
    let body = chat("You are a helpful assistant. ", 2000, "hi");
    let plain = TestHost::default();
    let w = worker_on(&plain, "");
    let (n_plain, calls_plain) = calls_of(&w, &plain, &body);
    let on = TestHost::default();
    let w = worker_on(&on, INSPECT);
    let (n_on, calls) = calls_of(&w, &on, &body);
    assert_eq!(n_on, n_plain, "{calls:?}");
    assert_eq!(calls, calls_plain);
}
