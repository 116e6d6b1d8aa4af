//! One podsim process, the simulated inference pod.

use std::fs;
use std::process::{Command, Stdio};

use crate::paths::podsim_bin;
use crate::process::{port_accepts, spawn_owned, tail, wait_until, Owned, STARTUP_TIMEOUT};
use crate::test_dir::TestDir;

/// Nothing spawned here should outlive a test run, even if the test process is
/// killed before its destructors run: every child gets SIGTERM when this
/// process ends ([`spawn_owned`]), and podsim also exits by itself after this.
const POD_LIFETIME_SECS: u64 = 300;

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
