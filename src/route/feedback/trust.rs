//! Each pod's trust horizon, learned from what its answers said of old
//! matches (see the parent module), and the counts behind it shared between
//! a replica's worker VMs (`feedback/trust`) and, with sync, between replicas
//! (their `podload` reports, summed into `feedback/remote`).

use crate::shared::registry::{PodSlot, MAX_SLOTS};
use crate::shared::store::{cas_update, SharedStore, StoreError};

/// Ages told apart, in whole seconds (0 to 14; the last counts 15 and more).
const AGES: usize = 16;
/// The shortest horizon learned. Access times are whole seconds, so an age
/// of 1 is anything from a few ms to 2 s; and a shortfall at age 0 or 1 is
/// mostly a prefill still running when the request came, not an eviction.
pub(crate) const MIN_HORIZON_SECS: u32 = 2;
/// Fewest evictions at or past an age before it can be a pod's horizon.
pub(crate) const MIN_EVICTIONS: u32 = 3;
/// A pod's counts halve when its observations reach this, so the horizon
/// follows the pod's recent traffic.
pub(crate) const TRUST_WINDOW: u32 = 64;

/// What the answers said of one pod's matches, by age.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Ages {
    /// A hash of the name of the pod these counts are of (0: not bound).
    owner: u64,
    held: [u16; AGES],
    evicted: [u16; AGES],
    total: u32,
}

impl Ages {
    fn bound(owner: u64) -> Self {
        Self {
            owner,
            ..Self::default()
        }
    }

    /// Adds one answer at `age` (raw: nothing halves).
    fn count(&mut self, age: usize, evicted: bool) {
        let counts = if evicted {
            &mut self.evicted
        } else {
            &mut self.held
        };
        let age = age.min(AGES - 1);
        counts[age] = counts[age].saturating_add(1);
        self.total = self.total.saturating_add(1);
    }

    /// Adds counts by age (another VM's or replica's, of the same pod; raw:
    /// nothing halves).
    fn absorb(&mut self, held: &[u16], evicted: &[u16]) {
        for (mine, theirs) in [(&mut self.held, held), (&mut self.evicted, evicted)] {
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m = m.saturating_add(*t);
            }
        }
        self.total = self.sum();
    }

    /// Adds one answer at `age`, then [`Ages::halve_past_window`].
    fn add(&mut self, age: usize, evicted: bool) {
        self.count(age, evicted);
        self.halve_past_window();
    }

    /// Adds `other`'s counts (another VM's, of the same pod), then
    /// [`Ages::halve_past_window`].
    fn merge(&mut self, other: &Ages) {
        self.absorb(&other.held, &other.evicted);
        self.halve_past_window();
    }

    /// Halves every count while the total is [`TRUST_WINDOW`] or more, so
    /// the horizon follows the pod's recent answers.
    fn halve_past_window(&mut self) {
        self.total = self.sum();
        while self.total >= TRUST_WINDOW {
            self.held
                .iter_mut()
                .chain(self.evicted.iter_mut())
                .for_each(|n| *n /= 2);
            self.total = self.sum();
        }
    }

    fn sum(&self) -> u32 {
        self.held
            .iter()
            .chain(&self.evicted)
            .map(|&n| u32::from(n))
            .sum()
    }
}

/// Shared-data key of the counts every worker VM merged (see
/// [`TrustLearner::share`]).
pub(crate) const SHARED_KEY: &str = "feedback/trust";
/// Shared-data key of the other Envoy replicas' counts, summed by the sync
/// singleton from their `podload` reports (the same encoding).
pub(crate) const REMOTE_KEY: &str = "feedback/remote";
/// Most pods whose counts a replica reports through Redis (those with the
/// most answers), so a report stays small.
pub(crate) const MAX_REPORTED_PODS: usize = 128;
/// Counts per pod in a report: held by age, then evicted by age.
pub(crate) const REPORTED_COUNTS: usize = 2 * AGES;
/// Tries of one merge under CAS before it waits for the next tick.
const MERGE_ATTEMPTS: u32 = 3;
/// Version byte of the shared value.
const SHARED_VERSION: u8 = 1;
/// Bytes per pod in the shared value: slot (u16), owner (u64), then the
/// held and evicted counts (u16 each), little endian.
const ENTRY_BYTES: usize = 2 + 8 + 4 * AGES;

/// Per pod slot: how old its matches were when its answers showed them held
/// or evicted, and from which age they are not to be trusted. Bounded:
/// [`MAX_SLOTS`] pods of 80 bytes, three times (the view, this VM's counts
/// not yet shared, and the other replicas').
///
/// Every worker VM of the Envoy learns from the answers it sees, and on its
/// tick merges them into one shared-data value, [`SHARED_KEY`]
/// ([`TrustLearner::share`]): with `N` workers, each VM would otherwise see
/// `1/N` of the answers, learn `N` times slower and report its own horizon.
#[derive(Debug, Default)]
pub(crate) struct TrustLearner {
    /// What [`TrustLearner::horizon`] reads: every VM's counts as last
    /// read, plus this VM's since.
    pods: Vec<Ages>,
    /// This VM's counts not yet merged into the shared value.
    pending: Vec<Ages>,
    /// The other replicas' counts (with sync), as last read.
    remote: Vec<Ages>,
}

fn owner_of(name: &str) -> u64 {
    // 0 means "not bound". XXH64 is the same in every VM and build.
    xxhash_rust::xxh64::xxh64(name.as_bytes(), 0).max(1)
}

impl TrustLearner {
    /// Binds `pod`'s slot to the member named `name`: when another pod
    /// held the slot before (a retired name's slot given to a new pod), its
    /// counts are dropped.
    pub(crate) fn bind(&mut self, pod: PodSlot, name: &str) {
        let i = pod.index();
        if i >= MAX_SLOTS {
            return;
        }
        let owner = owner_of(name);
        for v in [&mut self.pods, &mut self.pending] {
            if v.len() <= i {
                v.resize(i + 1, Ages::default());
            }
            if v[i].owner != owner {
                v[i] = Ages::bound(owner);
            }
        }
    }

    /// Counts one answer of `pod` to a match `age_secs` old: `evicted` when
    /// the pod cached clearly less than predicted.
    pub(crate) fn observe(&mut self, pod: PodSlot, age_secs: u32, evicted: bool) {
        let i = pod.index();
        if i >= MAX_SLOTS {
            return;
        }
        let age = age_secs as usize;
        for v in [&mut self.pods, &mut self.pending] {
            if v.len() <= i {
                v.resize(i + 1, Ages::default());
            }
        }
        self.pods[i].add(age, evicted);
        // Raw counts: the merge halves.
        self.pending[i].count(age, evicted);
    }

    /// The tick's exchange with the other worker VMs: merges this VM's
    /// counts since the last merge into [`SHARED_KEY`] (one get and one
    /// set under CAS, retried up to 3 times; with nothing new, one get),
    /// then learns from the merged counts. A slot the shared value holds
    /// for a pod of another name than this VM binds there is not read,
    /// and is replaced by the next merge of counts for that slot. An unreadable value is read as
    /// empty (the next merge replaces it). On an error or a lost race
    /// this VM's counts wait for the next tick, and its view is unchanged.
    ///
    /// With `remote` (sync on), it also reads the other replicas' counts
    /// ([`REMOTE_KEY`], one more get), which the horizon adds to these.
    pub(crate) fn share<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        remote: bool,
    ) -> Result<(), StoreError> {
        if remote {
            let (value, _) = store.get(REMOTE_KEY)?;
            let mut others = decode_shared(value.as_deref().unwrap_or_default());
            for (i, o) in others.iter_mut().enumerate() {
                let bound = self.pods.get(i).map_or(0, |p| p.owner);
                if bound != 0 && o.owner != bound {
                    *o = Ages::default();
                }
            }
            self.remote = others;
        }
        let shared = if self.pending.iter().any(|p| p.total > 0) {
            let pending = &self.pending;
            let mut merged = Vec::new();
            cas_update(store, SHARED_KEY, MERGE_ATTEMPTS, |current| {
                merged = decode_shared(current.unwrap_or_default());
                for (i, p) in pending.iter().enumerate().filter(|(_, p)| p.total > 0) {
                    if merged.len() <= i {
                        merged.resize(i + 1, Ages::default());
                    }
                    if merged[i].owner != p.owner {
                        merged[i] = Ages::bound(p.owner);
                    }
                    merged[i].merge(p);
                }
                Some(encode_shared(&merged))
            })?;
            for p in &mut self.pending {
                *p = Ages::bound(p.owner);
            }
            merged
        } else {
            let (value, _) = store.get(SHARED_KEY)?;
            decode_shared(value.as_deref().unwrap_or_default())
        };
        let len = self.pods.len().max(shared.len());
        self.pods.resize(len, Ages::default());
        for (i, view) in self.pods.iter_mut().enumerate() {
            let from = shared.get(i).copied().unwrap_or_default();
            *view = if view.owner == 0 || from.owner == view.owner {
                from
            } else {
                Ages::bound(view.owner)
            };
        }
        Ok(())
    }

    /// `pod`'s trust horizon: the age, from [`MIN_HORIZON_SECS`], that
    /// best splits its answers into held (younger) and evicted (at or
    /// past it): fewest holds at or past it plus evictions younger than
    /// it, ties to the older age. None when trusting every match splits
    /// them as well, or fewer than [`MIN_EVICTIONS`] evictions lie past
    /// the split (every match is trusted).
    pub(crate) fn horizon(&self, pod: PodSlot) -> Option<u32> {
        let own = self.pods.get(pod.index());
        let other = self.remote.get(pod.index());
        let p = match (own, other) {
            (None, None) => return None,
            (Some(p), None) | (None, Some(p)) => *p,
            (Some(a), Some(b)) => {
                let mut sum = *a;
                sum.absorb(&b.held, &b.evicted);
                sum
            }
        };
        let from = MIN_HORIZON_SECS as usize;
        // Trusting every match: every eviction from `from` on is a miss.
        let evictions: u32 = p.evicted[from..].iter().map(|&n| u32::from(n)).sum();
        let (mut best, mut best_cost) = (None, evictions);
        // Holds at or past `age`, evictions at or past it.
        let (mut held_past, mut evicted_past) = (0u32, 0u32);
        for age in (from..AGES).rev() {
            held_past += u32::from(p.held[age]);
            evicted_past += u32::from(p.evicted[age]);
            let cost = held_past + (evictions - evicted_past);
            if evicted_past >= MIN_EVICTIONS && cost < best_cost {
                best = Some(age as u32);
                best_cost = cost;
            }
        }
        best
    }
}

/// The shared value: [`SHARED_VERSION`], then [`ENTRY_BYTES`] per pod with
/// counts, in slot order.
fn encode_shared(pods: &[Ages]) -> Vec<u8> {
    let used = pods.iter().filter(|p| p.total > 0).count();
    let mut out = Vec::with_capacity(1 + used * ENTRY_BYTES);
    out.push(SHARED_VERSION);
    for (i, p) in pods.iter().enumerate().filter(|(_, p)| p.total > 0) {
        // Slots are below MAX_SLOTS (1024).
        out.extend_from_slice(&(i as u16).to_le_bytes());
        out.extend_from_slice(&p.owner.to_le_bytes());
        for n in p.held.iter().chain(&p.evicted) {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    out
}

/// Reads [`encode_shared`]'s value; anything else (another version, a
/// torn length) reads as no counts at all, and entries past
/// [`MAX_SLOTS`] are skipped.
fn decode_shared(bytes: &[u8]) -> Vec<Ages> {
    let mut pods = Vec::new();
    let Some((&SHARED_VERSION, rest)) = bytes.split_first() else {
        return pods;
    };
    if rest.len() % ENTRY_BYTES != 0 {
        return pods;
    }
    for e in rest.chunks_exact(ENTRY_BYTES) {
        let u16_at = |at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
        let slot = usize::from(u16_at(0));
        if slot >= MAX_SLOTS {
            continue;
        }
        let mut owner = [0u8; 8];
        owner.copy_from_slice(&e[2..10]);
        let mut p = Ages::bound(u64::from_le_bytes(owner));
        for age in 0..AGES {
            p.held[age] = u16_at(10 + 2 * age);
            p.evicted[age] = u16_at(10 + 2 * (AGES + age));
        }
        p.total = p.sum();
        if pods.len() <= slot {
            pods.resize(slot + 1, Ages::default());
        }
        pods[slot] = p;
    }
    pods
}

/// The counts a value of [`SHARED_KEY`] or [`REMOTE_KEY`] holds: (slot,
/// held then evicted by age), for tests.
#[cfg(test)]
pub(crate) fn decoded_counts(bytes: &[u8]) -> Vec<(usize, Vec<u16>)> {
    decode_shared(bytes)
        .iter()
        .enumerate()
        .filter(|(_, p)| p.total > 0)
        .map(|(i, p)| (i, p.held.iter().chain(&p.evicted).copied().collect()))
        .collect()
}

/// This replica's counts by pod name, for its `podload` report: the pods
/// named in `names` (slot, name) whose slot in [`SHARED_KEY`] holds counts
/// of that name, at most [`MAX_REPORTED_PODS`] (those with the most
/// answers), each as [`REPORTED_COUNTS`] counts.
pub(crate) fn reported_counts<'a, S: SharedStore + ?Sized>(
    store: &S,
    names: impl Iterator<Item = (PodSlot, &'a str)>,
) -> Vec<(String, Vec<u16>)> {
    let Ok((Some(bytes), _)) = store.get(SHARED_KEY) else {
        return Vec::new();
    };
    let pods = decode_shared(&bytes);
    let mut out: Vec<(u32, String, Vec<u16>)> = names
        .filter_map(|(slot, name)| {
            let p = pods.get(slot.index())?;
            (p.total > 0 && p.owner == owner_of(name)).then(|| {
                let counts = p.held.iter().chain(&p.evicted).copied().collect();
                (p.total, name.to_string(), counts)
            })
        })
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.0));
    out.truncate(MAX_REPORTED_PODS);
    out.into_iter().map(|(_, n, c)| (n, c)).collect()
}

/// Sums the other replicas' reported counts (slot, pod name, counts; a
/// report of another length than [`REPORTED_COUNTS`] is skipped) and
/// publishes them as [`REMOTE_KEY`] for the workers.
pub(crate) fn publish_remote<'a, S: SharedStore + ?Sized>(
    store: &S,
    reports: impl Iterator<Item = (PodSlot, &'a str, &'a [u16])>,
) -> Result<(), StoreError> {
    let mut pods: Vec<Ages> = Vec::new();
    for (slot, name, counts) in reports {
        let i = slot.index();
        if i >= MAX_SLOTS || counts.len() != REPORTED_COUNTS {
            continue;
        }
        if pods.len() <= i {
            pods.resize(i + 1, Ages::default());
        }
        let p = &mut pods[i];
        p.owner = owner_of(name);
        let (held, evicted) = counts.split_at(AGES);
        p.absorb(held, evicted);
    }
    store.set(REMOTE_KEY, &encode_shared(&pods), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::MemStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_pod_that_evicts_old_matches_gets_a_horizon() {
        let pod = PodSlot::new(2);
        let mut t = TrustLearner::default();
        assert_eq!(t.horizon(pod), None, "nothing seen: every match trusted");
        // Young matches hold, old ones were evicted.
        for _ in 0..10 {
            t.observe(pod, 0, false);
            t.observe(pod, 1, false);
            t.observe(pod, 2, false);
        }
        for _ in 0..2 {
            t.observe(pod, 4, true);
        }
        assert_eq!(t.horizon(pod), None, "two evictions are not evidence");
        t.observe(pod, 5, true);
        assert_eq!(t.horizon(pod), Some(4), "held up to 2 s, evicted from 4 s");
        // Enough evictions at 2 s outweigh the holds there.
        for _ in 0..12 {
            t.observe(pod, 2, true);
        }
        assert_eq!(t.horizon(pod), Some(2));
        // Other pods learned nothing.
        assert_eq!(t.horizon(PodSlot::new(1)), None);
        assert_eq!(t.horizon(PodSlot::new(7)), None);
    }

    #[test]
    fn young_shortfalls_and_a_pod_that_keeps_its_prefixes_give_no_horizon() {
        let pod = PodSlot::new(0);
        let mut t = TrustLearner::default();
        // Shortfalls at age 0-1 are prefills still running: no horizon.
        for _ in 0..20 {
            t.observe(pod, 0, true);
            t.observe(pod, 1, true);
        }
        assert_eq!(t.horizon(pod), None);
        // Old matches that hold outweigh a few old evictions.
        let mut t = TrustLearner::default();
        for age in 2..40 {
            t.observe(pod, age, false);
        }
        for _ in 0..5 {
            t.observe(pod, 20, true);
        }
        assert_eq!(t.horizon(pod), None);
        // Slots past the bound are not counted.
        t.observe(PodSlot::new(MAX_SLOTS as u16), 9, true);
        assert_eq!(t.horizon(PodSlot::new(MAX_SLOTS as u16)), None);
    }

    #[test]
    fn the_horizon_follows_recent_answers() {
        let pod = PodSlot::new(1);
        let mut t = TrustLearner::default();
        for _ in 0..40 {
            t.observe(pod, 3, true);
        }
        assert_eq!(t.horizon(pod), Some(3));
        // The pod got a bigger cache (or less traffic): old matches hold now.
        for _ in 0..200 {
            t.observe(pod, 3, false);
            t.observe(pod, 8, false);
        }
        assert_eq!(t.horizon(pod), None, "old evictions halved away");
        let p = &t.pods[1];
        assert!(p.total < TRUST_WINDOW, "{}", p.total);
    }

    #[test]
    fn a_slot_given_to_another_pod_starts_afresh() {
        let pod = PodSlot::new(3);
        let mut t = TrustLearner::default();
        t.bind(pod, "pod-a");
        for _ in 0..3 {
            t.observe(pod, 4, true);
        }
        assert_eq!(t.horizon(pod), Some(4));
        // The same member again (every refresh): kept.
        t.bind(pod, "pod-a");
        assert_eq!(t.horizon(pod), Some(4));
        // Its slot now names another pod: nothing is known of it.
        t.bind(pod, "pod-b");
        assert_eq!(t.horizon(pod), None);
    }

    /// Two worker VMs of one Envoy, both bound to the same members.
    fn two_vms() -> (TrustLearner, TrustLearner, MemStore) {
        let (mut a, mut b) = (TrustLearner::default(), TrustLearner::default());
        for t in [&mut a, &mut b] {
            t.bind(PodSlot::new(0), "pod-a");
            t.bind(PodSlot::new(2), "pod-c");
        }
        (a, b, MemStore::new())
    }

    #[test]
    fn worker_vms_learn_from_each_others_answers() {
        let pod = PodSlot::new(2);
        let (mut a, mut b, store) = two_vms();
        // Two evictions each: neither VM alone has the three a horizon needs.
        for t in [&mut a, &mut b] {
            t.observe(pod, 4, true);
            t.observe(pod, 5, true);
            t.observe(pod, 1, false);
            assert_eq!(t.horizon(pod), None);
        }
        a.share(&store, false).unwrap();
        assert_eq!(a.horizon(pod), None, "only a's own answers are shared yet");
        b.share(&store, false).unwrap();
        assert_eq!(b.horizon(pod), Some(4), "b reads a's two and its own two");
        a.share(&store, false).unwrap();
        assert_eq!(a.horizon(pod), Some(4));
        // Nothing new: one get, no write; nothing counted twice.
        let (gets, sets) = store.op_counts();
        a.share(&store, false).unwrap();
        b.share(&store, false).unwrap();
        assert_eq!(store.op_counts(), (gets + 2, sets));
        assert_eq!(a.pods[2].total, 6);
        assert_eq!(b.pods[2], a.pods[2]);
        assert_eq!(a.horizon(PodSlot::new(0)), None, "another pod: nothing");
    }

    #[test]
    fn a_lost_race_keeps_the_counts_for_the_next_tick() {
        let pod = PodSlot::new(0);
        let (mut a, mut b, store) = two_vms();
        for _ in 0..3 {
            a.observe(pod, 3, true);
        }
        store.interfere_next(MERGE_ATTEMPTS);
        assert_eq!(a.share(&store, false), Err(StoreError::CasMismatch));
        assert_eq!(a.horizon(pod), Some(3), "its own view is kept");
        b.share(&store, false).unwrap();
        assert_eq!(b.horizon(pod), None, "nothing was written");
        a.share(&store, false).unwrap();
        b.share(&store, false).unwrap();
        assert_eq!(b.horizon(pod), Some(3));
        assert_eq!(b.pods[0].total, 3, "merged once");
    }

    #[test]
    fn shared_counts_halve_at_the_window() {
        let pod = PodSlot::new(0);
        let (mut a, mut b, store) = two_vms();
        for t in [&mut a, &mut b] {
            for _ in 0..(TRUST_WINDOW / 2) {
                t.observe(pod, 6, true);
            }
            t.share(&store, false).unwrap();
        }
        // 32 + 32 reached the window: halved to 32.
        assert_eq!(b.pods[0].total, TRUST_WINDOW / 2);
        assert_eq!(b.horizon(pod), Some(6));
    }

    #[test]
    fn counts_of_a_pod_of_another_name_are_not_read_and_are_replaced() {
        let pod = PodSlot::new(0);
        let store = MemStore::new();
        let mut old = TrustLearner::default();
        old.bind(pod, "pod-old");
        for _ in 0..3 {
            old.observe(pod, 3, true);
        }
        old.share(&store, false).unwrap();
        // A VM that knows slot 0 as another pod (the old one retired).
        let mut new = TrustLearner::default();
        new.bind(pod, "pod-new");
        new.share(&store, false).unwrap();
        assert_eq!(new.horizon(pod), None, "the old pod's counts");
        new.observe(pod, 9, false);
        new.share(&store, false).unwrap();
        // Its merge replaced them: a VM still on the old name reads nothing.
        old.share(&store, false).unwrap();
        assert_eq!(old.horizon(pod), None);
        assert_eq!(new.pods[0].total, 1);
        // A VM not bound yet takes what is shared.
        let mut fresh = TrustLearner::default();
        fresh.share(&store, false).unwrap();
        assert_eq!(fresh.pods[0].total, 1);
    }

    #[test]
    fn an_unreadable_shared_value_reads_as_nothing_and_is_replaced() {
        let pod = PodSlot::new(2);
        let (mut a, _, store) = two_vms();
        let mut valid = encode_shared(&[Ages::default(), Ages::default(), {
            let mut p = Ages::bound(owner_of("pod-c"));
            (0..5).for_each(|_| p.add(3, true));
            p
        }]);
        // A slot past MAX_SLOTS in an entry of the right size is skipped.
        let mut far = valid[1..1 + ENTRY_BYTES].to_vec();
        far[..2].copy_from_slice(&u16::MAX.to_le_bytes());
        valid.extend_from_slice(&far);
        let junk: [&[u8]; 5] = [b"", b"\x02", &valid[..valid.len() - 1], b"\x01abc", &valid];
        for bytes in junk {
            store.set(SHARED_KEY, bytes, None).unwrap();
            let mut t = TrustLearner::default();
            t.bind(pod, "pod-c");
            t.share(&store, false).unwrap();
            assert!(t.pods.len() <= MAX_SLOTS);
        }
        assert_eq!(decode_shared(&valid).len(), 3);
        store.set(SHARED_KEY, b"\x07garbage", None).unwrap();
        a.observe(pod, 3, true);
        a.share(&store, false).unwrap();
        let (v, _) = store.get(SHARED_KEY).unwrap();
        assert_eq!(decode_shared(&v.unwrap())[2].total, 1, "replaced");
    }

    #[test]
    fn a_report_names_at_most_128_pods_and_remote_counts_of_another_pod_are_not_read() {
        let store = MemStore::new();
        let mut t = TrustLearner::default();
        let names: Vec<String> = (0..130).map(|i| format!("pod-{i}")).collect();
        for (i, name) in (0u16..).zip(&names) {
            t.bind(PodSlot::new(i), name);
            // Pod i has i + 1 answers: pods 0 and 1 have the fewest.
            for _ in 0..=i.min(60) {
                t.observe(PodSlot::new(i), 3, true);
            }
        }
        t.share(&store, false).unwrap();
        let named = (0u16..)
            .zip(&names)
            .map(|(i, n)| (PodSlot::new(i), n.as_str()));
        let report = reported_counts(&store, named);
        assert_eq!(report.len(), MAX_REPORTED_PODS);
        assert!(report
            .iter()
            .all(|(n, c)| n != "pod-0" && n != "pod-1" && c.len() == 32));
        // Slot 5 renamed here: a report under its old name is not read.
        let counts = vec![4u16; REPORTED_COUNTS];
        publish_remote(
            &store,
            [(PodSlot::new(5), "pod-5", counts.as_slice())].into_iter(),
        )
        .unwrap();
        let mut renamed = TrustLearner::default();
        renamed.bind(PodSlot::new(5), "pod-new");
        renamed.share(&store, true).unwrap();
        assert_eq!(renamed.horizon(PodSlot::new(5)), None);
        let mut same = TrustLearner::default();
        same.bind(PodSlot::new(5), "pod-5");
        same.share(&store, true).unwrap();
        assert!(same.horizon(PodSlot::new(5)).is_some());
        // A report of the wrong length is skipped.
        publish_remote(
            &store,
            [(PodSlot::new(5), "pod-5", &counts[..3])].into_iter(),
        )
        .unwrap();
        let (v, _) = store.get(REMOTE_KEY).unwrap();
        assert_eq!(decoded_counts(&v.unwrap()), vec![]);
    }
}
