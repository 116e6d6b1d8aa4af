//! Envoys started together: [`launch`] (and [`launch_all`], in parallel) is
//! the one way the tests and the bench start an Envoy among several. Each is
//! rendered from `envoy/<template>` onto its own listener, admin and bridge
//! ports, in front of up to four backends on loopback (podsim pods, or
//! anything else: the config's unused pod endpoints are dropped) and a Redis,
//! with the plugin JSON patched; the files the config reads through
//! `path_config_source` (an EDS file, an LDS listener) are rendered alike.
//!
//! A [`Fleet`] owns such replicas with the four pods and the Redis they share,
//! and stops them when it drops.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use serde_json::{json, Value};

use crate::envoy::{Envoy, EnvoyOptions};
use crate::http::get;
use crate::paths::with_module_paths;
use crate::pod::Pod;
use crate::ports::{free_port, Ports};
use crate::process::{child_with_args, wait_until};
use crate::redis::Redis;
use crate::render::{envoy_template, patch_plugin_json, render_text, substitute_ports};
use crate::test_dir::TestDir;

/// An edit of every plugin configuration JSON of a config.
pub type Patch<'a> = Box<dyn FnMut(&mut Value) + Send + 'a>;

/// How to start one Envoy: built with [`EnvoySpec::new`] and its setters,
/// started by [`launch`].
pub struct EnvoySpec<'a> {
    name: String,
    template: String,
    options: EnvoyOptions,
    backends: Vec<u16>,
    redis: Option<u16>,
    patches: Vec<Patch<'a>>,
    plugins: Option<usize>,
    edits: Vec<(String, String)>,
}

impl<'a> EnvoySpec<'a> {
    /// Envoy `name` on `envoy/<template>` in front of `backends` (1 to 4
    /// ports on 127.0.0.1, in the order of the config's pods), with
    /// [`EnvoyOptions::default`] and Redis on a port nothing listens on.
    pub fn new(name: &str, template: &str, backends: &[u16]) -> EnvoySpec<'a> {
        EnvoySpec {
            name: name.to_string(),
            template: template.to_string(),
            options: EnvoyOptions::default(),
            backends: backends.to_vec(),
            redis: None,
            patches: Vec::new(),
            plugins: None,
            edits: Vec::new(),
        }
    }

    /// Envoy worker threads.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.options.concurrency = n;
        self
    }

    /// Envoy's log level (`info`, `warning`, ...).
    pub fn log_level(mut self, level: &'static str) -> Self {
        self.options.log_level = level;
        self
    }

    /// The Redis the config's `redis` cluster points at.
    pub fn redis(mut self, port: u16) -> Self {
        self.redis = Some(port);
        self
    }

    /// Applies `patch` to every plugin configuration (after the patches
    /// before it).
    pub fn patch(mut self, patch: impl FnMut(&mut Value) + Send + 'a) -> Self {
        self.patches.push(Box::new(patch));
        self
    }

    /// Merges `value` (recursively, see [`merge_json`]) into every plugin
    /// configuration.
    pub fn merge(self, value: Value) -> Self {
        self.patch(move |config| merge_json(config, &value))
    }

    /// Fails the launch unless the config has exactly `n` plugin
    /// configurations (e.g. 2 on `sync.yaml`: the filter and the singleton).
    pub fn plugins(mut self, n: usize) -> Self {
        self.plugins = Some(n);
        self
    }

    /// Replaces `from` by `to` in the rendered config (before the files it
    /// reads are rendered); the launch fails when `from` is not there.
    pub fn edit(mut self, from: &str, to: &str) -> Self {
        self.edits.push((from.to_string(), to.to_string()));
        self
    }

    /// Runs another build of the filter module (`module`) in place of
    /// this build's ([`crate::wasm_module`]), same configuration.
    pub fn module(self, module: &std::path::Path) -> Self {
        let this = crate::paths::wasm_module().display().to_string();
        self.edit(&this, &module.display().to_string())
    }
}

/// Merges `src` into `dst`: objects key by key, recursively; anything else
/// replaces what was there.
pub fn merge_json(dst: &mut Value, src: &Value) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                merge_json(d.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (d, s) => *d = s.clone(),
    }
}

/// The plugin patch of a sync period and more `sync` settings (e.g.
/// `{"write_through": true}`), for [`EnvoySpec::merge`]:
/// `{"sync": {"period_ms": period_ms, ...more}}`.
pub fn sync_patch(period_ms: u64, more: Value) -> Value {
    let mut sync = json!({ "period_ms": period_ms });
    merge_json(&mut sync, &more);
    json!({ "sync": sync })
}

/// Starts one Envoy as `spec` says, its files in `dir` (`<name>.envoy.yaml`,
/// `<name>.log`), and waits until it is live.
pub fn launch(dir: &TestDir, spec: EnvoySpec<'_>) -> Result<Replica, String> {
    let EnvoySpec {
        name,
        template,
        options,
        backends,
        redis,
        mut patches,
        plugins,
        edits,
    } = spec;
    if backends.is_empty() || backends.len() > 4 {
        return Err(format!(
            "Envoy {name}: configs take 1 to 4 backends, not {}",
            backends.len()
        ));
    }
    let mut pods = [0u16; 4];
    for (i, slot) in pods.iter_mut().enumerate() {
        *slot = backends.get(i).copied().unwrap_or_else(free_port);
    }
    let unused = &pods[backends.len()..];
    let endpoints: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let ports = Ports {
        listener: free_port(),
        admin: free_port(),
        pods,
        redis_bridge: free_port(),
        redis: redis.unwrap_or_else(free_port),
    };
    let patched = Cell::new(0);
    let mut plugin = |config: &mut Value| {
        if config.get("endpoints").is_some() {
            config["endpoints"] = json!(endpoints);
        }
        for patch in &mut patches {
            patch(config);
        }
        patched.set(patched.get() + 1);
    };
    let mut text = render_text(&template, &ports, &mut plugin);
    if let Some(n) = plugins.filter(|&n| n != patched.get()) {
        return Err(format!(
            "{template}: {} plugin configurations, not {n}",
            patched.get()
        ));
    }
    for (from, to) in &edits {
        if !text.contains(from.as_str()) {
            return Err(format!("{template} rendered has no {from:?}"));
        }
        text = text.replace(from.as_str(), to);
    }
    let text = drop_endpoints(&text, unused);
    let text = render_sources(&text, dir, &name, &ports, unused, &mut plugin)?;
    let config = dir.join(&format!("{name}.envoy.yaml"));
    std::fs::write(&config, text).map_err(|e| format!("write {}: {e}", config.display()))?;
    let log = dir.join(&format!("{name}.log"));
    let envoy =
        Envoy::start(&config, &ports, log, &options).map_err(|e| format!("Envoy {name}: {e}"))?;
    let pid = child_with_args(&["--base-id", &ports.admin.to_string()])
        .ok_or_else(|| format!("no child process of ours runs Envoy {name}"))?;
    Ok(Replica {
        name,
        envoy,
        pid,
        ports,
    })
}

/// [`launch`] of every spec at once (each Envoy takes about a second to
/// start); the replicas in the order of `specs`, or the first error (the
/// ones started are stopped).
pub fn launch_all(dir: &TestDir, specs: Vec<EnvoySpec<'_>>) -> Result<Vec<Replica>, String> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .into_iter()
            .map(|spec| scope.spawn(move || launch(dir, spec)))
            .collect();
        let results: Vec<Result<Replica, String>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("an Envoy launch panicked".into()))
            })
            .collect();
        results.into_iter().collect()
    })
}

/// Renders every file a config reads through `path_config_source` from
/// `envoy/` (eds.yaml's EDS file, lds.yaml's listener) as the config itself
/// is rendered (ports, module path, plugin JSON, unused endpoints dropped)
/// into `dir` as `<name>.<path with - for />`, and points the config at it.
fn render_sources(
    yaml: &str,
    dir: &TestDir,
    name: &str,
    ports: &Ports,
    unused: &[u16],
    plugin: &mut dyn FnMut(&mut Value),
) -> Result<String, String> {
    let mut out = yaml.to_string();
    for rel in config_sources(yaml) {
        let Some(file) = rel.strip_prefix("envoy/") else {
            continue;
        };
        let text = with_module_paths(&substitute_ports(&envoy_template(file), ports));
        let text = drop_endpoints(&patch_plugin_json(&text, plugin), unused);
        let path = dir.join(&format!("{name}.{}", file.replace('/', "-")));
        std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
        out = out.replace(
            &format!("path: {rel} "),
            &format!("path: {} ", path.display()),
        );
    }
    Ok(out)
}

/// The paths of `path_config_source: { path: <path> }` in a config.
pub fn config_sources(yaml: &str) -> Vec<String> {
    const KEY: &str = "path_config_source: { path: ";
    yaml.lines()
        .filter_map(|l| l.split_once(KEY))
        .filter_map(|(_, rest)| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Removes the cluster endpoint lines of the given ports from a rendered
/// Envoy config.
pub fn drop_endpoints(yaml: &str, ports: &[u16]) -> String {
    if ports.is_empty() {
        return yaml.to_string();
    }
    let mut out: String = yaml
        .lines()
        .filter(|l| {
            !(l.contains("- endpoint:")
                && ports
                    .iter()
                    .any(|p| l.contains(&format!("port_value: {p} "))))
        })
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}

/// Starts podsim pods `pod-1`, `pod-2`, ... on `ports`, with extra podsim
/// flags.
pub fn start_pods(dir: &TestDir, ports: &[u16], args: &[&str]) -> Vec<Pod> {
    ports
        .iter()
        .enumerate()
        .map(|(i, &port)| Pod::start_with(dir, &format!("pod-{}", i + 1), port, args))
        .collect()
}

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
        let pods = start_pods(&self.dir, &self.pod_ports, args);
        self.pods.extend(pods);
    }

    /// Starts redis-server (no persistence) on the fleet's Redis port.
    pub fn start_redis(&mut self) {
        self.redis = Some(Redis::start(&self.dir, self.redis_port, None));
    }

    /// A spec of an Envoy in front of the fleet's pods and Redis (log level
    /// `warning`), for [`Fleet::launch`].
    pub fn spec<'a>(&self, name: &str, template: &str) -> EnvoySpec<'a> {
        EnvoySpec::new(name, template, &self.pod_ports)
            .redis(self.redis_port)
            .log_level("warning")
    }

    /// Starts an Envoy as `spec` says; returns its index.
    pub fn launch(&mut self, spec: EnvoySpec<'_>) -> usize {
        let replica = launch(&self.dir, spec).unwrap_or_else(|e| panic!("{e}"));
        self.replicas.push(replica);
        self.replicas.len() - 1
    }

    /// Starts the Envoys of `specs` in parallel; returns their indices.
    pub fn launch_all(&mut self, specs: Vec<EnvoySpec<'_>>) -> Range<usize> {
        let start = self.replicas.len();
        let replicas = launch_all(&self.dir, specs).unwrap_or_else(|e| panic!("{e}"));
        self.replicas.extend(replicas);
        start..self.replicas.len()
    }

    /// An Envoy on `envoy/<template>` in front of the fleet's pods and
    /// Redis, with `patch` applied to every plugin JSON; returns its index.
    pub fn start_envoy(
        &mut self,
        name: &str,
        template: &str,
        concurrency: u32,
        patch: impl FnMut(&mut Value) + Send,
    ) -> usize {
        let spec = self
            .spec(name, template)
            .concurrency(concurrency)
            .patch(patch);
        self.launch(spec)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_endpoints_are_dropped() {
        let yaml = "a\n              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 4001 } } }\n              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 4002 } } }\nb: { port_value: 4002 }\n";
        let out = drop_endpoints(yaml, &[4002]);
        assert!(out.contains("port_value: 4001 "));
        assert_eq!(out.matches("- endpoint:").count(), 1);
        assert!(
            out.contains("b: { port_value: 4002 }"),
            "only endpoint lines go"
        );
        assert_eq!(drop_endpoints(yaml, &[]), yaml);
    }

    #[test]
    fn config_sources_are_found() {
        let yaml = "a: 1\n          path_config_source: { path: envoy/eds/pods.yaml }\nb: 2\n";
        assert_eq!(
            config_sources(yaml),
            vec!["envoy/eds/pods.yaml".to_string()]
        );
        assert!(config_sources("a: 1\n").is_empty());
        let eds = envoy_template("eds.yaml");
        assert_eq!(
            config_sources(&eds),
            vec!["envoy/eds/pods.yaml".to_string()]
        );
        let plain = envoy_template("plain-eds.yaml");
        assert_eq!(config_sources(&plain), config_sources(&eds));
    }

    #[test]
    fn sync_patch_merges_into_the_sync_object_and_keeps_the_rest() {
        let mut config = json!({"block_size": 128, "sync": {"enabled": true, "period_ms": 1}});
        let patch = sync_patch(500, json!({"write_through": true}));
        merge_json(&mut config, &patch);
        assert_eq!(
            config,
            json!({"block_size": 128, "sync": {"enabled": true, "period_ms": 500, "write_through": true}})
        );
    }
}
