#!/usr/bin/env bash
# Runs kubernetes-sigs inference-perf once, offline, against an OpenAI-compatible
# endpoint (a router, a podsim pod, a llama-server), with a shared-prefix workload
# (num_groups system prompts, each shared by num_prompts_per_group users), a
# streaming /v1/completions API and a constant request rate.
#
#   scripts/bench/run-inference-perf.sh BASE_URL MODEL OUT_DIR [RATE] [DURATION]
#
#   BASE_URL   e.g. http://127.0.0.1:18500 (no /v1)
#   MODEL      model name sent in requests (podsim echoes any; llama-server: its alias)
#   OUT_DIR    created; gets config.yml, inference-perf.log and the reports
#              (summary_lifecycle_metrics.json, stage_0_lifecycle_metrics.json, ...)
#   RATE       requests/s (default 2), DURATION seconds (default 20)
#
# Workload knobs (env, defaults in brackets): IP_NUM_GROUPS [4],
# IP_PROMPTS_PER_GROUP [8], IP_SYSTEM_PROMPT_LEN [512], IP_QUESTION_LEN [32],
# IP_OUTPUT_LEN [16], IP_SEED [42], IP_NUM_WORKERS [1] (worker processes),
# IP_API_TYPE [completion] (or chat), IP_TIMEOUT [120] (per-request seconds),
# IP_PER_REQUEST [false] (also write per_request_lifecycle_metrics.json).
# Lengths are in tokens of the local tokenizer (.bench/tokenizer), not the server's.
# Needs scripts/bench/setup-inference-perf.sh first.
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ $# -lt 3 ]; then
    echo "usage: $0 BASE_URL MODEL OUT_DIR [RATE] [DURATION]" >&2
    exit 2
fi
BASE_URL="$1" MODEL="$2" OUT_DIR="$3" RATE="${4:-2}" DURATION="${5:-20}"
VENV="$BENCH_DIR/iperf"
TOK="$BENCH_DIR/tokenizer"
[ -x "$VENV/bin/inference-perf" ] && [ -s "$TOK/tokenizer.json" ] || {
    echo "$0: $VENV or $TOK missing: run scripts/bench/setup-inference-perf.sh" >&2
    exit 1
}
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

cat >"$OUT_DIR/config.yml" <<YAML
api:
  type: ${IP_API_TYPE:-completion}
  streaming: true
data:
  type: shared_prefix
  shared_prefix:
    num_groups: ${IP_NUM_GROUPS:-4}
    num_prompts_per_group: ${IP_PROMPTS_PER_GROUP:-8}
    system_prompt_len: ${IP_SYSTEM_PROMPT_LEN:-512}
    question_len: ${IP_QUESTION_LEN:-32}
    output_len: ${IP_OUTPUT_LEN:-16}
    seed: ${IP_SEED:-42}
load:
  type: constant
  stages:
  - rate: ${RATE}
    duration: ${DURATION}
  num_workers: ${IP_NUM_WORKERS:-1}
  request_timeout: ${IP_TIMEOUT:-120}
server:
  type: vllm
  model_name: ${MODEL}
  base_url: ${BASE_URL}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: ${TOK}
report:
  request_lifecycle:
    summary: true
    per_stage: true
    per_request: ${IP_PER_REQUEST:-false}
    use_server_output_tokens: true
storage:
  local_storage:
    path: ${OUT_DIR}
YAML

cd "$OUT_DIR"   # some report files land in the working directory
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
set +e
"$VENV/bin/inference-perf" --config_file "$OUT_DIR/config.yml" >"$OUT_DIR/inference-perf.log" 2>&1
rc=$?
set -e
if [ $rc -ne 0 ] || [ ! -s "$OUT_DIR/summary_lifecycle_metrics.json" ]; then
    tail -n 30 "$OUT_DIR/inference-perf.log" >&2
    echo "$0: inference-perf failed (exit $rc); log: $OUT_DIR/inference-perf.log" >&2
    exit $(( rc == 0 ? 1 : rc ))
fi
echo "$OUT_DIR/summary_lifecycle_metrics.json"
