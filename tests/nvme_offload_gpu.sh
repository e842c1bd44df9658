#!/usr/bin/env bash
# NVMe offload on a GPU run (issue 34 item 4's "a run on the device's disk"): GPT-2 (n_embd 768, 12 layers), bf16,
# ZeRO-3 with offload_optimizer "cpu" + offload_param "cpu" against offload_optimizer "nvme" + offload_param "nvme"
# (all of the parameter shard on disk: max_in_cpu 0) under a directory on the machine's own disk: the same losses and
# final weights bit for bit, and each run's tokens/s, NVMe wait and memory line printed.
# Usage (device machine, after tests/make_device_bundle.sh; tests/device_env.sh sourced):
#   bash tests/nvme_offload_gpu.sh path/to/zerorun [DIR on the disk (default: a temporary directory under $PWD)]
set -u
ZR=$(realpath "${1:?usage: nvme_offload_gpu.sh path/to/zerorun [dir]}")
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
W=$(mktemp -d "${2:-$PWD}/zr_nvme_gpu.XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
mkdir disk
df -h disk | tail -1
"$ZR" init --arch gpt2 --vocab 50304 --n_ctx 1024 --n_embd 768 --n_layer 12 --n_head 12 --seed 3 -o m.bin >/dev/null
cfg() {  # file device extra-param
  echo "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 8, \"gradient_clipping\": 1.0,
  \"bf16\": {\"enabled\": true},
  \"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": 50000000, \"sub_group_size\": 10000000,
    \"offload_optimizer\": {\"device\": \"$2\", \"nvme_path\": \"$W/disk\", \"pin_memory\": true},
    \"offload_param\": {\"device\": \"$2\", \"nvme_path\": \"$W/disk\", \"pin_memory\": true $3}},
  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"weight_decay\": 0.1}}}" >"$1"
}
cfg cpu.json cpu ""
cfg nvme.json nvme ', "max_in_cpu": 0, "buffer_count": 4, "buffer_size": 4000000'
for c in cpu nvme; do
  "$ZR" --config $c.json m.bin --device cuda --steps 6 --seq_len 1024 --log_dir $c --final_weights $c.st >$c.log 2>&1 ||
    { bad "$c run failed"; tail -5 $c.log; continue; }
  python3 - "$c" <<'PY'
import json, sys
d = sys.argv[1]
L = [json.loads(x) for x in open(d + "/metrics.jsonl")][2:]
n = len(L)
print(f"{d}: {16 * 1024 * n / sum(x['seconds'] for x in L):.0f} tok/s, optimizer {sum(x['optimizer_seconds'] for x in L) / n:.3f} s,"
      f" NVMe wait {sum(x.get('nvme_wait_seconds', 0) for x in L) / n:.3f} s a step (steps 3-6)")
PY
  grep -m1 "memory rank" $c.log | cut -c1-400
done
if [[ -s cpu.st && -s nvme.st ]] && diff <(losses cpu) <(losses nvme) >/dev/null && cmp -s nvme.st cpu.st; then
  ok "GPU, ZeRO-3, bf16: optimizer and parameters on NVMe = in host memory, bitwise ($(grep -o 'O_DIRECT\|buffered' nvme.log | head -1))"
else
  bad "GPU NVMe vs host memory: weights $(wdiff nvme.st cpu.st 2>/dev/null)"
fi
[[ -z "$(ls -A disk)" ]] && ok "nvme_path left empty" || bad "files left under nvme_path: $(ls disk)"
echo "nvme_offload_gpu: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
