#!/usr/bin/env bash
# Real DeepSpeed configs from public repositories (tests/ds_configs/, sources in SOURCES.json) load as DeepSpeed
# 0.19.5 loads them: each one it accepts trains 3 steps of a tiny GPT-2 on 1 and on 2 CPU ranks (with the micro
# batch an HF Trainer fills into "auto": its per_device_train_batch_size default, 8); each one it rejects
# (rejected_*.json, with the message expected in EXPECT below) fails with exit 1 and a message naming the key.
set -u
ZR=$(realpath "${1:?usage: ds_configs_test.sh path/to/zerorun}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR="$HERE/ds_configs"
source "$HERE/lib.sh"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$ZR" init --arch gpt2 --vocab 64 --n_ctx 16 --n_embd 32 --n_layer 1 --n_head 2 -o gpt.bin >/dev/null ||
  { echo "FAIL - init"; exit 1; }

# What DeepSpeed 0.19.5 says about each config it rejects, and what zerorun must say.
declare -A EXPECT=(
  [rejected_dsexamples_megatron_zero3_ds_zero_stage_3_config.json]="unknown key 'zero_optimization.stage3_param_persitence_threshold' (did you mean 'zero_optimization.stage3_param_persistence_threshold'?)"
  [rejected_dsexamples_bingbertsquad_deepspeed_bsz24_config.json]="'optimizer.params.max_grad_norm' is not an optimizer parameter"
  [rejected_megatron_deepspeed_ds_zero2_config_bf16.json]="'communication_data_type' \"bfp16\" is not a data type DeepSpeed supports"
)

n_ok=0
for cfg in "$DIR"/*.json; do
  name=$(basename "$cfg")
  [[ $name == SOURCES.json ]] && continue
  jq -e --arg n "$name" 'has($n)' "$DIR/SOURCES.json" >/dev/null || bad "$name: no entry in SOURCES.json"
  if [[ $name == rejected_* ]]; then
    want=${EXPECT[$name]:-}
    [[ -n $want ]] || { bad "$name: no expected message"; continue; }
    out=$(timeout 60 "$ZR" --config "$cfg" gpt.bin --steps 3 2>&1)
    rc=$?
    if [[ $rc -eq 1 ]] && grep -qF -- "$want" <<<"$out" && grep -qF -- "$cfg" <<<"$out"; then ok "$name rejected"; else
      bad "$name (rc=$rc, wanted '$want'):"
      echo "$out" | tail -3
    fi
    continue
  fi
  # The HF Trainer fills "auto" (or an absent micro batch with no train_batch_size) with its micro batch.
  mb=()
  if jq -e '(.train_micro_batch_size_per_gpu == "auto") or
            ((has("train_micro_batch_size_per_gpu") | not) and ((.train_batch_size // "auto") == "auto"))' \
    <(sed 's|^\xef\xbb\xbf||' "$cfg") >/dev/null 2>&1; then mb=(--micro_batch_size 8); fi
  for np in 1 2; do
    out=$(timeout 120 "$ZR" --num_gpus $np --device cpu --config "$cfg" gpt.bin --steps 3 --seq_len 8 "${mb[@]}" \
      --log_dir "log_${name}_$np" 2>&1)
    rc=$?
    steps=$(wc -l <"log_${name}_$np/metrics.jsonl" 2>/dev/null || echo 0)
    if [[ $rc -eq 0 && $steps -eq 3 ]] && ! grep -q "error" <<<"$out"; then
      ok "$name: 3 steps on $np rank(s)"
      n_ok=$((n_ok + 1))
    else
      bad "$name on $np rank(s) (rc=$rc, $steps steps):"
      echo "$out" | grep -v "^\[.*info" | tail -5
    fi
  done
done
# The "auto" values are noted with what was chosen; unknown top-level keys are warnings naming them.
# (without --micro_batch_size: the HF Trainer's default micro batch, 8, noted as such)
out=$("$ZR" --config "$DIR/llamafactory_ds_z3_config.json" gpt.bin --steps 1 --seq_len 8 2>&1)
for want in "'gradient_clipping' \"auto\" -> 1.0" \
  "'train_micro_batch_size_per_gpu' \"auto\" -> 8 (the HF Trainer's default per_device_train_batch_size" \
  "unknown top-level key 'comms_config' ignored" "unknown top-level key 'monitor_config' ignored" \
  "'zero_optimization.reduce_bucket_size' \"auto\" -> 1024"; do
  if grep -qF -- "$want" <<<"$out"; then ok "logged: $want"; else bad "not logged: $want"; fi
done
out=$("$ZR" --config "$DIR/axolotl_zero3_bf16.json" gpt.bin --steps 1 --seq_len 8 --micro_batch_size 8 2>&1)
if grep -qF "'zero_optimization.max_live_parameters' read as 'zero_optimization.stage3_max_live_parameters'" <<<"$out"; then
  ok "alias logged"
else bad "alias not logged"; fi
# The engine runs each step at DeepSpeed 0.19.5's lr: step 1 at the constructor's value (0 for WarmupCosineLR, whatever
# warmup_min_ratio), step k at iteration k-2 of the schedule, at the floor after total_num_steps.
echo '{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 6, "warmup_num_steps": 4,
  "warmup_min_ratio": 0.5, "cos_min_ratio": 0.1, "warmup_type": "linear"}}}' >cos.json
got=$("$ZR" --config cos.json gpt.bin --steps 8 --seq_len 8 2>&1 | sed -n 's/.*| lr \([0-9.e+-]*\) .*/\1/p' | tr '\n' ' ')
want="0.000e+00 5.000e-03 6.250e-03 7.500e-03 8.750e-03 5.500e-03 1.000e-03 1.000e-03 "
[[ "$got" == "$want" ]] && ok "WarmupCosineLR per-step lr in a run = DeepSpeed 0.19.5's" || bad "cosine lr: got '$got', want '$want'"
n_cfg=$(jq 'length' "$DIR/SOURCES.json")
[[ $n_cfg -ge 20 ]] && ok "$n_cfg real configs" || bad "only $n_cfg configs"
echo "passed $pass, failed $fail ($n_ok accepted runs)"
[[ $fail -eq 0 ]]
