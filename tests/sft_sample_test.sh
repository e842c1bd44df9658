#!/usr/bin/env bash
# Chat fine-tuning without Python, end to end on the CPU: a byte-level tokenizer learned by `zerorun tokenizer`,
# 300 conversations ("what is A plus B?" -> "A plus B is C.") rendered with a chat template by `zerorun prepare`
# (only the assistant turns in the loss), a small GPT-2 trained on them (packed, per-document attention), and
# `zerorun sample --chat` of the checkpoint answering in the trained form and stopping at the end of its turn.
# Checks: about a third of the tokens are targets, the training loss falls below half its start, the held-out loss
# below 1, and the reply has the form "A plus B is C." and ends there (120 steps learn the form, not the sums).
set -euo pipefail
ZR=${1:?usage: sft_sample_test.sh path/to/zerorun}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 - "$W" <<'PY'
import json, random, sys
random.seed(0)
w = sys.argv[1]
with open(f"{w}/chat.jsonl", "w") as f, open(f"{w}/text.txt", "w") as t:
    for i in range(300):
        a, b = random.randint(0, 50), random.randint(0, 50)
        q, r = f"what is {a} plus {b}?", f"{a} plus {b} is {a + b}."
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": r}]}) + "\n")
        t.write(f"user: {q}\nassistant: {r}\n")
PY
cat > "$W/chat.jinja" <<'J'
{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}
{% endfor %}{% if add_generation_prompt %}<|endoftext|>assistant: {% endif %}
J
cat > "$W/ds.json" <<'J'
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0, "steps_per_print": 20,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 20}}}
J
"$ZR" tokenizer "$W/text.txt" --vocab_size 400 -o "$W/tok" > /dev/null
"$ZR" prepare "$W/chat.jsonl" --tokenizer "$W/tok" --chat_template "$W/chat.jinja" -o "$W/chat" --val_docs 20 \
  --quiet | tee "$W/prep.log"
"$ZR" init --arch gpt2 --vocab 400 --n_ctx 64 --n_embd 64 --n_layer 2 --n_head 4 -o "$W/m.bin" > /dev/null
"$ZR" --device cpu --config "$W/ds.json" "$W/m.bin" --data "$W/chat_0*.bin" --eval_data "$W/chat_val_*.bin" \
  --eval_interval 120 --steps 120 --seq_len 64 --save_dir "$W/ckpt" --log_dir "$W/log" > "$W/train.log" 2>&1 ||
  { cat "$W/train.log"; exit 1; }
reply=$("$ZR" sample "$W/ckpt" --tokenizer "$W/tok" --chat --chat_template "$W/chat.jinja" \
  --prompt "what is 3 plus 4?" --max_new_tokens 16 --quiet)
echo "reply: $reply"
python3 - "$W" "$reply" <<'PY'
import json, re, sys
w, reply = sys.argv[1], sys.argv[2]
prep = open(f"{w}/prep.log").read()
m = re.search(r"\((\d+) = ([\d.]+)% in the loss\)", prep)
share = float(m.group(2))
losses = [json.loads(l)["loss"] for l in open(f"{w}/log/metrics.jsonl")]
ev = [json.loads(l)["eval_loss"] for l in open(f"{w}/log/eval.jsonl")]
checks = [("assistant turns are 25-45% of the tokens", 25 <= share <= 45, f"{share}%"),
          ("training loss falls below half its start", losses[-1] < 0.5 * losses[0], f"{losses[0]:.3f} -> {losses[-1]:.3f}"),
          ("held-out loss below 1", ev[-1] < 1.0, f"{ev[-1]:.3f}"),
          # the answer's form, and the turn ended (EOS) instead of going on into another "user:" turn
          ("the reply has the trained form and ends its turn",
           re.match(r"^\d+ plus .*is \d+\.$", reply.strip()) is not None and "user" not in reply, repr(reply))]
ok = True
for name, good, what in checks:
    print(f"{name}: {what} -> {'PASS' if good else 'FAIL'}")
    ok &= good
sys.exit(0 if ok else 1)
PY
