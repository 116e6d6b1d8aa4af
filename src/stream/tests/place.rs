//! New prompts placed through Redis (`sync.place_new`), on the host double:
//! what is asked, what a reply does, and every way it can fail.

use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const PLACE_ON: &str = r#","sync":{"enabled":true,"place_new":true}"#;

/// `addr` as Redis's reply to a placement (the script's array, QUIT's +OK).
fn reply_naming(addr: &str) -> Vec<u8> {
    format!("*1\r\n${}\r\n{addr}\r\n+OK\r\n", addr.len()).into_bytes()
}

/// The token of the last bridge call (the double numbers them from 1).
fn last_token(host: &TestHost) -> u32 {
    host.bridge_calls.borrow().len() as u32
}

fn last_call(host: &TestHost) -> String {
    String::from_utf8_lossy(host.bridge_calls.borrow().last().unwrap()).into_owned()
}

/// The member a placement named (the argument after the VM's name).
fn member_of(call: &str) -> String {
    call.split("\r\n")
        .find(|p| {
            p.contains(':') && p.len() > 17 && p.bytes().all(|b| b.is_ascii_hexdigit() || b == b':')
        })
        .unwrap()
        .to_string()
}

/// worker_on's first tick said the VM lives (call 1); Redis answers it.
fn heartbeat_answered(w: &Worker, host: &TestHost) {
    assert_eq!(host.bridge_calls.borrow().len(), 1);
    assert!(w.placer.on_reply(1, Some(b":0\r\n+OK\r\n"), &w.meter));
    host.bridge_calls.borrow_mut().clear();
}

#[test]
fn a_new_prompt_waits_for_redis_and_goes_where_it_says() {
    let host = TestHost::default();
    let w = worker_on(&host, PLACE_ON);
    heartbeat_answered(&w, &host);
    let body = chat("a brand new prompt ", 3000, "hi");
    let (mut s, v) = start_stream(&w, &host, 10, &body);
    assert_eq!(v, Verdict::Pause, "it waits for Redis");
    assert_eq!(host.header(DESTINATION_HEADER), None, "no pod named yet");
    assert_eq!(host.bridge_calls.borrow().len(), 1);
    let call = last_call(&host);
    assert!(call.contains("EVAL") && call.contains(PODS[0]) && call.contains(PODS[1]));
    let member = member_of(&call);
    // The worker's own pick goes first; Redis names the other pod.
    let own = *PODS.iter().min_by_key(|p| call.find(*p)).unwrap();
    let other = *PODS.iter().find(|&&p| p != own).unwrap();
    // Redis answers 640 us later (the host's clock, not the tick's).
    host.now.set(host.now.get() + 640_000);
    let v = s.on_place_reply(&w, &host, 1, Some(&reply_naming(other)));
    assert_eq!(v, Some(Verdict::Continue));
    assert_eq!(host.header(DESTINATION_HEADER).as_deref(), Some(other));
    assert_eq!(s.on_place_reply(&w, &host, 1, None), None, "answered once");
    w.meter.flush(&host);
    assert_eq!(
        host.stat("prefix_router.place.wait_us"),
        640,
        "the wait, timed"
    );
    // Recorded there: the same prompt is a local match, asking nothing.
    let (mut again, v) = start_stream(&w, &host, 11, &body);
    assert_eq!(v, Verdict::Continue);
    assert_eq!(host.header(DESTINATION_HEADER).as_deref(), Some(other));
    assert_eq!(host.bridge_calls.borrow().len(), 1);
    again.on_done(&w, &host);
    again.on_log(&w, &host);
    // Its end is released in Redis on the tick, with the member it named.
    s.on_done(&w, &host);
    s.on_log(&w, &host);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 2);
    let release = last_call(&host);
    assert!(release.contains(&member), "{release}");
    assert_eq!(host.stat("prefix_router.place.asked"), 1);
    assert_eq!(host.stat("prefix_router.routed.placed"), 1);
    assert_eq!(host.stat("prefix_router.routed.prefix_match"), 1);
    assert_eq!(host.stat("prefix_router.place.failed"), 0);
}

#[test]
fn a_failed_placement_takes_the_own_pick_and_backs_off_for_a_second() {
    let host = TestHost::default();
    let w = worker_on(&host, PLACE_ON);
    heartbeat_answered(&w, &host);
    let (mut s, v) = start_stream(&w, &host, 10, &chat("first new ", 3000, "a"));
    assert_eq!(v, Verdict::Pause);
    // A timeout or reset reaches the stream as no reply.
    assert_eq!(
        s.on_place_reply(&w, &host, 1, None),
        Some(Verdict::Continue)
    );
    let dest = host.header(DESTINATION_HEADER).expect("routed anyway");
    assert!(PODS.contains(&dest.as_str()));
    // Within the second: new prompts take the own pick at once.
    let (_, v) = start_stream(&w, &host, 11, &chat("second new ", 3000, "b"));
    assert_eq!(v, Verdict::Continue);
    assert_eq!(host.bridge_calls.borrow().len(), 1);
    // After it (the tick's clock), they ask again. The tick first sends
    // the failed placement's release (it may have been counted).
    host.now.set(host.now.get() + 1_100_000_000);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 2, "the release");
    let (_, v) = start_stream(&w, &host, 12, &chat("third new ", 3000, "c"));
    assert_eq!(v, Verdict::Pause);
    assert_eq!(host.bridge_calls.borrow().len(), 3);
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.place.failed"), 1);
    assert_eq!(host.stat("prefix_router.place.asked"), 2);
    assert_eq!(host.stat("prefix_router.routed.no_match"), 2);
}

#[test]
fn a_reply_naming_no_candidate_or_garbage_is_never_followed() {
    for bad in [
        reply_naming("6.6.6.6:1"),
        b"-ERR script failed\r\n+OK\r\n".to_vec(),
        reply_naming(PODS[0])[..8].to_vec(),
        b"\x00\x01\x02".to_vec(),
    ] {
        let host = TestHost::default();
        let w = worker_on(&host, PLACE_ON);
        heartbeat_answered(&w, &host);
        let (mut s, v) = start_stream(&w, &host, 10, &chat("hostile ", 3000, "x"));
        assert_eq!(v, Verdict::Pause);
        let member = member_of(&last_call(&host));
        assert_eq!(
            s.on_place_reply(&w, &host, 1, Some(&bad)),
            Some(Verdict::Continue)
        );
        let dest = host.header(DESTINATION_HEADER).unwrap();
        assert!(PODS.contains(&dest.as_str()), "{dest}");
        w.on_tick(&host);
        assert_eq!(host.stat("prefix_router.place.failed"), 1);
        assert!(
            last_call(&host).contains(&member),
            "released: it may be counted"
        );
    }
}

#[test]
fn a_stream_ending_while_placed_is_released_and_its_late_reply_ignored() {
    let host = TestHost::default();
    let w = worker_on(&host, PLACE_ON);
    heartbeat_answered(&w, &host);
    let (mut s, v) = start_stream(&w, &host, 10, &chat("gone ", 3000, "x"));
    assert_eq!(v, Verdict::Pause);
    let member = member_of(&last_call(&host));
    s.on_done(&w, &host);
    s.on_log(&w, &host);
    assert_eq!(
        s.on_place_reply(&w, &host, 1, Some(&reply_naming(PODS[0]))),
        None
    );
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.place.abandoned"), 1);
    assert!(last_call(&host).contains(&member));
    // Nothing was counted in flight or recorded for it.
    for pod in PODS {
        let name = format!("prefix_router.inflight.{}", pod.replace(['.', ':'], "_"));
        assert_eq!(host.stat(&name), 0);
    }
}

#[test]
fn a_refused_call_routes_at_once_and_is_counted() {
    let host = TestHost::default();
    let w = worker_on(&host, PLACE_ON);
    heartbeat_answered(&w, &host);
    host.bridge_refuses.set(true);
    let (_, v) = start_stream(&w, &host, 10, &chat("refused ", 3000, "x"));
    assert_eq!(v, Verdict::Continue);
    assert!(host.header(DESTINATION_HEADER).is_some());
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.place.skipped"), 1);
    assert_eq!(host.stat("prefix_router.place.asked"), 0);
}

#[test]
fn matched_prompts_and_the_setting_off_ask_nothing() {
    let host = TestHost::default();
    let w = worker_on(&host, r#","sync":{"enabled":true,"place_new":false}"#);
    let (_, v) = start_stream(&w, &host, 10, &chat("off ", 3000, "x"));
    assert_eq!(v, Verdict::Continue);
    w.on_tick(&host);
    assert!(
        host.bridge_calls.borrow().is_empty(),
        "no placement, no heartbeat"
    );
}

#[test]
fn the_setting_unset_asks_on_a_synced_load_aware_worker() {
    let host = TestHost::default();
    let w = worker_on(&host, r#","sync":{"enabled":true}"#);
    heartbeat_answered(&w, &host);
    let (_, v) = start_stream(&w, &host, 10, &chat("unset ", 3000, "x"));
    assert_eq!(v, Verdict::Pause, "waits for Redis's placement");
    assert!(last_call(&host).contains("EVAL"));
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.place.asked"), 1);
}

#[test]
fn the_tick_says_the_vm_lives_and_retries_a_failed_release() {
    let host = TestHost::default();
    let w = worker_on(&host, PLACE_ON);
    heartbeat_answered(&w, &host);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 0, "at most every 2 s");
    host.now.set(host.now.get() + 2_000_000_000);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 1);
    assert!(w.placer.on_reply(1, Some(b":0\r\n+OK\r\n"), &w.meter));
    // A placed request ends; its release fails and goes again.
    let (mut s, _) = start_stream(&w, &host, 10, &chat("retry ", 3000, "x"));
    let member = member_of(&last_call(&host));
    let _ = s.on_place_reply(&w, &host, 2, Some(&reply_naming(PODS[0])));
    s.on_done(&w, &host);
    s.on_log(&w, &host);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 3);
    assert!(last_call(&host).contains(&member));
    assert!(w.placer.on_reply(3, None, &w.meter));
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 4);
    assert!(last_call(&host).contains(&member), "sent again");
    assert!(!w.placer.on_reply(99, None, &w.meter), "not a release call");
    // Unanswered for twice its timeout: sent again anyway.
    host.now.set(host.now.get() + 2_100_000_000);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 5);
    assert!(last_call(&host).contains(&member));
    assert_eq!(host.stat("prefix_router.place.release_failed"), 1);
}

#[test]
fn in_cluster_mode_calls_go_to_the_master_the_singleton_named() {
    let host = TestHost::default();
    let w = worker_on(&host, r#","sync":{"enabled":true,"cluster":true}"#);
    // No master named yet: neither the heartbeat nor a placement is sent,
    // and the new prompt goes to the worker's own pick.
    assert!(host.bridge_calls.borrow().is_empty());
    let (_, v) = start_stream(&w, &host, 10, &chat("unnamed ", 3000, "x"));
    assert_eq!(v, Verdict::Continue);
    assert!(host.header(DESTINATION_HEADER).is_some());
    assert!(host.bridge_calls.borrow().is_empty());
    w.on_tick(&host);
    assert_eq!(host.stat("prefix_router.place.skipped"), 1);
    // Named: the heartbeat goes there with the next due tick, then the
    // placement.
    host.set(crate::sync::place::NODE_KEY, b"10.0.0.9:7000", None)
        .unwrap();
    host.now.set(host.now.get() + 2_000_000_000);
    w.on_tick(&host);
    assert_eq!(host.bridge_calls.borrow().len(), 1, "the heartbeat");
    heartbeat_answered(&w, &host);
    let (_, v) = start_stream(&w, &host, 11, &chat("named ", 3000, "x"));
    assert_eq!(v, Verdict::Pause);
    assert!(last_call(&host).contains("{aibrix:pl}:vms"));
    let nodes = host.bridge_nodes.borrow();
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| n.as_deref() == Some("10.0.0.9:7000")));
}

#[test]
fn on_one_redis_calls_name_no_node() {
    let host = TestHost::default();
    let w = worker_on(&host, PLACE_ON);
    heartbeat_answered(&w, &host);
    host.set(crate::sync::place::NODE_KEY, b"10.0.0.9:7000", None)
        .unwrap();
    let (_, v) = start_stream(&w, &host, 10, &chat("one redis ", 3000, "x"));
    assert_eq!(v, Verdict::Pause);
    assert!(host.bridge_nodes.borrow().iter().all(Option::is_none));
}

/// The placement reply of a followed claim: `addr`, the claim's age and
/// its record.
fn reply_following(addr: &str, age_ms: u64, record: &str) -> Vec<u8> {
    format!(
        "*3\r\n${}\r\n{addr}\r\n:{age_ms}\r\n${}\r\n{record}\r\n+OK\r\n",
        addr.len(),
        record.len()
    )
    .into_bytes()
}

/// The claim record a placement call carried (the asker's own prompt).
fn record_of(call: &str) -> String {
    call.split("\r\n")
        .find(|p| p.starts_with("31:"))
        .expect("a record")
        .to_string()
}

const CLAIM_ON: &str = r#","sync":{"enabled":true,"place_new":true,"place_claim_ms":1000}"#;

/// A worker with claims on whose prefill timing reads 2 ms per block on
/// every pod.
fn claim_worker(host: &TestHost, extra: &str) -> Worker {
    let w = worker_on(host, &format!("{CLAIM_ON}{extra}"));
    heartbeat_answered(&w, host);
    let slots: Vec<_> = w.router.fleet().all().map(|(slot, _, _)| slot).collect();
    let now_ms = host.now.get() / 1_000_000;
    for (i, slot) in slots.into_iter().enumerate() {
        assert!(w
            .router
            .prefill_started(900 + i as u32, slot, 100, now_ms - 200));
        w.router.prefill_answered(900 + i as u32, now_ms);
    }
    w
}

#[test]
fn a_claims_follower_waits_for_the_prefill_that_set_it_by_the_pods_timing() {
    let host = TestHost::default();
    let w = claim_worker(&host, "");
    let body = streamed_chat("one family's long system prompt. ", 6000, "q");
    let (mut s, v) = start_stream(&w, &host, 10, &body);
    assert_eq!(v, Verdict::Pause, "asks Redis");
    let record = record_of(&last_call(&host));
    assert!(
        last_call(&host).contains(&format!("{record}\r\n$1\r\n1\r\n")),
        "it says it can wait"
    );
    let total: u64 = record
        .rsplit(',')
        .next()
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .parse::<u64>()
        .unwrap()
        + 1;
    assert!(total > 40, "{record}");
    // Redis answers 15 ms after the last tick: the wait runs from now.
    host.now.set(host.now.get() + 15_000_000);
    // The claim was set 60 ms ago by a prompt of the same blocks: its
    // prefill takes 2 ms a block here, so it has total x 2 - 60 ms left.
    let v = s.on_place_reply(&w, &host, 1, Some(&reply_following(PODS[1], 60, &record)));
    assert_eq!(v, Some(Verdict::Pause), "held for the claim's prefill");
    assert_eq!(host.header(DESTINATION_HEADER).as_deref(), Some(PODS[1]));
    assert_eq!(w.meter.pending(Count::HeldForClaim), 1);
    assert_eq!(w.meter.pending(Count::Held), 1);
    assert_eq!(w.tick_ms(), crate::worker::FAST_TICK_MS);
    let wait_ms = total * 2 - 60 + total * 2 / 16;
    let start = host.now.get();
    host.now.set(start + (wait_ms - 1) * 1_000_000);
    w.on_tick(&host);
    assert!(host.resumed.borrow().is_empty(), "not before its deadline");
    host.now.set(start + wait_ms * 1_000_000);
    w.on_tick(&host);
    assert_eq!(host.resumed.borrow().len(), 1, "resumed at its deadline");
    assert_eq!(host.resumed.borrow()[0].0, 10);
    w.meter.flush(&host);
    assert_eq!(host.stat("prefix_router.hold.held_claim"), 1);
    assert_eq!(
        host.stat("prefix_router.hold.timed_out"),
        0,
        "by design, no timeout"
    );
    s.on_done(&w, &host);
    s.on_log(&w, &host);
}

#[test]
fn a_claims_follower_goes_at_once_when_a_wait_would_not_pay() {
    let body = streamed_chat("another family's long system prompt. ", 6000, "q");
    let other = streamed_chat("a different opening altogether, long. ", 6000, "q");
    // (extra settings, claim age ms, record from the other prompt, timing)
    for (extra, age, foreign, timed) in [
        ("", 10_000, false, true), // its prefill is done by now
        ("", 5, false, true),      // so young that computing is as fast
        ("", 60, true, true),      // shares nothing with it
        ("", 60, false, false),    // no prefill timed yet
        (r#","hold":{"enabled":false}"#, 60, false, true), // hold off
        (r#","hold":{"max_ms":10}"#, 60, false, true), // over hold.max_ms
    ] {
        let host = TestHost::default();
        let w = if timed {
            claim_worker(&host, extra)
        } else {
            let w = worker_on(&host, &format!("{CLAIM_ON}{extra}"));
            heartbeat_answered(&w, &host);
            w
        };
        let record = if foreign {
            let (mut o, _) = start_stream(&w, &host, 5, &other);
            let r = record_of(&last_call(&host));
            o.on_done(&w, &host);
            o.on_log(&w, &host);
            r
        } else {
            String::new()
        };
        let calls = host.bridge_calls.borrow().len() as u32;
        let (mut s, v) = start_stream(&w, &host, 10, &body);
        assert_eq!(v, Verdict::Pause, "asks Redis");
        let call = last_call(&host);
        let can_wait = if timed && !extra.contains("false") {
            "1"
        } else {
            "0"
        };
        assert!(
            call.contains(&format!("{}\r\n$1\r\n{can_wait}\r\n", record_of(&call))),
            "{extra} {timed}: it says whether it can wait"
        );
        let record = if foreign { record } else { record_of(&call) };
        let v = s.on_place_reply(
            &w,
            &host,
            calls + 1,
            Some(&reply_following(PODS[1], age, &record)),
        );
        assert_eq!(
            v,
            Some(Verdict::Continue),
            "{extra} {age} {foreign} {timed}"
        );
        assert_eq!(host.header(DESTINATION_HEADER).as_deref(), Some(PODS[1]));
        assert_eq!(w.meter.pending(Count::HeldForClaim), 0);
        s.on_done(&w, &host);
        s.on_log(&w, &host);
    }
}
