use super::*;

const STALE: u64 = 1750;

fn rec(pod: &str, at_ms: u64, waiting: u32) -> SharedRecord {
    SharedRecord {
        pod: pod.into(),
        at_ms,
        signals: PodSignals {
            waiting,
            running: 2,
            token_us: None,
        },
    }
}

fn bulk(b: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", b.len()).into_bytes();
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
    out
}

/// The reply Redis gives to `HSET, PEXPIRE, [HDEL,] HGETALL, QUIT`, with
/// `fields` as the hash.
fn reply(fields: &[(&str, Vec<u8>)], hdel: bool) -> Vec<u8> {
    let mut out = b":1\r\n:1\r\n".to_vec();
    if hdel {
        out.extend_from_slice(b":1\r\n");
    }
    out.extend_from_slice(format!("*{}\r\n", fields.len() * 2).as_bytes());
    for (name, value) in fields {
        out.extend(bulk(name.as_bytes()));
        out.extend(bulk(value));
    }
    out.extend_from_slice(b"+OK\r\n");
    out
}

fn pods(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.0.0.{i}:8000")).collect()
}

#[test]
fn values_round_trip_and_hostile_lines_are_skipped() {
    let mut timed = rec("10.0.0.2:8000", 1000, 0);
    timed.signals.token_us = Some(9_000);
    let records = vec![rec("10.0.0.1:8000", 900, 3), timed];
    let value = encode(&records, 1000);
    assert_eq!(
        String::from_utf8(value.clone()).unwrap(),
        "v2 1000\n10.0.0.1:8000 100 3 2 - -\n10.0.0.2:8000 0 0 2 - 9000\n"
    );
    assert_eq!(decode(&value), Some((1000, records)));
    // An older replica writes its pods' KV-cache usage in the fifth field:
    // read, and the number ignored.
    let (_, older) = decode(b"v2 1000\nold:1 5 1 2 300 -\n").unwrap();
    assert_eq!(older.len(), 1);
    assert_eq!((older[0].signals.waiting, older[0].signals.running), (1, 2));
    let hostile = b"v2 1000\n\
        a:1 5 1 1 - -\n\
        b:1 5 99999999 1 - -\n\
        c:1 5 1 1 1001 -\n\
        d:1 x 1 1 - -\n\
        e:1 5 1 1 -\n\
        f:1 5 1 1 - - extra\n\
        g:1 5 1 1 - 60000001\n\
        h:1 5 1 1 - 1.5\n\
        i:1 5 1 1 - -1\n\
        j:1 5 1 1 - 60000000\n\
        \xff\n";
    assert_eq!(decode(hostile), None, "not UTF-8");
    let hostile = &hostile[..hostile.len() - 2];
    let (_, got) = decode(hostile).unwrap();
    let names: Vec<&str> = got.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(names, ["a:1", "j:1"]);
    assert_eq!(got[0].signals.token_us, None);
    assert_eq!(got[1].signals.token_us, Some(60_000_000));
    assert_eq!(decode(b"v3 1000\n"), None);
    assert_eq!(decode(b""), None);
    // A name with a space or a newline is not written (it would split).
    assert_eq!(encode(&[rec("a b", 1, 1)], 1), b"v2 1\n".to_vec());
}

#[test]
fn a_value_from_an_earlier_version_is_read_without_token_latency() {
    // What a replica of the version before wrote: five fields a line.
    let v1 = b"v1 1000\n10.0.0.1:8000 100 3 2 300\nb:1 5 1 1 - 9000\n";
    let (written, got) = decode(v1).unwrap();
    assert_eq!(written, 1000);
    assert_eq!(
        got,
        vec![rec("10.0.0.1:8000", 900, 3)],
        "six fields are not v1"
    );
    // And the replica's exchange takes it as a live peer's.
    let mut a = Share::new("a", "pr", 250, STALE);
    let now = 10_000;
    assert!(a.due(now, 1000, true));
    let _ = a.request(&[], now, None);
    let value = b"v1 10000\n10.0.0.1:8000 0 3 2 300\n".to_vec();
    assert_eq!(a.on_reply(Some(&reply(&[("b", value)], false)), now), Ok(1));
    let got: Vec<&SharedRecord> = a.remote(now).collect();
    assert_eq!((got.len(), got[0].signals.token_us), (1, None));
}

#[test]
fn alone_a_replica_scrapes_every_pod() {
    let s = Share::new("a", "aibrix", 250, STALE);
    assert_eq!(s.key(), "aibrix:{signals}:pods");
    assert!(pods(20).iter().all(|p| s.scrapes(p, 1000)));
}

#[test]
fn live_replicas_split_the_pods_and_each_pod_has_one_owner() {
    let names = ["a", "b", "c"];
    let mut shares: Vec<Share> = names
        .iter()
        .map(|n| Share::new(n, "p", 250, STALE))
        .collect();
    let all = pods(60);
    // Two rounds: each replica's value lists the pods it scrapes (all of
    // them while it knows no other), then every replica reads all values.
    let now = 10_000;
    for round in 0..2 {
        let now = now + round * 250;
        let values: Vec<(&str, Vec<u8>)> = names
            .iter()
            .zip(&shares)
            .map(|(n, s)| {
                let own: Vec<SharedRecord> = all
                    .iter()
                    .filter(|p| s.scrapes(p, now))
                    .map(|p| rec(p, now, 1))
                    .collect();
                (*n, encode(&own, now))
            })
            .collect();
        for s in &mut shares {
            s.request(&[], now, None);
            assert_eq!(s.on_reply(Some(&reply(&values, false)), now), Ok(2));
        }
    }
    let now = now + 250;
    let mut counts = [0usize; 3];
    for p in &all {
        let owners: Vec<usize> = (0..3)
            .filter(|&i| shares[i].owner(p, now) == names[i])
            .collect();
        assert_eq!(owners.len(), 1, "{p}: {owners:?}");
        counts[owners[0]] += 1;
        // Every replica agrees on the owner, and only it scrapes the pod.
        let scrapers = shares.iter().filter(|s| s.scrapes(p, now)).count();
        assert_eq!(scrapers, 1, "{p}");
    }
    assert!(counts.iter().all(|&c| c >= 10), "uneven split {counts:?}");
    // The others' records are there for the pods this replica does not scrape.
    let remote: Vec<&str> = shares[0].remote(now).map(|r| r.pod.as_str()).collect();
    assert_eq!(remote.len(), 60 - counts[0]);
}

#[test]
fn a_dead_replicas_pods_pass_to_the_others_and_its_field_is_deleted() {
    let mut a = Share::new("a", "p", 250, STALE);
    let all = pods(40);
    let now = 10_000;
    let b_own: Vec<SharedRecord> = all.iter().map(|p| rec(p, now, 1)).collect();
    a.request(&[], now, None);
    a.on_reply(Some(&reply(&[("b", encode(&b_own, now))], false)), now)
        .unwrap();
    let mine = all.iter().filter(|p| a.scrapes(p, now)).count();
    assert!(mine < 40 && mine > 5, "{mine}");
    // B stops writing: once its value is stale, A scrapes every pod.
    let later = now + STALE + 1;
    a.request(&[], later, None);
    a.on_reply(Some(&reply(&[("b", encode(&b_own, now))], false)), later)
        .unwrap();
    assert_eq!(a.live_peers(later), 0);
    assert!(all.iter().all(|p| a.scrapes(p, later)));
    // Long dead: its field is deleted with the next exchange (HDEL).
    let gone = now + STALE * DEAD_AFTER_STALE + 1;
    a.request(&[], gone, None);
    a.on_reply(Some(&reply(&[("b", encode(&b_own, now))], false)), gone)
        .unwrap();
    let body = a.request(&[], gone + 250, None);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("HDEL\r\n$1\r\np\r\n") || text.contains("$4\r\nHDEL"),
        "{text}"
    );
    assert!(text.contains("\r\n$1\r\nb\r\n"), "{text}");
    assert!(a.on_reply(Some(&reply(&[], true)), gone + 250).is_ok());
}

#[test]
fn a_pod_its_owner_did_not_report_is_scraped_by_everyone() {
    let mut a = Share::new("a", "p", 250, STALE);
    let all = pods(40);
    let now = 10_000;
    // B is alive but reports nothing (it cannot reach the pods, say).
    a.request(&[], now, None);
    a.on_reply(Some(&reply(&[("b", encode(&[], now))], false)), now)
        .unwrap();
    assert_eq!(a.live_peers(now), 1);
    assert!(all.iter().all(|p| a.scrapes(p, now)));
}

#[test]
fn failed_or_hostile_exchanges_change_nothing_and_never_panic() {
    let mut a = Share::new("a", "p", 250, STALE);
    let now = 10_000;
    assert!(
        a.on_reply(Some(b":1\r\n"), now).is_err(),
        "nothing in flight"
    );
    for bad in [
        None,
        Some(&b"-ERR wrong"[..]),
        Some(&b":1\r\n:1\r\n*2\r\n$1\r\nb\r\n"[..]),
        Some(&b":1\r\n-WRONGTYPE\r\n*0\r\n+OK\r\n"[..]),
        Some(&b":1\r\n:1\r\n:5\r\n+OK\r\n"[..]),
        Some(&b"\x00\xff garbage"[..]),
    ] {
        a.request(&[], now, None);
        assert!(a.on_reply(bad, now).is_err(), "{bad:?}");
    }
    // A value from the future is refused; a field that is not ours is skipped.
    let future = encode(&[rec("x:1", now + 100_000, 1)], now + 100_000);
    a.request(&[], now, None);
    let r = reply(&[("b", future), ("c", b"hello".to_vec())], false);
    assert_eq!(a.on_reply(Some(&r), now), Ok(0));
    assert_eq!(a.remote(now).count(), 0);
}

#[test]
fn an_exchange_follows_each_scrape_round_or_an_interval_and_a_lost_call_is_given_up() {
    let mut a = Share::new("a", "p", 250, STALE);
    assert!(a.due(0, 1000, false));
    a.request(&[], 0, None);
    assert!(!a.due(300, 1000, true), "in flight");
    assert!(a.due(1001, 1000, false), "given up after the timeout");
    a.request(&[], 1001, None);
    a.on_reply(Some(&reply(&[], false)), 1002).unwrap();
    assert!(!a.due(1100, 1000, false));
    assert!(a.due(1110, 1000, true), "a completed round goes at once");
    a.request(&[], 1110, None);
    a.on_reply(Some(&reply(&[], false)), 1112).unwrap();
    assert!(!a.due(1300, 1000, false));
    assert!(a.due(1361, 1000, false), "an interval after the last");
}

#[test]
fn the_request_authenticates_first_and_ends_with_hgetall() {
    let mut a = Share::new("a", "p", 250, STALE);
    let body = a.request(&[rec("x:1", 5, 1)], 10, Some((None, "pw")));
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with("*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n"),
        "{text}"
    );
    let hset = text.find("HSET").unwrap();
    let hgetall = text.find("HGETALL").unwrap();
    let quit = text.find("QUIT").unwrap();
    assert!(hset < hgetall && hgetall < quit);
    // AUTH's +OK comes first in the reply.
    let mut r = b"+OK\r\n".to_vec();
    r.extend(reply(&[], false));
    assert_eq!(a.on_reply(Some(&r), 10), Ok(0));
}

#[test]
fn at_most_max_peers_are_remembered_the_freshest_kept() {
    let mut a = Share::new("a", "p", 250, STALE);
    let now = 10_000;
    let n = MAX_PEERS + 44;
    let values: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| (format!("r{i}"), encode(&[], now - i as u64)))
        .collect();
    let fields: Vec<(&str, Vec<u8>)> = values
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    a.request(&[], now, None);
    assert_eq!(a.on_reply(Some(&reply(&fields, false)), now), Ok(MAX_PEERS));
    assert!(a.peers.contains_key("r0"));
    assert!(!a.peers.contains_key(&format!("r{}", n - 1)));
}
