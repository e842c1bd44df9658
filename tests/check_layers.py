#!/usr/bin/env python3
# Layer check (ctest layer_check): every #include "..." in src/, kernels/ and include/ must point down the layers of
# shared/DESIGN.md (core -> kernels -> graph -> zero/comm -> engine -> cli). The table of allowed dependencies is
# written out once, here; README's "Layers" section points to it (`check_layers.py --table` prints it).
# Exit 0: clean; 1: violations, each printed as "file:line: layer -> layer (include)"; 2: a file or public header
# the table does not place (add it below).
import os
import re
import sys

# Layer -> the layers its files may include (its own always). Written transitively closed, so the order is read off
# the table itself; check_table() below proves it acyclic and closed.
ALLOWED = {
    "core": [],
    "kernels": ["core"],  # kernels/*.h: what both backends share (Backend, kernel types, counter RNG, optimizer math)
    "kernels/cpu": ["core", "kernels"],
    # The CUDA kernels take the CPU kernels' option structs (AttnDims, RopeFreqs, Unary) through cpu_kernels.h.
    "kernels/cuda": ["core", "kernels", "kernels/cpu"],
    "kernels/stub": ["core", "kernels"],  # a build without CUDA links these instead of kernels/cuda
    "kernels/blas_builtin": ["core"],
    "graph": ["core", "kernels", "kernels/cpu", "kernels/cuda"],
    "config": ["core"],
    "model": ["core", "kernels", "kernels/cpu", "kernels/cuda", "graph", "config"],
    "comm": ["core", "kernels", "kernels/cpu", "kernels/cuda", "config"],
    "zero": ["core", "kernels", "kernels/cpu", "kernels/cuda", "config", "comm"],
    "optim": ["core", "kernels", "kernels/cpu", "kernels/cuda", "config", "comm", "zero"],
    "data": ["core", "kernels", "kernels/cpu", "kernels/cuda", "graph", "config", "model", "comm"],
    "checkpoint": ["core", "kernels", "kernels/cpu", "kernels/cuda", "graph", "config", "model", "comm", "zero",
                   "optim", "data"],
    "engine": ["core", "kernels", "kernels/cpu", "kernels/cuda", "graph", "config", "model", "comm", "zero", "optim",
               "data", "checkpoint"],
    "infer": ["core", "kernels", "kernels/cpu", "kernels/cuda", "graph", "config", "model", "comm", "zero", "optim",
              "data", "checkpoint"],
    "launch": ["core", "kernels", "kernels/cpu", "kernels/cuda", "config", "comm"],
    "cli": ["core", "kernels", "kernels/cpu", "kernels/cuda", "graph", "config", "model", "comm", "zero", "optim",
            "data", "checkpoint", "engine", "infer", "launch"],
}

# Source directories -> layer (the longest matching prefix wins).
DIRS = {
    "src/core": "core",
    "kernels": "kernels",
    "kernels/cpu": "kernels/cpu",
    "kernels/cuda": "kernels/cuda",
    "kernels/stub": "kernels/stub",
    "kernels/blas_builtin": "kernels/blas_builtin",
    "src/graph": "graph",
    "src/config": "config",
    "src/model": "model",
    "src/comm": "comm",
    "src/zero": "zero",
    "src/optim": "optim",
    "src/data": "data",
    "src/checkpoint": "checkpoint",
    "src/engine": "engine",
    "src/infer": "infer",
    "src/launch": "launch",
    "src/cli": "cli",
}

# Public headers (include/zerorun/) -> the layer that implements them.
HEADERS = {
    "core": ["build_info", "device_memory", "dtype", "error", "fsutil", "hash", "knobs", "memory", "platform",
             "profile", "rng", "tensor"],
    "kernels": ["cuda_rt"],
    "graph": ["graph"],
    "config": ["config", "strict_json", "aio_config"],
    "model": ["model", "safetensors", "hf_arch", "hf_layout"],
    "comm": ["comm", "watchdog", "rank_status", "msmpi"],
    "zero": ["zero_plan", "nvme", "zero_state"],
    "optim": ["optim"],
    "data": ["data", "tokenizer", "jinja"],
    "checkpoint": ["checkpoint", "merge"],
    "engine": ["engine", "trainer", "estimate", "rank_agreement", "stop_signal"],
    "infer": ["sample"],
    "launch": ["launch"],
}

# Includes that point the wrong way today, each with the issue that removes it. Keep this list short.
EXCEPTIONS = {
    # Today's wrong-way includes, removed one by one by the commits that fix them (issue 33 item 2).
}

SCANNED = ("src", "kernels", "include")
SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def check_table():
    errors = []
    for layer, deps in ALLOWED.items():
        for d in deps:
            if d not in ALLOWED:
                errors.append(f"table: {layer} allows unknown layer {d}")
            elif layer in ALLOWED[d]:
                errors.append(f"table: {layer} and {d} allow each other (a cycle)")
            else:
                missing = [x for x in ALLOWED[d] if x not in deps]
                if missing:
                    errors.append(f"table: {layer} allows {d} but not what {d} allows: {', '.join(missing)}")
    for layer in list(HEADERS) + list(DIRS.values()):
        if layer not in ALLOWED:
            errors.append(f"table: unknown layer {layer}")
    return errors


def layer_of(root, rel):
    """The layer of a repository path, or None if the table does not place it."""
    if rel.startswith("include/zerorun/"):
        name = os.path.splitext(rel[len("include/zerorun/"):])[0]
        for layer, names in HEADERS.items():
            if name in names:
                return layer
        return None
    best = None
    for prefix, layer in DIRS.items():
        if (rel.startswith(prefix + "/")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def resolve(root, rel_file, inc):
    """The repository path an include names: next to the file, then from the root, then from include/."""
    here = os.path.normpath(os.path.join(os.path.dirname(rel_file), inc))
    for cand in (here, os.path.normpath(inc), os.path.normpath(os.path.join("include", inc))):
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def scan(root):
    """(unplaced files, wrong-way includes, exceptions used) of the tree at root."""
    unplaced, wrong, used = [], [], set()
    for top in SCANNED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                src_layer = layer_of(root, rel)
                if src_layer is None:
                    unplaced.append(f"{rel}: not placed in a layer (tests/check_layers.py DIRS / HEADERS)")
                    continue
                with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        target = resolve(root, rel, m.group(1))
                        if target is None:
                            continue  # a generated or system header
                        target = target.replace(os.sep, "/")
                        dst_layer = layer_of(root, target)
                        if dst_layer is None:
                            unplaced.append(f"{rel}:{n}: includes {target}, which no layer holds")
                            continue
                        if dst_layer == src_layer or dst_layer in ALLOWED[src_layer]:
                            continue
                        key = (rel, target)
                        if key in EXCEPTIONS:
                            used.add(key)
                            continue
                        wrong.append(f"{rel}:{n}: {src_layer} -> {dst_layer} ({target})")
    # A public header's implementation (a file of the same name that includes it) lives in the header's layer.
    for top in ("src", "kernels"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                stem, ext = os.path.splitext(f)
                header_path = os.path.join(root, "include/zerorun", stem + ".h")
                if ext not in (".cc", ".cpp", ".cu") or not os.path.isfile(header_path):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                header = "include/zerorun/" + stem + ".h"
                with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                    if f'#include "zerorun/{stem}.h"' not in fh.read():
                        continue  # a file of the same name that does not implement the header (kernels/cpu/optim.cc)
                impl_layer, header_layer = layer_of(root, rel), layer_of(root, header)
                if impl_layer and header_layer and impl_layer != header_layer:
                    if (rel, header) in EXCEPTIONS:
                        used.add((rel, header))
                    else:
                        wrong.append(f"{rel}: implements {header} ({header_layer}) from {impl_layer}")
    return unplaced, wrong, used


def self_test():
    """The check fails on a tree with a wrong-way include (core including engine) and passes without it."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        for d in ("src/core", "src/engine", "include/zerorun"):
            os.makedirs(os.path.join(root, d))
        for path, text in (("include/zerorun/engine.h", ""), ("include/zerorun/error.h", ""),
                           ("src/engine/engine.cc", '#include "zerorun/engine.h"\n#include "zerorun/error.h"\n'),
                           ("src/core/dtype.cc", '#include "zerorun/error.h"\n  #  include "zerorun/engine.h"\n')):
            with open(os.path.join(root, path), "w") as fh:
                fh.write(text)
        unplaced, wrong, _ = scan(root)
        ok = not unplaced and wrong == ["src/core/dtype.cc:2: core -> engine (include/zerorun/engine.h)"]
        os.remove(os.path.join(root, "src/core/dtype.cc"))
        ok = ok and scan(root)[:2] == ([], [])
    print("self-test", "ok" if ok else f"FAILED: {unplaced} {wrong}")
    return ok


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--table" in sys.argv:
        for layer, deps in ALLOWED.items():
            print(f"{layer:22} may include {', '.join(deps) if deps else '(nothing but itself)'}")
        return 0
    errors = check_table()
    if not self_test():
        return 2
    unplaced, wrong, used = scan(root)
    stale = [f"exception no longer needed: {a} -> {b}" for (a, b) in EXCEPTIONS if (a, b) not in used]
    for e in errors + unplaced + wrong + stale:
        print(e)
    if errors or unplaced:
        return 2
    if wrong or stale:
        print(f"{len(wrong)} include(s) point the wrong way; the allowed dependencies: tests/check_layers.py --table")
        return 1
    print(f"layers ok ({sum(1 for _ in ALLOWED)} layers, {len(EXCEPTIONS)} listed exception(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
