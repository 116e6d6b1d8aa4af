//! The sync singleton: one root context on Envoy's main thread (an
//! `envoy.bootstrap.wasm` service with `singleton: true`, same `vm_id` as the
//! filter, root id [`SYNC_ROOT_ID`](crate::deployment::SYNC_ROOT_ID)). It forwards
//! Envoy's callbacks to the singleton's services: the sync loop
//! ([`SyncSupervisor`]), membership ([`Refresher`]) and pod signals
//! ([`Collector`]); replies go to the service whose call it was, and the
//! workers' hand-off queue is drained into the sync loop.
//!
//! `on_configure` only parses, sets the tick and registers the hand-off queue
//! (idempotent): Envoy may configure two singleton VMs of which only one
//! ticks, so the services start on the first tick.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, RootContext};

use super::abi;
use super::envoy::EnvoyHost;
use super::{now_millis, now_nanos};
use crate::config::Settings;
use crate::deployment::{self, ConfigWatch};
use crate::fleet::SharedView;
use crate::singleton::membership::Refresher;
use crate::singleton::signals::Collector;
use crate::sync::handoff;
use crate::sync::supervisor::{SyncSupervisor, MAX_DRAIN, TICK_MS};

#[derive(Default)]
pub struct SyncRoot {
    settings: Option<Rc<Settings>>,
    queue: Option<u32>,
    /// The sync loop (started on the first tick or hand-off).
    sync: Option<SyncSupervisor<EnvoyHost>>,
    /// Membership and health of the pools (started on the first tick).
    fleet: Option<Refresher<EnvoyHost>>,
    /// The singleton's view of the fleet (the syncables name pods through it).
    view: SharedView,
    /// Pod signals (`signals.enabled`; started on the first tick).
    signals: Option<Collector<EnvoyHost>>,
    /// Compares this plugin configuration with the filter's.
    config_watch: Option<ConfigWatch>,
}

impl Context for SyncRoot {
    /// VM shutdown (Envoy drain): end the loop cleanly.
    fn on_done(&mut self) -> bool {
        if let Some(sync) = self.sync.as_mut() {
            sync.stop();
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
        let now = now_millis();
        // The call's owner reads the reply within its own bound.
        let read = move |max: usize| abi::call_reply(num_headers, body_size.min(max));
        if let Some(fleet) = self.fleet.as_mut() {
            if fleet.on_reply(token_id, now, read) {
                return;
            }
        }
        if let Some(signals) = self.signals.as_mut() {
            if signals.on_reply(token_id, now, read) {
                return;
            }
        }
        if let Some(sync) = self.sync.as_mut() {
            sync.on_reply(token_id, now, read);
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
        self.config_watch = Some(ConfigWatch::new(&EnvoyHost, raw));
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
        if !settings.sync.enabled {
            log::info!("prefix_router singleton: sync disabled (sync.enabled is false)");
        }
        self.settings = Some(Rc::new(settings));
        true
    }

    fn on_tick(&mut self) {
        super::follow_log_level();
        if let Some(watch) = self.config_watch.as_mut() {
            watch.on_tick(&EnvoyHost, super::vm_id, now_millis());
        }
        if self.fleet.is_none() {
            self.fleet = self
                .settings
                .clone()
                .map(|s| Refresher::new(EnvoyHost, s, self.view.clone()));
        }
        if let Some(fleet) = self.fleet.as_mut() {
            fleet.on_tick(now_millis());
        }
        // Starts the sync state on the first tick (signals share its origin).
        self.drain_queue();
        if self.signals.is_none() {
            self.signals = self
                .settings
                .clone()
                .filter(|s| s.signals.enabled)
                .map(|s| {
                    let replica = self.sync.as_ref().map(|sync| sync.origin().to_string());
                    Collector::new(EnvoyHost, s, self.view.clone(), replica.as_deref())
                });
        }
        if let Some(signals) = self.signals.as_mut() {
            signals.on_tick(now_millis());
        }
        if let Some(sync) = self.sync.as_mut() {
            sync.on_tick(now_millis());
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        self.drain_queue();
    }
}

impl SyncRoot {
    /// Hands the blocks workers recorded to the sync loop.
    fn drain_queue(&mut self) {
        // The loop starts with the first tick or the first hand-off,
        // whichever comes first, so no hand-off misses the dirty set.
        if self.sync.is_none() {
            self.sync = self.settings.clone().and_then(|s| {
                let clock_ms: Rc<dyn Fn() -> u64> = Rc::new(now_millis);
                SyncSupervisor::start(
                    EnvoyHost,
                    s,
                    self.view.clone(),
                    clock_ms,
                    now_nanos(),
                    now_millis(),
                )
            });
        }
        let Some(queue) = self.queue else {
            return;
        };
        for _ in 0..MAX_DRAIN {
            let msg = match hostcalls::dequeue_shared_queue(queue) {
                Ok(Some(m)) => m,
                _ => break,
            };
            if let Some(sync) = self.sync.as_mut() {
                sync.on_handoff(&msg);
            }
        }
    }
}
