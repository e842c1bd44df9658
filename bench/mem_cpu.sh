#!/usr/bin/env bash
# Activation memory on the CPU from the engine's counters (the memory line's "activations peak"), at a
# Qwen2.5-0.5B-like shape reduced in depth and length (vocabulary 151936, hidden 896, 14 heads on 2, MLP 4864, tied,
# q/k/v biases; LAYERS=2, T=64, micro-batch 4: 256 rows): the head and loss unchunked (train.loss_chunk_mib 0) and in
# chunks (train.loss_chunk_rows 32; the default 256 MiB a chunk does not chunk 256 rows), then each
# activation_checkpointing.recompute mode with the chunked head. Two steps each; the loss of step 2 is printed too
# (every variant computes the same model: the losses agree to float rounding).
# Usage: bash bench/mem_cpu.sh [BUILD_DIR=build]   (about 2 GB of memory; a few minutes on 2 busy cores)
set -euo pipefail
cd "$(dirname "$0")/.."
ZR=${1:-build}/zerorun
LAYERS=${LAYERS:-2}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$ZR" init --arch qwen2 --vocab 151936 --n_ctx 64 --n_embd 896 --n_layer "$LAYERS" --n_head 14 --n_kv_head 2 \
  --ffn 4864 --tied -o "$W/q.bin" >/dev/null
run() {  # name, train keys, top-level blocks
  echo "{\"train_micro_batch_size_per_gpu\": 4, \"steps_per_print\": 1, \"train\": {\"data\": \"synthetic\" $2} $3}" \
    >"$W/c.json"
  "$ZR" --device cpu --config "$W/c.json" "$W/q.bin" --steps 2 >"$W/out" 2>&1 || { cat "$W/out"; exit 1; }
  local act loss
  act=$(grep -o "activations peak=[0-9.]*MiB" "$W/out" | tail -1)
  loss=$(grep -o "loss[ =:]*[0-9.]*" "$W/out" | tail -1)
  printf '%-36s %-32s %s\n' "$1" "$act" "$loss"
}
run "unchunked" ', "loss_chunk_mib": 0' ''
run "chunked (32 rows)" ', "loss_chunk_rows": 32' ''
for m in '"norms"' '"mlp_act"' '"attention"' '["norms", "mlp_act", "attention"]' '"block"'; do
  run "chunked + recompute $m" ', "loss_chunk_rows": 32' ", \"activation_checkpointing\": {\"recompute\": $m}"
done
