//! Linux `/proc` readers: a process's CPU time, and a panic hook that kills
//! our child processes (the release profile aborts on panic, so no
//! destructor would stop them). Finding children is the harness's.

use std::fs;
use std::time::Duration;

use harness::{children, stat_fields};

/// Kernel clock ticks per second of `/proc/<pid>/stat` times (USER_HZ; 100
/// on every Linux architecture this runs on).
const USER_HZ: u64 = 100;

/// User + system CPU time of a whole process (all threads, exited ones
/// included), from `/proc/<pid>/stat`; 10 ms resolution.
pub fn cpu_time_stat(pid: u32) -> Option<Duration> {
    let f = stat_fields(pid)?;
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// CPU time of a process's live threads, summed from
/// `/proc/<pid>/task/*/schedstat` (nanoseconds: precise enough for per-request
/// costs; threads that exited are not counted).
pub fn cpu_time_sched(pid: u32) -> Option<Duration> {
    let mut total = 0u64;
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let text = fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(Duration::from_nanos(total))
}

/// Both CPU clocks of a process at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    pub stat: Duration,
    pub sched: Duration,
}

/// Samples both CPU clocks of `pid` (zero if the process is gone).
pub fn cpu_sample(pid: u32) -> CpuSample {
    CpuSample {
        stat: cpu_time_stat(pid).unwrap_or_default(),
        sched: cpu_time_sched(pid).unwrap_or_default(),
    }
}

/// Machine-wide CPU time from `/proc/stat`, in ticks: (busy, steal, total).
fn machine_ticks() -> (u64, u64, u64) {
    let text = fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest is inside user)
    let busy = get(0) + get(1) + get(2) + get(5) + get(6);
    let steal = get(7);
    (busy, steal, busy + steal + get(3) + get(4))
}

/// CPU time of this process, of its children already reaped (`cutime`,
/// `cstime`) and of its live children (10 ms ticks).
fn own_tree_cpu() -> Duration {
    let me = std::process::id();
    let reaped = stat_fields(me)
        .and_then(|f| Some(f.get(13)?.parse::<u64>().ok()? + f.get(14)?.parse::<u64>().ok()?))
        .map_or(Duration::ZERO, |t| {
            Duration::from_millis(t * 1000 / USER_HZ)
        });
    std::iter::once(me)
        .chain(children())
        .filter_map(cpu_time_stat)
        .sum::<Duration>()
        + reaped
}

/// Measures how busy the machine was over an interval, and how much of that
/// was this benchmark (this process and its children): other work on the
/// same cores skews latencies.
pub struct LoadMeter {
    started: std::time::Instant,
    machine: (u64, u64, u64),
    own: Duration,
}

/// Average CPU use over a [`LoadMeter`] interval, in cores.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Load {
    pub cores: usize,
    pub busy_cores: f64,
    pub ours_cores: f64,
    pub others_cores: f64,
    pub steal_cores: f64,
}

impl LoadMeter {
    pub fn start() -> LoadMeter {
        LoadMeter {
            started: std::time::Instant::now(),
            machine: machine_ticks(),
            own: own_tree_cpu(),
        }
    }

    /// Load since `start`.
    pub fn finish(&self) -> Load {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let (busy, steal, _) = machine_ticks();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let busy_cores = busy.saturating_sub(self.machine.0) as f64 / USER_HZ as f64 / secs;
        let ours_cores = own_tree_cpu().saturating_sub(self.own).as_secs_f64() / secs;
        Load {
            cores,
            busy_cores,
            ours_cores,
            others_cores: (busy_cores - ours_cores).max(0.0),
            steal_cores: steal.saturating_sub(self.machine.1) as f64 / USER_HZ as f64 / secs,
        }
    }
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "machine load during the measurement: {:.2} of {} cores busy, {:.2} this benchmark, \
             {:.2} other processes, {:.2} stolen by the hypervisor{}",
            self.busy_cores,
            self.cores,
            self.ours_cores,
            self.others_cores,
            self.steal_cores,
            if self.others_cores + self.steal_cores > 0.2 {
                " (noisy: latencies are skewed)"
            } else {
                ""
            }
        )
    }
}

/// On panic, after the usual message, kill (SIGKILL, by PID) every child
/// process still running, so a failed benchmark leaves nothing behind.
pub fn kill_children_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let pids: Vec<String> = children().iter().map(u32::to_string).collect();
        if !pids.is_empty() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .args(&pids)
                .status();
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_is_readable_and_grows() {
        let me = std::process::id();
        let before = cpu_sample(me);
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let after = cpu_sample(me);
        assert!(after.sched > before.sched);
        assert!(after.stat >= before.stat);
    }
}
