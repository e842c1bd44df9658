// Name -> op table. Explicit (no static-initialiser registration) so that
// linking the static library never drops an op.
#include <map>

#include "op_util.h"

namespace zerorun {
namespace {
const std::map<std::string, std::unique_ptr<Op>>& table() {
  static const auto* t = [] {
    auto* m = new std::map<std::string, std::unique_ptr<Op>>();
    (*m)["linear"] = ops::make_linear();
    (*m)["matmul"] = ops::make_matmul();
    (*m)["add"] = ops::make_add();
    (*m)["mul"] = ops::make_mul();
    (*m)["gelu"] = ops::make_gelu();
    (*m)["relu"] = ops::make_relu();
    (*m)["silu"] = ops::make_silu();
    (*m)["swiglu"] = ops::make_swiglu();
    (*m)["geglu"] = ops::make_geglu();
    (*m)["scale"] = ops::make_scale();
    (*m)["softcap"] = ops::make_softcap();
    (*m)["dropout"] = ops::make_dropout();
    (*m)["qk_norm"] = ops::make_qk_norm();
    (*m)["layernorm"] = ops::make_layernorm();
    (*m)["rmsnorm"] = ops::make_rmsnorm();
    (*m)["attention"] = ops::make_attention();
    (*m)["rope"] = ops::make_rope();
    (*m)["embedding"] = ops::make_embedding();
    (*m)["cross_entropy"] = ops::make_cross_entropy();
    (*m)["mse"] = ops::make_mse();
    return m;
  }();
  return *t;
}
}  // namespace

const Op& op_lookup(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (auto& [k, v] : table()) known += (known.empty() ? "" : ", ") + k;
    ZR_FAIL("unknown op '", name, "' (known ops: ", known, ")");
  }
  return *it->second;
}

std::vector<std::string> op_names() {
  std::vector<std::string> r;
  for (auto& [k, v] : table()) r.push_back(k);
  return r;
}

}  // namespace zerorun
