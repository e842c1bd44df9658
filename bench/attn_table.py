# Prints the same-call tables of bench/attn_device.sh from bench/torch_sdpa.py's and zerorun_attn_probe's JSON lines:
# per shape zerorun's defaults (or a run's candidates) against SDPA (fwd+bwd ratio: SDPA / zerorun; grouped-query
# shapes with the split backward, the backend's default), the best of the swept forward tilings and backward
# variants (and the ratio they would give), and every variant's time and largest difference.
# Usage: python3 bench/attn_table.py sdpa.jsonl probe.jsonl [more probe runs...]
import json
import sys


def rows(path):
    out = []
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def key(r):
    return (r["B"], r["H"], r["K"], r["T"], r["D"])


def table(probe, ref, title):
    print("== %s: B,H,K,T,D[ w c d] | zr fwd | sdpa fwd | zr bwd ((s): split) | det | sdpa bwd | ratio | best -> ratio"
          % title)
    fwd, bwd, split = {}, {}, {}
    for r in probe:
        k = key(r) + (r.get("window", 0), r.get("softcap", 0), r.get("doc", 0))
        if r["probe"] == "zerorun tc attention fwd":
            fwd.setdefault(k, []).append((r["tiling"], r["ms"], r["max_diff_vs_0"]))
        elif r["probe"] == "zerorun tc attention bwd" and "split" in r["kernels"]:
            split.setdefault(k, []).append((r.get("variant", 0), r["ms"], r["max_rel_diff_vs_two_kernel"]))
        elif r["probe"] == "zerorun tc attention bwd" and r["kernels"].startswith("one"):
            bwd.setdefault(k, []).append((r["variant"], r["ms"], r["max_rel_diff_vs_two_kernel"]))
    for r in probe:
        if r["probe"] != "zerorun tc attention":
            continue
        k = key(r) + (r.get("window", 0), r.get("softcap", 0), r.get("doc", 0))
        s = ref.get(key(r)) if k[5:] == (0, 0, 0) else None
        zb = r["bwd_ms"]
        sp = split.get(k, [])
        sp0 = [m for v, m, _ in sp if v == 0]
        if sp0:
            zb = sp0[0]
        name = ",".join(str(x) for x in k[:5]) + ("" if k[5:] == (0, 0, 0) else " w%d c%g d%d" % k[5:])
        line = "%-22s | %.4f | %s | %.4f%s | %.4f | %s" % (
            name, r["fwd_ms"], "%.4f" % s["fwd_ms"] if s else "  -   ", zb, " (s)" if sp0 else "", r["bwd_det_ms"],
            "%.4f" % s["bwd_ms"] if s else "  -   ")
        line += " | diff %.2g" % r["bwd_paths_rel_diff"]
        if s:
            line += " | %.3f" % ((s["fwd_ms"] + s["bwd_ms"]) / (r["fwd_ms"] + zb))
            bf = min(fwd.get(k, [(0, r["fwd_ms"], 0)]), key=lambda x: x[1])
            cands = [(v, m) for v, m, d in bwd.get(k, []) if d < 0.02] + [("s%d" % v, m) for v, m, d in sp if d < 0.02]
            bb = min(cands, key=lambda x: x[1]) if cands else (0, zb)
            line += " | f%s b%s -> %.3f" % (bf[0], bb[0], (s["fwd_ms"] + s["bwd_ms"]) / (bf[1] + bb[1]))
        print(line)
    for k in sorted(set(fwd) | set(bwd) | set(split)):
        name = ",".join(str(x) for x in k[:5]) + ("" if k[5:] == (0, 0, 0) else " w%d c%g d%d" % k[5:])
        for what, d in (("fwd", fwd), ("bwd", bwd), ("split", split)):
            if k in d:
                print(" %s %s: %s" % (name, what, "  ".join("%d:%.4f(%.1g)" % x for x in d[k])))


ref = {key(r): r for r in rows(sys.argv[1])}
for path in sys.argv[2:]:
    table(rows(path), ref, path.rsplit("/", 1)[-1])
