#!/usr/bin/env bash
# Peer routers for the side-by-side benchmark, from PyPI (Rust binaries inside,
# no torch/CUDA), into one venv:
#   .bench/peers/   sglang-router (python -m sglang_router.launch_router)
#                   vllm-router   (bin/vllm-router)
# Idempotent: returns at once when both pinned versions are installed.
set -euo pipefail
. "$(dirname "$0")/common.sh"

SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"
VLLM_ROUTER_VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"
VENV="$BENCH_DIR/peers"

if pip_has "$VENV" sglang-router "$SGLANG_ROUTER_VERSION" \
    && pip_has "$VENV" vllm-router "$VLLM_ROUTER_VERSION"; then
    exit 0
fi
mkdir -p "$BENCH_DIR"
make_venv "$VENV"
blog "installing sglang-router==$SGLANG_ROUTER_VERSION vllm-router==$VLLM_ROUTER_VERSION"
t0=$(date +%s)
"$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" \
    "sglang-router==$SGLANG_ROUTER_VERSION" "vllm-router==$VLLM_ROUTER_VERSION"
"$VENV/bin/python" -c 'import sglang_router' >/dev/null
"$VENV/bin/vllm-router" --help >/dev/null
blog "done in $(( $(date +%s) - t0 )) s"
