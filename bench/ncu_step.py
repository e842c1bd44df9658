# Kernel-time breakdown of one training step from an ncu CSV
# (ncu --metrics gpu__time_duration.sum --csv --page raw ...; see bench/ncu_step.sh):
# the kernels between two consecutive AdamW kernels (the step's last kernel) grouped by
# name, with total time, calls and share of the step's kernel time.
# Usage: python3 bench/ncu_step.py ncu.csv [TOP]
import csv
import re
import sys
from collections import defaultdict

rows = list(csv.reader(open(sys.argv[1])))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[hdr]
name_c, t_c = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
unit = rows[hdr + 1][t_c]
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
ks = []
for r in rows[hdr + 2:]:
    if len(r) <= max(name_c, t_c):
        continue
    try:
        ks.append((r[name_c], float(r[t_c].replace(",", "")) * scale))
    except ValueError:
        pass
adam = [i for i, (n, _) in enumerate(ks) if "k_adam" in n]
if len(adam) < 2:
    sys.exit(f"need two AdamW kernels in the capture, found {len(adam)} of {len(ks)} kernels")
step = ks[adam[-2] + 1:adam[-1] + 1]


def short(n):
    n = re.sub(r"(\(anonymous namespace\)|\w+)::", "", n)
    if n.startswith("void "):
        n = n[5:]
    depth = 0
    for i, ch in enumerate(n):  # cut the argument list (the first '(' outside template brackets)
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            n = n[:i]
            break
    return n[:70]


g = defaultdict(lambda: [0.0, 0])
for n, t in step:
    g[short(n)][0] += t
    g[short(n)][1] += 1
total = sum(t for _, t in step)
print(f"one step: {len(step)} kernels, {total / 1e3:.2f} ms of kernel time")
print(f"{'kernel':70s} {'total us':>10s} {'calls':>6s} {'us/call':>9s} {'share':>7s}")
for n, (t, c) in sorted(g.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"{n:70s} {t:10.1f} {c:6d} {t / c:9.1f} {100 * t / total:6.1f}%")
