//! The decision line: why a request went to its pod, for an operator asking
//! "why that pod". The router writes one per routed request only while
//! Envoy's `wasm` log component is at `debug` or `trace` (the host layer
//! follows that level on every tick); at any other level nothing here runs.
//!
//! One line per request, bounded: the chosen pod first, then the pods that
//! hold part of the prompt (longest first), then the least loaded, at most
//! [`MAX_LISTED`] pods and a count of the rest. The request's model name is
//! the client's: it is cut to [`MAX_MODEL_CHARS`] and printed escaped, so a
//! model name cannot forge a log line.

use std::fmt::Write;

use crate::fleet::FleetView;
use crate::route::policy::{Choice, PoolView, Reason};
use crate::shared::registry::PodSlot;

/// Most pods one line names.
pub(crate) const MAX_LISTED: usize = 12;
/// Most characters of the model name a line prints.
pub(crate) const MAX_MODEL_CHARS: usize = 64;

/// What the policy weighed of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodFacts<'a> {
    /// The pod's name (its `host:port` or EDS hostname).
    pub(crate) name: &'a str,
    /// Leading blocks of the prompt the table says the pod holds.
    pub(crate) matched: u32,
    /// The load the policy compared: the estimated queue (load-aware) or
    /// the in-flight count (aibrix).
    pub(crate) queue: u32,
    /// The load-aware policy's ties: in-flight requests, requests sent and
    /// new prefixes placed by this replica, the age of its requests in
    /// flight, and the pod's slowness in thousandths (1000 = the fastest).
    pub(crate) ties: Option<Ties>,
}

/// The load-aware policy's tie-breaks for one pod ([`crate::route::policy::PodView`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ties {
    pub(crate) inflight: u32,
    pub(crate) sent: u32,
    pub(crate) placed: u32,
    pub(crate) age: u64,
    pub(crate) slowness: u32,
}

/// What every decision line names, whatever the policy: the pods' names,
/// the request, the pool and each pod's match (`(pod, leading blocks)`).
pub(crate) struct Scene<'a> {
    fleet: &'a FleetView,
    model: &'a str,
    blocks: usize,
    pool: &'a [PodSlot],
    lengths: &'a [(PodSlot, u32)],
}

impl<'a> Scene<'a> {
    pub(crate) fn new(
        fleet: &'a FleetView,
        model: &'a str,
        blocks: usize,
        pool: &'a [PodSlot],
        lengths: &'a [(PodSlot, u32)],
    ) -> Self {
        Scene {
            fleet,
            model,
            blocks,
            pool,
            lengths,
        }
    }

    fn facts(&self, pod: PodSlot, queue: u32) -> PodFacts<'a> {
        PodFacts {
            name: self.fleet.name(pod).unwrap_or("?"),
            matched: self.lengths.iter().find(|l| l.0 == pod).map_or(0, |l| l.1),
            queue,
            ..PodFacts::default()
        }
    }

    fn log(&self, policy: &str, choice: Option<&Choice>, mut facts: Vec<PodFacts<'_>>) {
        if let Some(choice) = choice {
            let chosen = self.fleet.name(choice.pod).unwrap_or("?");
            log::debug!(
                "{}",
                line(policy, self.model, self.blocks, choice, chosen, &mut facts)
            );
        }
    }
}

fn at<T: Copy + Default>(v: &[T], i: usize) -> T {
    v.get(i).copied().unwrap_or_default()
}

/// Logs the `aibrix` policy's decision (`load`: in-flight per pod slot)
/// when Envoy's `wasm` log level is at debug; otherwise returns at once.
pub(crate) fn aibrix(scene: &Scene<'_>, load: &[u32], choice: Option<&Choice>) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let facts = scene
        .pool
        .iter()
        .map(|&p| scene.facts(p, at(load, p.index())))
        .collect();
    scene.log("aibrix", choice, facts);
}

/// Logs the load-aware policy's decision, with what it weighed of each pod
/// (`view`), when Envoy's `wasm` log level is at debug; otherwise returns
/// at once.
pub(crate) fn load_aware(scene: &Scene<'_>, view: &PoolView, choice: Option<&Choice>) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let facts = view
        .pods
        .iter()
        .map(|v| PodFacts {
            ties: Some(Ties {
                inflight: v.inflight,
                sent: v.sent,
                placed: v.placed,
                age: v.age,
                slowness: match v.slowness {
                    0 => 1000,
                    s => s,
                },
            }),
            ..scene.facts(v.pod, v.queue)
        })
        .collect();
    scene.log("load_aware", choice, facts);
}

fn reason(r: Reason) -> &'static str {
    match r {
        Reason::PrefixMatch => "prefix_match",
        Reason::NoMatch => "no_match",
        Reason::LoadGuard => "load_guard",
        Reason::Spread => "spread",
        Reason::Placed => "placed",
    }
}

/// The decision line of one request: `policy`, the request's `model` and
/// block count, the `choice` (naming `pods[chosen]`), and what the policy
/// weighed of each pod of the pool (`pods`, reordered in place).
pub(crate) fn line(
    policy: &str,
    model: &str,
    blocks: usize,
    choice: &Choice,
    chosen: &str,
    pods: &mut [PodFacts<'_>],
) -> String {
    let model: String = model.chars().take(MAX_MODEL_CHARS).collect();
    let mut out = String::with_capacity(160 + 64 * pods.len().min(MAX_LISTED));
    let _ = write!(
        out,
        "prefix_router: decision policy={policy} model={model:?} blocks={blocks} -> {chosen} \
         ({}, match {}%)",
        reason(choice.reason),
        choice.match_percent
    );
    // The chosen pod, then the longest matches, then the least loaded.
    pods.sort_by_key(|p| (p.name != chosen, std::cmp::Reverse(p.matched), p.queue));
    for p in pods.iter().take(MAX_LISTED) {
        let _ = write!(out, " | {} match={}", p.name, p.matched);
        let _ = write!(out, " queue={}", p.queue);
        if let Some(t) = p.ties {
            let _ = write!(
                out,
                " inflight={} sent={} placed={} age={} slow={}.{:03}x",
                t.inflight,
                t.sent,
                t.placed,
                t.age,
                t.slowness / 1000,
                t.slowness % 1000
            );
        }
    }
    if pods.len() > MAX_LISTED {
        let _ = write!(out, " | +{} more", pods.len() - MAX_LISTED);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::registry::PodSlot;

    fn pod(name: &str, matched: u32, queue: u32) -> PodFacts<'_> {
        PodFacts {
            name,
            matched,
            queue,
            ..PodFacts::default()
        }
    }

    fn choice(reason: Reason, match_percent: u8) -> Choice {
        Choice {
            pod: PodSlot::new(1),
            reason,
            match_percent,
        }
    }

    #[test]
    fn names_the_choice_then_matches_then_the_least_loaded() {
        let mut pods = [
            pod("a:1", 0, 3),
            pod("b:1", 4, 9),
            pod("c:1", 0, 0),
            pod("d:1", 10, 2),
        ];
        pods[0].ties = Some(Ties {
            inflight: 2,
            sent: 7,
            placed: 1,
            age: 1500,
            slowness: 3000,
        });
        let l = line(
            "load_aware",
            "m",
            12,
            &choice(Reason::LoadGuard, 0),
            "a:1",
            &mut pods,
        );
        assert_eq!(
            l,
            "prefix_router: decision policy=load_aware model=\"m\" blocks=12 -> a:1 \
             (load_guard, match 0%) | a:1 match=0 queue=3 inflight=2 sent=7 placed=1 age=1500 \
             slow=3.000x | d:1 match=10 queue=2 | b:1 match=4 queue=9 | c:1 match=0 queue=0"
        );
    }

    #[test]
    fn is_bounded_and_escapes_the_model() {
        let names: Vec<String> = (0..200).map(|i| format!("10.0.0.{i}:8000")).collect();
        let mut pods: Vec<PodFacts<'_>> = names.iter().map(|n| pod(n, 0, 1)).collect();
        let model = format!("evil\nprefix_router: decision forged {}", "x".repeat(5000));
        let l = line(
            "aibrix",
            &model,
            3,
            &choice(Reason::NoMatch, 0),
            &names[150],
            &mut pods,
        );
        assert!(!l.contains('\n'), "{l}");
        assert!(l.contains("model=\"evil\\nprefix_router"), "{l}");
        assert!(l.contains("-> 10.0.0.150:8000 (no_match, match 0%) | 10.0.0.150:8000 "));
        assert_eq!(l.matches(" | ").count(), MAX_LISTED + 1, "{l}");
        assert!(l.ends_with(" | +188 more"), "{l}");
        assert!(l.len() < 1200, "{} bytes", l.len());
    }
}
