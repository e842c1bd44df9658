#!/usr/bin/env bash
# Runs the GPU tests on the device machine from the bundle that
# tests/make_device_bundle.sh made (.devbuild/, carried by the device tool):
# the CUDA-vs-CPU op tests and a GPU-vs-CPU training comparison.
# Usage there: bash tests/run_gpu.sh [OUT_DIR]
set -uo pipefail
# A metrics.jsonl line without what may differ between two runs of one job: the timing fields (names ending in
# "seconds") and the memory snapshots (host_bytes, device_bytes, nvme_bytes).
metrics_content() { sed -E 's/"[a-z_]*_bytes":\{[^}]*\},//g; s/"[a-z_]*seconds":[^,}]*,//g; s/,"[a-z_]*seconds":[^,}]*\}/}/g' "$1"; }
cd "$(dirname "$0")/.."
OUTD=${1:-${OUT:-/tmp}}
source tests/device_env.sh
export ZERORUN_POISON_UNINIT=1  # unwritten tensors are NaN, so a read before a write fails
BIN=.devbuild/bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$BIN/zerorun" report
rc=0
"$BIN/zerorun_nccl_test" 2>&1 | tail -3
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
"$BIN/zerorun_cuda_tests" 2>&1 | tee "$OUTD/cuda_ops.log" | tail -25
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
if [[ -x "$BIN/zerorun" ]] && "$BIN/zerorun" train --help 2>/dev/null | grep -q -- "--device"; then
  W=$(mktemp -d)
  "$BIN/zerorun" init --arch gpt2 --vocab 256 --n_ctx 64 --n_embd 64 --n_layer 2 --n_head 4 --seed 3 -o "$W/m.bin" >/dev/null
  echo '{"train_batch_size": 8, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' >"$W/c.json"
  "$BIN/zerorun" init --arch llama --vocab 256 --n_ctx 64 --n_embd 64 --n_layer 2 --n_head 4 --n_kv_head 2 --ffn 160 \
    --seed 3 -o "$W/ll.bin" >/dev/null
  # GPT-2, and a grouped-query Llama (rotary, SwiGLU, RMSNorm): per-step fp32 loss on the GPU vs the CPU.
  for model in m ll; do
    for dev in cpu cuda; do
      "$BIN/zerorun" --device $dev --config "$W/c.json" "$W/$model.bin" --steps 20 --seq_len 64 --log_dir "$W/$model-$dev" \
        >"$W/$model-$dev.out" 2>&1 || { echo "training $model on $dev failed:"; tail -5 "$W/$model-$dev.out"; rc=1; }
    done
    if [[ -s "$W/$model-cpu/metrics.jsonl" && -s "$W/$model-cuda/metrics.jsonl" ]]; then
      paste -d' ' <(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' "$W/$model-cpu/metrics.jsonl") \
        <(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' "$W/$model-cuda/metrics.jsonl") |
        awk -v name=$model '{d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; printf "%s step %2d cpu %.7f cuda %.7f rel %.2e\n", name, NR, $1, $2, d}
             END{printf "%s: gpu vs cpu fp32, 20 steps: worst relative %.2e -> %s\n", (name=="m"?"gpt2":"llama"), w, (w<=1e-4&&NR==20?"PASS":"FAIL"); exit !(w<=1e-4&&NR==20)}' ||
        rc=1
    else rc=1; fi
  done
  # bf16 Llama on the GPU trains (rope in f32 between 16-bit projections and attention).
  echo '{"train_batch_size": 8, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' >"$W/cb.json"
  if "$BIN/zerorun" --device cuda --config "$W/cb.json" "$W/ll.bin" --steps 20 --seq_len 64 --log_dir "$W/ll-bf16" >"$W/ll-bf16.out" 2>&1 &&
    python3 -c 'import json,sys; l=[json.loads(x)["loss"] for x in open(sys.argv[1])]; print(f"ok   - llama bf16 on GPU: loss {l[0]:.4f} -> {l[-1]:.4f}"); sys.exit(not l[-1] < l[0] - 0.3)' "$W/ll-bf16/metrics.jsonl"; then :
  else echo "FAIL - llama bf16 on GPU"; tail -3 "$W/ll-bf16.out"; rc=1; fi
fi
# CUDA graphs against eager runs of the same job: per-step loss and grad norm within 1e-6 relative, the same
# loss scales and skipped steps, and the graphs really captured (bf16 + gas 4 + activation checkpointing: two
# graphs; fp16 with a 2-step scale window: a new capture at every scale change; ZeRO-1). The data is a cycle of
# 256 distinct tokens read in order, so no token repeats within a micro-batch of 2 x 64: the embedding's atomic
# gradient sums then add one value each and the runs are deterministic (attention backward atomic-free).
if [[ -n "${W:-}" ]]; then
  cycle_tokens() {  # FILE V: a cycle through all V token ids (a permutation), 40 times, read in order
    python3 -c '
import struct, sys
v = int(sys.argv[2])
toks = [(i * 7 + 3) % v for i in range(v * 40 + 1)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack(f"<{len(toks)}H", *toks))' "$1" "$2"
  }
  cycle_tokens "$W/cyc.bin" 256
  declare -A GCFG=(
    [bf16_gas4_ckpt]='{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "activation_checkpointing": {"enabled": true}, "gradient_clipping": 1.0}'
    [fp16_window2]='{"train_batch_size": 2, "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 2}}'
    [zero1_bf16]='{"train_batch_size": 2, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}}')
  for name in "${!GCFG[@]}"; do
    echo "${GCFG[$name]}" >"$W/g_$name.json"
    for gr in 0 1; do
      ZERORUN_ATTN_ATOMICS=0 ZERORUN_CUDA_GRAPHS=$gr "$BIN/zerorun" --device cuda --config "$W/g_$name.json" "$W/m.bin" \
        --steps 12 --seq_len 64 --data "$W/cyc.bin" --log_dir "$W/g${gr}_$name" >"$W/g${gr}_$name.out" 2>&1 || {
        echo "FAIL - graphs=$gr $name"; tail -4 "$W/g${gr}_$name.out"; rc=1; }
    done
    caps=$(sed -n 's/.*CUDA graphs: \([0-9]*\) captures.*/\1/p' "$W/g1_$name.out")
    if [[ -z "$caps" || "$caps" -lt 1 ]] || grep -q "CUDA graphs" "$W/g0_$name.out"; then
      echo "FAIL - $name: graphs on/off not as asked (captures: '${caps}')"; rc=1; continue
    fi
    paste -d' ' <(metrics_content "$W/g0_$name/metrics.jsonl") <(metrics_content "$W/g1_$name/metrics.jsonl") |
      python3 -c '
import json, sys
worst, bad, n = 0.0, [], 0
for n, line in enumerate(sys.stdin, 1):
    a, b = line.split(" ", 1)
    a, b = json.loads(a), json.loads(b)
    for k in ("loss", "grad_norm"):
        d = abs(a[k] - b[k]) / max(abs(a[k]), 1e-30); worst = max(worst, d)
        if d > 1e-6: bad.append(f"step {n} {k} {a[k]} vs {b[k]}")
    for k in ("loss_scale", "skipped", "step", "lr"):
        if a[k] != b[k]: bad.append(f"step {n} {k} {a[k]} vs {b[k]}")
print(("ok  " if not bad and n == 12 else "FAIL") + f" - CUDA graphs vs eager, {sys.argv[1]}: {n} steps, worst relative {worst:.2e}, {sys.argv[2]} captures", *bad[:5], sep="\n   ")
sys.exit(1 if bad or n != 12 else 0)' "$name" "$caps" || rc=1
  done
  fp16caps=$(sed -n 's/.*CUDA graphs: \([0-9]*\) captures.*/\1/p' "$W/g1_fp16_window2.out")
  [[ "${fp16caps:-0}" -ge 3 ]] || { echo "FAIL - fp16 with a 2-step scale window captured ${fp16caps:-0} times (a scale change recaptures)"; rc=1; }
fi
# ZERORUN_DETERMINISTIC=1: two runs of one job give the same bits (every step's loss, grad norm, and the final
# weights), on random synthetic tokens that repeat within a micro-batch; bf16 with graphs and the overlapped
# update, and fp32 ZeRO-2 on 2 ranks sharing the GPU.
if [[ -n "${W:-}" ]]; then
  echo '{"train_batch_size": 8, "bf16": {"enabled": true}, "gradient_clipping": 1.0}' >"$W/d16.json"
  echo '{"train_batch_size": 8, "zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}' >"$W/d2.json"
  for job in "d16 1" "d2 2"; do
    set -- $job
    for k in 1 2; do
      ZERORUN_DETERMINISTIC=1 "$BIN/zerorun" --device cuda --comm mpi --num_gpus $2 --config "$W/$1.json" "$W/m.bin" \
        --steps 8 --seq_len 64 --log_dir "$W/det_$1_$k" --final_weights "$W/det_$1_$k.st" >"$W/det_$1_$k.out" 2>&1 ||
        { echo "FAIL - deterministic run $1 #$k"; tail -3 "$W/det_$1_$k.out"; rc=1; }
    done
    if grep -q "deterministic GPU kernels" "$W/det_$1_1.out" &&
      cmp -s <(metrics_content "$W/det_$1_1/metrics.jsonl") <(metrics_content "$W/det_$1_2/metrics.jsonl") &&
      cmp -s "$W/det_$1_1.st" "$W/det_$1_2.st"; then
      echo "ok   - ZERORUN_DETERMINISTIC=1, $1 on $2 rank(s): two runs, the same bits (8 steps' metrics, final weights)"
    else echo "FAIL - ZERORUN_DETERMINISTIC=1, $1: runs differ"; diff "$W/det_$1_1/metrics.jsonl" "$W/det_$1_2/metrics.jsonl" | head -4; rc=1; fi
  done
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
# Out of GPU memory (GPT-2 124M at micro batch 512): a non-zero exit within the timeout, and the error says what
# the block was for, what the rank holds and how to fit.
if [[ -n "${W:-}" ]]; then
  "$BIN/zerorun" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd 768 --n_layer 12 --n_head 12 -o "$W/big.bin" >/dev/null
  echo '{"train_micro_batch_size_per_gpu": 512, "bf16": {"enabled": true}}' >"$W/oom.json"
  timeout 180 "$BIN/zerorun" --device cuda --config "$W/oom.json" "$W/big.bin" --steps 2 >"$W/oom.out" 2>&1
  orc=$?
  if [[ $orc -ne 0 && $orc -ne 124 ]] && grep -q "out of GPU memory on cuda:0 allocating .* for " "$W/oom.out" &&
    grep -q "train_micro_batch_size_per_gpu" "$W/oom.out"; then
    echo "ok   - out of GPU memory: rc=$orc, $(grep -o 'out of GPU memory[^;]*;[^;]*' "$W/oom.out" | head -1)"
  else echo "FAIL - out of GPU memory: rc=$orc"; tail -3 "$W/oom.out"; rc=1; fi
  rm -f "$W/big.bin"
fi
# Several ranks on one GPU: --comm mpi stages the collectives through host memory (NCCL needs a GPU per rank), so
# the GPU engine's multi-rank ZeRO paths run here too: ZeRO-0..3 on 2 ranks vs 1 rank, fp32 (losses and final
# weights within 1e-5) and bf16 (losses within 1e-2).
if [[ -n "${W:-}" ]]; then
  export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
  for bf in 0 1; do
    COMM=mpi DEVICE=cuda SPECS="2:2" BATCH=8 BF16=$bf bash tests/parity_test.sh "$BIN/zerorun" 2>&1 |
      sed "s/^/[shared GPU, bf16=$bf] /" | tee -a "$OUTD/shared_gpu_parity.log" | grep -E "^\[.*(ok|FAIL)"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  done
  # The engine's own multi-rank checks on the GPU: model-state bytes per stage (= zerorun estimate), inf on one
  # rank skips the step on all, stage 3 + activation checkpointing = stage 3 (bit for bit, hence deterministic
  # kernels: with attention's and the embedding's atomics the last bits vary from run to run).
  for np in 2 3; do
    ZERORUN_DETERMINISTIC=1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np $np -x LD_LIBRARY_PATH \
      -x OMPI_MCA_btl -x OMPI_MCA_btl_vader_single_copy_mechanism -x ZERORUN_DETERMINISTIC \
      "$BIN/zerorun_mpi_engine_test" --device cuda --comm mpi 2>&1 |
      grep -E "FAIL|passed|error" | sed 's/^/[shared GPU] /'
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  done
  # Checkpoints of GPU ranks: tests/checkpoint_test.sh (bitwise resume at stages 0-3, resume at another world size
  # and stage, merge, integrity errors, a rank killed mid-save) with every run on 2-4 ranks sharing the GPU, in
  # deterministic mode (bitwise resume). Across world sizes the gradients are summed in another order, hence the
  # 3e-5 weights bound (the CPU's runs come within 1.2e-5).
  cycle_tokens "$W/cyc128.bin" 128
  ZERORUN_DETERMINISTIC=1 TRAIN_ARGS="--device cuda --comm mpi" WTOL=3e-5 \
    bash tests/checkpoint_test.sh "$BIN/zerorun" 2>&1 | tee "$OUTD/gpu_checkpoints.log" | grep -E "^(ok|FAIL)|passed" |
    sed 's/^/[GPU checkpoints] /'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  # A checkpoint moves between devices: 2 GPU ranks (ZeRO-3) save at step 5 and 1 CPU rank resumes; 3 CPU ranks
  # (ZeRO-1) save and 1 GPU resumes. Both against 10 straight CPU steps: losses within 1e-5, weights 3e-5.
  (
    source tests/lib.sh
    cd "$W" && Z=$OLDPWD/$BIN/zerorun
    echo '{"train_batch_size": 12, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 300}, "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}}' >x3.json
    echo '{"train_batch_size": 12, "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}}' >x1.json
    "$Z" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 --seed 4 -o x.bin >/dev/null
    common=(--data cyc128.bin --steps 10)
    "$Z" --config x1.json x.bin "${common[@]}" --log_dir xA --final_weights xA.st >x.log 2>&1
    for way in "cuda 2 x3 cpu 1 x1" "cpu 3 x1 cuda 1 x3"; do
      set -- $way
      rm -rf xS xB
      "$Z" --device $1 --comm mpi --num_gpus $2 --config $3.json x.bin --data cyc128.bin --steps 5 --save_dir xS \
        --log_dir xB >>x.log 2>&1
      "$Z" --device $4 --num_gpus $5 --config $6.json x.bin "${common[@]}" --save_dir xS --resume latest --log_dir xB \
        --final_weights xB.st >>x.log 2>&1
      worst=$(loss_diff xA xB) wd=$(wdiff xB.st xA.st) rows=$(losses xB | wc -l)
      if [[ $rows -eq 10 ]] && awk -v w="$worst" -v d="$wd" 'BEGIN{exit !(w <= 1e-5 && d <= 3e-5)}'; then
        ok "checkpoint of $2 $1 rank(s) resumed on $5 $4 rank(s): losses within $worst, weights within $wd"
      else bad "checkpoint $1 -> $4: $rows rows, losses $worst, weights $wd"; tail -3 x.log; fi
    done
    [[ $fail -eq 0 ]]
  ) || rc=1
  # bf16 ZeRO-1/2 on 2 GPU ranks (the 16-bit weight copy all-gathered): resume = a straight run, bit for bit.
  bash tests/gpu_bf16_resume.sh "$BIN/zerorun" || rc=1
  # Without --comm mpi, two ranks need two GPUs: a clear error naming the rank, and both ranks end.
  G=$(nvidia-smi -L | wc -l)
  if [[ $G -eq 1 ]]; then
    out=$(timeout 60 "$BIN/zerorun" --num_gpus 2 --device cuda --config "$W/c.json" "$W/m.bin" --steps 1 2>&1); st=$?
    if [[ $st -ne 0 && $st -lt 124 ]] && grep -q "local rank 1 has no GPU of its own" <<<"$out"; then
      echo "ok   - 2 NCCL ranks on 1 GPU: $(grep -o 'local rank 1 has no GPU[^.]*' <<<"$out" | head -1)"
    else echo "FAIL - 2 NCCL ranks on 1 GPU: rc $st"; tail -3 <<<"$out"; rc=1; fi
  fi
  # Two ranks made to pick the same GPU: NCCL's bare "invalid usage" becomes a message naming both ranks.
  out=$(timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE \
    env OMPI_COMM_WORLD_LOCAL_RANK=0 "$BIN/zerorun" train "$W/m.bin" --config "$W/c.json" --device cuda --steps 1 2>&1)
  st=$?
  if [[ $st -ne 0 && $st -lt 124 ]] && grep -q "ranks 0 and 1 both use GPU" <<<"$out"; then
    echo "ok   - ranks sharing a GPU under NCCL: $(grep -o 'ranks 0 and 1 both use GPU [^(]*' <<<"$out" | head -1)"
  else echo "FAIL - ranks sharing a GPU under NCCL: rc $st"; tail -3 <<<"$out"; rc=1; fi
  # --device auto (the default): the GPU here, said in the log; and a job where one rank sees no GPU is an error
  # on every rank, not a job training half on the CPU.
  out=$(timeout 120 "$BIN/zerorun" --config "$W/c.json" "$W/m.bin" --steps 2 --seq_len 64 2>&1); st=$?
  if [[ $st -eq 0 ]] && grep -q "device: cuda (auto: 1 GPU(s) visible" <<<"$out" && grep -q "device peak" <<<"$out"; then
    echo "ok   - no --device: $(grep -o 'device: cuda ([^;]*' <<<"$out")"
  else echo "FAIL - no --device on a GPU machine: rc $st"; tail -3 <<<"$out"; rc=1; fi
  out=$(timeout 60 mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x OMPI_MCA_btl \
    -x OMPI_MCA_btl_vader_single_copy_mechanism -np 1 "$BIN/zerorun" train "$W/m.bin" --config "$W/c.json" --comm mpi \
    --steps 1 : -np 1 env CUDA_VISIBLE_DEVICES= "$BIN/zerorun" train "$W/m.bin" --config "$W/c.json" --comm mpi \
    --steps 1 2>&1)
  st=$?
  if [[ $st -ne 0 && $st -lt 124 ]] && grep -q "1 of 2 ranks see no GPU" <<<"$out"; then
    echo "ok   - --device auto, one rank without a GPU: rc $st, $(grep -o 'error on rank [^:]*: --device auto[^;]*' <<<"$out" | head -1)"
  else echo "FAIL - --device auto with one rank without a GPU: rc $st"; tail -3 <<<"$out"; rc=1; fi
fi
# The PyTorch oracle (CPU runs of zerorun) with the device machine's PyTorch, which has transformers: also
# GPT2LMHeadModel.from_pretrained on a merge, and transformers' own GPT-2 imported and trained on both sides.
if python3 -c "import torch" 2>/dev/null; then
  timeout 300 python3 tests/torch_oracle.py --zerorun "$BIN/zerorun" 2>&1 | grep -v " step " | tail -8
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
exit $rc
