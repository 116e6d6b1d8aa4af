//! The singleton's membership refresher. For cluster pools it asks Envoy's
//! admin `/clusters?format=json` (filtered to the pools' clusters) every
//! `membership.refresh_ms`, through the `membership.admin_cluster` cluster,
//! registers new pod names, and publishes the members with Envoy's health to
//! the workers ([`MEMBERS_KEY`]). A bad reply or an empty cluster
//! keeps the last good members of that pool (counted, logged once per
//! streak): routing never loses its candidates to a glitch. For static pools
//! it only keeps its own view (the syncables name pods through it).
//!
//! It runs over the host traits; the host forwards its tick and the replies
//! to its calls here.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::config::Settings;
use crate::fleet::membership::{parse_clusters, Host};
use crate::fleet::{cluster_members, Member, Members, SharedView, MEMBERS_KEY};
use crate::shared::calls::{CallFailed, HttpCalls};
use crate::shared::metrics::{MetricKind, MetricSink};
use crate::shared::store::{SharedStore, StoreError};

/// Static pools are rebuilt this often (their names stay marked in use).
const STATIC_REFRESH_MS: u64 = 10_000;
/// A refresh call times out after twice the refresh interval, at least this.
const MIN_REFRESH_MS: u64 = 200;

pub(crate) struct Refresher<H: SharedStore + MetricSink + HttpCalls> {
    host: H,
    settings: Rc<Settings>,
    view: SharedView,
    /// pool -> cluster, for the cluster pools.
    clusters: BTreeMap<String, String>,
    /// Last good hosts per cluster pool.
    last_good: BTreeMap<String, Vec<Host>>,
    /// What was last published, to write only on change.
    published: Option<Members>,
    /// The admin call in flight.
    call: Option<u32>,
    next_ms: u64,
    path: String,
    failing_logged: bool,
    metrics: Metrics,
}

struct Metrics {
    refreshes: u32,
    failures: u32,
    members: u32,
    routable: u32,
}

/// The section of this part's stats: `prefix_router.membership.*`.
const SECTION: &str = "membership";

impl<H: SharedStore + MetricSink + HttpCalls> Refresher<H> {
    pub(crate) fn new(host: H, settings: Rc<Settings>, view: SharedView) -> Self {
        let clusters = settings.cluster_pools();
        let path = admin_path(clusters.values());
        let metrics = Metrics {
            refreshes: host.define_in(SECTION, MetricKind::Counter, "refreshes"),
            failures: host.define_in(SECTION, MetricKind::Counter, "failures"),
            members: host.define_in(SECTION, MetricKind::Gauge, "members"),
            routable: host.define_in(SECTION, MetricKind::Gauge, "healthy"),
        };
        Self {
            host,
            settings,
            view,
            clusters,
            last_good: BTreeMap::new(),
            published: None,
            call: None,
            next_ms: 0,
            path,
            failing_logged: false,
            metrics,
        }
    }

    /// The host's tick: a refresh when due and none is in flight (the
    /// first at once).
    pub(crate) fn on_tick(&mut self, now_ms: u64) {
        if now_ms < self.next_ms || self.call.is_some() {
            return;
        }
        if self.clusters.is_empty() {
            self.next_ms = now_ms + STATIC_REFRESH_MS;
            self.rebuild(now_ms);
            return;
        }
        let m = &self.settings.membership;
        self.next_ms = now_ms + u64::from(m.refresh_ms);
        let headers = [
            (":method", "GET"),
            (":path", self.path.as_str()),
            (":authority", m.admin_authority.as_str()),
        ];
        let timeout_ms = u64::from(m.refresh_ms).max(MIN_REFRESH_MS) * 2;
        match self
            .host
            .dispatch(&m.admin_cluster, &headers, None, timeout_ms)
        {
            Ok(token) => self.call = Some(token),
            Err(status) => {
                let why = format!("cannot call cluster {} ({status})", m.admin_cluster);
                self.failed(&why);
            }
        }
    }

    /// The reply to call `token`, read through `read` (at most the bytes it
    /// is given, or why there is no body); false if the call is not ours.
    pub(crate) fn on_reply(
        &mut self,
        token: u32,
        now_ms: u64,
        read: impl FnOnce(usize) -> Result<Vec<u8>, CallFailed>,
    ) -> bool {
        if self.call != Some(token) {
            return false;
        }
        self.call = None;
        let body = match read(usize::MAX) {
            Ok(body) => body,
            Err(e) => {
                self.failed(&format!("admin /clusters: {e}"));
                return true;
            }
        };
        let mut errors = Vec::new();
        for (pool, cluster) in &self.clusters {
            match parse_clusters(&body, cluster, self.settings.membership.pod_name) {
                Ok(hosts) => {
                    self.last_good.insert(pool.clone(), hosts);
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        if errors.is_empty() {
            self.host.increment_metric(self.metrics.refreshes, 1);
            if self.failing_logged {
                log::info!("prefix_router membership: admin /clusters readable again");
            }
            self.failing_logged = false;
        } else {
            self.failed(&errors.join("; "));
        }
        self.rebuild(now_ms);
        true
    }

    /// Counts a failed refresh; the last good members stay.
    fn failed(&mut self, why: &str) {
        self.host.increment_metric(self.metrics.failures, 1);
        if !self.failing_logged {
            self.failing_logged = true;
            log::warn!("prefix_router membership: {why}; keeping the last good members");
        }
    }

    /// Rebuilds the view from static pools and the last good cluster hosts,
    /// and publishes it to the workers when it changed.
    fn rebuild(&mut self, now_ms: u64) {
        let mut hosts = self.last_good.clone();
        for (pool, addrs) in self.settings.static_pools() {
            hosts.insert(
                pool,
                addrs
                    .into_iter()
                    .map(|a| Host {
                        name: a.clone(),
                        address: a,
                        healthy: true,
                    })
                    .collect(),
            );
        }
        let now_secs = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX);
        let members =
            match cluster_members(&self.host, &hosts, now_secs, self.settings.retire_secs()) {
                Ok(m) => m,
                Err(e) => {
                    log::warn!("prefix_router membership: pod registry: {e}");
                    return;
                }
            };
        let all: Vec<&Member> = members.pools.values().flatten().collect();
        self.host
            .record_metric(self.metrics.members, all.len() as u64);
        let healthy = all.iter().filter(|m| m.healthy).count();
        self.host
            .record_metric(self.metrics.routable, healthy as u64);
        if self.published.as_ref() == Some(&members) {
            return;
        }
        if !self.clusters.is_empty() {
            if let Err(e) = self.host.set(MEMBERS_KEY, &members.encode(), None) {
                let status = match e {
                    StoreError::Host { status, .. } => status,
                    other => other.to_string(),
                };
                log::warn!("prefix_router membership: publishing failed ({status})");
                return;
            }
        }
        self.view.borrow_mut().set_members(members.clone());
        self.published = Some(members);
    }
}

/// `/clusters?format=json&filter=^(a|b)$`, the filter percent-encoded and the
/// cluster names regex-escaped.
fn admin_path<'a>(clusters: impl Iterator<Item = &'a String>) -> String {
    let mut names: Vec<String> = clusters.map(|c| regex_escape(c)).collect();
    names.sort();
    names.dedup();
    let filter = format!("^({})$", names.join("|"));
    let mut path = String::from("/clusters?format=json&filter=");
    for b in filter.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' || b == b'~' {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;
