//! End-to-end tests: run the podsim binary on a free port and talk HTTP/1.1 to it.
//! Every server is started with --exit-after-secs, so none outlives the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Pod {
    child: Child,
    port: u16,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ready_path(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!(
        "podsim-test-{}-{tag}-{nanos}.port",
        std::process::id()
    ))
}

fn start(tag: &str, extra: &[&str]) -> Pod {
    let ready = ready_path(tag);
    let mut child = Command::new(env!("CARGO_BIN_EXE_podsim"))
        .args(["--port", "0", "--exit-after-secs", "60", "--ready-file"])
        .arg(&ready)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        if let Ok(s) = std::fs::read_to_string(&ready) {
            break s.parse::<u16>().unwrap();
        }
        assert!(Instant::now() < deadline, "podsim did not become ready");
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_file(&ready);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim_end(), format!("listening on 127.0.0.1:{port}"));
    Pod { child, port }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..nl]).unwrap().trim(), 16).unwrap();
        raw = &raw[nl + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked")
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn post(port: u16, path: &str, body: &Value) -> Reply {
    request(port, "POST", path, &[], &body.to_string())
}

fn metric(port: u16, series: &str) -> f64 {
    let page = request(port, "GET", "/metrics", &[], "").body;
    page.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} not in\n{page}"))
        .parse()
        .unwrap()
}

fn sse_events(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "{body:?}");
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("bad event {e:?}"))
                .to_owned()
        })
        .collect()
}

const FAST: &[&str] = &["--time-scale", "0", "--name", "pod-a"];

#[test]
fn completions_cache_and_metrics() {
    let pod = start("cmpl", FAST);
    let prompt = "x".repeat(64 * 3 + 10); // 51 tokens: 3 full blocks of 16
    let r = post(
        pod.port,
        "/v1/completions",
        &json!({"model": "whatever", "prompt": prompt, "max_tokens": 5}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-served-by"), Some("pod-a"));
    let v = r.json();
    assert_eq!(v["served_by"], "pod-a");
    assert_eq!(v["model"], "whatever");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["prompt_tokens"], 51);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 56);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let r = post(pod.port, "/v1/completions", &json!({"prompt": prompt}));
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 48);
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["model"], "sim-model");

    let l = "{model_name=\"sim-model\"}";
    assert_eq!(
        metric(pod.port, &format!("vllm:prefix_cache_queries_total{l}")),
        102.0
    );
    assert_eq!(
        metric(pod.port, &format!("vllm:prefix_cache_hits_total{l}")),
        48.0
    );
    assert_eq!(
        metric(pod.port, &format!("vllm:num_requests_running{l}")),
        0.0
    );
    assert_eq!(
        metric(pod.port, &format!("vllm:num_requests_waiting{l}")),
        0.0
    );
    assert_eq!(
        metric(pod.port, &format!("vllm:kv_cache_usage_perc{l}")),
        0.0
    );
    assert_eq!(metric(pod.port, "podsim_requests_total"), 2.0);
    assert_eq!(metric(pod.port, "podsim_kv_cached_blocks"), 3.0);

    // Batch of token-id lists: one choice each.
    let r = post(
        pod.port,
        "/v1/completions",
        &json!({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2}),
    );
    let v = r.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

#[test]
fn chat_stream_with_usage() {
    let pod = start("chat", FAST);
    let body = json!({
        "messages": [{"role": "system", "content": "s".repeat(100)}, {"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "max_tokens": 3,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    let r = post(pod.port, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-served-by"), Some("pod-a"));
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_events(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    // role chunk, 3 token chunks, usage chunk
    assert_eq!(chunks.len(), 5);
    assert!(chunks.iter().all(|c| c["served_by"] == "pod-a"));
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert!(chunks[2]["choices"][0]["finish_reason"].is_null());
    let usage = &chunks[4]["usage"];
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 3);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();

    // Non-streaming repeat hits the cached blocks.
    let mut again = body.clone();
    again["stream"] = json!(false);
    let v = post(pod.port, "/v1/chat/completions", &again).json();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap(), prompt_tokens);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        prompt_tokens / 16 * 16
    );
    assert_eq!(v["choices"][0]["message"]["content"], " the quick brown");
}

#[test]
fn completion_stream_without_usage() {
    let pod = start("cstream", FAST);
    let r = post(
        pod.port,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2, "stream": true}),
    );
    let events = sse_events(&r.body);
    assert_eq!(events.len(), 3);
    assert_eq!(events[2], "[DONE]");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["text"], " the");
    assert_eq!(first["served_by"], "pod-a");
    assert!(first.get("usage").is_none());
}

#[test]
fn errors_and_side_endpoints() {
    let pod = start("misc", &["--time-scale", "0", "--model", "m1,m2"]);
    let name = format!("127.0.0.1:{}", pod.port);

    let r = request(pod.port, "POST", "/v1/completions", &[], "{not json");
    assert_eq!(r.status, 400);
    assert_eq!(r.header("x-served-by"), Some(name.as_str()));
    let v = r.json();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("malformed JSON"));
    assert_eq!(v["served_by"], name);

    let r = post(pod.port, "/v1/chat/completions", &json!({"messages": "no"}));
    assert_eq!(r.status, 400);
    assert_eq!(request(pod.port, "GET", "/nope", &[], "").status, 404);
    assert_eq!(
        request(pod.port, "GET", "/v1/completions", &[], "").status,
        405
    );

    let r = request(pod.port, "GET", "/health", &[], "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-served-by"), Some(name.as_str()));

    let v = request(pod.port, "GET", "/v1/models", &[], "").json();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1", "m2"]);

    let v = post(pod.port, "/tokenize", &json!({"prompt": "abcdefghi"})).json();
    assert_eq!(v["count"], 3);
    assert_eq!(v["max_model_len"], 32768);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let tok = post(pod.port, "/tokenize", &chat).json();
    let rendered = post(pod.port, "/v1/chat/completions/render", &chat).json();
    assert_eq!(rendered["token_ids"], tok["tokens"]);
    let rendered = post(
        pod.port,
        "/v1/completions/render",
        &json!({"prompt": ["abcdefghi", "ab"]}),
    )
    .json();
    assert_eq!(rendered[0]["token_ids"], v["tokens"]);
    assert_eq!(rendered[1]["token_ids"].as_array().unwrap().len(), 1);

    let r = request(
        pod.port,
        "POST",
        "/v1/completions",
        &[("x-sim-delay-ms", "soon")],
        "{}",
    );
    assert_eq!(r.status, 400);
}

#[test]
fn sim_delay_and_latency_model() {
    // 1 slot, 10 ms per decode step, no prefill cost.
    let pod = start(
        "latency",
        &[
            "--slots",
            "1",
            "--prefill-us-per-token",
            "0",
            "--decode-us-per-token",
            "10000",
            "--name",
            "slow",
        ],
    );
    let body = json!({"prompt": "hello", "max_tokens": 11}).to_string();
    let t = Instant::now();
    let r = request(pod.port, "POST", "/v1/completions", &[], &body);
    assert_eq!(r.status, 200);
    let plain = t.elapsed();
    assert!(plain >= Duration::from_millis(100), "{plain:?}"); // 10 further tokens x 10 ms

    let t = Instant::now();
    let r = request(
        pod.port,
        "POST",
        "/v1/completions",
        &[("x-sim-delay-ms", "150")],
        &body,
    );
    assert_eq!(r.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );

    // Two concurrent requests on one slot: the second waits for the first.
    let port = pod.port;
    let t = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || request(port, "POST", "/v1/completions", &[], &body).status)
        })
        .collect();
    for th in threads {
        assert_eq!(th.join().unwrap(), 200);
    }
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
}

/// With `--prefill-stalls-decode`, a prefill makes one gap of each request
/// decoding meanwhile late by its duration, in the inter-token latency
/// histogram too when the reply is not streamed (as vLLM counts its steps),
/// rather than stretching every gap a little.
#[test]
fn a_prefill_makes_one_gap_of_a_non_streamed_reply_late() {
    let pod = start(
        "stalls",
        &[
            "--slots",
            "2",
            "--prefill-us-per-token",
            "1000",
            "--decode-us-per-token",
            "8000",
            "--prefill-stalls-decode",
        ],
    );
    let port = pod.port;
    // 40 gaps of 8 ms; 100 ms in, a 200-token prompt (200 ms of prefill).
    let decoding = std::thread::spawn(move || {
        post(
            port,
            "/v1/completions",
            &json!({"prompt": "hi", "max_tokens": 41}),
        )
        .status
    });
    std::thread::sleep(Duration::from_millis(100));
    let prompt = "abcd".repeat(200);
    let r = post(
        port,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1}),
    );
    assert_eq!((r.status, decoding.join().unwrap()), (200, 200));
    let bucket = |le: &str| {
        metric(
            port,
            &format!(
                "vllm:inter_token_latency_seconds_bucket{{model_name=\"sim-model\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!(
        (bucket("0.01"), bucket("0.2"), bucket("0.3"), bucket("+Inf")),
        (39.0, 39.0, 40.0, 40.0)
    );
}

#[test]
fn exits_by_itself() {
    let ready = ready_path("exit");
    let mut child = Command::new(env!("CARGO_BIN_EXE_podsim"))
        .args(["--port", "0", "--exit-after-secs", "1", "--ready-file"])
        .arg(&ready)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("podsim did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        std::fs::read_to_string(&ready)
            .unwrap()
            .parse::<u16>()
            .unwrap()
            > 0
    );
    let _ = std::fs::remove_file(&ready);
}

#[test]
fn bad_flags_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_podsim"))
        .args(["--port", "0", "--slots", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--slots"));
}
