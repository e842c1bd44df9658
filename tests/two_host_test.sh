#!/usr/bin/env bash
# Two real hosts on one machine: network namespaces joined by a veth pair (10.231.0.1 and .2, the interface named
# zr0 in both), each with its own OpenSSH server; mpirun starts the remote rank over real ssh (--ssh with
# arguments, --nic zr0). Checks: the 2-host ZeRO-3 run equals 2 local ranks; a checkpoint written from 2 hosts
# resumes on 1; kill -9 of the remote rank ends the job, with nothing left on either host. Namespaces, sshds and
# processes are cleaned up here; the launcher's report names rank 1, its host and signal 9 (exit 137). The link
# taken down mid-training (ssh keepalives): the job ends within the timeout + 15 s with a report naming the
# collective, rank 0 and its host (rank 1 on the unreachable host: no report), nothing left on the launching host,
# and the unreachable rank ends by its watchdog. Needs root, /usr/sbin/sshd (Debian's openssh-server) and `ip netns`: skipped
# (exit 77) with a message otherwise.
set -u
ZR=$(realpath "${1:?usage: two_host_test.sh path/to/zerorun}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"
unset OMPI_MCA_btl  # lib.sh's shared-memory-only transport: two hosts need tcp
skip() { echo "SKIP - $1"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces"
[[ -x /usr/sbin/sshd ]] || skip "needs /usr/sbin/sshd (apt-get install openssh-server)"
command -v ssh >/dev/null || skip "needs ssh (openssh-client)"
A=zrA$$ B=zrB$$
ip netns add $A 2>/dev/null || skip "cannot create network namespaces here"
W=$(mktemp -d)
cleanup() {
  for ns in $A $B; do
    pids=$(ip netns pids $ns 2>/dev/null)
    [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
    ip netns del $ns 2>/dev/null
  done
  [[ -n "${KEEP:-}" ]] || rm -rf "$W"
}
trap cleanup EXIT
ip netns add $B
ip link add zra$$ type veth peer name zrb$$
ip link set zra$$ netns $A && ip link set zrb$$ netns $B
ip -n $A link set zra$$ name zr0 && ip -n $B link set zrb$$ name zr0
ip -n $A addr add 10.231.0.1/24 dev zr0 && ip -n $B addr add 10.231.0.2/24 dev zr0
for ns in $A $B; do ip -n $ns link set zr0 up; ip -n $ns link set lo up; done
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$W/id" && ssh-keygen -q -t ed25519 -N '' -f "$W/hostkey"
cp "$W/id.pub" "$W/authorized_keys"
cat >"$W/sshd_config" <<CONF
HostKey $W/hostkey
AuthorizedKeysFile $W/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
CONF
# Each host has its own name too (a UTS namespace), as the ranks report it: zr-hostA, zr-hostB.
ip netns exec $A unshare --uts sh -c "hostname zr-hostA && exec /usr/sbin/sshd -f $W/sshd_config -o ListenAddress=10.231.0.1 -o PidFile=$W/a.pid"
ip netns exec $B unshare --uts sh -c "hostname zr-hostB && exec /usr/sbin/sshd -f $W/sshd_config -o ListenAddress=10.231.0.2 -o PidFile=$W/b.pid"
SSH="ssh -i $W/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
for _ in $(seq 50); do ip netns exec $A $SSH 10.231.0.2 true 2>/dev/null && break; sleep 0.1; done
if ip netns exec $A $SSH 10.231.0.2 true; then ok "ssh from host A to host B"; else bad "no ssh to host B"; exit 1; fi

cd "$W"
printf '10.231.0.1 slots=1\n10.231.0.2 slots=1\n' >hosts
"$ZR" init --arch gpt2 --vocab 64 --n_ctx 16 --n_embd 16 --n_layer 2 --n_head 2 -o gpt.bin >/dev/null
echo '{"train_batch_size": 4, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' >z3.json
export ZERORUN_COMM_TIMEOUT=20
onA() { ip netns exec $A unshare --uts sh -c 'hostname zr-hostA && exec "$@"' sh "$@"; }
LAUNCH=(--hostfile hosts --ssh "$SSH" --nic zr0 --master_addr 10.231.0.1)
# The job's environment on the remote host (over real ssh, which starts a fresh environment): the dry run's command
# as printed, the rank command replaced by an environment dump.
export NCCL_DEBUG=WARN
cmd=$(ip netns exec $A "$ZR" "${LAUNCH[@]}" --config z3.json gpt.bin --dry_run)
timeout 60 ip netns exec $A sh -c "${cmd%% $ZR train*}"' sh -c '"'"'{ env; ip -o -4 addr show dev zr0; } >$PWD/env.$OMPI_COMM_WORLD_RANK'"'" \
  >dump.out 2>&1
if grep -q "inet 10.231.0.2/" env.1 2>/dev/null && grep -qx "ZERORUN_COMM_TIMEOUT=20" env.1 && grep -qx "NCCL_DEBUG=WARN" env.1 &&
  grep -qx "NCCL_SOCKET_IFNAME=zr0" env.1 && grep -qx "MASTER_ADDR=10.231.0.1" env.1; then
  ok "the rank on host B has the job's environment (ZERORUN_COMM_TIMEOUT, NCCL_*, MASTER_ADDR, NCCL_SOCKET_IFNAME)"
else bad "rank on host B: $(grep -E 'ZERORUN|NCCL|MASTER|inet' env.1 2>/dev/null | tr '\n' ' ')"; tail -3 dump.out; fi
timeout 300 ip netns exec $A "$ZR" "${LAUNCH[@]}" --config z3.json gpt.bin --steps 4 --micro_batch_size 2 --log_dir two \
  --save_dir ck >two.out 2>&1
rc=$?
"$ZR" --num_gpus 2 --config z3.json gpt.bin --steps 6 --micro_batch_size 2 --log_dir local >/dev/null 2>&1
if [[ $rc -eq 0 ]] && grep -q "world 2 (mpi" two.out && [[ $(wc -l <two/metrics.jsonl) -eq 4 ]]; then
  d=$(paste <(losses two) <(losses local | head -4) | awk '{d=$1-$2; if(d<0)d=-d; if(d>w)w=d} END{printf "%.3g", w}')
  if awk -v d="$d" 'BEGIN{exit !(d < 1e-6)}'; then ok "2-host ZeRO-3 run over ssh = 2 local ranks (max loss diff $d)"
  else bad "2-host losses differ from 2 local ranks by $d"; fi
else bad "2-host run rc=$rc"; grep -v '^\[zerorun\]' two.out | tail -8; fi
# The checkpoint written from two hosts, resumed on one (micro 2 x gas 2): steps 5, 6 as the 2-rank run's.
"$ZR" --config z3.json gpt.bin --steps 6 --micro_batch_size 2 --save_dir ck --resume latest --log_dir one >one.out 2>&1
d=$(paste <(losses one | tail -2) <(losses local | tail -2) | awk '{d=$1-$2; if(d<0)d=-d; if(d>w)w=d} END{printf "%.3g", w}')
if grep -q "resumed from ck/global_step4" one.out && awk -v d="$d" 'BEGIN{exit !(d < 1e-5)}'; then
  ok "a checkpoint saved from 2 hosts resumes on 1 (steps 5-6 within $d of the 2-rank run)"
else bad "resume on 1 host: diff '$d'"; tail -3 one.out; fi

# kill -9 of the remote rank: the job ends, nothing left on either host but the sshds.
onA "$ZR" "${LAUNCH[@]}" --config z3.json gpt.bin --steps 1000000 --micro_batch_size 2 --log_dir long >long.out 2>&1 &
launcher=$!
for _ in $(seq 300); do [[ -s long/metrics.jsonl ]] && break; sleep 0.1; done
sshd_b=$(cat b.pid) sshd_a=$(cat a.pid)
victim=$(for p in $(ip netns pids $B); do { tr '\0' ' ' </proc/$p/cmdline; } 2>/dev/null | grep -q "zerorun train" && echo $p; done | head -1)
t0=$(date +%s.%N)
[[ -n "$victim" ]] && kill -9 "$victim"
for _ in $(seq 350); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
if kill -0 $launcher 2>/dev/null; then bad "job still running 35 s after the remote rank was killed"; kill -9 $launcher
else
  wait $launcher; rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [[ -n "$victim" && $rc -eq 137 ]]; then ok "kill -9 of the remote rank ends the job in ${dt}s (exit $rc: 128 + 9)"
  else bad "remote kill: victim '$victim', rc=$rc"; fi
  # The launcher's report: the root cause is rank 1 on host B, killed by signal 9.
  if grep -A1 "root cause" long.out | grep -q "rank 1 on host 10.231.0.2.*exited on signal 9" &&
    ! grep -q "^ZERORUN_RANK_STATUS" long.out; then
    ok "kill -9: the report names rank 1, its host and signal 9: $(grep -A1 'root cause' long.out | tail -1 | sed 's/^zerorun: *//')"
  else bad "kill -9 report: $(grep '^zerorun:' long.out | tail -12)"; fi
fi
sleep 1
left=$(for ns in $A $B; do for p in $(ip netns pids $ns); do [[ $p == "$sshd_a" || $p == "$sshd_b" ]] || ps -o pid=,args= -p $p; done; done)
if [[ -z "$left" ]]; then ok "nothing left on either host"; else bad "left behind: $left"; fi

# The link taken down mid-training, ZERORUN_COMM_TIMEOUT=10. Plain ssh (no keepalives): mpirun would wait for the
# link forever; rank 0's watchdog fires at 10 s, the launcher ends mpirun (SIGTERM at +3 s, SIGKILL at +8 s) and what
# it left, so the job ends within the timeout + 15 s with a report naming rank 0, its host and the collective; the
# rank on the unreachable host ends by its own watchdog. With ssh keepalives (2 s x 2) mpirun notices the dead link
# first: the report names the silent rank 1 and its host, and rank 0's collective in progress.
export ZERORUN_COMM_TIMEOUT=10
ranks_b() { for p in $(ip netns pids $B); do { tr '\0' ' ' </proc/$p/cmdline; } 2>/dev/null | grep -q "zerorun train" && echo $p; done; }
link_down() {  # name, extra ssh options
  local name=$1 t0 rc=-1
  rm -rf $name
  onA "$ZR" --hostfile hosts --ssh "$SSH $2" --nic zr0 --master_addr 10.231.0.1 --config z3.json gpt.bin \
    --steps 1000000 --micro_batch_size 2 --log_dir $name >$name.out 2>&1 &
  local launcher=$!
  for _ in $(seq 300); do [[ -s $name/metrics.jsonl ]] && break; sleep 0.1; done
  [[ -n "$(ranks_b)" ]] || bad "$name: no rank on host B before the link went down"
  t0=$(date +%s.%N)
  ip -n $B link set zr0 down
  for _ in $(seq 250); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
  if kill -0 $launcher 2>/dev/null; then bad "$name: job still running 25 s after the link went down"; kill -9 $launcher
  else
    wait $launcher; rc=$?
    ok "$name: the job ends in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s (exit $rc), within the timeout + 15 s"
  fi
  left=$(for p in $(ip netns pids $A); do [[ $p == "$sshd_a" ]] || ps -o pid=,args= -p $p; done)
  if [[ -z "$left" ]]; then ok "$name: nothing left on the launching host"; else bad "$name: left on host A: $left"; fi
  for _ in $(seq 150); do [[ -z "$(ranks_b)" ]] && break; sleep 0.1; done
  if [[ -z "$(ranks_b)" ]]; then
    ok "$name: the rank on the unreachable host is gone $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s after the link went down (its watchdog: 10 s)"
  else bad "$name: the rank on host B still runs"; fi
  ip -n $B link set zr0 up
  for _ in $(seq 50); do onA $SSH 10.231.0.2 true 2>/dev/null && break; sleep 0.2; done  # the link back for the next
  return $rc
}
link_down down ""
rc=$?
cause=$(grep -A3 "root cause" down.out)
if grep -q "rank 0 on host 10.231.0.1 (zr-hostA).*collective timed out (watchdog)" <<<"$cause" &&
  grep -Eq "error: zerorun: watchdog: rank 0: [a-z_]+ #[0-9]+ .* has not completed after 10 s" <<<"$cause" &&
  grep -Eq "state: step [0-9]+, in [a-z_]+ #[0-9]+ for 10.[0-9] s" <<<"$cause" &&
  grep -q "rank 1 on host 10.231.0.2: no report" down.out && [[ $rc -eq 1 ]]; then
  ok "down: the report names the collective, rank 0 and its host: $(grep -A2 'root cause' down.out | tail -1 | sed 's/^zerorun: *//' | cut -c1-80)"
else bad "down: report (rc=$rc): $(grep '^zerorun:' down.out | tail -14)"; fi
link_down keepalive "-o ServerAliveInterval=2 -o ServerAliveCountMax=2"
rc=$?
if grep -q "root cause: [a-z]* lost (or could not start) a remote.*no word from rank 1 on host 10.231.0.2" keepalive.out &&
  grep -Eq "rank 0 on host 10.231.0.1 \(zr-hostA\): stopped by signal 15 at step [0-9]+, in [a-z_]+ #[0-9]+" keepalive.out; then
  ok "keepalive: the report names rank 1 and its host, and rank 0's collective: $(grep 'rank 0 on host' keepalive.out | sed 's/^zerorun: *//' | cut -c1-100)"
else bad "keepalive: report (rc=$rc): $(grep '^zerorun:' keepalive.out | tail -14)"; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
