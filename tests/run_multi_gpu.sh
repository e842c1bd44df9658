#!/usr/bin/env bash
# Multi-GPU checks for a machine with 2-8 GPUs (device kinds nvidia-h200-x2/x4/x8),
# from the bundle of tests/make_device_bundle.sh: ZeRO-0..3 parity across
# 2/4/8 GPUs vs 1 GPU (fp32 within 1e-5, bf16 within 1e-2), stage-3 model-state
# memory per GPU ~ 1/N, weak scaling of GPT-2 350M with ZeRO-2, and GPT-2 1.5B
# with ZeRO-3 + optimizer offload across the GPUs; NCCL's collectives, its watchdog (a stuck rank), the engine
# test and two bitwise-equal deterministic runs over NCCL, and (4+ GPUs) the checkpoint tests on NCCL ranks.
# Exits 77 with fewer than 2 GPUs.
# Usage there: bash tests/run_multi_gpu.sh [OUT_DIR]
set -uo pipefail
# A metrics.jsonl line without what may differ between two runs of one job: the timing fields (names ending in
# "seconds") and the memory snapshots (host_bytes, device_bytes, nvme_bytes).
metrics_content() { sed -E 's/"[a-z_]*_bytes":\{[^}]*\},//g; s/"[a-z_]*seconds":[^,}]*,//g; s/,"[a-z_]*seconds":[^,}]*\}/}/g' "$1"; }
cd "$(dirname "$0")/.."
OUTD=${1:-${OUT:-/tmp}}
source tests/device_env.sh
ZR=$PWD/.devbuild/bin/zerorun
G=$(nvidia-smi -L 2>/dev/null | wc -l)
if [[ $G -lt 2 ]]; then echo "run_multi_gpu: $G GPU(s) visible, needs at least 2"; exit 77; fi
rc=0
specs="1:4"
for n in 2 4 8; do [[ $n -le $G ]] && specs="$specs $n:2"; done  # global batch 16 = micro x accumulation x ranks
echo "== parity fp32 ($specs)"
DEVICE=cuda SPECS="$specs" BATCH=16 bash tests/parity_test.sh "$ZR" | tee "$OUTD/parity_fp32.log" | tail -20 || rc=1
echo "== parity bf16"
DEVICE=cuda SPECS="$specs" BATCH=16 BF16=1 bash tests/parity_test.sh "$ZR" | tee "$OUTD/parity_bf16.log" | tail -20 || rc=1

BIN=$PWD/.devbuild/bin
MPI=(mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
echo "== NCCL collectives on $G ranks"
timeout 120 "${MPI[@]}" -np $G "$BIN/zerorun_nccl_test" 2>&1 | tail -3
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
echo "== NCCL watchdog: rank 1 stuck before an all_reduce"
t0=$(date +%s)
out=$(timeout 60 "${MPI[@]}" -np 2 "$BIN/zerorun_nccl_test" --stall 2>&1); st=$?
dt=$(($(date +%s) - t0))
if [[ $st -ne 0 && $st -ne 124 && $dt -lt 40 ]] && grep -q "watchdog: rank 0: all_reduce #[0-9]* (1024 x f32) has not completed after 3 s" <<<"$out"; then
  echo "ok   - NCCL watchdog ended the job after ${dt}s (rc=$st): $(grep -o 'watchdog: rank 0: [^;]*' <<<"$out" | head -1)"
else echo "FAIL - NCCL watchdog: rc=$st after ${dt}s"; tail -5 <<<"$out"; rc=1; fi
echo "== engine over NCCL (model-state bytes = zerorun estimate, inf on one rank skips on all, ZeRO-3 + checkpointing)"
for n in 2 $G; do
  ZERORUN_DETERMINISTIC=1 timeout 300 "${MPI[@]}" -x ZERORUN_DETERMINISTIC -np $n "$BIN/zerorun_mpi_engine_test" \
    --device cuda 2>&1 | grep -E "FAIL|passed|error"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
done

W=$(mktemp -d)
echo "== ZERORUN_DETERMINISTIC=1 over NCCL: two ZeRO-2 runs on $G GPUs give the same bits"
"$ZR" init --arch gpt2 --vocab 256 --n_ctx 64 --n_embd 64 --n_layer 2 --n_head 4 --seed 3 -o "$W/m.bin" >/dev/null
echo "{\"train_batch_size\": $((4 * G)), \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}}" >"$W/d2.json"
for k in 1 2; do
  ZERORUN_DETERMINISTIC=1 "$ZR" --num_gpus $G --device cuda --config "$W/d2.json" "$W/m.bin" --steps 8 --seq_len 64 \
    --log_dir "$W/det$k" --final_weights "$W/det$k.st" >"$W/det$k.out" 2>&1 || { tail -3 "$W/det$k.out"; rc=1; }
done
if cmp -s <(metrics_content "$W/det1/metrics.jsonl") <(metrics_content "$W/det2/metrics.jsonl") &&
  cmp -s "$W/det1.st" "$W/det2.st"; then echo "ok   - the same bits (8 steps' metrics, final weights)"
else echo "FAIL - deterministic NCCL runs differ"; rc=1; fi
if [[ $G -ge 4 ]]; then
  echo "== checkpoints of NCCL ranks (bitwise resume, other world sizes and stages, merge, integrity, a rank killed)"
  ZERORUN_DETERMINISTIC=1 TRAIN_ARGS="--device cuda" WTOL=3e-5 bash tests/checkpoint_test.sh "$ZR" 2>&1 |
    tee "$OUTD/nccl_checkpoints.log" | grep -E "^FAIL|passed"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
"$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd 1024 --n_layer 24 --n_head 16 -o "$W/m350.bin" >/dev/null
tok_s() {  # tokens/s of the last printed step line
  grep -E "step +[0-9]+/" "$1" | tail -1 | sed 's/.*| \([0-9]*\) tok\/s.*/\1/'
}
echo "== stage-3 model states per GPU"
for n in 1 $G; do
  echo '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}' >"$W/z3.json"
  "$ZR" --num_gpus $n --device cuda --config "$W/z3.json" "$W/m350.bin" --steps 2 >"$W/z3_$n.out" 2>&1 || rc=1
  grep "memory rank 0" "$W/z3_$n.out" | head -1 | sed "s/^/  $n GPU(s): /"
done
echo "== weak scaling, GPT-2 350M, ZeRO-2, micro batch 4 per GPU"
echo '{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true}, "steps_per_print": 5, "zero_optimization": {"stage": 2}}' >"$W/z2.json"
for n in 1 $G; do
  "$ZR" --num_gpus $n --device cuda --config "$W/z2.json" "$W/m350.bin" --steps 15 >"$W/z2_$n.out" 2>&1 || rc=1
done
t1=$(tok_s "$W/z2_1.out") tn=$(tok_s "$W/z2_$G.out")
awk -v a="${t1:-0}" -v b="${tn:-0}" -v n="$G" 'BEGIN{e=(a>0)?b/(n*a):0; printf "  1 GPU %d tok/s, %d GPUs %d tok/s: efficiency %.1f%% -> %s\n", a, n, b, 100*e, (e>=0.9?"PASS":"FAIL"); exit !(e>=0.9)}' || rc=1
echo "== GPT-2 1.5B, ZeRO-3 + optimizer offload on $G GPUs"
"$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd 1600 --n_layer 48 --n_head 25 -o "$W/m15.bin" >/dev/null
echo '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "steps_per_print": 1,
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}' >"$W/off.json"
"$ZR" --num_gpus $G --device cuda --config "$W/off.json" "$W/m15.bin" --steps 4 2>&1 | grep -E "step|memory rank 0|error" || rc=1
exit $rc
