#!/usr/bin/env bash
# Two real hosts on one machine: network namespaces joined by a veth pair (10.231.0.1 and .2, the interface named
# zr0 in both), each with its own OpenSSH server; mpirun starts the remote rank over real ssh (--ssh with
# arguments, --nic zr0). Checks: the 2-host ZeRO-3 run equals 2 local ranks; a checkpoint written from 2 hosts
# resumes on 1; kill -9 of the remote rank ends the job, with nothing left on either host. Namespaces, sshds and
# processes are cleaned up here. The link taken down mid-training (ssh keepalives): the job ends within the timeout + 15 s,
# nothing left on the launching host, the unreachable rank ends by its watchdog. Needs root, /usr/sbin/sshd (Debian's openssh-server) and `ip netns`: skipped
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
  rm -rf "$W"
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
ip netns exec $A /usr/sbin/sshd -f "$W/sshd_config" -o ListenAddress=10.231.0.1 -o PidFile="$W/a.pid"
ip netns exec $B /usr/sbin/sshd -f "$W/sshd_config" -o ListenAddress=10.231.0.2 -o PidFile="$W/b.pid"
SSH="ssh -i $W/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
for _ in $(seq 50); do ip netns exec $A $SSH 10.231.0.2 true 2>/dev/null && break; sleep 0.1; done
if ip netns exec $A $SSH 10.231.0.2 true; then ok "ssh from host A to host B"; else bad "no ssh to host B"; exit 1; fi

cd "$W"
printf '10.231.0.1 slots=1\n10.231.0.2 slots=1\n' >hosts
"$ZR" init --arch gpt2 --vocab 64 --n_ctx 16 --n_embd 16 --n_layer 2 --n_head 2 -o gpt.bin >/dev/null
echo '{"train_batch_size": 4, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' >z3.json
export ZERORUN_COMM_TIMEOUT=20
onA() { ip netns exec $A "$@"; }
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
victim=$(for p in $(ip netns pids $B); do tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q "zerorun train" && echo $p; done | head -1)
t0=$(date +%s.%N)
[[ -n "$victim" ]] && kill -9 "$victim"
for _ in $(seq 350); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
if kill -0 $launcher 2>/dev/null; then bad "job still running 35 s after the remote rank was killed"; kill -9 $launcher
else
  wait $launcher; rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [[ -n "$victim" && $rc -ne 0 ]]; then ok "kill -9 of the remote rank ends the job in ${dt}s (exit $rc)"
  else bad "remote kill: victim '$victim', rc=$rc"; fi
fi
sleep 1
left=$(for ns in $A $B; do for p in $(ip netns pids $ns); do [[ $p == "$sshd_a" || $p == "$sshd_b" ]] || ps -o pid=,args= -p $p; done; done)
if [[ -z "$left" ]]; then ok "nothing left on either host"; else bad "left behind: $left"; fi

# The link taken down mid-training (ssh keepalives, ZERORUN_COMM_TIMEOUT=10): the job ends within the timeout
# + 15 s, nothing is left on the launching host, and the rank on the unreachable host ends by its own watchdog.
export ZERORUN_COMM_TIMEOUT=10
ip netns exec $A "$ZR" --hostfile hosts --ssh "$SSH -o ServerAliveInterval=2 -o ServerAliveCountMax=2" --nic zr0 \
  --master_addr 10.231.0.1 --config z3.json gpt.bin --steps 1000000 --micro_batch_size 2 --log_dir down >down.out 2>&1 &
launcher=$!
for _ in $(seq 300); do [[ -s down/metrics.jsonl ]] && break; sleep 0.1; done
ranks_b() { for p in $(ip netns pids $B); do tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q "zerorun train" && echo $p; done; }
[[ -n "$(ranks_b)" ]] || bad "no rank on host B before the link went down"
t0=$(date +%s.%N)
ip -n $B link set zr0 down
for _ in $(seq 250); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
if kill -0 $launcher 2>/dev/null; then bad "job still running 25 s after the link went down"; kill -9 $launcher
else
  wait $launcher; rc=$?
  ok "link down: the job ends in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s (exit $rc)"
fi
sleep 1
left=$(for p in $(ip netns pids $A); do [[ $p == "$sshd_a" ]] || ps -o pid=,args= -p $p; done)
if [[ -z "$left" ]]; then ok "link down: nothing left on the launching host"; else bad "left on host A: $left"; fi
for _ in $(seq 150); do [[ -z "$(ranks_b)" ]] && break; sleep 0.1; done
if [[ -z "$(ranks_b)" ]]; then
  ok "link down: the rank on the unreachable host ended by its watchdog ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s)"
else bad "link down: the rank on host B still runs"; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
