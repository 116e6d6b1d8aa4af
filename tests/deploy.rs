//! The deploy/ recipes: their Kubernetes objects pass the schemas we could
//! obtain (scripts/release/check_deploy.py: Kubernetes API schemas, and the
//! Envoy Gateway, Gateway API and Istio CRDs vendored in deploy/schemas), and
//! every Envoy configuration they produce passes `envoy --mode validate`.
//! The Envoy Gateway and Istio ones, assembled from what the recipe writes
//! around stand-in pods, also run: a shared prefix sticks to one pod, the
//! singleton is found under the vm_id the recipe gives it, its plugin JSON
//! agrees with the filter's, and sync reaches Redis.
//!
//! No Kubernetes cluster, Envoy Gateway or Istio runs here: what those add
//! (EG's translation, istio-agent's module fetch, bootstrap merging) is taken
//! from their sources as cited in the recipes, not executed.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use harness::{
    assert_one_pod, envoy_bin, python_bin, repo_root, run_ok, shared_prefix_prompts,
    substitute_ports, text, wait_until, with_module_paths, EnvoyOptions, Ports, Redis, Running,
    TestDir,
};
use serde_json::json;

const RECIPES: [&str; 3] = ["kubernetes", "envoy-gateway", "istio"];

/// Runs check_deploy.py into `dir`; panics with its output when it fails.
fn extract(dir: &TestDir) -> PathBuf {
    let out_dir = dir.join("extracted");
    let stdout = run_ok(
        Command::new(python_bin())
            .arg(repo_root().join("scripts/release/check_deploy.py"))
            .arg(&out_dir),
    );
    // Every object was checked against a schema, in every recipe.
    for recipe in RECIPES {
        assert!(
            stdout.contains(&format!("check_deploy: {recipe}: ")),
            "{recipe} not checked:\n{stdout}"
        );
    }
    let crd_checks = stdout.lines().filter(|l| l.contains("CRD schema")).count();
    assert!(
        crd_checks >= 9,
        "only {crd_checks} CRD objects checked:\n{stdout}"
    );
    out_dir
}

#[test]
fn recipes_pass_their_schemas_and_their_envoy_configs_validate() {
    let dir = TestDir::new("deploy-validate");
    let out_dir = extract(&dir);
    for recipe in RECIPES {
        let path = out_dir.join(format!("{recipe}.yaml"));
        let rendered = dir.join(&format!("{recipe}-validate.yaml"));
        let config = fs::read_to_string(&path).unwrap();
        // The per-pod gauges' `pod` label (docs/operations.md) comes with every recipe.
        assert!(
            config.contains("tag_name: pod"),
            "{recipe}: no `pod` stats tag"
        );
        fs::write(&rendered, with_module_paths(&config)).unwrap();
        run_ok(
            Command::new(envoy_bin())
                .current_dir(repo_root())
                .args(["--mode", "validate", "-c"])
                .arg(&rendered),
        );
    }
}

/// Starts `recipe`'s extracted Envoy config, edited by `edit`, with Redis
/// and four pods.
fn start_recipe(
    label: &str,
    recipe: &str,
    edit: impl FnOnce(String) -> String,
) -> (Running, Redis) {
    let dir = TestDir::new(label);
    let out_dir = extract(&dir);
    let ports = Ports::free();
    let text_in = edit(fs::read_to_string(out_dir.join(format!("{recipe}.yaml"))).unwrap());
    let config: PathBuf = dir.join(&format!("{recipe}-run.yaml"));
    fs::write(
        &config,
        with_module_paths(&substitute_ports(&text_in, &ports)),
    )
    .unwrap();
    let redis = Redis::start(&dir, ports.redis, None);
    let run = Running::start(dir, ports, &config, &EnvoyOptions::default(), &[]);
    (run, redis)
}

fn run_recipe(recipe: &str) {
    let (run, redis) = start_recipe(&format!("deploy-{recipe}"), recipe, |t| t);
    check_running(recipe, &run, &redis);
}

/// The control of the two runs below: the Envoy Gateway recipe with the
/// singleton on any other vm_id than the policy's is reported, and requests
/// pass through as no_endpoints (the filter never learns the pods).
#[test]
fn envoy_gateway_recipe_with_another_singleton_vm_id_reports_the_singleton_missing() {
    let vm_id = "vm_id: envoyextensionpolicy/prefix-router/prefix-router/wasm/0";
    let (run, _redis) = start_recipe("deploy-eg-wrong-vm-id", "envoy-gateway", |t| {
        let first = t.find(vm_id).expect("the singleton's vm_id");
        format!(
            "{}vm_id: prefix_router{}",
            &t[..first],
            &t[first + vm_id.len()..]
        )
    });
    let envoy = &run.envoy;
    let missing = wait_until(Duration::from_secs(8), || {
        envoy.router_stat("prefix_router.singleton_missing") == 1
    });
    assert!(missing, "not reported: {:?}", envoy.router_stats());
    // The filter's VMs never get the pods (the singleton publishes them
    // under its own vm_id): requests pass through.
    for i in 0..3 {
        envoy
            .complete(&json!(text(3000 + i, 2048)))
            .unwrap()
            .expect_pod();
    }
    let passed = envoy.router_stat_reaching("prefix_router.passthrough.no_endpoints", 3);
    assert!(passed >= 3, "{:?}", envoy.router_stats());
}

fn check_running(recipe: &str, run: &Running, redis: &Redis) {
    let envoy = &run.envoy;
    // Cluster membership comes from the admin through the singleton: wait
    // for the pods to be known before routing.
    let members = wait_until(Duration::from_secs(10), || {
        envoy.router_stat("prefix_router.membership.members") >= 4
    });
    assert!(
        members,
        "{recipe}: the singleton never published the 4 pods: {:?}",
        envoy.router_stats()
    );
    let pods: Vec<String> = shared_prefix_prompts(11, 10)
        .iter()
        .map(|p| run.complete(&json!(p)).expect_pod())
        .collect();
    assert_one_pod(&pods, recipe);
    let pushed = wait_until(Duration::from_secs(20), || redis.dbsize() > 0);
    assert!(pushed, "{recipe}: nothing reached Redis");
    std::thread::sleep(Duration::from_millis(3_500));
    assert_eq!(
        envoy.router_stat("prefix_router.singleton_missing"),
        0,
        "{recipe}"
    );
    assert_eq!(
        envoy.router_stat("prefix_router.config_mismatch"),
        0,
        "{recipe}"
    );
    let log = envoy.log_text();
    assert!(
        log.contains("starting: sync singleton"),
        "{recipe}: no singleton started"
    );
}

#[test]
fn envoy_gateway_recipe_runs_with_the_singleton_on_the_policy_vm_id() {
    run_recipe("envoy-gateway");
}

#[test]
fn istio_recipe_runs_with_the_singleton_on_the_filter_vm_id() {
    run_recipe("istio");
}
