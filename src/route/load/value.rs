//! A worker VM's published value (`load/worker/<i>`, see [`super`]): the
//! header, then per pod slot what the VM has in flight and has sent, each
//! field for every slot in turn so that each reads as one run.

use crate::shared::registry::MAX_SLOTS;

/// A VM's counts stop counting this long after its last publish (20 ticks).
pub const VM_STALE_MS: u64 = 5_000;
/// Token, time and version before the counts.
pub(super) const HEADER: usize = 17;
/// The layout of a published value this build writes and reads.
pub(super) const VERSION: u8 = 1;
/// Bytes per pod slot in a published value.
pub(super) const SLOT_BYTES: usize = 20;

/// Per pod slot, what one VM, or several summed, has in flight and sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// Requests in flight.
    pub(super) counts: Vec<u32>,
    /// Requests sent recently.
    pub(super) sent: Vec<u32>,
    /// New prefixes placed recently.
    pub(super) placed: Vec<u32>,
    /// The sum of the send times (ms) of the requests in flight.
    pub(super) sent_ms: Vec<u64>,
}

impl Tally {
    /// Slots with anything recorded.
    pub(super) fn len(&self) -> usize {
        self.counts
            .len()
            .max(self.sent.len())
            .max(self.placed.len())
            .max(self.sent_ms.len())
    }
}

/// One VM's published value, read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Published<'a> {
    pub(super) token: u64,
    pub(super) at_ms: u64,
    /// The per-slot part (empty for a value of another version): each
    /// field for every slot in turn, so that each reads as one run.
    pub(super) slots: &'a [u8],
}

impl<'a> Published<'a> {
    /// The value a VM with `token` writes at `at_ms` for its `tally`:
    /// after the header, `n` counts (`u32`), then `n` sent counts (`u32`),
    /// `n` placed counts (`u32`) and `n` send-time sums (`u64`).
    pub(super) fn encode(token: u64, at_ms: u64, tally: &Tally) -> Vec<u8> {
        let n = tally.len().min(MAX_SLOTS);
        let mut out = Vec::with_capacity(HEADER + SLOT_BYTES * n);
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&at_ms.to_le_bytes());
        out.push(VERSION);
        for field in [&tally.counts, &tally.sent, &tally.placed] {
            let have = field.len().min(n);
            out.extend(field[..have].iter().flat_map(|c| c.to_le_bytes()));
            out.resize(out.len() + 4 * (n - have), 0);
        }
        let have = tally.sent_ms.len().min(n);
        out.extend(tally.sent_ms[..have].iter().flat_map(|c| c.to_le_bytes()));
        out.resize(out.len() + 8 * (n - have), 0);
        out
    }

    /// None for an empty or malformed header; nothing counted for a value
    /// of another version, or whose per-slot part is not whole slots of at
    /// most [`MAX_SLOTS`] (each field's place depends on their number).
    pub(super) fn decode(bytes: &'a [u8]) -> Option<Published<'a>> {
        let token = u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
        let at_ms = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        let version = *bytes.get(16)?;
        let slots = &bytes[HEADER..];
        let whole = slots.len() % SLOT_BYTES == 0 && slots.len() / SLOT_BYTES <= MAX_SLOTS;
        Some(Published {
            token,
            at_ms,
            slots: if version == VERSION && whole {
                slots
            } else {
                &[]
            },
        })
    }

    /// Adds what this value counts into `tally`, slot by slot.
    pub(super) fn add_to(&self, tally: &mut Tally) {
        let n = self.slots.len() / SLOT_BYTES;
        let (counts, rest) = self.slots.split_at(4 * n);
        let (sent, rest) = rest.split_at(4 * n);
        let (placed, sent_ms) = rest.split_at(4 * n);
        add_u32s(&mut tally.counts, counts);
        add_u32s(&mut tally.sent, sent);
        add_u32s(&mut tally.placed, placed);
        grow(&mut tally.sent_ms, n);
        for (t, c) in tally.sent_ms.iter_mut().zip(sent_ms.chunks_exact(8)) {
            let mut v = [0; 8];
            v.copy_from_slice(c);
            *t = t.saturating_add(u64::from_le_bytes(v));
        }
    }

    /// This value's tally.
    #[cfg(test)]
    pub(super) fn tally(&self) -> Tally {
        let mut tally = Tally::default();
        self.add_to(&mut tally);
        tally
    }

    pub(super) fn live(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) <= VM_STALE_MS
    }
}

/// Adds the little-endian `u32`s of `bytes` into `total`, slot by slot.
pub(super) fn add_u32s(total: &mut Vec<u32>, bytes: &[u8]) {
    grow(total, bytes.len() / 4);
    for (t, c) in total.iter_mut().zip(bytes.chunks_exact(4)) {
        *t = t.saturating_add(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    }
}

/// Grows `v` to at least `n` slots.
fn grow<T: Clone + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}
