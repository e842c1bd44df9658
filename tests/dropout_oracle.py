#!/usr/bin/env python3
"""Dropout against torch (float64), with transformers' definitions of where each model drops out: GPT-2
(embd_pdrop after the embeddings, attn_pdrop on the attention probabilities, resid_pdrop on the attention and MLP
outputs), Phi-3 (attention_dropout, resid_pdrop before each residual add; embd_pdrop is never read) and Qwen3
(attention_dropout), each imported from a transformers-layout checkpoint with every probability 0.1.

torch's own dropout draws from its generator, so the reference applies zerorun's masks: the counter-based bits of
kernels/counter_rng.h (splitmix64 keyed by seed, optimizer step and the dropout's site; counters from the global
index of a micro-batch's first sample), written out again here from that definition. With the masks equal:
  - 12 training steps with accumulation and clipping agree within 1e-4 relative, on 1 rank and on 2 ranks ZeRO-2
    (the masks follow the samples, not the ranks);
  - the reference without dropout differs (the dropout is there);
  - `zerorun eval` drops nothing: its loss is the dropout-free reference's;
  - `import --no_dropout` trains like the dropout-free reference.
Exit 77 (skipped) without torch."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from hf_decoder_oracle import T, V, base, hf_forward_logits, write_checkpoint, write_safetensors
    from torch_oracle import compare, hf_gpt2_loss, markov_shard, run_zerorun, window_batches
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SEED = 7


def mix64_int(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def mix64(z):  # numpy uint64 arrays (multiplication wraps modulo 2^64, as in C++)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_key(seed, step, site):
    return mix64_int((mix64_int(seed ^ mix64_int(site + 1)) + step * GOLDEN) & M64)


def apply_mask(x, p, seed, step, site, sample0):
    """x [samples, ...] dropped out as zerorun does: element i keeps iff its 24 bits >= round(p 2^24)."""
    n = x.numel()
    per_sample = n // x.shape[0]
    counters = np.arange(n, dtype=np.uint64) + np.uint64(sample0 * per_sample)
    key = np.uint64(dropout_key(seed, step, site))
    with np.errstate(over="ignore"):
        bits = mix64(key + (counters + np.uint64(1)) * np.uint64(GOLDEN)) >> np.uint64(40)
    keep = bits >= np.uint64(int(np.float32(p) * 16777216.0 + 0.5))
    m = torch.tensor(keep.reshape(tuple(x.shape)), dtype=x.dtype)
    return x * m / (1.0 - float(np.float32(p)))


class Masks:
    """The reference's drop(kind, layer, x) for one micro-batch: site numbering as zerorun's builders number the
    graph's dropouts (in node order)."""

    def __init__(self, sites, p):
        self.sites, self.p, self.step, self.sample0 = sites, p, 0, 0

    def __call__(self, kind, layer, x):
        site = self.sites(kind, layer)
        return x if site is None else apply_mask(x, self.p, SEED, self.step, site, self.sample0)


def gpt2_sites(kind, layer):
    return 0 if kind == "embd" else 1 + 3 * layer + ["attn", "resid_attn", "resid_mlp"].index(kind)


def phi3_sites(kind, layer):
    return 3 * layer + ["attn", "resid_attn", "resid_mlp"].index(kind)


def qwen3_sites(kind, layer):
    return layer if kind == "attn" else None


def gpt2_checkpoint(d, p):
    os.makedirs(d, exist_ok=True)
    C, L, H = 48, 2, 4
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_positions": T,
           "n_ctx": T, "n_embd": C, "n_layer": L, "n_head": H, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "attn_pdrop": p, "resid_pdrop": p, "embd_pdrop": p,
           "tie_word_embeddings": True}
    g = torch.Generator().manual_seed(11)

    def r(*s, std=0.08):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * std).to(torch.float32).to(torch.float64)

    w = {"transformer.wte.weight": r(V, C), "transformer.wpe.weight": r(T, C),
         "transformer.ln_f.weight": 1 + r(C), "transformer.ln_f.bias": r(C)}
    for i in range(L):
        q = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[q + ln + ".weight"], w[q + ln + ".bias"] = 1 + r(C), r(C)
        for n, (a, b) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                          "mlp.c_proj": (4 * C, C)}.items():
            w[q + n + ".weight"], w[q + n + ".bias"] = r(a, b), r(b)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    return cfg, w


def reference(loss_of, w, cfg, steps, batch, masks):
    """torch.optim.AdamW over `steps` steps of the config's micro-batches, each forward with that micro-batch's
    masks (step k + 1; the global index of its first sample)."""
    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    o = cfg["optimizer"]["params"]
    opt = torch.optim.AdamW(list(params.values()), lr=o["lr"], betas=tuple(o["betas"]), weight_decay=o["weight_decay"])
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    losses = []
    for k in range(steps):
        opt.zero_grad()
        total = 0.0
        for a in range(gas):
            first = k * micro * gas + a * micro
            if masks:
                masks.step, masks.sample0 = k + 1, first
            b = batch(first, micro)
            loss = loss_of(params, b, masks)
            (loss / gas).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["gradient_clipping"])
        opt.step()
        losses.append(total / gas)
    return losses


def eval_loss(zr, model, cfg, work, shard):
    cpath = os.path.join(work, "eval.json")
    with open(cpath, "w") as f:
        json.dump(cfg, f)
    r = subprocess.run([zr, "eval", "--config", cpath, model, "--data", shard, "--eval_batches", "2",
                        "--seed", str(SEED)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"zerorun eval failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    m = re.search(r"eval_loss ([0-9.eE+-]+)", r.stdout + r.stderr)
    if m:
        return float(m.group(1))
    raise SystemExit(f"zerorun eval printed no loss:\n{r.stdout}\n{r.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    zr = args.zerorun
    p, steps = 0.1, 12
    cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
           "gradient_clipping": 1.0}
    cfg2 = dict(cfg, zero_optimization={"stage": 2}, train_micro_batch_size_per_gpu=1)
    ok = True
    with tempfile.TemporaryDirectory() as work:
        shard = os.path.join(work, "tok_000.bin")
        batch = window_batches(markov_shard(shard, V, 6000, 5, 3, np.random.default_rng(0)), T)

        def decoder(hc):
            def loss_of(params, b, masks):
                lg = hf_forward_logits(hc, params, b["tokens"], drop=masks)
                return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), b["targets"].reshape(-1))
            return loss_of

        models = []
        d = os.path.join(work, "gpt2")
        gcfg, gw = gpt2_checkpoint(d, p)
        models.append(("gpt2 (embd, attn, resid 0.1)", d, gw, gpt2_sites,
                       lambda params, b, masks, c=gcfg: hf_gpt2_loss(c, params, b["tokens"], b["targets"], masks)))
        for name, mt, sites, kw in [
                ("phi3 (attention_dropout, resid_pdrop 0.1)", "phi3", phi3_sites,
                 dict(architectures=["Phi3ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0,
                      num_key_value_heads=4, sliding_window=None, resid_pdrop=p, embd_pdrop=p,
                      attention_dropout=p, original_max_position_embeddings=T, tie_word_embeddings=False)),
                ("qwen3 (attention_dropout 0.1)", "qwen3", qwen3_sites,
                 dict(architectures=["Qwen3ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6, head_dim=16,
                      rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False, attention_dropout=p))]:
            hc = base(mt, **kw)
            d = os.path.join(work, mt)
            w = write_checkpoint(d, hc, "F32", False, 21)
            models.append((name, d, w, sites, decoder(hc)))

        for name, d, w, sites, loss_of in models:
            model = os.path.join(work, "m.bin")
            r = subprocess.run([zr, "import", d, "-o", model], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: FAIL: zerorun import:\n{r.stdout}{r.stderr}")
                ok = False
                continue
            ref = reference(loss_of, w, cfg, steps, batch, Masks(sites, p))
            plain = reference(loss_of, w, cfg, steps, batch, None)
            seed = ["--seed", str(SEED)]
            ok &= compare(f"{name}, 1 rank", run_zerorun(zr, model, cfg, steps, work, ["--data", shard] + seed), ref)
            ok &= compare(f"{name}, 2 ranks ZeRO-2",
                          run_zerorun(zr, model, cfg2, steps, work,
                                      ["--data", shard, "--num_gpus", "2", "--device", "cpu"] + seed), ref)
            diff = max(abs(a - b) / abs(b) for a, b in zip(ref, plain))
            print(f"{name}: the reference with dropout differs from the one without by up to {diff:.2e} "
                  f"-> {'PASS' if diff > 1e-3 else 'FAIL'}")
            ok &= diff > 1e-3
            # Evaluation drops nothing: the untrained model's loss over the first 2 global batches.
            with torch.no_grad():
                want = sum(float(loss_of({k: v for k, v in w.items()}, batch(i * 4 + a * 2, 2), None))
                           for i in range(2) for a in range(2)) / 4
            got = eval_loss(zr, model, cfg, work, shard)
            good = abs(got - want) <= 1e-5 * abs(want)
            print(f"{name}: zerorun eval {got:.7f}, reference without dropout {want:.7f} -> "
                  f"{'PASS' if good else 'FAIL'}")
            ok &= good
            r = subprocess.run([zr, "import", d, "-o", model, "--no_dropout"], capture_output=True, text=True)
            ok &= r.returncode == 0 and compare(f"{name}, import --no_dropout",
                                                run_zerorun(zr, model, cfg, steps, work, ["--data", shard] + seed),
                                                plain)
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
