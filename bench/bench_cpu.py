#!/usr/bin/env python3
"""CPU benchmark: the same model.bin and config trained by zerorun and by
PyTorch (Debian's python3-torch, float32, torch.optim.AdamW, the graph
interpreted by tests/torch_oracle.py) in one call; prints tokens/s of both and
the ratio. Usage: bench/bench_cpu.py --zerorun build/zerorun [--steps 30]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch_oracle as orc  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as w:
        for name, init, B, T in [
            ("gpt2 L4 C128 T64", ["--vocab", "512", "--n_ctx", "64", "--n_embd", "128", "--n_layer", "4", "--n_head", "4"], 16, 64),
            ("gpt2 L6 C256 T128", ["--vocab", "2048", "--n_ctx", "128", "--n_embd", "256", "--n_layer", "6", "--n_head", "8"], 8, 128),
            ("llama L6 C256 T128 GQA 8/2", ["--arch", "llama", "--vocab", "2048", "--n_ctx", "128", "--n_embd", "256",
                                            "--n_layer", "6", "--n_head", "8", "--n_kv_head", "2", "--ffn", "688"], 8, 128),
        ]:
            m = os.path.join(w, "m.bin")
            arch = [] if "--arch" in init else ["--arch", "gpt2"]
            subprocess.run([a.zerorun, "init", *arch, *init, "-o", m], check=True, capture_output=True)
            cfg = {"train_batch_size": B, "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "gradient_clipping": 1.0, "steps_per_print": 1000}
            c = os.path.join(w, "c.json")
            json.dump(cfg, open(c, "w"))
            log = os.path.join(w, "log")
            subprocess.run([a.zerorun, "--config", c, m, "--steps", str(a.steps), "--log_dir", log], check=True,
                           capture_output=True, env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
            secs = [json.loads(l)["seconds"] for l in open(os.path.join(log, "metrics.jsonl"))][3:]
            zr = B * T / (sum(secs) / len(secs))
            params, meta = orc.read_safetensors(m)
            graph = json.loads(meta["graph"])
            params = {k: v.float().requires_grad_(True) for k, v in params.items()}
            opt = torch.optim.AdamW(list(params.values()), lr=1e-3)
            V = params["wte.weight" if "wte.weight" in params else "embed_tokens.weight"].shape[0]
            rng = np.random.default_rng(0)
            times = []
            for i in range(a.steps):
                x = torch.tensor(rng.integers(0, V, (B, T)))
                y = torch.tensor(rng.integers(0, V, (B, T)))
                t0 = time.perf_counter()
                loss = orc.forward(graph, params, {"tokens": x, "targets": y})
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
                opt.step()
                times.append(time.perf_counter() - t0)
            pt = B * T / (sum(times[3:]) / len(times[3:]))
            rows.append((name, zr, pt))
    print(f"{'model':>28} {'zerorun tok/s':>14} {'pytorch tok/s':>14} {'ratio':>7}   ({a.threads} threads, torch {torch.__version__})")
    for n, zr, pt in rows:
        print(f"{n:>28} {zr:>14.0f} {pt:>14.0f} {zr / pt:>6.2f}x")


if __name__ == "__main__":
    main()
