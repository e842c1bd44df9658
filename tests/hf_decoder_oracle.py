#!/usr/bin/env python3
"""Oracle for today's decoders in CI (Debian's python3-torch, no transformers): for each transformers model_type
zerorun imports (llama with llama3 rope scaling, mistral, qwen2, qwen3, phi3, olmo2, gemma, gemma2, gemma3_text,
gemma3 multimodal) it writes a checkpoint directory laid out as the published ones (config.json with the real keys
in transformers 4 or 5 spelling, shrunk sizes; model.safetensors or a sharded index; F32/BF16/F16; tokenizer and
generation config files), then
  1. `zerorun import` reads it;
  2. zerorun trains 20 steps (AdamW, accumulation 2, clipping, warmup-decay schedule) and the model's forward as
     transformers' modeling_<type>.py defines it, written out here in float64 torch, trains the same 20 steps
     with torch.optim.AdamW: per-step losses within 1e-4 relative;
  3. `zerorun merge` of a 3-step ZeRO-3 checkpoint writes transformers' names and layout (split or fused), the
     imported config.json with every field, generation_config.json and the tokenizer files, and the forward here
     on the merged weights gives zerorun's loss of the merged model.bin (1e-5).
Exit 77 (skipped) when torch is not installed."""
import argparse
import copy
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_oracle import compare, markov_shard, read_safetensors, run_zerorun, torch_train, window_batches  # noqa: E402

V, T = 96, 32


# ---- checkpoints as transformers saves them --------------------------------------------------------------------
def write_safetensors(path, tensors, dtype="F32"):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        a = t.detach().to(torch.float32).numpy()
        if dtype == "F32":
            b = a.astype("<f4").tobytes()
        elif dtype == "F16":
            b = a.astype("<f2").tobytes()
        else:  # BF16: the top half of the f32 bits, rounded to nearest even
            u = a.astype("<f4").view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            b = u.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def quantised(t, dtype):
    """The values a checkpoint of `dtype` holds (what zerorun reads back)."""
    if dtype == "F16":
        return t.to(torch.float16).to(torch.float64)
    if dtype == "BF16":
        return t.to(torch.bfloat16).to(torch.float64)
    return t.to(torch.float32).to(torch.float64)


def hf_weights(cfg, mt, gen):
    """transformers' parameter names and shapes for model_type `mt` (random values)."""
    C, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim") or C // H
    Fw = cfg["intermediate_size"]
    gemma = mt.startswith("gemma")
    w = {}

    def r(*shape, s=0.08):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * s

    def norm(n):  # Gemma's weights are the offset from 1
        w[n] = r(n_of(n), s=0.1) if gemma else 1.0 + r(n_of(n), s=0.1)

    sizes = {}

    def n_of(n):
        return sizes.get(n, C)

    w["model.embed_tokens.weight"] = r(V, C, s=0.5)
    for i in range(L):
        p = f"model.layers.{i}."
        if mt == "phi3":
            w[p + "self_attn.qkv_proj.weight"] = r((H + 2 * K) * D, C)
        else:
            w[p + "self_attn.q_proj.weight"] = r(H * D, C)
            w[p + "self_attn.k_proj.weight"] = r(K * D, C)
            w[p + "self_attn.v_proj.weight"] = r(K * D, C)
            if mt == "qwen2" or cfg.get("attention_bias"):
                for x, n in (("q", H * D), ("k", K * D), ("v", K * D)):
                    w[p + f"self_attn.{x}_proj.bias"] = r(n, s=0.2)
        w[p + "self_attn.o_proj.weight"] = r(C, H * D)
        if cfg.get("attention_bias") and mt != "qwen2":
            w[p + "self_attn.o_proj.bias"] = r(C, s=0.2)
        if mt in ("qwen3", "gemma3_text"):
            for x in ("q", "k"):
                sizes[p + f"self_attn.{x}_norm.weight"] = D
                norm(p + f"self_attn.{x}_norm.weight")
        if mt == "olmo2":
            sizes[p + "self_attn.q_norm.weight"] = H * D
            sizes[p + "self_attn.k_norm.weight"] = K * D
            norm(p + "self_attn.q_norm.weight")
            norm(p + "self_attn.k_norm.weight")
        if mt == "phi3":
            w[p + "mlp.gate_up_proj.weight"] = r(2 * Fw, C)
        else:
            w[p + "mlp.gate_proj.weight"] = r(Fw, C)
            w[p + "mlp.up_proj.weight"] = r(Fw, C)
        w[p + "mlp.down_proj.weight"] = r(C, Fw)
        names = {"olmo2": ["post_attention_layernorm", "post_feedforward_layernorm"],
                 "gemma2": ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm"]}
        names["gemma3_text"] = names["gemma2"]
        for n in names.get(mt, ["input_layernorm", "post_attention_layernorm"]):
            norm(p + n + ".weight")
    norm("model.norm.weight")
    if not cfg.get("tie_word_embeddings", gemma):
        w["lm_head.weight"] = r(V, C)
    return w


# ---- the forward, from transformers' modeling_<type>.py ------------------------------------------------------------
def inv_freq(theta, D, rope):
    """modeling_rope_utils: default, linear, llama3, yarn (float64 here)."""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    scale = 1.0
    t = (rope or {}).get("rope_type", (rope or {}).get("type", "default"))
    if t == "linear":
        inv = inv / rope["factor"]
    elif t == "llama3":
        f, lo, hi, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], \
            rope["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        out = torch.where(wl > old / lo, inv / f, inv)
        s = (old / wl - lo) / (hi - lo)
        mid = ~(wl < old / hi) & ~(wl > old / lo)
        inv = torch.where(mid, (1 - s) * out / f + s * out, out)
    elif t == "yarn":
        f = rope["factor"]
        scale = rope.get("attention_factor") or (0.1 * math.log(f) + 1.0)
        omax = rope.get("original_max_position_embeddings", T)

        def dim_of(rot):
            return D * math.log(omax / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low = max(math.floor(dim_of(rope.get("beta_fast", 32))), 0)
        high = min(math.ceil(dim_of(rope.get("beta_slow", 1))), D - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        ef = 1 - ramp
        inv = (inv / f) * (1 - ef) + inv * ef
    return inv, scale


def rope_apply(x, theta, rope, position_ids=None):
    """position_ids [B, T] (transformers' argument; packed documents restart at 0), else 0 .. T - 1."""
    B, Hh, Tt, D = x.shape
    inv, scale = inv_freq(theta, D, rope)
    if position_ids is None:
        emb = torch.cat([torch.outer(torch.arange(Tt, dtype=torch.float64), inv)] * 2, dim=-1)
    else:  # [B, 1, T, D]: broadcast over the heads
        emb = torch.cat([position_ids.to(torch.float64)[:, None, :, None] * inv] * 2, dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    rot = torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)
    return x * cos + rot * sin


def rms(x, w, eps, gemma):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w) if gemma else y * w


def hf_forward(cfg_full, w, tokens, targets):
    logits = hf_forward_logits(cfg_full, w, tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def hf_forward_logits(cfg_full, w, tokens, position_ids=None, drop=None):
    """position_ids: packed documents (each restarting at 0) attend only within their document — the block-diagonal
    causal mask transformers' packing collators ask for with position_ids (flash-attention varlen / the 4D mask).
    drop(kind, layer, x): training mode's dropouts where given (kind "attn": the attention probabilities;
    "resid_attn", "resid_mlp": Phi-3's outputs before their residual adds)."""
    if drop is None:
        def drop(kind, layer, x):
            return x
    mt = cfg_full["model_type"]
    cfg = cfg_full["text_config"] if mt == "gemma3" else cfg_full
    mt = "gemma3_text" if mt == "gemma3" else mt
    gemma = mt.startswith("gemma")
    C, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim") or C // H
    eps = cfg.get("rms_norm_eps", 1e-5 if mt in ("phi3", "olmo2") else 1e-6)
    B, Tt = tokens.shape
    rope_p = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    theta = cfg.get("rope_theta", 1e6 if mt == "gemma3_text" else 10000.0)
    if rope_p and "rope_theta" in rope_p:
        theta = rope_p["rope_theta"]
    if rope_p and rope_p.get("rope_type", rope_p.get("type")) == "default":
        rope_p = None
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        if mt == "gemma2":
            layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        elif mt == "gemma3_text":
            pat = cfg.get("sliding_window_pattern", 6)
            layer_types = ["sliding_attention" if (i + 1) % pat else "full_attention" for i in range(L)]
        elif mt in ("qwen2", "qwen3"):
            mw = cfg.get("max_window_layers", L)
            use = cfg.get("use_sliding_window", False) and window
            layer_types = ["sliding_attention" if use and i >= mw else "full_attention" for i in range(L)]
        elif mt in ("mistral", "phi3") and window:
            layer_types = ["sliding_attention"] * L
        else:
            layer_types = ["full_attention"] * L
    scaling = cfg.get("query_pre_attn_scalar", D) ** -0.5 if mt in ("gemma2", "gemma3_text") else D ** -0.5
    softcap = cfg.get("attn_logit_softcapping", 50.0 if mt == "gemma2" else None)
    final_cap = cfg.get("final_logit_softcapping", 30.0 if mt == "gemma2" else None)

    def lin(x, n, bias=True):
        y = x @ w[n + ".weight"].t()
        return y + w[n + ".bias"] if bias and n + ".bias" in w else y

    pad = cfg.get("pad_token_id")  # transformers' nn.Embedding(..., padding_idx=pad_token_id)
    h = F.embedding(tokens, w["model.embed_tokens.weight"], padding_idx=pad)
    if gemma:
        h = h * torch.tensor(C ** 0.5, dtype=torch.float64)
    pos = torch.arange(Tt)
    causal = pos[None, :] <= pos[:, None]
    if position_ids is not None:  # [B, 1, T, T]: same document (documents numbered by their starts) and causal
        doc = (position_ids == 0).cumsum(-1)
        causal = (causal[None] & (doc[:, :, None] == doc[:, None, :]))[:, None]
    for i in range(L):
        p = f"model.layers.{i}."
        x = h if mt == "olmo2" else rms(h, w[p + "input_layernorm.weight"], eps, gemma)
        if mt == "phi3":
            q, k, v = lin(x, p + "self_attn.qkv_proj").split([H * D, K * D, K * D], dim=-1)
        else:
            q, k, v = (lin(x, p + f"self_attn.{n}_proj") for n in ("q", "k", "v"))
        if mt == "olmo2":  # q/k norms over the full projected width
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps, False)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps, False)
        q, k, v = (t.view(B, Tt, -1, D).transpose(1, 2) for t in (q, k, v))
        if mt in ("qwen3", "gemma3_text"):  # per head
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps, gemma)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps, gemma)
        sliding = layer_types[i] == "sliding_attention"
        if mt == "gemma3_text":
            rp = cfg.get("rope_parameters")
            if rp and "full_attention" in rp:
                fa, sa = rp["full_attention"], rp["sliding_attention"]
                th, rsc = (sa["rope_theta"], None) if sliding else (fa["rope_theta"], fa)
                if rsc and rsc.get("rope_type") == "default":
                    rsc = None
            else:
                th, rsc = (cfg.get("rope_local_base_freq", 10000.0), None) if sliding else (theta, rope_p)
        else:
            th, rsc = theta, rope_p
        q, k = rope_apply(q, th, rsc, position_ids), rope_apply(k, th, rsc, position_ids)
        k, v = (t.repeat_interleave(H // K, dim=1) for t in (k, v))
        s = (q @ k.transpose(-1, -2)) * scaling
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        mask = causal & (pos[None, :] > pos[:, None] - window) if sliding else causal
        a = drop("attn", i, s.masked_fill(~mask, float("-inf")).softmax(-1)) @ v
        a = lin(a.transpose(1, 2).reshape(B, Tt, H * D), p + "self_attn.o_proj")
        if mt == "phi3":
            a = drop("resid_attn", i, a)
        if mt in ("olmo2", "gemma2", "gemma3_text"):
            a = rms(a, w[p + "post_attention_layernorm.weight"], eps, gemma)
        h = h + a
        if mt == "olmo2":
            x = h
        elif gemma and mt != "gemma":
            x = rms(h, w[p + "pre_feedforward_layernorm.weight"], eps, gemma)
        else:
            x = rms(h, w[p + "post_attention_layernorm.weight"], eps, gemma)
        if mt == "phi3":
            g, u = lin(x, p + "mlp.gate_up_proj").chunk(2, dim=-1)
        else:
            g, u = lin(x, p + "mlp.gate_proj"), lin(x, p + "mlp.up_proj")
        act = F.gelu(g, approximate="tanh") if gemma else F.silu(g)
        m = lin(act * u, p + "mlp.down_proj")
        if mt == "phi3":
            m = drop("resid_mlp", i, m)
        if mt in ("olmo2", "gemma2", "gemma3_text"):
            m = rms(m, w[p + "post_feedforward_layernorm.weight"], eps, gemma)
        h = h + m
    h = rms(h, w["model.norm.weight"], eps, gemma)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = h @ head.t()
    if final_cap:
        logits = torch.tanh(logits / final_cap) * final_cap
    return logits


# ---- the model_types, as their published configs spell them (shrunk) --------------------------------------------
def base(mt, **kw):
    c = {"architectures": [], "model_type": mt, "vocab_size": V, "hidden_size": 48, "intermediate_size": 80,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": T,
         "initializer_range": 0.02, "use_cache": True, "bos_token_id": 1, "eos_token_id": 2,
         "transformers_version": "4.51.0", "torch_dtype": "bfloat16", "attention_dropout": 0.0}
    c.update(kw)
    return c


def cases():
    llama3 = base("llama", architectures=["LlamaForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
                  rope_theta=500000.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False, head_dim=12,
                  pretraining_tp=1, eos_token_id=[2, 3],
                  rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8, "rope_type": "llama3"})
    llama_t5 = base("llama", architectures=["LlamaForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
                    dtype="float32", transformers_version="5.0.0", tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 16})
    del llama_t5["torch_dtype"]
    mistral = base("mistral", architectures=["MistralForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
                   rope_theta=10000.0, sliding_window=7, tie_word_embeddings=False, head_dim=None)
    qwen2 = base("qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
                 rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=32,
                 max_window_layers=21, rope_scaling=None, bos_token_id=43, eos_token_id=45)
    qwen3 = base("qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6, head_dim=16,
                 rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                 sliding_window=None, max_window_layers=28, rope_scaling=None)
    # As transformers 5 saves Phi-3: rope_parameters carrying partial_rotary_factor 1.0 (the whole head rotates).
    phi3 = base("phi3", architectures=["Phi3ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                sliding_window=9, resid_pdrop=0.0, embd_pdrop=0.0, original_max_position_embeddings=T,
                tie_word_embeddings=False, num_key_value_heads=4, eos_token_id=32, pad_token_id=32)
    olmo2 = base("olmo2", architectures=["Olmo2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6,
                 rope_theta=500000.0, attention_bias=False, tie_word_embeddings=False, rope_scaling=None,
                 pad_token_id=1, eos_token_id=3)
    gemma = base("gemma", architectures=["GemmaForCausalLM"], hidden_act="gelu", hidden_activation=None,
                 head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, num_key_value_heads=1,
                 pad_token_id=0)
    del gemma["hidden_activation"]
    gemma2 = base("gemma2", architectures=["Gemma2ForCausalLM"], hidden_act="gelu_pytorch_tanh",
                  hidden_activation="gelu_pytorch_tanh", head_dim=16, query_pre_attn_scalar=24,
                  attn_logit_softcapping=50.0, final_logit_softcapping=3.0, sliding_window=6, rms_norm_eps=1e-6,
                  rope_theta=10000.0, cache_implementation="hybrid", num_hidden_layers=3, pad_token_id=0)
    gemma3t = base("gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_activation="gelu_pytorch_tanh",
                   head_dim=16, query_pre_attn_scalar=16, sliding_window=5, sliding_window_pattern=2,
                   rope_local_base_freq=10000.0, rope_theta=1000000.0, final_logit_softcapping=None,
                   attn_logit_softcapping=None, rope_scaling={"rope_type": "linear", "factor": 8.0},
                   num_hidden_layers=3, rms_norm_eps=1e-6, pad_token_id=0)
    gemma3t5 = base("gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_activation="gelu_pytorch_tanh",
                    head_dim=16, query_pre_attn_scalar=16, sliding_window=5, transformers_version="5.0.0",
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"], num_hidden_layers=3,
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    gemma3mm = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                "text_config": dict(gemma3t, architectures=None), "vision_config": {"model_type": "siglip_vision_model"},
                "boi_token_index": 5, "eoi_token_index": 6, "image_token_index": 7, "mm_tokens_per_image": 4,
                "bos_token_id": 1, "eos_token_id": [2, 3], "transformers_version": "4.51.0"}
    del gemma3mm["text_config"]["architectures"]
    # (name, config, dtype, sharded)
    return [("llama3.2 (llama3 rope, tied, head_dim)", llama3, "BF16", False),
            ("llama, transformers 5 (rope_parameters yarn, dtype)", llama_t5, "F32", True),
            ("mistral (sliding window 7)", mistral, "F32", False),
            ("qwen2.5 (q/k/v bias, tied)", qwen2, "BF16", True),
            ("qwen3 (per-head q/k norm, head_dim 16)", qwen3, "F32", False),
            ("phi3 (fused qkv_proj and gate_up_proj, window)", phi3, "F16", False),
            ("olmo2 (post-norms, full-width q/k norm)", olmo2, "F32", False),
            ("gemma ((1+w) norms, GeGLU, embedding scale, MQA)", gemma, "BF16", False),
            ("gemma2 (sandwich norms, soft-capping, alternate windows)", gemma2, "F32", False),
            ("gemma3_text (q/k norm, local/global rope, linear scaling)", gemma3t, "F32", False),
            ("gemma3_text, transformers 5 (layer_types, rope_parameters)", gemma3t5, "F32", False),
            ("gemma3 multimodal (text_config; vision tower left out)", gemma3mm, "BF16", True)]


def write_checkpoint(d, cfg, dtype, sharded, seed):
    os.makedirs(d, exist_ok=True)
    mt = cfg["model_type"]
    tc = cfg["text_config"] if mt == "gemma3" else cfg
    gen = torch.Generator().manual_seed(seed)
    w = hf_weights(tc, "gemma3_text" if mt == "gemma3" else mt, gen)
    w = {k: quantised(v, dtype) for k, v in w.items()}
    stored = dict(w)
    if mt == "gemma3":  # transformers 4's multimodal names, plus a vision tower
        stored = {("language_model." + k if k.startswith("model.") else "language_model." + k): v for k, v in w.items()}
        stored["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3, 2, 2)
        stored["multi_modal_projector.mm_input_projection_weight"] = torch.zeros(4, 48)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": cfg.get("eos_token_id", 2), "do_sample": True,
                   "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.51.0"}, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{{ messages }}", "eos_token": "</s>"}, f)
    names = list(stored)
    if sharded:
        half = len(names) // 2
        parts = [("model-00001-of-00002.safetensors", names[:half]), ("model-00002-of-00002.safetensors", names[half:])]
        idx = {"metadata": {"total_size": 0}, "weight_map": {}}
        for fn, ns in parts:
            write_safetensors(os.path.join(d, fn), {n: stored[n] for n in ns}, dtype)
            for n in ns:
                idx["weight_map"][n] = fn
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f)
    else:
        write_safetensors(os.path.join(d, "model.safetensors"), stored, dtype)
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    zr = args.zerorun
    ok = True
    with tempfile.TemporaryDirectory() as work:
        shard = os.path.join(work, "tok_000.bin")
        batch = window_batches(markov_shard(shard, V, 6000, 5, 3, np.random.default_rng(0)), T)

        cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
               "gradient_clipping": 1.0,
               "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 2e-4, "warmup_max_lr": 2e-3,
                                                                 "warmup_num_steps": 4, "total_num_steps": 20}}}
        for i, (name, hc, dtype, sharded) in enumerate(cases()):
            if args.only and args.only not in name:
                continue
            d = os.path.join(work, f"hf{i}")
            w = write_checkpoint(d, hc, dtype, sharded, 100 + i)
            model = os.path.join(work, f"m{i}.bin")
            r = subprocess.run([zr, "import", d, "-o", model], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: FAIL: zerorun import:\n{r.stdout}{r.stderr}")
                ok = False
                continue
            params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            ours = run_zerorun(zr, model, cfg, 20, work, ["--data", shard])
            ref = torch_train(list(params.values()), lambda b: hf_forward(hc, params, b["tokens"], b["targets"]),
                              cfg, 20, batch)
            ok &= compare(name, ours, ref)
            ok &= merge_check(zr, work, i, name, hc, model, cfg, shard, batch)
            ok &= init_check(zr, work, name, d, model)
        ok &= refusals(zr, work)
        ok &= masked_check(zr, work, cfg)
        ok &= init_flags_check(zr, work)
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


def init_check(zr, work, name, d, imported):
    """`zerorun init --from_config` builds the imported model's graph with fresh weights of the same names and
    shapes."""
    fresh = os.path.join(work, "fresh.bin")
    r = subprocess.run([zr, "init", "--from_config", os.path.join(d, "config.json"), "-o", fresh, "--seed", "3"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name}: FAIL: init --from_config:\n{r.stdout}{r.stderr}")
        return False
    a, ma = read_safetensors(fresh)
    b, mb = read_safetensors(imported)
    ga, gb = json.loads(ma["graph"]), json.loads(mb["graph"])
    same = {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()} and ga["nodes"] == gb["nodes"]
    print(f"{name}: init --from_config -> the same graph and parameter shapes -> {'PASS' if same else 'FAIL'}")
    return same


def init_flags_check(zr, work):
    """`zerorun init --arch <model_type>` with size flags builds what --from_config builds of the config.json those
    flags spell (the family's other settings at transformers' defaults)."""
    ok = True
    for mt in ("mistral", "qwen3", "olmo2", "gemma2", "gemma3_text"):
        flags = ["--vocab", "96", "--n_ctx", "32", "--n_embd", "48", "--n_layer", "2", "--n_head", "4",
                 "--n_kv_head", "2", "--ffn", "80", "--head_dim", "16"]
        cfg = {"model_type": mt, "vocab_size": 96, "max_position_embeddings": 32, "hidden_size": 48,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80,
               "head_dim": 16}
        cpath = os.path.join(work, f"flags_{mt}.json")
        with open(cpath, "w") as f:
            json.dump(cfg, f)
        a, b = os.path.join(work, "fa.bin"), os.path.join(work, "fb.bin")
        r1 = subprocess.run([zr, "init", "--arch", mt, "-o", a] + flags, capture_output=True, text=True)
        r2 = subprocess.run([zr, "init", "--from_config", cpath, "-o", b], capture_output=True, text=True)
        good = r1.returncode == 0 and r2.returncode == 0
        if good:
            ga = json.loads(read_safetensors(a)[1]["graph"])
            gb = json.loads(read_safetensors(b)[1]["graph"])
            good = ga["nodes"] == gb["nodes"]
        print(f"init --arch {mt} with size flags == init --from_config of that config -> {'PASS' if good else 'FAIL'}"
              f"{'' if good else ': ' + r1.stderr + r2.stderr}")
        ok &= good
    return ok


def masked_check(zr, work, cfg):
    """A zerorun shard with a loss mask and documents (zerorun prepare's format, data.h): targets the mask leaves out
    and first tokens of documents are -100; the loss is the mean over the global batch's counted targets, as
    transformers computes it with num_items_in_batch across accumulation. Documents packed into windows attend only
    within themselves, their positions restart at 0 (the reference gets position_ids: a block-diagonal causal mask
    and rope at each document's own positions); with train.packing false each document is a sequence of its own,
    padded. zerorun on 1 and 2 ranks vs torch; a Qwen3 (rope, per-head q/k norm) and a Gemma 2 (soft-capping, a
    sliding window of 7 on alternate layers)."""
    return all([masked_case(zr, work, cfg, 4, 173, True), masked_case(zr, work, cfg, 8, 61, True),
                masked_case(zr, work, cfg, 4, 29, False)])


def masked_case(zr, work, cfg, case, doc_len, packing):
    name, hc = cases()[case][0], dict(cases()[case][1])
    d = os.path.join(work, "masked_hf")
    w = write_checkpoint(d, hc, "F32", False, 5)
    model = os.path.join(work, "masked.bin")
    subprocess.run([zr, "import", d, "-o", model], check=True, capture_output=True)
    rng = np.random.default_rng(3)
    n = 4000
    toks = rng.integers(0, V, size=n).astype(np.uint16)
    toks[1::2] = (toks[0:-1:2].astype(np.int64) * 5 + 3) % V
    mask = (rng.random(n) < 0.6).astype(np.uint8)  # 40% of tokens are context only
    starts = list(range(0, n, doc_len)) + [n]
    for st in starts[:-1]:
        mask[st] = 0
    shard = os.path.join(work, "masked_000.bin")
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5], hdr[7], hdr[8] = 20250711, 1, n, 0, 2, len(starts) - 1, 1, V
    with open(shard, "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes() + mask.tobytes() + np.array(starts, dtype=np.int64).tobytes())
    windows = (n - 1) // T
    start_set = set(starts)

    def batch(first, count):
        x = np.zeros((count, T), dtype=np.int64)
        y = np.full((count, T), -100, dtype=np.int64)
        p = np.zeros((count, T), dtype=np.int64)
        for b in range(count):
            if packing:
                k = (first + b) % windows
                doc_start = k * T  # a document begun in an earlier window restarts at the window's start
                for t in range(T):
                    i = k * T + t
                    if i in start_set:
                        doc_start = i
                    x[b, t], p[b, t] = toks[i], i - doc_start
                    if mask[i + 1] and (i + 1) not in start_set:
                        y[b, t] = toks[i + 1]
            else:  # document s mod the count, cut to T + 1 tokens, padded with 0 (the pad id: no padding_idx here)
                d = (first + b) % (len(starts) - 1)
                lo, hi = starts[d], min(starts[d + 1], starts[d] + T + 1)
                for t in range(T):
                    x[b, t], p[b, t] = (toks[lo + t] if lo + t < hi else 0), t
                    if lo + t + 1 < hi and mask[lo + t + 1]:
                        y[b, t] = toks[lo + t + 1]
        return {"tokens": torch.tensor(x), "targets": torch.tensor(y), "positions": torch.tensor(p)}

    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    o = cfg["optimizer"]["params"]
    opt = torch.optim.AdamW(list(params.values()), lr=o["lr"], betas=tuple(o["betas"]), weight_decay=o["weight_decay"])
    micro, gas, steps = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], 12
    ref = []
    for k in range(steps):
        opt.zero_grad()
        bs = [batch(k * micro * gas + a * micro, micro) for a in range(gas)]
        count = sum(int((b["targets"] != -100).sum()) for b in bs)
        total = 0.0
        for b in bs:  # the sum over the micro-batch's counted targets, over the global batch's count
            lg = hf_forward_logits(hc, params, b["tokens"], b["positions"])
            loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), b["targets"].reshape(-1), ignore_index=-100,
                                   reduction="sum") / count
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["gradient_clipping"])
        opt.step()
        ref.append(total)
    c = {k: v for k, v in cfg.items() if k != "scheduler"}
    if not packing:
        c["train"] = {"packing": False}
    what = f"{name}, documents of {doc_len} {'packed' if packing else 'padded'}"
    ok = compare(f"loss mask (zerorun shard), {what}, 1 rank",
                 run_zerorun(zr, model, c, steps, work, ["--data", shard]), ref)
    ok &= compare(f"loss mask (zerorun shard), {what}, 2 ranks ZeRO-2",
                  run_zerorun(zr, model, dict(c, zero_optimization={"stage": 2}, train_micro_batch_size_per_gpu=1,
                                              gradient_accumulation_steps=2), steps, work,
                              ["--data", shard, "--num_gpus", "2", "--device", "cpu"]), ref)
    return ok


def refusals(zr, work):
    """What must not import silently: a Qwen2 checkpoint relabelled llama (its biases would be dropped), config keys
    whose effect zerorun does not compute, a non-finite weight."""
    ok = True
    qwen2 = dict(cases()[3][1])
    bad = [("a Qwen2 relabelled llama", dict(qwen2, model_type="llama"), None,
            "tensors that are not weights of a llama of 2 layers, hidden_size 48: model.layers.0.self_attn.k_proj.bias"),
           ("longrope", dict(qwen2, rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 6,
                                                   "long_factor": [1.0] * 6}), None, 'rope_type "longrope"'),
           ("partial rotary", dict(qwen2, partial_rotary_factor=0.5), None, "partial_rotary_factor 0.5"),
           ("partial rotary (transformers 5)",
            dict(qwen2, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
            None, "rope_parameters.partial_rotary_factor 0.5 is not supported"),
           ("custom code", dict(qwen2, auto_map={"AutoModel": "x.Y"}), None, "'auto_map' is not supported"),
           ("attention dropout of 1", dict(qwen2, attention_dropout=1.0), None,
            "'attention_dropout' must be a probability in [0, 1), got 1"),
           ("a NaN weight", qwen2, "model.layers.1.mlp.up_proj.weight", "holds a non-finite value")]
    for i, (what, cfg, nan_at, want) in enumerate(bad):
        d = os.path.join(work, f"bad{i}")
        write_checkpoint(d, qwen2, "F32", False, 7)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        if nan_at:
            w, _ = read_safetensors(os.path.join(d, "model.safetensors"))
            w[nan_at][0, 0] = float("nan")
            write_safetensors(os.path.join(d, "model.safetensors"), w)
        r = subprocess.run([zr, "import", d, "-o", os.path.join(work, "bad.bin")], capture_output=True, text=True)
        good = r.returncode == 1 and want in r.stderr
        print(f"refused: {what}: exit {r.returncode} -> {'PASS' if good else 'FAIL'}{'' if good else ': ' + r.stderr}")
        ok &= good
    return ok


def merge_check(zr, work, i, name, hc, model, cfg, shard, batch):
    save, out = os.path.join(work, f"ck{i}"), os.path.join(work, f"merged{i}")
    run_zerorun(zr, model, dict(cfg, zero_optimization={"stage": 3}), 3, work, ["--data", shard, "--save_dir", save])
    r = subprocess.run([zr, "merge", save, out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name}: FAIL: merge:\n{r.stdout}{r.stderr}")
        return False
    with open(os.path.join(out, "config.json")) as f:
        mc = json.load(f)
    w, meta = read_safetensors(os.path.join(out, "model.safetensors"))
    expect = copy.deepcopy(hc)
    if hc["model_type"] == "gemma3":  # the language model, saved as Gemma3ForCausalLM
        expect = dict(hc["text_config"], model_type="gemma3_text", transformers_version=hc["transformers_version"])
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if k in hc and k not in expect:
                expect[k] = hc[k]
    expect["architectures"] = mc["architectures"]
    ok = mc == expect and meta.get("format") == "pt"
    if not ok:
        print(f"  merged config.json differs from the imported one:\n  {mc}\n  {expect}")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if not os.path.exists(os.path.join(out, f)):
            print(f"  merge wrote no {f}")
            ok = False
    b = batch(0, 4)
    cfg0 = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.0}}}
    zl = run_zerorun(zr, os.path.join(out, "model.bin"), cfg0, 1, work, ["--data", shard])[0]
    with torch.no_grad():
        hl = hf_forward(hc, w, b["tokens"], b["targets"]).item()
    rel = abs(zl - hl) / abs(hl)
    ok &= rel <= 1e-5
    print(f"{name}: merge -> {mc['architectures'][0]} names, config.json as imported, loss {hl:.8f} vs zerorun "
          f"{zl:.8f} (rel {rel:.1e}) -> {'PASS' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    main()
