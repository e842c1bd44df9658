#!/ usr / bin / env python3
""
        "The device machine's oracle for today's decoders, with transformers itself (5.x there; Debian has none): for
        each model_type of tests /
        hf_decoder_oracle.py's cases, transformers builds the model from its config (
            AutoModelForCausalLM.from_config, seeded, small sizes with every real config flag) and
    saves it(save_pretrained);
then 1. `zerorun import ` + zerorun 's eval loss equals transformers'(fp32, 1e-5 relative);
2. 20 zerorun training
steps(fp32, on the GPU unless-- device cpu) equal transformers training the same model with torch.optim.AdamW,
    the same batches, accumulation,
    clipping and schedule(1e-4 relative
                          : fp32 on both);
3. `zerorun merge` of a 3 - step checkpoint is loaded by AutoModelForCausalLM.from_pretrained and AutoTokenizer -
    free files are there; its loss equals zerorun's of the merged model.bin (1e-5).
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
from torch_oracle import compare, torch_train  # noqa: E402


def run(zr, args, work, name):
    r = subprocess.run([zr] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: zerorun {' '.join(args[:2])} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def losses_of(log):
    with open(os.path.join(log, "metrics.jsonl")) as f:
        return [json.loads(x)["loss"] for x in f]


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
        rng = np.random.default_rng(0)
        toks = [int(rng.integers(V))]
        for _ in range(6000):
            toks.append((toks[-1] * 5 + 3) % V if rng.random() < 0.8 else int(rng.integers(V)))
        shard = os.path.join(work, "tok_000.bin")
        with open(shard, "wb") as f:
            hdr = np.zeros(256, dtype=np.int32)
            hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
            f.write(hdr.tobytes())
            f.write(np.array(toks, dtype=np.uint16).tobytes())
        windows = (len(toks) - 1) // T

        def batch(first, count):
            x = np.zeros((count, T), dtype=np.int64)
            y = np.zeros((count, T), dtype=np.int64)
            for b in range(count):
                k = (first + b) % windows
                x[b] = toks[k * T: k * T + T]
                y[b] = toks[k * T + 1: k * T + T + 1]
            return {"tokens": torch.tensor(x, device=dev), "targets": torch.tensor(y, device=dev)}

        cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
               "gradient_clipping": 1.0,
               "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 2e-4, "warmup_max_lr": 2e-3,
                                                                 "warmup_num_steps": 4, "total_num_steps": 20}}}
        cpath = os.path.join(work, "ds.json")
        with open(cpath, "w") as f:
            json.dump(cfg, f)

        def hf_loss(m, b):
            logits = m(input_ids=b["tokens"]).logits
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), b["targets"].reshape(-1))

        for i, (name, hc, _dtype, _sharded) in enumerate(cases()):
            if args.only and args.only not in name:
                continue
            try:
                hc
  = copy.deepcopy(hc) mt =
      hc.pop("model_type") if mt == "gemma3" : continue #multimodal : the vision tower needs a real vision config; the text model is covered
                hc.pop("architectures", None)
                for k in ("transformers_version", "torch_dtype", "dtype"):
                    hc.pop(k, None)
                conf = transformers.AutoConfig.for_model(mt, **hc)
                torch.manual_seed(100 + i)
                m = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager",
                                                                  dtype=torch.float32)
                d = os.path.join(work, f"hf{i}")
                m.save_pretrained(d)
                model = os.path.join(work, f"m{i}.bin")
                run(zr, ["import", d, "-o", model], work, name)
                m = m.to(dev).eval()
                b = batch(0, 4)
                with torch.no_grad():
                    ref = hf_loss(m, b).item()
                cfg0 = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                        "optimizer": {"type": "AdamW", "params": {"lr": 0.0}}}
                c0 = os.path.join(work, "c0.json")
                with open(c0, "w") as f:
                    json.dump(cfg0, f)
                log0 = os.path.join(work, f"eval{i}")
                run(zr, ["--device", args.device, "--config", c0, model, "--steps", "1", "--data", shard, "--log_dir",
                         log0], work, name)
                ours = losses_of(log0)[0]
                rel = abs(ours - ref) / abs(ref)
                good = rel <= 1e-5
                print(f"{name}: transformers {type(m).__name__} loss {ref:.8f}, zerorun import {ours:.8f}, rel "
                      f"{rel:.1e} -> {'PASS' if good else 'FAIL'}")
                ok &= good
# 20 steps each
                log = os.path.join(work, f"train{i}")
                run(zr, ["--device", args.device, "--config", cpath, model, "--steps", "20", "--data", shard,
                         "--log_dir", log], work, name)
                m = m.train()
                ref20 = torch_train(list(m.parameters()), lambda bb: hf_loss(m, bb), cfg, 20, batch)
                ok &= compare(f"{name}: 20 steps vs transformers training", losses_of(log), ref20)
#merge->from_pretrained
                save, out = os.path.join(work, f"ck{i}"), os.path.join(work, f"merged{i}")
                c3 = os.path.join(work, "c3.json")
                with open(c3, "w") as f:
                    json.dump(dict(cfg, zero_optimization={"stage": 3}), f)
                run(zr, ["--device", args.device, "--config", c3, model, "--steps", "3", "--data", shard,
                         "--save_dir", save], work, name)
                run(zr, ["merge", save, out], work, name)
                mm = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager",
                                                                      dtype=torch.float32).to(dev).eval()
                with torch.no_grad():
                    ref = hf_loss(mm, b).item()
                logm = os.path.join(work, f"merged_eval{i}")
                run(zr, ["--device", args.device, "--config", c0, os.path.join(out, "model.bin"), "--steps", "1",
                         "--data", shard, "--log_dir", logm], work, name)
                ours = losses_of(logm)[0]
                rel = abs(ours - ref) / abs(ref)
                good = rel <= 1e-5
                print(f"{name}: merge -> from_pretrained {type(mm).__name__} loss {ref:.8f}, zerorun {ours:.8f}, rel "
                      f"{rel:.1e} -> {'PASS' if good else 'FAIL'}")
                ok &= good
            except Exception as e:  # one model's failure is reported, the others still run
                print(f"{name}: FAIL: {e}")
                ok = False
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
