#!/usr/bin/env bash
# Checks the external benchmark parts end to end on loopback, and prints the
# evidence. Starts only its own processes (on free ports) and stops them by PID.
#
#   scripts/bench/verify.sh peers   sglang-router and vllm-router (cache_aware) over 3 podsim pods:
#                                   readiness time, a completion, a streaming chat, prefix affinity
#   scripts/bench/verify.sh llama   2 llama-servers: readiness time, smoke, shared-prefix cold/warm TTFT
#   scripts/bench/verify.sh iperf   inference-perf (shared_prefix, streaming completions) against 1 podsim
#   scripts/bench/verify.sh all
#
# Needs the matching setup-*.sh first, and target/release/podsim (built if missing).
set -euo pipefail
. "$(dirname "$0")/common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
PROBE=(python3 "$HERE/probe.py")
PODSIM="$REPO_ROOT/target/release/podsim"
TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

POD_PIDS=()
start_pods() { # N -> stops the previous pods, sets WORKERS (space-separated URLs)
    [ -x "$PODSIM" ] || (cd "$REPO_ROOT" && cargo build --release -p podsim)
    local i p
    for p in "${POD_PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    POD_PIDS=()
    WORKERS=""
    rm -f "$TMP"/pod*.port
    for i in $(seq 1 "$1"); do
        "$PODSIM" --port 0 --name "pod-$i" --ready-file "$TMP/pod$i.port" --exit-after-secs 900 >"$TMP/pod$i.log" 2>&1 &
        PIDS+=($!); POD_PIDS+=($!)
    done
    for i in $(seq 1 "$1"); do
        for _ in $(seq 1 100); do [ -s "$TMP/pod$i.port" ] && break; sleep 0.05; done
        WORKERS="$WORKERS http://127.0.0.1:$(cat "$TMP/pod$i.port")"
    done
}

verify_peers() {
    local kind port mport pid
    for kind in sglang vllm; do
        start_pods 3   # fresh pods per router: podsim caches outlive a router
        port=$(free_port) mport=$(free_port)
        # shellcheck disable=SC2086
        "$HERE/start-peer.sh" "$kind" "$port" "$mport" cache_aware $WORKERS >"$TMP/$kind.log" 2>&1 &
        pid=$!; PIDS+=("$pid")
        say "$kind (pid $pid, port $port) over 3 fresh podsim pods: ready (GET /readiness healthy_workers=3) after $("${PROBE[@]}" wait "http://127.0.0.1:$port/readiness" 60 3) s"
        "${PROBE[@]}" smoke "http://127.0.0.1:$port" m
        "${PROBE[@]}" affinity "http://127.0.0.1:$port" 6
        echo "metrics (:$mport): $(curl -s "127.0.0.1:$mport/metrics" | grep -c -v '^#') series, e.g. $(curl -s "127.0.0.1:$mport/metrics" | grep -m1 -E '^(smg_worker_selection_total|vllm_router_processed_requests_total)')"
        echo "log lines: $(wc -l <"$TMP/$kind.log")"
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
}

verify_llama() {
    local p1 p2 l1 l2 t0
    p1=$(free_port) p2=$(free_port)
    t0=$(date +%s.%N)
    "$HERE/start-llama.sh" "$p1" gemma-270m >"$TMP/llama1.log" 2>&1 & l1=$!; PIDS+=("$l1")
    "$HERE/start-llama.sh" "$p2" gemma-270m >"$TMP/llama2.log" 2>&1 & l2=$!; PIDS+=("$l2")
    "${PROBE[@]}" wait "http://127.0.0.1:$p1/health" 120 >/dev/null
    "${PROBE[@]}" wait "http://127.0.0.1:$p2/health" 120 >/dev/null
    say "2 llama-servers (pids $l1 $l2, ports $p1 $p2), started together: both ready (GET /health 200) $(python3 -c "import time; print(f'{time.time() - $t0:.2f}')") s after start"
    echo "RSS: $(ps -o rss= -p "$l1") kB, $(ps -o rss= -p "$l2") kB"
    "${PROBE[@]}" smoke "http://127.0.0.1:$p1" gemma-270m
    cat "$REPO_ROOT/README.md" "$REPO_ROOT/tools/podsim/README.md" | tr -s ' \n' ' ' >"$TMP/words.txt"
    say "shared prefix (~500 tokens), 3 questions, server 1"
    "${PROBE[@]}" ttft "http://127.0.0.1:$p1" gemma-270m "$TMP/words.txt" 250
    echo "server 1 /metrics: $(curl -s "127.0.0.1:$p1/metrics" | grep -E '^llamacpp:prompt_tokens(_cached)?_total' | tr '\n' ' ')"
}

verify_iperf() {
    start_pods 1
    local url="${WORKERS# }"
    say "inference-perf -> podsim $url (rate 2/s, 10 s)"
    local t0=$SECONDS
    "$HERE/run-inference-perf.sh" "$url" sim-model "$TMP/iperf" 2 10 >/dev/null
    echo "took $(( SECONDS - t0 )) s; reports: $(cd "$TMP/iperf" && ls ./*.json | tr '\n' ' ')"
    python3 - "$TMP/iperf/summary_lifecycle_metrics.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); s = d["successes"]; p = s["prompt_tokens"]
lat = s["latency"]["time_to_first_token"]
print(f"successes={s['count']} failures={d['failures']['count']} prompt_tokens total={p['total']:.0f} "
      f"cached={p['cached']:.0f} ({p['cached'] / p['total']:.0%}) ttft p50={lat['median'] * 1000:.1f}ms "
      f"output_tokens mean={s['output_tokens']['mean']:.0f} rps={s['throughput']['requests_per_sec']:.2f}")
assert s["count"] > 0 and d["failures"]["count"] == 0 and p["cached"] > 0
PY
}

case "${1:-all}" in
    peers) verify_peers ;;
    llama) verify_llama ;;
    iperf) verify_iperf ;;
    all) verify_peers; verify_llama; verify_iperf ;;
    *) echo "usage: $0 peers|llama|iperf|all" >&2; exit 2 ;;
esac
echo; echo "verify ${1:-all}: OK"
