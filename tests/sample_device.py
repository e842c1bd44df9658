#!/usr/bin/env python3
"""`zerorun sample` against transformers' own greedy generation, on the device machine (transformers is not in
Debian): for each model_type of tests/hf_decoder_oracle.py's cases (untied heads, so generation does not just
repeat the prompt) and GPT-2, transformers builds a small model from its config (seeded, fp32, eager attention),
saves it with a byte-level tokenizer, and generates greedily (`generate(do_sample=False, max_new_tokens=N)`, its
generation_config's eos stopping it, with its own KV cache); `zerorun sample DIR --prompt_ids ... --ids` must give
the same tokens, on the GPU (--device cuda, default) and on the CPU. A token that differs only where transformers'
two best logits are within 1e-4 of each other (fp32 on different kernels may break such a tie either way) ends
that case's comparison without failing it. Also `sample --prompt TEXT` through the saved tokenizer.
Usage: python3 tests/sample_device.py --zerorun BIN [--device cuda|cpu] [--only NAME] [--new 40]"""
import argparse
import copy
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_decoder_oracle import cases  # noqa: E402


def small_tokenizer(transformers, vocab):
    """A byte-level BPE tokenizer of at most `vocab` ids (the tiny models' vocabulary), trained here on the prompt's
    words, with <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(["zerorun trains today's models"] * 4,
                          trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"]))
    assert t.get_vocab_size() <= vocab, (t.get_vocab_size(), vocab)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>")


def zerorun_ids(zr, d, prompt, n, device):
    r = subprocess.run([zr, "sample", d, "--prompt_ids", ",".join(map(str, prompt)), "--max_new_tokens", str(n),
                        "--ids", "--device", device], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"zerorun sample failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    sys.stderr.write(r.stderr)
    return [int(x) for x in r.stdout.split()]


def main():
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--zerorun", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="")
    ap.add_argument("--new", type=int, default=20)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda" if args.device == "cuda" and torch.cuda.is_available() else "cpu"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {dev}")
    zr, ok = args.zerorun, True
    prompt = [5, 17, 3, 42, 8]
    todo = [(name, hc) for name, hc, _d, _s in cases() if hc["model_type"] != "gemma3"]
    todo.append(("gpt2", {"model_type": "gpt2", "vocab_size": 96, "n_positions": 32, "n_embd": 48, "n_layer": 2,
                          "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                          "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}))
    with tempfile.TemporaryDirectory() as work:
        for i, (name, hc) in enumerate(todo):
            if args.only and args.only not in name:
                continue
            try:
                hc = copy.deepcopy(hc)
                mt = hc.pop("model_type")
                for k in ("architectures", "transformers_version", "torch_dtype", "dtype"):
                    hc.pop(k, None)
                hc["tie_word_embeddings"] = False
                conf = transformers.AutoConfig.for_model(mt, **hc)
                torch.manual_seed(200 + i)
                m = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager",
                                                                  dtype=torch.float32)
                d = os.path.join(work, f"hf{i}")
                m.save_pretrained(d)
                tok = small_tokenizer(transformers, conf.vocab_size)
                tok.save_pretrained(d)
                m = m.to(dev).eval()
                with torch.no_grad():
                    out = m.generate(torch.tensor([prompt], device=dev), do_sample=False, max_new_tokens=args.new,
                                     output_scores=True, return_dict_in_generate=True)
                ref = out.sequences[0, len(prompt):].tolist()
                gaps = [float(torch.topk(s[0].float(), 2).values.diff().abs()) for s in out.scores]
                for zdev in ("cuda", "cpu") if args.device == "cuda" else ("cpu",):
                    ours = zerorun_ids(zr, d, prompt, args.new, zdev)
                    good = ours == ref
                    note = ""
                    if not good:
                        k = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
                        tie = k < len(gaps) and gaps[k] < 1e-4 and ours[:k] == ref[:k]
                        note = f" (first difference at {k}, transformers' top-2 gap there {gaps[k] if k < len(gaps) else float('nan'):.1e}{': a tie' if tie else ''})"
                        good = tie
                    print(f"{name} [zerorun on {zdev}]: transformers {ref}, zerorun {ours}{note} -> "
                          f"{'PASS' if good else 'FAIL'}")
                    ok &= good
                # Text in, text out through the saved tokenizer (one whose ids fit the model's vocabulary):
                # zerorun prints the prompt and its continuation as transformers decodes its greedy generation.
                text = "zerorun trains"
                p_ids = tok(text).input_ids
                with torch.no_grad():
                    gen = m.generate(torch.tensor([p_ids], device=dev), do_sample=False, max_new_tokens=8)
                new = gen[0, len(p_ids):].tolist()
                eos = m.generation_config.eos_token_id
                eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
                new = new[:next((j for j, x in enumerate(new) if x in eos), len(new))]  # zerorun prints no EOS
                want = text + tok.decode(new, skip_special_tokens=True)
                r = subprocess.run([zr, "sample", d, "--prompt", text, "--max_new_tokens", "8",
                                    "--device", args.device if dev == "cuda" else "cpu"], capture_output=True,
                                   text=True)
                got = r.stdout.rstrip("\n")
                good = r.returncode == 0 and got == want
                print(f"{name}: sample --prompt {text!r} -> exit {r.returncode}: {got!r}, transformers {want!r} -> "
                      f"{'PASS' if good else 'FAIL'}{'' if r.returncode == 0 else chr(10) + r.stderr[-600:]}")
                ok &= good
            except Exception as e:  # noqa: BLE001 - report every case
                print(f"{name}: FAIL: {e}")
                ok = False
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
