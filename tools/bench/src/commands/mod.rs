//! One module per subcommand.

pub mod compare;
pub mod convergence;
pub mod demo;
pub mod overhead;
pub mod sync_cost;
