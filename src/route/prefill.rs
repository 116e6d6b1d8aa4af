//! How fast each pod prefills, timed by this VM ([`PrefillTiming`]): from
//! routing a streamed request with a long prompt new to its pod to its
//! answer's first bytes, per block. What it adds to the load-aware
//! slowness: a pod 3x slower than the others reads slow after its first
//! such prefill, and, while that prefill is still open, as soon as it is
//! overdue, long before the pod has made the tokens its reported
//! token latency needs (see [`crate::route::router`]'s `slowness`).

use crate::route::policy::SLOW_PREFILL;
use crate::shared::registry::{PodSlot, MAX_SLOTS};
use crate::shared::store::{cas_update, SharedStore, StoreError};

/// Shared-data key where the worker VMs of a replica publish the pods
/// their prefill timing reads slow (see [`PrefillTiming::share`]).
pub(crate) const SHARED_KEY: &str = "prefill/slow";
/// Version byte of [`SHARED_KEY`]'s value.
const SHARED_VERSION: u8 = 1;
/// Bytes per pod in [`SHARED_KEY`]: slot (u16), slowness (u16,
/// thousandths), until when it stands (u64 ms), little-endian.
const ENTRY_BYTES: usize = 12;
/// How long a VM's reading stands in [`SHARED_KEY`] unless it writes it
/// again (it does on its ticks while it still reads so).
const STANDS_MS: u64 = 600;
/// A VM writes its reading again once it stands less than this.
const REWRITE_BELOW_MS: u64 = 300;
/// CAS attempts per tick to merge a reading.
const MERGE_ATTEMPTS: u32 = 3;

/// Uncached blocks a prefill needs to be timed: shorter ones are mostly
/// the fixed cost of the path and the first token.
pub(crate) const MIN_BLOCKS: u32 = 32;
/// Prefills timed per pod (their lower median counts; older ones drop).
const SAMPLES: usize = 8;
/// Open prefills timed at once per VM (others go untimed).
const MAX_OPEN: usize = 64;
/// A sample older than this drops: a pod once slow is tried again.
const SAMPLE_TTL_MS: u64 = 30_000;
/// An open prefill older than this is forgotten (its stream's end was
/// missed), and bounds what one open prefill can say.
const OPEN_TTL_MS: u64 = 60_000;
/// Most slowness (thousandths) a prefill time reads as.
const MAX_SLOWNESS: u64 = 8_000;

#[derive(Debug, Clone, Copy)]
struct Open {
    stream: u32,
    pod: PodSlot,
    blocks: u32,
    start_ms: u64,
}

/// This VM's prefill timing per pod, bounded: [`SAMPLES`] per pod, at most
/// [`MAX_SLOTS`] pods, [`MAX_OPEN`] open.
///
/// A pod's prefill time is the lower median of its recent samples (µs per
/// uncached block; see `figure_of`). For a pod with no sample
/// yet, an open prefill counts as a lower bound: its time so far. Only
/// prefills sent to a pod with a free slot (as far as the router knew)
/// are timed, so that a known queue is not read as slowness; a new pod
/// that is busier than known (other replicas' requests) still reads slow
/// while its first prefill is overdue, until that one answers.
#[derive(Debug, Default)]
pub(crate) struct PrefillTiming {
    /// Per slot: (µs per block, when answered, ms), newest last.
    samples: Vec<Vec<(u64, u64)>>,
    open: Vec<Open>,
    /// Per slot, as of the last [`Self::tick`]: slowness in thousandths
    /// against the reference pod, only where at least [`SLOW_PREFILL`]
    /// (else 0); empty when none is.
    own: Vec<u32>,
    /// What the other worker VMs read, as of the last [`Self::share`]:
    /// (slot, slowness, until ms).
    others: Vec<(usize, u32, u64)>,
    /// The higher of `own` and `others` per slot.
    slow: Vec<u32>,
}

impl PrefillTiming {
    /// A prefill of `blocks` uncached blocks was sent to `pod` at
    /// `now_ms` by stream `stream`. False when it is not timed (too short,
    /// a slot out of range, or [`MAX_OPEN`] open already).
    pub(crate) fn start(&mut self, stream: u32, pod: PodSlot, blocks: u32, now_ms: u64) -> bool {
        if blocks < MIN_BLOCKS || pod.index() >= MAX_SLOTS || self.open.len() >= MAX_OPEN {
            return false;
        }
        self.open.retain(|o| o.stream != stream);
        self.open.push(Open {
            stream,
            pod,
            blocks,
            start_ms: now_ms,
        });
        true
    }

    /// Stream `stream`'s first answer bytes at `now_ms`: its prefill is
    /// done, and timed.
    pub(crate) fn answered(&mut self, stream: u32, now_ms: u64) {
        let Some(at) = self.open.iter().position(|o| o.stream == stream) else {
            return;
        };
        let o = self.open.swap_remove(at);
        let us = now_ms.saturating_sub(o.start_ms).saturating_mul(1000) / u64::from(o.blocks);
        let i = o.pod.index();
        if self.samples.len() <= i {
            self.samples.resize(i + 1, Vec::new());
        }
        let s = &mut self.samples[i];
        if s.len() >= SAMPLES {
            s.remove(0);
        }
        s.push((us, now_ms));
    }

    /// Stream `stream` ended without answer bytes: not timed.
    pub(crate) fn ended(&mut self, stream: u32) {
        self.open.retain(|o| o.stream != stream);
    }

    /// Whether a prefill is being timed (the worker then ticks fast, so
    /// that an overdue one is seen within a fast tick).
    pub(crate) fn any_open(&self) -> bool {
        !self.open.is_empty()
    }

    /// Recomputes each pod's slowness at `now_ms`: its prefill time (for a
    /// pod not timed yet, an open prefill's time so far) against the
    /// reference pod's, that is, the fastest or, from three pods timed on,
    /// the second fastest (see `reference`).
    pub(crate) fn tick(&mut self, now_ms: u64) {
        self.open
            .retain(|o| now_ms.saturating_sub(o.start_ms) < OPEN_TTL_MS);
        for s in &mut self.samples {
            s.retain(|&(_, at)| now_ms.saturating_sub(at) < SAMPLE_TTL_MS);
        }
        let figures: Vec<Option<u64>> = self.samples.iter().map(|s| figure_of(s)).collect();
        self.own.clear();
        self.read_own(&figures, now_ms);
        self.combine(now_ms);
    }

    /// `figures`: each slot's prefill time from its samples (None: none).
    fn read_own(&mut self, figures: &[Option<u64>], now_ms: u64) {
        let timed = figures.iter().flatten().copied().collect();
        let Some(reference) = reference(timed).filter(|&r| r > 0) else {
            return;
        };
        let mut figure: Vec<u64> = figures.iter().map(|f| f.unwrap_or(0)).collect();
        // An open prefill speaks only for a pod not timed yet (new, or its
        // samples aged out): one that has answered as fast as the others
        // is more likely queueing behind requests this VM does not know
        // of, and every VM and replica reading it slow at once would herd
        // the new prefixes onto the others.
        for o in &self.open {
            let i = o.pod.index();
            if figure.len() <= i {
                figure.resize(i + 1, 0);
            }
            if figures.get(i).copied().flatten().is_some() {
                continue;
            }
            let so_far =
                now_ms.saturating_sub(o.start_ms).saturating_mul(1000) / u64::from(o.blocks);
            figure[i] = figure[i].max(so_far);
        }
        let slow: Vec<u32> = figure
            .iter()
            .map(|&us| {
                let r = (us.saturating_mul(1000) / reference).min(MAX_SLOWNESS);
                if i128::from(r) >= SLOW_PREFILL {
                    r as u32
                } else {
                    0
                }
            })
            .collect();
        if slow.iter().any(|&s| s > 0) {
            self.own = slow;
        }
    }

    /// `slow` = the higher of this VM's reading and the other VMs' that
    /// still stand at `now_ms`.
    fn combine(&mut self, now_ms: u64) {
        self.slow.clone_from(&self.own);
        for &(slot, s, until) in &self.others {
            if until <= now_ms {
                continue;
            }
            if self.slow.len() <= slot {
                self.slow.resize(slot + 1, 0);
            }
            self.slow[slot] = self.slow[slot].max(s);
        }
        if self.slow.iter().all(|&s| s == 0) {
            self.slow.clear();
        }
    }

    /// The tick's exchange with the replica's other worker VMs (call only
    /// while there are any): reads [`SHARED_KEY`] (one get) and, while this
    /// VM reads a pod slow that the value does not already say for at
    /// least [`REWRITE_BELOW_MS`] more, merges its reading in (one set
    /// under CAS, up to 3 tries; a lost race waits for the next tick). A
    /// reading stands [`STANDS_MS`] from its last write. An unreadable
    /// value reads as empty.
    pub(crate) fn share<S: SharedStore + ?Sized>(
        &mut self,
        store: &S,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mine: Vec<(usize, u32)> = self
            .own
            .iter()
            .enumerate()
            .filter(|&(_, &s)| s > 0)
            .map(|(i, &s)| (i, s))
            .collect();
        let (value, _) = store.get(SHARED_KEY)?;
        let mut current = decode_shared(value.as_deref().unwrap_or_default(), now_ms);
        let stale = |current: &[(usize, u32, u64)], &(slot, s): &(usize, u32)| {
            !current.iter().any(|&(c, cs, until)| {
                c == slot && cs >= s && until >= now_ms.saturating_add(REWRITE_BELOW_MS)
            })
        };
        if mine.iter().any(|m| stale(&current, m)) {
            cas_update(store, SHARED_KEY, MERGE_ATTEMPTS, |value| {
                current = decode_shared(value.unwrap_or_default(), now_ms);
                for &(slot, s) in &mine {
                    current.retain(|&(c, cs, until)| c != slot || (cs > s && until > now_ms));
                    if !current.iter().any(|&(c, _, _)| c == slot) {
                        current.push((slot, s, now_ms.saturating_add(STANDS_MS)));
                    }
                }
                Some(encode_shared(&current))
            })?;
        }
        self.others = current;
        self.combine(now_ms);
        Ok(())
    }

    /// How long `pod` takes per uncached block (µs), by this VM's timing:
    /// its own figure, else the reference pod's (see `reference`), a
    /// lower bound for a pod not timed yet. None before any prefill was
    /// timed. Samples older than [`SAMPLE_TTL_MS`] drop at the tick.
    pub(crate) fn us_per_block(&self, pod: PodSlot) -> Option<u64> {
        if let Some(us) = self.samples.get(pod.index()).and_then(|s| figure_of(s)) {
            return Some(us);
        }
        reference(self.samples.iter().filter_map(|s| figure_of(s)).collect())
    }

    /// Whether any pod has a prefill time ([`Self::us_per_block`] is Some).
    pub(crate) fn timed_any(&self) -> bool {
        self.samples.iter().any(|s| !s.is_empty())
    }

    /// Per slot, as of the last tick: how much slower than the reference
    /// pod this pod prefills (thousandths), where at least
    /// [`SLOW_PREFILL`]; 0 (or missing) elsewhere.
    pub(crate) fn slowness(&self) -> &[u32] {
        &self.slow
    }
}

/// A pod's prefill time from its samples: their lower median. Queueing
/// only adds time, and a prompt the pod held though the table did not
/// know it answers at once; the median leaves out a few of either.
fn figure_of(samples: &[(u64, u64)]) -> Option<u64> {
    let mut us: Vec<u64> = samples.iter().map(|&(us, _)| us).collect();
    if us.is_empty() {
        return None;
    }
    let mid = (us.len() - 1) / 2;
    Some(*us.select_nth_unstable(mid).1)
}

/// [`SHARED_KEY`]'s value: the version, then an entry per slot.
fn encode_shared(entries: &[(usize, u32, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + entries.len() * ENTRY_BYTES);
    out.push(SHARED_VERSION);
    for &(slot, s, until) in entries {
        let (Ok(slot), Ok(s)) = (u16::try_from(slot), u16::try_from(s)) else {
            continue;
        };
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&until.to_le_bytes());
    }
    out
}

/// The entries of a [`SHARED_KEY`] value that still stand at `now_ms`
/// (one per slot, slots below [`MAX_SLOTS`], slowness at most
/// [`MAX_SLOWNESS`], standing at most [`STANDS_MS`] more); another
/// version or a torn length reads as empty.
fn decode_shared(bytes: &[u8], now_ms: u64) -> Vec<(usize, u32, u64)> {
    let mut out: Vec<(usize, u32, u64)> = Vec::new();
    let Some((&SHARED_VERSION, rest)) = bytes.split_first() else {
        return out;
    };
    if rest.len() % ENTRY_BYTES != 0 || rest.len() / ENTRY_BYTES > MAX_SLOTS {
        return out;
    }
    for e in rest.chunks_exact(ENTRY_BYTES) {
        let slot = usize::from(u16::from_le_bytes([e[0], e[1]]));
        let s = u32::from(u16::from_le_bytes([e[2], e[3]])).min(MAX_SLOWNESS as u32);
        let mut until = [0u8; 8];
        until.copy_from_slice(&e[4..12]);
        // No entry stands longer than a write makes it (a clock that went
        // back, or a value not of this build).
        let until = u64::from_le_bytes(until).min(now_ms.saturating_add(STANDS_MS));
        if slot >= MAX_SLOTS || until <= now_ms || out.iter().any(|&(c, _, _)| c == slot) {
            continue;
        }
        out.push((slot, s, until));
    }
    out
}

/// The fastest figure, or from three on the second fastest (one pod that
/// read fast by chance does not make the others read slow).
fn reference(mut times: Vec<u64>) -> Option<u64> {
    let rank = usize::from(times.len() >= 3);
    (rank < times.len()).then(|| *times.select_nth_unstable(rank).1)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn p(n: u16) -> PodSlot {
        PodSlot::new(n)
    }

    /// One prefill of 100 blocks on `pod` from `at` taking `ms`.
    fn timed(t: &mut PrefillTiming, stream: u32, pod: u16, at: u64, ms: u64) {
        assert!(t.start(stream, p(pod), 100, at));
        t.answered(stream, at + ms);
    }

    #[test]
    fn a_pods_time_per_block_is_its_own_else_the_reference_pods() {
        let mut t = PrefillTiming::default();
        assert_eq!(t.us_per_block(p(0)), None, "nothing timed");
        assert!(!t.timed_any());
        timed(&mut t, 1, 0, 0, 200);
        assert!(t.timed_any());
        timed(&mut t, 2, 1, 0, 600);
        assert_eq!(t.us_per_block(p(0)), Some(2_000));
        assert_eq!(t.us_per_block(p(1)), Some(6_000));
        // Not timed: the fastest of two timed pods.
        assert_eq!(t.us_per_block(p(3)), Some(2_000));
        assert_eq!(t.us_per_block(p(999)), Some(2_000));
    }

    #[test]
    fn a_pod_three_times_slower_reads_slow_once_timed() {
        let mut t = PrefillTiming::default();
        timed(&mut t, 1, 0, 0, 200);
        t.tick(300);
        assert!(t.slowness().is_empty(), "one pod timed: no reference");
        timed(&mut t, 2, 1, 0, 210);
        timed(&mut t, 3, 2, 0, 600);
        t.tick(700);
        // Reference: the second fastest of three (2,100 us per block).
        assert_eq!(t.slowness(), &[0, 0, 2857]);
        // Queueing only adds time: of two samples the lower counts, and
        // from three on the lower median, so one answered at once (a
        // prompt the pod held after all) does not make the others slow.
        timed(&mut t, 4, 0, 700, 900);
        t.tick(1700);
        assert_eq!(t.slowness().first().copied().unwrap_or(0), 0);
        timed(&mut t, 5, 1, 1700, 5);
        timed(&mut t, 6, 1, 1700, 220);
        t.tick(1950);
        assert_eq!(t.slowness(), &[0, 0, 2857]);
        // Samples age out: a pod once slow is tried again.
        t.tick(40_000);
        assert!(t.slowness().is_empty());
    }

    #[test]
    fn an_overdue_prefill_reads_slow_before_it_answers() {
        let mut t = PrefillTiming::default();
        timed(&mut t, 1, 0, 0, 200);
        timed(&mut t, 2, 1, 0, 200);
        assert!(t.start(3, p(2), 100, 0));
        t.tick(250);
        assert!(t.slowness().is_empty(), "1.25x so far: within noise");
        t.tick(400);
        assert_eq!(t.slowness(), &[0, 0, 2000], "twice the reference so far");
        assert!(t.any_open());
        // Its stream ends without answering: no longer counted.
        t.ended(3);
        t.tick(500);
        assert!(t.slowness().is_empty());
        assert!(!t.any_open());
        // On a pod that has answered as fast as the others, an overdue
        // prefill is more likely queueing: it does not count.
        assert!(t.start(4, p(1), 100, 500));
        t.tick(1_500);
        assert!(t.slowness().is_empty(), "{:?}", t.slowness());
        // Once it answers, its sample is one of the pod's: of two, the
        // lower counts.
        t.answered(4, 1_500);
        t.tick(1_600);
        assert!(t.slowness().is_empty());
    }

    /// A VM that reads pod 2 slow, as in the test above.
    fn reading_pod_2_slow() -> PrefillTiming {
        let mut t = PrefillTiming::default();
        timed(&mut t, 1, 0, 0, 200);
        timed(&mut t, 2, 1, 0, 200);
        assert!(t.start(3, p(2), 100, 0));
        t.tick(400);
        assert_eq!(t.slowness(), &[0, 0, 2000]);
        t
    }

    #[test]
    fn worker_vms_share_what_their_timing_reads() {
        use crate::shared::store::MemStore;
        let store = MemStore::default();
        let mut a = reading_pod_2_slow();
        let mut b = PrefillTiming::default();
        b.share(&store, 400).unwrap();
        assert!(b.slowness().is_empty(), "nothing shared yet");
        a.share(&store, 400).unwrap();
        b.share(&store, 410).unwrap();
        assert_eq!(b.slowness(), &[0, 0, 2000], "B timed nothing itself");
        // B's own ticks keep it while it stands.
        b.tick(500);
        assert_eq!(b.slowness(), &[0, 0, 2000]);
        // A's reading stands STANDS_MS from its write; A, reading the same,
        // writes only once it stands less than REWRITE_BELOW_MS more.
        let written = store.get(SHARED_KEY).unwrap().1;
        a.share(&store, 450).unwrap();
        assert_eq!(store.get(SHARED_KEY).unwrap().1, written, "no write");
        a.tick(800);
        a.share(&store, 800).unwrap();
        assert_ne!(store.get(SHARED_KEY).unwrap().1, written, "written again");
        b.share(&store, 1_300).unwrap();
        assert_eq!(b.slowness(), &[0, 0, 4000], "A's newer, higher reading");
        // Once A's prefill ended and its reading lapsed, B reads nothing.
        a.ended(3);
        a.tick(1_400);
        a.share(&store, 1_400).unwrap();
        b.tick(1_500);
        b.share(&store, 1_500).unwrap();
        assert!(b.slowness().is_empty(), "{:?}", b.slowness());
    }

    #[test]
    fn a_lost_race_or_a_hostile_value_changes_nothing_and_never_panics() {
        use crate::shared::store::MemStore;
        let mut a = reading_pod_2_slow();
        // Values of another version, torn, too long, naming slots out of
        // range or absurd slowness.
        let mut huge = vec![SHARED_VERSION];
        huge.extend(std::iter::repeat_n(0u8, ENTRY_BYTES * (MAX_SLOTS + 1)));
        for value in [
            vec![9u8, 1, 2],
            vec![SHARED_VERSION, 1, 2, 3],
            huge,
            wild_value(),
        ] {
            let store = MemStore::default();
            store.set(SHARED_KEY, &value, None).unwrap();
            let mut b = PrefillTiming::default();
            b.share(&store, 400).unwrap();
            assert!(b.slowness().len() <= 2, "{:?}", b.slowness());
            assert!(b.slowness().iter().all(|&s| u64::from(s) <= MAX_SLOWNESS));
            // A's merge replaces what it cannot read.
            a.share(&store, 400).unwrap();
            b.share(&store, 410).unwrap();
            assert_eq!(b.slowness().get(2), Some(&2000));
        }
        // A wild entry stands no longer than a write makes it.
        let mut b = PrefillTiming::default();
        let store = MemStore::default();
        store.set(SHARED_KEY, &wild_value(), None).unwrap();
        b.share(&store, 400).unwrap();
        b.tick(400 + STANDS_MS);
        assert!(b.slowness().is_empty(), "{:?}", b.slowness());
        // Every CAS lost: the VM's view stays its own; the next tick tries
        // again.
        let mut c = reading_pod_2_slow();
        let racing = Racing::default();
        c.share(&racing, 400).unwrap_err();
        assert_eq!(c.slowness(), &[0, 0, 2000]);
    }

    /// A slot out of range, then slot 1 at an absurd slowness standing
    /// forever.
    fn wild_value() -> Vec<u8> {
        let mut wild = vec![SHARED_VERSION];
        wild.extend_from_slice(&u16::MAX.to_le_bytes());
        wild.extend_from_slice(&7u16.to_le_bytes());
        wild.extend_from_slice(&u64::MAX.to_le_bytes());
        wild.extend_from_slice(&1u16.to_le_bytes());
        wild.extend_from_slice(&u16::MAX.to_le_bytes());
        wild.extend_from_slice(&u64::MAX.to_le_bytes());
        wild
    }

    /// A store whose every CAS write loses.
    #[derive(Default)]
    struct Racing(crate::shared::store::MemStore);

    impl SharedStore for Racing {
        fn get(&self, key: &str) -> Result<crate::shared::store::Versioned, StoreError> {
            self.0.get(key)
        }
        fn set(&self, _: &str, _: &[u8], _: Option<u32>) -> Result<(), StoreError> {
            Err(StoreError::CasMismatch)
        }
    }

    #[test]
    fn timing_is_bounded() {
        let mut t = PrefillTiming::default();
        assert!(!t.start(1, p(0), MIN_BLOCKS - 1, 0), "too short");
        let out = PodSlot::new(u16::try_from(MAX_SLOTS).unwrap());
        assert!(!t.start(1, out, 100, 0));
        for s in 0..MAX_OPEN as u32 {
            assert!(t.start(s, p(0), 100, 0));
        }
        assert!(!t.start(999, p(0), 100, 0), "open list full");
        for s in 0..MAX_OPEN as u32 {
            t.answered(s, 100 + u64::from(s));
        }
        assert_eq!(t.samples[0].len(), SAMPLES);
        // An answer for a stream never timed, and the same stream twice.
        t.answered(12_345, 10);
        assert!(t.start(7, p(1), 100, 0));
        assert!(t.start(7, p(1), 100, 5));
        assert_eq!(t.open.len(), 1);
        // An open prefill whose end was missed is forgotten.
        t.tick(OPEN_TTL_MS + 5);
        assert!(!t.any_open());
        // A zero-length answer and a clock that went back read 0, not a panic.
        assert!(t.start(8, p(2), 100, 1_000));
        t.answered(8, 10);
        t.tick(u64::MAX);
    }
}
