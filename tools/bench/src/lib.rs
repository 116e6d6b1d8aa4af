//! Building blocks of `prefix-bench` (the demo and benchmarks of the Envoy
//! prefix-router filter) and of router comparisons to come: deterministic
//! workloads, an HTTP load runner, percentiles, process fleets on loopback
//! (through the `harness` crate the integration tests share) and report
//! output.

// Test tooling: a benchmark whose setup fails (a process that does not
// start, a file that cannot be written) can only stop, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod chart;
pub mod commands;
pub mod drive;
pub mod metrics;
pub mod outage;
pub mod peer;
pub mod percentiles;
pub mod procstat;
pub mod redis_meter;
pub mod redis_writer;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod tagproxy;
pub mod workload;
