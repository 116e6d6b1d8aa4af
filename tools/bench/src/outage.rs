//! A pod that leaves and returns while a workload runs (the `live-fleet`
//! workload of `compare`): the pod process is killed (SIGKILL, requests in
//! flight on it are cut off) at one moment and started again on the same
//! port, with the same name and a cold cache, at another, from a thread of
//! its own while the client keeps sending. Then what the outcomes say about
//! it: errors and hit rate before, during and after the outage, and what
//! the returned pod served.
//!
//! The arithmetic over outcomes is pure ([`OutageFacts::of`], unit-tested
//! below); Envoy's view of the pod (connect failures, retries) is read from
//! its admin after the run.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::drive::drive;
use crate::metrics::hit_rate;
use crate::runner::{Outcome, Pacing};
use crate::scenario::PodSet;
use crate::support::{self, Envoy, TestDir};
use crate::workload::Request;

/// Requests that fail within this long of the kill were (or could have
/// been) in flight before anyone could notice; the issue's bound for "no
/// request goes to a pod that is gone".
pub const NOTICE_MS: f64 = 2000.0;

/// When a pod leaves and returns, from the start of the workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outage {
    /// Index of the pod in the [`PodSet`].
    pub pod: usize,
    #[serde(rename = "kill_at_ms", serialize_with = "as_ms")]
    pub kill_at: Duration,
    #[serde(rename = "return_at_ms", serialize_with = "as_ms")]
    pub return_at: Duration,
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// When it really happened, ms after the first send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// The kill.
    pub kill_ms: f64,
    /// The restarted pod accepts connections.
    pub back_ms: f64,
}

/// Sends `requests` (see [`drive`]) while `outage` happens to `pods`.
#[allow(clippy::too_many_arguments)]
pub fn drive_with_outage(
    rt: &tokio::runtime::Runtime,
    urls: &[String],
    requests: &[Request],
    pacing: Pacing,
    label: &str,
    fresh_connections: bool,
    pods: &mut PodSet,
    dir: &TestDir,
    outage: &Outage,
) -> (Vec<Outcome>, Timeline) {
    thread::scope(|s| {
        let t0 = Instant::now();
        let ms = move || t0.elapsed().as_secs_f64() * 1000.0;
        let faults = s.spawn(move || {
            thread::sleep(outage.kill_at.saturating_sub(t0.elapsed()));
            pods.kill(outage.pod);
            let kill_ms = ms();
            eprintln!(
                "  [{label}] {:.1} s: {} killed",
                kill_ms / 1000.0,
                pods.pods[outage.pod].name
            );
            thread::sleep(outage.return_at.saturating_sub(t0.elapsed()));
            pods.restart(dir, outage.pod);
            let back_ms = ms();
            eprintln!(
                "  [{label}] {:.1} s: {} back",
                back_ms / 1000.0,
                pods.pods[outage.pod].name
            );
            Timeline { kill_ms, back_ms }
        });
        let outcomes = rt.block_on(drive(urls, requests, pacing, label, fresh_connections));
        let timeline = faults.join().expect("the pod kill/restart thread panicked");
        (outcomes, timeline)
    })
}

/// Requests of one phase of the run (by send time).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Phase {
    pub sent: usize,
    pub errors: usize,
    pub hit_rate: Option<f64>,
}

impl Phase {
    fn of<'a>(outcomes: impl Iterator<Item = &'a Outcome> + Clone) -> Phase {
        Phase {
            sent: outcomes.clone().count(),
            errors: outcomes.clone().filter(|o| !o.ok()).count(),
            hit_rate: hit_rate(outcomes.filter(|o| o.ok())),
        }
    }
}

/// What a run with an outage shows about it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OutageFacts {
    /// The pod that left and returned.
    pub pod: String,
    pub timeline: Timeline,
    /// Sent before the kill.
    pub before: Phase,
    /// Sent between the kill and the pod's return.
    pub outage: Phase,
    /// Sent after the return.
    pub after: Phase,
    /// Failed requests sent before the kill (in flight on the pod when it
    /// died, most of them).
    pub errors_in_flight: usize,
    /// Failed requests sent after the kill.
    pub errors_after_kill: usize,
    /// Failed requests sent more than [`NOTICE_MS`] after the kill: the
    /// router still sent them to a pod that was gone.
    pub errors_late: usize,
    /// Ok replies from the pod among requests sent after it returned.
    pub served_after_return: usize,
    /// From the return to the send of the first such request, ms.
    pub first_after_return_ms: Option<f64>,
    /// Envoy's counters for the pod's address (`/clusters`; the address is
    /// the same before and after the restart) and its cluster's retries.
    pub upstream: BTreeMap<String, i64>,
}

impl OutageFacts {
    /// The facts of `outcomes`, where pod `pod` left and returned as
    /// `timeline` says.
    pub fn of(outcomes: &[Outcome], pod: &str, timeline: Timeline) -> OutageFacts {
        let t = timeline;
        let sent_in = |from: f64, to: f64| {
            outcomes
                .iter()
                .filter(move |o| o.start_ms >= from && o.start_ms < to)
        };
        let failed_in = |from: f64, to: f64| sent_in(from, to).filter(|o| !o.ok()).count();
        let back: Vec<&Outcome> = sent_in(t.back_ms, f64::INFINITY)
            .filter(|o| o.ok() && o.pod.as_deref() == Some(pod))
            .collect();
        OutageFacts {
            pod: pod.to_string(),
            timeline,
            before: Phase::of(sent_in(f64::NEG_INFINITY, t.kill_ms)),
            outage: Phase::of(sent_in(t.kill_ms, t.back_ms)),
            after: Phase::of(sent_in(t.back_ms, f64::INFINITY)),
            errors_in_flight: failed_in(f64::NEG_INFINITY, t.kill_ms),
            errors_after_kill: failed_in(t.kill_ms, f64::INFINITY),
            errors_late: failed_in(t.kill_ms + NOTICE_MS, f64::INFINITY),
            served_after_return: back.len(),
            first_after_return_ms: back.iter().map(|o| o.start_ms - t.back_ms).reduce(f64::min),
            upstream: BTreeMap::new(),
        }
    }
}

/// Envoy's counters for the host `127.0.0.1:<port>` of cluster `pods`
/// (`cx_connect_fail`, `rq_error`, `rq_total`, ...; a counter still at 0 is
/// absent from the admin's reply and reads 0) and the cluster's retries
/// (`upstream_rq_retry`, `upstream_rq_retry_success`).
pub fn upstream_counters(envoy: &Envoy, port: u16) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = [
        "cx_connect_fail",
        "rq_error",
        "rq_total",
        "upstream_rq_retry",
        "upstream_rq_retry_success",
    ]
    .into_iter()
    .map(|k| (k.to_string(), 0))
    .collect();
    if let Ok(reply) = support::get(&envoy.admin_url("/clusters?format=json")) {
        let json: Value = serde_json::from_str(&reply.body).unwrap_or_default();
        out.extend(host_counters(&json, "pods", port));
    }
    let retries = envoy.stats_matching(r"^cluster\.pods\.upstream_rq_retry(_success)?$");
    for (name, v) in retries {
        out.insert(name.trim_start_matches("cluster.pods.").to_string(), v);
    }
    out
}

/// The counters of one host in an admin `/clusters?format=json` reply.
pub fn host_counters(clusters: &Value, cluster: &str, port: u16) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let statuses = clusters["cluster_statuses"]
        .as_array()
        .into_iter()
        .flatten();
    for c in statuses.filter(|c| c["name"] == cluster) {
        for h in c["host_statuses"].as_array().into_iter().flatten() {
            if h["address"]["socket_address"]["port_value"].as_u64() != Some(u64::from(port)) {
                continue;
            }
            for stat in h["stats"].as_array().into_iter().flatten() {
                let (Some(name), v) = (stat["name"].as_str(), &stat["value"]) else {
                    continue;
                };
                // uint64 in the admin's JSON is a string; absent means 0.
                let v = v
                    .as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .unwrap_or(0);
                out.insert(name.to_string(), v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn o(i: usize, start_ms: f64, pod: &str, ok: bool) -> Outcome {
        Outcome {
            index: i,
            start_ms,
            status: if ok { 200 } else { 503 },
            pod: Some(pod.into()),
            prompt_tokens: Some(100),
            cached_tokens: Some(if pod == "pod-1" { 100 } else { 0 }),
            ..Outcome::default()
        }
    }

    #[test]
    fn facts_by_phase() {
        let t = Timeline {
            kill_ms: 1000.0,
            back_ms: 5000.0,
        };
        let outcomes = vec![
            o(0, 0.0, "pod-1", true),
            o(1, 900.0, "pod-2", false),  // in flight at the kill
            o(2, 1500.0, "pod-1", false), // before anyone could notice
            o(3, 3500.0, "pod-1", false), // late: still sent to the dead pod
            o(4, 4000.0, "pod-1", true),
            o(5, 5200.0, "pod-3", true),
            o(6, 5700.0, "pod-2", true),
            o(7, 6000.0, "pod-2", true),
        ];
        let f = OutageFacts::of(&outcomes, "pod-2", t);
        assert_eq!((f.before.sent, f.before.errors), (2, 1));
        assert_eq!(f.before.hit_rate, Some(1.0));
        assert_eq!((f.outage.sent, f.outage.errors), (3, 2));
        assert_eq!((f.after.sent, f.after.errors), (3, 0));
        assert!((f.after.hit_rate.unwrap() - 0.0).abs() < 1e-12);
        assert_eq!(
            (f.errors_in_flight, f.errors_after_kill, f.errors_late),
            (1, 2, 1)
        );
        assert_eq!(f.served_after_return, 2);
        assert_eq!(f.first_after_return_ms, Some(700.0));
        let none = OutageFacts::of(&outcomes[..5], "pod-2", t);
        assert_eq!(
            (none.served_after_return, none.first_after_return_ms),
            (0, None)
        );
    }

    #[test]
    fn host_counters_from_the_admin_reply() {
        let reply = json!({"cluster_statuses": [
            {"name": "envoy_admin", "host_statuses": [
                {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 4002}},
                 "stats": [{"name": "cx_connect_fail", "value": "9"}]}]},
            {"name": "pods", "host_statuses": [
                {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 4001}},
                 "stats": [{"name": "cx_connect_fail", "value": "1"}]},
                {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 4002}},
                 "stats": [{"name": "cx_connect_fail", "value": "3"},
                           {"name": "rq_error", "value": 2},
                           {"name": "rq_timeout"}]}]}
        ]});
        let c = host_counters(&reply, "pods", 4002);
        assert_eq!(c["cx_connect_fail"], 3);
        assert_eq!(c["rq_error"], 2);
        assert_eq!(c["rq_timeout"], 0);
        assert!(host_counters(&reply, "pods", 4999).is_empty());
    }
}
