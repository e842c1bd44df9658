#!/usr/bin/env bash
# GPT-2 1.5B on one GPU with ZeRO-3 + optimizer (and optionally parameter)
# offload to CPU, bf16: prints tokens/s and the memory report (device peak vs
# host). Usage (device machine, after tests/make_device_bundle.sh):
#   [MODEL=m-1.5B.bin] bash bench/offload_1p5b.sh [STEPS] [offload_param: cpu|none]
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4}
PARAM=${2:-none}
source tests/device_env.sh
ZR=${ZR:-.devbuild/bin/zerorun}
W=$(mktemp -d)
M=${MODEL:-$W/m.bin}  # MODEL: an existing GPT-2 1.5B model.bin (bench_gpt2.sh's BENCH_DIR/m-1.5B.bin)
[[ -f "$M" ]] || "$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd 1600 --n_layer 48 --n_head 25 -o "$M" >/dev/null
cat >"$W/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "$PARAM"}}}
JSON
"$ZR" --device cuda --config "$W/c.json" "$M" --steps "$STEPS" 2>&1 | grep --line-buffered -E "ZeRO|step|memory|error"
