#!/usr/bin/env bash
# Hostile and odd input ends cleanly: SIGTERM to a multi-rank launcher (143 after a complete checkpoint, or the
# previous `latest` intact with the save's temporary files removed), shards and model files that are not regular
# files, out-of-range manifest fields, non-finite weights, host names that are not host names, and a --dry_run
# command that a shell runs as printed. Input faults exit 1 with a message naming the file and what is wrong; never
# "internal error".
set -u
ZR=$(realpath "${1:?usage: hostile_input_test.sh path/to/zerorun}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
# expect_err NAME PATTERN CMD...: exit 1 with PATTERN in the output and no "internal error".
expect_err() {
  local name=$1 pat=$2 out rc
  shift 2
  out=$(timeout -k 5 60 "$@" 2>&1)
  rc=$?
  if [[ $rc -eq 1 ]] && grep -qF -- "$pat" <<<"$out" && ! grep -q "internal error" <<<"$out"; then ok "$name"; else
    bad "$name (rc=$rc, wanted '$pat'):"
    echo "$out" | tail -4
  fi
}
"$ZR" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 -o gpt.bin >/dev/null
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}' >c.json

# 1. SIGTERM to the launcher of 2 ranks: every rank stops after its step, saves, and the launcher exits 143.
"$ZR" --num_gpus 2 --config c.json gpt.bin --steps 1000000 --seq_len 16 --save_dir S --log_dir L >term.out 2>&1 &
pid=$!
for _ in $(seq 300); do [[ $(cat L/metrics.jsonl 2>/dev/null | wc -l) -ge 3 ]] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
rc=$?
at=$(sed -n 's/.*stopping after step \([0-9]*\).*/\1/p' term.out | head -1)
if [[ $rc -eq 143 && -n "$at" && "$(cat S/latest 2>/dev/null)" == "global_step$at" && -s S/global_step$at/manifest.json ]] &&
  [[ -z "$(find S -name '*.tmp.*')" ]] && grep -q "SIGTERM: every rank stops after its current step" term.out &&
  "$ZR" --num_gpus 2 --config c.json gpt.bin --steps $((at + 1)) --seq_len 16 --save_dir S --resume latest 2>&1 |
  grep -q "resumed from S/global_step$at"; then
  ok "SIGTERM to a 2-rank launcher: exit 143 after a complete checkpoint at step $at that resumes"
else
  bad "SIGTERM to a 2-rank launcher: rc=$rc, stopped at '$at', latest '$(cat S/latest 2>/dev/null)'"
  grep -v "loss" term.out | tail -5
fi

# 2. A second SIGTERM during the save (held open by a test hook after the shards are written): the previous `latest`
# stays, the unfinished save's files are removed and a message says so.
"$ZR" --num_gpus 2 --config c.json gpt.bin --steps 2 --seq_len 16 --save_dir B >/dev/null 2>&1
prev=$(cat B/latest 2>/dev/null)
ZERORUN_FAULT_INJECT=pause_after_shard:20000 "$ZR" --num_gpus 2 --config c.json gpt.bin --steps 1000000 --seq_len 16 \
  --save_dir B --resume latest --log_dir BL >term2.out 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -s BL/metrics.jsonl ]] && break; sleep 0.1; done
kill -TERM $pid
for _ in $(seq 300); do [[ $(ls B/*/zero_rank_*.safetensors 2>/dev/null | wc -l) -ge 4 ]] && break; sleep 0.05; done
t0=$(date +%s)
kill -TERM $pid
wait $pid
rc=$?
dt=$(($(date +%s) - t0))
if [[ $rc -eq 143 && $dt -lt 15 && "$(cat B/latest)" == "$prev" && -s B/$prev/manifest.json && "$(ls B)" == "$(printf '%s\nlatest' "$prev")" ]] &&
  grep -q "stopped by SIGTERM before the checkpoint was complete: removed 2 file(s) of the unfinished save in B; 'latest' is unchanged ($prev)" term2.out; then
  ok "second SIGTERM mid-save: exit 143 in ${dt}s, 'latest' still $prev, the unfinished save removed, the message says so"
else
  bad "second SIGTERM mid-save: rc=$rc after ${dt}s, latest '$(cat B/latest)' (before: '$prev'), B: $(ls B | tr '\n' ' ')"
  grep -v "loss" term2.out | tail -5
fi

# The launcher killed outright (SIGKILL, nothing to forward): mpirun and the ranks end too, none is left behind.
"$ZR" --num_gpus 2 --config c.json gpt.bin --steps 1000000 --seq_len 16 --log_dir KL >kill.out 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -s KL/metrics.jsonl ]] && break; sleep 0.1; done
kill -KILL $pid
wait $pid 2>/dev/null
mine() { for p in $(pgrep -f "log_dir KL"); do [[ "$(readlink /proc/$p/cwd 2>/dev/null)" == "$(pwd -P)" ]] && echo $p; done; }
for _ in $(seq 100); do [[ -z "$(mine)" ]] && break; sleep 0.1; done
if [[ -z "$(mine)" ]]; then ok "launcher killed with SIGKILL: no mpirun or rank left"; else
  bad "processes left after the launcher's SIGKILL: $(mine | tr '\n' ' ')"; kill -9 $(mine); fi

# 3. Shards and model files that are not regular files: an error naming them, exit 1 (never a hang on a FIFO).
"$ZR" --config c.json gpt.bin --steps 2 --seq_len 16 --save_dir R >/dev/null 2>&1
shard=R/global_step2/zero_rank_00000.safetensors
mv $shard keep.st
for kind in zero fifo dir; do
  rm -rf $shard
  case $kind in
    zero) ln -s /dev/zero $shard ;;
    fifo) mkfifo $shard ;;
    dir) mkdir $shard ;;
  esac
  expect_err "resume: shard is $kind" "$shard: not a regular file" \
    "$ZR" --config c.json gpt.bin --steps 3 --seq_len 16 --save_dir R --resume latest
  expect_err "merge: shard is $kind" "not a regular file" "$ZR" merge R merged_$kind
done
rm -rf $shard
mv keep.st $shard
mkfifo fifo.bin
expect_err "model.bin is a FIFO" "fifo.bin: not a regular file (a FIFO (named pipe))" "$ZR" --config c.json fifo.bin --steps 1
ln -s /dev/zero zero.bin
expect_err "model.bin is /dev/zero" "zero.bin: not a regular file (a character device)" "$ZR" --config c.json zero.bin --steps 1
expect_err "model.bin is a directory" "R: not a regular file (a directory)" "$ZR" --config c.json R --steps 1
expect_err "config is a directory" "R: not a regular file (a directory)" "$ZR" --config R gpt.bin --steps 1
expect_err "hostfile is /dev/zero" "zero.bin: not a regular file" "$ZR" --hostfile zero.bin --config c.json gpt.bin --steps 1
cp -r R/global_step2 F && rm F/manifest.json && mkfifo F/manifest.json
expect_err "token shard is a FIFO" "fifo.bin: not a regular file (a FIFO (named pipe))" "$ZR" --config c.json gpt.bin \
  --steps 1 --data fifo.bin
expect_err "token shard is /dev/zero" "zero.bin: not a regular file (a character device)" "$ZR" --config c.json gpt.bin \
  --steps 1 --data zero.bin
expect_err "manifest.json is a FIFO" "F/manifest.json: not a regular file (a FIFO (named pipe))" "$ZR" merge F merged_f
if out=$("$ZR" --config <(cat c.json) gpt.bin --steps 1 --seq_len 16 2>&1); then ok "--config <(...) (a pipe) is read"; else
  bad "--config <(...): $out"; fi

# 4. Every manifest field in range.
cp -r R/global_step2 M
m=M/manifest.json
for edit in '.zero_stage = 7|zero_stage' '.precision = "fp8"|precision' '.scheduler.last_batch_iteration = -5|last_batch_iteration' \
  '.data.seed = -1|data.seed' '.optimizer.states = [1]|optimizer.states' '.config = 3|config' '.world_size = 0|world_size'; do
  jq "${edit%%|*}" R/global_step2/manifest.json >$m
  expect_err "manifest ${edit%%|*} (resume)" "${edit##*|}" "$ZR" --config c.json gpt.bin --steps 3 --seq_len 16 --resume M
  expect_err "manifest ${edit%%|*} (merge)" "${edit##*|}" "$ZR" merge M merged_m
done

# 5. Non-finite weights: an error naming the tensor at load.
"$PY" - gpt.bin nan.bin <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n])
name = sorted(k for k in h if k != "__metadata__")[0]
s, _ = h[name]["data_offsets"]
b[8 + n + s + 4 * 3:8 + n + s + 4 * 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)
PY
first=$("$PY" -c "import json,struct;b=open('gpt.bin','rb').read();n=struct.unpack('<Q',b[:8])[0];print(sorted(k for k in json.loads(b[8:8+n]) if k!='__metadata__')[0])")
expect_err "NaN weight in model.bin" "nan.bin: tensor '$first' holds a non-finite value (NaN or Inf) at element 3" \
  "$ZR" --config c.json nan.bin --steps 1

# A checkpoint whose master weights hold a NaN (checksums updated, as a diverged run would save it): merge refuses.
cp -r R/global_step2 N
"$PY" - N <<'PY'
import json, struct, sys, zlib
d = sys.argv[1]; p = d + "/zero_rank_00000.safetensors"
b = bytearray(open(p, "rb").read())
(n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n])
name = sorted(k for k in h if k.endswith(".master"))[0]
s, _ = h[name]["data_offsets"]
b[8 + n + s:8 + n + s + 4] = struct.pack("<f", float("inf"))
open(p, "wb").write(b)
m = json.load(open(d + "/manifest.json"))
m["files"]["zero_rank_00000.safetensors"]["crc32"] = "%08x" % zlib.crc32(bytes(b))
json.dump(m, open(d + "/manifest.json", "w"))
PY
expect_err "merge of a checkpoint with an Inf weight" "holds a non-finite value (NaN or Inf) at element 0" "$ZR" merge N merged_n
[[ ! -e merged_n/model.bin && ! -e merged_n/model.safetensors ]] && ok "nothing written" || bad "merge wrote files"

# 6. Host names: only host names and IP literals; anything else is an error naming the hostfile line.
for name in 'a;touch_x' '$(touch_x)' '`touch_x`' 'a|b' '-oProxyCommand=touch_x' $'bad\x01name' $'evil\u202ename' 'a..b' 'x-.y'; do
  printf 'worker-0 slots=1\n%s slots=1\n' "$name" >hosts
  expect_err "host name $(printf %q "$name")" "hosts:2: '" "$ZR" --hostfile hosts --config c.json gpt.bin --dry_run
done
printf 'worker-0 slots=2\n10.0.0.7 slots=1\nfe80::1 slots=1\nnode_3.cluster.local slots=1\n' >hosts
out=$("$ZR" --hostfile hosts --config c.json gpt.bin --steps 1 --dry_run 2>&1)
if [[ $? -eq 0 ]]; then ok "host names and IP literals accepted"; else bad "valid hosts rejected: $out"; fi
expect_err "--master_addr not a host" "--master_addr '\$(x)' is not a host name" "$ZR" --num_gpus 2 --config c.json gpt.bin \
  --master_addr '$(x)' --dry_run

# 7. --dry_run prints a command a shell runs as printed: the words come back exactly, and pasted it trains.
printf 'worker-0 slots=2\nworker-1 slots=2\n' >hosts
line=$("$ZR" --hostfile hosts --config c.json gpt.bin --steps 1 --dry_run)
eval "words=($line)"
if printf '%s\n' "${words[@]}" | grep -qx 'ZERORUN_SLOTS=worker-0=0+1;worker-1=0+1' && [[ $line == *"'ZERORUN_SLOTS=worker-0=0+1;worker-1=0+1'"* ]]; then
  ok "--dry_run quotes the slot map"
else bad "--dry_run: $line"; fi
cp c.json "my cfg's \$HOME.json"
line=$("$ZR" --num_gpus 2 --device cpu --config "my cfg's \$HOME.json" gpt.bin --steps 2 --seq_len 16 --log_dir P --dry_run)
if bash -c "$line" >paste.out 2>&1 && [[ $(wc -l <P/metrics.jsonl) -eq 2 ]]; then ok "the pasted --dry_run command trains"; else
  bad "pasted --dry_run command failed: $line"; tail -3 paste.out; fi
[[ ! -e touch_x ]] && ok "no host name ran a command" || bad "a host name ran a command"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
