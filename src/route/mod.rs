//! The request path: from a request body to the pod it goes to.
//!
//! [`request`] turns a body into a model and prompt bytes, [`hashing`] cuts
//! them into chained block hashes, [`table`] (the prefix table in shared
//! data) answers which pods hold how much of the chain, `policy` picks a pod
//! from one view per pod (its match, the in-flight counts of [`load`], the
//! slowness [`latency`] and [`prefill`] measure), [`router`] runs those
//! steps for one request, and [`hold`] keeps a request whose matched prefix
//! its pod is still computing until that prefill answers. All of it runs
//! over the [`crate::shared::store::SharedStore`] trait, naming pods and
//! models by the slots of [`crate::shared::registry`]; [`meter`] keeps the
//! path's stats in VM memory until the worker's tick flushes them.

pub mod hashing;
pub(crate) mod hold;
pub(crate) mod latency;
pub mod load;
pub mod meter;
pub(crate) mod policy;
pub(crate) mod prefill;
pub(crate) mod reads;
pub mod request;
pub mod router;
pub mod table;
