//! Parsing pods' `/metrics`, the scrape schedule and the published value.

use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn p(n: u16) -> PodSlot {
    PodSlot::new(n)
}

const VLLM: &str = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0
vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5
vllm:prompt_tokens_total{model_name=\"m\"} 1234.0
";

fn names() -> MetricNames {
    MetricNames::default()
}

#[test]
fn vllm_body_gives_waiting_and_running() {
    let s = parse(VLLM.as_bytes(), &names()).unwrap();
    assert_eq!(
        s,
        PodSignals {
            waiting: 2,
            running: 3,
            token_us: None,
        }
    );
}

#[test]
fn the_kv_cache_usage_is_not_read_so_an_absurd_one_spoils_nothing() {
    // No rule reads a pod's KV-cache usage: a value out of range (which
    // earlier builds refused, dropping the pod's report) leaves the report.
    let body = VLLM.replace("} 0.5", "} 1.5");
    assert!(body.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 1.5"));
    let s = parse(body.as_bytes(), &names()).unwrap();
    assert_eq!((s.waiting, s.running), (2, 3));
}

#[test]
fn series_of_several_models_are_summed() {
    let body = "vllm:num_requests_waiting{model_name=\"a\"} 1\n\
                vllm:num_requests_waiting{model_name=\"b\"} 4\n\
                vllm:num_requests_running{model_name=\"a\"} 2\n\
                vllm:num_requests_running{model_name=\"b\"} 2\n\
                vllm:kv_cache_usage_perc{model_name=\"a\"} 0.1\n\
                vllm:kv_cache_usage_perc{model_name=\"b\"} 0.7\n";
    let s = parse(body.as_bytes(), &names()).unwrap();
    assert_eq!((s.waiting, s.running), (5, 4));
}

#[test]
fn waiting_and_running_are_required() {
    let s = parse(
        b"vllm:num_requests_waiting 0\nvllm:num_requests_running 1\n",
        &names(),
    )
    .unwrap();
    assert_eq!((s.waiting, s.running), (0, 1));
    assert_eq!(
        parse(b"vllm:num_requests_running 1\n", &names()),
        Err(SignalError::Missing("waiting"))
    );
    assert_eq!(
        parse(b"vllm:num_requests_waiting 1\n", &names()),
        Err(SignalError::Missing("running"))
    );
    assert_eq!(parse(b"", &names()), Err(SignalError::Missing("waiting")));
}

#[test]
fn absurd_values_are_refused() {
    let ok_running = "vllm:num_requests_running 1\n";
    for bad in ["-1", "NaN", "+Inf", "abc", "1e12"] {
        let body = format!("{ok_running}vllm:num_requests_waiting {bad}\n");
        assert_eq!(
            parse(body.as_bytes(), &names()),
            Err(SignalError::Absurd("waiting")),
            "{bad}"
        );
    }
    // One bad series of several spoils the sum.
    let body = format!(
        "{ok_running}vllm:num_requests_waiting{{a=\"1\"}} 1\nvllm:num_requests_waiting{{a=\"2\"}} x\n"
    );
    assert_eq!(
        parse(body.as_bytes(), &names()),
        Err(SignalError::Absurd("waiting"))
    );
}

#[test]
fn labels_with_braces_quotes_timestamps_and_crlf_are_read() {
    let body = "vllm:num_requests_waiting{path=\"}{\",q=\"a\\\"}\"} 7 1700000000000\r\n\
                  vllm:num_requests_running   2\r\n";
    let s = parse(body.as_bytes(), &names()).unwrap();
    assert_eq!((s.waiting, s.running), (7, 2));
}

#[test]
fn names_are_configurable_for_other_servers() {
    let sglang = MetricNames {
        waiting: vec!["sglang:num_queue_reqs".into()],
        running: vec!["sglang:num_running_reqs".into()],
        token_latency: vec!["sglang:inter_token_latency_seconds".into()],
    };
    let body = "sglang:num_queue_reqs{model_name=\"m\"} 3\n\
                sglang:num_running_reqs{model_name=\"m\"} 8\n\
                sglang:token_usage{model_name=\"m\"} 0.9\n";
    let s = parse(body.as_bytes(), &sglang).unwrap();
    assert_eq!((s.waiting, s.running), (3, 8));
    assert!(parse(body.as_bytes(), &names()).is_err());
}

#[test]
fn a_metric_whose_name_only_starts_like_a_wanted_one_is_not_read() {
    let body = "vllm:num_requests_waiting_total 9\nvllm:num_requests_waiting 1\n\
                vllm:num_requests_running 1\n";
    assert_eq!(parse(body.as_bytes(), &names()).unwrap().waiting, 1);
}

#[test]
fn garbage_never_panics() {
    let inputs: [&[u8]; 8] = [
        b"{",
        b"vllm:num_requests_waiting{",
        b"vllm:num_requests_waiting{a=\"",
        b"\xff\xfe vllm:num_requests_waiting \xff",
        b"#\n#\n\n\n",
        b"vllm:num_requests_waiting",
        b"   \t  ",
        b"}}}} 1 2 3",
    ];
    for i in inputs {
        assert!(parse(i, &names()).is_err());
    }
}

#[test]
fn records_round_trip_and_a_partial_record_is_ignored() {
    let records = vec![
        Record {
            slot: p(3),
            at_ms: 1_700_000_000_123,
            signals: PodSignals {
                waiting: 1,
                running: 2,
                token_us: Some(3_000),
            },
        },
        Record {
            slot: p(1023),
            at_ms: 5,
            signals: PodSignals {
                waiting: u32::MAX,
                running: 0,
                token_us: None,
            },
        },
    ];
    let mut bytes = encode(&records);
    assert_eq!(bytes.len(), 2 * RECORD);
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(decode(&bytes), records);
}

#[test]
fn the_published_value_is_bounded() {
    let records: Vec<Record> = (0..MAX_SLOTS as u16 + 100)
        .map(|slot| Record {
            slot: p(slot),
            at_ms: 0,
            signals: PodSignals::default(),
        })
        .collect();
    assert_eq!(encode(&records).len(), MAX_SLOTS * RECORD);
}

#[test]
fn workers_ignore_stale_records() {
    let rec = |slot, at_ms| Record {
        slot,
        at_ms,
        signals: PodSignals {
            waiting: 1,
            running: 1,
            token_us: None,
        },
    };
    let bytes = encode(&[rec(p(1), 1_000), rec(p(2), 9_000)]);
    let view = SignalView::from_published(&bytes, 10_000, 2_000);
    assert_eq!(view.get(p(1)), None);
    assert!(view.get(p(2)).is_some());
}

/// A vLLM body whose inter-token latency histogram holds `count` tokens
/// over `sum` seconds (two models' series; `extra` lines after).
fn with_tokens(sum: f64, count: u64, extra: &str) -> String {
    let half = sum / 2.0;
    format!(
        "{VLLM}\
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{model_name=\"m\",le=\"0.01\"}} {count}
vllm:inter_token_latency_seconds_sum{{model_name=\"m\"}} {half}
vllm:inter_token_latency_seconds_count{{model_name=\"m\"}} {c1}
vllm:inter_token_latency_seconds_sum{{model_name=\"n\"}} {half}
vllm:inter_token_latency_seconds_count{{model_name=\"n\"}} {c2}
{extra}",
        c1 = count / 2,
        c2 = count - count / 2,
    )
}

#[test]
fn token_latency_totals_are_summed_over_series_and_need_sum_and_count_of_one_name() {
    let (s, t) = parse_with_totals(with_tokens(0.3, 100, "").as_bytes(), &names()).unwrap();
    assert_eq!(s.token_us, None, "parse leaves the mean to the scraper");
    let t = t.unwrap();
    assert!((t.sum_secs - 0.3).abs() < 1e-9 && t.count == 100.0, "{t:?}");
    // The older name counts only when the newer is absent.
    let older = format!(
        "{}vllm:time_per_output_token_seconds_sum 9\nvllm:time_per_output_token_seconds_count 1\n",
        with_tokens(0.3, 100, "")
    );
    let t = parse_with_totals(older.as_bytes(), &names())
        .unwrap()
        .1
        .unwrap();
    assert_eq!(t.count, 100.0);
    // A sum of one name and a count of the other, a bad value, or only
    // the buckets: no totals, and the scrape is still good.
    for body in [
        format!("{VLLM}vllm:inter_token_latency_seconds_sum 1\nvllm:time_per_output_token_seconds_count 5\n"),
        format!("{VLLM}vllm:inter_token_latency_seconds_sum NaN\nvllm:inter_token_latency_seconds_count 5\n"),
        format!("{VLLM}vllm:inter_token_latency_seconds_bucket{{le=\"+Inf\"}} 5\n"),
        VLLM.to_string(),
    ] {
        let (s, t) = parse_with_totals(body.as_bytes(), &names()).unwrap();
        assert_eq!((s.waiting, t), (2, None), "{body}");
    }
}

#[test]
fn the_scraper_weighs_a_pods_recent_tokens_most() {
    let mut s = Scraper::new(250, names());
    let at = std::cell::Cell::new(0);
    let scrape = |s: &mut Scraper, sum: f64, count: u64| {
        s.due(at.get(), &[target(1)]);
        s.on_reply(p(1), Ok(with_tokens(sum, count, "").as_bytes()), at.get());
        at.set(at.get() + 250);
        decode(&s.take_publish().unwrap())[0].signals.token_us
    };
    // First scrape: the mean over all the pod's tokens.
    assert_eq!(scrape(&mut s, 0.09, 30), Some(3_000));
    // 10 more tokens at 9 ms, the 30 before weighing 0.8 each:
    // (0.072 + 0.09) s over 34.
    assert_eq!(scrape(&mut s, 0.18, 40), Some(4_765));
    // No token since: the value stands (nothing decays).
    assert_eq!(scrape(&mut s, 0.18, 40), Some(4_765));
    // (0.162 x 0.8 + 0.09) s over 37.2.
    assert_eq!(scrape(&mut s, 0.27, 50), Some(5_903));
    // A span whose mean is absurd (a minute per token) is not added.
    assert_eq!(scrape(&mut s, 120.27, 51), Some(5_903));
    // 10 more at 9 ms: (0.2196 x 0.8 + 0.09) s over 39.76.
    assert_eq!(scrape(&mut s, 120.36, 61), Some(6_682));
    // The pod restarted (its count went back): its new totals alone.
    assert_eq!(scrape(&mut s, 0.01, 10), Some(1_000));
    // A pod without the histogram, or one with no token yet: none.
    assert_eq!(scrape(&mut s, 0.0, 0), None);
    s.due(at.get(), &[target(1)]);
    s.on_reply(p(1), Ok(VLLM.as_bytes()), at.get());
    at.set(at.get() + 250);
    assert_eq!(decode(&s.take_publish().unwrap())[0].signals.token_us, None);
    // An absurd mean (over a minute per token) is ignored.
    assert_eq!(scrape(&mut s, 120.0, 1), None);
}

/// A vLLM body whose inter-token latency histogram (with its buckets, one
/// model's series; a label before `le` whose name ends like it) holds
/// `fast` tokens of 3 ms and `late` ones of 625 ms.
fn with_late_tokens(fast: u64, late: u64) -> String {
    let name = "vllm:inter_token_latency_seconds";
    let mut body = format!("{VLLM}# TYPE {name} histogram\n");
    for le in ["0.01", "0.025", "0.05", "0.1", "0.5", "0.75", "1.0", "+Inf"] {
        let n = if le == "0.01" || le == "0.025" || le == "0.05" || le == "0.1" || le == "0.5" {
            fast
        } else {
            fast + late
        };
        body += &format!("{name}_bucket{{handle=\"le\",model_name=\"m\",le=\"{le}\"}} {n}\n");
    }
    let sum = fast as f64 * 0.003 + late as f64 * 0.625;
    body += &format!("{name}_sum{{model_name=\"m\"}} {sum}\n");
    body += &format!("{name}_count{{model_name=\"m\"}} {}\n", fast + late);
    body
}

#[test]
fn the_buckets_are_read_by_their_le_label() {
    let (_, t) = parse_with_totals(with_late_tokens(90, 10).as_bytes(), &names()).unwrap();
    assert_eq!(t.unwrap().buckets.map(|b| b.total()), Some(100.0));
    // Buckets that do not add up to the count are not used.
    let short = with_late_tokens(90, 10).replace("le=\"+Inf\"} 100", "le=\"+Inf\"} 90");
    let (_, t) = parse_with_totals(short.as_bytes(), &names()).unwrap();
    assert_eq!(t.unwrap().buckets, None);
}

/// Scrapes pod 1's `body` at `at` (then 250 ms on) and returns the time per
/// output token the scraper publishes.
fn scrape_every_250_ms(s: &mut Scraper, at: &mut u64, body: &str) -> Option<u32> {
    s.due(*at, &[target(1)]);
    s.on_reply(p(1), Ok(body.as_bytes()), *at);
    *at += 250;
    decode(&s.take_publish().unwrap())[0].signals.token_us
}

/// A page rendered while observations landed (its buckets short of the
/// count) is passed over: the late tokens it saw are not taken by their mean,
/// the next page that adds up covers them. Past [`MAX_TORN_SCRAPES`] in a
/// row, the pod is taken to export no usable buckets.
#[test]
fn a_torn_histogram_page_is_passed_over_not_taken_by_its_mean() {
    let mut s = Scraper::new(250, names());
    let mut at = 0;
    let mut scrape = |s: &mut Scraper, body: String| scrape_every_250_ms(s, &mut at, &body);
    let torn = |fast: u64, late: u64| {
        let n = fast + late;
        with_late_tokens(fast, late).replace(
            &format!("le=\"+Inf\"}} {n}"),
            &format!("le=\"+Inf\"}} {}", n - 1),
        )
    };
    assert_eq!(scrape(&mut s, with_late_tokens(900, 100)), Some(3_000));
    // Torn: the value stands; its 100 late tokens are not taken by the mean.
    assert_eq!(scrape(&mut s, torn(950, 200)), Some(3_000));
    // The next whole page covers the torn one's tokens by their buckets.
    assert_eq!(scrape(&mut s, with_late_tokens(1_000, 200)), Some(3_000));
    // A pod whose pages stay torn is read by its mean after three.
    for k in 1..=MAX_TORN_SCRAPES as u64 {
        assert_eq!(scrape(&mut s, torn(1_000 + k, 300)), Some(3_000));
    }
    let mean = scrape(&mut s, torn(1_010, 300));
    assert!(mean.is_some_and(|us| us > 3_000), "{mean:?}");
}

#[test]
fn tokens_held_back_by_prefills_do_not_make_a_pod_read_slow() {
    let mut s = Scraper::new(250, names());
    let mut at = 0;
    let mut scrape = |s: &mut Scraper, body: String| scrape_every_250_ms(s, &mut at, &body);
    // A tenth of the tokens 625 ms late: the mean would say 65 ms.
    assert_eq!(scrape(&mut s, with_late_tokens(900, 100)), Some(3_000));
    // 100 more tokens and 1,000 more late ones: with the older tokens at
    // 0.8, 820 on time and 1,080 late. Most are late: they are the pod's
    // pace, none is left out (the mean, 357 ms).
    assert_eq!(
        scrape(&mut s, with_late_tokens(1_000, 1_100)),
        Some(356_558)
    );
    // Without buckets, the mean (as servers without them).
    let mut s = Scraper::new(250, names());
    assert_eq!(scrape(&mut s, with_tokens(0.09, 30, "")), Some(3_000));
}

#[test]
fn a_shared_record_keeps_this_replicas_token_latency() {
    let mut s = Scraper::new(250, names());
    s.due(0, &[target(1)]);
    s.on_reply(p(1), Ok(with_tokens(0.03, 10, "").as_bytes()), 100);
    s.set_remote([Record {
        slot: p(1),
        at_ms: 200,
        signals: PodSignals {
            waiting: 7,
            running: 1,
            token_us: None,
        },
    }]);
    let r = decode(&s.take_publish().unwrap())[0];
    assert_eq!((r.signals.waiting, r.signals.token_us), (7, Some(3_000)));
}

#[test]
fn a_shared_record_brings_the_scrapers_token_latency() {
    // A pod this replica does not scrape: the shared record is all it has.
    let mut s = Scraper::new(250, names());
    s.set_remote([Record {
        slot: p(2),
        at_ms: 200,
        signals: PodSignals {
            waiting: 1,
            running: 1,
            token_us: Some(9_000),
        },
    }]);
    let r = decode(&s.take_publish().unwrap())[0];
    assert_eq!((r.slot, r.signals.token_us), (p(2), Some(9_000)));
    // Fresher than this replica's own scrape: the scraper's timing wins.
    s.due(0, &[target(2)]);
    s.on_reply(p(2), Ok(with_tokens(0.03, 10, "").as_bytes()), 100);
    let r = decode(&s.take_publish().unwrap())[0];
    assert_eq!(r.signals.token_us, Some(9_000));
}

fn target(n: u16) -> Target {
    Target {
        slot: p(n),
        address: format!("10.0.0.{n}:8000"),
        cluster: "pods".into(),
    }
}

#[test]
fn scraper_calls_each_pod_once_per_interval_and_never_twice_in_flight() {
    let mut s = Scraper::new(250, names());
    let targets = [target(1), target(2), target(2)];
    assert_eq!(
        s.due(0, &targets).len(),
        2,
        "a slot listed twice is called once"
    );
    assert!(s.due(100, &targets).is_empty(), "not due yet");
    // Pod 1 answered, pod 2 still in flight at the next round.
    s.on_reply(p(1), Ok(VLLM.as_bytes()), 120);
    let next = s.due(250, &targets);
    assert_eq!(next.iter().map(|t| t.slot).collect::<Vec<_>>(), vec![p(1)]);
}

#[test]
fn a_failed_or_absurd_scrape_drops_the_pods_record_and_says_why() {
    let mut s = Scraper::new(250, names());
    s.due(0, &[target(1)]);
    assert_eq!(s.on_reply(p(1), Ok(VLLM.as_bytes()), 10), Outcome::Scraped);
    let published = s.take_publish().unwrap();
    assert_eq!(decode(&published)[0].signals.waiting, 2);
    assert_eq!(s.take_publish(), None, "published once per change");
    s.due(250, &[target(1)]);
    let out = s.on_reply(p(1), Ok(b"vllm:num_requests_waiting -3\n"), 260);
    assert!(matches!(out, Outcome::Fallback(ref why) if why.contains("absurd")));
    assert!(decode(&s.take_publish().unwrap()).is_empty());
    s.due(500, &[target(1)]);
    assert!(matches!(
        s.on_reply(p(1), Err("timeout"), 510),
        Outcome::Fallback(_)
    ));
    assert_eq!(s.good(), 0);
}

#[test]
fn a_pod_that_left_loses_its_record() {
    let mut s = Scraper::new(250, names());
    s.due(0, &[target(1), target(2)]);
    s.on_reply(p(1), Ok(VLLM.as_bytes()), 1);
    s.on_reply(p(2), Ok(VLLM.as_bytes()), 1);
    s.take_publish();
    s.due(250, &[target(2)]);
    let left = decode(&s.take_publish().unwrap());
    assert_eq!(left.iter().map(|r| r.slot).collect::<Vec<_>>(), vec![p(2)]);
}

#[test]
fn a_call_that_could_not_be_sent_frees_the_slot_for_the_next_round() {
    let mut s = Scraper::new(250, names());
    s.due(0, &[target(1)]);
    assert!(matches!(
        s.not_sent(p(1), "no cluster"),
        Outcome::Fallback(_)
    ));
    assert_eq!(s.due(250, &[target(1)]).len(), 1);
}

#[test]
fn workers_remember_the_most_a_pod_ran_at_once() {
    let rec = |running| Record {
        slot: p(7),
        at_ms: 1_000,
        signals: PodSignals {
            waiting: 0,
            running,
            token_us: None,
        },
    };
    let mut view = SignalView::default();
    assert_eq!(view.capacity(p(7)), 0);
    view.update(&encode(&[rec(4)]), 1_000, 500, |_, _| 0);
    view.update(&encode(&[rec(1)]), 1_000, 500, |_, _| 0);
    assert_eq!(view.get(p(7)).unwrap().running, 1);
    assert_eq!(view.capacity(p(7)), 4);
    // A stale record is not current, and teaches nothing.
    view.update(&encode(&[rec(9)]), 5_000, 500, |_, _| 0);
    assert_eq!((view.get(p(7)), view.capacity(p(7))), (None, 4));
}

#[test]
fn a_report_counts_as_foreign_only_what_this_replica_did_not_send() {
    let rec = |at_ms, waiting, running| Record {
        slot: p(3),
        at_ms,
        signals: PodSignals {
            waiting,
            running,
            token_us: None,
        },
    };
    let mut view = SignalView::default();
    // The pod ran 4 and queued 2; this replica had at most 5 on it since
    // the report (taken at 900): one is someone else's.
    view.update(&encode(&[rec(900, 2, 4)]), 1_000, 500, |pod, at| {
        assert_eq!((pod, at), (p(3), 900));
        5
    });
    assert_eq!(view.seen(p(3)).unwrap().foreign, 1);
    // Fewer than this replica had: nothing foreign (never below 0).
    view.update(&encode(&[rec(900, 0, 2)]), 1_000, 500, |_, _| 5);
    assert_eq!(view.seen(p(3)).unwrap().foreign, 0);
}

#[test]
fn shared_records_fill_the_pods_this_replica_does_not_scrape() {
    let mut s = Scraper::new(250, names());
    let targets = [Target {
        slot: p(0),
        address: "a:1".into(),
        cluster: "c".into(),
    }];
    s.due(0, &targets);
    s.on_reply(p(0), Ok(VLLM.as_bytes()), 100);
    let _ = s.take_publish();
    let remote = |slot: u16, at_ms: u64, waiting: u32| Record {
        slot: p(slot),
        at_ms,
        signals: PodSignals {
            waiting,
            running: 1,
            token_us: None,
        },
    };
    // Pod 1 only from another replica; pod 0 from both, this one's fresher.
    s.set_remote([remote(1, 90, 7), remote(0, 50, 9)]);
    assert_eq!(s.good(), 2);
    let published = decode(&s.take_publish().expect("changed"));
    let by_slot: Vec<(u16, u64, u32)> = published
        .iter()
        .map(|r| (r.slot.index() as u16, r.at_ms, r.signals.waiting))
        .collect();
    assert_eq!(by_slot, [(0, 100, 2), (1, 90, 7)]);
    // Only this replica's own scrape is shared on.
    assert_eq!(s.own().map(|r| r.slot).collect::<Vec<_>>(), [p(0)]);
    // The same remote records again: nothing new to publish.
    s.set_remote([remote(1, 90, 7), remote(0, 50, 9)]);
    assert_eq!(s.take_publish(), None);
    // A fresher remote record wins over an older own one.
    s.set_remote([remote(0, 200, 4)]);
    let published = decode(&s.take_publish().expect("changed"));
    assert_eq!(published.len(), 1);
    assert_eq!((published[0].at_ms, published[0].signals.waiting), (200, 4));
}
