//! The two namespaces the filter syncs through Redis, as [`Syncable`](crate::sync::Syncable)s over
//! the shared store.
//!
//! - [`PrefixCacheSync`] (`prefixcache`): entity id = block hash in decimal,
//!   payload `{"model_to_pods":{model:{pod:unix_nanos}}}`, merge keeps the
//!   newer time per pod: byte-compatible with AIBrix's Go gateways. Delta
//!   tracking: blocks workers handed over since the last successful push.
//! - [`PodLoadSync`] (`podload`): one entity per replica, its in-flight count
//!   per pod, so routing weighs the fleet's load and not only its own.
//!
//! Pods travel by their stable name, never by slot. Remote facts are applied
//! to routing only for pods that are members here now (a slot is given to
//! another pod only long after its pod left, see [`crate::shared::registry`]), and
//! their times are clamped to now, so a hostile or skewed writer cannot pin a
//! fact beyond its idle expiry. Facts for other pods (another gateway's, e.g.
//! an AIBrix gateway's) are kept, bounded, as [`ForeignFacts`](crate::sync::foreign::ForeignFacts) and carried in
//! every value this replica writes: it never erases another writer's data,
//! and a key naming a pod it does not know is never deleted as stale (it
//! leaves by TTL).

mod podload;
mod prefixcache;

use std::rc::Rc;

pub use podload::PodLoadSync;
pub use prefixcache::PrefixCacheSync;
// The payloads, for tests that decode them.
#[cfg(any(test, feature = "testkit"))]
pub use {podload::LoadReport, prefixcache::BlockPayload};

/// The host's clock: [`PrefixCacheSync`] reads Unix seconds from it,
/// [`PodLoadSync`] Unix milliseconds.
pub type Clock = Rc<dyn Fn() -> u64>;

const NANOS: u64 = 1_000_000_000;

#[cfg(test)]
mod testutil {
    use super::Clock;
    use crate::config::Settings;
    use crate::fleet::SharedView;
    use crate::shared::store::MemStore;
    use std::rc::Rc;

    pub(crate) fn settings() -> Rc<Settings> {
        Rc::new(Settings::from_json(br#"{"endpoints":["a:1","b:1"]}"#).unwrap())
    }

    /// The static pools as members (a:1 gets slot 0, b:1 slot 1).
    pub(crate) fn view(store: &MemStore, s: &Settings) -> SharedView {
        let m = crate::fleet::static_members(store, &s.static_pools(), 1, 100).unwrap();
        Rc::new(std::cell::RefCell::new(crate::fleet::FleetView::new(m)))
    }

    pub(crate) fn clock(secs: u64) -> Clock {
        Rc::new(move || secs)
    }
}
