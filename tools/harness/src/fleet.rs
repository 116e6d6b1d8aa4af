//! A fleet: podsim pods, Envoy replicas on rendered `envoy/*.yaml` and
//! optionally Redis, stopped when the [`Fleet`] drops. Beyond one Envoy on
//! its own pods: pods with custom flags, several Envoys sharing pods and
//! Redis, Envoy's PID (for CPU accounting), and sync settings patched into
//! the plugin JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    child_with_args, free_port, get, render_config, wait_until, Envoy, EnvoyOptions, Pod, Ports,
    Redis, TestDir,
};

/// One Envoy of the fleet.
pub struct Replica {
    pub name: String,
    pub envoy: Envoy,
    /// Envoy's process id (the `.venv` wrapper execs the real binary).
    pub pid: u32,
    pub ports: Ports,
}

impl Replica {
    /// `http://127.0.0.1:<listener>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.envoy.listener)
    }

    /// The filter's stats (`prefix_router.*`, without Envoy's `wasmcustom.`).
    pub fn stats(&self) -> BTreeMap<String, i64> {
        self.envoy.router_stats()
    }

    /// The filter's stats once every worker VM has flushed what it counted
    /// (the request path's stats reach Envoy on the worker's tick).
    pub fn settled_stats(&self) -> BTreeMap<String, i64> {
        self.envoy.settled_router_stats()
    }

    /// Sync cycles the replica finished (ok or failed), read with a narrow
    /// stats filter: the admin endpoint's cost lands on the Envoy measured.
    pub fn cycles_done(&self) -> i64 {
        self.envoy
            .stats_matching(r"^wasmcustom\.prefix_router\.sync\.cycles_(ok|failed)$")
            .values()
            .sum()
    }

    /// One filter stat, 0 when it does not exist yet.
    pub fn stat(&self, name: &str) -> i64 {
        self.envoy.router_stat(name)
    }

    /// Waits (polling every 20 ms, at most `timeout`) until stat `name`
    /// reaches `min`; returns whether it did.
    pub fn wait_stat(&self, name: &str, min: i64, timeout: Duration) -> bool {
        wait_until(timeout, || self.stat(name) >= min)
    }

    /// Cumulative quantiles (`(percent, value)`) of a filter histogram, as
    /// of Envoy's last stats flush (every 5 s); empty before the first.
    pub fn histogram(&self, name: &str) -> Vec<(f64, f64)> {
        let url = self
            .envoy
            .admin_url(&format!("/stats?format=json&filter={name}"));
        let Ok(reply) = get(&url) else {
            return Vec::new();
        };
        let json: Value = serde_json::from_str(&reply.body).unwrap_or_default();
        let mut out = Vec::new();
        for stat in json["stats"].as_array().into_iter().flatten() {
            let h = &stat["histograms"];
            let Some(quantiles) = h["supported_quantiles"].as_array() else {
                continue;
            };
            let computed = h["computed_quantiles"].as_array().into_iter().flatten();
            for q in computed.filter(|q| q["name"].as_str().is_some_and(|n| n.ends_with(name))) {
                for (p, v) in quantiles
                    .iter()
                    .zip(q["values"].as_array().into_iter().flatten())
                {
                    if let (Some(p), Some(v)) = (p.as_f64(), v["cumulative"].as_f64()) {
                        out.push((p, v));
                    }
                }
            }
        }
        out
    }
}

/// Running processes; fields drop in order: Envoys, pods, Redis, scratch dir.
pub struct Fleet {
    pub replicas: Vec<Replica>,
    pub pods: Vec<Pod>,
    pub redis: Option<Redis>,
    pub pod_ports: [u16; 4],
    pub redis_port: u16,
    pub dir: TestDir,
}

impl Fleet {
    /// A scratch dir and free ports for pods and Redis; nothing started yet.
    pub fn new(label: &str) -> Fleet {
        let pod_ports = [free_port(), free_port(), free_port(), free_port()];
        Fleet {
            replicas: Vec::new(),
            pods: Vec::new(),
            redis: None,
            pod_ports,
            redis_port: free_port(),
            dir: TestDir::new(label),
        }
    }

    /// Starts the four pods `pod-1`..`pod-4` with extra podsim flags.
    pub fn start_pods(&mut self, args: &[&str]) {
        for (i, &port) in self.pod_ports.iter().enumerate() {
            let pod = Pod::start_with(&self.dir, &format!("pod-{}", i + 1), port, args);
            self.pods.push(pod);
        }
    }

    /// Starts redis-server (no persistence) on the fleet's Redis port.
    pub fn start_redis(&mut self) {
        self.redis = Some(Redis::start(&self.dir, self.redis_port, None));
    }

    /// Starts an Envoy on `envoy/<template>` rendered onto the fleet's pods
    /// and Redis, with `patch` applied to every plugin JSON; returns its index.
    pub fn start_envoy(
        &mut self,
        name: &str,
        template: &str,
        concurrency: u32,
        patch: &mut dyn FnMut(&mut Value),
    ) -> usize {
        let redis = self.redis_port;
        self.start_envoy_via(name, template, concurrency, redis, &|yaml| yaml, patch)
    }

    /// [`Fleet::start_envoy`] with Envoy's Redis cluster on `redis_port`
    /// (e.g. a counting relay in front of the fleet's Redis) and `edit` applied to the rendered YAML (e.g. to point at an
    /// EDS file of the fleet's pods).
    pub fn start_envoy_via(
        &mut self,
        name: &str,
        template: &str,
        concurrency: u32,
        redis_port: u16,
        edit: &dyn Fn(String) -> String,
        patch: &mut dyn FnMut(&mut Value),
    ) -> usize {
        let ports = Ports {
            listener: free_port(),
            admin: free_port(),
            pods: self.pod_ports,
            redis_bridge: free_port(),
            redis: redis_port,
        };
        // The harness writes `<dir>/<template>`; keep one file per replica.
        let rendered = render_config(&self.dir, template, &ports, patch);
        let config = self.dir.join(&format!("{name}.yaml"));
        let text = std::fs::read_to_string(&rendered).expect("read rendered config");
        std::fs::write(&config, edit(text)).expect("write rendered config");
        // (A replica named like its template, `plain` on plain.yaml, is the
        // rendered file itself.)
        if rendered != config {
            let _ = std::fs::remove_file(&rendered);
        }
        let options = EnvoyOptions {
            concurrency,
            log_level: "warning",
        };
        let log = self.dir.join(&format!("{name}.log"));
        let envoy = Envoy::start(&config, &ports, log, &options).unwrap_or_else(|e| panic!("{e}"));
        let pid = child_with_args(&["--base-id", &ports.admin.to_string()])
            .unwrap_or_else(|| panic!("no child process of ours runs Envoy {name}"));
        self.replicas.push(Replica {
            name: name.to_string(),
            envoy,
            pid,
            ports,
        });
        self.replicas.len() - 1
    }

    /// Stops replica `i` (its Envoy exits; the others keep running).
    pub fn stop_envoy(&mut self, i: usize) {
        drop(self.replicas.remove(i));
    }

    /// Base URLs of every replica, in start order.
    pub fn base_urls(&self) -> Vec<String> {
        self.replicas.iter().map(Replica::base_url).collect()
    }
}

/// Settings of the `sync` object to patch into a plugin configuration.
#[derive(Clone, Copy, Debug)]
pub struct SyncPatch {
    pub period_ms: u64,
    pub write_through: bool,
    pub full_scan_every: u32,
    /// Change-log poll interval between cycles; None keeps the default.
    pub poll_ms: Option<u64>,
}

impl SyncPatch {
    /// A patch for [`Fleet::start_envoy`]: sets the sync fields present in
    /// every plugin JSON of `sync.yaml` (filter and singleton alike).
    pub fn apply(self, config: &mut Value) {
        let sync = &mut config["sync"];
        if sync.is_object() {
            sync["period_ms"] = json!(self.period_ms);
            sync["write_through"] = json!(self.write_through);
            sync["full_scan_every"] = json!(self.full_scan_every);
            if let Some(poll) = self.poll_ms {
                sync["poll_ms"] = json!(poll);
            }
        }
    }
}
