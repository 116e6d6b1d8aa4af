//! Name registries: stable names -> small slots, in shared data. Pods and
//! models each have one.
//!
//! Table records and in-flight counters name a pod and a model by a `u16`
//! slot to stay small (a pod's is typed as [`PodSlot`]). A slot is *not* a position in some list (that shifted
//! every index when a config update added a pod); it is given to a name once,
//! in a registry that every VM of the `vm_id` shares and that survives plugin
//! config updates. So a slot means the same pod (model) for every worker, the
//! singleton, and every configuration that VM ever runs.
//!
//! A slot is given to another name only when the registry is otherwise full
//! and its name has not been seen for `retire_secs`, which callers set beyond
//! the table's idle expiry: by then every record that named the slot has
//! expired, locally and in what sync can apply (remote pod facts are applied
//! only for current members, remote times are clamped to now).
//!
//! Model names come from three sources, and each may fill only its share of
//! the model registry, so none takes what another needs:
//! - the configuration's per-model pools (at most [`MAX_MODEL_POOLS`],
//!   refused at load beyond): a slot whenever one is free or retired, which
//!   the two shares below always leave (unless models that earlier
//!   configurations named, not yet retired, hold it);
//! - client requests, any `model` string: while fewer than
//!   [`CLIENT_SLOTS`] slots are live;
//! - Redis values naming models no client here named: while fewer than
//!   [`REMOTE_SLOTS`] are live.
//!
//! A client's model that finds no slot (a flood of names filled the
//! clients' share) is still routed by prefix, under its [`local_model_id`]:
//! a hash of the name above the registry's range, the same in every VM, so
//! the table keeps its records apart from other models' (two such names
//! share an id, and so records, about 1 in 64,512 times). Those records are
//! not synced (sync names a model by its slot); the model takes a slot once
//! one is free again (its id is looked up again a minute later), and its
//! records under the local id idle out. Slots are not reclaimed sooner
//! because a slot handed to another name while records still name it gives
//! the new model the old one's matches, here and in every replica sync
//! writes to. So a flood of names can cost the models that arrive during it
//! their sync, never their routing, and never a configured model's slot.
//!
//! Layout of one registry value: per slot, in slot order,
//! `last_seen u32 | len u8 | name bytes` (little endian; `len` 0 = free).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::shared::store::{cas_update, SharedStore, StoreError};

/// A pod's slot in the pod registry: how table records, in-flight counters,
/// load reports, signals and cooldowns name a pod. On the wire (records,
/// handoff messages, cooldowns, signals) it is the bare `u16`, little endian;
/// in JSON (published members) a bare number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodSlot(u16);

impl PodSlot {
    pub const fn new(raw: u16) -> Self {
        PodSlot(raw)
    }

    /// Position in per-slot vectors (`vec[slot.index()]`).
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    pub const fn to_le_bytes(self) -> [u8; 2] {
        self.0.to_le_bytes()
    }

    pub(crate) const fn from_le_bytes(bytes: [u8; 2]) -> Self {
        PodSlot(u16::from_le_bytes(bytes))
    }
}

impl fmt::Display for PodSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Shared-data key of the pod registry.
pub(crate) const PODS_KEY: &str = "fleet/pods";
/// Shared-data key of the model registry.
pub(crate) const MODELS_KEY: &str = "ptab/models";
/// Most slots of a registry (names live at once, plus the recently gone).
pub const MAX_SLOTS: usize = 1024;
/// Longest name kept (a Kubernetes pod name is at most 253 bytes).
pub const MAX_NAME: usize = 255;
/// Live model slots that names from client requests may fill (the
/// configuration's models are not held to it).
pub(crate) const CLIENT_SLOTS: usize = MAX_SLOTS / 4 * 3;
/// Live model slots that names only Redis values bring may fill.
pub(crate) const REMOTE_SLOTS: usize = MAX_SLOTS / 2;
/// Most per-model pools a configuration may name: what the clients' share
/// leaves, so every configured model finds a slot.
pub(crate) const MAX_MODEL_POOLS: usize = MAX_SLOTS - CLIENT_SLOTS;
/// A member's `last_seen` is rewritten at most this often (bounded writes).
pub(crate) const SEEN_EVERY_SECS: u32 = 60;
const MAX_ATTEMPTS: u32 = 16;

/// The table id of a model that has no registry slot: a hash of its name
/// above every slot (`MAX_SLOTS..=u16::MAX`), the same in every VM and
/// replica. Only this replica's table uses it; sync, which names models by
/// slot, skips records under it.
pub(crate) fn local_model_id(name: &str) -> u16 {
    let slots = MAX_SLOTS as u64;
    let span = u64::from(u16::MAX) + 1 - slots;
    u16::try_from(slots + xxhash_rust::xxh64::xxh64(name.as_bytes(), 0) % span).unwrap_or(u16::MAX)
}

/// One registry slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    /// Last time (unix seconds) a VM saw the pod as a member.
    pub last_seen: u32,
}

/// The decoded registry: `slots[i]` is slot `i`, `None` when free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    pub slots: Vec<Option<Slot>>,
}

impl Registry {
    pub fn decode(bytes: &[u8]) -> Registry {
        let mut slots = Vec::new();
        let mut rest = bytes;
        while rest.len() >= 5 && slots.len() < MAX_SLOTS {
            let last_seen = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let len = usize::from(rest[4]);
            let Some(name) = rest.get(5..5 + len) else {
                break;
            };
            slots.push(match (len, std::str::from_utf8(name)) {
                (1.., Ok(n)) => Some(Slot {
                    name: n.to_string(),
                    last_seen,
                }),
                _ => None,
            });
            rest = &rest[5 + len..];
        }
        Registry { slots }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for slot in &self.slots {
            match slot {
                Some(s) => {
                    out.extend_from_slice(&s.last_seen.to_le_bytes());
                    // Names are cut to MAX_NAME at interning.
                    out.push(u8::try_from(s.name.len()).unwrap_or(0));
                    out.extend_from_slice(s.name.as_bytes());
                }
                None => out.extend_from_slice(&[0, 0, 0, 0, 0]),
            }
        }
        out
    }

    pub fn slot_of(&self, name: &str) -> Option<u16> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.name == name))
            .and_then(|i| u16::try_from(i).ok())
    }

    #[cfg(any(test, feature = "testkit"))]
    pub fn name_of(&self, slot: u16) -> Option<&str> {
        self.slots
            .get(usize::from(slot))?
            .as_ref()
            .map(|s| s.name.as_str())
    }

    #[cfg(any(test, feature = "testkit"))]
    /// Marks `names` seen at `now`, giving new names a slot. Returns each
    /// name's slot (None: registry full of names seen within `retire_secs`,
    /// or a name that is empty or too long) and whether anything changed.
    pub fn intern(
        &mut self,
        names: &[&str],
        now: u32,
        retire_secs: u32,
    ) -> (Vec<Option<u16>>, bool) {
        self.intern_within(names, now, retire_secs, MAX_SLOTS)
    }

    /// `intern`, but a new name (or a retired one coming back)
    /// gets a slot only while fewer than `limit` slots are live (names from
    /// untrusted sources, such as another writer's Redis values, may not
    /// take the last ones).
    pub(crate) fn intern_within(
        &mut self,
        names: &[&str],
        now: u32,
        retire_secs: u32,
        limit: usize,
    ) -> (Vec<Option<u16>>, bool) {
        let mut changed = false;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if name.is_empty() || name.len() > MAX_NAME {
                out.push(None);
                continue;
            }
            if let Some(slot) = self.slot_of(name) {
                // A retired name that comes back is held to `limit` like a
                // new one: else untrusted names could retire, let others
                // take the limit, and come back on top of them.
                let retired = self
                    .slots
                    .get(usize::from(slot))
                    .and_then(Option::as_ref)
                    .is_some_and(|s| now.saturating_sub(s.last_seen) > retire_secs);
                if retired && self.live(now, retire_secs) >= limit.min(MAX_SLOTS) {
                    out.push(None);
                    continue;
                }
                if let Some(Some(s)) = self.slots.get_mut(usize::from(slot)) {
                    if now.saturating_sub(s.last_seen) >= SEEN_EVERY_SECS {
                        s.last_seen = now;
                        changed = true;
                    }
                }
                out.push(Some(slot));
                continue;
            }
            if self.live(now, retire_secs) >= limit.min(MAX_SLOTS) {
                out.push(None);
                continue;
            }
            let fresh = Some(Slot {
                name: name.to_string(),
                last_seen: now,
            });
            let free = self.slots.iter().position(Option::is_none);
            let slot = match free {
                Some(i) => Some(i),
                None if self.slots.len() < MAX_SLOTS => {
                    self.slots.push(None);
                    Some(self.slots.len() - 1)
                }
                // Full: the pod gone longest, if gone past retirement.
                None => self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.as_ref().map(|s| (i, s.last_seen)))
                    .filter(|(_, seen)| now.saturating_sub(*seen) > retire_secs)
                    .min_by_key(|(_, seen)| *seen)
                    .map(|(i, _)| i),
            };
            match slot.and_then(|i| Some((i, u16::try_from(i).ok()?))) {
                Some((i, id)) => {
                    self.slots[i] = fresh;
                    changed = true;
                    out.push(Some(id));
                }
                None => out.push(None),
            }
        }
        (out, changed)
    }

    /// Slots whose name was seen within `retire_secs`.
    fn live(&self, now: u32, retire_secs: u32) -> usize {
        self.slots
            .iter()
            .flatten()
            .filter(|s| now.saturating_sub(s.last_seen) <= retire_secs)
            .count()
    }

    #[cfg(any(test, feature = "testkit"))]
    /// One past the highest slot in use (sizes per-slot arrays).
    pub fn bound(&self) -> usize {
        self.slots
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1)
    }
}

/// A registry in a shared store, under one key.
pub struct NameRegistry<'s, S: SharedStore + ?Sized> {
    store: &'s S,
    key: &'static str,
}

impl<'s, S: SharedStore + ?Sized> NameRegistry<'s, S> {
    pub(crate) fn pods(store: &'s S) -> Self {
        Self {
            store,
            key: PODS_KEY,
        }
    }

    pub fn models(store: &'s S) -> Self {
        Self {
            store,
            key: MODELS_KEY,
        }
    }

    pub fn load(&self) -> Result<Registry, StoreError> {
        let (value, _) = self.store.get(self.key)?;
        Ok(Registry::decode(value.as_deref().unwrap_or(&[])))
    }

    /// [`Registry::intern_within`] with every slot open, under CAS; writes only
    /// when something changed.
    /// Returns the slots and the registry as written (or read).
    pub(crate) fn intern(
        &self,
        names: &[&str],
        now: u32,
        retire_secs: u32,
    ) -> Result<(Vec<Option<u16>>, Registry), StoreError> {
        self.intern_within(names, now, retire_secs, MAX_SLOTS)
    }

    /// [`Registry::intern_within`] under CAS.
    pub(crate) fn intern_within(
        &self,
        names: &[&str],
        now: u32,
        retire_secs: u32,
        limit: usize,
    ) -> Result<(Vec<Option<u16>>, Registry), StoreError> {
        let mut result = (Vec::new(), Registry::default());
        cas_update(self.store, self.key, MAX_ATTEMPTS, |cur| {
            let mut reg = Registry::decode(cur.unwrap_or(&[]));
            let (slots, changed) = reg.intern_within(names, now, retire_secs, limit);
            let bytes = changed.then(|| reg.encode());
            result = (slots, reg);
            bytes
        })?;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_name_keeps_its_slot_whatever_order_it_is_interned_in() {
        let store = MemStore::new();
        let reg = NameRegistry::pods(&store);
        let (a, _) = reg
            .intern(&["10.0.0.2:80", "10.0.0.1:80"], 100, 1000)
            .unwrap();
        // A config update that adds a pod sorting first shifts nothing.
        let (b, _) = reg
            .intern(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"], 101, 1000)
            .unwrap();
        assert_eq!(a, vec![Some(0), Some(1)]);
        assert_eq!(b, vec![Some(2), Some(1), Some(0)]);
    }

    #[test]
    fn a_slot_is_reused_only_when_full_and_retired() {
        let mut reg = Registry::default();
        let names: Vec<String> = (0..MAX_SLOTS).map(|i| format!("pod-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (slots, _) = reg.intern(&refs, 1000, 500);
        assert!(slots.iter().all(Option::is_some));
        // Full, nobody retired yet: no slot.
        let (s, changed) = reg.intern(&["newcomer"], 1400, 500);
        assert_eq!((s, changed), (vec![None], false));
        // pod-0..1023 stay members except pod-7, which left at 1000.
        let keep: Vec<&str> = refs.iter().copied().filter(|n| *n != "pod-7").collect();
        reg.intern(&keep, 1450, 500);
        let (s, _) = reg.intern(&["newcomer"], 1501, 500);
        assert_eq!(s, vec![Some(7)]);
        assert_eq!(reg.name_of(7), Some("newcomer"));
        assert_eq!(reg.slot_of("pod-7"), None);
    }

    #[test]
    fn untrusted_names_never_take_the_last_slots() {
        let store = MemStore::new();
        let reg = NameRegistry::models(&store);
        let junk: Vec<String> = (0..MAX_SLOTS).map(|i| format!("junk-{i}")).collect();
        let refs: Vec<&str> = junk.iter().map(String::as_str).collect();
        let (slots, r) = reg.intern_within(&refs, 10, 100, MAX_SLOTS / 2).unwrap();
        assert_eq!(slots.iter().flatten().count(), MAX_SLOTS / 2);
        assert_eq!(r.slots.iter().flatten().count(), MAX_SLOTS / 2);
        // A name a request brings still gets one.
        assert!(reg.intern(&["llama"], 11, 100).unwrap().0[0].is_some());
    }

    #[test]
    fn a_retired_untrusted_name_coming_back_counts_against_the_limit() {
        // Found by tests/fuzz.rs (prefixcache): remote-only models held 513
        // live slots of a limit of 512.
        let names = |p: &str| -> Vec<String> { (0..4).map(|i| format!("{p}-{i}")).collect() };
        let (old, new) = (names("old"), names("new"));
        let old: Vec<&str> = old.iter().map(String::as_str).collect();
        let new: Vec<&str> = new.iter().map(String::as_str).collect();
        let mut reg = Registry::default();
        reg.intern_within(&old, 1000, 100, 4);
        // Long after `old` retired, `new` takes the limit (slots are free).
        let (slots, _) = reg.intern_within(&new, 2000, 100, 4);
        assert!(slots.iter().all(Option::is_some));
        // `old` comes back: the limit holds.
        let (slots, _) = reg.intern_within(&old, 2001, 100, 4);
        assert_eq!(slots, vec![None; 4]);
        let live = reg
            .slots
            .iter()
            .flatten()
            .filter(|s| 2001 - s.last_seen <= 100)
            .count();
        assert_eq!(live, 4);
        // Within the limit a retired name comes back to its own slot, and
        // a trusted caller is not held to it.
        let (slots, _) = reg.intern_within(&old[..1], 2200, 100, 4);
        assert_eq!(slots, vec![Some(0)]);
        assert!(reg
            .intern(&old[1..], 2201, 100)
            .0
            .iter()
            .all(Option::is_some));
    }

    #[test]
    fn a_flood_of_client_names_fills_only_the_clients_share() {
        let store = MemStore::new();
        let reg = NameRegistry::models(&store);
        let flood: Vec<String> = (0..2 * MAX_SLOTS).map(|i| format!("flood-{i}")).collect();
        for (i, name) in flood.iter().enumerate() {
            let (ids, _) = reg.intern_within(&[name], 10, 100, CLIENT_SLOTS).unwrap();
            assert_eq!(ids[0].is_some(), i < CLIENT_SLOTS, "{name}");
        }
        // Names only Redis brings get no slot past their own share either.
        let (ids, _) = reg
            .intern_within(&["remote"], 11, 100, REMOTE_SLOTS)
            .unwrap();
        assert_eq!(ids, vec![None]);
        // Every model a configuration may name still gets one.
        let configured: Vec<String> = (0..MAX_MODEL_POOLS).map(|i| format!("pool-{i}")).collect();
        let refs: Vec<&str> = configured.iter().map(String::as_str).collect();
        let (ids, r) = reg.intern(&refs, 12, 100).unwrap();
        assert!(ids.iter().all(Option::is_some), "{ids:?}");
        assert_eq!(r.slots.iter().flatten().count(), MAX_SLOTS);
        // The flood's names are reclaimed once retired: a new client name
        // gets one of their slots.
        let (ids, _) = reg
            .intern_within(&["later"], 10 + 101, 100, CLIENT_SLOTS)
            .unwrap();
        assert!(ids[0].is_some_and(|id| reg.load().unwrap().name_of(id) == Some("later")));
    }

    #[test]
    fn local_ids_lie_above_every_slot_and_are_the_same_in_every_vm() {
        let names: Vec<String> = (0..10_000).map(|i| format!("model-{i}")).collect();
        let ids: std::collections::BTreeSet<u16> =
            names.iter().map(|n| local_model_id(n)).collect();
        assert!(ids.iter().all(|&id| usize::from(id) >= MAX_SLOTS));
        // A hash: distinct names rarely share an id.
        assert!(ids.len() > 9_000, "{}", ids.len());
        assert_eq!(local_model_id("llama"), local_model_id("llama"));
        assert_eq!(local_model_id(""), local_model_id(""));
    }

    #[test]
    fn last_seen_is_rewritten_at_most_every_minute() {
        let mut reg = Registry::default();
        reg.intern(&["a"], 1000, 10);
        assert!(!reg.intern(&["a"], 1000 + SEEN_EVERY_SECS - 1, 10).1);
        assert!(reg.intern(&["a"], 1000 + SEEN_EVERY_SECS, 10).1);
    }

    #[test]
    fn decode_survives_any_bytes_and_round_trips() {
        let mut reg = Registry::default();
        reg.intern(&["a:1", "pod-b", ""], 5, 10);
        assert_eq!(Registry::decode(&reg.encode()), reg);
        assert_eq!(reg.bound(), 2);
        for junk in [&b""[..], b"\x01", b"\0\0\0\0\xff", b"\0\0\0\0\x02\xff\xfe"] {
            let r = Registry::decode(junk);
            assert!(r.slots.iter().flatten().all(|s| !s.name.is_empty()));
        }
    }
}
