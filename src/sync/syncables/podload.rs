//! The `podload` namespace: one entity per replica with its in-flight count
//! per pod, so routing weighs the fleet's load and not only its own.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::Clock;
use crate::config::Settings;
use crate::fleet::SharedView;
use crate::route::load;
use crate::shared::store::SharedStore;
use crate::sync::{Capabilities, Rejected, Syncable};

/// One replica's load report.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoadReport {
    /// In-flight requests per pod name.
    pub inflight: BTreeMap<String, u32>,
    /// When the report was made, unix milliseconds.
    pub at_ms: u64,
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
    use crate::shared::registry::PodSlot;
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
    fn a_report_of_an_older_release_with_trust_counts_is_still_applied() {
        // Releases before 0.2 sent the answers' trust counts in a `trust`
        // field; in a mixed fleet during an upgrade their load still counts.
        let store = Rc::new(MemStore::new());
        let s = settings();
        let mut me = PodLoadSync::new(
            store.clone(),
            &s,
            view(&store, &s),
            "r1".into(),
            Rc::new(|| 10_000),
            30_000,
        );
        me.on_sync_start();
        me.apply_remote(
            "old",
            br#"{"inflight":{"a:1":2},"at_ms":9000,"trust":{"a:1":[0,1,2]}}"#,
        )
        .unwrap();
        me.on_sync_end();
        assert_eq!(load::remote(&*store).unwrap(), vec![2, 0]);
    }
}
