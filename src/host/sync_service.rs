//! The sync singleton's root context: one on Envoy's main thread (an
//! `envoy.bootstrap.wasm` service with `singleton: true`, same `vm_id` as the
//! filter, root id [`SYNC_ROOT_ID`](crate::deployment::SYNC_ROOT_ID)). It
//! forwards Envoy's callbacks to [`Singleton`]: the tick, the replies to its
//! calls, and the workers' hand-off queue.
//!
//! `on_configure` only parses, sets the tick and registers the hand-off queue
//! (idempotent): Envoy may configure two singleton VMs of which only one
//! ticks, so the services start on the first tick.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, RootContext};

use super::abi;
use super::envoy::{now_nanos, EnvoyHost};
use crate::deployment;
use crate::singleton::Singleton;
use crate::sync::handoff;
use crate::sync::supervisor::TICK_MS;

#[derive(Default)]
pub(crate) struct SyncRoot {
    queue: Option<u32>,
    singleton: Option<Singleton<EnvoyHost>>,
}

impl SyncRoot {
    /// The messages waiting in the hand-off queue, dequeued as they are taken.
    fn queue(&self) -> impl Iterator<Item = Vec<u8>> {
        let queue = self.queue;
        std::iter::from_fn(move || hostcalls::dequeue_shared_queue(queue?).ok().flatten())
    }
}

impl Context for SyncRoot {
    /// VM shutdown (Envoy drain): end the loop cleanly.
    fn on_done(&mut self) -> bool {
        if let Some(singleton) = self.singleton.as_mut() {
            singleton.stop();
        }
        true
    }

    fn on_http_call_response(
        &mut self,
        token_id: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(singleton) = self.singleton.as_mut() {
            // A call none of its services sent is not read.
            let _ = singleton.on_reply(token_id, |max| {
                abi::call_reply(num_headers, body_size.min(max))
            });
        }
    }
}

impl RootContext for SyncRoot {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        deployment::announce_build(&EnvoyHost, "sync singleton");
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        super::follow_log_level();
        let Some((settings, raw)) = super::load_plugin_config() else {
            return false;
        };
        if let Err(status) = hostcalls::set_tick_period(Duration::from_millis(TICK_MS)) {
            log::error!(
                "prefix_router singleton: cannot set the tick ({status:?}): sync will not run"
            );
        }
        // Register the hand-off queue now, before listeners serve: workers
        // find it and hand their table writes here from their first request.
        // Registering twice (Envoy may configure two singleton VMs) returns
        // the same queue, so this is idempotent.
        self.queue = hostcalls::register_shared_queue(handoff::QUEUE_NAME).ok();
        match self.singleton.as_mut() {
            Some(singleton) => singleton.reconfigure(settings, raw),
            None => {
                let clock_ns = Rc::new(now_nanos);
                self.singleton = Some(Singleton::new(EnvoyHost, settings, raw, clock_ns));
            }
        }
        true
    }

    fn on_tick(&mut self) {
        super::follow_log_level();
        let queue = self.queue();
        if let Some(singleton) = self.singleton.as_mut() {
            singleton.on_tick(super::vm_id, queue);
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        let queue = self.queue();
        if let Some(singleton) = self.singleton.as_mut() {
            singleton.on_queue(queue);
        }
    }
}
