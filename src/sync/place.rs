//! Fleet-wide placement of new prompts through Redis (`sync.place_new`).
//!
//! Replicas balance on their own requests in flight and on the others' as
//! of the last sync; with no prefix to follow, three replicas then send
//! their new prompts to the same idle pod between two syncs (the
//! three-replica TTFT tail of issue 12; policy-notes, "What would close the
//! three-replica tail"). Here a request that no pod holds any of waits for
//! one script in Redis that picks among the candidates the worker allows
//! (the load-aware policy's bound) and counts the request there, so every
//! replica's next pick sees it.
//!
//! Keys, all under `{<key_prefix>:pl}:`, one hash tag, so one slot of a
//! Redis Cluster (whose master the singleton names to the workers through
//! shared data, [`NODE_KEY`]); every script declares [`slot_key`] so the
//! cluster checks it runs on that slot's master:
//! - `p:{pod}`: sorted set of that pod's placed requests in flight, scored
//!   by send time (unix ms);
//! - `v:{vm}`: hash of one worker VM's placed requests, member -> pod, so a
//!   release needs only the member and a dead VM's requests can be found;
//! - `vms`: sorted set of worker VMs by last sign of life (unix ms);
//! - `c:{family}`: the pod a prompt family went to, for `place_claim_ms`,
//!   with the claim's length and the setter's record (`pod \t ms \t
//!   record`, see [`crate::route::router::shared_with_claim`]); set when
//!   the family is placed by cost, and not extended by the placements that
//!   follow the claim, so it ends `place_claim_ms` after the family's first
//!   placement (within about a sync period, sync tells every replica's
//!   table of the family anyway).
//!
//! The pick: with `place_claim_ms` set, the pod the prompt's family (model
//! and first 32 blocks) was placed on within that time, if a candidate
//! (`c:{family}`; the reply then carries the claim's age, by its `PTTL`,
//! and record, for the follower's `hold`; a worker that cannot wait
//! follows it only while no placed request is in flight there);
//! else the lowest `cost + placed in flight x step`, where the worker sends
//! each candidate's prefill cost under its policy (a 3x slower pod's is
//! three times a fast one's) and what one more queued request adds there;
//! then the pod whose oldest placed request was sent longest ago (it frees
//! a slot first); then the candidates' order (the worker's preference, its
//! own pick first: among idle pods alike, the one its replica sent least
//! to). The worker's own view of the queues only bounds the candidates:
//! read by every replica at once, a stale picture herds (policy-notes).
//! Each call also reaps
//! up to [`REAP_PER_CALL`] VMs silent for [`VM_TTL_MS`]: their requests
//! leave the sets, so a dead replica's load ages out. Every key expires
//! [`KEY_TTL_SECS`] after its last write.

use crate::shared::store::SharedStore;
use crate::sync::cmd;
use crate::sync::resp::{parse_pipeline_reply, Frame, Pipeline};
use crate::sync::SyncSettings;

/// A worker VM silent this long (no placement, release or heartbeat) is
/// dead: its requests are removed from the pods' sets.
pub(crate) const VM_TTL_MS: u64 = 10_000;
/// How often a worker VM with placement on says it lives.
pub(crate) const HEARTBEAT_MS: u64 = 2_000;
/// Dead VMs one call reaps at most (the rest go with the next calls).
pub(crate) const REAP_PER_CALL: usize = 4;
/// Every placement key expires this long after its last write.
pub(crate) const KEY_TTL_SECS: u64 = 3_600;
/// Candidates one placement weighs at most (the worker's first ones).
pub(crate) const MAX_CANDIDATES: usize = 32;
/// Members one release script carries (more go as further scripts of the
/// same pipeline).
const RELEASE_CHUNK: usize = 256;

/// ARGV: prefix, now ms, vm, member, vm ttl ms, key ttl s, reap count,
/// claim (or empty), claim ms, claim record, whether the asker can wait
/// (`1` or `0`), then (pod, cost, step) triples. An asker that cannot wait
/// follows a claim only while no placed request is in flight on its pod
/// (there it would compute the family again beside the first one's
/// prefill; placed by cost it does so on a free pod). Returns `{pod}`, or
/// `{pod, age ms, record}` when the pod is the family's claim (age -1 when
/// unknown: a claim an older build set).
const PLACE_SCRIPT: &str = "\
local p, now, vm, member = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local vttl, kttl, reap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local vms = p .. 'vms'
for _, d in ipairs(redis.call('ZRANGEBYSCORE', vms, '-inf', now - vttl, 'LIMIT', 0, reap)) do
  local h = p .. 'v:' .. d
  local all = redis.call('HGETALL', h)
  for i = 1, #all, 2 do redis.call('ZREM', p .. 'p:' .. all[i + 1], all[i]) end
  redis.call('DEL', h)
  redis.call('ZREM', vms, d)
end
local best, bs, bo = nil, nil, nil
local ck = nil
local claim = nil
if ARGV[8] ~= '' then
  ck = p .. 'c:' .. ARGV[8]
  local held = redis.call('GET', ck)
  if held then
    local pod, ms, rec = string.match(held, '^([^\\t]*)\\t?([^\\t]*)\\t?(.*)$')
    for i = 12, #ARGV - 2, 3 do if ARGV[i] == pod then best = pod; claim = {ms, rec} end end
    if best and ARGV[11] ~= '1' and redis.call('ZCARD', p .. 'p:' .. best) > 0 then
      best, claim = nil, nil
    end
  end
end
if best == nil then
  for i = 12, #ARGV - 2, 3 do
    local k = p .. 'p:' .. ARGV[i]
    local c = redis.call('ZCARD', k)
    local o = now
    if c > 0 then o = tonumber(redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')[2]) end
    local s = tonumber(ARGV[i + 1]) + c * tonumber(ARGV[i + 2])
    if best == nil or s < bs or (s == bs and o < bo) then best, bs, bo = ARGV[i], s, o end
  end
end
if best == nil then return redis.error_reply('no candidates') end
if ck and not claim then
  redis.call('SET', ck, best .. '\\t' .. ARGV[9] .. '\\t' .. ARGV[10], 'PX', tonumber(ARGV[9]))
end
local k = p .. 'p:' .. best
redis.call('ZADD', k, now, member)
redis.call('EXPIRE', k, kttl)
local h = p .. 'v:' .. vm
redis.call('HSET', h, member, best)
redis.call('EXPIRE', h, kttl)
redis.call('ZADD', vms, now, vm)
redis.call('EXPIRE', vms, kttl)
if claim then
  local age, ms, left = -1, tonumber(claim[1]), redis.call('PTTL', ck)
  if ms and left >= 0 then age = ms - left end
  return {best, age, claim[2]}
end
return {best}";

/// ARGV: prefix, now ms, vm, key ttl s, then members. Releases them (those
/// still known) and says the VM lives. Returns how many were released.
const RELEASE_SCRIPT: &str = "\
local p, now, vm, kttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local h = p .. 'v:' .. vm
local n = 0
for i = 5, #ARGV do
  local pod = redis.call('HGET', h, ARGV[i])
  if pod then
    n = n + redis.call('ZREM', p .. 'p:' .. pod, ARGV[i])
    redis.call('HDEL', h, ARGV[i])
  end
end
local vms = p .. 'vms'
redis.call('ZADD', vms, now, vm)
redis.call('EXPIRE', vms, kttl)
return n";

/// One candidate of a placement: its address, the worker's prefill cost
/// of the request there (in a fast pod's prefill blocks) and what each
/// placed request in flight there adds to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub address: String,
    pub cost: i64,
    pub step: i64,
}

/// Shared-data key under which the singleton names the Redis Cluster
/// master holding the placement keys (`sync.cluster`), for the workers'
/// calls; empty while it does not know.
pub(crate) const NODE_KEY: &str = "sync/place-node";

/// The first part of every placement key: `{<key_prefix>:pl}:`. The braces
/// are a Redis Cluster hash tag (every key in one slot); one Redis ignores
/// them.
fn key_prefix(settings: &SyncSettings) -> String {
    format!("{{{}:pl}}:", settings.key_prefix)
}

/// Where a worker's placement call goes: `Ok(None)` on one Redis (the
/// bridge's own route); in cluster mode `Ok(Some(master))` once the
/// singleton has named the master of the placement slot ([`NODE_KEY`]),
/// `Err(())` before (the call is not sent). One shared-data read, in
/// cluster mode only.
pub(crate) fn node<S: SharedStore + ?Sized>(
    settings: &SyncSettings,
    store: &S,
) -> Result<Option<String>, ()> {
    if !settings.cluster {
        return Ok(None);
    }
    match store.get(NODE_KEY) {
        Ok((Some(v), _)) if !v.is_empty() => String::from_utf8(v).map(Some).map_err(|_| ()),
        _ => Err(()),
    }
}

/// The key every placement script declares (its slot is every placement
/// key's slot).
pub(crate) fn slot_key(settings: &SyncSettings) -> String {
    format!("{}vms", key_prefix(settings))
}

fn start(settings: &SyncSettings) -> Pipeline {
    let mut p = Pipeline::new();
    if let Some(pw) = &settings.auth_password {
        cmd::auth(&mut p, settings.auth_username.as_deref(), pw);
    }
    p
}

/// The pipeline asking Redis to place `member` of worker VM `vm` on one of
/// `candidates` (at most [`MAX_CANDIDATES`] are sent), following the claim
/// of the prompt's family if any (with `place_claim_ms` > 0; `family` is
/// the family and the claim record the prompt leaves if it sets the
/// claim; `may_wait`: the asker can wait for a claim's prefill, see
/// `PLACE_SCRIPT`), and the number of replies to expect. None without
/// candidates.
pub(crate) fn ask(
    settings: &SyncSettings,
    now_ms: u64,
    vm: &str,
    member: &str,
    family: Option<(u64, &str)>,
    may_wait: bool,
    candidates: &[Candidate],
) -> Option<(Vec<u8>, usize)> {
    if candidates.is_empty() {
        return None;
    }
    let mut p = start(settings);
    let prefix = key_prefix(settings);
    let slot = slot_key(settings);
    let now = now_ms.to_string();
    let vttl = VM_TTL_MS.to_string();
    let kttl = KEY_TTL_SECS.to_string();
    let reap = REAP_PER_CALL.to_string();
    let (family, record) = match (family, settings.place_claim_ms) {
        (Some((f, record)), 1..) if record.len() <= MAX_RECORD_BYTES => {
            (format!("{f:016x}"), record)
        }
        _ => (String::new(), ""),
    };
    let claim_ms = settings.place_claim_ms.to_string();
    let figures: Vec<(String, String)> = candidates
        .iter()
        .take(MAX_CANDIDATES)
        .map(|c| (c.cost.max(0).to_string(), c.step.max(1).to_string()))
        .collect();
    let mut args: Vec<&[u8]> = vec![
        b"EVAL",
        PLACE_SCRIPT.as_bytes(),
        b"1",
        slot.as_bytes(),
        prefix.as_bytes(),
        now.as_bytes(),
        vm.as_bytes(),
        member.as_bytes(),
        vttl.as_bytes(),
        kttl.as_bytes(),
        reap.as_bytes(),
        family.as_bytes(),
        claim_ms.as_bytes(),
        record.as_bytes(),
        if may_wait { b"1" } else { b"0" },
    ];
    for (c, (cost, step)) in candidates.iter().zip(&figures) {
        args.push(c.address.as_bytes());
        args.push(cost.as_bytes());
        args.push(step.as_bytes());
    }
    p.push(&args);
    Some(p.finish())
}

/// Why a placement named no pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlaceError {
    /// No reply: the call failed or timed out.
    NoReply,
    /// Truncated or garbage, or not a name.
    Unreadable,
    /// Redis answered an error (AUTH, an ACL without `EVAL`, the script, a
    /// slot moved): its first [`REFUSAL_CHARS`] characters.
    Refused(String),
    /// A pod that was not a candidate (a hostile or stale value).
    NotACandidate,
}

/// Characters of a Redis error kept in [`PlaceError::Refused`] (for the
/// log; Redis's own errors are shorter).
pub const REFUSAL_CHARS: usize = 120;

/// Longest claim record sent or read (see
/// [`crate::route::router::shared_with_claim`]); a longer one read is
/// ignored.
pub const MAX_RECORD_BYTES: usize = 1_024;

/// A placement that followed its family's claim: how long ago the claim
/// was set (Redis's clock) and what it recorded of the prompt that set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    pub(crate) age_ms: u64,
    pub record: String,
}

/// The index in `candidates` of the pod a complete reply of `expected`
/// frames names, and the claim it followed, if any with a known age and a
/// readable record.
pub fn chosen(
    reply: &[u8],
    expected: usize,
    candidates: &[Candidate],
) -> Result<(usize, Option<Followed>), PlaceError> {
    let frames = parse_pipeline_reply(reply, expected).map_err(|_| PlaceError::Unreadable)?;
    // AUTH's +OK first when configured; the script's reply before QUIT's.
    let at = expected.checked_sub(2).ok_or(PlaceError::Unreadable)?;
    // AUTH's error, or the script's (QUIT's +OK after it).
    if let Some(Frame::Error(e)) = frames
        .iter()
        .take(at + 1)
        .find(|f| matches!(f, Frame::Error(_)))
    {
        return Err(PlaceError::Refused(e.chars().take(REFUSAL_CHARS).collect()));
    }
    let Some(Frame::Array(parts)) = frames.get(at) else {
        return Err(PlaceError::Unreadable);
    };
    let Some(Frame::Bulk(name)) = parts.first() else {
        return Err(PlaceError::Unreadable);
    };
    let index = candidates
        .iter()
        .take(MAX_CANDIDATES)
        .position(|c| c.address.as_bytes() == name.as_slice())
        .ok_or(PlaceError::NotACandidate)?;
    let followed = match parts.get(1..) {
        Some([Frame::Integer(age), Frame::Bulk(record)]) if record.len() <= MAX_RECORD_BYTES => {
            match (u64::try_from(*age), std::str::from_utf8(record)) {
                (Ok(age_ms), Ok(record)) if !record.is_empty() => Some(Followed {
                    age_ms,
                    record: record.to_string(),
                }),
                _ => None,
            }
        }
        _ => None,
    };
    Ok((index, followed))
}

/// The tick's pipeline: releases `members` of VM `vm` (ended requests, and
/// requests whose stream ended while Redis placed them) and says it lives.
/// One script per [`RELEASE_CHUNK`] members, at least one.
pub(crate) fn release(
    settings: &SyncSettings,
    now_ms: u64,
    vm: &str,
    members: &[String],
) -> (Vec<u8>, usize) {
    let mut p = start(settings);
    let prefix = key_prefix(settings);
    let slot = slot_key(settings);
    let now = now_ms.to_string();
    let kttl = KEY_TTL_SECS.to_string();
    let mut chunks: Vec<&[String]> = members.chunks(RELEASE_CHUNK).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for chunk in chunks {
        let mut args: Vec<&[u8]> = vec![
            b"EVAL",
            RELEASE_SCRIPT.as_bytes(),
            b"1",
            slot.as_bytes(),
            prefix.as_bytes(),
            now.as_bytes(),
            vm.as_bytes(),
            kttl.as_bytes(),
        ];
        args.extend(chunk.iter().map(|m| m.as_bytes()));
        p.push(&args);
    }
    p.finish()
}

/// Whether a release reply of `expected` frames is complete and without
/// errors (else its members stay placed until the VM is reaped).
pub(crate) fn released(reply: &[u8], expected: usize) -> bool {
    parse_pipeline_reply(reply, expected)
        .is_ok_and(|frames| !frames.iter().any(|f| matches!(f, Frame::Error(_))))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cands(names: &[&str]) -> Vec<Candidate> {
        names
            .iter()
            .map(|n| Candidate {
                address: (*n).to_string(),
                cost: 132,
                step: 8,
            })
            .collect()
    }

    fn bulk(s: &str) -> String {
        format!("${}\r\n{s}\r\n", s.len())
    }

    /// The place script's reply naming `s` alone.
    fn named(s: &str) -> String {
        format!("*1\r\n{}", bulk(s))
    }

    #[test]
    fn ask_sends_one_script_with_every_candidate_and_its_costs() {
        let s = SyncSettings {
            place_claim_ms: 0,
            ..SyncSettings::default()
        };
        assert!(ask(&s, 5, "vm1", "vm1:1", Some((1, "")), true, &[]).is_none());
        let mut c = cands(&["10.0.0.1:8000", "10.0.0.2:8000"]);
        c[1].cost = 3000;
        let (body, _) = ask(&s, 1234, "vm1", "vm1:7", Some((0xab, "31:ff")), true, &c).unwrap();
        let text = String::from_utf8(body).unwrap();
        assert!(
            !text.contains("00000000000000ab") && !text.contains("31:ff"),
            "no claim when off"
        );
        let s = SyncSettings {
            place_claim_ms: 1000,
            ..SyncSettings::default()
        };
        let (body, n) = ask(&s, 1234, "vm1", "vm1:7", Some((0xab, "31:ff")), true, &c).unwrap();
        assert_eq!(n, 2, "EVAL and QUIT");
        let text = String::from_utf8(body).unwrap();
        assert!(text.starts_with("*21\r\n$4\r\nEVAL\r\n"), "{text}");
        for part in [
            "$1\r\n1\r\n$15\r\n{aibrix:pl}:vms\r\n",
            "{aibrix:pl}:",
            "1234",
            "vm1:7",
            "00000000000000ab",
            "$5\r\n31:ff\r\n$1\r\n1\r\n",
            "10.0.0.1:8000",
            "3000",
            "QUIT",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        // More than MAX_CANDIDATES: the first ones only.
        let many: Vec<String> = (0..40).map(|i| format!("p{i}:1")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let (body, _) = ask(&s, 1, "v", "v:1", None, false, &cands(&refs)).unwrap();
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("p31:1") && !text.contains("p32:1"));
    }

    #[test]
    fn every_placement_key_is_in_the_declared_keys_slot() {
        use crate::sync::keys::key_slot;
        let s = SyncSettings {
            key_prefix: "tenant-a".into(),
            ..SyncSettings::default()
        };
        let base = key_prefix(&s);
        let slot = key_slot(slot_key(&s).as_bytes());
        for key in [
            format!("{base}p:10.0.0.7:8000"),
            format!("{base}v:0123456789abcdef"),
            format!("{base}c:00000000000000ab"),
            format!("{base}vms"),
        ] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
        // The scripts build every key from that base (ARGV[1]), none other.
        for script in [PLACE_SCRIPT, RELEASE_SCRIPT] {
            assert!(!script.contains("'pl:"), "{script}");
            assert!(script.contains("p .. 'vms'"));
        }
        let (body, _) = release(&s, 9, "vm1", &[]);
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.contains("$1\r\n1\r\n$17\r\n{tenant-a:pl}:vms\r\n"),
            "{text}"
        );
    }

    #[test]
    fn ask_authenticates_first_when_configured() {
        let s = SyncSettings {
            auth_password: Some("pw".into()),
            ..SyncSettings::default()
        };
        let (body, n) = ask(&s, 1, "v", "v:1", None, false, &cands(&["a:1"])).unwrap();
        assert_eq!(n, 3);
        assert!(body.starts_with(b"*2\r\n$4\r\nAUTH\r\n"));
    }

    #[test]
    fn only_a_complete_reply_naming_a_candidate_counts() {
        let c = cands(&["a:1", "b:2"]);
        let ok = format!("{}+OK\r\n", named("b:2"));
        assert_eq!(chosen(ok.as_bytes(), 2, &c), Ok((1, None)));
        let authed = format!("+OK\r\n{}+OK\r\n", named("a:1"));
        assert_eq!(chosen(authed.as_bytes(), 3, &c), Ok((0, None)));
        // A followed claim: its age and record.
        let claimed = format!("*3\r\n{}:120\r\n{}+OK\r\n", bulk("b:2"), bulk("31:ff"));
        assert_eq!(
            chosen(claimed.as_bytes(), 2, &c),
            Ok((
                1,
                Some(Followed {
                    age_ms: 120,
                    record: "31:ff".into()
                })
            ))
        );
        // An unknown age (an older build's claim), an empty, long or
        // non-UTF-8 record, an age that is no integer: the pod alone.
        for (age, record) in [
            (":-1\r\n".to_string(), bulk("31:ff")),
            (":5\r\n".to_string(), bulk("")),
            (
                ":5\r\n".to_string(),
                bulk(&"9".repeat(MAX_RECORD_BYTES + 1)),
            ),
            (bulk("5"), bulk("31:ff")),
        ] {
            let reply = format!("*3\r\n{}{age}{record}+OK\r\n", bulk("a:1"));
            assert_eq!(chosen(reply.as_bytes(), 2, &c), Ok((0, None)), "{reply:?}");
        }
        let mut not_utf8 = b"*3\r\n$3\r\na:1\r\n:5\r\n$1\r\n".to_vec();
        not_utf8.extend([0xff, b'\r', b'\n', b'+', b'O', b'K', b'\r', b'\n']);
        assert_eq!(chosen(&not_utf8, 2, &c), Ok((0, None)));
        let refused = format!("-WRONGPASS no\r\n{}+OK\r\n", named("a:1"));
        assert_eq!(
            chosen(refused.as_bytes(), 3, &c),
            Err(PlaceError::Refused("WRONGPASS no".into()))
        );
        let noperm = "-NOPERM User sync has no permissions to run the 'eval' command\r\n+OK\r\n";
        assert_eq!(
            chosen(noperm.as_bytes(), 2, &c),
            Err(PlaceError::Refused(
                "NOPERM User sync has no permissions to run the 'eval' command".into()
            ))
        );
        let long = format!("-ERR {}\r\n+OK\r\n", "x".repeat(500));
        match chosen(long.as_bytes(), 2, &c) {
            Err(PlaceError::Refused(e)) => assert_eq!(e.chars().count(), REFUSAL_CHARS),
            other => panic!("{other:?}"),
        }
        let hostile = format!("{}+OK\r\n", named("evil:666"));
        assert_eq!(
            chosen(hostile.as_bytes(), 2, &c),
            Err(PlaceError::NotACandidate)
        );
        for bad in [
            named("a:1"),                              // truncated: no QUIT reply
            ":3\r\n+OK\r\n".to_string(),               // not a name
            format!("{}+OK\r\n", bulk("a:1")),         // not the script's array
            "*0\r\n+OK\r\n".to_string(),               // an empty array
            "\x00\x7f".to_string(),                    // garbage
            format!("{}+OK\r\n+OK\r\n", named("a:1")), // bytes after QUIT's
        ] {
            assert_eq!(
                chosen(bad.as_bytes(), 2, &c),
                Err(PlaceError::Unreadable),
                "{bad:?}"
            );
        }
        assert_eq!(chosen(b"+OK\r\n", 1, &c), Err(PlaceError::Unreadable));
    }

    #[test]
    fn release_chunks_members_and_beats_without_any() {
        let s = SyncSettings::default();
        let (body, n) = release(&s, 9, "vm1", &[]);
        assert_eq!(n, 2, "a heartbeat: one script and QUIT");
        assert!(String::from_utf8(body).unwrap().contains("vm1"));
        let members: Vec<String> = (0..600).map(|i| format!("vm1:{i}")).collect();
        let (_, n) = release(&s, 9, "vm1", &members);
        assert_eq!(n, 4, "3 scripts of <= 256 members, and QUIT");
        assert!(released(b":2\r\n:0\r\n+OK\r\n", 3));
        assert!(!released(b":2\r\n-ERR x\r\n+OK\r\n", 3));
        assert!(!released(b":2\r\n", 3));
    }
}
