//! The `podload` namespace: one entity per replica with its in-flight count
//! per pod, so routing weighs the fleet's load and not only its own.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::Clock;
use crate::config::Settings;
use crate::fleet::SharedView;
use crate::route::feedback::trust as feedback;
use crate::route::load;
use crate::route::policy::PolicyMode;
use crate::shared::registry::PodSlot;
use crate::shared::store::SharedStore;
use crate::sync::{Capabilities, Rejected, Syncable};

/// One replica's load report.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoadReport {
    /// In-flight requests per pod name.
    pub inflight: BTreeMap<String, u32>,
    /// When the report was made, unix milliseconds.
    pub at_ms: u64,
    /// What this replica's answers said of each pod's old matches
    /// (`feedback.cached_tokens`): per pod name, held then evicted counts by
    /// age (see [`crate::route::feedback::trust::reported_counts`]). Absent in
    /// reports of replicas without it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trust: BTreeMap<String, Vec<u16>>,
}

/// Per-replica in-flight load as a syncable: pushes this replica's counts
/// (full snapshot of one entity), pulls the others' and publishes their sum
/// to the shared store for routing.
pub struct PodLoadSync<S: SharedStore> {
    namespace: String,
    replica: String,
    store: S,
    fleet: SharedView,
    clock_ms: Clock,
    /// Reports older than this are stale (deleted from Redis, not applied).
    max_age_ms: u64,
    remote: HashMap<String, Vec<u32>>,
    /// Whether replicas share what the answers said (`feedback.cached_tokens`
    /// with the load-aware policy).
    trust: bool,
    /// The other replicas' trust counts, by replica: (slot, pod name, counts).
    remote_trust: HashMap<String, Vec<(PodSlot, String, Vec<u16>)>>,
}

impl<S: SharedStore> PodLoadSync<S> {
    pub fn new(
        store: S,
        settings: &Settings,
        fleet: SharedView,
        replica: String,
        clock_ms: Clock,
        max_age_ms: u64,
    ) -> Self {
        Self {
            namespace: settings.sync.namespaces.load.clone(),
            replica,
            store,
            fleet,
            clock_ms,
            max_age_ms,
            remote: HashMap::new(),
            trust: settings.feedback.cached_tokens && settings.policy == PolicyMode::LoadAware,
            remote_trust: HashMap::new(),
        }
    }
}

impl<S: SharedStore> Syncable for PodLoadSync<S> {
    fn namespace(&self) -> String {
        self.namespace.clone()
    }

    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let Ok(local) = load::replica_total(&self.store, (self.clock_ms)()) else {
            return Vec::new();
        };
        let fleet = self.fleet.borrow();
        let report = LoadReport {
            inflight: fleet
                .all()
                .filter_map(|(slot, name, _)| {
                    let n = local.get(slot.index()).copied().unwrap_or(0);
                    (n > 0).then(|| (name.to_string(), n))
                })
                .collect(),
            at_ms: (self.clock_ms)(),
            trust: if self.trust {
                feedback::reported_counts(
                    &self.store,
                    fleet.all().map(|(slot, name, _)| (slot, name)),
                )
                .into_iter()
                .collect()
            } else {
                BTreeMap::new()
            },
        };
        serde_json::to_vec(&report)
            .map(|v| vec![(self.replica.clone(), v)])
            .unwrap_or_default()
    }

    fn apply_remote(&mut self, id: &str, payload: &[u8]) -> Result<(), Rejected> {
        if id == self.replica {
            return Ok(());
        }
        let report: LoadReport = serde_json::from_slice(payload)
            .map_err(|e| Rejected(format!("load report {id}: {e}")))?;
        let fleet = self.fleet.borrow();
        let mut counts = vec![0u32; fleet.bound()];
        for (name, n) in &report.inflight {
            if let Some(c) = fleet
                .slot_of(name)
                .and_then(|pod| counts.get_mut(pod.index()))
            {
                *c = *n;
            }
        }
        self.remote.insert(id.to_string(), counts);
        if self.trust {
            let trust = report
                .trust
                .into_iter()
                .filter_map(|(name, c)| Some((fleet.slot_of(&name)?, name, c)))
                .collect();
            self.remote_trust.insert(id.to_string(), trust);
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            hooks: true,
            stale: true,
            ..Capabilities::default()
        }
    }

    fn on_sync_start(&mut self) {
        // Replicas that stopped reporting drop out with this pull.
        self.remote.clear();
        self.remote_trust.clear();
    }

    fn on_sync_end(&mut self) {
        let mut total = vec![0u32; self.fleet.borrow().bound()];
        for counts in self.remote.values() {
            for (t, c) in total.iter_mut().zip(counts) {
                *t = t.saturating_add(*c);
            }
        }
        if let Err(e) = load::set_remote(&self.store, &total) {
            log::warn!("prefix_router: publishing fleet load failed: {e}");
        }
        if self.trust {
            let reports = self
                .remote_trust
                .values()
                .flatten()
                .map(|(slot, name, c)| (*slot, name.as_str(), c.as_slice()));
            if let Err(e) = feedback::publish_remote(&self.store, reports) {
                log::warn!("prefix_router: publishing the replicas' trust counts failed: {e}");
            }
        }
    }

    fn is_stale(&self, id: &str, payload: &[u8]) -> bool {
        id != self.replica
            && serde_json::from_slice::<LoadReport>(payload)
                .is_ok_and(|r| (self.clock_ms)().saturating_sub(r.at_ms) > self.max_age_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{settings, view};
    use super::*;
    use crate::shared::store::MemStore;
    use std::cell::Cell;
    use std::rc::Rc;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn pod_load_sums_other_replicas_and_drops_stale() {
        let store = Rc::new(MemStore::new());
        let s = settings();
        let now = Rc::new(Cell::new(10_000u64));
        let n = now.clone();
        let mut me = PodLoadSync::new(
            store.clone(),
            &s,
            view(&store, &s),
            "r1".into(),
            Rc::new(move || n.get()),
            30_000,
        );
        // One worker VM with 2 requests in flight on b:1.
        let mut vm = load::VmLoad::new(1);
        vm.add(PodSlot::new(1), 2);
        vm.refresh(&*store, 10_000, false).unwrap();
        let snap = me.snapshot();
        assert_eq!(snap[0].0, "r1");
        assert_eq!(
            String::from_utf8(snap[0].1.clone()).unwrap(),
            r#"{"inflight":{"b:1":2},"at_ms":10000}"#
        );
        me.on_sync_start();
        me.apply_remote("r1", &snap[0].1).unwrap();
        me.apply_remote("r2", br#"{"inflight":{"a:1":3,"b:1":1},"at_ms":9000}"#)
            .unwrap();
        me.apply_remote("r3", br#"{"inflight":{"a:1":4,"gone:1":9},"at_ms":9000}"#)
            .unwrap();
        me.on_sync_end();
        // The others' reports only (this replica's own counts are its VMs').
        assert_eq!(load::remote(&*store).unwrap(), vec![7, 1]);
        now.set(100_000);
        assert!(me.is_stale("r2", br#"{"inflight":{},"at_ms":1}"#));
        assert!(!me.is_stale("r1", br#"{"inflight":{},"at_ms":1}"#));
        me.on_sync_start();
        me.on_sync_end();
        assert_eq!(load::remote(&*store).unwrap(), vec![0, 0]);
    }

    #[test]
    fn trust_counts_travel_by_pod_name_and_the_others_are_summed() {
        use crate::route::feedback::trust::REMOTE_KEY;
        use crate::route::feedback::TrustLearner;
        let store = Rc::new(MemStore::new());
        let s = settings();
        let fleet = view(&store, &s);
        let mut me = PodLoadSync::new(
            store.clone(),
            &s,
            fleet.clone(),
            "r1".into(),
            Rc::new(|| 10_000),
            30_000,
        );
        // This replica's VMs learned: b:1 (slot 1) evicted three matches at 4 s.
        let mut vm = TrustLearner::default();
        for (slot, name, _) in fleet.borrow().all() {
            vm.bind(slot, name);
        }
        for _ in 0..3 {
            vm.observe(PodSlot::new(1), 4, true);
        }
        vm.share(&*store, false).unwrap();
        let snap = me.snapshot();
        let report: LoadReport = serde_json::from_slice(&snap[0].1).unwrap();
        let mut want = vec![0u16; 32];
        want[16 + 4] = 3;
        assert_eq!(report.trust.get("b:1"), Some(&want), "{report:?}");
        assert_eq!(report.trust.len(), 1);
        // Two other replicas: one saw a:1 hold at 2 s and b:1 evict at 4 s;
        // one names a pod unknown here and sends a malformed count list.
        let mut held = vec![0u16; 32];
        held[2] = 5;
        let r2 = LoadReport {
            inflight: BTreeMap::new(),
            at_ms: 9_000,
            trust: [("a:1".to_string(), held), ("b:1".to_string(), want.clone())].into(),
        };
        let r3 = LoadReport {
            inflight: BTreeMap::new(),
            at_ms: 9_000,
            trust: [
                ("gone:1".to_string(), want.clone()),
                ("a:1".to_string(), vec![9; 3]),
            ]
            .into(),
        };
        me.on_sync_start();
        me.apply_remote("r1", &snap[0].1).unwrap();
        me.apply_remote("r2", &serde_json::to_vec(&r2).unwrap())
            .unwrap();
        me.apply_remote("r3", &serde_json::to_vec(&r3).unwrap())
            .unwrap();
        me.on_sync_end();
        // A worker VM of this replica that read no answer at all.
        let mut other_vm = TrustLearner::default();
        for (slot, name, _) in fleet.borrow().all() {
            other_vm.bind(slot, name);
        }
        other_vm.share(&*store, true).unwrap();
        // b:1: its own 3 plus r2's 3 evictions at 4 s; a:1: held only.
        assert_eq!(other_vm.horizon(PodSlot::new(1)), Some(4));
        assert_eq!(other_vm.horizon(PodSlot::new(0)), None);
        // In REMOTE_KEY, r2's counts alone (r1's own are its VMs').
        let (v, _) = store.get(REMOTE_KEY).unwrap();
        let mut a_held = vec![0u16; 32];
        a_held[2] = 5;
        assert_eq!(
            feedback::decoded_counts(&v.unwrap()),
            vec![(0, a_held), (1, want.clone())]
        );
        // Replicas gone: the sum empties.
        me.on_sync_start();
        me.on_sync_end();
        let (v, _) = store.get(REMOTE_KEY).unwrap();
        assert_eq!(feedback::decoded_counts(&v.unwrap()), vec![]);
    }
}
