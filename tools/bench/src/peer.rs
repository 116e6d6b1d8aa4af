//! Peer routers (sglang-router, vllm-router) as child processes, started
//! through `scripts/bench/start-peer.sh` (which execs the router, so the
//! child's PID is the router's) and stopped by that PID when dropped.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use harness::{self, Service, TestDir};

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
    _service: Service,
    pub kind: PeerKind,
    pub port: u16,
    pub metrics_port: u16,
    pub log: PathBuf,
}

impl Peer {
    /// Starts `kind` with `policy` over `workers` (base URLs) and waits until
    /// `GET /readiness` reports every worker healthy. `name` names its log
    /// (`<name>.log` in `dir`), so several of one kind can run side by side.
    pub fn start(
        kind: PeerKind,
        name: &str,
        policy: &str,
        workers: &[String],
        dir: &TestDir,
    ) -> Result<Peer, String> {
        let port = harness::free_port();
        let metrics_port = harness::free_port();
        let log = dir.join(&format!("{name}.log"));
        let script = harness::repo_root().join("scripts/bench/start-peer.sh");
        let mut cmd = Command::new(&script);
        cmd.arg(kind.script_name())
            .arg(port.to_string())
            .arg(metrics_port.to_string())
            .arg(policy)
            .args(workers)
            .current_dir(harness::repo_root());
        let url = format!("http://127.0.0.1:{port}/readiness");
        let ready = || {
            harness::get(&url).is_ok_and(|reply| {
                let healthy = serde_json::from_str::<serde_json::Value>(&reply.body)
                    .ok()
                    .and_then(|v| v["healthy_workers"].as_u64());
                reply.status == 200 && healthy == Some(workers.len() as u64)
            })
        };
        let service = Service::start(
            kind.script_name(),
            &mut cmd,
            log.clone(),
            Duration::from_secs(90),
            ready,
        )?;
        Ok(Peer {
            _service: service,
            kind,
            port,
            metrics_port,
            log,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}
