//! Pod signals through a real Envoy: the singleton reads each pod's
//! `/metrics` through the pods' own `override_host` cluster, and routing
//! sees load the filter did not send (another replica's, or clients going
//! straight to the pod).

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::thread;
use std::time::Duration;

use harness::{completion_body, send, text, wait_until, Running, Setup, CLIENT_TIMEOUT};
use serde_json::json;

/// POSTs a completions request straight to the pod on `port`, bypassing
/// Envoy.
fn post_to_pod(port: u16, body: &serde_json::Value) -> Result<harness::Reply, String> {
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    let body = body.to_string();
    send(
        "POST",
        &url,
        &[("content-type", "application/json")],
        Some(body.as_bytes()),
        CLIENT_TIMEOUT,
    )
}

/// One Envoy, load-aware, scraping its pods every 100 ms.
fn signals_setup() -> Setup {
    Setup::new("single.yaml")
        .plugin_field(
            "signals",
            json!({"enabled": true, "cluster": "pods", "interval_ms": 100}),
        )
        .plugin_field("policy", json!({"mode": "load_aware"}))
}

fn with_signals() -> Running {
    signals_setup().start()
}

#[test]
fn load_the_filter_never_saw_moves_a_matched_prefix_off_the_busy_pod() {
    let mut run = with_signals();
    assert!(
        run.envoy
            .router_stat_within("prefix_router.signals.scrapes", 8, Duration::from_secs(10))
            >= 8,
        "{:?}",
        run.envoy.router_stats()
    );
    let prefix = text(71, 4096);
    let body = |i: u64| completion_body(&json!(format!("{prefix}{}", text(9000 + i, 200))));
    let home = run.post("/v1/completions", &body(0)).expect_pod();
    // Control: idle fleet, the prefix stays home.
    assert_eq!(run.post("/v1/completions", &body(1)).expect_pod(), home);

    // The home pod again, on its port, now with real (simulated) compute
    // time and 2 slots; the table still says it holds the prefix.
    let port = run.pod_named(&home).port;
    {
        let dir = &run.dir;
        let pod = run.pods.iter_mut().find(|p| p.name == home).unwrap();
        pod.kill();
        *pod = harness::Pod::start_with(dir, &home, port, &["--time-scale", "1", "--slots", "2"]);
    }
    // Eight long requests straight to it (2 run, 6 wait: 8 > the slack of
    // 4), bypassing Envoy: only the pod's own metrics show them.
    let holders: Vec<_> = (0..8)
        .map(|i| {
            let body = json!({"model": "m", "prompt": text(500 + i, 64), "max_tokens": 1500});
            thread::spawn(move || post_to_pod(port, &body))
        })
        .collect();
    let busy = wait_until(Duration::from_secs(5), || {
        harness::get(&format!("http://127.0.0.1:{port}/metrics"))
            .map(|r| {
                r.body
                    .contains("vllm:num_requests_waiting{model_name=\"sim-model\"} 6")
            })
            .unwrap_or(false)
    });
    assert!(busy, "the home pod never showed 6 waiting");
    // Published by the singleton, read by the workers on their tick.
    thread::sleep(Duration::from_millis(800));
    let moved = run.post("/v1/completions", &body(2)).expect_pod();
    assert_ne!(moved, home, "the busy pod still took its prefix");
    assert_eq!(
        run.envoy.router_stat("prefix_router.signals.fallbacks"),
        0,
        "{:?}",
        run.envoy.router_stats()
    );
    for h in holders {
        assert_eq!(h.join().unwrap().unwrap().status, 200);
    }
}

#[test]
fn a_pod_whose_metrics_fail_is_counted_and_leaves_the_published_signals() {
    let mut run = with_signals();
    assert!(
        run.envoy
            .router_stat_within("prefix_router.signals.scrapes", 4, Duration::from_secs(10))
            >= 4
    );
    run.pods
        .iter_mut()
        .find(|p| p.name == "pod-4")
        .unwrap()
        .kill();
    assert!(
        run.envoy.router_stat_within(
            "prefix_router.signals.fallbacks",
            1,
            Duration::from_secs(10)
        ) >= 1,
        "{:?}",
        run.envoy.router_stats()
    );
    let gauge = wait_until(Duration::from_secs(5), || {
        run.envoy.router_stat("prefix_router.signals.pods") == 3
    });
    assert!(gauge, "{:?}", run.envoy.router_stats());
}

/// Starts Redis and two replicas, `a` and `b` (`sync.yaml`: the filter and
/// the singleton), sharing their scrapes every `interval_ms`.
fn start_sharing_pair(f: &mut harness::fleet::Fleet, interval_ms: u64) {
    f.start_redis();
    let patch = json!({
        "signals": {"enabled": true, "cluster": "pods", "interval_ms": interval_ms, "share": true},
        "sync": {"period_ms": 2000}
    });
    let specs = ["a", "b"]
        .iter()
        .map(|n| f.spec(n, "sync.yaml").merge(patch.clone()).plugins(2))
        .collect();
    f.launch_all(specs);
}

/// Two replicas with `signals.share`: each pod is scraped about once per
/// interval by the pair (not once per replica), each replica publishes all
/// four pods' signals, the ones it scraped and the ones the other did, and
/// when one replica stops the other takes its pods over.
#[test]
fn replicas_share_scrapes_through_redis_and_take_over_a_stopped_ones_pods() {
    const INTERVAL_MS: u64 = 200;
    let mut f = harness::fleet::Fleet::new("signals-share");
    f.start_pods(&["--time-scale", "0"]);
    start_sharing_pair(&mut f, INTERVAL_MS);
    let settled = wait_until(Duration::from_secs(20), || {
        f.replicas.iter().all(|r| {
            r.stat("prefix_router.signals.share_peers") == 1
                && r.stat("prefix_router.signals.pods") == 4
                && r.stat("prefix_router.signals.shared") >= 5
        })
    });
    assert!(
        settled,
        "replicas never saw each other: {:?} / {:?}",
        f.replicas[0].stats(),
        f.replicas[1].stats()
    );
    let scrapes = |f: &harness::fleet::Fleet| -> Vec<i64> {
        f.replicas
            .iter()
            .map(|r| r.stat("prefix_router.signals.scrapes"))
            .collect()
    };
    let window = Duration::from_secs(4);
    let before = scrapes(&f);
    thread::sleep(window);
    let after = scrapes(&f);
    let total: i64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    // One scrape per pod per interval for the pair; each replica alone
    // would make as many again.
    let once = 4 * window.as_millis() as i64 / INTERVAL_MS as i64;
    eprintln!("scrapes in {window:?}: {before:?} -> {after:?}, {total} for the pair (one per pod per interval: {once})");
    assert!(
        total * 2 <= once * 3,
        "{total} scrapes: not shared ({once} expected)"
    );
    assert!(
        total * 2 >= once,
        "{total} scrapes: pods not read ({once} expected)"
    );
    assert_eq!(
        f.replicas[0].stat("prefix_router.signals.share_failures"),
        0
    );

    // B stops: once its value is stale (3 intervals + the timeout), A
    // scrapes every pod itself and still publishes all four.
    f.stop_envoy(1);
    let a = &f.replicas[0];
    let alone = wait_until(Duration::from_secs(10), || {
        a.stat("prefix_router.signals.share_peers") == 0
    });
    assert!(alone, "A still counts B as live: {:?}", a.stats());
    thread::sleep(Duration::from_millis(500));
    let before = a.stat("prefix_router.signals.scrapes");
    thread::sleep(window);
    let got = a.stat("prefix_router.signals.scrapes") - before;
    eprintln!("A alone: {got} scrapes in {window:?} (every pod every interval: {once})");
    assert!(
        got * 4 >= once * 3,
        "A took over only {got} scrapes of {once}"
    );
    assert_eq!(a.stat("prefix_router.signals.pods"), 4);
}

/// With `signals.share`, each pod's time per output token travels with its
/// shared record: both replicas take the 5x slower pod as slow (their
/// `slowness` gauges), including the one that does not scrape it and
/// never sent it a request.
#[test]
fn shared_signals_carry_a_pods_speed_to_the_replicas_that_do_not_scrape_it() {
    const INTERVAL_MS: u64 = 200;
    let mut f = harness::fleet::Fleet::new("signals-share-speed");
    for (i, &port) in f.pod_ports.clone().iter().enumerate() {
        let scale = if i == 0 { "10" } else { "2" };
        let pod = harness::Pod::start_with(
            &f.dir,
            &format!("pod-{}", i + 1),
            port,
            &["--time-scale", scale],
        );
        f.pods.push(pod);
    }
    // Streamed tokens straight to every pod (not through Envoy): the pods'
    // inter-token latency histograms fill, the filter times nothing itself.
    for &port in &f.pod_ports {
        let body = json!({"model": "m", "prompt": text(7, 16), "max_tokens": 20, "stream": true});
        post_to_pod(port, &body).unwrap();
    }
    start_sharing_pair(&mut f, INTERVAL_MS);
    let gauge = |port: u16| format!("prefix_router.slowness.127_0_0_1_{port}");
    let slow = gauge(f.pod_ports[0]);
    let fast: Vec<String> = f.pod_ports[1..].iter().map(|&p| gauge(p)).collect();
    let settled = wait_until(Duration::from_secs(20), || {
        f.replicas.iter().all(|r| {
            r.stat("prefix_router.signals.share_peers") == 1
                && r.stat("prefix_router.signals.shared") >= 5
        })
    });
    assert!(settled, "replicas never saw each other");
    // Past the start, when every pod is everyone's (no shared record yet):
    // by now each pod is scraped by its owner only.
    thread::sleep(Duration::from_millis(2000));
    for r in &f.replicas {
        let v = r.stat(&slow);
        assert!(v >= 2500, "{}: {slow} = {v} ({:?})", r.name, r.stats());
    }
    for r in &f.replicas {
        for g in &fast {
            let v = r.stat(g);
            assert!((1000..2000).contains(&v), "{}: {g} = {v}", r.name);
        }
    }
}

/// A pod whose decoding is held back by the prefills it computes (podsim
/// `--prefill-stalls-decode`, as a vLLM step carrying a prefill chunk) is
/// not taken for a slow pod: its late tokens are left out of its time per
/// output token. Its mean inter-token latency is over twice the others'
/// here, and the `slowness` gauges stay under the 1.5x that counts as slow
/// for every pod.
#[test]
fn prefills_holding_back_a_pods_decoding_do_not_make_it_read_slow() {
    let run = signals_setup()
        .pod_args(&[
            "--time-scale",
            "1",
            "--slots",
            "8",
            "--decode-us-per-token",
            "3000",
            "--prefill-stalls-decode",
        ])
        .start();
    let ports: Vec<u16> = run.pods.iter().map(|p| p.port).collect();
    // Every pod decodes three streams of 150 tokens (~0.45 s); the first
    // also computes six 4,096-token prompts (~0.2 s each) meanwhile.
    let mut clients = Vec::new();
    for (i, &port) in ports.iter().enumerate() {
        for s in 0..3 {
            let body = json!({"model": "m", "prompt": text(100 + s, 16), "max_tokens": 150, "stream": true});
            clients.push(thread::spawn(move || post_to_pod(port, &body)));
        }
        if i == 0 {
            let port = ports[0];
            clients.push(thread::spawn(move || {
                for n in 0..6 {
                    thread::sleep(Duration::from_millis(60));
                    let body =
                        json!({"model": "m", "prompt": text(900 + n, 16_384), "max_tokens": 1});
                    post_to_pod(port, &body)?;
                }
                post_to_pod(port, &json!({"model": "m", "prompt": "x", "max_tokens": 1}))
            }));
        }
    }
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap().status, 200);
    }
    let mean_ms = |port: u16| {
        let page = harness::get(&format!("http://127.0.0.1:{port}/metrics"))
            .unwrap()
            .body;
        let value = |suffix: &str| -> f64 {
            let name = format!("vllm:inter_token_latency_seconds_{suffix}{{");
            let line = page.lines().find(|l| l.starts_with(&name)).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        value("sum") / value("count") * 1e3
    };
    let means: Vec<f64> = ports.iter().map(|&p| mean_ms(p)).collect();
    assert!(
        means[1..].iter().all(|&m| means[0] > 2.0 * m),
        "the prefills did not hold the first pod back: mean ms {means:?}"
    );
    let gauge = |port: u16| format!("prefix_router.slowness.127_0_0_1_{port}");
    let read = wait_until(Duration::from_secs(5), || {
        ports.iter().all(|&p| run.envoy.router_stat(&gauge(p)) > 0)
    });
    assert!(read, "{:?}", run.envoy.router_stats());
    // Past a few more scrapes and worker ticks: the values stand.
    thread::sleep(Duration::from_millis(600));
    for &port in &ports {
        let v = run.envoy.router_stat(&gauge(port));
        assert!(
            (1000..1500).contains(&v),
            "{} = {v}, mean ms {means:?}",
            gauge(port)
        );
    }
}
