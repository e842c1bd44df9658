#!/usr/bin/env bash
# On the device machine (tests/data/README or the report says how it was run): zerorun's tokenizer vs Python
# `tokenizers` (HF, Rust) on the same tokenizer.json files: identical ids on the oracle documents, and
# throughput on the same file at 1..N threads (RAYON_NUM_THREADS for HF's encode_batch).
#   device_tokenizer_bench.sh BUNDLE_DIR OUT_DIR
# BUNDLE_DIR holds zr_tok (zerorun_tokenize_tool, built static), bench.txt and one directory a model with
# tokenizer.json and docs.jsonl (tokenizer_oracle.mjs's documents).
set -uo pipefail
B=$1
OUT=$2
mkdir -p "$OUT"
python3 -c "import tokenizers; print('tokenizers', tokenizers.__version__)" || { echo "no Python tokenizers here"; exit 77; }
for m in gpt2 llama2 llama3 qwen3; do
  "$B/zr_tok" "$B/$m" "$B/$m/docs.jsonl" "$OUT/$m.ours.jsonl" 0
  python3 - "$B/$m" "$OUT/$m.ours.jsonl" <<'PY'
import json, sys
from tokenizers import Tokenizer
d, ours = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(d + "/tokenizer.json")
docs = [json.loads(l) for l in open(d + "/docs.jsonl", encoding="utf-8") if l.strip()]
zr = [json.loads(l) for l in open(ours, encoding="utf-8")]
bad = {"ids": 0, "plain": 0, "decoded": 0}
shown = 0
for doc, z in zip(docs, zr):
    ref = {"ids": tok.encode(doc).ids, "plain": tok.encode(doc, add_special_tokens=False).ids}
    ref["decoded"] = tok.decode(ref["plain"], skip_special_tokens=False) if ref["plain"] else ""
    for k in bad:
        if ref[k] != z[k]:
            bad[k] += 1
            if shown < 3:
                shown += 1
                print(f"  {d.split('/')[-1]} {k} differ on {json.dumps(doc, ensure_ascii=False)[:120]}\n    hf: {str(ref[k])[:200]}\n    zr: {str(z[k])[:200]}")
n = sum(bad.values())
print(f"{d.split('/')[-1]}: {len(docs)} documents vs Python tokenizers: {'identical' if n == 0 else 'DIFFER'} {bad}")
PY
done
nproc
for m in ${BENCH_MODELS:-gpt2 llama3 qwen3 llama2}; do
  for t in ${BENCH_THREADS:-1 2 4 8 16}; do
    echo -n "zerorun $m "; "$B/zr_tok" --bench "$B/$m" "$B/bench.txt" $t
    RAYON_NUM_THREADS=$t python3 - "$B/$m" "$B/bench.txt" $t <<'PY'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
lines = [l for l in open(sys.argv[2], encoding="utf-8")]
nbytes = sum(len(l.encode()) for l in lines)
t0 = time.time()
enc = tok.encode_batch(lines, add_special_tokens=False)
s = time.time() - t0
n = sum(len(e.ids) for e in enc)
print(f"hf-tokenizers {sys.argv[1].split('/')[-1]} threads {sys.argv[3]}: {len(lines)} docs, {nbytes/1e6:.1f} MB, {n} tokens in {s:.3f} s: {nbytes/1e6/s:.2f} MB/s")
PY
  done
done
