//! The live fleet: which pods exist, by a stable name, which may take
//! traffic now, and the small slot each is known by in shared data.
//!
//! - [`crate::shared::registry`]: stable pod name <-> [`PodSlot`], shared by every VM
//!   and surviving config updates, so nothing learned about pod X is ever
//!   read as pod Y.
//! - [`membership`]: the hosts and health of an Envoy upstream cluster, from
//!   the admin `/clusters` reply the singleton fetches.
//! - [`FleetView`]: one VM's picture: members per pool (published by the
//!   singleton for cluster pools, built from the config for static ones) and
//!   pods in passive cooldown (a worker saw them fail).
//!
//! Workers refresh their view on their tick, never per request: membership
//! and health cost a request nothing beyond what routing already reads.

pub mod membership;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::shared::registry::{NameRegistry, PodSlot};
use crate::shared::store::{cas_update, SharedStore, StoreError};

/// Shared-data key of the published members (written by the singleton).
pub(crate) const MEMBERS_KEY: &str = "fleet/members";
/// Shared-data key of the passive cooldowns (written by workers).
pub const DOWN_KEY: &str = "fleet/down";
/// Most pods in cooldown at once.
const MAX_DOWN: usize = 256;

/// Pool key of the default pool (models without a pool of their own).
pub(crate) const DEFAULT_POOL: &str = "";

/// One pod of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub(crate) slot: PodSlot,
    /// Stable name (table, sync payloads, load reports).
    pub(crate) name: String,
    /// `host:port` for the destination header.
    pub(crate) address: String,
    /// Envoy's view (health checks, outlier detection, EDS health).
    pub(crate) healthy: bool,
}

/// Members of every pool (`""` = the default pool).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    pub pools: BTreeMap<String, Vec<Member>>,
}

impl Members {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<Members> {
        serde_json::from_slice(bytes).ok()
    }
}

/// Passive cooldowns: `slot u16 | until_ms u64` pairs, little endian.
pub fn decode_down(bytes: &[u8]) -> Vec<(PodSlot, u64)> {
    bytes
        .chunks_exact(10)
        .take(MAX_DOWN)
        .map(|c| {
            let mut until = [0u8; 8];
            until.copy_from_slice(&c[2..10]);
            (
                PodSlot::from_le_bytes([c[0], c[1]]),
                u64::from_le_bytes(until),
            )
        })
        .collect()
}

fn encode_down(down: &[(PodSlot, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(down.len() * 10);
    for (slot, until) in down {
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&until.to_le_bytes());
    }
    out
}

/// Puts `slot` in cooldown until `until_ms` for every VM (expired entries
/// are dropped on the way). Returns the list as written.
pub fn mark_down<S: SharedStore + ?Sized>(
    store: &S,
    slot: PodSlot,
    until_ms: u64,
    now_ms: u64,
) -> Result<Vec<(PodSlot, u64)>, StoreError> {
    let mut written = Vec::new();
    cas_update(store, DOWN_KEY, 8, |cur| {
        let mut down: Vec<(PodSlot, u64)> = decode_down(cur.unwrap_or(&[]))
            .into_iter()
            .filter(|(s, until)| *until > now_ms && *s != slot)
            .collect();
        if down.len() >= MAX_DOWN {
            down.remove(0);
        }
        down.push((slot, until_ms));
        let bytes = encode_down(&down);
        written = down;
        Some(bytes)
    })?;
    Ok(written)
}

/// A view shared by the singleton's syncables (one VM, one thread).
pub type SharedView = Rc<RefCell<FleetView>>;

/// One VM's picture of the fleet.
#[derive(Debug, Clone, Default)]
pub struct FleetView {
    members: Members,
    by_slot: HashMap<PodSlot, (String, String)>,
    by_name: HashMap<String, PodSlot>,
    down: Vec<(PodSlot, u64)>,
    bound: usize,
}

impl FleetView {
    #[cfg(any(test, feature = "testkit"))]
    pub fn new(members: Members) -> Self {
        let mut view = FleetView::default();
        view.set_members(members);
        view
    }

    pub(crate) fn set_members(&mut self, members: Members) {
        self.by_slot.clear();
        self.by_name.clear();
        for m in members.pools.values().flatten() {
            self.by_slot
                .insert(m.slot, (m.name.clone(), m.address.clone()));
            self.by_name.insert(m.name.clone(), m.slot);
        }
        self.bound = self
            .by_slot
            .keys()
            .map(|s| s.index() + 1)
            .max()
            .unwrap_or(0);
        self.members = members;
    }

    /// Members of every pool (the singleton's scraper reads which cluster
    /// each pod's pool is).
    pub(crate) fn members(&self) -> &Members {
        &self.members
    }

    pub(crate) fn set_down(&mut self, down: Vec<(PodSlot, u64)>) {
        self.down = down;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_slot.is_empty()
    }

    fn pool(&self, pool: &str) -> &[Member] {
        self.members.pools.get(pool).map_or(&[], Vec::as_slice)
    }

    fn cooling(&self, slot: PodSlot, now_ms: u64) -> bool {
        self.down
            .iter()
            .any(|(s, until)| *s == slot && *until > now_ms)
    }

    /// Slots of `pool` (a pool key: a model with a pool of its own, else
    /// [`DEFAULT_POOL`]) that may take a request now: healthy and not in
    /// cooldown. If that leaves none, every member of the pool (as Envoy's
    /// panic routing does): routing never stops while the pool has members.
    /// A pool with no members yet has none: its requests pass through.
    pub fn routable(&self, pool: &str, now_ms: u64) -> Vec<PodSlot> {
        let pool = self.pool(pool);
        let ok: Vec<PodSlot> = pool
            .iter()
            .filter(|m| m.healthy && !self.cooling(m.slot, now_ms))
            .map(|m| m.slot)
            .collect();
        if ok.is_empty() {
            pool.iter().map(|m| m.slot).collect()
        } else {
            ok
        }
    }

    pub(crate) fn address(&self, slot: PodSlot) -> Option<&str> {
        self.by_slot.get(&slot).map(|(_, a)| a.as_str())
    }

    pub(crate) fn name(&self, slot: PodSlot) -> Option<&str> {
        self.by_slot.get(&slot).map(|(n, _)| n.as_str())
    }

    /// Slot of a current member by name (None for anyone else).
    pub fn slot_of(&self, name: &str) -> Option<PodSlot> {
        self.by_name.get(name).copied()
    }

    /// Every member: (slot, name, address), each once.
    pub fn all(&self) -> impl Iterator<Item = (PodSlot, &str, &str)> {
        self.by_slot
            .iter()
            .map(|(s, (n, a))| (*s, n.as_str(), a.as_str()))
    }

    /// One past the highest member slot.
    pub fn bound(&self) -> usize {
        self.bound
    }
}

/// Builds members from static `host:port` pools: each address is its own
/// stable name, and gets its slot from the registry.
pub fn static_members<S: SharedStore + ?Sized>(
    store: &S,
    pools: &BTreeMap<String, Vec<String>>,
    now_secs: u32,
    retire_secs: u32,
) -> Result<Members, StoreError> {
    let hosts = pools
        .iter()
        .map(|(pool, addrs)| {
            let hosts = addrs
                .iter()
                .map(|a| membership::Host {
                    name: a.clone(),
                    address: a.clone(),
                    healthy: true,
                })
                .collect();
            (pool.clone(), hosts)
        })
        .collect();
    cluster_members(store, &hosts, now_secs, retire_secs)
}

/// Builds members from the hosts of each pool, interning their names in the
/// registry. Hosts the registry cannot take (full) are left out.
pub(crate) fn cluster_members<S: SharedStore + ?Sized>(
    store: &S,
    pools: &BTreeMap<String, Vec<membership::Host>>,
    now_secs: u32,
    retire_secs: u32,
) -> Result<Members, StoreError> {
    let mut names: Vec<&str> = pools.values().flatten().map(|h| h.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let (slots, _) = NameRegistry::pods(store).intern(&names, now_secs, retire_secs)?;
    let slot_of: HashMap<&str, PodSlot> = names
        .iter()
        .zip(slots)
        .filter_map(|(n, s)| Some((*n, PodSlot::new(s?))))
        .collect();
    let pools = pools
        .iter()
        .map(|(pool, hosts)| {
            let members = hosts
                .iter()
                .filter_map(|h| {
                    Some(Member {
                        slot: *slot_of.get(h.name.as_str())?,
                        name: h.name.clone(),
                        address: h.address.clone(),
                        healthy: h.healthy,
                    })
                })
                .collect();
            (pool.clone(), members)
        })
        .collect();
    Ok(Members { pools })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn pools(list: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        list.iter()
            .map(|(p, a)| (p.to_string(), a.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn static_pools_keep_slots_across_a_config_update() {
        let store = MemStore::new();
        let before = static_members(&store, &pools(&[("", &["b:1", "c:1"])]), 10, 100).unwrap();
        let after =
            static_members(&store, &pools(&[("", &["a:1", "b:1", "c:1"])]), 11, 100).unwrap();
        let slot = |m: &Members, n: &str| FleetView::new(m.clone()).slot_of(n).unwrap();
        assert_eq!(slot(&before, "b:1"), slot(&after, "b:1"));
        assert_eq!(slot(&before, "c:1"), slot(&after, "c:1"));
        assert_ne!(slot(&after, "a:1"), slot(&after, "b:1"));
    }

    #[test]
    fn unhealthy_and_cooling_pods_are_not_routable_but_never_all() {
        let store = MemStore::new();
        let hosts = |ok: [bool; 3]| {
            let list = ["p1", "p2", "p3"]
                .iter()
                .zip(ok)
                .map(|(n, healthy)| membership::Host {
                    name: n.to_string(),
                    address: format!("{n}:80"),
                    healthy,
                })
                .collect();
            BTreeMap::from([(DEFAULT_POOL.to_string(), list)])
        };
        let m = cluster_members(&store, &hosts([true, false, true]), 10, 100).unwrap();
        let mut view = FleetView::new(m);
        let (p1, p3) = (view.slot_of("p1").unwrap(), view.slot_of("p3").unwrap());
        assert_eq!(view.routable(DEFAULT_POOL, 0), vec![p1, p3]);
        assert!(view
            .routable("model-with-a-pool-not-known-yet", 0)
            .is_empty());
        view.set_down(mark_down(&store, p1, 5_000, 1_000).unwrap());
        assert_eq!(view.routable(DEFAULT_POOL, 4_999), vec![p3]);
        assert_eq!(
            view.routable(DEFAULT_POOL, 5_000),
            vec![p1, p3],
            "cooldown ends by itself"
        );
        // Everyone unhealthy: route anyway rather than stop.
        let m = cluster_members(&store, &hosts([false, false, false]), 10, 100).unwrap();
        view.set_members(m);
        assert_eq!(view.routable(DEFAULT_POOL, 0).len(), 3);
        assert_eq!(view.address(p3), Some("p3:80"));
    }

    #[test]
    fn cooldown_list_is_bounded_and_drops_expired() {
        let store = MemStore::new();
        for slot in 0..(MAX_DOWN as u16 + 10) {
            mark_down(&store, PodSlot::new(slot), 10_000, 0).unwrap();
        }
        let down = mark_down(&store, PodSlot::new(7), 20_000, 15_000).unwrap();
        assert_eq!(down, vec![(PodSlot::new(7), 20_000)]);
        let (v, _) = store.get(DOWN_KEY).unwrap();
        assert!(decode_down(&v.unwrap()).len() <= MAX_DOWN);
    }
}
