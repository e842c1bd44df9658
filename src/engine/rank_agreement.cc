// Fingerprints of config, model and data, compared across ranks at start (see rank_agreement.h).
#include "zerorun/rank_agreement.h"

#include <cstring>

#include "zerorun/error.h"

namespace zerorun {

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t model_fingerprint(const Model& m) {
  uint64_t h = fnv1a(m.graph_hash.data(), m.graph_hash.size());
  for (const auto& [name, t] : m.tensors) {
    h = fnv1a(name.data(), name.size(), h);
    for (int64_t d : t.shape()) h = fnv1a(&d, sizeof d, h);
    const auto* bytes = static_cast<const unsigned char*>(t.raw());
    const size_t esz = dtype_size(t.dtype());
    for (int64_t i = 0; i < t.numel(); i += 997) h = fnv1a(bytes + static_cast<size_t>(i) * esz, esz, h);
  }
  return h;
}

void require_same_on_all_ranks(Communicator& comm, const std::vector<Fingerprint>& items) {
  const int W = comm.size();
  if (W < 2 || items.empty()) return;
  const size_t k = items.size();
  std::vector<uint64_t> mine(k), all(k * static_cast<size_t>(W));
  for (size_t i = 0; i < k; ++i) mine[i] = items[i].value;
  comm.all_gather(mine.data(), all.data(), static_cast<int64_t>(2 * k), DType::I32);  // 64-bit words as pairs
  std::string msg;
  for (size_t i = 0; i < k; ++i) {
    std::vector<int> differ;
    for (int r = 1; r < W; ++r)
      if (all[static_cast<size_t>(r) * k + i] != all[i]) differ.push_back(r);
    if (differ.empty()) continue;
    std::string ranks;
    for (size_t j = 0; j < differ.size() && j < 8; ++j) ranks += (j ? ", " : "") + std::to_string(differ[j]);
    if (differ.size() > 8) ranks += " and " + std::to_string(differ.size() - 8) + " more";
    msg += std::string(msg.empty() ? "" : "; ") + items[i].what + " on rank" + (differ.size() > 1 ? "s " : " ") +
           ranks + " differs from rank 0's";
  }
  ZR_CHECK(msg.empty(), "the ranks do not train the same job: ", msg,
           " (every node needs the same files; the fingerprint covers content, not paths)");
}

}  // namespace zerorun
