#!/usr/bin/env bash
# zerorun's Jinja subset vs @huggingface/jinja: the chat templates of Llama 3 (npm), Llama 3.1, Qwen2.5 (npm),
# Qwen3 (npm), Gemma 3 (npm), Mistral v0.1/v0.3, Phi-3 and SmolLM2 (chat_templates/) rendered with each context
# of chat_cases.json (system prompts, multi-turn, generation prompt, tools and tool calls, reasoning, roles that
# do not alternate): identical text, and an error wherever the oracle raises.
#   jinja_oracle.sh ZERORUN_TOKENIZE_TOOL
set -euo pipefail
TOOL=$1
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/npm_oracle_env.sh"
cp "$HERE/jinja_oracle.mjs" "$HERE/jinja_compare.mjs" "$NPM_DIR/scripts/"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
L="$NPM_DIR/node_modules/@lenml"
T="$HERE/chat_templates"
specs=(llama3="$L/tokenizer-llama3/models/tokenizer_config.json" qwen2_5="$L/tokenizer-qwen2_5/models/tokenizer_config.json"
  qwen3="$L/tokenizer-qwen3/models/tokenizer_config.json" gemma3="$L/tokenizer-gemma3/models/tokenizer_config.json"
  mistral_v0.1="$T/mistral_v0.1.jinja" mistral_v0.3="$T/mistral_v0.3.jinja" phi3="$T/phi3.jinja"
  smollm2="$T/smollm2.jinja" llama3.1="$T/llama3.1.jinja")
node "$NPM_DIR/scripts/jinja_oracle.mjs" "$HERE/chat_cases.json" "$WORK/oracle.jsonl" "${specs[@]}"
"$TOOL" --chat "$HERE/chat_cases.json" "$WORK/ours.jsonl" "${specs[@]}"
node "$NPM_DIR/scripts/jinja_compare.mjs" "$WORK/oracle.jsonl" "$WORK/ours.jsonl"
