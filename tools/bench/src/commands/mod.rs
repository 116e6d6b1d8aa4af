//! One module per subcommand.

pub mod bursts;
pub mod compare;
pub mod compat_cost;
pub mod convergence;
pub mod decide;
pub mod demo;
pub mod iperf;
pub mod memory;
pub mod overhead;
pub mod place_wait;
pub mod real;
pub mod scale;
pub mod sync_cost;
