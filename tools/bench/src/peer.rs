//! Peer routers (sglang-router, vllm-router) as child processes, started
//! through `scripts/bench/start-peer.sh` (which execs the router, so the
//! child's PID is the router's) and stopped by that PID when dropped.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{self, TestDir};

/// Which peer router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    Sglang,
    Vllm,
}

impl PeerKind {
    /// The name `start-peer.sh` takes.
    pub fn script_name(self) -> &'static str {
        match self {
            PeerKind::Sglang => "sglang",
            PeerKind::Vllm => "vllm",
        }
    }
}

/// `$BENCH_DIR` or `<repo>/.bench` (scripts/bench/common.sh).
pub fn bench_dir() -> PathBuf {
    std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| harness::repo_root().join(".bench"))
}

/// Is the peers venv there (`scripts/bench/setup-peers.sh` ran)?
pub fn peers_installed() -> bool {
    bench_dir().join("peers/bin/python").is_file()
}

/// A running peer router.
pub struct Peer {
    child: Child,
    pub kind: PeerKind,
    pub port: u16,
    pub metrics_port: u16,
    pub log: PathBuf,
}

impl Peer {
    /// Starts `kind` with `policy` over `workers` (base URLs) and waits until
    /// `GET /readiness` reports every worker healthy.
    pub fn start(
        kind: PeerKind,
        policy: &str,
        workers: &[String],
        dir: &TestDir,
    ) -> Result<Peer, String> {
        let port = harness::free_port();
        let metrics_port = harness::free_port();
        let log = dir.join(&format!("{}.log", kind.script_name()));
        let out = fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let script = harness::repo_root().join("scripts/bench/start-peer.sh");
        let child = Command::new(&script)
            .arg(kind.script_name())
            .arg(port.to_string())
            .arg(metrics_port.to_string())
            .arg(policy)
            .args(workers)
            .current_dir(harness::repo_root())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", script.display()))?;
        let mut peer = Peer {
            child,
            kind,
            port,
            metrics_port,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        let url = format!("http://127.0.0.1:{port}/readiness");
        loop {
            if let Ok(Some(status)) = peer.child.try_wait() {
                return Err(format!(
                    "{} exited during startup ({status}):\n{}",
                    kind.script_name(),
                    harness::tail(&peer.log, 20)
                ));
            }
            if let Ok(reply) = harness::get(&url) {
                let healthy = serde_json::from_str::<serde_json::Value>(&reply.body)
                    .ok()
                    .and_then(|v| v["healthy_workers"].as_u64());
                if reply.status == 200 && healthy == Some(workers.len() as u64) {
                    return Ok(peer);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} not ready in 90 s:\n{}",
                    kind.script_name(),
                    harness::tail(&peer.log, 20)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        terminate(&mut self.child);
    }
}

/// Stops a child we started: SIGTERM by PID, up to 10 s to exit, then SIGKILL.
pub fn terminate(child: &mut std::process::Child) {
    if let Ok(None) = child.try_wait() {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}
