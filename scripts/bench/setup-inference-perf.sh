#!/usr/bin/env bash
# kubernetes-sigs inference-perf, the client for the benchmark, run offline:
#   .bench/iperf/       venv (Python 3.12: inference-perf needs >= 3.12) with inference-perf
#   .bench/tokenizer/   a local Hugging Face tokenizer dir (byte-level BPE, 8k vocab)
#                       trained here on the shakespeare.txt that inference-perf ships,
#                       so nothing is fetched from a hub (HF_HUB_OFFLINE=1 works)
# Idempotent: returns at once when the pinned version and the tokenizer are there.
set -euo pipefail
. "$(dirname "$0")/common.sh"

INFERENCE_PERF_VERSION="${INFERENCE_PERF_VERSION:-0.7.0}"
VENV="$BENCH_DIR/iperf"
TOK="$BENCH_DIR/tokenizer"
PY312="${PY312:-}"
if [ -z "$PY312" ]; then
    if command -v pyenv >/dev/null 2>&1 && [ -x "$(pyenv root)/versions/3.12.1/bin/python" ]; then
        PY312="$(pyenv root)/versions/3.12.1/bin/python"
    else
        PY312="$(command -v python3.12 || true)"
    fi
fi

if pip_has "$VENV" inference-perf "$INFERENCE_PERF_VERSION" && [ -s "$TOK/tokenizer.json" ] \
    && [ -s "$TOK/tokenizer_config.json" ]; then
    exit 0
fi
[ -n "$PY312" ] && [ -x "$PY312" ] || { blog "no Python 3.12 found (set PY312=/path/to/python3.12)"; exit 1; }
mkdir -p "$BENCH_DIR"
make_venv "$VENV" "$PY312"
if ! pip_has "$VENV" inference-perf "$INFERENCE_PERF_VERSION"; then
    blog "installing inference-perf==$INFERENCE_PERF_VERSION (~1 min)"
    t0=$(date +%s)
    "$VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" "inference-perf==$INFERENCE_PERF_VERSION"
    blog "installed in $(( $(date +%s) - t0 )) s"
fi

if ! { [ -s "$TOK/tokenizer.json" ] && [ -s "$TOK/tokenizer_config.json" ]; }; then
    blog "training a byte-level BPE tokenizer on inference-perf's shakespeare.txt -> $TOK"
    rm -rf "$TOK.tmp"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" - "$TOK.tmp" <<'PY'
import sys
from importlib.resources import files
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
from transformers import PreTrainedTokenizerFast

out = sys.argv[1]
corpus = str(files("inference_perf").joinpath("assets/shakespeare.txt"))
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
trainer = trainers.BpeTrainer(vocab_size=8192, min_frequency=2, show_progress=False,
                              special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train([corpus], trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                               eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                               model_max_length=32768)
fast.save_pretrained(out)
print(f"vocab {fast.vocab_size}, 'Hello world' -> {fast('Hello world').input_ids}")
PY
    rm -rf "$TOK"
    mv "$TOK.tmp" "$TOK"
fi
blog "done: $("$VENV/bin/inference-perf" --help >/dev/null 2>&1 && echo "inference-perf $INFERENCE_PERF_VERSION ok"), tokenizer $TOK"
