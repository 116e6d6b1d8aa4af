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

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::drive::drive;
use crate::metrics::hit_rate;
use crate::runner::{Outcome, Pacing};
use crate::scenario::PodSet;
use crate::workload::Request;
use harness::{self, Envoy, TestDir};

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
    /// Envoy's health check marked the pod failed (admin `/clusters`).
    pub envoy_down_ms: Option<f64>,
    /// The filter's singleton published it as not healthy.
    pub filter_down_ms: Option<f64>,
    /// Envoy marked the returned pod healthy again.
    pub envoy_up_ms: Option<f64>,
    /// The filter's singleton published it as healthy again.
    pub filter_up_ms: Option<f64>,
}

/// What to watch, through an Envoy's admin, while the pod is gone and back.
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    pub admin: u16,
    /// The pod's port (its host in cluster `pods` is `127.0.0.1:<port>`).
    pub pod_port: u16,
    /// With the filter: how many pods are healthy when all are
    /// (`prefix_router.membership.healthy`).
    pub filter_all: Option<i64>,
}

impl Watch {
    /// Is the pod healthy in Envoy's eyes (None: the admin did not say)?
    fn envoy_healthy(&self) -> Option<bool> {
        let url = format!("http://127.0.0.1:{}/clusters", self.admin);
        let body = harness::get(&url).ok()?.body;
        let key = format!("pods::127.0.0.1:{}::health_flags::", self.pod_port);
        let flags = body.lines().find_map(|l| l.strip_prefix(&key))?;
        Some(flags.trim() == "healthy")
    }

    /// Does the filter count every pod healthy (None: no filter, or no answer)?
    fn filter_healthy(&self) -> Option<bool> {
        let all = self.filter_all?;
        let url = format!(
            "http://127.0.0.1:{}/stats?filter=prefix_router%5C.membership%5C.healthy",
            self.admin
        );
        let body = harness::get(&url).ok()?.body;
        let v: i64 = body
            .lines()
            .next()?
            .rsplit(' ')
            .next()?
            .trim()
            .parse()
            .ok()?;
        Some(v >= all)
    }

    /// Polls every 20 ms until Envoy and the filter both see the pod as
    /// `healthy` (or are not watched), at most until `deadline`; returns when
    /// each did, by `ms()`.
    fn until(
        &self,
        healthy: bool,
        deadline: Instant,
        ms: impl Fn() -> f64,
    ) -> (Option<f64>, Option<f64>) {
        let (mut envoy, mut filter) = (None, None);
        let watch_filter = self.filter_all.is_some();
        while Instant::now() < deadline && (envoy.is_none() || (watch_filter && filter.is_none())) {
            if envoy.is_none() && self.envoy_healthy() == Some(healthy) {
                envoy = Some(ms());
            }
            if watch_filter && filter.is_none() && self.filter_healthy() == Some(healthy) {
                filter = Some(ms());
            }
            thread::sleep(Duration::from_millis(20));
        }
        (envoy, filter)
    }
}

/// Sends `requests` (see [`drive`]) while `outage` happens to `pods`; with
/// `watch`, also when Envoy and the filter noticed.
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
    watch: Option<Watch>,
) -> (Vec<Outcome>, Timeline) {
    thread::scope(|s| {
        let t0 = Instant::now();
        let ms = move || t0.elapsed().as_secs_f64() * 1000.0;
        let faults = s.spawn(move || {
            let mut t = Timeline::default();
            thread::sleep(outage.kill_at.saturating_sub(t0.elapsed()));
            pods.kill(outage.pod);
            t.kill_ms = ms();
            let name = pods.pods[outage.pod].name.clone();
            eprintln!("  [{label}] {:.1} s: {name} killed", t.kill_ms / 1000.0);
            if let Some(w) = &watch {
                (t.envoy_down_ms, t.filter_down_ms) = w.until(false, t0 + outage.return_at, ms);
            }
            thread::sleep(outage.return_at.saturating_sub(t0.elapsed()));
            pods.restart(dir, outage.pod);
            t.back_ms = ms();
            eprintln!("  [{label}] {:.1} s: {name} back", t.back_ms / 1000.0);
            if let Some(w) = &watch {
                let deadline = Instant::now() + Duration::from_secs(10);
                (t.envoy_up_ms, t.filter_up_ms) = w.until(true, deadline, ms);
            }
            t
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
    /// Prefix groups whose home before the kill was the pod (the pod that
    /// served most of their requests) and that were sent between
    /// [`NOTICE_MS`] after the kill and the return.
    pub groups_moved: usize,
    /// How many pods served each of those groups in that time, on average:
    /// 1.0 = each moved to one other pod, more = scattered.
    pub pods_per_moved_group: Option<f64>,
    /// Of the groups at home on the pod before the kill, how many it served
    /// again after its return (its cache is cold then: their records in a
    /// router's table are stale).
    pub old_groups_back: usize,
    /// Requests of those groups it served after its return that missed
    /// (less than half the prompt cached).
    pub old_group_misses_after_return: usize,
    /// Envoy's counters for the pod's address (`/clusters`; the address is
    /// the same before and after the restart) and its cluster's retries.
    pub upstream: BTreeMap<String, i64>,
}

impl OutageFacts {
    /// The facts of `outcomes`, where pod `pod` left and returned as
    /// `timeline` says; `families[i]` is the prefix group of request `i`
    /// (None: shares nothing).
    pub fn of(
        outcomes: &[Outcome],
        families: &[Option<usize>],
        pod: &str,
        timeline: Timeline,
    ) -> OutageFacts {
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
        let (groups_moved, pods_per_moved_group) = moved_groups(
            sent_in(f64::NEG_INFINITY, t.kill_ms),
            sent_in(t.kill_ms + NOTICE_MS, t.back_ms),
            families,
            pod,
        );
        let homes = homes(sent_in(f64::NEG_INFINITY, t.kill_ms), families);
        let old_back: Vec<&Outcome> = back
            .iter()
            .copied()
            .filter(|o| {
                families
                    .get(o.index)
                    .copied()
                    .flatten()
                    .and_then(|g| homes.get(&g))
                    == Some(&pod)
            })
            .collect();
        let old_groups: BTreeSet<Option<usize>> = old_back
            .iter()
            .map(|o| families.get(o.index).copied().flatten())
            .collect();
        OutageFacts {
            old_groups_back: old_groups.len(),
            old_group_misses_after_return: old_back
                .iter()
                .filter(|o| o.cached_tokens.unwrap_or(0) * 2 < o.prompt_tokens.unwrap_or(0))
                .count(),
            groups_moved,
            pods_per_moved_group,
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

/// Each group's home in `outcomes`: the pod that served most of its ok
/// requests.
fn homes<'a>(
    outcomes: impl Iterator<Item = &'a Outcome>,
    families: &[Option<usize>],
) -> BTreeMap<usize, &'a str> {
    let mut served: BTreeMap<usize, BTreeMap<&str, usize>> = BTreeMap::new();
    for o in outcomes.filter(|o| o.ok()) {
        if let (Some(g), Some(p)) = (families.get(o.index).copied().flatten(), o.pod.as_deref()) {
            *served.entry(g).or_default().entry(p).or_default() += 1;
        }
    }
    served
        .into_iter()
        .filter_map(|(g, counts)| {
            let (p, _) = counts.into_iter().max_by_key(|(_, n)| *n)?;
            Some((g, p))
        })
        .collect()
}

/// The groups at home on `pod` in `before` that were sent in `outage`, and
/// the mean number of pods that served each of them there.
fn moved_groups<'a>(
    before: impl Iterator<Item = &'a Outcome>,
    outage: impl Iterator<Item = &'a Outcome>,
    families: &[Option<usize>],
    pod: &str,
) -> (usize, Option<f64>) {
    let family = |o: &Outcome| families.get(o.index).copied().flatten();
    let homes = homes(before, families);
    let home = |g: usize| homes.get(&g).copied();
    let mut pods_of: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for o in outage.filter(|o| o.ok()) {
        if let (Some(g), Some(p)) = (family(o), o.pod.as_deref()) {
            if home(g) == Some(pod) {
                pods_of.entry(g).or_default().insert(p);
            }
        }
    }
    let n = pods_of.len();
    let total: usize = pods_of.values().map(BTreeSet::len).sum();
    (n, (n > 0).then(|| total as f64 / n as f64))
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
    if let Ok(reply) = harness::get(&envoy.admin_url("/clusters?format=json")) {
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
            ..Timeline::default()
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
        let families = vec![None; outcomes.len()];
        let f = OutageFacts::of(&outcomes, &families, "pod-2", t);
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
        let none = OutageFacts::of(&outcomes[..5], &families, "pod-2", t);
        assert_eq!(
            (none.served_after_return, none.first_after_return_ms),
            (0, None)
        );
    }

    #[test]
    fn moved_groups_are_counted_with_their_pods() {
        let t = Timeline {
            kill_ms: 1000.0,
            back_ms: 9000.0,
            ..Timeline::default()
        };
        // Group 0 at home on pod-2, group 1 on pod-1; after the kill group 0
        // goes to pod-3 and pod-4 (scattered), group 1 stays.
        let outcomes = vec![
            o(0, 0.0, "pod-2", true),
            o(1, 100.0, "pod-2", true),
            o(2, 200.0, "pod-3", true),
            o(3, 300.0, "pod-1", true),
            o(4, 1500.0, "pod-1", true), // within NOTICE_MS: not counted
            o(5, 3100.0, "pod-3", true),
            o(6, 3200.0, "pod-4", true),
            o(7, 3300.0, "pod-1", true),
            o(8, 9500.0, "pod-2", true), // after the return
        ];
        let families = vec![
            Some(0),
            Some(0),
            Some(0),
            Some(1),
            Some(0),
            Some(0),
            Some(0),
            Some(1),
            Some(0),
        ];
        let f = OutageFacts::of(&outcomes, &families, "pod-2", t);
        assert_eq!((f.groups_moved, f.pods_per_moved_group), (1, Some(2.0)));
        // #8: group 0 back on pod-2 after its return, a miss (cold cache).
        assert_eq!((f.old_groups_back, f.old_group_misses_after_return), (1, 1));
        let f = OutageFacts::of(&outcomes, &families, "pod-1", t);
        assert_eq!((f.groups_moved, f.pods_per_moved_group), (1, Some(1.0)));
        let f = OutageFacts::of(&outcomes, &families, "pod-4", t);
        assert_eq!((f.groups_moved, f.pods_per_moved_group), (0, None));
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
