//! What `compat-cost` runs: its options, the two modes and the fixed
//! setup of `envoy/aibrix.yaml` they share.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use envoy_prefix_router::config::{AIBRIX_BLOCK_SIZE, AIBRIX_DENSE_BLOCKS};
use envoy_prefix_router::route::router::sampled_positions;

/// The model every request names.
pub(super) const MODEL: &str = "llama-3-8b-instruct";
/// Pods in the EDS file (`envoy/eds/aibrix-pods.yaml`), by hostname.
pub(super) const AIBRIX_PODS: [&str; 4] = [
    "vllm-llama-a",
    "vllm-llama-b",
    "vllm-llama-c",
    "vllm-llama-d",
];
pub(super) const PODS: i64 = AIBRIX_PODS.len() as i64;
pub(super) const CHAT_PATH: &str = "/v1/chat/completions";
/// Deadline for anything that takes a few sync periods.
pub(super) const DEADLINE: Duration = Duration::from_secs(60);
/// Longest wait for a push to be over.
pub(super) const QUIET_DEADLINE: Duration = Duration::from_secs(90);
/// The meter's class of the calls that write prompt blocks.
pub(super) const PUSH: &str = "write prefixcache";

#[derive(Clone, Debug)]
pub struct CompatCostArgs {
    /// Distinct prompts per size.
    pub prompts: usize,
    /// Prompt sizes, KiB.
    pub sizes_kib: Vec<usize>,
    /// Prompts loaded before the steady-state cycles.
    pub steady_prompts: usize,
    /// Their size, KiB.
    pub steady_kib: usize,
    /// Idle cycles observed in steady state.
    pub steady_cycles: usize,
    /// Sync period of both modes, ms.
    pub period_ms: u64,
    /// `table_capacity_blocks` of both modes; None keeps the default.
    pub table_capacity_blocks: Option<u32>,
    /// Where the JSON goes; None = `results/`.
    pub results_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Mode {
    Native,
    Compat,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Compat => "compat",
        }
    }

    /// Block size and dense prefix of this mode (the defaults).
    pub(super) fn blocks(self) -> (usize, usize) {
        match self {
            Mode::Native => (128, 32),
            Mode::Compat => (AIBRIX_BLOCK_SIZE, AIBRIX_DENSE_BLOCKS as usize),
        }
    }

    /// Blocks recorded (so keys written) for a prompt of `len` bytes.
    pub(super) fn recorded(self, len: usize) -> usize {
        let (size, dense) = self.blocks();
        sampled_positions(len / size, dense).len()
    }

    /// The plugin JSON of this mode, from envoy/aibrix.yaml's.
    pub(super) fn patch(self, args: &CompatCostArgs, config: &mut Value) {
        if let Some(sync) = config.get_mut("sync").filter(|s| s.is_object()) {
            sync["period_ms"] = json!(args.period_ms);
            // The table's sync alone: placement's calls (one per new prompt)
            // are not part of what this counts.
            sync["place_new"] = json!(false);
        }
        if let Some(capacity) = args.table_capacity_blocks {
            config["table_capacity_blocks"] = json!(capacity);
        }
        if self == Mode::Native {
            if let Some(obj) = config.as_object_mut() {
                obj.remove("compat");
                obj.remove("block_size");
            }
        }
    }
}
