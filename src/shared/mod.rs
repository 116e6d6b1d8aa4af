//! Foundations every layer stands on: the VM shared data seen through the
//! [`store::SharedStore`] trait, the [`registry`] that names pods and
//! models by small, stable slots in it, Envoy's stats ([`metrics`]) and the
//! singleton's outgoing [`calls`]. Nothing here knows about requests,
//! sync or the fleet; `route`, `fleet`, `signals` and `sync` import it
//! downward.

pub(crate) mod calls;
pub(crate) mod metrics;
pub mod registry;
pub mod store;
