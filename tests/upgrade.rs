//! The upgrade procedure (issue 51, docs/operations.md "Upgrades") on a real
//! Envoy with real pods, the listener delivered by LDS from a file as a
//! control plane would deliver it:
//! - a new module of the same table layout, swapped in by an LDS update,
//!   finds the table the old one built: every prompt goes to the pod that
//!   served it, on a full match;
//! - a module of another layout version (the `next-layout` test build,
//!   `target/layout`) finds nothing it can read: every prompt routes as new,
//!   and `table.layout_resets` counts the buckets it started anew.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::{
    lds_listener, render_lds, target_dir, text, wait_until, write_lds_listeners, Envoy,
    EnvoyOptions, Pod, Ports, Reply, TestDir,
};
use serde_json::{json, Value};

/// 32 blocks of 128 bytes.
const PROMPT_LEN: usize = 4096;

/// A test build of the filter under `target/<dir>` (`make build` makes both).
fn test_build(dir: &str) -> PathBuf {
    let path = target_dir()
        .join(dir)
        .join("wasm32-wasip1/release/envoy_prefix_router.wasm");
    assert!(
        path.is_file(),
        "{} missing: run `make build`",
        path.display()
    );
    path
}

struct Fleet {
    envoy: Envoy,
    ports: Ports,
    listener_file: PathBuf,
    _pods: Vec<Pod>,
    _dir: TestDir,
}

impl Fleet {
    fn start(module: &Path) -> Fleet {
        let dir = TestDir::new("upgrade");
        let ports = Ports::free();
        let (path, listener_file) = render_lds(&dir, &ports);
        let pods = ports
            .pods
            .iter()
            .enumerate()
            .map(|(i, &port)| Pod::start(&dir, &format!("pod-{}", i + 1), port))
            .collect();
        write_lds_listeners(&listener_file, &[listener(&ports, module)]);
        let envoy = Envoy::start(
            &path,
            &ports,
            dir.join("envoy.log"),
            &EnvoyOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Fleet {
            envoy,
            ports,
            listener_file,
            _pods: pods,
            _dir: dir,
        }
    }

    fn complete(&self, seed: u64) -> Reply {
        self.envoy
            .complete(&json!(text(seed, PROMPT_LEN)))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A counter or gauge by full name (0 if Envoy has none), None while
    /// the admin does not answer (the main thread compiling a module).
    fn try_stat(&self, name: &str) -> Option<i64> {
        let stats = self.envoy.try_stats_matching(name).ok()?;
        Some(stats.get(name).copied().unwrap_or(0))
    }

    /// [`Fleet::try_stat`], waiting for the admin to answer.
    fn stat(&self, name: &str) -> i64 {
        let mut value = None;
        assert!(
            wait_until(Duration::from_secs(30), || {
                value = self.try_stat(name);
                value.is_some()
            }),
            "the admin never answered for {name}"
        );
        value.unwrap_or_default()
    }

    /// Delivers the listener loading `module` through LDS and waits until
    /// Envoy serves it from a VM of that module.
    fn swap_module(&self, module: &Path) {
        let updates = self.stat("listener_manager.lds.update_success");
        let modified = self.stat("listener_manager.listener_modified");
        let vms = self.stat("wasm.envoy.wasm.runtime.v8.created");
        write_lds_listeners(&self.listener_file, &[listener(&self.ports, module)]);
        assert!(
            wait_until(Duration::from_secs(30), || {
                self.try_stat("listener_manager.lds.update_success") > Some(updates)
                    && self.try_stat("listener_manager.listener_modified") > Some(modified)
                    && self.try_stat("listener_manager.total_listeners_warming") == Some(0)
            }),
            "the LDS update to {} was not applied: {}",
            module.display(),
            harness::tail(&self.envoy.log, 20)
        );
        assert!(
            self.stat("wasm.envoy.wasm.runtime.v8.created") > vms,
            "no new VM for {}: the module was not swapped",
            module.display()
        );
        assert!(
            wait_until(Duration::from_secs(30), || self
                .try_stat("listener_manager.total_listeners_draining")
                == Some(0)),
            "the replaced listener never finished draining"
        );
        eprintln!(
            "swapped to {}: {:?}",
            module.display(),
            self.envoy.stats_matching("wasm.envoy.wasm.runtime.v8")
        );
    }
}

fn listener(ports: &Ports, module: &Path) -> String {
    lds_listener(
        ports,
        "ingress",
        ports.listener,
        module,
        &mut |_: &mut Value| {},
    )
}

#[test]
fn a_same_layout_module_keeps_the_table_and_a_layout_change_starts_clean_counted() {
    let release = harness::wasm_module();
    let same_layout = test_build("fault");
    let next_layout = test_build("layout");
    let f = Fleet::start(&release);
    let groups: Vec<u64> = (600..616).collect();
    let home: BTreeMap<u64, String> = groups
        .iter()
        .map(|g| (*g, f.complete(*g).expect_pod()))
        .collect();
    for g in &groups {
        assert_eq!(f.complete(*g).match_percent(), 100, "group {g} before");
    }

    // Build B, same layout: the table is kept, every group on its pod.
    f.swap_module(&same_layout);
    for g in &groups {
        let r = f.complete(*g);
        assert_eq!(
            (r.expect_pod(), r.match_percent()),
            (home[g].clone(), 100),
            "group {g} after a module of the same layout"
        );
    }
    let resets = "prefix_router.table.layout_resets";
    assert_eq!(f.envoy.settled_router_stat(resets), 0);
    let no_match = f.envoy.settled_router_stat("prefix_router.routed.no_match");

    // Build C, another layout version: nothing is read as a match, the
    // buckets the groups write are started anew and counted.
    f.swap_module(&next_layout);
    for g in &groups {
        assert_eq!(
            f.complete(*g).match_percent(),
            0,
            "group {g} after a layout change"
        );
    }
    let n = groups.len() as i64;
    assert_eq!(
        f.envoy
            .router_stat_reaching("prefix_router.routed.no_match", no_match + n),
        no_match + n
    );
    let reset = f.envoy.router_stat_reaching(resets, 1);
    eprintln!(
        "{} groups after the layout change: {reset} buckets started anew",
        groups.len()
    );
    // Routed again in the new layout: matched.
    for g in &groups {
        assert_eq!(f.complete(*g).match_percent(), 100, "group {g} relearned");
    }
}
