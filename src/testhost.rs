//! Envoy as the singleton's services see it, for their unit tests (one
//! double for all of them): shared data in a `MemStore`, stats by name,
//! every outgoing call recorded with a token (and refused on demand), and
//! whether the singleton registered its queue.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use crate::deployment::DeploymentHost;
use crate::shared::calls::HttpCalls;
use crate::shared::metrics::{MetricKind, MetricSink};
use crate::shared::store::{MemStore, SharedStore, StoreError, Versioned};
use crate::sync::bridge::BridgeCalls;
use crate::sync::SyncSettings;

/// A call a service sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) token: u32,
    /// The cluster, or `bridge` for a Redis pipeline.
    pub(crate) to: String,
    /// `name: value`, pseudo-headers included (none for the bridge).
    pub(crate) headers: Vec<String>,
    /// The Redis Cluster master a pipeline named.
    pub(crate) node: Option<String>,
    pub(crate) body: Vec<u8>,
    pub(crate) timeout_ms: u64,
}

impl Sent {
    /// Whether this is the Redis probe (`INFO server`).
    pub(crate) fn is_probe(&self) -> bool {
        self.body.windows(4).any(|w| w == b"INFO")
    }
}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) store: MemStore,
    metrics: RefCell<Vec<String>>,
    values: RefCell<HashMap<u32, i64>>,
    sent: RefCell<Vec<Sent>>,
    /// Envoy refuses every call while set.
    pub(crate) refuse: Cell<bool>,
    /// Whether the singleton's queue is registered.
    pub(crate) queue: Cell<bool>,
    /// Queue look-ups so far.
    pub(crate) lookups: Cell<u32>,
}

/// The double; clones share one Envoy.
#[derive(Clone, Default)]
pub(crate) struct FakeEnvoy(pub(crate) Rc<Inner>);

impl FakeEnvoy {
    /// Every call sent so far, in order.
    pub(crate) fn sent(&self) -> Vec<Sent> {
        self.0.sent.borrow().clone()
    }

    /// The value of stat `name`; 0 if never written, and None if never
    /// defined.
    pub(crate) fn stat(&self, name: &str) -> i64 {
        let id = self
            .id(name)
            .unwrap_or_else(|| panic!("stat {name} defined"));
        self.0.values.borrow().get(&id).copied().unwrap_or(0)
    }

    /// The value of gauge `name`; None if never written.
    pub(crate) fn gauge(&self, name: &str) -> Option<i64> {
        self.0.values.borrow().get(&self.id(name)?).copied()
    }

    /// Forgets every stat value (the definitions stay).
    pub(crate) fn clear_stats(&self) {
        self.0.values.borrow_mut().clear();
    }

    fn id(&self, name: &str) -> Option<u32> {
        let i = self.0.metrics.borrow().iter().position(|n| n == name)?;
        Some(i as u32 + 1)
    }

    fn send(&self, mut call: Sent) -> Result<u32, String> {
        if self.0.refuse.get() {
            return Err("BadArgument".into());
        }
        let mut sent = self.0.sent.borrow_mut();
        call.token = sent.len() as u32 + 1;
        sent.push(call);
        Ok(sent.len() as u32)
    }
}

impl SharedStore for FakeEnvoy {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        self.0.store.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.0.store.set(key, value, cas)
    }
}

impl MetricSink for FakeEnvoy {
    fn define_metric(&self, _kind: MetricKind, name: &str) -> u32 {
        if let Some(id) = self.id(name) {
            return id;
        }
        let mut names = self.0.metrics.borrow_mut();
        names.push(name.to_string());
        names.len() as u32
    }
    fn increment_metric(&self, id: u32, by: i64) {
        *self.0.values.borrow_mut().entry(id).or_default() += by;
    }
    fn record_metric(&self, id: u32, value: u64) {
        self.0.values.borrow_mut().insert(id, value as i64);
    }
}

impl HttpCalls for FakeEnvoy {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout_ms: u64,
    ) -> Result<u32, String> {
        self.send(Sent {
            token: 0,
            to: cluster.into(),
            headers: headers.iter().map(|(k, v)| format!("{k}: {v}")).collect(),
            node: None,
            body: body.unwrap_or_default().to_vec(),
            timeout_ms,
        })
    }
}

impl BridgeCalls for FakeEnvoy {
    fn post_bridge(
        &self,
        _sync: &SyncSettings,
        node: Option<&str>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, String> {
        self.send(Sent {
            token: 0,
            to: "bridge".into(),
            headers: Vec::new(),
            node: node.map(str::to_owned),
            body: body.to_vec(),
            timeout_ms,
        })
    }
}

impl DeploymentHost for FakeEnvoy {
    fn queue_registered(&self, _vm_id: &str, _name: &str) -> bool {
        self.0.lookups.set(self.0.lookups.get() + 1);
        self.0.queue.get()
    }
}
