#!/usr/bin/env bash
# Runs the GPU tests on the device machine from the bundle that
# tests/make_device_bundle.sh made (.devbuild/, carried by the device tool):
# the CUDA-vs-CPU op tests and a GPU-vs-CPU training comparison.
# Usage there: bash tests/run_gpu.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${1:-${OUT:-/tmp}}
source tests/device_env.sh
export ZERORUN_POISON_UNINIT=1  # unwritten tensors are NaN, so a read before a write fails
BIN=.devbuild/bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$BIN/zerorun" report
rc=0
if [[ -x "$BIN/zerorun_nccl_test" ]]; then  # left out of bundles that must fit the carry limit
  "$BIN/zerorun_nccl_test" 2>&1 | tail -3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
else
  echo "zerorun_nccl_test: not in the bundle (BUNDLE_NCCL=1 tests/make_device_bundle.sh packs it)"
fi
"$BIN/zerorun_cuda_tests" 2>&1 | tee "$OUTD/cuda_ops.log" | tail -25
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
if [[ -x "$BIN/zerorun" ]] && "$BIN/zerorun" train --help 2>/dev/null | grep -q -- "--device"; then
  W=$(mktemp -d)
  "$BIN/zerorun" init --arch gpt2 --vocab 256 --n_ctx 64 --n_embd 64 --n_layer 2 --n_head 4 --seed 3 -o "$W/m.bin" >/dev/null
  echo '{"train_batch_size": 8, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' >"$W/c.json"
  for dev in cpu cuda; do
    "$BIN/zerorun" --device $dev --config "$W/c.json" "$W/m.bin" --steps 20 --seq_len 64 --log_dir "$W/$dev" \
      >"$W/$dev.out" 2>&1 || { echo "training on $dev failed:"; tail -5 "$W/$dev.out"; rc=1; }
  done
  if [[ -s "$W/cpu/metrics.jsonl" && -s "$W/cuda/metrics.jsonl" ]]; then
    paste -d' ' <(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' "$W/cpu/metrics.jsonl") \
      <(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' "$W/cuda/metrics.jsonl") |
      awk '{d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; printf "step %2d cpu %.7f cuda %.7f rel %.2e\n", NR, $1, $2, d}
           END{printf "gpu vs cpu fp32, 20 steps: worst relative %.2e -> %s\n", w, (w<=1e-4?"PASS":"FAIL"); exit !(w<=1e-4)}' ||
      rc=1
  fi
fi
# Seed configs on one GPU: ZeRO-3 + optimizer/param offload with "auto" (-> bf16), ZeRO-2 offload bf16.
if [[ -n "${W:-}" ]]; then
  for c in ds_config_zero3.json ds_config_zero2_offload.json; do
    if "$BIN/zerorun" --device cuda --config "configs/$c" "$W/m.bin" --steps 5 --seq_len 64 >"$W/$c.out" 2>&1; then
      echo "ok   - $c on GPU: $(grep -E 'step +5/5' "$W/$c.out" | sed 's/\[zerorun\] //')"
    else
      echo "FAIL - $c on GPU"; tail -4 "$W/$c.out"; rc=1
    fi
  done
fi
exit $rc
