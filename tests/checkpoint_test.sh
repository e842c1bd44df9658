#!/usr/bin/env bash
# Checkpoints end to end: bitwise resume (stages 0-3), resume at another world
# size / ZeRO stage, merge == live weights, integrity errors, and a rank
# killed in the middle of a save. TRAIN_ARGS adds options to every training
# run (tests/run_gpu.sh: "--device cuda --comm mpi --data F", two ranks sharing
# the GPU), WTOL sets the weights bound of section 2 (default 1e-5).
set -u
ZR_BIN=$(realpath "${1:?usage: checkpoint_test.sh path/to/zerorun}")
TRAIN_ARGS=${TRAIN_ARGS:-}
WTOL=${WTOL:-1e-5}
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
# This script's ranks: zerorun processes working in $W. A pattern alone would also match (and the kill below hit)
# ranks of another test suite running on the machine at the same time.
my_ranks() {
  local p here
  here=$(cd "$W" && pwd -P)
  for p in $(pgrep -f "zerorun train $1"); do [[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" == "$here" ]] && echo "$p"; done
}
# Every training command gets TRAIN_ARGS (after its own, so a test's --micro_batch_size etc. stay).
ZR=$W/zerorun
cat >"$ZR" <<EOF2
#!/usr/bin/env bash
case "\$1" in init|merge|import|report|estimate) exec "$ZR_BIN" "\$@" ;; esac
exec "$ZR_BIN" "\$@" $TRAIN_ARGS
EOF2
chmod +x "$ZR"
run() { "$ZR" "$@" >>run.log 2>&1; }

"$ZR" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 --seed 4 -o ckm.bin >/dev/null
cfg() {  # stage
  echo "{\"train_batch_size\": 12, \"gradient_clipping\": 0.5, \"zero_optimization\": {\"stage\": $1, \"reduce_bucket_size\": 6000, \"stage3_param_persistence_threshold\": 300},
  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3, \"weight_decay\": 0.1}},
  \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 3, \"warmup_max_lr\": 2e-3, \"total_num_steps\": 10}}}" >"c$1.json"
}
for s in 0 1 2 3; do cfg $s; done

# 1. 10 steps straight vs 5 + save + resume + 5, same world size: bitwise.
for s in 0 1 2 3; do
  rm -rf A B S
  run --num_gpus 2 --config c$s.json ckm.bin --steps 10 --micro_batch_size 3 --log_dir A --final_weights A.st
  run --num_gpus 2 --config c$s.json ckm.bin --steps 5 --micro_batch_size 3 --log_dir B --save_dir S
  run --num_gpus 2 --config c$s.json ckm.bin --steps 10 --micro_batch_size 3 --log_dir B --save_dir S --resume latest \
    --final_weights B.st
  if [[ -s A.st && -s B.st ]] && diff <(losses A) <(losses B) >/dev/null && [[ "$(wdiff B.st A.st)" == "0" ]]; then
    ok "ZeRO-$s: save at 5 + resume = 10 straight, bitwise (losses and weights)"
  else
    bad "ZeRO-$s bitwise resume: weights $(wdiff B.st A.st 2>&1)"; diff <(losses A) <(losses B) | head -4
  fi
done

# 2. Resume at another world size / stage: following losses within 1e-5 of the uninterrupted run (weights WTOL).
rm -rf A && run --config c0.json ckm.bin --steps 10 --micro_batch_size 12 --log_dir A --final_weights A.st
for spec in "4 2 2 2" "2 3 2 2" "3 4 1 1" "2 2 3 1" "2 2 1 3"; do
  set -- $spec
  n1=$1 n2=$2 s1=$3 s2=$4
  rm -rf B S
  run --num_gpus $n1 --config c$s1.json ckm.bin --steps 5 --micro_batch_size $((12 / n1)) --log_dir B --save_dir S
  run --num_gpus $n2 --config c$s2.json ckm.bin --steps 10 --micro_batch_size $((12 / n2)) --log_dir B --save_dir S \
    --resume global_step5 --final_weights B.st
  worst=$(loss_diff A B)
  rows=$(losses B | wc -l)
  wd=$(wdiff B.st A.st)
  if [[ $rows -eq 10 ]] && awk -v w="$worst" -v d="$wd" -v t="$WTOL" 'BEGIN{exit !(w <= 1e-5 && d <= t)}'; then
    ok "resume $n1 ranks ZeRO-$s1 -> $n2 ranks ZeRO-$s2: losses within $worst, weights within $wd"
  else
    bad "resume $n1/ZeRO-$s1 -> $n2/ZeRO-$s2: $rows rows, losses $worst, weights $wd"; tail -3 run.log
  fi
done

# 3. merge: equals the gathered live weights exactly; bf16; model.bin trains; no MPI needed.
rm -rf S B M
run --num_gpus 3 --config c3.json ckm.bin --steps 4 --micro_batch_size 4 --save_dir S --final_weights live.st
out=$(env -u OMPI_MCA_btl "$ZR" merge S M 2>&1)
if [[ "$(wdiff M/model.bin live.st)" == "0" && -s M/config.json ]]; then ok "merge == live weights (exact)"; else bad "merge differs: $out"; fi
"$ZR" merge S MZ --layout zerorun >/dev/null 2>&1
if [[ "$(wdiff MZ/model.safetensors live.st)" == "0" ]] && grep -q zerorun_note MZ/config.json; then
  ok "merge --layout zerorun: model.bin's names and layout, config.json says so"
else bad "merge --layout zerorun differs"; fi
# The default layout is what transformers' GPT2LMHeadModel loads: "transformer." names, Conv1D weights [in, out].
if "$PY" - M/model.safetensors live.st M/config.json <<'PY'
import json, struct, sys
from array import array
def load(p):
    b = open(p, "rb").read(); (n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n]); meta = h.pop("__metadata__", {})
    out = {}
    for k, e in h.items():
        s, t = e["data_offsets"]; a = array("f"); a.frombytes(b[8 + n + s:8 + n + t]); out[k] = (e["shape"], a)
    return out, meta
hf, meta = load(sys.argv[1]); live, _ = load(sys.argv[2]); cfg = json.load(open(sys.argv[3]))
conv = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
assert meta.get("format") == "pt" and cfg["architectures"] == ["GPT2LMHeadModel"], (meta, cfg)
assert set(hf) == {"transformer." + k for k in live}, sorted(set(hf) ^ {"transformer." + k for k in live})
for k, (shape, a) in live.items():
    hs, ha = hf["transformer." + k]
    if k.endswith(conv):
        r, c = shape
        assert hs == [c, r] and all(ha[j * r + i] == a[i * c + j] for i in range(r) for j in range(c)), k
    else:
        assert hs == shape and ha == a, k
PY
then ok "merge (default): GPT2LMHeadModel names and Conv1D [in, out] weights, exact"; else bad "merge HF layout"; fi
"$ZR" merge S M16 --dtype bf16 --layout zerorun >/dev/null 2>&1
b16=$(wdiff M16/model.safetensors live.st 2>&1)
if [[ "$b16" == "keys-differ" ]]; then bad "bf16 merge keys"; else
  "$PY" -c "import json,struct; b=open('M16/model.safetensors','rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n]); h.pop('__metadata__'); import sys; sys.exit(0 if all(e['dtype']=='BF16' for e in h.values()) else 1)" \
    && ok "merge --dtype bf16 writes BF16 tensors" || bad "bf16 merge dtype"
fi
if "$ZR" --config c0.json M/model.bin --steps 2 --micro_batch_size 12 >/dev/null 2>&1; then ok "merged model.bin trains"; else bad "merged model.bin does not train"; fi
# Peak memory near one copy of the model: a 4M-parameter model (16 MiB fp32) on 4 ranks.
"$ZR" init --arch gpt2 --vocab 4096 --n_ctx 64 --n_embd 256 --n_layer 4 --n_head 4 -o big.bin >/dev/null
run --num_gpus 4 --config c3.json big.bin --steps 1 --micro_batch_size 1 --seq_len 16 --save_dir SB
out=$("$ZR" merge SB MB 2>&1)
echo "$out" | tail -1
peak=$(echo "$out" | sed -n 's/.*peak memory +\([0-9.]*\) MiB while merging.*model \([0-9.]*\) MiB fp32.*/\1 \2/p')
if [[ -n "$peak" ]] && awk -v p="${peak% *}" -v m="${peak#* }" 'BEGIN{exit !(p < m)}'; then ok "merge peak memory +${peak% *} MiB < one model copy (${peak#* } MiB)"; else bad "merge peak memory: $out"; fi

# 4. Integrity: every fault is named, on every rank, non-zero exit.
rm -rf S && run --num_gpus 2 --config c2.json ckm.bin --steps 3 --micro_batch_size 6 --save_dir S
expect_fail() {  # name pattern cmd...
  local name=$1 pat=$2; shift 2
  local o; o=$(timeout 120 "$@" 2>&1); local rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -qF -- "$pat" <<<"$o"; then ok "$name"; else bad "$name (rc=$rc)"; echo "$o" | grep -v "^\[zerorun\]" | tail -4; fi
}
RESUME=("$ZR" --num_gpus 2 --config c2.json ckm.bin --steps 5 --micro_batch_size 6 --save_dir S)
cp -r S S.good
f=S/global_step3/zero_rank_00001.safetensors
"$PY" -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0x40; open(p,'wb').write(b)" "$f"
expect_fail "flipped byte -> checksum error naming the shard" "zero_rank_00001.safetensors: checksum" "${RESUME[@]}" --resume latest
o=$("${RESUME[@]}" --resume latest 2>&1); n=$(grep -c "error on rank" <<<"$o")
[[ $n -ge 1 ]] && ok "integrity error reported with the rank ($n rank line(s))" || bad "no rank named"
rm -rf S && cp -r S.good S && truncate -s -100 "$f"
expect_fail "truncated shard -> size error" "truncated or replaced shard" "${RESUME[@]}" --resume latest
rm -rf S && cp -r S.good S && rm "$f"
expect_fail "missing shard" "zero_rank_00001.safetensors: shard listed in the manifest is missing" "${RESUME[@]}" --resume latest
rm -rf S && cp -r S.good S
"$ZR" init --arch gpt2 --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 3 --n_head 4 -o other.bin >/dev/null
expect_fail "manifest from another model" "checkpoint is of another model" \
  "$ZR" --num_gpus 2 --config c2.json other.bin --steps 5 --micro_batch_size 6 --save_dir S --resume latest
expect_fail "unknown tag (names the saved ones)" "no checkpoint 'global_step99' (saved: global_step" "${RESUME[@]}" --resume global_step99
expect_fail "merge of a corrupt checkpoint" "checksum" bash -c "cp -r S.good S2; \"$PY\" -c \"import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-5]^=1; open(p,'wb').write(b)\" S2/global_step3/zero_rank_00000.safetensors; \"$ZR\" merge S2 OUT"

# 4b. import: the default merge (transformers' GPT-2 layout) read back is the merged model.bin exactly (weights and
# graph); a bf16 one rounds; what is not a GPT-2 checkpoint is an error naming the file and what is wrong.
same_model() {
  "$PY" - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); (n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n]); m = h.pop("__metadata__", {})
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}, m
a, ma = load(sys.argv[1]); b, mb = load(sys.argv[2])
def graph(m):  # what import keeps of the directory for merge (its config.json, generation config, tokenizer) aside
    g = json.loads(m["graph"])
    for k in ("hf_config", "hf_generation_config", "hf_tokenizer"):
        g.pop(k, None)
    return g
sys.exit(0 if a == b and graph(ma) == graph(mb) else 1)
PY
}
"$ZR" merge S.good MH >/dev/null 2>&1
if "$ZR" import MH -o imp.bin >/dev/null 2>&1 && same_model imp.bin MH/model.bin; then
  ok "import of the merged GPT2LMHeadModel files == merged model.bin (weights and graph, exact)"
else bad "import round trip"; fi
"$ZR" merge S.good MH16 --dtype bf16 >/dev/null 2>&1
# import keeps the checkpoint's dtype: model.bin holds bf16 (widened here to compare with the f32 merge).
widen_bf16() {
  "$PY" - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); (n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n]); d = b[8 + n:]
out, off, hdr = bytearray(), 0, {"__metadata__": h.pop("__metadata__")}
for k in sorted(h, key=lambda k: h[k]["data_offsets"][0]):
    if h[k]["dtype"] != "BF16": sys.exit(1)
    s, e = h[k]["data_offsets"]
    for i in range(s, e, 2): out += b"\0\0" + d[i:i + 2]
    hdr[k] = {"dtype": "F32", "shape": h[k]["shape"], "data_offsets": [off, off + 2 * (e - s)]}; off += 2 * (e - s)
j = json.dumps(hdr).encode(); j += b" " * ((8 - len(j) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + out)
PY
}
if "$ZR" import MH16 -o imp16.bin >/dev/null 2>&1 && widen_bf16 imp16.bin imp16w.bin \
  && [[ "$(wdiff imp16w.bin MH/model.bin | awk '{print ($1 < 1e-2) ? "ok" : "big"}')" == ok ]] \
  && "$ZR" --config c0.json imp16.bin --steps 1 --micro_batch_size 12 >/dev/null 2>&1; then
  ok "import of a bf16 checkpoint: model.bin keeps bf16, weights within bf16 rounding, trains"
else bad "bf16 import"; fi
expect_fail "import: no config.json" "has no config.json" "$ZR" import S.good -o x.bin
mkdir -p HL && cp MH/model.safetensors HL/ && sed 's/"gpt2"/"bert"/' MH/config.json >HL/config.json
expect_fail "import: another model_type" 'model_type "bert" is not one zerorun imports' "$ZR" import HL -o x.bin
mkdir -p HD && cp MH/model.safetensors HD/ &&
  "$PY" -c "import json; c=json.load(open('MH/config.json')); c.update(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1); json.dump(c, open('HD/config.json','w'))"
if "$ZR" import HD -o hd.bin >/dev/null &&
  "$PY" -c "import json,struct,sys; b=open('hd.bin','rb').read(); n=struct.unpack('<Q',b[:8])[0]; g=json.loads(json.loads(b[8:8+n])['__metadata__']['graph']); sys.exit(0 if sum(x['op']=='dropout' for x in g['nodes'])==5 and sum(x.get('attrs',{}).get('dropout',0)>0 for x in g['nodes'] if x['op']=='attention')==2 else 1)"; then
  ok "import gpt2: dropout 0.1 (as published) is applied in training (5 dropout nodes, 2 attention dropouts)"
else bad "import gpt2 with dropout"; fi
"$PY" -c "import json; c=json.load(open('HD/config.json')); c.update(attn_pdrop=1.5); json.dump(c, open('HD/config.json','w'))"
expect_fail "import gpt2: a dropout of 1.5" "'attn_pdrop' must be a probability in [0, 1), got 1.5" "$ZR" import HD -o x.bin
"$PY" -c "import json; c=json.load(open('HD/config.json')); c.update(attn_pdrop=0.1); json.dump(c, open('HD/config.json','w'))"
if "$ZR" import HD -o hd.bin --no_dropout 2>&1 | grep -q "note: --no_dropout: trains without the resid_pdrop of 0.1"; then
  ok "import gpt2 --no_dropout: trains without dropout and says so"
else bad "import --no_dropout"; fi
mkdir -p HM && cp MH/model.safetensors HM/ && sed 's/"gpt2"/"mistral"/' MH/config.json >HM/config.json
expect_fail "import: a GPT-2 labelled mistral" "HM/config.json: 'hidden_size' must be a positive integer" \
  "$ZR" import HM -o x.bin
mkdir -p HP && cp MH/config.json HP/ && touch HP/pytorch_model.bin
expect_fail "import: pickle only" "only pytorch_model.bin" "$ZR" import HP -o x.bin
mkdir -p HN && cp MH/model.safetensors HN/ && sed 's/"n_layer": [0-9]*/"n_layer": 9/' MH/config.json >HN/config.json
expect_fail "import: config asks for more layers than the file has" "has no tensor 'transformer.h." "$ZR" import HN -o x.bin
mkdir -p HG && cp MH/model.safetensors HG/ && sed 's/"gelu_new"/"relu"/' MH/config.json >HG/config.json
expect_fail "import: another activation" "activation_function \"relu\" is not supported" "$ZR" import HG -o x.bin
mkdir -p HT && cp MH/config.json HT/ && cp MZ/model.safetensors HT/
expect_fail "import: Linear-layout weights (merge --layout zerorun)" "(Conv1D weights are [in, out])" "$ZR" import HT -o x.bin

# Llama (grouped-query: 4 query heads, 2 key/value heads; untied): the default merge is LlamaForCausalLM's layout
# ("model." names, q/k/v_proj = rows of qkv_proj, exact), config.json a LlamaConfig; import of it = the merged
# model.bin exactly; config.json asking for what the graph does not compute is an error naming the key.
"$ZR" init --arch llama --vocab 128 --n_ctx 32 --n_embd 64 --n_layer 2 --n_head 4 --n_kv_head 2 --ffn 96 --seed 5 \
  -o ll.bin >/dev/null
run --num_gpus 2 --config c2.json ll.bin --steps 3 --micro_batch_size 6 --save_dir SL --final_weights ll_live.st
"$ZR" merge SL ML >/dev/null 2>&1
if "$PY" - ML/model.safetensors ll_live.st ML/config.json <<'PY'
import json, struct, sys
from array import array
def load(p):
    b = open(p, "rb").read(); (n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n]); h.pop("__metadata__", {})
    out = {}
    for k, e in h.items():
        s, t = e["data_offsets"]; a = array("f"); a.frombytes(b[8 + n + s:8 + n + t]); out[k] = (e["shape"], a)
    return out
hf = load(sys.argv[1]); live = load(sys.argv[2]); cfg = json.load(open(sys.argv[3]))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama", cfg
assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["tie_word_embeddings"]) == (4, 2, 16, False), cfg
want = set()
for k, (shape, a) in live.items():
    if k.endswith(".self_attn.qkv_proj.weight"):
        stem = "model." + k[: -len("qkv_proj.weight")]
        assert shape == [128, 64], shape
        for name, r0, r1 in (("q_proj", 0, 64), ("k_proj", 64, 96), ("v_proj", 96, 128)):
            hs, ha = hf[stem + name + ".weight"]; want.add(stem + name + ".weight")
            assert hs == [r1 - r0, 64] and ha == a[r0 * 64:r1 * 64], name
    else:
        n = k if k == "lm_head.weight" else "model." + k
        want.add(n)
        assert hf[n][0] == shape and hf[n][1] == a, k
assert set(hf) == want, sorted(set(hf) ^ want)
PY
then ok "merge of a grouped-query llama: LlamaForCausalLM names, q/k/v_proj split from qkv_proj, exact"
else bad "merge llama HF layout"; fi
if "$ZR" import ML -o imp_ll.bin >/dev/null 2>&1 && same_model imp_ll.bin ML/model.bin &&
  "$ZR" --config c0.json imp_ll.bin --steps 1 --micro_batch_size 12 >/dev/null 2>&1; then
  ok "import of the merged LlamaForCausalLM files == merged model.bin (weights and graph, exact), trains"
else bad "llama import round trip"; fi
llama_cfg() {  # DIR PYTHON-EXPR: ML's weights with config.json edited by the expression on dict c
  mkdir -p "$1" && cp ML/model.safetensors "$1/" &&
    "$PY" -c "import json,sys; c=json.load(open('ML/config.json')); $2; json.dump(c, open('$1/config.json','w'))"
}
llama_cfg LS 'c["rope_scaling"] = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}'
expect_fail "import llama: a rope type zerorun does not compute" 'rope_scaling.rope_type "longrope" is not supported' \
  "$ZR" import LS -o x.bin
llama_cfg LS2 'c["rope_scaling"] = {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}'
expect_fail "import llama: a rope setting of another type" "rope_scaling.beta_fast is not a setting of rope_type linear" \
  "$ZR" import LS2 -o x.bin
llama_cfg LB 'c["attention_bias"] = True'
expect_fail "import llama: biases the checkpoint lacks" "has no tensor 'model.layers.0.self_attn.q_proj.bias'" \
  "$ZR" import LB -o x.bin
llama_cfg LD 'c["attention_dropout"] = -0.1'
expect_fail "import llama: a negative dropout" "'attention_dropout' must be a probability in [0, 1), got -0.1" \
  "$ZR" import LD -o x.bin
llama_cfg LK 'c["num_key_value_heads"] = 4'
expect_fail "import llama: more key/value heads than the file has" "k_proj.weight' has shape [32, 64], expected [64, 64]" \
  "$ZR" import LK -o x.bin
llama_cfg LK3 'c["num_key_value_heads"] = 3'
expect_fail "import llama: key/value heads not dividing the heads" "config.json: num_key_value_heads 3 must divide num_attention_heads 4" \
  "$ZR" import LK3 -o x.bin
llama_cfg LH 'c["head_dim"] = 32'
expect_fail "import llama: another head_dim than the weights" "q_proj.weight' has shape [64, 64], expected [128, 64]" \
  "$ZR" import LH -o x.bin
llama_cfg LA 'c["hidden_act"] = "gelu"'
expect_fail "import llama: another activation" 'hidden_act "gelu" is not supported' "$ZR" import LA -o x.bin

# 5. A rank killed in the middle of a save keeps the previous checkpoint and latest; resume uses it.
rm -rf S A B && cp -r S.good S
ZERORUN_FAULT_INJECT=die_after_shard:1 "$ZR" --num_gpus 2 --config c2.json ckm.bin --steps 6 --micro_batch_size 6 \
  --save_dir S --resume latest >kill.log 2>&1
rc=$?
latest=$(cat S/latest)
if [[ $rc -ne 0 && "$latest" == "global_step3" && ! -e S/global_step6/manifest.json ]] && grep -q "fault injection" kill.log; then
  ok "rank killed mid-save: rc=$rc, latest still $latest, no manifest for step 6"
else bad "kill mid-save: rc=$rc latest=$latest"; tail -3 kill.log; fi
if "$ZR" --num_gpus 2 --config c2.json ckm.bin --steps 4 --micro_batch_size 6 --save_dir S --resume latest 2>&1 | grep -q "resumed from S/global_step3 at step 3"; then
  ok "next resume uses the previous checkpoint"; else bad "resume after failed save"; fi
if [[ -n "$(my_ranks ckm.bin)" ]]; then bad "ranks left behind"; kill -9 $(my_ranks ckm.bin); else ok "no ranks left behind"; fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
