//! The singleton's pod-signal scraper: every `signals.interval_ms` it sends
//! one `GET signals.path` per live pod through an Envoy cluster, naming the
//! pod in `signals.host_header` (the `override_host` policy, or an
//! `ORIGINAL_DST` cluster with `use_http_header`, sends it there), parses
//! the reply ([`crate::signals::parse`], at most `signals.max_body_bytes`
//! read) and publishes one bounded value ([`crate::signals::KEY`]) that the
//! workers read on their tick. The schedule and the parsing are the pure
//! [`Scraper`]; this file only does the calls.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MetricType};

use super::abi;
use crate::config::{PoolSource, Settings};
use crate::fleet::SharedView;
use crate::route::registry::PodSlot;
use crate::signals::{self, Outcome, Scraper, Target};
use crate::sync::CallFailed;

pub struct SignalService {
    settings: Rc<Settings>,
    view: SharedView,
    scraper: Scraper,
    /// dispatch token -> pod slot.
    calls: HashMap<u32, PodSlot>,
    scrapes: u32,
    fallbacks: u32,
    good: u32,
    /// Pods whose scrapes fail (logged once when they start to, and when
    /// they read again); at most the live pods.
    failing: HashSet<PodSlot>,
}

fn def(kind: MetricType, name: &str) -> u32 {
    hostcalls::define_metric(kind, &format!("prefix_router.signals.{name}")).unwrap_or(0)
}

impl SignalService {
    pub fn new(settings: Rc<Settings>, view: SharedView) -> Self {
        let s = &settings.signals;
        let scraper = Scraper::new(u64::from(s.interval_ms), s.names.clone());
        Self {
            scraper,
            view,
            calls: HashMap::new(),
            scrapes: def(MetricType::Counter, "scrapes"),
            fallbacks: def(MetricType::Counter, "fallbacks"),
            good: def(MetricType::Gauge, "pods"),
            failing: HashSet::new(),
            settings,
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

    pub fn on_tick(&mut self, now_ms: u64) {
        let targets = self.targets();
        let due = self.scraper.due(now_ms, &targets);
        let settings = self.settings.clone();
        let s = &settings.signals;
        let timeout = Duration::from_millis(u64::from(s.timeout_ms));
        for t in due {
            let authority = if s.authority.is_empty() {
                t.address.as_str()
            } else {
                s.authority.as_str()
            };
            let headers = vec![
                (":method", "GET"),
                (":path", s.path.as_str()),
                (":authority", authority),
                (s.host_header.as_str(), t.address.as_str()),
            ];
            match hostcalls::dispatch_http_call(&t.cluster, headers, None, vec![], timeout) {
                Ok(token) => {
                    self.calls.insert(token, t.slot);
                }
                Err(status) => {
                    let why = format!("cannot call cluster {} ({status:?})", t.cluster);
                    let out = self.scraper.not_sent(t.slot, &why);
                    self.count(t.slot, &t.address, out);
                }
            }
        }
        self.publish();
    }

    /// Handles a scrape reply; false if `token` is not one of ours.
    pub fn on_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        now_ms: u64,
    ) -> bool {
        let Some(slot) = self.calls.remove(&token) else {
            return false;
        };
        let max = self.settings.signals.max_body_bytes;
        let reply = match abi::call_ok(num_headers) {
            Ok(()) => Ok(
                abi::buffer(BufferType::HttpCallResponseBody, 0, body_size.min(max))
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
            ),
            Err(e) => Err(match e {
                CallFailed::Timeout => "timed out or reset".to_string(),
                other => other.to_string(),
            }),
        };
        let out = match &reply {
            Ok(body) => self.scraper.on_reply(slot, Ok(body), now_ms),
            Err(why) => self.scraper.on_reply(slot, Err(why), now_ms),
        };
        let address = self.view.borrow().address(slot).unwrap_or("?").to_string();
        self.count(slot, &address, out);
        self.publish();
        true
    }

    fn count(&mut self, slot: PodSlot, address: &str, out: Outcome) {
        match out {
            Outcome::Scraped => {
                let _ = hostcalls::increment_metric(self.scrapes, 1);
                if self.failing.remove(&slot) {
                    log::info!("prefix_router signals: pod {address}: metrics read again");
                }
            }
            Outcome::Fallback(why) => {
                let _ = hostcalls::increment_metric(self.fallbacks, 1);
                if self.failing.len() < crate::route::registry::MAX_SLOTS
                    && self.failing.insert(slot)
                {
                    log::warn!(
                        "prefix_router signals: pod {address}: {why}; weighed by in-flight counts until its metrics read again"
                    );
                }
            }
        }
    }

    fn publish(&mut self) {
        if let Some(value) = self.scraper.take_publish() {
            let _ = hostcalls::record_metric(self.good, self.scraper.good() as u64);
            if let Err(status) = hostcalls::set_shared_data(signals::KEY, Some(&value), None) {
                log::warn!("prefix_router signals: publishing failed ({status:?})");
            }
        }
    }
}
