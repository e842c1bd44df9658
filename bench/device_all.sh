#!/usr/bin/env bash
# Everything a one-GPU device call should run, in order of importance, each
# part under its own time limit so one slow part cannot starve the rest:
# GPU tests (tests/run_gpu.sh), the GEMM probe (cuBLASLt vs PyTorch products), the kernel-time breakdown of one
# GPT-2 124M step and of a llama-336M step under ncu (bench/ncu_step.sh) and the GPT-2 step's host-side queue/wait
# times (ZERORUN_PROFILE=host), the GPT-2 benchmark against PyTorch, and GPT-2 1.5B with ZeRO-3 + CPU offload; with
# 2+ GPUs also tests/run_multi_gpu.sh. Logs go to OUT_DIR.
# Usage (device machine, after tests/make_device_bundle.sh, carry .devbuild):
#   bash bench/device_all.sh "$OUT"        (about 8 minutes; PARTS="gpu_tests attention" runs only those)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${1:-${OUT:-/tmp}}
source tests/device_env.sh
ZR=.devbuild/bin/zerorun
part() {  # name seconds cmd...   (PARTS="a b": only those parts)
  local name=$1 t=$2; shift 2
  [[ -n "${PARTS:-}" && " $PARTS " != *" $name "* ]] && return 0
  echo "=== $name"
  timeout "$t" "$@" >"$OUTD/$name.log" 2>&1
  local rc=$?
  grep -v "^step " "$OUTD/$name.log" | tail -${TAIL:-24}
  [[ $rc -eq 124 ]] && echo "($name cut at ${t}s)"
  return 0
}
part gpu_tests 170 bash tests/run_gpu.sh "$OUTD"
W=$(mktemp -d)
TAIL=2 part attention 60 bash -c '.devbuild/bin/zerorun_attn_probe; python3 bench/torch_sdpa.py'
TAIL=12 part gemm_probe 60 bash -c '.devbuild/bin/zerorun_gemm_probe; python3 bench/torch_gemm.py'
TAIL=40 part ncu_step_124m 120 bash bench/ncu_step.sh
LLAMA="4 2816" TAIL=40 part ncu_step_llama336m 150 bash bench/ncu_step.sh 24 1024 16 4
"$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd 768 --n_layer 12 --n_head 12 -o "$W/p.bin" >/dev/null
echo '{"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": true}, "steps_per_print": 1000}' >"$W/p.json"
ZERORUN_PROFILE=host TAIL=30 part host_profile_124m 60 "$ZR" --device cuda --config "$W/p.json" "$W/p.bin" --steps 30
ZERORUN_FUSE=0 NO_TORCH=1 BENCH_DIR=$W/ab TAIL=3 part unfused_124m 90 bash bench/bench_gpt2.sh 124M 8
BENCH_DIR=$W/bench TAIL=8 part bench_gpt2 420 bash bench/bench_gpt2.sh "${SIZES:-124M 350M 1.5B}" 8
MODEL=$W/bench/m-1.5B.bin TAIL=8 part offload_1p5b 100 bash bench/offload_1p5b.sh 3
G=$(nvidia-smi -L 2>/dev/null | wc -l)
[[ $G -ge 2 ]] && TAIL=40 part multi_gpu 560 bash tests/run_multi_gpu.sh "$OUTD"
exit 0
