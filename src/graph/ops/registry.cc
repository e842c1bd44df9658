// Name -> op table, from the list in op_list.h. Explicit (no static-initialiser registration) so that
// linking the static library never drops an op.
#include <map>

#include "op_util.h"

namespace zerorun {
namespace {
const std::map<std::string, std::unique_ptr<Op>>& table() {
  static const auto* t = [] {
    auto* m = new std::map<std::string, std::unique_ptr<Op>>();
#define ZR_OP(name) (*m)[#name] = ops::make_##name();
#include "op_list.h"
#undef ZR_OP
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
