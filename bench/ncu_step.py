# Kernel-time breakdown of one training step from an ncu CSV
# (ncu --metrics gpu__time_duration.sum --csv --page raw ...; see bench/ncu_step.sh):
# the kernels between two consecutive AdamW kernels (the step's last kernel) grouped by
# name, with total time, calls and share of the step's kernel time; with dram__bytes_read.sum and
# dram__bytes_write.sum in the CSV (bench/ncu_step.sh with DRAM=1) also each group's DRAM traffic and bandwidth.
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
byte_unit = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
dram_c = [cols.index(m) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum") if m in cols]
dram_s = [byte_unit.get(rows[hdr + 1][c], 1.0) for c in dram_c]
ks = []
for r in rows[hdr + 2:]:
    if len(r) <= max([name_c, t_c] + dram_c):
        continue
    try:
        b = [float(r[c].replace(",", "")) * s for c, s in zip(dram_c, dram_s)]
        ks.append((r[name_c], float(r[t_c].replace(",", "")) * scale, b))
    except ValueError:
        pass
# A step ends with its update: the last of a run of AdamW kernels (one kernel, or with the update overlapping the
# next forward, the default on one GPU, one a block, which ncu's serialised replay runs back to back).
adam = [i for i, (n, _, _) in enumerate(ks) if "k_adam" in n]
ends = [i for k, i in enumerate(adam) if k + 1 == len(adam) or adam[k + 1] != i + 1]
if len(ends) < 2:
    sys.exit(f"need two steps' AdamW kernels in the capture, found {len(ends)} run(s) in {len(ks)} kernels")
step = ks[ends[-2] + 1:ends[-1] + 1]


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


g = defaultdict(lambda: [0.0, 0, 0.0, 0.0])
for n, t, b in step:
    e = g[short(n)]
    e[0] += t
    e[1] += 1
    if len(b) == 2:
        e[2] += b[0]
        e[3] += b[1]
total = sum(t for _, t, _ in step)
dram = len(dram_c) == 2
print(f"one step: {len(step)} kernels, {total / 1e3:.2f} ms of kernel time")
print(f"{'kernel':70s} {'total us':>10s} {'calls':>6s} {'us/call':>9s} {'share':>7s}" +
      (f" {'MB read':>9s} {'MB write':>9s} {'TB/s':>6s}" if dram else ""))
for n, (t, c, rd, wr) in sorted(g.items(), key=lambda kv: -kv[1][0])[:top]:
    line = f"{n:70s} {t:10.1f} {c:6d} {t / c:9.1f} {100 * t / total:6.1f}%"
    if dram:
        line += f" {rd / 1e6:9.1f} {wr / 1e6:9.1f} {(rd + wr) / (t * 1e6):6.2f}"
    print(line)
