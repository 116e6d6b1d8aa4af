//! The sync singleton (one per Envoy, on the main thread): the loop that
//! syncs the table with Redis ([`crate::sync::supervisor`]), the
//! [`membership`] refresher, the pod [`signals`] collector and the
//! configuration comparison, started and driven by [`Singleton`] over the
//! host traits. The host's singleton root context forwards Envoy's
//! callbacks here. This sits above `fleet`, `signals`, `sync` and `config`,
//! and nothing but the host imports it.

pub(crate) mod membership;
pub(crate) mod signals;

use std::rc::Rc;

use self::membership::Refresher;
use self::signals::Collector;
use crate::config::Settings;
use crate::deployment::{ConfigWatch, DeploymentHost};
use crate::fleet::SharedView;
use crate::shared::calls::{CallFailed, HttpCalls};
use crate::sync::supervisor::{SyncHost, SyncSupervisor};
use crate::sync::syncables::Clock;

/// Queue messages handed to sync per callback, so one burst cannot stall
/// the main thread.
pub(crate) const MAX_DRAIN: usize = 10_000;

/// What the singleton asks of Envoy: what sync asks, plus outgoing calls
/// and the deployment checks' look-ups.
pub(crate) trait SingletonHost: SyncHost + HttpCalls + DeploymentHost {}
impl<T: SyncHost + HttpCalls + DeploymentHost> SingletonHost for T {}

/// The singleton's services. Envoy may configure two singleton VMs of
/// which only one ticks, so nothing starts before the first tick (sync
/// also starts on the first hand-off, whichever comes first, so no hand-off
/// misses the dirty set).
pub(crate) struct Singleton<H: SingletonHost> {
    host: H,
    settings: Rc<Settings>,
    /// Unix nanoseconds (the services' milliseconds, sync's seed).
    clock_ns: Clock,
    /// The singleton's view of the fleet (the syncables name pods through it).
    view: SharedView,
    /// Compares this plugin configuration with the filter's.
    config_watch: ConfigWatch,
    sync: Option<SyncSupervisor<H>>,
    membership: Option<Refresher<H>>,
    signals: Option<Collector<H>>,
}

impl<H: SingletonHost> Singleton<H> {
    /// The singleton of `settings` (`raw`: the configuration as given).
    pub(crate) fn new(host: H, settings: Settings, raw: Vec<u8>, clock_ns: Clock) -> Self {
        if !settings.sync.enabled {
            log::info!("prefix_router singleton: sync disabled (sync.enabled is false)");
        }
        Self {
            config_watch: ConfigWatch::new(&host, raw),
            host,
            settings: Rc::new(settings),
            clock_ns,
            view: SharedView::default(),
            sync: None,
            membership: None,
            signals: None,
        }
    }

    /// A later configuration: compared from now on, and given to the
    /// services that start after it (those running keep theirs).
    pub(crate) fn reconfigure(&mut self, settings: Settings, raw: Vec<u8>) {
        if !settings.sync.enabled {
            log::info!("prefix_router singleton: sync disabled (sync.enabled is false)");
        }
        self.config_watch = ConfigWatch::new(&self.host, raw);
        self.settings = Rc::new(settings);
    }

    fn now_ms(&self) -> u64 {
        (self.clock_ns)() / 1_000_000
    }

    /// The host's tick: the configuration check, membership, the workers'
    /// hand-offs (`queue`, at most [`MAX_DRAIN`] taken), pod signals (which
    /// share under sync's origin), then sync.
    pub(crate) fn on_tick(
        &mut self,
        vm_id: impl FnOnce() -> String,
        queue: impl Iterator<Item = Vec<u8>>,
    ) {
        let now = self.now_ms();
        self.config_watch.on_tick(&self.host, vm_id, now);
        let membership = self.membership.get_or_insert_with(|| {
            Refresher::new(self.host.clone(), self.settings.clone(), self.view.clone())
        });
        membership.on_tick(now);
        self.on_queue(queue);
        if self.signals.is_none() && self.settings.signals.enabled {
            let replica = self.sync.as_ref().map(|s| s.origin().to_string());
            self.signals = Some(Collector::new(
                self.host.clone(),
                self.settings.clone(),
                self.view.clone(),
                replica.as_deref(),
            ));
        }
        if let Some(signals) = self.signals.as_mut() {
            signals.on_tick(now);
        }
        if let Some(sync) = self.sync.as_mut() {
            sync.on_tick(now);
        }
    }

    /// Workers handed blocks over (`queue`: the messages waiting, at most
    /// [`MAX_DRAIN`] taken): they go to sync, which starts now if it has not.
    pub(crate) fn on_queue(&mut self, queue: impl Iterator<Item = Vec<u8>>) {
        if self.sync.is_none() {
            let clock_ns = self.clock_ns.clone();
            let clock_ms: Clock = Rc::new(move || clock_ns() / 1_000_000);
            self.sync = SyncSupervisor::start(
                self.host.clone(),
                self.settings.clone(),
                self.view.clone(),
                clock_ms,
                (self.clock_ns)(),
                self.now_ms(),
            );
        }
        for message in queue.take(MAX_DRAIN) {
            if let Some(sync) = self.sync.as_mut() {
                sync.on_handoff(&message);
            }
        }
    }

    /// The reply to call `token`, to the service that sent it, which reads
    /// it through `read` within its own bound; false if none sent it.
    pub(crate) fn on_reply(
        &mut self,
        token: u32,
        read: impl Fn(usize) -> Result<Vec<u8>, CallFailed>,
    ) -> bool {
        let now = self.now_ms();
        if let Some(membership) = self.membership.as_mut() {
            if membership.on_reply(token, now, &read) {
                return true;
            }
        }
        if let Some(signals) = self.signals.as_mut() {
            if signals.on_reply(token, now, &read) {
                return true;
            }
        }
        self.sync
            .as_mut()
            .is_some_and(|sync| sync.on_reply(token, now, &read))
    }

    /// VM shutdown (Envoy drain): ends the sync loop cleanly.
    pub(crate) fn stop(&mut self) {
        if let Some(sync) = self.sync.as_mut() {
            sync.stop();
        }
    }
}

#[cfg(test)]
mod tests;
