# shellcheck shell=bash
# Shared helpers for scripts/bench/*.sh (sourced, not run).
# Everything lives under $BENCH_DIR (default: <repo>/.bench), which .gitignore excludes.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH_DIR="${BENCH_DIR:-$REPO_ROOT/.bench}"
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input)

blog() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

# venv DIR [PYTHON]: create a venv at DIR unless it already has a working pip.
make_venv() {
    local dir="$1" py="${2:-python3}"
    if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c 'import pip' 2>/dev/null; then
        blog "creating venv $dir ($("$py" --version 2>&1))"
        rm -rf "$dir"
        "$py" -m venv "$dir"
        "$dir/bin/python" -m pip install "${PIP_FLAGS[@]}" --upgrade pip
    fi
}

# pip_has VENV NAME VERSION: is exactly NAME==VERSION installed in VENV?
pip_has() {
    local v
    v="$("$1/bin/python" -m pip show "$2" 2>/dev/null | awk '/^Version:/ {print $2}')"
    [ "$v" = "$3" ]
}

# wait_http URL TIMEOUT_S [PID]: poll until URL answers 2xx; fail early if PID dies.
wait_http() {
    local url="$1" timeout="$2" pid="${3:-}" t0
    t0=$(date +%s)
    until curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; do
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        if [ $(( $(date +%s) - t0 )) -ge "$timeout" ]; then return 1; fi
        sleep 0.1
    done
}
