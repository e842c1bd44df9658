#!/usr/bin/env bash
# `zerorun estimate` for NVMe offload (issue 34 item 5, issue 33 item 5): its NVMe rows ("ZeRO-N nvme":
# offload_optimizer "nvme"; "ZeRO-3 nvme+par": and offload_param "nvme") sized by a DeepSpeed config's keys
# (--config: sub_group_size, buffer_count, buffer_size, max_in_cpu) against real CPU-rank trainings of a 93M-parameter
# Llama on 2 ranks, 2 steps (as load_memory_test.sh checks the other rows): the NVMe bytes and the chunk slots in RAM
# equal the engine's memory line ("moments on NVMe=", "parameters on NVMe=", "buffers in RAM="), the files' sizes on
# disk equal NVMe/node, the model states within 10% of the engine's counters and host/node within 10% of the ranks'
# summed peak RSS. Without --config: DeepSpeed's defaults, named.
set -u
ZR=$(realpath "${1:?usage: estimate_nvme_test.sh path/to/zerorun}")
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
# nvme_path on a disk (O_DIRECT), not tmpfs, when NVME_DIR names one (ctest: the build directory).
W=$(mktemp -d "${NVME_DIR:-${TMPDIR:-/tmp}}/zr_est_nvme.XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$W"' EXIT
cd "$W"
mkdir disk
"$ZR" init --arch llama --vocab 8000 --n_ctx 64 --n_embd 1024 --n_layer 6 --n_head 16 --ffn 2816 --seed 3 -o m.bin \
  >/dev/null || { echo "FAIL - init"; exit 1; }
# ZeRO-2 with the moments on NVMe (chunks of 10M elements, 3 slots); ZeRO-3 with the moments (DeepSpeed's chunking)
# and the parameter shard past its first 20M elements (chunks of 8M, 2 slots) on NVMe.
cat >opt.json <<EOF
{"train_batch_size": 2, "zero_optimization": {"stage": 2, "sub_group_size": 10000000,
  "offload_optimizer": {"device": "nvme", "nvme_path": "$W/disk", "buffer_count": 3}},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
EOF
cat >par.json <<EOF
{"train_batch_size": 2, "zero_optimization": {"stage": 3,
  "offload_optimizer": {"device": "nvme", "nvme_path": "$W/disk"},
  "offload_param": {"device": "nvme", "nvme_path": "$W/disk", "max_in_cpu": 20000000, "buffer_size": 8000000,
                    "buffer_count": 2}},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
EOF
for c in opt:"ZeRO-2 nvme " par:"ZeRO-3 nvme+par "; do
  name=${c%%:*} label=${c#*:}
  # The run, its NVMe files' sizes sampled while it runs (each file is made full size at the start).
  "$ZR" --num_gpus 2 --device cpu --config $name.json m.bin --steps 2 --seq_len 32 --data synthetic >$name.log 2>&1 &
  pid=$!
  : >$name.sizes
  while kill -0 $pid 2>/dev/null; do
    find disk -name '*.bin' -printf '%p %s\n' 2>/dev/null >>$name.sizes
    sleep 0.2
  done
  wait $pid || { bad "$name: the run failed"; tail -5 $name.log; continue; }
  files=$(awk '$2 > m[$1] {m[$1] = $2} END{for (f in m) s += m[f]; printf "%.1f", s / 1048576}' $name.sizes)
  lines=$(grep "done:.*memory rank" $name.log)
  if [[ $(echo "$lines" | grep -c "peak RSS=") -ne 2 ]]; then
    bad "$name: no memory line from both ranks"; tail -5 $name.log; continue
  fi
  est=$("$ZR" estimate m.bin --device cpu --num_gpus 2 --seq_len 32 --config $name.json 2>&1)
  row=$(echo "$est" | grep "^$label")
  # Rank 0's model states and optimizer report (what follows " | activations" is not needed here).
  r0=$(echo "$lines" | grep -m1 "memory rank 0:" | sed 's/ | activations.*//')
  rss=$(echo "$lines" | sed 's/.*peak RSS=\([0-9.]*\)MiB.*/\1/' | tr '\n' ' ')
  cmp_out=$(awk -v row="$row" -v r0="$r0" -v all="$rss" -v files="$files" '
    function mib(x) { return x ~ /GiB$/ ? x * 1024 : x + 0 }
    function near(a, b, tol) { return a <= (1 + tol) * b + 0.05 && a >= b / (1 + tol) - 0.05 }
    function field(k,   v, s) { s = r0; v = 0
      while (match(s, k "=[0-9.]+")) { v += substr(s, RSTART + length(k) + 1, RLENGTH - length(k) - 1); s = substr(s, RSTART + RLENGTH) }
      return v }
    BEGIN {
      split(row, f, " +")
      states = mib(f[3]) + mib(f[4]) + mib(f[5]); bufs = mib(f[7]); node = mib(f[10]); nv = mib(f[11]); nvnode = mib(f[12])
      s = field("params") + field("grads") + field("optimizer")
      e_nv = field("moments on NVMe") + field("parameters on NVMe"); e_bufs = field("buffers in RAM")
      n = split(all, r, " "); sum = 0; for (i = 1; i <= n; ++i) sum += r[i]
      printf "NVMe %.1f vs %.1f MiB, buffers in RAM %.1f vs %.1f MiB, files per node %.1f vs %.1f MiB on disk, states %.0f vs %.0f MiB, host per node %.0f vs %.0f MiB (summed peak RSS)", nv, e_nv, bufs, e_bufs, nvnode, files, states, s, node, sum
      exit !(e_nv > 0 && near(nv, e_nv, 0.001) && near(bufs, e_bufs, 0.001) && near(nvnode, files, 0.001) &&
             near(states, s, 0.1) && near(node, sum, 0.1))
    }')
  if [[ $? -eq 0 && -n $row ]]; then ok "estimate '$label' vs the run: $cmp_out"; else bad "estimate '$label': $cmp_out"; echo "$est"; fi
  echo "$est" | grep -q "^$name.json: .*row '${label% }'" && ok "estimate names $name.json's row ('${label% }')" ||
    bad "estimate does not name $name.json's row"
done
# Without --config: DeepSpeed's defaults, named; the other rows as without the NVMe section.
est=$("$ZR" estimate m.bin --num_gpus 8 2>&1)
if echo "$est" | grep -q "^NVMe offload (ZeRO-Infinity), DeepSpeed's defaults: .*sub_group_size 1000000000 .*buffer_count 4;.*max_in_cpu 1000000000 .*buffer_size 100000000 .*buffer_count 5" &&
  [[ $(echo "$est" | grep -c "^ZeRO-[123] nvme") == 4 ]]; then
  ok "estimate without --config: the NVMe rows at DeepSpeed's defaults"
else
  bad "estimate without --config"; echo "$est"
fi
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
