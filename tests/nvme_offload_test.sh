#!/usr/bin/env bash
# offload_optimizer.device "nvme" on CPU ranks (issue 34 item 4): the optimizer's moments in a file under nvme_path
# (a directory on this disk: O_DIRECT through io_uring, or buffered where the filesystem refuses O_DIRECT), streamed
# in chunks of sub_group_size elements. vs the in-memory states: bitwise (losses and final weights) at ZeRO-2 and
# ZeRO-3 on 1 and 2 ranks, with chunks that split buckets, a single buffer slot short of the default, bf16 states
# and one request at a time (aio.overlap_events false, single_submit); checkpoints save and resume bitwise; the files
# are gone afterwards; errors name nvme_path (missing, not a directory, full). offload_param.device "nvme" (ZeRO-3):
# the parameter shard in a file (all of it, or past max_in_cpu elements), bitwise = memory, checkpoints included.
set -u
ZR=$(realpath "${1:?usage: nvme_offload_test.sh path/to/zerorun}")
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
# A directory on disk (not tmpfs) beside the build when TMPDIR is tmpfs: NVME_DIR overrides.
W=$(mktemp -d "${NVME_DIR:-${TMPDIR:-/tmp}}/zr_nvme.XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
mkdir disk
"$ZR" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 --seed 9 -o pm.bin >/dev/null
cfg() {  # file stage device extra-zero extra-top
  echo "{\"train_batch_size\": 12, \"gradient_clipping\": 0.5 $5,
  \"zero_optimization\": {\"stage\": $2, \"reduce_bucket_size\": 5000, \"stage3_param_persistence_threshold\": 200,
    \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"$3\", \"nvme_path\": \"$W/disk\", \"buffer_count\": 3} $4},
  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3, \"weight_decay\": 0.1}}}" >"$1"
}
AIO=', "aio": {"block_size": 8192, "queue_depth": 4}'
for stage in 2 3; do
  cfg cpu$stage.json $stage cpu "" ""
  cfg nvme$stage.json $stage nvme "" "$AIO"
  for n in 1 2; do
    "$ZR" --num_gpus $n --config cpu$stage.json pm.bin --steps 8 --micro_batch_size $((6 / n)) --log_dir c$stage$n \
      --final_weights c$stage$n.st >c$stage$n.log 2>&1 || { bad "stage $stage, $n ranks: cpu run"; continue; }
    "$ZR" --num_gpus $n --config nvme$stage.json pm.bin --steps 8 --micro_batch_size $((6 / n)) --log_dir n$stage$n \
      --final_weights n$stage$n.st >n$stage$n.log 2>&1 || { bad "stage $stage, $n ranks: nvme run"; tail -3 n$stage$n.log; continue; }
    if diff <(losses c$stage$n) <(losses n$stage$n) >/dev/null && [[ "$(wdiff n$stage$n.st c$stage$n.st)" == "0" ]]; then
      ok "ZeRO-$stage, $n ranks: NVMe moments = in-memory moments, bitwise ($(grep -o 'O_DIRECT\|buffered' n$stage$n.log | head -1))"
    else
      bad "ZeRO-$stage, $n ranks: NVMe vs memory: weights $(wdiff n$stage$n.st c$stage$n.st)"
    fi
  done
done
# metrics.jsonl: the time each step waited on the disk; the memory line: the moments' bytes on NVMe.
if [[ $(grep -c '"nvme_wait_seconds":[0-9.e-]*' n22/metrics.jsonl) == 8 ]] && grep -q 'moments on NVMe=0.842MiB' n21.log; then
  ok "nvme_wait_seconds in metrics.jsonl, moments on NVMe in the memory line"
else
  bad "NVMe metrics / memory line"; head -1 n22/metrics.jsonl; grep -m1 'memory rank' n21.log
fi
# One request at a time, one submit each, bf16 master + moments (2-byte elements in the file).
cfg s.json 2 nvme "" ', "aio": {"block_size": 4096, "queue_depth": 1, "single_submit": true, "overlap_events": false}'
cfg b.json 2 nvme "" ', "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}'
cfg bm.json 2 none "" ', "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}'
"$ZR" --config s.json pm.bin --steps 8 --micro_batch_size 6 --final_weights s.st >s.log 2>&1
[[ "$(wdiff s.st c21.st)" == "0" ]] && ok "queue depth 1, single_submit, no overlap: bitwise" || bad "serial aio: $(wdiff s.st c21.st)"
"$ZR" --config b.json pm.bin --steps 8 --micro_batch_size 6 --final_weights b.st >b.log 2>&1
"$ZR" --config bm.json pm.bin --steps 8 --micro_batch_size 6 --final_weights bm.st >bm.log 2>&1
[[ -s b.st && "$(wdiff b.st bm.st)" == "0" ]] && ok "bf16 states on NVMe = in memory, bitwise" || bad "bf16 NVMe: $(wdiff b.st bm.st)"
# Checkpoints: 8 straight vs 4 + save + resume + 4, 2 ranks ZeRO-3 on NVMe; a NVMe checkpoint resumed in memory.
run() { "$ZR" --num_gpus 2 --config nvme3.json pm.bin --micro_batch_size 3 "$@" >>resume.log 2>&1; }
run --steps 4 --log_dir B --save_dir S
run --steps 8 --log_dir B --save_dir S --resume latest --final_weights B.st
[[ -s B.st && "$(wdiff B.st n32.st)" == "0" ]] && diff <(losses n32) <(losses B) >/dev/null &&
  ok "NVMe run: save at 4 + resume = 8 straight, bitwise" || { bad "NVMe resume: $(wdiff B.st n32.st)"; tail -3 resume.log; }
"$ZR" --num_gpus 2 --config cpu3.json pm.bin --micro_batch_size 3 --steps 8 --save_dir S --resume global_step4 \
  --final_weights C.st >>resume.log 2>&1
[[ -s C.st && "$(wdiff C.st c32.st)" == "0" ]] && ok "NVMe checkpoint resumed with in-memory states: bitwise" ||
  bad "NVMe checkpoint -> memory: $(wdiff C.st c32.st)"
# offload_param "nvme" (ZeRO-3): the parameter shard in a file, all of it (max_in_cpu 0; chunks of 1000 elements
# that split groups, two slots) or past the first 20000 elements with the moments on NVMe too: bitwise = memory.
PN=", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$W/disk\""
cfg p3.json 3 cpu "$PN, \"max_in_cpu\": 0, \"buffer_size\": 1000, \"buffer_count\": 2}" "$AIO"
cfg q3.json 3 nvme "$PN, \"max_in_cpu\": 20000}, \"stage3_prefetch_bucket_size\": 100000" ""
for n in 1 2; do
  for c in p q; do
    "$ZR" --num_gpus $n --config ${c}3.json pm.bin --steps 8 --micro_batch_size $((6 / n)) --log_dir $c$n \
      --final_weights $c$n.st >$c$n.log 2>&1 || { bad "offload_param nvme ($c), $n ranks: run failed"; tail -3 $c$n.log; continue; }
    if diff <(losses c3$n) <(losses $c$n) >/dev/null && [[ "$(wdiff $c$n.st c3$n.st)" == "0" ]]; then
      ok "ZeRO-3, $n ranks: parameters on NVMe ($c) = in memory, bitwise"
    else
      bad "ZeRO-3, $n ranks: parameters on NVMe ($c) vs memory: weights $(wdiff $c$n.st c3$n.st)"
    fi
  done
done
if grep -q 'parameters on NVMe=0.421MiB' p1.log && grep -q 'moments on NVMe=.*parameters on NVMe=' q2.log &&
  [[ $(grep -c '"nvme_wait_seconds":[0-9.e-]*' p2/metrics.jsonl) == 8 ]]; then
  ok "parameters on NVMe in the memory line, nvme_wait_seconds in metrics.jsonl"
else
  bad "offload_param nvme: memory line / metrics"; grep -m1 'memory rank' p1.log; head -1 p2/metrics.jsonl
fi
# metrics.jsonl's host_bytes (every step, every category) are rank 0's model states of its memory line (at start
# and at the end); nvme_bytes are the bytes on NVMe the memory line names; CPU ranks wait on no host<->device copy.
if python3 - c21 c32 n21 n22 n32 p1 p2 q2 <<'PY'
import json, re, sys
cats = {"params", "grads", "optimizer", "activations", "buffers", "pinned"}
for run in sys.argv[1:]:
    nvme = run[0] in "npq"
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    assert len(rows) == 8, (run, len(rows))
    lines = [l for l in open(run + ".log") if "memory rank 0:" in l]
    assert len(lines) == 2 and all("| host now: params=" in l for l in lines), (run, lines)
    for r in rows:
        h = r["host_bytes"]
        assert cats <= set(h) and ("nvme_buffers" in h) == nvme and "transfer_wait_seconds" not in r, (run, r)
        assert ("nvme_bytes" in r) == nvme, (run, r)
        if nvme:
            assert h["nvme_buffers"] > 0 and sum(r["nvme_bytes"].values()) > 0, (run, r)
    for l in lines:
        m = re.search(r"model states params=([0-9.]+)MiB grads=([0-9.]+)MiB optimizer=([0-9.]+)MiB", l)
        for k, v in zip(("params", "grads", "optimizer"), m.groups()):
            for r in rows:
                assert abs(r["host_bytes"][k] / 2**20 - float(v)) <= 0.0005 + 1e-9, (run, k, v, r["host_bytes"])
        for what, k in (("moments on NVMe=", "optimizer"), ("parameters on NVMe=", "params")):
            m = re.search(what + r"([0-9.]+)MiB", l)
            got = rows[-1].get("nvme_bytes", {}).get(k, 0) / 2**20
            assert (abs(got - float(m.group(1))) <= 0.0005 + 1e-9) if m else got == 0, (run, what, got, l)
        assert ("NVMe now: " in l) == nvme, (run, l)
PY
then
  ok "metrics.jsonl host_bytes = the memory line's model states, nvme_bytes = its bytes on NVMe, every step"
else
  bad "host_bytes / nvme_bytes in metrics.jsonl vs the memory line"
fi
# Checkpoints with the parameters on NVMe: 4 + save + resume = 8 straight; resumed with everything in memory.
rm -rf S2
"$ZR" --num_gpus 2 --config p3.json pm.bin --micro_batch_size 3 --steps 4 --save_dir S2 >>resume.log 2>&1
"$ZR" --num_gpus 2 --config p3.json pm.bin --micro_batch_size 3 --steps 8 --save_dir S2 --resume latest \
  --final_weights P.st >>resume.log 2>&1
[[ -s P.st && "$(wdiff P.st c32.st)" == "0" ]] && ok "parameters on NVMe: save at 4 + resume = 8 straight, bitwise" ||
  { bad "offload_param nvme resume: $(wdiff P.st c32.st)"; tail -3 resume.log; }
"$ZR" --num_gpus 2 --config cpu3.json pm.bin --micro_batch_size 3 --steps 8 --save_dir S2 --resume global_step4 \
  --final_weights P1.st >>resume.log 2>&1
[[ -s P1.st && "$(wdiff P1.st c32.st)" == "0" ]] && ok "its checkpoint resumed with the parameters in memory: bitwise" ||
  bad "offload_param nvme checkpoint -> memory: $(wdiff P1.st c32.st)"
# Files cleaned up after every run.
[[ -z "$(ls -A disk)" ]] && ok "nvme_path left empty" || bad "files left under nvme_path: $(ls disk)"
# Errors naming nvme_path: missing, a file, full (a 1 MiB filesystem is not available unprivileged: RLIMIT_FSIZE).
sed "s|$W/disk|$W/absent|" nvme2.json >absent.json
"$ZR" --config absent.json pm.bin --steps 1 --micro_batch_size 6 >e1.log 2>&1
[[ $? -eq 1 ]] && grep -q "nvme_path '$W/absent'" e1.log && ok "missing nvme_path: exit 1 naming it" || { bad "missing nvme_path"; tail -2 e1.log; }
touch afile && sed "s|$W/disk|$W/afile|" nvme2.json >file.json
"$ZR" --config file.json pm.bin --steps 1 --micro_batch_size 6 >e2.log 2>&1
[[ $? -eq 1 ]] && grep -q "nvme_path '$W/afile' is not a directory" e2.log && ok "nvme_path a file: named" || { bad "nvme_path a file"; tail -2 e2.log; }
(trap "" XFSZ; ulimit -f 256; "$ZR" --config nvme2.json pm.bin --steps 1 --micro_batch_size 6 >e3.log 2>&1)
grep -q "nvme_path '$W/disk'.*\(no room\|full\|too large\)" e3.log && ok "no room under nvme_path: named" || { bad "full nvme_path"; tail -2 e3.log; }
[[ -z "$(ls -A disk)" ]] && ok "nvme_path empty after the errors" || bad "files left after errors: $(ls disk)"
echo "nvme_offload: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
