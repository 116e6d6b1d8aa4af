#!/usr/bin/env bash
# Placeholder demo: four simulated pods on the placeholder ports and one Envoy
# with the prefix-router filter (envoy/single.yaml) in the foreground.
# Ctrl-C stops everything. `make run` builds first.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_BIN="${ENVOY_BIN:-.venv/bin/envoy}"
PODSIM_BIN="${PODSIM_BIN:-target/release/podsim}"
CONFIG="${CONFIG:-envoy/single.yaml}"
RUN_DIR="$(mktemp -d)"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$RUN_DIR"
}
trap cleanup EXIT INT TERM

for i in 1 2 3 4; do
    "$PODSIM_BIN" --port "1800$i" --name "pod-$i" --ready-file "$RUN_DIR/pod-$i.ready" \
        --exit-after-secs 86400 >"$RUN_DIR/pod-$i.log" 2>&1 &
    pids+=($!)
done
for i in 1 2 3 4; do
    for _ in $(seq 100); do [ -e "$RUN_DIR/pod-$i.ready" ] && break; sleep 0.05; done
done

echo "pods on 127.0.0.1:18001-18004; Envoy listener 127.0.0.1:18080, admin 127.0.0.1:18901"
echo "try: curl -si localhost:18080/v1/completions -d '{\"model\":\"m\",\"prompt\":\"hello\"}'"
"$ENVOY_BIN" -c "$CONFIG" --disable-hot-restart --concurrency 2 -l info &
pids+=($!)
wait "${pids[-1]}"
