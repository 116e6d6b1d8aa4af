//! Where the binaries and modules are found: an environment variable, then
//! the repository (`.venv/bin/envoy`, `<target>/{release,debug}/podsim`,
//! `<target>/wasm32-wasip1/release/*.wasm`), then `PATH`.

use std::path::{Path, PathBuf};

/// Module path as written in the Envoy configs (relative to the repo root).
pub const WASM_REL_PATH: &str = "target/wasm32-wasip1/release/envoy_prefix_router.wasm";

/// The benchmark's reference filter (tools/reffilter), as written in `envoy/reference.yaml`.
pub const REFERENCE_WASM_REL_PATH: &str = "target/wasm32-wasip1/release/reference_filter.wasm";

/// The repository root (two levels above this crate); Envoy runs with this
/// as its working directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Cargo's target directory as the Makefile uses it (`CARGO_TARGET_DIR` or `target/`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        None => repo_root().join("target"),
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn locate(env_var: &str, candidates: &[PathBuf], on_path: Option<&str>, hint: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return PathBuf::from(path);
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return found.clone();
    }
    if let Some(found) = on_path.and_then(find_on_path) {
        return found;
    }
    panic!("{env_var} not set and none of {candidates:?} exists: {hint}");
}

/// The Envoy binary (`ENVOY_BIN`, `.venv/bin/envoy`, or `envoy` on `PATH`).
pub fn envoy_bin() -> PathBuf {
    locate(
        "ENVOY_BIN",
        &[repo_root().join(".venv/bin/envoy")],
        Some("envoy"),
        "run `make setup`",
    )
}

/// The simulated inference pod (`PODSIM_BIN`, release build, then debug build).
pub fn podsim_bin() -> PathBuf {
    let target = target_dir();
    locate(
        "PODSIM_BIN",
        &[target.join("release/podsim"), target.join("debug/podsim")],
        None,
        "run `make build`",
    )
}

/// The filter module (`PREFIX_ROUTER_WASM` or the release build under the target dir).
pub fn wasm_module() -> PathBuf {
    let default = target_dir().join("wasm32-wasip1/release/envoy_prefix_router.wasm");
    locate("PREFIX_ROUTER_WASM", &[default], None, "run `make build`")
}

/// The reference filter module (`REFERENCE_FILTER_WASM` or the release build under the target dir).
pub fn reference_wasm_module() -> PathBuf {
    let default = target_dir().join("wasm32-wasip1/release/reference_filter.wasm");
    locate(
        "REFERENCE_FILTER_WASM",
        &[default],
        None,
        "run `make build`",
    )
}

/// `text` with the module paths of the shipped configs made absolute (the
/// target dir may be elsewhere than `target/`).
pub fn with_module_paths(text: &str) -> String {
    let mut text = text.to_string();
    if text.contains(WASM_REL_PATH) {
        text = text.replace(WASM_REL_PATH, &wasm_module().display().to_string());
    }
    if text.contains(REFERENCE_WASM_REL_PATH) {
        text = text.replace(
            REFERENCE_WASM_REL_PATH,
            &reference_wasm_module().display().to_string(),
        );
    }
    text
}

/// The Python of the repository's virtualenv (`.venv/bin/python`), with
/// the packages `make setup` installs (the deploy schema checker, ORAS).
pub fn python_bin() -> PathBuf {
    repo_root().join(".venv/bin/python")
}

/// `redis-server` (`REDIS_SERVER_BIN` or `PATH`).
pub fn redis_server_bin() -> PathBuf {
    locate(
        "REDIS_SERVER_BIN",
        &[],
        Some("redis-server"),
        "run `make setup`",
    )
}
