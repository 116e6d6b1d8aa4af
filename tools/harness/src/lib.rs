//! The process harness shared by the integration tests (`tests/`) and
//! `prefix-bench`: free loopback ports, `envoy/*.yaml` rendered onto them,
//! Envoy / podsim / Redis child processes that are killed when dropped (and
//! when this process ends, see [`spawn_owned`]),
//! scripts run as a [`Service`], small HTTP and admin-stats clients, the one
//! launcher of Envoys started together and a [`fleet::Fleet`] of them sharing
//! pods and Redis ([`fleet`]), an independent RESP client ([`redis`]), a
//! local Redis Cluster ([`cluster`]) and the AIBrix oracle ([`aibrix`]).
//!
//! Binaries are found, in order, through an environment variable
//! (`ENVOY_BIN`, `PODSIM_BIN`, `PREFIX_ROUTER_WASM`, `REFERENCE_FILTER_WASM`,
//! `REDIS_SERVER_BIN`), then in the repository (`.venv/bin/envoy`,
//! `<target>/{release,debug}/podsim`, `<target>/wasm32-wasip1/release/*.wasm`),
//! then on `PATH`.
//! Building them is the Makefile's job (`make build`), not the tests'.

// Test tooling: a setup that fails (a process that does not start, a file
// that cannot be written) can only stop, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
pub mod aibrix;
pub mod cluster;
pub mod fleet;
pub mod redis;

/// Reserved placeholder port numbers used in `envoy/*.yaml` (docs/CONTRACTS.md).
pub const PLACEHOLDER_LISTENER: u16 = 18080;
pub const PLACEHOLDER_ADMIN: u16 = 18901;
pub const PLACEHOLDER_PODS: [u16; 4] = [18001, 18002, 18003, 18004];
pub const PLACEHOLDER_REDIS_BRIDGE: u16 = 18379;
pub const PLACEHOLDER_REDIS: u16 = 16379;

/// Module path as written in the Envoy configs (relative to the repo root).
pub const WASM_REL_PATH: &str = "target/wasm32-wasip1/release/envoy_prefix_router.wasm";
/// The benchmark's reference filter (tools/reffilter), as written in `envoy/reference.yaml`.
pub const REFERENCE_WASM_REL_PATH: &str = "target/wasm32-wasip1/release/reference_filter.wasm";

/// Nothing spawned here should outlive a test run, even if the test process is
/// killed before its destructors run: every child gets SIGTERM when this
/// process ends ([`spawn_owned`]), and podsim also exits by itself after this.
const POD_LIFETIME_SECS: u64 = 300;
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Paths and binaries
// ---------------------------------------------------------------------------

/// The repository root (two levels above this crate); Envoy runs with this
/// as its working directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Cargo's target directory as the Makefile uses it (`CARGO_TARGET_DIR` or `target/`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        None => repo_root().join("target"),
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn locate(env_var: &str, candidates: &[PathBuf], on_path: Option<&str>, hint: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return PathBuf::from(path);
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return found.clone();
    }
    if let Some(found) = on_path.and_then(find_on_path) {
        return found;
    }
    panic!("{env_var} not set and none of {candidates:?} exists: {hint}");
}

/// The Envoy binary (`ENVOY_BIN`, `.venv/bin/envoy`, or `envoy` on `PATH`).
pub fn envoy_bin() -> PathBuf {
    locate(
        "ENVOY_BIN",
        &[repo_root().join(".venv/bin/envoy")],
        Some("envoy"),
        "run `make setup`",
    )
}

/// The simulated inference pod (`PODSIM_BIN`, release build, then debug build).
pub fn podsim_bin() -> PathBuf {
    let target = target_dir();
    locate(
        "PODSIM_BIN",
        &[target.join("release/podsim"), target.join("debug/podsim")],
        None,
        "run `make build`",
    )
}

/// The filter module (`PREFIX_ROUTER_WASM` or the release build under the target dir).
pub fn wasm_module() -> PathBuf {
    let default = target_dir().join("wasm32-wasip1/release/envoy_prefix_router.wasm");
    locate("PREFIX_ROUTER_WASM", &[default], None, "run `make build`")
}

/// The reference filter module (`REFERENCE_FILTER_WASM` or the release build under the target dir).
pub fn reference_wasm_module() -> PathBuf {
    let default = target_dir().join("wasm32-wasip1/release/reference_filter.wasm");
    locate(
        "REFERENCE_FILTER_WASM",
        &[default],
        None,
        "run `make build`",
    )
}

/// `text` with the module paths of the shipped configs made absolute (the
/// target dir may be elsewhere than `target/`).
pub fn with_module_paths(text: &str) -> String {
    let mut text = text.to_string();
    if text.contains(WASM_REL_PATH) {
        text = text.replace(WASM_REL_PATH, &wasm_module().display().to_string());
    }
    if text.contains(REFERENCE_WASM_REL_PATH) {
        text = text.replace(
            REFERENCE_WASM_REL_PATH,
            &reference_wasm_module().display().to_string(),
        );
    }
    text
}

/// The Python of the repository's virtualenv (`.venv/bin/python`), with
/// the packages `make setup` installs (the deploy schema checker, ORAS).
pub fn python_bin() -> PathBuf {
    repo_root().join(".venv/bin/python")
}

/// `redis-server` (`REDIS_SERVER_BIN` or `PATH`).
pub fn redis_server_bin() -> PathBuf {
    locate(
        "REDIS_SERVER_BIN",
        &[],
        Some("redis-server"),
        "run `make setup`",
    )
}

// ---------------------------------------------------------------------------
// Ports and scratch directories
// ---------------------------------------------------------------------------

static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
/// [`free_port`]'s random state (0: not seeded yet).
static PORT_RNG: Mutex<u64> = Mutex::new(0);

/// A loopback port that was free a moment ago and that this process has not
/// handed out before (tests in one binary run in parallel).
///
/// Picked at random below the kernel's ephemeral range when that leaves
/// room (`listen_range`): a port from that range (`bind` to port 0) can
/// be taken, between this call and its server's `bind`, by any outgoing
/// connection on the machine (an Envoy's to its pods), and the server
/// then fails to start.
pub fn free_port() -> u16 {
    let range = listen_range();
    for _ in 0..1_000 {
        let port = match range {
            Some((low, high)) => low + (next_random() % u64::from(high - low)) as u16,
            None => {
                let listener =
                    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
                listener.local_addr().expect("local_addr").port()
            }
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return port;
        }
    }
    panic!("no free loopback port after 1000 tries");
}

/// The ports [`free_port`] picks from: 10000 up to the start of the
/// kernel's ephemeral range (`ip_local_port_range`), if that starts above
/// 12000; else None (ports come from `bind` to port 0).
fn listen_range() -> Option<(u16, u16)> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = text.split_whitespace().next()?.parse().ok()?;
    (low > 12_000).then_some((10_000, low))
}

/// The next of a xorshift sequence seeded by the process id and the time
/// (processes started together are unlikely to pick the same ports; each
/// process keeps only its own from repeating, [`HANDED_OUT`]).
fn next_random() -> u64 {
    let mut state = PORT_RNG.lock().unwrap_or_else(|e| e.into_inner());
    if *state == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        *state = (u64::from(std::process::id()) << 32 ^ nanos) | 1;
    }
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// The ports one Envoy instance and its pods use in a test.
#[derive(Clone, Debug)]
pub struct Ports {
    pub listener: u16,
    pub admin: u16,
    pub pods: [u16; 4],
    pub redis_bridge: u16,
    pub redis: u16,
}

impl Ports {
    /// A fresh free port for every placeholder.
    pub fn free() -> Ports {
        Ports {
            listener: free_port(),
            admin: free_port(),
            pods: [free_port(), free_port(), free_port(), free_port()],
            redis_bridge: free_port(),
            redis: free_port(),
        }
    }

    fn substitution(&self, placeholder: u16) -> Option<u16> {
        match placeholder {
            PLACEHOLDER_LISTENER => Some(self.listener),
            PLACEHOLDER_ADMIN => Some(self.admin),
            PLACEHOLDER_REDIS_BRIDGE => Some(self.redis_bridge),
            PLACEHOLDER_REDIS => Some(self.redis),
            p => PLACEHOLDER_PODS
                .iter()
                .position(|&q| q == p)
                .map(|i| self.pods[i]),
        }
    }
}

static DIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A scratch directory for one test: configs, logs, ready files. Removed on
/// drop unless the test is failing, so the logs stay for a look.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(label: &str) -> TestDir {
        let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("epr-{label}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create test dir");
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("test files kept in {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------
// Rendering envoy/*.yaml
// ---------------------------------------------------------------------------

/// Reads `envoy/<name>` from the repository.
pub fn envoy_template(name: &str) -> String {
    let path = repo_root().join("envoy").join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Replaces every whole number in `text` that is a placeholder port by its
/// test port, in one pass (so a substituted port is never rewritten again).
pub fn substitute_ports(text: &str, ports: &Ports) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let run = &text[start..i];
            match run.parse::<u16>().ok().and_then(|p| ports.substitution(p)) {
                Some(port) => out.push_str(&port.to_string()),
                None => out.push_str(run),
            }
        } else {
            let ch = text[i..].chars().next().expect("char boundary");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Applies `patch` to the plugin configuration JSON of every wasm plugin in an
/// Envoy config: the block scalar that follows a `value: |` line and parses as
/// a JSON object. The JSON is written back pretty-printed at the same indent.
pub fn patch_plugin_json(yaml: &str, patch: &mut dyn FnMut(&mut Value)) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push(line.to_string());
        i += 1;
        if line.trim_end().ends_with("value: |") {
            let key_indent = indent_of(line);
            let start = i;
            while i < lines.len()
                && (lines[i].trim().is_empty() || indent_of(lines[i]) > key_indent)
            {
                i += 1;
            }
            let block = &lines[start..i];
            let body_indent = block
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| indent_of(l))
                .min()
                .unwrap_or(key_indent + 2);
            let json: String = block
                .iter()
                .map(|l| l.get(body_indent..).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            match serde_json::from_str::<Value>(&json) {
                Ok(mut value) if value.is_object() => {
                    patch(&mut value);
                    let pretty = serde_json::to_string_pretty(&value).expect("serialize JSON");
                    let pad = " ".repeat(body_indent);
                    out.extend(pretty.lines().map(|l| format!("{pad}{l}")));
                }
                _ => out.extend(block.iter().map(|l| l.to_string())),
            }
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `envoy/<name>` with its placeholder ports replaced, the wasm module
/// paths made absolute (so a custom target dir works) and the plugin JSON
/// patched.
pub fn render_text(name: &str, ports: &Ports, patch: &mut dyn FnMut(&mut Value)) -> String {
    let text = with_module_paths(&substitute_ports(&envoy_template(name), ports));
    patch_plugin_json(&text, patch)
}

/// [`render_text`] written to `dir`; returns the path of the written file.
pub fn render_config(
    dir: &TestDir,
    name: &str,
    ports: &Ports,
    patch: &mut dyn FnMut(&mut Value),
) -> PathBuf {
    let text = render_text(name, ports, patch);
    let path = dir.join(name);
    fs::write(&path, text).expect("write rendered envoy config");
    path
}

// ---------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------

/// PIDs of this process's direct children (from `/proc`).
pub fn children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat_fields(pid).is_some_and(|f| f.get(1) == Some(&me)))
        .collect()
}

/// Fields of `/proc/<pid>/stat` after the command name, which may contain
/// spaces: `[0]` is the state, `[1]` the parent PID, `[11]`/`[12]` utime/stime.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// The child of ours whose command line contains `args` in a row (e.g.
/// Envoy behind the `.venv` wrapper, found by its `--base-id`).
pub fn child_with_args(args: &[&str]) -> Option<u32> {
    children().into_iter().find(|pid| {
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        argv.windows(args.len())
            .any(|w| w.iter().zip(args).all(|(a, b)| *a == b.as_bytes()))
    })
}

/// One endpoint of an EDS file: its hostname (the pod name), its port on
/// 127.0.0.1 and Envoy's health status for it (`HEALTHY`, `UNHEALTHY`, ...).
pub type EdsHost = (String, u16, &'static str);

/// Writes the `pods` cluster's EDS file by rename (Envoy's file watch
/// follows moves, and never sees a half-written file).
pub fn write_eds(path: &Path, hosts: &[EdsHost]) {
    let endpoints: Vec<_> = hosts
        .iter()
        .map(|(name, port, health)| {
            serde_json::json!({
                "endpoint": {
                    "hostname": name,
                    "address": { "socket_address": { "address": "127.0.0.1", "port_value": port } }
                },
                "health_status": health
            })
        })
        .collect();
    let doc = serde_json::json!({
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": "pods",
            "endpoints": [{ "lb_endpoints": endpoints }]
        }]
    });
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_string_pretty(&doc).expect("EDS json")).expect("write EDS");
    fs::rename(&tmp, path).expect("rename EDS");
}

/// How often a worker VM flushes the request path's stats to Envoy (its tick).
pub const STATS_FLUSH: Duration = Duration::from_millis(250);

pub fn wait_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(25));
    }
}

fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The last `n` lines of a file, for failure messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `cmd` to its end and returns its stdout; panics, with its stdout
/// and stderr, when it cannot start or exits unsuccessfully.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e} (make setup installs it)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Spawns `cmd` (taken: what is left in its place runs `true`) so that the child cannot
/// outlive this process, however the process ends: killed before its
/// destructors run, too. The kernel sends the child SIGTERM when the
/// *thread* that forked it exits (`PR_SET_PDEATHSIG`, kept across `exec`:
/// the `.venv` Envoy wrapper and the peer scripts exec their server), so
/// every child is forked by one thread that lives as long as the process
/// (tests and launches run on threads that end before their children do).
pub fn spawn_owned(cmd: &mut Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    let mut cmd = std::mem::replace(cmd, Command::new("true"));
    let parent = std::process::id();
    // SAFETY: between fork and exec the closure makes two async-signal-safe
    // calls (prctl, getppid) and allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent ended before the signal was armed.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let spawner = SPAWNER
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            thread::Builder::new()
                .name("harness-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .expect("spawn the harness's spawner thread");
            tx
        })
        .clone();
    let (reply, child) = mpsc::channel();
    let gone = || std::io::Error::other("the harness's spawner thread is gone");
    spawner.send((cmd, reply)).map_err(|_| gone())?;
    child.recv().map_err(|_| gone())?
}

/// A child process killed (by its own PID) and reaped on drop.
struct Owned {
    child: Child,
}

impl Owned {
    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A long-running child started by a script (a peer router, a model
/// server), its output in a log file, stopped when dropped: SIGTERM by its
/// PID, up to 10 s to exit, then SIGKILL (the scripts exec the server, so the
/// child's PID is the server's).
pub struct Service {
    child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Service {
    /// Spawns `cmd` (stdin closed, stdout and stderr to `log`) and polls
    /// `ready` every 50 ms until it holds; an error, with the log's tail,
    /// when the child exits first or `timeout` passes.
    pub fn start(
        name: &str,
        cmd: &mut Command,
        log: PathBuf,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<Service, String> {
        let out = fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = spawn_owned(cmd.stdin(Stdio::null()).stdout(out).stderr(err))
            .map_err(|e| format!("spawn {name}: {e}"))?;
        let mut service = Service {
            child,
            name: name.to_string(),
            log,
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = service.child.try_wait() {
                return Err(format!(
                    "{name} exited during startup ({status}):\n{}",
                    tail(&service.log, 20)
                ));
            }
            if ready() {
                return Ok(service);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{name} not ready in {} s:\n{}",
                    timeout.as_secs(),
                    tail(&service.log, 20)
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the child (see [`Service`]); dropping does it too.
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(25));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Options for one Envoy instance.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    pub concurrency: u32,
    pub log_level: &'static str,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            concurrency: 1,
            log_level: "info",
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
    /// panics).
    fn try_stats_matching(&self, filter: &str) -> Result<BTreeMap<String, i64>, String> {
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

/// A running simulated inference pod.
pub struct Pod {
    proc: Owned,
    pub name: String,
    pub port: u16,
}

impl Pod {
    /// Starts podsim on `port` with zero simulated compute time and waits for
    /// its ready file.
    pub fn start(dir: &TestDir, name: &str, port: u16) -> Pod {
        Pod::start_with(dir, name, port, &["--time-scale", "0"])
    }

    /// Starts podsim with extra arguments (e.g. a non-zero `--time-scale`).
    pub fn start_with(dir: &TestDir, name: &str, port: u16, extra: &[&str]) -> Pod {
        let ready = dir.join(&format!("{name}.ready"));
        let log = fs::File::create(dir.join(&format!("{name}.log"))).expect("pod log file");
        let log_err = log.try_clone().expect("clone log file");
        let child = spawn_owned(
            Command::new(podsim_bin())
                .args(["--port", &port.to_string(), "--name", name])
                .arg("--ready-file")
                .arg(&ready)
                .args(["--exit-after-secs", &POD_LIFETIME_SECS.to_string()])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err),
        )
        .unwrap_or_else(|e| panic!("spawn {}: {e}", podsim_bin().display()));
        let mut pod = Pod {
            proc: Owned { child },
            name: name.to_string(),
            port,
        };
        let up = wait_until(STARTUP_TIMEOUT, || {
            pod.proc.exited().is_some() || (ready.exists() && port_accepts(port))
        });
        if let Some(status) = pod.proc.exited() {
            panic!(
                "podsim {name} exited during startup ({status}):\n{}",
                tail(&dir.join(&format!("{name}.log")), 30)
            );
        }
        assert!(up, "podsim {name} not ready on port {port} in time");
        pod
    }

    /// Kills the pod now (e.g. to cause upstream errors mid-request).
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// A running `redis-server` with no persistence.
pub struct Redis {
    proc: Owned,
    pub port: u16,
    pub password: Option<String>,
}

impl Redis {
    pub fn start(dir: &TestDir, port: u16, password: Option<&str>) -> Redis {
        Redis::start_with(dir, port, password, &[])
    }

    /// [`Redis::start`] with more redis-server arguments (e.g. a TLS port);
    /// ready when `port` answers PING.
    pub fn start_with(dir: &TestDir, port: u16, password: Option<&str>, extra: &[&str]) -> Redis {
        let mut cmd = Command::new(redis_server_bin());
        cmd.current_dir(dir.path())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--logfile", "redis.log"]);
        if let Some(pw) = password {
            cmd.args(["--requirepass", pw]);
        }
        cmd.args(extra);
        let child = spawn_owned(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .unwrap_or_else(|e| panic!("spawn {}: {e}", redis_server_bin().display()));
        let mut redis = Redis {
            proc: Owned { child },
            port,
            password: password.map(str::to_string),
        };
        let up = wait_until(STARTUP_TIMEOUT, || {
            redis.proc.exited().is_some()
                || redis
                    .command(&["PING"])
                    .is_ok_and(|r| r == redis::Resp::Simple("PONG".into()))
        });
        assert!(
            up && redis.proc.exited().is_none(),
            "redis-server not ready on port {port}:\n{}",
            tail(&dir.join("redis.log"), 30)
        );
        redis
    }

    /// Sends one command (after AUTH when a password is set) on a
    /// connection of its own and returns its reply.
    pub fn command(&self, args: &[&str]) -> std::io::Result<redis::Resp> {
        let mut conn = redis::Conn::open(self.port, self.password.as_deref())?;
        Ok(conn.send(&[redis::text_cmd(args)])?.remove(0))
    }

    /// Keys in the database (`DBSIZE`); 0 while the server does not answer.
    pub fn dbsize(&self) -> i64 {
        self.command(&["DBSIZE"]).map(|r| r.int()).unwrap_or(0)
    }

    /// Kills the server now (e.g. to test sync when Redis goes away).
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// A TCP proxy in front of a server (Redis, Envoy's admin) that can be told to misbehave:
/// hold every chunk of the server's replies for a while (slower than the
/// sync's call timeout), answer garbage instead of forwarding (open
/// connections are closed when garbage is turned on), or close both
/// directions when the client half-closes, as some middleboxes do (what the
/// server had not answered by then is lost). Its threads end with the test
/// process; connections end when either side closes.
pub struct FaultProxy {
    pub port: u16,
    /// Milliseconds each server -> client chunk is held (0 = none).
    delay_ms: std::sync::Arc<AtomicU32>,
    /// Close both directions on the client's half-close (1) instead of
    /// passing it on (0).
    close_on_half_close: std::sync::Arc<AtomicU32>,
    /// When set, the server is never reached: each connection gets this
    /// reply once, then is closed.
    garbage: std::sync::Arc<Mutex<Option<Vec<u8>>>>,
}

impl FaultProxy {
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind fault proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let delay_ms = std::sync::Arc::new(AtomicU32::new(0));
        let close_on_half_close = std::sync::Arc::new(AtomicU32::new(0));
        let garbage = std::sync::Arc::new(Mutex::new(None::<Vec<u8>>));
        let (d, c, g) = (
            delay_ms.clone(),
            close_on_half_close.clone(),
            garbage.clone(),
        );
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (d, c, g) = (d.clone(), c.clone(), g.clone());
                let close = c.load(Ordering::SeqCst) != 0;
                thread::spawn(move || proxy_one(client, upstream, &d, close, &g));
            }
        });
        FaultProxy {
            port,
            delay_ms,
            close_on_half_close,
            garbage,
        }
    }

    /// New connections close both directions on the client's half-close.
    pub fn set_close_on_half_close(&self, on: bool) {
        self.close_on_half_close
            .store(u32::from(on), Ordering::SeqCst);
    }

    pub fn set_delay(&self, delay: Duration) {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn set_garbage(&self, reply: Option<&[u8]>) {
        *self.garbage.lock().expect("garbage lock") = reply.map(<[u8]>::to_vec);
    }
}

fn proxy_one(
    mut client: TcpStream,
    upstream: u16,
    delay: &AtomicU32,
    close_on_half_close: bool,
    garbage: &Mutex<Option<Vec<u8>>>,
) {
    let junk = garbage.lock().map(|g| g.clone()).unwrap_or(None);
    if let Some(junk) = junk {
        let mut buf = [0u8; 4096];
        let _ = client.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = client.read(&mut buf);
        let _ = client.write_all(&junk);
        return;
    }
    let Ok(mut server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream)) else {
        return;
    };
    let (Ok(mut client_w), Ok(mut server_r)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    // client -> server, passing the half-close on as the bridge does (or
    // closing everything, the middlebox that does not).
    let closed = std::sync::Arc::new(AtomicU32::new(0));
    let closed_up = closed.clone();
    let up = thread::spawn(move || {
        let _ = std::io::copy(&mut client, &mut server);
        if close_on_half_close {
            closed_up.store(1, Ordering::SeqCst);
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
        } else {
            let _ = server.shutdown(std::net::Shutdown::Write);
        }
    });
    let mut buf = [0u8; 16 * 1024];
    // Poll so that turning garbage on also ends pooled connections.
    let _ = server_r.set_read_timeout(Some(Duration::from_millis(100)));
    loop {
        match server_r.read(&mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if garbage.lock().map(|g| g.is_some()).unwrap_or(false) {
                    break;
                }
            }
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let ms = delay.load(Ordering::SeqCst);
                if ms > 0 {
                    thread::sleep(Duration::from_millis(u64::from(ms)));
                }
                if closed.load(Ordering::SeqCst) != 0 || client_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = client_w.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}

// ---------------------------------------------------------------------------
// A whole setup: pods + Envoy
// ---------------------------------------------------------------------------

/// An edit of the plugin configuration JSON.
pub type PluginPatch = Box<dyn FnMut(&mut Value)>;

/// An edit of the rendered YAML text, given the ports it was rendered on.
type ConfigEdit = Box<dyn FnOnce(String, &Ports) -> String>;

/// Builds a test setup: four podsim pods (named `pod-1`..`pod-4`) on the
/// ports of the config's four endpoints, and Envoy on a rendered config.
pub struct Setup {
    config: &'static str,
    options: EnvoyOptions,
    patches: Vec<PluginPatch>,
    edits: Vec<ConfigEdit>,
    /// Extra podsim arguments for every pod.
    pod_args: Vec<&'static str>,
}

/// A running setup. Fields drop in order: Envoy first, then the pods.
pub struct Running {
    pub envoy: Envoy,
    pub pods: Vec<Pod>,
    pub ports: Ports,
    pub dir: TestDir,
}

impl Setup {
    /// A setup on `envoy/<config>`.
    pub fn new(config: &'static str) -> Setup {
        Setup {
            config,
            options: EnvoyOptions::default(),
            patches: Vec::new(),
            edits: Vec::new(),
            pod_args: Vec::new(),
        }
    }

    /// podsim arguments for every pod, in place of [`Pod::start`]'s
    /// (`--time-scale 0`), e.g. a small KV cache.
    pub fn pod_args(mut self, args: &[&'static str]) -> Setup {
        self.pod_args.extend_from_slice(args);
        self
    }

    /// Envoy worker threads (`--concurrency`).
    pub fn concurrency(mut self, n: u32) -> Setup {
        self.options.concurrency = n;
        self
    }

    /// Patches the plugin configuration JSON before Envoy starts (patches
    /// apply in the order given).
    pub fn patch(mut self, patch: impl FnMut(&mut Value) + 'static) -> Setup {
        self.patches.push(Box::new(patch));
        self
    }

    /// Sets one top-level field of the plugin configuration.
    pub fn plugin_field(self, key: &'static str, value: Value) -> Setup {
        self.patch(move |config| {
            config[key] = value.clone();
        })
    }

    /// Edits the rendered YAML text (after ports and plugin JSON), e.g. a
    /// shorter route timeout. Panics if the edit changed nothing.
    pub fn edit_yaml(mut self, from: &'static str, to: &'static str) -> Setup {
        self.edits.push(Box::new(move |text: String, _: &Ports| {
            assert!(text.contains(from), "config has no {from:?} to edit");
            text.replace(from, to)
        }));
        self
    }

    /// Edits the rendered YAML text with `edit`, which also gets the ports
    /// (after ports and plugin JSON), e.g. a bootstrap service taken out.
    /// Panics if the edit changed nothing.
    pub fn edit(mut self, edit: impl FnOnce(String, &Ports) -> String + 'static) -> Setup {
        self.edits
            .push(Box::new(move |text: String, ports: &Ports| {
                let edited = edit(text.clone(), ports);
                assert_ne!(edited, text, "the edit changed nothing");
                edited
            }));
        self
    }

    /// Loads `module` in place of the filter's release build (e.g. the
    /// fault-injection build).
    pub fn module(mut self, module: PathBuf) -> Setup {
        self.edits.push(Box::new(move |text: String, _: &Ports| {
            let from = wasm_module().display().to_string();
            assert!(text.contains(&from), "config loads no {from}");
            text.replace(&from, &module.display().to_string())
        }));
        self
    }

    /// Renders the config into a scratch dir; Envoy is not started.
    pub fn render(mut self) -> (TestDir, Ports, PathBuf) {
        let dir = TestDir::new(self.config.trim_end_matches(".yaml"));
        let ports = Ports::free();
        let mut patches = std::mem::take(&mut self.patches);
        let path = render_config(&dir, self.config, &ports, &mut |config: &mut Value| {
            for patch in patches.iter_mut() {
                patch(config);
            }
        });
        if !self.edits.is_empty() {
            let mut text = fs::read_to_string(&path).expect("read rendered config");
            for edit in self.edits.drain(..) {
                text = edit(text, &ports);
            }
            fs::write(&path, text).expect("write edited config");
        }
        (dir, ports, path)
    }

    /// Starts Envoy alone (no pods); for tests that expect startup to fail.
    pub fn start_envoy_only(self) -> (TestDir, Result<Envoy, EnvoyStartError>) {
        let options = self.options.clone();
        let (dir, ports, path) = self.render();
        let envoy = Envoy::start(&path, &ports, dir.join("envoy.log"), &options);
        (dir, envoy)
    }

    /// Starts the four pods, then Envoy; panics (with Envoy's log) on failure.
    pub fn start(self) -> Running {
        let options = self.options.clone();
        let pod_args = self.pod_args.clone();
        let (dir, ports, path) = self.render();
        Running::start(dir, ports, &path, &options, &pod_args)
    }
}

impl Running {
    /// Starts four pods (`pod-1`..`pod-4`, with `pod_args` in place of
    /// [`Pod::start`]'s when given) on `ports.pods`, then Envoy on the
    /// rendered config at `config`, its log in `dir`; panics (with Envoy's
    /// log) on failure.
    pub fn start(
        dir: TestDir,
        ports: Ports,
        config: &Path,
        options: &EnvoyOptions,
        pod_args: &[&str],
    ) -> Running {
        let pods = ports
            .pods
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let name = format!("pod-{}", i + 1);
                if pod_args.is_empty() {
                    Pod::start(&dir, &name, port)
                } else {
                    Pod::start_with(&dir, &name, port, pod_args)
                }
            })
            .collect();
        let envoy = Envoy::start(config, &ports, dir.join("envoy.log"), options)
            .unwrap_or_else(|e| panic!("{e}"));
        Running {
            envoy,
            pods,
            ports,
            dir,
        }
    }

    /// The pod that answered as `name`.
    pub fn pod_named(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod named {name:?}"))
    }

    /// POSTs a JSON body to `path` through Envoy on a new connection.
    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.post_with(path, body, &[])
    }

    /// Like [`Running::post`] with extra request headers.
    pub fn post_with(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        self.envoy
            .post_json(path, body, headers)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// POSTs an OpenAI completions request.
    pub fn complete(&self, prompt: &Value) -> Reply {
        self.post("/v1/completions", &completion_body(prompt))
    }

    /// POSTs an OpenAI chat completions request.
    pub fn chat(&self, messages: &[(&str, &str)]) -> Reply {
        self.post("/v1/chat/completions", &chat_body(messages))
    }

    /// Waits (bounded) until every in-flight gauge reads 0; returns the gauges.
    pub fn wait_inflight_zero(&self, timeout: Duration) -> BTreeMap<String, i64> {
        let mut last = BTreeMap::new();
        wait_until(timeout, || {
            last = self.envoy.inflight();
            last.values().all(|&v| v == 0)
        });
        last
    }
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// Generous: the tests assert outcomes, never latencies.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A response of any status.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The pod that answered (`x-served-by`).
    pub fn served_by(&self) -> String {
        self.header("x-served-by")
            .unwrap_or_else(|| panic!("no x-served-by header: {self:?}"))
            .to_string()
    }

    /// The prompt tokens the pod reported cached
    /// (`usage.prompt_tokens_details.cached_tokens` of a non-streamed answer).
    pub fn cached_tokens(&self) -> u64 {
        let v: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("answer not JSON ({e}): {}", self.body));
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens in {}", self.body))
    }

    /// The filter's match percent (`x-prefix-match`, the header the configs set).
    pub fn match_percent(&self) -> u32 {
        let raw = self
            .header("x-prefix-match")
            .unwrap_or_else(|| panic!("no x-prefix-match header: {self:?}"));
        raw.trim()
            .parse()
            .unwrap_or_else(|_| panic!("x-prefix-match not an integer: {raw:?}"))
    }

    /// Asserts a 200 from a pod and returns the pod's name.
    pub fn expect_pod(&self) -> String {
        assert_eq!(self.status, 200, "expected 200 from a pod, got {self:?}");
        self.served_by()
    }
}

/// Sends one request on a new connection. 4xx/5xx are replies, not errors;
/// transport failures (refused, reset, timeout) are errors.
pub fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Reply, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(timeout)
        .max_idle_connections(0)
        .build();
    let mut request = agent.request(method, url);
    for (k, v) in headers {
        request = request.set(k, v);
    }
    let result = match body {
        Some(bytes) => request.send_bytes(bytes),
        None => request.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(t)) => return Err(t.to_string()),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .filter_map(|name| {
            let value = response.header(&name)?.to_string();
            Some((name.to_ascii_lowercase(), value))
        })
        .collect();
    let mut body = String::new();
    response
        .into_reader()
        .read_to_string(&mut body)
        .map_err(|e| format!("read body: {e}"))?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// GET with the default timeout.
pub fn get(url: &str) -> Result<Reply, String> {
    send("GET", url, &[], None, Duration::from_secs(5))
}

// ---------------------------------------------------------------------------
// Request bodies and prompt text
// ---------------------------------------------------------------------------

/// A completions request body for any prompt shape (string, list, token ids).
pub fn completion_body(prompt: &Value) -> String {
    serde_json::json!({ "model": "test-model", "prompt": prompt, "max_tokens": 8 }).to_string()
}

/// A chat completions request body from (role, content) turns.
pub fn chat_body(messages: &[(&str, &str)]) -> String {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({ "role": role, "content": content }))
        .collect();
    serde_json::json!({ "model": "test-model", "messages": messages, "max_tokens": 8 }).to_string()
}

/// Deterministic filler text of exactly `len` bytes; different seeds differ
/// from the first word on.
pub fn text(seed: u64, len: usize) -> String {
    const WORDS: &[&str] = &[
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra",
        "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = format!("[{seed}] ");
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
        out.push(' ');
    }
    out.truncate(len);
    out
}

/// `n` prompts sharing a 4 KiB prefix (`text(seed, 4096)`), each ending in
/// a 300-byte question of its own (`text(seed * 100 + i, 300)`).
pub fn shared_prefix_prompts(seed: u64, n: u64) -> Vec<String> {
    let prefix = text(seed, 4096);
    (0..n)
        .map(|i| format!("{prefix}{}", text(seed * 100 + i, 300)))
        .collect()
}

/// Asserts that `pods` (the pods that answered a shared prefix's requests)
/// are one pod, named at least once: the prefix stuck. `what` names the
/// setup in the failure message.
pub fn assert_one_pod(pods: &[String], what: &str) {
    assert!(
        pods.first()
            .is_some_and(|first| pods.iter().all(|p| p == first)),
        "{what}: the prefix moved: {pods:?}"
    );
}

/// Deterministic token ids.
pub fn token_ids(seed: u64, count: usize) -> Vec<u32> {
    let mut state = seed.wrapping_add(1).wrapping_mul(0x2545_F491_4F6C_DD1D);
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 50_000) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELPER: &str = "HARNESS_SPAWN_HELPER";

    /// A child spawned by [`spawn_owned`] ends with the process that
    /// spawned it, though that process never kills it: this test runs its
    /// own binary again as that process, which spawns a `sleep`, writes
    /// its PID and exits.
    #[test]
    // The helper leaves its child unreaped on purpose: that is the test.
    #[allow(clippy::zombie_processes)]
    fn a_child_ends_with_the_process_that_spawned_it() {
        if let Ok(file) = std::env::var(HELPER) {
            let child = spawn_owned(Command::new("sleep").arg("30")).unwrap();
            fs::write(file, child.id().to_string()).unwrap();
            return;
        }
        let dir = TestDir::new("spawn-owned");
        let file = dir.join("pid");
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_child_ends_with_the_process_that_spawned_it",
            ])
            .env(HELPER, &file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let pid: u32 = fs::read_to_string(&file).unwrap().parse().unwrap();
        let sleeping = || stat_fields(pid).is_some_and(|f| f[0] != "Z");
        let ended = wait_until(Duration::from_secs(5), || !sleeping());
        if !ended {
            // Ours (a grandchild): end it by its PID before failing.
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        assert!(ended, "sleep {pid} outlived the process that spawned it");
    }

    #[test]
    fn finds_a_child_by_its_arguments() {
        let mut child = std::process::Command::new("sleep")
            .arg("5.123")
            .spawn()
            .unwrap();
        // The child is ours from spawn, but its command line is the
        // parent's until it has exec'd: look until it shows.
        let mut found = None;
        wait_until(Duration::from_secs(3), || {
            found = child_with_args(&["5.123"]);
            found.is_some()
        });
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, Some(child.id()));
    }
}
