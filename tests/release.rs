//! The release through a real registry (`make test-release`, after `make
//! release`): Debian's distribution registry (`docker-registry`) on
//! 127.0.0.1, the OCI image pushed with skopeo, its manifest read back and
//! checked against dist/'s digest and media types, the module pulled back by
//! deploy/module/fetch-module.sh (the recipes' init container, skopeo
//! underneath) and by the ORAS Python client (scripts/release/oras_pull.py),
//! each checked against dist/'s digests and sha256, then loaded in Envoy,
//! which routes a shared prefix to one pod.
//!
//! Ignored by `cargo test`: it needs dist/ (make release) and skopeo and
//! docker-registry (make setup); `make test-release` runs it with --ignored.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::{
    assert_one_pod, free_port, python_bin, repo_root, run_ok, send, shared_prefix_prompts, Service,
    Setup, TestDir,
};
use serde_json::{json, Value};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = "envoy-prefix-router";

fn dist(suffix: &str) -> PathBuf {
    let path = repo_root().join(format!("dist/envoy_prefix_router-{VERSION}{suffix}"));
    assert!(
        path.exists(),
        "{} is missing: run `make release`",
        path.display()
    );
    path
}

fn sha256_of(path: &Path) -> String {
    run_ok(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Debian's distribution registry on a free loopback port, storing under `dir`.
fn start_registry(dir: &TestDir) -> (Service, String) {
    let port = free_port();
    let config = dir.join("registry.yml");
    let storage = dir.join("registry-data");
    fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        ),
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{port}/v2/");
    let service = Service::start(
        "docker-registry",
        Command::new("docker-registry").arg("serve").arg(&config),
        dir.join("registry.log"),
        Duration::from_secs(20),
        || send("GET", &url, &[], None, Duration::from_secs(1)).is_ok_and(|r| r.status == 200),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (service, format!("127.0.0.1:{port}"))
}

#[test]
#[ignore = "needs dist/ (make release), skopeo and docker-registry: make test-release"]
fn release_image_round_trips_a_registry_and_routes_from_the_pulled_module() {
    let module = dist(".wasm");
    let layout = dist(".oci");
    let expected_sha = fs::read_to_string(dist(".wasm.sha256")).unwrap();
    let expected_sha = expected_sha.split_whitespace().next().unwrap().to_string();
    let expected_digest = fs::read_to_string(dist(".oci.digest"))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        sha256_of(&module),
        expected_sha,
        "dist's .sha256 is not its module's"
    );

    let dir = TestDir::new("release");
    let (_registry, registry) = start_registry(&dir);
    let image = format!("{registry}/{REPOSITORY}:{VERSION}");

    // Push the layout as built, digests unchanged (skopeo keeps them).
    run_ok(Command::new("skopeo").args([
        "copy",
        "--dest-tls-verify=false",
        &format!("oci:{}:{VERSION}", layout.display()),
        &format!("docker://{image}"),
    ]));

    // The registry serves the manifest dist/ names, with the compat media types.
    let raw = run_ok(Command::new("skopeo").args([
        "inspect",
        "--tls-verify=false",
        "--raw",
        &format!("docker://{image}"),
    ]));
    let raw_path = dir.join("manifest.json");
    fs::write(&raw_path, &raw).unwrap();
    assert_eq!(format!("sha256:{}", sha256_of(&raw_path)), expected_digest);
    let manifest: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"],
        "compat"
    );
    let inspected: Value = serde_json::from_str(&run_ok(Command::new("skopeo").args([
        "inspect",
        "--tls-verify=false",
        &format!("docker://{image}"),
    ])))
    .unwrap();
    assert_eq!(inspected["Digest"], expected_digest.as_str());

    // Pull back as the deploy recipes' init container does, by digest too.
    let script = repo_root().join("deploy/module/fetch-module.sh");
    let fetch = |image: &str, sha: &str, out: &Path| {
        Command::new("sh")
            .arg(&script)
            .env("IMAGE", image)
            .env("WASM_SHA256", sha)
            .env("OUT", out)
            .env("SKOPEO_ARGS", "--src-tls-verify=false")
            .output()
            .unwrap()
    };
    let pulled_dir = dir.join("pulled");
    let by_digest = format!("{registry}/{REPOSITORY}@{expected_digest}");
    let out = fetch(&by_digest, &expected_sha, &pulled_dir);
    assert!(
        out.status.success(),
        "fetch-module.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pulled = pulled_dir.join("plugin.wasm");
    assert_eq!(fs::read(&pulled).unwrap(), fs::read(&module).unwrap());
    // A second client, ORAS (Python), checks the same digests by itself.
    let oras_out = dir.join("oras.wasm");
    let said = run_ok(
        Command::new(python_bin())
            .arg(repo_root().join("scripts/release/oras_pull.py"))
            .args([
                &registry,
                REPOSITORY,
                VERSION,
                &expected_digest,
                &expected_sha,
            ])
            .arg(&oras_out),
    );
    assert!(said.contains(&expected_digest), "{said}");
    assert_eq!(fs::read(&oras_out).unwrap(), fs::read(&module).unwrap());
    // A wrong sha256 stops it, and writes nothing.
    let refused_dir = dir.join("refused");
    let wrong = "0".repeat(64);
    let out = fetch(&image, &wrong, &refused_dir);
    assert!(!out.status.success(), "fetch-module.sh took a wrong sha256");
    assert!(!refused_dir.join("plugin.wasm").exists());

    // Envoy on the pulled module routes by prefix, and says which build it is.
    let run = Setup::new("minimal-single.yaml").module(pulled).start();
    let pods: Vec<String> = shared_prefix_prompts(21, 10)
        .iter()
        .map(|p| run.complete(&json!(p)).expect_pod())
        .collect();
    assert_one_pod(&pods, "the pulled module");
    assert!(
        run.envoy
            .router_stat_reaching("prefix_router.routed.prefix_match", 9)
            >= 9
    );
    let revision = manifest["annotations"]["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    let line = format!("prefix_router {VERSION} (commit {revision})");
    assert!(
        run.envoy.log_text().contains(&line),
        "the pulled module does not log {line:?}"
    );
}
