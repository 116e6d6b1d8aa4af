#!/usr/bin/env bash
# Runs one llama.cpp server (Gemma 3 270M Q4_K_M, CPU) in the foreground, as
# this process (exec), so a harness can spawn it and stop it by PID (SIGTERM).
#
#   scripts/bench/start-llama.sh PORT ALIAS [EXTRA llama-server ARGS...]
#
# Serves the OpenAI API on 127.0.0.1:PORT under model name ALIAS (requests may
# name any model). Ready when `GET /health` answers 200 (503 while loading),
# ~1-2 s after start. Prefix cache: per-slot KV only (--cache-ram 0 turns off
# the 8 GiB host-RAM prompt cache, which would make one server look cache-hot
# for every prompt and hide routing effects). 2 slots of 2048 tokens each
# (-c is shared by -np slots), 1 thread: two servers fit on the 2 cores.
# --swa-full: Gemma 3 has sliding-window attention (n_swa 512); without a
# full-size SWA cache llama.cpp cannot roll a slot back to a shared prefix and
# logs "forcing full prompt re-processing due to lack of cache data (likely due
# to SWA ...)": requests sharing a system prompt but differing in the question
# got cached_tokens 0 (only an exact re-send, or a few trailing tokens of
# difference, hit). With it: 356 of 390 tokens cached. Costs ~50 MB RSS.
# Cached prompt tokens: usage.prompt_tokens_details.cached_tokens,
# timings.cache_n, /metrics llamacpp:prompt_tokens_cached_total (if present).
# So with the default each server keeps at most 2 prefixes warm (one per slot,
# LRU slot reuse): a 3rd distinct prefix evicts one. LLAMA_CACHE_RAM=MiB gives a
# bounded host-RAM prompt cache instead (64 held 4 prompts of ~500 tokens, ~11-23
# MiB each, oldest evicted first): a per-server cache capacity knob.
# Extra args are appended (the last occurrence of a flag wins, with a
# deprecation warning), e.g. -t 2. LLAMA_LOG_VERBOSITY (default 2 = warnings).
# Needs scripts/bench/setup-real-llm.sh first.
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ $# -lt 2 ]; then
    echo "usage: $0 PORT ALIAS [EXTRA llama-server ARGS...]" >&2
    exit 2
fi
PORT="$1" ALIAS="$2"; shift 2
LLAMA_SERVER="$BENCH_DIR/bin/llama-server"
MODEL="${LLAMA_MODEL:-$BENCH_DIR/models/gemma3-270m-q4_k_m.gguf}"
[ -x "$LLAMA_SERVER" ] && [ -s "$MODEL" ] || {
    echo "$0: $LLAMA_SERVER or $MODEL missing: run scripts/bench/setup-real-llm.sh" >&2
    exit 1
}

exec "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" -a "$ALIAS" \
    -c 4096 -np 2 -t 1 --metrics --no-webui --cache-ram "${LLAMA_CACHE_RAM:-0}" --swa-full \
    --offline --log-colors off --log-verbosity "${LLAMA_LOG_VERBOSITY:-2}" "$@"
