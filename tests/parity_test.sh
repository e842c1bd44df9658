#!/usr/bin/env bash
# N-rank data parallel / ZeRO-1 on CPU (mpirun) vs one rank on the same
# global batch: per-step losses of the tiny GPT-2 within 1e-5 relative for
# 20 steps, with gradient accumulation and clipping active.
set -u
ZR=$(realpath "${1:?usage: parity_test.sh path/to/zerorun}")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
"$ZR" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 --seed 9 -o m.bin >/dev/null
pass=0 fail=0
losses() { sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' "$1/metrics.jsonl"; }
for stage in 0 1; do
  cat >c.json <<EOF2
{"train_batch_size": 12, "gradient_clipping": 0.5, "zero_optimization": {"stage": $stage},
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1}}}
EOF2
  "$ZR" --config c.json m.bin --steps 20 --micro_batch_size 2 --log_dir ref >/dev/null 2>&1 || { echo "FAIL - 1-rank run"; exit 1; }
  for spec in "2 2" "3 2" "4 3"; do
    set -- $spec
    n=$1 micro=$2
    out=$("$ZR" --num_gpus "$n" --device cpu --config c.json m.bin --steps 20 --micro_batch_size "$micro" \
      --log_dir "r$n" 2>&1)
    if [[ $? -ne 0 ]]; then
      fail=$((fail + 1)); echo "FAIL - stage $stage on $n ranks did not run:"; echo "$out" | tail -5; continue
    fi
    worst=$(paste <(losses ref) <(losses "r$n") | awk 'BEGIN{w=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d} END{printf "%.3g", w}')
    rows=$(losses "r$n" | wc -l)
    if [[ $rows -eq 20 ]] && awk -v w="$worst" 'BEGIN{exit !(w <= 1e-5)}'; then
      pass=$((pass + 1)); echo "ok   - ZeRO-$stage on $n ranks vs 1 rank: worst relative loss difference $worst"
    else
      fail=$((fail + 1)); echo "FAIL - ZeRO-$stage on $n ranks: worst $worst over $rows steps"
    fi
  done
done
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
