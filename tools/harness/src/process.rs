//! Child processes that cannot outlive this one ([`spawn_owned`]), scripts
//! run as a [`Service`], commands run to success, and bounded waits.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long a child (Envoy, podsim, redis-server) may take to be ready.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

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

pub(crate) fn port_accepts(port: u16) -> bool {
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
pub(crate) struct Owned {
    pub(crate) child: Child,
}

impl Owned {
    pub(crate) fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

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
                "process::tests::a_child_ends_with_the_process_that_spawned_it",
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
