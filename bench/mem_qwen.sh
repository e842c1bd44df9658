#!/usr/bin/env bash
# Activation memory at Qwen2.5-0.5B's shape (issue 31 item 2): vocabulary 151936, hidden 896, 24 layers, 14 heads
# on 2 key/value heads, MLP 4864, tied head, q/k/v biases; T=1024, bf16, one GPU, the same micro-batch for all.
# zerorun with the head and loss unchunked (train.loss_chunk_mib 0), chunked (the default 256 MiB of logits a
# chunk), and with selective recomputation (activation_checkpointing.recompute: norms+mlp_act, attention, block),
# then PyTorch (torch.compile, SDPA, fused AdamW) on the same shape: tokens/s, the device peak and zerorun's
# activations peak, one JSON line each and a table.
# Usage (device machine, after tests/make_device_bundle.sh): bash bench/mem_qwen.sh [MICRO_BATCH=16] [STEPS=10]
# (LAYERS=4 for a quick look; NO_TORCH=1: zerorun only)
set -uo pipefail
cd "$(dirname "$0")/.."
MB=${1:-16}
STEPS=${2:-10}
LAYERS=${LAYERS:-24}
source tests/device_env.sh
ZR=${ZR:-.devbuild/bin/zerorun}
W=${BENCH_DIR:-$(mktemp -d)}
mkdir -p "$W"
RES=$W/mem_results.jsonl
rm -f "$RES"
"$ZR" init --arch qwen2 --vocab 151936 --n_ctx 1024 --n_embd 896 --n_layer "$LAYERS" --n_head 14 --n_kv_head 2 \
  --ffn 4864 --tied -o "$W/qwen.bin" >/dev/null || { echo "init failed"; exit 1; }
run() {  # name, extra config JSON (train block keys, then top-level blocks)
  local name=$1 train=$2 top=$3
  echo "{\"train_micro_batch_size_per_gpu\": $MB, \"bf16\": {\"enabled\": true}, \"steps_per_print\": 1000,
    \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, \"train\": {$train} $top}" >"$W/c.json"
  rm -rf "$W/log"
  if "$ZR" --device cuda --config "$W/c.json" "$W/qwen.bin" --steps $((STEPS + 3)) --log_dir "$W/log" >"$W/zr.out" 2>&1; then
    python3 - "$W/log/metrics.jsonl" "$name" "$MB" "$W/zr.out" <<'PY' | tee -a "$RES"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
name, B, out = sys.argv[2], int(sys.argv[3]), open(sys.argv[4]).read()
peak = re.findall(r"device peak=([0-9.]+)MiB", out)
act = re.findall(r"activations peak=([0-9.]+)MiB", out)
tok = B * 1024 / (sum(r["seconds"] for r in rows) / len(rows))
print(json.dumps({"impl": "zerorun " + name, "tokens_per_s": tok,
                  "peak_gib": float(peak[-1]) / 1024 if peak else None,
                  "act_gib": float(act[-1]) / 1024 if act else None, "loss": rows[-1]["loss"]}))
PY
  else
    echo "zerorun $name failed:"; tail -5 "$W/zr.out"
  fi
}
run "unchunked" '"loss_chunk_mib": 0' ''
run "chunked" '' ''
run "chunked+norms+mlp_act" '' ', "activation_checkpointing": {"recompute": ["norms", "mlp_act"]}'
run "chunked+attention" '' ', "activation_checkpointing": {"recompute": "attention"}'
run "chunked+block" '' ', "activation_checkpointing": {}'
if [[ -z "${NO_TORCH:-}" ]]; then
  python3 bench/torch_llama.py --size qwen2.5-0.5B --layers "$LAYERS" --embd 896 --heads 14 --kv_heads 2 --ffn 4864 \
    --vocab 151936 --tied 1 --qkv_bias 1 --batch "$MB" --steps "$STEPS" 2>"$W/torch.err" | tee -a "$RES" ||
    { echo "pytorch failed:"; tail -5 "$W/torch.err"; }
fi
python3 - "$RES" "$MB" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"Qwen2.5-0.5B shape, micro-batch {sys.argv[2]}, T 1024, bf16")
print(f"{'impl':>32} {'tokens/s':>10} {'device peak GiB':>16} {'activations GiB':>16}")
for r in rows:
    pk = f"{r['peak_gib']:.2f}" if r.get("peak_gib") is not None else "?"
    ac = f"{r['act_gib']:.2f}" if r.get("act_gib") is not None else "-"
    print(f"{r['impl']:>32} {r['tokens_per_s']:>10.0f} {pk:>16} {ac:>16}")
PY
