//! The sync singleton's heartbeat in shared data, read by the workers.
//!
//! A stat that stops moving is no alarm: if the singleton's VM died, its own
//! gauges would freeze at healthy values. So the singleton only writes a
//! heartbeat (when it last ticked, last synced successfully, and started),
//! and every worker VM turns it into gauges on its own tick. The ages keep
//! growing while the singleton is dead or Redis is failing, which an
//! operator can alert on (`sync.last_success_age_s`, `sync.singleton_age_s`).

/// Shared-data key of the heartbeat (one fixed key).
pub(crate) const KEY: &str = "sync/heartbeat";
/// How often the singleton rewrites the heartbeat.
pub(crate) const WRITE_EVERY_MS: u64 = 500;
/// A singleton silent this long is reported dead (error log on the workers).
pub(crate) const DEAD_AFTER_MS: u64 = 10_000;

/// What the singleton last reported, in Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Heartbeat {
    /// When the sync engine started.
    pub(crate) started_ms: u64,
    /// The singleton's last tick.
    pub(crate) tick_ms: u64,
    /// The last successful sync cycle; 0 if none yet.
    pub(crate) success_ms: u64,
}

impl Heartbeat {
    pub const LEN: usize = 24;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        for (chunk, v) in
            out.chunks_exact_mut(8)
                .zip([self.started_ms, self.tick_ms, self.success_ms])
        {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// None for anything that is not exactly one encoded heartbeat.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = bytes.try_into().ok()?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        Some(Self {
            started_ms: word(0),
            tick_ms: word(1),
            success_ms: word(2),
        })
    }

    /// Seconds since the last successful cycle (since start if none yet).
    pub fn success_age_s(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.success_ms.max(self.started_ms)) / 1000
    }

    /// Seconds since the singleton last ticked.
    pub fn tick_age_s(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.tick_ms) / 1000
    }

    pub fn singleton_dead(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.tick_ms) > DEAD_AFTER_MS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_round_trips_and_rejects_other_lengths() {
        let h = Heartbeat {
            started_ms: 1,
            tick_ms: u64::MAX,
            success_ms: 42,
        };
        assert_eq!(Heartbeat::decode(&h.encode()), Some(h));
        assert_eq!(Heartbeat::decode(&h.encode()[..23]), None);
        assert_eq!(Heartbeat::decode(&[0u8; 25]), None);
    }

    #[test]
    fn ages_grow_while_nothing_is_written() {
        let h = Heartbeat {
            started_ms: 10_000,
            tick_ms: 20_000,
            success_ms: 0,
        };
        // No success yet: age counts from start.
        assert_eq!(h.success_age_s(40_000), 30);
        assert_eq!(h.tick_age_s(40_000), 20);
        assert!(h.singleton_dead(40_000));
        assert!(!h.singleton_dead(25_000));
        // A clock behind the writer's never underflows.
        assert_eq!(h.tick_age_s(0), 0);
    }
}
