#!/usr/bin/env bash
# One training step of GPT-2 (124M by default), bf16, micro batch 8, under ncu: the
# per-kernel time breakdown (bench/ncu_step.py) without the profiler's per-op syncs.
# Usage (device machine, after tests/make_device_bundle.sh): [DRAM=1] bash bench/ncu_step.sh [LAYERS EMBD HEADS BATCH]
# A Llama instead: LLAMA="KV_HEADS FFN" (vocab 32000), e.g. LLAMA="4 2816" bash bench/ncu_step.sh 24 1024 16 4
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/device_env.sh
L=${1:-12} C=${2:-768} H=${3:-12} B=${4:-8}
ZR=.devbuild/bin/zerorun
W=$(mktemp -d)
if [[ -n "${LLAMA:-}" ]]; then
  read -r KV FF <<<"$LLAMA"
  "$ZR" init --arch llama --vocab 32000 --n_ctx 1024 --n_embd "$C" --n_layer "$L" --n_head "$H" --n_kv_head "$KV" \
    --ffn "$FF" -o "$W/m.bin" >/dev/null
else
  "$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd "$C" --n_layer "$L" --n_head "$H" -o "$W/m.bin" >/dev/null
fi
echo "{\"train_micro_batch_size_per_gpu\": $B, \"bf16\": {\"enabled\": true}, \"steps_per_print\": 1000}" >"$W/c.json"
# Steps 1-3 warm up (plans, allocator); capture well into the run, two steps' worth of kernels (a step is about
# 31 kernels a layer + 20 (38 for a Llama): skip ~6.4 steps, capture ~3.6; 2500 and 1400 at 12 layers).
PER=$(((${LLAMA:+7 +} 31) * L + 20))  # a Llama layer has about 7 kernels more
# DRAM=1: each kernel's DRAM bytes too (replayed passes: slower).
M=gpu__time_duration.sum${DRAM:+,dram__bytes_read.sum,dram__bytes_write.sum}
ncu --clock-control none --metrics "$M" --csv --page raw --launch-skip $((PER * 64 / 10)) \
  --launch-count $((PER * 36 / 10)) "$ZR" --device cuda --config "$W/c.json" "$W/m.bin" --steps 14 >"$W/ncu.csv" 2>"$W/ncu.err" || tail -5 "$W/ncu.err"
[[ -n "${OUT:-}" ]] && cp "$W/ncu.csv" "$OUT/"
python3 bench/ncu_step.py "$W/ncu.csv" "${TOP:-45}"
