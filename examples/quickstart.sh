#!/usr/bin/env bash
# README command 1: install dependencies, build zerorun, then the whole path from text to text without Python on
# real text every Debian machine has (the licences in /usr/share/common-licenses): learn a byte-level BPE tokenizer,
# tokenize into shards (GPL-3 held out), train a small GPT-2 on the CPU with a DeepSpeed config while the loss on
# the held-out licence is measured, and print a sample of what it learned.
# STEPS=N (default 400) and DATA=path/to/shards_*.bin (your own token shards; the vocabulary must fit 1024) change it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
Q=runs/quickstart
rm -rf "$Q" && mkdir -p "$Q"
L=/usr/share/common-licenses
# GPL-3 first: --val_docs 1 makes it the held-out document (the links GPL, LGPL, GFDL are left out: no repeats).
TEXTS=("$L/GPL-3")
while IFS= read -r f; do TEXTS+=("$f"); done < <(find "$L" -type f ! -name GPL-3 | sort)
./build/zerorun tokenizer "${TEXTS[@]}" --vocab_size 1024 -o "$Q/tokenizer"
./build/zerorun prepare "${TEXTS[@]}" --tokenizer "$Q/tokenizer" -o "$Q/licenses" --val_docs 1 --quiet
./build/zerorun init --arch gpt2 --vocab 1024 --n_ctx 128 --n_embd 128 --n_layer 4 --n_head 4 -o "$Q/model.bin"
./build/zerorun --device cpu --config configs/quickstart_cpu.json "$Q/model.bin" --seq_len 128 \
  --data "${DATA:-$Q/licenses_0*.bin}" --eval_data "$Q/licenses_val_*.bin" --eval_interval 50 \
  --steps "${STEPS:-400}" --log_dir "$Q" --save_dir "$Q/checkpoints"
echo "--- a sample (zerorun sample $Q/checkpoints --tokenizer $Q/tokenizer):"
./build/zerorun sample "$Q/checkpoints" --tokenizer "$Q/tokenizer" --prompt "You may" --max_new_tokens 120 \
  --temperature 0.8 --top_k 40 --seed 1
