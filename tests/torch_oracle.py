#!/usr/bin/env python3
"""Independent oracle: trains the same model.bin on the same data with
PyTorch (float64) and checks zerorun's per-step losses agree within 1e-4
relative. Reads model.bin with a small safetensors reader and interprets the
graph JSON with torch ops; AdamW, clipping and the LR schedule are torch's
own (torch.optim.AdamW, clip_grad_norm_) or re-derived from DeepSpeed's
formulas here. Exit 77 (skipped) when torch is not installed."""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hash_uniform(seed, counter):
    return (splitmix64(((seed * 0x100000001B3) & M64) ^ counter) >> 40) / 16777216.0


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hl,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + hl])
    meta = header.pop("__metadata__", {})
    data = blob[8 + hl :]
    dt = {"F32": np.float32, "I32": np.int32, "F16": np.float16, "BF16": np.uint16}
    tensors = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        arr = np.frombuffer(data[b:en], dtype=dt[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":  # the high half of an f32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.tensor(arr.astype(np.float64))
    return tensors, meta


def markov_shard(path, V, n, mul, add, rng):
    """An llm.c token shard of a noisy Markov chain over V ids (learnable structure); returns the tokens."""
    toks = [int(rng.integers(V))]
    for _ in range(n):
        toks.append((toks[-1] * mul + add) % V if rng.random() < 0.8 else int(rng.integers(V)))
    with open(path, "wb") as f:
        hdr = np.zeros(256, dtype=np.int32)
        hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
        f.write(hdr.tobytes())
        f.write(np.array(toks, dtype=np.uint16).tobytes())
    return toks


def window_batches(toks, T, device="cpu"):
    """batch(first, count): samples first .. first + count - 1 of zerorun's order over the shard (sample i: tokens
    i T .. i T + T, targets shifted by one)."""
    windows = (len(toks) - 1) // T

    def batch(first, count):
        x = np.zeros((count, T), dtype=np.int64)
        y = np.zeros((count, T), dtype=np.int64)
        for b in range(count):
            w = (first + b) % windows
            x[b] = toks[w * T: w * T + T]
            y[b] = toks[w * T + 1: w * T + T + 1]
        return {"tokens": torch.tensor(x, device=device), "targets": torch.tensor(y, device=device)}

    return batch


def rotary(q, k, theta):
    """q, k [B, heads, T, D] rotated as transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb do it:
    inv_freq = 1 / theta^(2i/D), emb = cat(freqs, freqs), x cos + rotate_half(x) sin."""
    T, D = q.shape[2], q.shape[3]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv)] * 2, dim=-1)
    cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)

    def rotate_half(t):
        return torch.cat((-t[..., D // 2:], t[..., :D // 2]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def forward(graph, params, inputs):
    vals = dict(inputs)
    for n in graph["nodes"]:
        op, a = n["op"], n.get("attrs", {})
        x = [vals.get(i) for i in n["in"]]  # an optional graph input left out ("positions") is None
        p = {r: params[t] for r, t in n.get("params", {}).items()}
        if op == "linear":
            y = F.linear(x[0], p["weight"], p.get("bias"))
        elif op == "embedding":
            if a.get("position"):
                T = x[0].shape[1]
                y = p["weight"][:T].unsqueeze(0).expand(x[0].shape[0], T, -1)
            else:
                y = p["weight"][x[0]]
        elif op == "add":
            y = x[0] + x[1]
        elif op == "mul":
            y = x[0] * x[1]
        elif op == "matmul":
            y = x[0] @ x[1]
        elif op == "gelu":
            y = F.gelu(x[0], approximate="tanh")
        elif op == "relu":
            y = F.relu(x[0])
        elif op == "silu":
            y = F.silu(x[0])
        elif op == "swiglu":  # transformers' LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
            y = F.silu(x[0]) * x[1]
        elif op == "layernorm":
            C = x[0].shape[-1]
            y = F.layer_norm(x[0], (C,), p["weight"], p.get("bias"), a.get("eps", 1e-5))
        elif op == "rmsnorm":
            y = x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + a.get("eps", 1e-6)) * p["weight"]
        elif op == "rope":  # transformers' apply_rotary_pos_emb (rotate_half) + repeat_kv, from their definition
            B, T, W = x[0].shape
            H = a["n_head"]
            K = a.get("n_kv_head", H)
            D = W // (H + 2 * K)
            q, k, v = x[0].split([H * D, K * D, K * D], dim=2)
            q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
            q, k = rotary(q, k, a.get("theta", 10000.0))
            k, v = (t.repeat_interleave(H // K, dim=1) for t in (k, v))
            y = torch.cat([t.transpose(1, 2).reshape(B, T, H * D) for t in (q, k, v)], dim=2)
        elif op == "attention":
            B, T, C3 = x[0].shape
            C, H = C3 // 3, a["n_head"]
            q, k, v = x[0].split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
        elif op == "cross_entropy":
            y = F.cross_entropy(x[0].reshape(-1, x[0].shape[-1]), x[1].reshape(-1).long())
        elif op == "mse":
            y = F.mse_loss(x[0], x[1])
        else:
            raise SystemExit(f"oracle: op {op} not interpreted")
        vals[n["out"][0]] = y
    return vals[graph["loss"]]


def hf_gpt2_loss(config, sd, tokens, targets, drop=None):
    """GPT2LMHeadModel's forward as transformers' modeling_gpt2 defines it (eval mode), written here from that
    definition rather than from zerorun's graph: Conv1D layers compute x @ W + b with W stored [in, out], GELU is
    gelu_new, the head is tied to wte unless lm_head.weight is given. Reads sizes from config.json only.
    drop(kind, layer, x): training mode's dropouts (kind "embd", "attn", "resid_attn", "resid_mlp"), where given."""
    if drop is None:
        def drop(kind, layer, x):
            return x
    C, H, L = config["n_embd"], config["n_head"], config["n_layer"]
    eps = config["layer_norm_epsilon"]
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    w = {k: v for k, v in sd.items()}
    B, T = tokens.shape

    def conv1d(x, name):
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def ln(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], eps)

    h = drop("embd", -1, w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][torch.arange(T)])
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        p = f"transformer.h.{i}"
        q, k, v = conv1d(ln(h, p + ".ln_1"), p + ".attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        att = drop("attn", i, att.masked_fill(~mask, float("-inf")).softmax(-1))
        a = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + drop("resid_attn", i, conv1d(a, p + ".attn.c_proj"))
        m = conv1d(ln(h, p + ".ln_2"), p + ".mlp.c_fc")
        m = 0.5 * m * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (m + 0.044715 * m.pow(3))))
        h = h + drop("resid_mlp", i, conv1d(m, p + ".mlp.c_proj"))
    h = F.layer_norm(h, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    head = w.get("lm_head.weight", w["transformer.wte.weight"])
    return F.cross_entropy((h @ head.t()).view(B * T, -1), targets.reshape(-1))


def hf_llama_loss(config, w, tokens, targets):
    """LlamaForCausalLM's forward as transformers' modeling_llama defines it (eval mode), from config.json and the
    merged model.safetensors only: separate q/k/v_proj, rotary q and k, key/value heads repeated
    num_attention_heads / num_key_value_heads times, LlamaRMSNorm, SwiGLU MLP, untied or tied lm_head."""
    assert config["model_type"] == "llama" and config["hidden_act"] == "silu"
    C, H, L = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    K = config.get("num_key_value_heads", H)
    D, eps = C // H, config["rms_norm_eps"]
    B, T = tokens.shape

    def norm(x, name):
        return w[name + ".weight"] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def lin(x, name):
        return x @ w[name + ".weight"].t()

    h = w["model.embed_tokens.weight"][tokens]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        p = f"model.layers.{i}"
        x = norm(h, p + ".input_layernorm")
        q = lin(x, p + ".self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = lin(x, p + ".self_attn.k_proj").view(B, T, K, D).transpose(1, 2)
        v = lin(x, p + ".self_attn.v_proj").view(B, T, K, D).transpose(1, 2)
        q, k = rotary(q, k, config.get("rope_theta", 10000.0))
        k, v = (t.repeat_interleave(H // K, dim=1) for t in (k, v))
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(D)).masked_fill(~mask, float("-inf")).softmax(-1)
        h = h + lin((att @ v).transpose(1, 2).reshape(B, T, C), p + ".self_attn.o_proj")
        x = norm(h, p + ".post_attention_layernorm")
        h = h + lin(F.silu(lin(x, p + ".mlp.gate_proj")) * lin(x, p + ".mlp.up_proj"), p + ".mlp.down_proj")
    h = norm(h, "model.norm")
    head = w["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else w["lm_head.weight"]
    return F.cross_entropy((h @ head.t()).view(B * T, -1), targets.reshape(-1))


def lr_at(sched, base_lr, it):
    """DeepSpeed WarmupLR / WarmupDecayLR, evaluated at last_batch_iteration=it."""
    if not sched:
        return base_lr
    p = sched["params"]
    mn, mx = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 0.001)
    nw = max(2, p.get("warmup_num_steps", 1000))
    if it < 0:
        g = 0.0
    elif it < nw:
        g = it / nw if p.get("warmup_type", "log") == "linear" else math.log(it + 1) / math.log(nw)
    else:
        g = 1.0
    if sched["type"] == "WarmupDecayLR" and it >= nw:
        total = p["total_num_steps"]
        g = max(0.0, (total - it) / max(1.0, total - nw))
    return mn + (mx - mn) * g


def torch_train(params, loss_of, cfg, steps, make_batch):
    """Per-step losses of `steps` steps of torch.optim.AdamW on `params` with the config's micro batch,
    accumulation, clipping and schedule; loss_of(batch) is the model's loss."""
    o = cfg["optimizer"]["params"]
    opt = torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8),
                            weight_decay=o.get("weight_decay", 0.0))
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    losses = []
    for k in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg.get("scheduler"), o["lr"], k - 1)
        opt.zero_grad()
        total = 0.0
        for a in range(gas):
            loss = loss_of(make_batch(k * micro * gas + a * micro, micro))
            (loss / gas).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, cfg["gradient_clipping"])
        opt.step()
        losses.append(total / gas)
    return losses


def torch_losses(model_path, cfg, steps, make_batch):
    params, meta = read_safetensors(model_path)
    graph = json.loads(meta["graph"])
    for t in params.values():
        t.requires_grad_(True)
    return torch_train(list(params.values()), lambda b: forward(graph, params, b), cfg, steps, make_batch)


def run_zerorun(zr, model, cfg, steps, work, extra):
    cpath = os.path.join(work, "ds.json")
    with open(cpath, "w") as f:
        json.dump(cfg, f)
    log = os.path.join(work, "log")
    cmd = [zr, "--config", cpath, model, "--steps", str(steps), "--log_dir", log] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"zerorun failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    with open(os.path.join(log, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def compare(name, ours, ref, rtol=1e-4):
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
    for i, (a, b) in enumerate(zip(ours, ref)):
        print(f"  {name} step {i + 1:2d}: zerorun {a:.8f} torch {b:.8f} rel {abs(a - b) / abs(b):.2e}")
    ok = len(ours) == len(ref) and worst <= rtol and ref[-1] < ref[0]
    print(f"{name}: {len(ours)} steps, worst relative difference {worst:.2e} (limit {rtol:g}) -> "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def transformers_checks(zr, work, arch, merged, merged_loss, cfg, shard, make_batch, V, T):
    """With transformers installed (the device machine's PyTorch has it; Debian has not): (1) the class's
    from_pretrained on zerorun merge's output gives zerorun's loss; (2) a model of that class made and saved by
    transformers, read by `zerorun import`, trains like transformers' model under torch.optim.AdamW (float64,
    the same batches, clipping and schedule). arch: gpt2 (GPT2LMHeadModel) or llama (LlamaForCausalLM, 4 query
    heads sharing 2 key/value heads)."""
    try:
        import transformers
    except ImportError:
        print("transformers: not installed, from_pretrained checks skipped")
        return True
    ok = True
    batch = make_batch(0, 4)
    cls = transformers.GPT2LMHeadModel if arch == "gpt2" else transformers.LlamaForCausalLM

    def hf_loss(model, b):
        logits = model(input_ids=b["tokens"].long()).logits  # labels= would shift; targets are already shifted
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["targets"].long().reshape(-1))

    m = cls.from_pretrained(merged, attn_implementation="eager").double().eval()
    with torch.no_grad():
        ref = hf_loss(m, batch).item()
    rel = abs(merged_loss - ref) / abs(ref)
    print(f"transformers {transformers.__version__}: {cls.__name__}.from_pretrained(merge) loss {ref:.8f}, "
          f"zerorun {merged_loss:.8f}, rel {rel:.2e} -> {'PASS' if rel <= 1e-5 else 'FAIL'}")
    ok &= rel <= 1e-5
    # (2) transformers' own model, imported
    torch.manual_seed(11)
    if arch == "gpt2":
        conf = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        conf = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
    hf = cls(conf)
    hf_dir = os.path.join(work, "hf_" + arch)
    hf.save_pretrained(hf_dir)  # model.safetensors + config.json
    imported = os.path.join(work, "imported.bin")
    r = subprocess.run([zr, "import", hf_dir, "-o", imported], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: zerorun import of transformers' {cls.__name__}:\n{r.stdout}{r.stderr}")
        return False
    steps = 20
    ours = run_zerorun(zr, imported, cfg, steps, work, ["--data", shard])
    hf = cls.from_pretrained(hf_dir, attn_implementation="eager").double().train()
    ref = torch_train(list(hf.parameters()), lambda b: hf_loss(hf, b), cfg, steps, make_batch)  # tied: once
    ok &= compare(f"zerorun import of transformers' {cls.__name__} vs transformers training it", ours, ref)
    return ok


def merge_checks(zr, work, arch, model, cfg, shard, make_batch, V, T):
    """A 3-step ZeRO-3 checkpoint of `model`, merged: the graph interpreter on the zerorun layout and the
    transformers class's forward (written from its definition) on the default layout give zerorun's loss of the
    merged model.bin; then transformers_checks. Returns (ok, merged dir, zerorun's loss)."""
    save = os.path.join(work, "ckpt_" + arch)
    merged = os.path.join(work, "merged_" + arch)
    run_zerorun(zr, model, dict(cfg, zero_optimization={"stage": 3}), 3, work, ["--data", shard, "--save_dir", save])
    merged_z = merged + "_zerorun"
    subprocess.run([zr, "merge", save, merged], check=True, capture_output=True)
    subprocess.run([zr, "merge", save, merged_z, "--layout", "zerorun"], check=True, capture_output=True)
    weights, _ = read_safetensors(os.path.join(merged_z, "model.safetensors"))
    hf_weights, hf_meta = read_safetensors(os.path.join(merged, "model.safetensors"))
    _, meta = read_safetensors(os.path.join(merged, "model.bin"))
    graph = json.loads(meta["graph"])
    batch = make_batch(0, 4)
    hf_forward = hf_gpt2_loss if arch == "gpt2" else hf_llama_loss
    with torch.no_grad():
        ref = forward(graph, weights, batch).item()
        with open(os.path.join(merged, "config.json")) as f:
            hf_ref = hf_forward(json.load(f), hf_weights, batch["tokens"].long(), batch["targets"].long()).item()
    cfg0 = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.0}}}
    ours = run_zerorun(zr, os.path.join(merged, "model.bin"), cfg0, 1, work, ["--data", shard])[0]
    rel = abs(ours - ref) / abs(ref)
    hf_rel = abs(ours - hf_ref) / abs(hf_ref)
    ok = rel <= 1e-5 and hf_rel <= 1e-5 and hf_meta.get("format") == "pt"
    print(f"merged {arch} checkpoint: torch forward loss {ref:.8f} (zerorun layout), {hf_ref:.8f} ("
          f"{'GPT2LMHeadModel' if arch == 'gpt2' else 'LlamaForCausalLM'} layout, format={hf_meta.get('format')}), "
          f"zerorun {ours:.8f}, rel {rel:.2e} / {hf_rel:.2e} -> {'PASS' if ok else 'FAIL'}")
    ok &= transformers_checks(zr, work, arch, merged, ours, cfg, shard, make_batch, V, T)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    zr = args.zerorun
    ok = True
    with tempfile.TemporaryDirectory() as work:
        # --- MLP on the synthetic regression task -------------------------
        mlp = os.path.join(work, "mlp.bin")
        subprocess.run([zr, "init", "--arch", "mlp", "--in", "64", "--hidden", "128", "--out_features", "64",
                        "--seed", "3", "-o", mlp], check=True, capture_output=True)
        cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
               "gradient_clipping": 1.0,
               "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                            "warmup_num_steps": 5, "warmup_type": "linear"}}}
        seed = 77

        def mlp_batch(first, count):
            x = np.zeros((count, 64))
            for b in range(count):
                for i in range(64):
                    x[b, i] = 2.0 * hash_uniform(seed, (first + b) * 64 + i) - 1.0
            x = x.astype(np.float32).astype(np.float64)
            y = x[:, [(7 * j + 3) % 64 for j in range(64)]]
            return {"x": torch.tensor(x), "y": torch.tensor(y)}

        ours = run_zerorun(zr, mlp, cfg, 20, work, ["--seed", str(seed)])
        ok &= compare("mlp", ours, torch_losses(mlp, cfg, 20, mlp_batch))

        # --- tiny GPT-2 (L=2, C=64, H=4, T=32) on an llm.c token shard ----
        gpt = os.path.join(work, "gpt.bin")
        V, T = 128, 32
        subprocess.run([zr, "init", "--arch", "gpt2", "--vocab", str(V), "--n_ctx", str(T), "--n_embd", "64",
                        "--n_layer", "2", "--n_head", "4", "--seed", "5", "-o", gpt], check=True,
                       capture_output=True)
        shard = os.path.join(work, "tok_000.bin")
        gpt_batch = window_batches(markov_shard(shard, V, 8000, 3, 1, np.random.default_rng(0)), T)
        cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
               "gradient_clipping": 1.0,
               "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-3,
                                                                 "warmup_num_steps": 4, "total_num_steps": 20}}}

        ours = run_zerorun(zr, gpt, cfg, 20, work, ["--data", shard])
        ok &= compare("gpt2", ours, torch_losses(gpt, cfg, 20, gpt_batch))
        ok &= merge_checks(zr, work, "gpt2", gpt, cfg, shard, gpt_batch, V, T)
        # --- tiny Llama (L=2, C=64, 4 query heads on 2 key/value heads, rotary, SwiGLU) on the same shard ---
        llama = os.path.join(work, "llama.bin")
        subprocess.run([zr, "init", "--arch", "llama", "--vocab", str(V), "--n_ctx", str(T), "--n_embd", "64",
                        "--n_layer", "2", "--n_head", "4", "--n_kv_head", "2", "--ffn", "96", "--rope_theta", "500",
                        "--seed", "6", "-o", llama], check=True, capture_output=True)
        ours = run_zerorun(zr, llama, cfg, 20, work, ["--data", shard])
        ok &= compare("llama (grouped-query, rotary)", ours, torch_losses(llama, cfg, 20, gpt_batch))
        ok &= merge_checks(zr, work, "llama", llama, cfg, shard, gpt_batch, V, T)
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
