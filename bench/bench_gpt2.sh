#!/usr/bin/env bash
# GPT-2 124M / 350M / 1.5B (and Llama llama-336M / llama-1B) from random init,
# T=1024, bf16, one GPU: zerorun vs PyTorch (torch.compile, fused AdamW, SDPA)
# in the same call. Prints one JSON
# line per run and a side-by-side table with the zerorun/PyTorch ratio.
# Usage (device machine, after tests/make_device_bundle.sh): bash bench/bench_gpt2.sh "124M 350M" [STEPS]
# (NO_TORCH=1: zerorun only, e.g. for an A/B of a ZERORUN_* setting)
set -uo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-124M 350M 1.5B}
STEPS=${2:-10}
source tests/device_env.sh
ZR=${ZR:-.devbuild/bin/zerorun}
W=${BENCH_DIR:-$(mktemp -d)}  # BENCH_DIR keeps the model files (m-SIZE.bin) for later scripts
mkdir -p "$W"
declare -A L=([124M]=12 [350M]=24 [1.5B]=48) C=([124M]=768 [350M]=1024 [1.5B]=1600) H=([124M]=12 [350M]=16 [1.5B]=25)
declare -A B=([124M]=8 [350M]=4 [1.5B]=2)
# Llama-architecture sizes (bench/torch_llama.py on the PyTorch side): grouped-query attention, SwiGLU, rotary,
# vocab 32000, untied head. llama-1B is TinyLlama-1.1B's shape (C 2048, 22 layers, 32 heads on 4 key/value heads).
L+=([llama-336M]=24 [llama-1B]=22) C+=([llama-336M]=1024 [llama-1B]=2048) H+=([llama-336M]=16 [llama-1B]=32)
B+=([llama-336M]=4 [llama-1B]=2)
declare -A KV=([llama-336M]=4 [llama-1B]=4) FF=([llama-336M]=2816 [llama-1B]=5632)
RES=$W/results.jsonl
rm -f "$RES"
for s in $SIZES; do
  [[ -n "${L[$s]:-}" ]] || { echo "unknown size '$s' (${!L[*]})"; exit 2; }
  if [[ $s == llama-* ]]; then
    "$ZR" init --arch llama --vocab 32000 --n_ctx 1024 --n_embd ${C[$s]} --n_layer ${L[$s]} --n_head ${H[$s]} \
      --n_kv_head ${KV[$s]} --ffn ${FF[$s]} -o "$W/m-$s.bin" >/dev/null
  else
    "$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd ${C[$s]} --n_layer ${L[$s]} --n_head ${H[$s]} \
      -o "$W/m-$s.bin" >/dev/null
  fi
  echo "{\"train_micro_batch_size_per_gpu\": ${B[$s]}, \"bf16\": {\"enabled\": true}, \"steps_per_print\": 1000,
    \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}}" >"$W/c.json"
  rm -rf "$W/log"
  if "$ZR" --device cuda --config "$W/c.json" "$W/m-$s.bin" --steps $((STEPS + 3)) --log_dir "$W/log" >"$W/zr.out" 2>&1; then
    python3 - "$W/log/metrics.jsonl" "$s" "${B[$s]}" "${L[$s]}" "${C[$s]}" "$W/zr.out" <<'PY' | tee -a "$RES"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
size, B, L, C = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
out = open(sys.argv[6]).read()
P = int(re.search(r"model \S+: (\d+) parameters", out).group(1))
peak = re.findall(r"device peak=([0-9.]+)MiB", out)
tok = B * 1024 / (sum(r["seconds"] for r in rows) / len(rows))
print(json.dumps({"impl": "zerorun", "size": size, "params": P, "tokens_per_s": tok,
                  "mfu": tok * (6 * P + 6 * L * C * 1024) / 989e12,
                  "peak_gib": float(peak[-1]) / 1024 if peak else None, "loss": rows[-1]["loss"]}))
PY
  else
    echo "zerorun $s failed:"; tail -5 "$W/zr.out"
  fi
  [[ -n "${NO_TORCH:-}" ]] && continue
  if [[ $s == llama-* ]]; then
    python3 bench/torch_llama.py --size "$s" --layers ${L[$s]} --embd ${C[$s]} --heads ${H[$s]} --kv_heads ${KV[$s]} \
      --ffn ${FF[$s]} --batch ${B[$s]} --steps "$STEPS" 2>"$W/torch.err" | tee -a "$RES" ||
      { echo "pytorch $s failed:"; tail -5 "$W/torch.err"; }
  else
    python3 bench/torch_gpt2.py --size "$s" --layers ${L[$s]} --embd ${C[$s]} --heads ${H[$s]} --batch ${B[$s]} \
      --steps "$STEPS" 2>"$W/torch.err" | tee -a "$RES" || { echo "pytorch $s failed:"; tail -5 "$W/torch.err"; }
  fi
done
cat "$RES"
python3 - "$RES" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'size':>6} {'impl':>16} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'zerorun/pytorch':>16}")
for r in rows:
    ref = [x for x in rows if x["size"] == r["size"] and x["impl"].startswith("pytorch")]
    ratio = f"{r['tokens_per_s'] / ref[0]['tokens_per_s']:.3f}x" if r["impl"] == "zerorun" and ref else ""
    pk = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "?"
    print(f"{r['size']:>6} {r['impl']:>16} {r['tokens_per_s']:>10.0f} {100 * r['mfu']:>6.1f}% {pk:>9} {ratio:>16}")
PY
