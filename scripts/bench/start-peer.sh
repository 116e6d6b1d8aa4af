#!/usr/bin/env bash
# Runs one peer router in the foreground, as this process (exec), so a harness
# can spawn it and stop it by PID (SIGTERM; both shut down in well under 1 s
# when idle, otherwise after in-flight requests, graceful period up to 180 s).
#
#   scripts/bench/start-peer.sh sglang|vllm PORT METRICS_PORT POLICY WORKER_URL...
#
#   sglang  sglang-router 0.3.2 (python -m sglang_router.launch_router); policies:
#           random round_robin cache_aware power_of_two manual
#   vllm    vllm-router 0.1.17; policies: random round_robin cache_aware kv_aware
#           power_of_two consistent_hash sticky_least_loaded
#
# Listens on 127.0.0.1:PORT (OpenAI API) and 127.0.0.1:METRICS_PORT (Prometheus
# /metrics). Start the workers first and wait for their GET /health 200:
# sglang never registers a worker that is down at start (it retries in the
# background, and /readiness counts only registered ones); vllm waits up to
# --worker-startup-timeout-secs (60 here) until at least one is up, then starts
# with all of them and /readiness counts a dead one as healthy.
#
# Readiness: GET http://127.0.0.1:PORT/readiness answers 200
#   {"status":"ready","healthy_workers":N,"total_workers":N}
# once N workers are registered; wait for N == number of WORKER_URLs. (GET
# /health answers 200 earlier on sglang, before any worker is registered.)
# Seen: ready 0.5-1.1 s after start.
#
# Quiet and offline: warn-level logs (a few startup lines remain), no tokenizer
# or model is loaded (no --model-path/--tokenizer-path), HF_HUB_OFFLINE=1.
# The process renames itself (setproctitle: "sglang::router", "vllm::router"), so find
# it by PID, never by name. Extra router flags: PEER_ARGS="--flag value ...".
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ $# -lt 5 ]; then
    echo "usage: $0 sglang|vllm PORT METRICS_PORT POLICY WORKER_URL..." >&2
    exit 2
fi
KIND="$1" PORT="$2" MPORT="$3" POLICY="$4"; shift 4
VENV="$BENCH_DIR/peers"
[ -x "$VENV/bin/python" ] || { echo "$0: $VENV missing: run scripts/bench/setup-peers.sh" >&2; exit 1; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_COLOR=1 PYTHONUNBUFFERED=1
# shellcheck disable=SC2206
EXTRA=(${PEER_ARGS:-})
COMMON=(--host 127.0.0.1 --port "$PORT" --prometheus-host 127.0.0.1 --prometheus-port "$MPORT"
        --policy "$POLICY" --worker-startup-timeout-secs 60 --worker-startup-check-interval 1
        --worker-urls "$@")
case "$KIND" in
    sglang) exec "$VENV/bin/python" -m sglang_router.launch_router "${COMMON[@]}" --log-level warn "${EXTRA[@]}" ;;
    vllm)   exec "$VENV/bin/vllm-router" "${COMMON[@]}" --log-level warning "${EXTRA[@]}" ;;
    *) echo "$0: unknown router '$KIND' (sglang|vllm)" >&2; exit 2 ;;
esac
