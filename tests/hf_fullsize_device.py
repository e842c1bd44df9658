#!/usr/bin/env python3
"""One full-size shape per family on the device: transformers builds the model from the published config
(AutoModelForCausalLM.from_config, seeded) and saves it; `zerorun import` reads it and zerorun trains 20 bf16 steps
(bf16 block, AdamW with fp32 master weights); transformers trains the same model 20 steps under torch.autocast
(bf16, fp32 weights, torch.optim.AdamW) on the same batches. The per-step losses must agree within bf16 noise
(3e-2 relative at any step; the mean within 1e-2). Prints tokens/s of each as information, not a benchmark.
Usage: python3 tests/hf_fullsize_device.py --zerorun BIN [--only NAME[,NAME...]] [--steps 20]"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

# The published configs (sizes and every flag that changes what is computed), as their config.json spell them.
SHAPES = {
    "Llama-3.2-1B": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=True, hidden_act="silu",
                         rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "Qwen2.5-1.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                         tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                         sliding_window=32768, max_window_layers=21),
    "Qwen3-1.7B": dict(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       tie_word_embeddings=True, hidden_act="silu", attention_bias=False),
    "Gemma-2-2B": dict(model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                       query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       sliding_window=4096, max_position_embeddings=8192, rms_norm_eps=1e-6,
                       hidden_activation="gelu_pytorch_tanh"),
    "Gemma-3-1B": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                       num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                       query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6,
                       rope_theta=1000000.0, rope_local_base_freq=10000.0, max_position_embeddings=32768,
                       rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh"),
    "OLMo-2-0425-1B": dict(model_type="olmo2", vocab_size=100352, hidden_size=2048, intermediate_size=8192,
                           num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                           max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=500000.0,
                           tie_word_embeddings=False, attention_bias=False, pad_token_id=100277,
                           bos_token_id=None, eos_token_id=100257),
    # The 7B/3.8B models at their full width but 8 of their 32 layers: transformers' own fp32-weight AdamW training
    # of the whole model (16 bytes a parameter) does not fit one 80 GB card.
    "Mistral-7B-v0.3 (8 of 32 layers)": dict(model_type="mistral", vocab_size=32768, hidden_size=4096,
                                             intermediate_size=14336, num_hidden_layers=8, num_attention_heads=32,
                                             num_key_value_heads=8, max_position_embeddings=32768,
                                             rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
                                             tie_word_embeddings=False),
    "Phi-3-mini-4k (8 of 32 layers)": dict(model_type="phi3", vocab_size=32064, hidden_size=3072,
                                           intermediate_size=8192, num_hidden_layers=8, num_attention_heads=32,
                                           num_key_value_heads=32, max_position_embeddings=4096,
                                           original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                                           rope_theta=10000.0, sliding_window=2047, tie_word_embeddings=False,
                                           bos_token_id=1, eos_token_id=32000, pad_token_id=32000),
}


def main():
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    B, T, steps = args.micro, args.seq, args.steps
    ok = True
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("WORKDIR", "/tmp")) as work:
        rng = np.random.default_rng(0)
        n = B * T * steps + 1
        toks = rng.integers(0, 32000, size=n)  # ids every vocabulary has; a learnable pattern on half the positions
        toks[1::2] = (toks[0:-1:2] * 7 + 11) % 32000
        shard = os.path.join(work, "tok_000.bin")
        with open(shard, "wb") as f:
            hdr = np.zeros(256, dtype=np.int32)
            hdr[0], hdr[1], hdr[2] = 20240520, 1, n
            f.write(hdr.tobytes())
            f.write(toks.astype(np.uint16).tobytes())
        cfg = {"train_batch_size": B, "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
               "bf16": {"enabled": True}, "gradient_clipping": 1.0,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}}
        cpath = os.path.join(work, "ds.json")
        with open(cpath, "w") as f:
            json.dump(cfg, f)
        for name, hc in SHAPES.items():
            if args.only and not any(o in name for o in args.only.split(",")):
                continue
            hc = dict(hc)
            mt = hc.pop("model_type")
            conf = transformers.AutoConfig.for_model(mt, **hc)
            torch.manual_seed(0)
            t_init = time.time()
            with torch.device("cuda"):  # initialised on the GPU (minutes on the CPU at these sizes), saved, moved off
                m = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
            d = os.path.join(work, "hf")
            shutil.rmtree(d, ignore_errors=True)  # the last model's shards must not linger beside this one's
            m.save_pretrained(d)
            m = m.cpu()
            torch.cuda.empty_cache()
            t_init = time.time() - t_init
            model = os.path.join(work, "m.bin")
            t0 = time.time()
            r = subprocess.run([args.zerorun, "import", d, "-o", model], capture_output=True, text=True)
            if r.returncode:
                print(f"{name}: FAIL import:\n{r.stdout}{r.stderr}")
                ok = False
                continue
            log = os.path.join(work, "log")
            r = subprocess.run([args.zerorun, "--config", cpath, model, "--steps", str(steps), "--seq_len", str(T),
                                "--data", shard, "--log_dir", log], capture_output=True, text=True)
            zt = time.time() - t0
            if r.returncode:
                print(f"{name}: FAIL zerorun training:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
                ok = False
                continue
            with open(os.path.join(log, "metrics.jsonl")) as f:
                ours = [json.loads(x)["loss"] for x in f]
            tps = [ln for ln in r.stdout.splitlines() if "tok/s" in ln]
            m = m.cuda().train()
            opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
            ref = []
            t0 = time.time()
            for k in range(steps):
                x = torch.tensor(toks[k * B * T: (k + 1) * B * T].reshape(B, T), device="cuda")
                y = torch.tensor(toks[k * B * T + 1: (k + 1) * B * T + 1].reshape(B, T), device="cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = m(input_ids=x).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                opt.step()
                ref.append(loss.item())
            torch.cuda.synchronize()
            ht = time.time() - t0
            rels = [abs(a - b) / abs(b) for a, b in zip(ours, ref)]
            good = len(ours) == steps and max(rels) <= 3e-2 and sum(rels) / len(rels) <= 1e-2
            for k in range(steps):
                print(f"  {name} step {k + 1:2d}: zerorun {ours[k]:.5f} transformers {ref[k]:.5f} rel {rels[k]:.1e}")
            print(f"{name}: 20 bf16 steps, worst rel {max(rels):.1e}, mean {sum(rels) / len(rels):.1e} -> "
                  f"{'PASS' if good else 'FAIL'} (wall: build + save {t_init:.0f} s, zerorun {zt:.0f} s incl. import and "
                  f"start, transformers eager {ht:.0f} s; "
                  f"{tps[-1].strip() if tps else ''})")
            ok &= good
            del m, opt
            torch.cuda.empty_cache()
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
