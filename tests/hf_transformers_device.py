#!/usr/bin/env python3
"""The device machine's oracle for today's decoders, with transformers itself (5.x there; Debian has none): for
each model_type of tests/hf_decoder_oracle.py's cases, transformers builds the model from its config
(AutoModelForCausalLM.from_config, seeded, small sizes with every real config flag) and saves it (save_pretrained,
with a byte-level BPE tokenizer trained here); then
  1. `zerorun import` + zerorun's eval loss equals transformers' (fp32, 1e-5 relative);
  2. 20 zerorun training steps (fp32, on the GPU unless --device cpu) equal transformers training the same model
     with torch.optim.AdamW, the same batches, accumulation, clipping and schedule (1e-4 relative);
  3. `zerorun merge` of a 3-step ZeRO-3 checkpoint is loaded by AutoModelForCausalLM.from_pretrained with
     zerorun's loss of the merged model.bin (1e-5), and AutoTokenizer.from_pretrained loads the copied tokenizer.
Usage: python3 tests/hf_transformers_device.py --zerorun BIN [--device cuda|cpu] [--only NAME]"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_decoder_oracle import T, V, cases  # noqa: E402
from torch_oracle import compare, markov_shard, torch_train, window_batches  # noqa: E402


def run(zr, args, name):
    r = subprocess.run([zr] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: zerorun {' '.join(args[:2])} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def losses_of(log):
    with open(os.path.join(log, "metrics.jsonl")) as f:
        return [json.loads(x)["loss"] for x in f]


def tiny_tokenizer(transformers):
    """A byte-level BPE tokenizer trained here (no hub), as a fast tokenizer saves itself."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["zerorun trains today's models"] * 4,
                          trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>")


def main():
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if args.device == "cuda" and torch.cuda.is_available() else "cpu"
    zr = args.zerorun
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {dev}")
    ok = True
    with tempfile.TemporaryDirectory() as work:
        shard = os.path.join(work, "tok_000.bin")
        batch = window_batches(markov_shard(shard, V, 6000, 5, 3, np.random.default_rng(0)), T, dev)
        cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
               "gradient_clipping": 1.0,
               "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 2e-4, "warmup_max_lr": 2e-3,
                                                                 "warmup_num_steps": 4, "total_num_steps": 20}}}
        configs = {}
        for k, c in (("train", cfg), ("zero3", dict(cfg, zero_optimization={"stage": 3})),
                     ("eval", {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.0}}})):
            configs[k] = os.path.join(work, k + ".json")
            with open(configs[k], "w") as f:
                json.dump(c, f)

        def train(model, steps, log, name, extra=()):
            run(zr, ["--device", args.device, "--config", configs["zero3" if extra else ("eval" if steps == 0 else
                     "train")], model, "--steps", str(max(steps, 1)), "--data", shard, "--log_dir", log] + list(extra),
                name)
            return losses_of(log)

        def hf_loss(m, b):
            logits = m(input_ids=b["tokens"]).logits
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), b["targets"].reshape(-1))

        for i, (name, hc, _dtype, _sharded) in enumerate(cases()):
            if args.only and args.only not in name:
                continue
            try:
                hc = copy.deepcopy(hc)
                mt = hc.pop("model_type")
                if mt == "gemma3":
                    continue  # multimodal: the vision tower needs a real vision config; the text model is covered
                for k in ("architectures", "transformers_version", "torch_dtype", "dtype"):
                    hc.pop(k, None)
                conf = transformers.AutoConfig.for_model(mt, **hc)
                torch.manual_seed(100 + i)
                m = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager",
                                                                  dtype=torch.float32)
                d = os.path.join(work, f"hf{i}")
                m.save_pretrained(d)
                tok = tiny_tokenizer(transformers)
                tok.save_pretrained(d)
                model = os.path.join(work, f"m{i}.bin")
                run(zr, ["import", d, "-o", model], name)
                m = m.to(dev).eval()
                b = batch(0, 4)
                with torch.no_grad():
                    ref = hf_loss(m, b).item()
                ours = train(model, 0, os.path.join(work, f"eval{i}"), name)[0]
                rel = abs(ours - ref) / abs(ref)
                print(f"{name}: transformers {type(m).__name__} loss {ref:.8f}, zerorun import {ours:.8f}, rel "
                      f"{rel:.1e} -> {'PASS' if rel <= 1e-5 else 'FAIL'}")
                ok &= rel <= 1e-5
                ours = train(model, 20, os.path.join(work, f"train{i}"), name)
                m = m.train()
                ref20 = torch_train(list(m.parameters()), lambda bb: hf_loss(m, bb), cfg, 20, batch)
                ok &= compare(f"{name}: 20 steps vs transformers training", ours, ref20)
                save, out = os.path.join(work, f"ck{i}"), os.path.join(work, f"merged{i}")
                train(model, 3, os.path.join(work, f"z3_{i}"), name, ["--save_dir", save])
                run(zr, ["merge", save, out], name)
                mm = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager",
                                                                      dtype=torch.float32).to(dev).eval()
                with torch.no_grad():
                    ref = hf_loss(mm, b).item()
                ours = train(os.path.join(out, "model.bin"), 0, os.path.join(work, f"merged_eval{i}"), name)[0]
                rel = abs(ours - ref) / abs(ref)
                print(f"{name}: merge -> from_pretrained {type(mm).__name__} loss {ref:.8f}, zerorun {ours:.8f}, rel "
                      f"{rel:.1e} -> {'PASS' if rel <= 1e-5 else 'FAIL'}")
                ok &= rel <= 1e-5
                text = "zerorun trains today's models, 12345"
                t1 = transformers.AutoTokenizer.from_pretrained(d)
                t2 = transformers.AutoTokenizer.from_pretrained(out)
                good = t2(text)["input_ids"] == t1(text)["input_ids"] and len(t2) == len(t1) and type(t1) is type(t2)
                print(f"{name}: AutoTokenizer.from_pretrained(merge) {type(t2).__name__}: the ids of the imported "
                      f"directory's tokenizer -> {'PASS' if good else 'FAIL'}")
                ok &= good
            except Exception as e:  # one model's failure is reported, the others still run
                print(f"{name}: FAIL: {e}")
                ok = False
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
