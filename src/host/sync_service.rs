//! The sync singleton (placeholder until the engine lands).

use proxy_wasm::traits::{Context, RootContext};

#[derive(Default)]
pub struct SyncRoot;

impl Context for SyncRoot {}

impl RootContext for SyncRoot {}
