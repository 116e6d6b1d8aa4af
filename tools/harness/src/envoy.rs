//! One Envoy process on a rendered config: started and waited for, its
//! admin stats and log, and requests through its listener.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{get, send, Reply, CLIENT_TIMEOUT};
use crate::paths::{envoy_bin, repo_root};
use crate::ports::Ports;
use crate::process::{port_accepts, spawn_owned, tail, wait_until, Owned, STARTUP_TIMEOUT};
use crate::prompts::completion_body;

/// How often a worker VM flushes the request path's stats to Envoy (its tick).
pub const STATS_FLUSH: Duration = Duration::from_millis(250);

/// Options for one Envoy instance.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    pub concurrency: u32,
    pub log_level: &'static str,
    /// `--drain-time-s`: how long a replaced listener drains (Envoy's
    /// default, 600 s, when None).
    pub drain_time_s: Option<u32>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            concurrency: 1,
            log_level: "info",
            drain_time_s: None,
        }
    }
}

/// A running Envoy.
pub struct Envoy {
    proc: Owned,
    pub listener: u16,
    pub admin: u16,
    pub log: PathBuf,
}

/// Envoy exited (or never became ready) during startup; `log` is its log.
#[derive(Debug)]
pub struct EnvoyStartError {
    pub reason: String,
    pub log: String,
}

impl std::fmt::Display for EnvoyStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n--- envoy log ---\n{}", self.reason, self.log)
    }
}

impl Envoy {
    /// Starts Envoy on a rendered config and waits until its admin `/ready`
    /// says LIVE and the listener accepts connections.
    pub fn start(
        config: &Path,
        ports: &Ports,
        log: PathBuf,
        options: &EnvoyOptions,
    ) -> Result<Envoy, EnvoyStartError> {
        let child = spawn_owned(
            Command::new(envoy_bin())
                .current_dir(repo_root())
                .arg("-c")
                .arg(config)
                .arg("--disable-hot-restart")
                .args(["--base-id", &ports.admin.to_string()])
                .args(["--concurrency", &options.concurrency.to_string()])
                .args(
                    options
                        .drain_time_s
                        .map(|s| ["--drain-time-s".to_string(), s.to_string()])
                        .into_iter()
                        .flatten(),
                )
                .args(["-l", options.log_level])
                .arg("--log-path")
                .arg(&log)
                // Tests read the log while Envoy runs: flush it often.
                .args(["--file-flush-interval-msec", "100"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .map_err(|e| EnvoyStartError {
            reason: format!("spawn {}: {e}", envoy_bin().display()),
            log: String::new(),
        })?;
        let mut envoy = Envoy {
            proc: Owned { child },
            listener: ports.listener,
            admin: ports.admin,
            log,
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = envoy.proc.exited() {
                return Err(EnvoyStartError {
                    reason: format!("envoy exited during startup: {status}"),
                    log: envoy.log_text(),
                });
            }
            let live = get(&envoy.admin_url("/ready"))
                .map(|r| r.status == 200 && r.body.trim() == "LIVE")
                .unwrap_or(false);
            if live && port_accepts(envoy.listener) {
                return Ok(envoy);
            }
            if Instant::now() >= deadline {
                return Err(EnvoyStartError {
                    reason: "envoy not ready in time".into(),
                    log: envoy.log_text(),
                });
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:<listener><path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.listener)
    }

    /// POSTs a completions `body` that the pod holds for `delay_ms` (podsim's
    /// `x-sim-delay-ms`), on a thread: the request stays in flight meanwhile.
    pub fn slow_completion(
        &self,
        body: String,
        delay_ms: u64,
    ) -> thread::JoinHandle<Result<Reply, String>> {
        let url = self.url("/v1/completions");
        thread::spawn(move || {
            let delay = delay_ms.to_string();
            let headers = [
                ("content-type", "application/json"),
                ("x-sim-delay-ms", delay.as_str()),
            ];
            send(
                "POST",
                &url,
                &headers,
                Some(body.as_bytes()),
                CLIENT_TIMEOUT,
            )
        })
    }

    /// POSTs a JSON body to `path` on a new connection, with `headers`
    /// after `content-type`; transport failures are errors.
    pub fn post_json(
        &self,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let url = self.url(path);
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        send("POST", &url, &all, Some(body.as_bytes()), CLIENT_TIMEOUT)
            .map_err(|e| format!("POST {url}: {e}"))
    }

    /// POSTs an OpenAI completions request for `prompt`.
    pub fn complete(&self, prompt: &Value) -> Result<Reply, String> {
        self.post_json("/v1/completions", &completion_body(prompt), &[])
    }

    /// `http://127.0.0.1:<admin><path>`
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Has the process exited?
    pub fn exited(&mut self) -> bool {
        self.proc.exited().is_some()
    }

    /// All counters and gauges whose name matches the admin regex `filter`
    /// (e.g. `^wasmcustom\.`), by full name.
    pub fn stats_matching(&self, filter: &str) -> BTreeMap<String, i64> {
        self.try_stats_matching(filter)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Envoy::stats_matching`], or why the admin gave none (never
    /// panics: the admin may be slow to answer while the main thread loads
    /// a module).
    pub fn try_stats_matching(&self, filter: &str) -> Result<BTreeMap<String, i64>, String> {
        let url = self.admin_url(&format!(
            "/stats?format=json&filter={}",
            percent_encode(filter)
        ));
        let reply = get(&url).map_err(|e| format!("GET {url}: {e}"))?;
        if reply.status != 200 {
            return Err(format!("GET {url}: {} {}", reply.status, reply.body));
        }
        let json: Value =
            serde_json::from_str(&reply.body).map_err(|e| format!("GET {url}: stats JSON: {e}"))?;
        let mut out = BTreeMap::new();
        for stat in json["stats"].as_array().into_iter().flatten() {
            if let (Some(name), Some(value)) = (stat["name"].as_str(), stat.get("value")) {
                let value = value
                    .as_i64()
                    .or_else(|| value.as_f64().map(|f| f as i64))
                    .unwrap_or(0);
                out.insert(name.to_string(), value);
            }
        }
        Ok(out)
    }

    /// The filter's counters and gauges that are not zero, one `name:
    /// value` line each, or None if the admin does not answer (never
    /// panics: it runs while a test fails).
    fn used_stats_text(&self) -> Option<String> {
        let stats = self
            .try_stats_matching(r"^wasmcustom\.prefix_router\.")
            .ok()?;
        let lines: Vec<String> = stats
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(k, v)| format!("{}: {v}", k.trim_start_matches("wasmcustom.")))
            .collect();
        Some(lines.join("\n"))
    }

    /// The filter's own stats (docs/CONTRACTS.md names), without Envoy's
    /// `wasmcustom.` prefix.
    pub fn router_stats(&self) -> BTreeMap<String, i64> {
        self.stats_matching(r"^wasmcustom\.prefix_router\.")
            .into_iter()
            .map(|(k, v)| (k.trim_start_matches("wasmcustom.").to_string(), v))
            .collect()
    }

    /// One filter stat by its contract name (`prefix_router.routed.no_match`);
    /// 0 when the stat does not exist yet.
    pub fn router_stat(&self, name: &str) -> i64 {
        self.router_stats().get(name).copied().unwrap_or(0)
    }

    /// The filter's stats once every worker VM has flushed what it counted
    /// so far: the request path's stats reach Envoy on the worker's tick
    /// ([`STATS_FLUSH`]), so a read right after traffic can miss the last
    /// tick's counts. Waits three ticks.
    pub fn settled_router_stats(&self) -> BTreeMap<String, i64> {
        thread::sleep(STATS_FLUSH * 3);
        self.router_stats()
    }

    /// One stat as [`Envoy::settled_router_stats`] reads it.
    pub fn settled_router_stat(&self, name: &str) -> i64 {
        self.settled_router_stats().get(name).copied().unwrap_or(0)
    }

    /// Waits (at most 5 s) until stat `name` reaches `min`; returns its
    /// value then (below `min` if it never did).
    pub fn router_stat_reaching(&self, name: &str, min: i64) -> i64 {
        self.router_stat_within(name, min, Duration::from_secs(5))
    }

    /// [`Envoy::router_stat_reaching`] with its own deadline.
    pub fn router_stat_within(&self, name: &str, min: i64, timeout: Duration) -> i64 {
        let mut last = 0;
        wait_until(timeout, || {
            last = self.router_stat(name);
            last >= min
        });
        last
    }

    /// The `prefix_router.inflight.*` gauges, keyed by the full stat name.
    pub fn inflight(&self) -> BTreeMap<String, i64> {
        self.router_stats()
            .into_iter()
            .filter(|(k, _)| k.starts_with("prefix_router.inflight."))
            .collect()
    }

    /// The in-flight gauge of the pod listening on `port`.
    pub fn inflight_of(&self, port: u16) -> i64 {
        self.router_stat(&inflight_stat_name(port))
    }
}

impl Drop for Envoy {
    /// Kills Envoy; in a failing test, first prints the filter's non-zero
    /// stats (as of the worker VMs' last tick) and then the log's tail, so
    /// a failure seen only in CI's output says what the filter counted.
    fn drop(&mut self) {
        let failing = thread::panicking();
        let stats = if failing {
            self.used_stats_text()
        } else {
            None
        };
        self.proc.kill();
        if failing {
            if let Some(stats) = stats {
                eprintln!(
                    "--- filter stats, non-zero (admin {}) ---\n{stats}\n--- end of stats ---",
                    self.admin
                );
            }
            eprintln!(
                "--- envoy log tail ({}) ---\n{}\n--- end of envoy log ---",
                self.log.display(),
                tail(&self.log, 60)
            );
        }
    }
}

/// Contract name of the in-flight gauge for pod `127.0.0.1:<port>`.
pub fn inflight_stat_name(port: u16) -> String {
    format!("prefix_router.inflight.127_0_0_1_{port}")
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
