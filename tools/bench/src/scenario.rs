//! The routers a comparison puts side by side, and how each is started in
//! front of a set of backends (podsim pods, or llama-servers behind
//! [`crate::tagproxy`]): Envoy with `envoy/plain.yaml` (round robin), with
//! the filter (`single.yaml`, one or three replicas), three `sync.yaml`
//! replicas + redis-server (periodic or write-through), sglang-router and
//! vllm-router (`cache_aware`), one process or three side by side (as a
//! peer runs for high availability: each replica routes on its own state).
//!
//! The Envoys are started by the harness's launcher
//! ([`harness::fleet::launch`]): configs name four pods, and with fewer
//! backends the unused endpoints are removed from the rendered config and from
//! the plugin JSON.
//!
//! On a live fleet ([`GatewayOptions::eds`]) the Envoy routers run on the
//! EDS-fed configs instead: round robin on `envoy/plain-eds.yaml`, the filter
//! on `envoy/eds.yaml` (membership and health from Envoy's admin), both with
//! the same active health check and retry policy. The EDS file they read
//! (`envoy/eds/pods.yaml`) is rendered onto the backends like the config.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::peer::{Peer, PeerKind};
use harness::fleet::{launch, launch_all, sync_patch, EnvoySpec};
use harness::{self, Envoy, Pod, Redis, TestDir};

/// One router setup of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Router {
    /// Envoy, `plain.yaml`: round robin, no filter.
    RoundRobin,
    /// One Envoy with the filter (`single.yaml`).
    Filter,
    /// One Envoy with the filter in `policy.mode: aibrix`, no pod signals
    /// (AIBrix's rules on in-flight counts).
    FilterAibrix,
    /// Three `single.yaml` Envoys, no sync; the client alternates them.
    Filter3NoSync,
    /// Three `sync.yaml` Envoys + Redis, periodic sync, `sync.place_new`
    /// off (the fleet before placement).
    Filter3Sync,
    /// Three `sync.yaml` Envoys + Redis, write-through, `place_new` off.
    Filter3WriteThrough,
    /// Three `sync.yaml` Envoys + Redis, periodic sync, pod scrapes shared
    /// through Redis (`signals.share`), `place_new` off.
    Filter3Share,
    /// Three `sync.yaml` Envoys + Redis, periodic sync, new prompts placed
    /// through Redis (`sync.place_new`, as a synced fleet runs by default).
    Filter3Place,
    /// sglang-router `--policy cache_aware`.
    Sglang,
    /// vllm-router `--policy cache_aware`.
    Vllm,
    /// Three sglang-router `--policy cache_aware` processes over the same
    /// pods, nothing shared between them; the client alternates them.
    Sglang3,
    /// Three vllm-router `--policy cache_aware` processes, as [`Router::Sglang3`].
    Vllm3,
}

impl Router {
    pub const ALL: [Router; 12] = [
        Router::RoundRobin,
        Router::Filter,
        Router::FilterAibrix,
        Router::Filter3NoSync,
        Router::Filter3Sync,
        Router::Filter3WriteThrough,
        Router::Filter3Share,
        Router::Filter3Place,
        Router::Sglang,
        Router::Vllm,
        Router::Sglang3,
        Router::Vllm3,
    ];

    /// Short name (command line, tables, JSON).
    pub fn key(self) -> &'static str {
        match self {
            Router::RoundRobin => "round-robin",
            Router::Filter => "filter",
            Router::FilterAibrix => "filter-aibrix",
            Router::Filter3NoSync => "filter-3x-nosync",
            Router::Filter3Sync => "filter-3x-sync",
            Router::Filter3WriteThrough => "filter-3x-wt",
            Router::Filter3Share => "filter-3x-share",
            Router::Filter3Place => "filter-3x-place",
            Router::Sglang => "sglang",
            Router::Vllm => "vllm",
            Router::Sglang3 => "sglang-3x",
            Router::Vllm3 => "vllm-3x",
        }
    }

    /// One line of what runs.
    pub fn describe(self, sync_period_ms: u64) -> String {
        match self {
            Router::RoundRobin => "Envoy, envoy/plain.yaml (round robin, no filter)".into(),
            Router::Filter => {
                "one Envoy with the filter (envoy/single.yaml: load-aware policy, pod signals)"
                    .into()
            }
            Router::FilterAibrix => "one Envoy with the filter, policy.mode aibrix, signals off \
                 (envoy/single.yaml patched)"
                .into(),
            Router::Filter3NoSync => {
                "3 Envoys with the filter, no sync (3 x single.yaml), client round robin".into()
            }
            Router::Filter3Sync => format!(
                "3 Envoys with the filter + Redis, periodic sync every {sync_period_ms} ms \
                 (3 x sync.yaml, sync.place_new off), client round robin"
            ),
            Router::Filter3WriteThrough => format!(
                "3 Envoys with the filter + Redis, write-through (period {sync_period_ms} ms, \
                 3 x sync.yaml, sync.place_new off), client round robin"
            ),
            Router::Filter3Share => format!(
                "3 Envoys with the filter + Redis, periodic sync every {sync_period_ms} ms, pod \
                 scrapes shared through Redis (3 x sync.yaml, signals.share, sync.place_new off), client \
                 round robin"
            ),
            Router::Filter3Place => format!(
                "3 Envoys with the filter + Redis, periodic sync every {sync_period_ms} ms, new \
                 prompts placed through Redis (3 x sync.yaml, sync.place_new as by default), client \
                 round robin"
            ),
            Router::Sglang => "sglang-router 0.3.2 --policy cache_aware".into(),
            Router::Vllm => "vllm-router 0.1.17 --policy cache_aware".into(),
            Router::Sglang3 => "3 x sglang-router 0.3.2 --policy cache_aware, nothing shared, \
                 client round robin"
                .into(),
            Router::Vllm3 => "3 x vllm-router 0.1.17 --policy cache_aware, nothing shared, \
                 client round robin"
                .into(),
        }
    }

    pub fn parse(s: &str) -> Option<Router> {
        Router::ALL.into_iter().find(|r| r.key() == s)
    }

    /// A peer router (sglang-router or vllm-router), one process or three.
    pub fn is_peer(self) -> bool {
        matches!(
            self,
            Router::Sglang | Router::Vllm | Router::Sglang3 | Router::Vllm3
        )
    }

    /// Three peer processes side by side.
    pub fn is_peer_fleet(self) -> bool {
        matches!(self, Router::Sglang3 | Router::Vllm3)
    }

    /// One line of what runs, on the static pods or, with `opts.eds`, on
    /// the live fleet.
    pub fn describe_with(self, opts: &GatewayOptions) -> String {
        match (opts.eds, self) {
            (true, Router::RoundRobin) => {
                "Envoy, envoy/plain-eds.yaml (EDS-fed pods, /health check, \
                 retry; round robin, no filter)"
                    .into()
            }
            (true, Router::Filter) => "one Envoy with the filter, envoy/eds.yaml (EDS-fed pods, \
                 members and health from Envoy's admin, passive cooldown, /health check, retry)"
                .into(),
            _ => self.describe(opts.sync_period_ms),
        }
    }

    /// Whether the router runs on a live fleet ([`GatewayOptions::eds`]):
    /// the peers (their own worker list) and the single Envoys, which have
    /// EDS-fed configs; the 3-Envoy fleets have none yet.
    pub fn has_eds_variant(self) -> bool {
        matches!(
            self,
            Router::RoundRobin | Router::Filter | Router::Sglang | Router::Vllm
        )
    }

    /// Uses the filter (has filter stats).
    pub fn is_filter(self) -> bool {
        matches!(
            self,
            Router::Filter
                | Router::FilterAibrix
                | Router::Filter3NoSync
                | Router::Filter3Sync
                | Router::Filter3WriteThrough
                | Router::Filter3Share
                | Router::Filter3Place
        )
    }
}

impl Serialize for Router {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.key())
    }
}

/// Parses a comma-separated router list; `all` = every router.
pub fn parse_routers(s: &str) -> Result<Vec<Router>, String> {
    if s == "all" {
        return Ok(Router::ALL.to_vec());
    }
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            Router::parse(p.trim()).ok_or_else(|| {
                let names: Vec<&str> = Router::ALL.iter().map(|r| r.key()).collect();
                format!("unknown router {p:?}; one of: all, {}", names.join(", "))
            })
        })
        .collect()
}

/// How gateways are started.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    pub sync_period_ms: u64,
    /// Envoy worker threads of a lone Envoy (plain, filter).
    pub single_concurrency: u32,
    /// Envoy worker threads of each of three replicas.
    pub replica_concurrency: u32,
    /// Synced fleets: before traffic, one warm-up request per replica, then
    /// wait until every replica polls the change log (a fleet in service).
    /// Off = a cold fleet on an empty Redis, whose replicas cannot poll
    /// until the first cycle after the first write (see the README notes).
    pub warm_sync: bool,
    /// A live fleet: the Envoy routers' `pods` cluster is fed by EDS from a
    /// file, with an active health check and route retries
    /// (`plain-eds.yaml`, `eds.yaml`); the gateway starts once Envoy (and the
    /// filter's membership) sees every backend healthy.
    pub eds: bool,
    /// Merged into the plugin configuration of every Envoy of the `filter`
    /// and `filter-3x-*` routers, after their own settings (compare's
    /// `--filter-patch`), e.g. `{"hold":{"enabled":false}}`.
    pub filter_patch: Option<serde_json::Value>,
    /// Another build of the filter module for those same Envoys (a
    /// variant being tried, e.g. a build without one mechanism).
    pub filter_module: Option<std::path::PathBuf>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            sync_period_ms: 2000,
            single_concurrency: 2,
            replica_concurrency: 1,
            warm_sync: true,
            eds: false,
            filter_patch: None,
            filter_module: None,
        }
    }
}

/// A running router in front of the backends.
pub struct Gateway {
    pub router: Router,
    pub envoys: Vec<Envoy>,
    pub redis: Option<Redis>,
    /// The peer router's processes (one, or three for `sglang-3x`/`vllm-3x`).
    pub peers: Vec<Peer>,
}

/// A filter router's Envoy: its spec, then `--filter-patch` on top, and
/// the module swapped for `filter_module`'s.
fn with_filter_patch<'a>(spec: EnvoySpec<'a>, opts: &GatewayOptions) -> EnvoySpec<'a> {
    let spec = match &opts.filter_patch {
        Some(patch) => spec.merge(patch.clone()),
        None => spec,
    };
    match &opts.filter_module {
        Some(module) => spec.module(module),
        None => spec,
    }
}

impl Router {
    /// Whether a setup's patch and module apply to this router's Envoys
    /// (the filter and the three-Envoy filter fleets, not `filter-aibrix`,
    /// whose policy is fixed).
    pub fn takes_variants(self) -> bool {
        self.is_filter() && self != Router::FilterAibrix
    }
}

impl Gateway {
    /// Starts `router` in front of `backends` (loopback ports, at most 4 for
    /// the Envoy routers). Files go to `dir`.
    pub fn start(
        router: Router,
        backends: &[u16],
        dir: &TestDir,
        opts: &GatewayOptions,
    ) -> Result<Gateway, String> {
        let mut gw = Gateway {
            router,
            envoys: Vec::new(),
            redis: None,
            peers: Vec::new(),
        };
        if opts.eds && !router.has_eds_variant() {
            return Err(format!("{} has no live-fleet (EDS) variant", router.key()));
        }
        // The Envoy routers, in front of `backends`.
        let spec = |name: &str, template: &str, concurrency| {
            EnvoySpec::new(name, template, backends)
                .concurrency(concurrency)
                .log_level("warning")
        };
        let patched = |s| with_filter_patch(s, opts);
        let single = opts.single_concurrency;
        match router {
            Router::RoundRobin => {
                let template = if opts.eds {
                    "plain-eds.yaml"
                } else {
                    "plain.yaml"
                };
                gw.envoys
                    .push(launch(dir, spec("plain", template, single))?.envoy);
            }
            Router::Filter => {
                let template = if opts.eds { "eds.yaml" } else { "single.yaml" };
                let filter = patched(spec("filter", template, single));
                gw.envoys.push(launch(dir, filter)?.envoy);
            }
            Router::FilterAibrix => {
                let aibrix = spec("filter-aibrix", "single.yaml", single).patch(|c| {
                    c["policy"] = json!({"mode": "aibrix"});
                    c["signals"] = json!({"enabled": false});
                });
                gw.envoys.push(launch(dir, aibrix)?.envoy);
            }
            Router::Filter3NoSync => {
                let specs = (0..3)
                    .map(|i| {
                        patched(spec(
                            &format!("nosync-{i}"),
                            "single.yaml",
                            opts.replica_concurrency,
                        ))
                    })
                    .collect();
                gw.envoys
                    .extend(launch_all(dir, specs)?.into_iter().map(|r| r.envoy));
            }
            Router::Filter3Sync
            | Router::Filter3WriteThrough
            | Router::Filter3Share
            | Router::Filter3Place => {
                let redis_port = harness::free_port();
                gw.redis = Some(Redis::start(dir, redis_port, None));
                let write_through = router == Router::Filter3WriteThrough;
                let mut patch = sync_patch(
                    opts.sync_period_ms,
                    json!({
                        "write_through": write_through,
                        "full_scan_every": 6,
                        "place_new": router == Router::Filter3Place,
                    }),
                );
                if router == Router::Filter3Share {
                    patch["signals"] = json!({"share": true});
                }
                let specs = (0..3)
                    .map(|i| {
                        patched(
                            spec(&format!("sync-{i}"), "sync.yaml", opts.replica_concurrency)
                                .redis(redis_port)
                                .merge(patch.clone()),
                        )
                    })
                    .collect();
                gw.envoys
                    .extend(launch_all(dir, specs)?.into_iter().map(|r| r.envoy));
                // Every replica past its first cycle (a change-log position),
                // as a fleet that has been up for a while.
                let timeout = Duration::from_millis(opts.sync_period_ms * 3 + 2000);
                for (i, e) in gw.envoys.iter().enumerate() {
                    if !harness::wait_until(timeout, || {
                        e.router_stat("prefix_router.sync.cycles_ok") >= 1
                    }) {
                        return Err(format!("sync replica {i}: no successful sync cycle"));
                    }
                }
                if opts.warm_sync {
                    warm_up_sync(&gw.envoys, timeout)?;
                }
            }
            Router::Sglang | Router::Vllm | Router::Sglang3 | Router::Vllm3 => {
                let kind = if matches!(router, Router::Sglang | Router::Sglang3) {
                    PeerKind::Sglang
                } else {
                    PeerKind::Vllm
                };
                let workers: Vec<String> = backends
                    .iter()
                    .map(|p| format!("http://127.0.0.1:{p}"))
                    .collect();
                let n = if router.is_peer_fleet() { 3 } else { 1 };
                for i in 0..n {
                    let name = if n == 1 {
                        kind.script_name().to_string()
                    } else {
                        format!("{}-{i}", kind.script_name())
                    };
                    gw.peers
                        .push(Peer::start(kind, &name, "cache_aware", &workers, dir)?);
                }
            }
        }
        if opts.eds {
            for e in &gw.envoys {
                wait_all_healthy(e, backends.len(), router.is_filter())?;
            }
        }
        Ok(gw)
    }

    /// Base URLs the client spreads requests over.
    pub fn urls(&self) -> Vec<String> {
        if !self.peers.is_empty() {
            return self.peers.iter().map(Peer::base_url).collect();
        }
        self.envoys
            .iter()
            .map(|e| format!("http://127.0.0.1:{}", e.listener))
            .collect()
    }

    /// The filter's stats of every replica (empty for other routers).
    pub fn filter_stats(&self) -> Vec<BTreeMap<String, i64>> {
        if !self.router.is_filter() {
            return Vec::new();
        }
        // The request path's stats reach Envoy on each worker's tick: wait
        // for it once, then read every replica.
        std::thread::sleep(harness::STATS_FLUSH * 3);
        self.envoys.iter().map(Envoy::router_stats).collect()
    }
}

/// One small request through every replica (its blocks reach Redis and
/// create the change log), then waits until every replica has polled the
/// log, as the replicas of a fleet that has been serving do. The prompts
/// share nothing with any workload and record two 128-byte blocks.
fn warm_up_sync(envoys: &[Envoy], timeout: Duration) -> Result<(), String> {
    for (i, e) in envoys.iter().enumerate() {
        let prompt = harness::text(0xFEED_0000 + i as u64, 300);
        let body = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 1}).to_string();
        let reply = harness::send(
            "POST",
            &e.url("/v1/completions"),
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
            Duration::from_secs(30),
        )?;
        if reply.status != 200 {
            return Err(format!(
                "warm-up through replica {i}: status {}",
                reply.status
            ));
        }
    }
    for (i, e) in envoys.iter().enumerate() {
        if !harness::wait_until(timeout, || {
            e.router_stat("prefix_router.sync.polls_ok") >= 1
        }) {
            return Err(format!(
                "sync replica {i}: no change-log poll after the warm-up"
            ));
        }
    }
    Ok(())
}

/// The filter's worker tick (src/host/root.rs): how often a worker VM
/// reads the membership the singleton publishes.
const WORKER_TICK: Duration = Duration::from_millis(250);

/// Waits until Envoy's health checks pass on all `n` hosts of cluster
/// `pods` and, with the filter, until its singleton has published them and
/// the workers have had time to read them.
fn wait_all_healthy(e: &Envoy, n: usize, filter: bool) -> Result<(), String> {
    let n = n as i64;
    let envoy_sees = || {
        e.stats_matching(r"^cluster\.pods\.membership_healthy$")
            .values()
            .sum::<i64>()
            == n
    };
    let filter_sees = || !filter || e.router_stat("prefix_router.membership.healthy") == n;
    if harness::wait_until(Duration::from_secs(20), || envoy_sees() && filter_sees()) {
        if filter {
            // The singleton has published the members; each worker reads
            // them on its next tick (every 250 ms). Until then it passes
            // requests through (`passthrough.no_endpoints`).
            std::thread::sleep(WORKER_TICK * 2 + Duration::from_millis(100));
        }
        Ok(())
    } else {
        Err(format!(
            "not all {n} pods healthy after 20 s (Envoy: {}, filter: {})",
            envoy_sees(),
            filter_sees()
        ))
    }
}

/// Sums the same stat over replicas.
pub fn sum_stat(stats: &[BTreeMap<String, i64>], name: &str) -> i64 {
    stats.iter().filter_map(|s| s.get(name)).sum()
}

/// The simulated pods' latency and cache model (podsim flags).
#[derive(Clone, Debug, Serialize)]
pub struct PodModel {
    pub slots: u32,
    pub prefill_us_per_token: f64,
    pub decode_us_per_token: f64,
    pub kv_block_tokens: u32,
    pub kv_capacity_blocks: u32,
    pub time_scale: f64,
    /// podsim --prefill-stalls-decode.
    pub prefill_stalls_decode: bool,
}

impl PodModel {
    /// The podsim flags.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--slots".into(),
            self.slots.to_string(),
            "--prefill-us-per-token".into(),
            self.prefill_us_per_token.to_string(),
            "--decode-us-per-token".into(),
            self.decode_us_per_token.to_string(),
            "--kv-block-tokens".into(),
            self.kv_block_tokens.to_string(),
            "--kv-capacity-blocks".into(),
            self.kv_capacity_blocks.to_string(),
            "--time-scale".into(),
            self.time_scale.to_string(),
        ];
        if self.prefill_stalls_decode {
            args.push("--prefill-stalls-decode".into());
        }
        args
    }

    /// Modelled seconds one request holds a slot with `uncached` prompt
    /// tokens and `output` tokens (no queueing).
    pub fn service_s(&self, uncached: f64, output: f64) -> f64 {
        (uncached * self.prefill_us_per_token + (output - 1.0).max(0.0) * self.decode_us_per_token)
            * self.time_scale
            / 1e6
    }
}

/// Fresh podsim pods `pod-1..pod-n` (cold caches).
pub struct PodSet {
    pub pods: Vec<Pod>,
    /// The podsim flags, for a restart.
    args: Vec<String>,
}

impl PodSet {
    pub fn start(dir: &TestDir, n: usize, model: &PodModel) -> PodSet {
        PodSet::start_with_slow(dir, n, model, None)
    }

    /// [`PodSet::start`], with pod `slow.0` (0-based) `slow.1` times slower
    /// (its `--time-scale` multiplied).
    pub fn start_with_slow(
        dir: &TestDir,
        n: usize,
        model: &PodModel,
        slow: Option<(usize, f64)>,
    ) -> PodSet {
        let args = model.args();
        let pods = (1..=n)
            .map(|i| {
                let own = match slow {
                    Some((k, f)) if k + 1 == i => PodModel {
                        time_scale: model.time_scale * f,
                        ..model.clone()
                    }
                    .args(),
                    _ => args.clone(),
                };
                let flags: Vec<&str> = own.iter().map(String::as_str).collect();
                Pod::start_with(dir, &format!("pod-{i}"), harness::free_port(), &flags)
            })
            .collect();
        PodSet { pods, args }
    }

    /// Kills pod `i` (SIGKILL: in-flight requests are cut off).
    pub fn kill(&mut self, i: usize) {
        self.pods[i].kill();
    }

    /// Starts pod `i` again, same name, port and flags, cold cache (killing
    /// it first if it still runs); returns when it accepts connections.
    pub fn restart(&mut self, dir: &TestDir, i: usize) {
        self.pods[i].kill();
        let (name, port) = (self.pods[i].name.clone(), self.pods[i].port);
        // Its ready file from the first start would count as ready at once.
        let _ = std::fs::remove_file(dir.join(&format!("{name}.ready")));
        let flags: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.pods[i] = Pod::start_with(dir, &name, port, &flags);
    }

    pub fn ports(&self) -> Vec<u16> {
        self.pods.iter().map(|p| p.port).collect()
    }

    pub fn names(&self) -> Vec<String> {
        self.pods.iter().map(|p| p.name.clone()).collect()
    }

    /// Sum over pods of a podsim metric (`vllm:prefix_cache_hits_total`, ...).
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.pods
            .iter()
            .map(|p| pod_metric(p.port, name).unwrap_or(0.0))
            .sum()
    }
}

/// One series of a pod's `/metrics` (labels ignored, first match).
pub fn pod_metric(port: u16, name: &str) -> Option<f64> {
    let reply = harness::get(&format!("http://127.0.0.1:{port}/metrics")).ok()?;
    reply.body.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            return None;
        }
        l.rsplit(' ').next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_names_round_trip() {
        for r in Router::ALL {
            assert_eq!(Router::parse(r.key()), Some(r));
            assert_eq!(serde_json::to_value(r).unwrap(), json!(r.key()));
        }
        assert_eq!(parse_routers("all").unwrap().len(), 12);
        assert_eq!(
            parse_routers("round-robin,filter").unwrap(),
            vec![Router::RoundRobin, Router::Filter]
        );
        assert!(parse_routers("filter,nope").is_err());
    }

    #[test]
    fn service_time_model() {
        let m = PodModel {
            slots: 4,
            prefill_us_per_token: 50.0,
            decode_us_per_token: 3000.0,
            kv_block_tokens: 16,
            kv_capacity_blocks: 3072,
            time_scale: 1.0,
            prefill_stalls_decode: false,
        };
        // 1000 uncached tokens: 50 ms; 32 output tokens: 31 x 3 ms.
        assert!((m.service_s(1000.0, 32.0) - 0.143).abs() < 1e-9);
        assert!(m.args().contains(&"--kv-capacity-blocks".to_string()));
    }
}
