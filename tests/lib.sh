# Shared helpers for the shell test scripts (sourced): pass/fail counting,
# per-step losses from metrics.jsonl, and a weights comparison.
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   - $1"; }
bad() { fail=$((fail + 1)); echo "FAIL - $1"; }
PY=$(command -v /usr/bin/python3 || command -v python3)
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
losses() { sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' "$1/metrics.jsonl"; }
# Largest |a-b| / max(1, |b|) over all tensors of two f32 safetensors files (stdlib only): allclose with
# atol = rtol; "0" means bitwise-equal data. (Elements with an exactly-zero true gradient, like GPT-2's key
# bias, drift by Adam-amplified rounding noise of ~1e-6 absolute, so a pure relative bound would be
# meaningless there.) Prints "keys-differ" when the tensor names differ.
wdiff() {
  "$PY" - "$1" "$2" <<'PY'
import json, struct, sys
from array import array
def load(p):
    b = open(p, "rb").read()
    (n,) = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    out = {}
    for k, e in h.items():
        s, t = e["data_offsets"]; a = array("f"); a.frombytes(b[8 + n + s:8 + n + t]); out[k] = a
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if a.keys() != b.keys(): print("keys-differ"); sys.exit()
print("%.3g" % max(abs(x - y) / max(1.0, abs(y)) for k in a for x, y in zip(a[k], b[k])))
PY
}
# Worst relative per-step loss difference between two log dirs.
loss_diff() {
  paste <(losses "$1") <(losses "$2") | awk 'BEGIN{w=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d} END{printf "%.3g", w}'
}
