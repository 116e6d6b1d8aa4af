//! The singleton's pod-signal collector: every `signals.interval_ms` it
//! sends one `GET signals.path` per live pod through an Envoy cluster,
//! naming the pod in `signals.host_header` (the `override_host` policy, or an
//! `ORIGINAL_DST` cluster with `use_http_header`, sends it there), parses
//! the reply ([`crate::signals::parse_with_totals`], at most `signals.max_body_bytes`
//! read) and publishes one bounded value ([`KEY`]) that the workers
//! read on their tick. With `signals.share`, it also exchanges records with
//! the other replicas through Redis ([`Share`]). The schedule and parsing
//! are the [`Scraper`]'s; this file sends the calls, counts and logs, over
//! the host traits (the host forwards its tick and the replies here).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::config::{PoolSource, Settings};
use crate::fleet::SharedView;
use crate::shared::calls::{CallFailed, HttpCalls};
use crate::shared::metrics::{MetricKind, MetricSink};
use crate::shared::registry::{PodSlot, MAX_SLOTS};
use crate::shared::store::{SharedStore, StoreError};
use crate::signals::share::{Share, SharedRecord};
use crate::signals::{Outcome, Record, Scraper, Target, KEY};
use crate::sync::bridge::BridgeCalls;

/// Bytes of a share reply read at most (the bridge truncates at 64 KiB; a
/// truncated reply fails to parse and counts as a failed exchange).
const MAX_SHARE_REPLY: usize = 64 * 1024;

pub(crate) struct Collector<H: SharedStore + MetricSink + HttpCalls + BridgeCalls> {
    host: H,
    settings: Rc<Settings>,
    view: SharedView,
    scraper: Scraper,
    /// dispatch token -> pod slot.
    calls: HashMap<u32, PodSlot>,
    /// Pods whose scrapes fail (logged once when they start to, and when
    /// they read again); at most the live pods.
    failing: HashSet<PodSlot>,
    /// With `signals.share`: the exchange through Redis and its call.
    share: Option<Share>,
    share_token: Option<u32>,
    /// A scrape round started and its records are not shared yet.
    round_open: bool,
    /// A failure streak is logged once, at its start.
    share_failing: bool,
    metrics: Metrics,
}

struct Metrics {
    scrapes: u32,
    fallbacks: u32,
    good: u32,
    shared: u32,
    share_failures: u32,
    share_peers: u32,
}

/// The section of this part's stats: `prefix_router.signals.*`.
const SECTION: &str = "signals";

impl<H: SharedStore + MetricSink + HttpCalls + BridgeCalls> Collector<H> {
    /// `replica`: this replica's sync origin, for `signals.share` (None
    /// without sync: no sharing).
    pub(crate) fn new(
        host: H,
        settings: Rc<Settings>,
        view: SharedView,
        replica: Option<&str>,
    ) -> Self {
        let s = &settings.signals;
        let scraper = Scraper::new(u64::from(s.interval_ms), s.names.clone());
        let share = match (s.share, replica) {
            (true, Some(r)) => Some(Share::new(
                r,
                &settings.sync.key_prefix,
                u64::from(s.interval_ms),
                s.stale_ms(),
            )),
            (true, None) => {
                log::warn!("prefix_router signals: share needs sync; every pod is scraped here");
                None
            }
            _ => None,
        };
        let metrics = Metrics {
            shared: host.define_in(SECTION, MetricKind::Counter, "shared"),
            share_failures: host.define_in(SECTION, MetricKind::Counter, "share_failures"),
            share_peers: host.define_in(SECTION, MetricKind::Gauge, "share_peers"),
            scrapes: host.define_in(SECTION, MetricKind::Counter, "scrapes"),
            fallbacks: host.define_in(SECTION, MetricKind::Counter, "fallbacks"),
            good: host.define_in(SECTION, MetricKind::Gauge, "pods"),
        };
        Self {
            host,
            share,
            share_token: None,
            round_open: false,
            share_failing: false,
            scraper,
            view,
            calls: HashMap::new(),
            failing: HashSet::new(),
            settings,
            metrics,
        }
    }

    /// Every live pod with the cluster its scrape goes through.
    fn targets(&self) -> Vec<Target> {
        let s = &self.settings;
        let view = self.view.borrow();
        let mut out = Vec::new();
        for (pool, members) in &view.members().pools {
            let cluster = if s.signals.cluster.is_empty() {
                match s.pools.get(pool) {
                    Some(PoolSource::Cluster(c)) => c.clone(),
                    _ => continue,
                }
            } else {
                s.signals.cluster.clone()
            };
            for m in members {
                out.push(Target {
                    slot: m.slot,
                    address: m.address.clone(),
                    cluster: cluster.clone(),
                });
            }
        }
        out
    }

    /// The host's tick: the due scrapes, then the exchange when due.
    pub(crate) fn on_tick(&mut self, now_ms: u64) {
        let mut targets = self.targets();
        if let Some(share) = &self.share {
            // Only the pods this replica scrapes: its own, and orphans.
            let view = self.view.borrow();
            targets.retain(|t| view.name(t.slot).map_or(true, |n| share.scrapes(n, now_ms)));
        }
        let due = self.scraper.due(now_ms, &targets);
        if self.share.is_some() && !due.is_empty() {
            self.round_open = true;
        }
        let settings = self.settings.clone();
        let s = &settings.signals;
        let timeout_ms = u64::from(s.timeout_ms);
        for t in due {
            let authority = if s.authority.is_empty() {
                t.address.as_str()
            } else {
                s.authority.as_str()
            };
            let headers = [
                (":method", "GET"),
                (":path", s.path.as_str()),
                (":authority", authority),
                (s.host_header.as_str(), t.address.as_str()),
            ];
            match self.host.dispatch(&t.cluster, &headers, None, timeout_ms) {
                Ok(token) => {
                    self.calls.insert(token, t.slot);
                }
                Err(status) => {
                    let why = format!("cannot call cluster {} ({status})", t.cluster);
                    let out = self.scraper.not_sent(t.slot, &why);
                    self.count(t.slot, &t.address, out);
                }
            }
        }
        self.exchange(now_ms);
        self.publish();
    }

    /// With `signals.share`, once per interval: writes this replica's
    /// records to Redis and reads every replica's, in one bridge call.
    fn exchange(&mut self, now_ms: u64) {
        let settings = self.settings.clone();
        let sync = &settings.sync;
        let timeout_ms = sync
            .op_timeout_ms
            .clamp(1, 2 * u64::from(settings.signals.timeout_ms));
        let Some(share) = self.share.as_mut() else {
            return;
        };
        let round_done = self.round_open && !self.scraper.busy();
        if !share.due(now_ms, timeout_ms, round_done) {
            return;
        }
        self.round_open = false;
        let own: Vec<SharedRecord> = {
            let view = self.view.borrow();
            self.scraper
                .own()
                .filter_map(|r| {
                    Some(SharedRecord {
                        pod: view.name(r.slot)?.to_string(),
                        at_ms: r.at_ms,
                        signals: r.signals,
                    })
                })
                .collect()
        };
        let auth = sync
            .auth_password
            .as_deref()
            .map(|pw| (sync.auth_username.as_deref(), pw));
        let body = share.request(&own, now_ms, auth);
        match self.host.post_bridge(sync, None, &body, timeout_ms) {
            Ok(token) => self.share_token = Some(token),
            Err(status) => {
                let why = format!("cannot call cluster {} ({status})", sync.bridge_cluster);
                self.shared_reply(Err(&why), now_ms);
            }
        }
    }

    /// An exchange's reply, or why the call failed.
    fn shared_reply(&mut self, reply: Result<&[u8], &str>, now_ms: u64) {
        let Some(share) = self.share.as_mut() else {
            return;
        };
        match share.on_reply(reply.ok(), now_ms) {
            Ok(peers) => {
                self.host.increment_metric(self.metrics.shared, 1);
                self.host
                    .record_metric(self.metrics.share_peers, peers as u64);
                if self.share_failing {
                    self.share_failing = false;
                    log::info!("prefix_router signals: sharing through Redis works again");
                }
            }
            Err(e) => {
                // The others' records age out; until then they still count.
                share.forget_peers();
                self.host.increment_metric(self.metrics.share_failures, 1);
                if !self.share_failing {
                    self.share_failing = true;
                    let why = reply.err().map_or_else(|| e.to_string(), str::to_string);
                    log::warn!(
                        "prefix_router signals: sharing through Redis failed ({why}); every pod is scraped here until it works"
                    );
                }
            }
        }
        let view = self.view.borrow();
        let remote: Vec<Record> = share
            .remote(now_ms)
            .filter_map(|r| {
                Some(Record {
                    slot: view.slot_of(&r.pod)?,
                    at_ms: r.at_ms,
                    signals: r.signals,
                })
            })
            .collect();
        drop(view);
        self.scraper.set_remote(remote);
    }

    /// The reply to call `token`, read through `read` (at most the bytes it
    /// is given, or why there is no body): a scrape's at most
    /// `signals.max_body_bytes`, an exchange's at most 64 KiB. False if the
    /// call is not ours.
    pub(crate) fn on_reply(
        &mut self,
        token: u32,
        now_ms: u64,
        read: impl FnOnce(usize) -> Result<Vec<u8>, CallFailed>,
    ) -> bool {
        if self.share_token == Some(token) {
            self.share_token = None;
            let reply = read(MAX_SHARE_REPLY).map_err(|e| e.to_string());
            self.shared_reply(reply.as_deref().map_err(String::as_str), now_ms);
            self.publish();
            return true;
        }
        let Some(slot) = self.calls.remove(&token) else {
            return false;
        };
        let reply = read(self.settings.signals.max_body_bytes).map_err(|e| match e {
            CallFailed::Timeout => "timed out or reset".to_string(),
            other => other.to_string(),
        });
        let out = match &reply {
            Ok(body) => self.scraper.on_reply(slot, Ok(body), now_ms),
            Err(why) => self.scraper.on_reply(slot, Err(why), now_ms),
        };
        let address = self.view.borrow().address(slot).unwrap_or("?").to_string();
        self.count(slot, &address, out);
        if self.round_open && !self.scraper.busy() {
            // The round is complete: share it now, not a tick later.
            self.exchange(now_ms);
        }
        self.publish();
        true
    }

    fn count(&mut self, slot: PodSlot, address: &str, out: Outcome) {
        match out {
            Outcome::Scraped => {
                self.host.increment_metric(self.metrics.scrapes, 1);
                if self.failing.remove(&slot) {
                    log::info!("prefix_router signals: pod {address}: metrics read again");
                }
            }
            Outcome::Fallback(why) => {
                self.host.increment_metric(self.metrics.fallbacks, 1);
                if self.failing.len() < MAX_SLOTS && self.failing.insert(slot) {
                    log::warn!(
                        "prefix_router signals: pod {address}: {why}; weighed by in-flight counts until its metrics read again"
                    );
                }
            }
        }
    }

    fn publish(&mut self) {
        if let Some(value) = self.scraper.take_publish() {
            self.host
                .record_metric(self.metrics.good, self.scraper.good() as u64);
            if let Err(e) = self.host.set(KEY, &value, None) {
                let status = match e {
                    StoreError::Host { status, .. } => status,
                    other => other.to_string(),
                };
                log::warn!("prefix_router signals: publishing failed ({status})");
            }
        }
    }
}

#[cfg(test)]
mod tests;
