#!/usr/bin/env bash
# `make release`: builds dist/ from this checkout, every name carrying Cargo's version:
#
#   dist/envoy_prefix_router-<version>.wasm          the module (release profile)
#   dist/envoy_prefix_router-<version>.wasm.sha256   its sha256 (`sha256sum -c` reads it)
#   dist/envoy_prefix_router-<version>.oci/          OCI image layout, tag <version> (compat
#                                                    Wasm image: see scripts/release/oci_image.py)
#   dist/envoy_prefix_router-<version>.oci.digest    the image manifest's digest (the `sha256`
#                                                    that Istio's WasmPlugin and Envoy Gateway's
#                                                    EnvoyExtensionPolicy check)
#
# The module is built in its own target dir (target/dist-build) with the git commit in
# PREFIX_ROUTER_COMMIT, which the module logs at VM start and names in a stat; the shared
# target/ build (commit "unknown") is left alone. A checkout with uncommitted changes to
# tracked files gets "-dirty" after the commit. No Docker: the image is written by Python.
set -euo pipefail
cd "$(dirname "$0")/../.."

log() { printf 'release: %s\n' "$*"; }

version="$(cargo metadata --no-deps --format-version 1 \
    | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "envoy-prefix-router"))')"
if commit="$(git rev-parse --short=12 HEAD 2>/dev/null)"; then
    created="$(git log -1 --format=%cI HEAD)"
    if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        commit="${commit}-dirty"
    fi
else
    commit="unknown"
    created=""
fi

if ! rustup target list --installed | grep -qx wasm32-wasip1; then
    log "adding rust target wasm32-wasip1"
    rustup target add wasm32-wasip1
fi

log "building ${version} (commit ${commit})"
PREFIX_ROUTER_COMMIT="$commit" cargo build --target wasm32-wasip1 --release \
    --target-dir target/dist-build -p envoy-prefix-router --lib

name="envoy_prefix_router-${version}"
mkdir -p dist
rm -rf "dist/${name}.wasm" "dist/${name}.wasm.sha256" "dist/${name}.oci" "dist/${name}.oci.digest"
cp target/dist-build/wasm32-wasip1/release/envoy_prefix_router.wasm "dist/${name}.wasm"
(cd dist && sha256sum "${name}.wasm" > "${name}.wasm.sha256")
python3 scripts/release/oci_image.py "dist/${name}.wasm" "dist/${name}.oci" "$version" \
    --created "$created" --revision "$commit" --version "$version" > "dist/${name}.oci.digest"

log "dist/${name}.wasm  sha256 $(cut -d' ' -f1 "dist/${name}.wasm.sha256")"
log "dist/${name}.oci   tag ${version}, manifest $(cat "dist/${name}.oci.digest")"
log "push: skopeo copy oci:dist/${name}.oci:${version} docker://<registry>/envoy-prefix-router:${version}"
