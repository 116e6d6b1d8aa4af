//! Drives a workload through [`Runner::send`] with the runner's two pacings
//! (closed loop, Poisson open loop) and shows progress on stderr while it
//! runs: sent, done, errors and the hit rate so far.
//!
//! Request `i` goes to target `i % targets` (several Envoy replicas: the
//! client spreads requests over them round robin), as [`Runner::run`] does.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runner::{poisson_offsets, Outcome, Pacing, Runner};
use crate::workload::Request;

/// Counters the progress line reads.
#[derive(Default)]
struct Progress {
    sent: AtomicUsize,
    done: AtomicUsize,
    errors: AtomicUsize,
    prompt: AtomicUsize,
    cached: AtomicUsize,
}

impl Progress {
    fn record(&self, o: &Outcome) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if !o.ok() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.prompt
            .fetch_add(o.prompt_tokens.unwrap_or(0) as usize, Ordering::Relaxed);
        self.cached
            .fetch_add(o.cached_tokens.unwrap_or(0) as usize, Ordering::Relaxed);
    }

    fn line(&self, label: &str, total: usize, elapsed: Duration) -> String {
        let prompt = self.prompt.load(Ordering::Relaxed);
        let hit = if prompt > 0 {
            format!(
                "{:.2}",
                self.cached.load(Ordering::Relaxed) as f64 / prompt as f64
            )
        } else {
            "-".into()
        };
        format!(
            "  [{label}] {:.1} s: sent {}/{total}, done {}, errors {}, hit rate so far {hit}",
            elapsed.as_secs_f64(),
            self.sent.load(Ordering::Relaxed),
            self.done.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// Sends `requests` with `pacing` to the base URLs `urls`; outcomes in
/// workload order, `start_ms` relative to the first send. Connections are
/// pooled and kept alive, or with `fresh_connections` every request opens its
/// own (a client without keep-alive). Progress goes to stderr (a rewritten
/// line on a terminal, a line every 5 s otherwise), labelled `label`.
pub async fn drive(
    urls: &[String],
    requests: &[Request],
    pacing: Pacing,
    label: &str,
    fresh_connections: bool,
) -> Vec<Outcome> {
    let runner = Runner::new(urls.to_vec());
    let urls: Arc<Vec<String>> = Arc::new(urls.to_vec());
    let targets = urls.len();
    let requests = Arc::new(requests.to_vec());
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    let total = requests.len();
    let tty = std::io::stderr().is_terminal();
    let ticker = {
        let (progress, label) = (progress.clone(), label.to_string());
        tokio::spawn(async move {
            let every = if tty {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(5)
            };
            loop {
                tokio::time::sleep(every).await;
                let line = progress.line(&label, total, started.elapsed());
                let mut err = std::io::stderr().lock();
                if tty {
                    let _ = write!(err, "\r{line}\x1b[K");
                } else {
                    let _ = writeln!(err, "{line}");
                }
                let _ = err.flush();
            }
        })
    };
    let targets = targets.max(1);
    let send = {
        let (runner, requests, progress) = (runner.clone(), requests.clone(), progress.clone());
        move |i: usize| {
            let (runner, requests, progress) = (runner.clone(), requests.clone(), progress.clone());
            let urls = urls.clone();
            async move {
                progress.sent.fetch_add(1, Ordering::Relaxed);
                let t0 = Instant::now();
                // A client of its own: a new connection, dropped after.
                let runner = if fresh_connections {
                    Runner::new(urls.to_vec())
                } else {
                    runner
                };
                let mut o = runner.send(i % targets, i, &requests[i]).await;
                o.start_ms = t0.duration_since(started).as_secs_f64() * 1000.0;
                o.family = requests[i].family;
                progress.record(&o);
                o
            }
        }
    };
    let mut outcomes = match pacing {
        Pacing::Closed { concurrency } => {
            let next = Arc::new(AtomicUsize::new(0));
            let mut workers = Vec::new();
            for _ in 0..concurrency.max(1) {
                let (next, send) = (next.clone(), send.clone());
                workers.push(tokio::spawn(async move {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            break;
                        }
                        done.push(send(i).await);
                    }
                    done
                }));
            }
            let mut all = Vec::with_capacity(total);
            for w in workers {
                all.extend(w.await.unwrap_or_default());
            }
            all
        }
        Pacing::Poisson { rate_per_sec, seed } => {
            let offsets = poisson_offsets(total, rate_per_sec, seed);
            let start = tokio::time::Instant::from_std(started);
            let mut tasks = Vec::with_capacity(total);
            for (i, offset) in offsets.into_iter().enumerate() {
                let send = send.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(start + offset).await;
                    send(i).await
                }));
            }
            let mut all = Vec::with_capacity(total);
            for t in tasks {
                if let Ok(o) = t.await {
                    all.push(o);
                }
            }
            all
        }
    };
    ticker.abort();
    let line = progress.line(label, total, started.elapsed());
    if tty {
        eprintln!("\r{line}\x1b[K");
    } else {
        eprintln!("{line}");
    }
    outcomes.sort_by_key(|o| o.index);
    outcomes
}
