#!/usr/bin/env bash
# bf16 ZeRO-1 and ZeRO-2 on 2 ranks sharing one GPU (--comm mpi): the weights are all-gathered as their 16-bit copy
# and the f32 values some ops read are widened from it, also after a resume. 3 steps, save, resume for 3 more =
# 6 straight steps bit for bit (deterministic kernels); the step-3 checkpoint resumed on 1 rank trains within
# bf16 noise of the straight run. Run by tests/run_gpu.sh (device machine, after tests/make_device_bundle.sh).
# Usage: bash tests/gpu_bf16_resume.sh ZERORUN
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/lib.sh
Z=$(realpath "$1")
DEV=${DEVICE:-cuda}  # DEVICE=cpu: the same runs on CPU ranks (a check of this script)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none ZERORUN_DETERMINISTIC=1
"$Z" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 --seed 4 -o x.bin >/dev/null
"$PY" -c '
import struct
toks = [(i * 7 + 3) % 128 for i in range(128 * 40 + 1)]
with open("cyc.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack(f"<{len(toks)}H", *toks))'
for st in 1 2; do
  echo "{\"train_batch_size\": 12, \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": $st},
    \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}}" >b.json
  rm -rf S A B C
  b=(--device "$DEV" --comm mpi --num_gpus 2 --config b.json x.bin --data cyc.bin)
  "$Z" "${b[@]}" --steps 6 --log_dir A >>x.log 2>&1
  "$Z" "${b[@]}" --steps 3 --save_dir S --log_dir B >>x.log 2>&1
  "$Z" "${b[@]}" --steps 6 --save_dir S --resume global_step3 --log_dir B >>x.log 2>&1
  "$Z" --device "$DEV" --config b.json x.bin --data cyc.bin --steps 6 --save_dir S --resume global_step3 \
    --log_dir C >>x.log 2>&1
  worst=$(loss_diff A B)
  one=$(paste -d' ' <(losses A | tail -3) <(losses C) |
    awk '{d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d} END{printf "%.2e", w+0}')
  if [[ $(losses B | wc -l) -eq 6 && $(losses C | wc -l) -eq 3 ]] &&
    awk -v w="$worst" -v o="$one" 'BEGIN{exit !(w == 0 && o <= 1e-2)}'; then
    ok "bf16 ZeRO-$st on 2 $DEV ranks: resume = straight run bit for bit; resumed on 1 rank within $one"
  else
    bad "bf16 ZeRO-$st resume: straight vs resumed $worst, on 1 rank $one"
    tail -3 x.log
  fi
done
[[ $fail -eq 0 ]]
