// Fingerprints of config, model and data, compared across ranks at start (see rank_agreement.h).
#include "zerorun/rank_agreement.h"

#include <algorithm>
#include <cstring>

#include "zerorun/error.h"
#include "zerorun/safetensors.h"

namespace zerorun {

uint64_t model_fingerprint(const Model& m) {
  uint64_t h = fnv1a(m.graph_hash.data(), m.graph_hash.size());
  if (m.tensors.empty() && m.file) {
    // An opened model.bin (never read whole): its header (names, dtypes, shapes, offsets) and 64 evenly spaced
    // pieces of 256 stored bytes of every tensor.
    for (const SafetensorsEntry& e : m.file->entries) {
      h = fnv1a(e.name.data(), e.name.size(), h);
      const uint64_t meta[] = {static_cast<uint64_t>(e.dtype), e.begin, e.end};
      h = fnv1a(meta, sizeof meta, h);
      for (int64_t d : e.shape) h = fnv1a(&d, sizeof d, h);
      const int64_t es = static_cast<int64_t>(dtype_size(e.dtype)), n = shape_numel(e.shape);
      const int64_t piece = std::min<int64_t>(n, 256 / es);
      unsigned char buf[256];
      for (int k = 0; k < 64 && piece > 0; ++k) {
        const int64_t at = (n - piece) * k / 63;
        read_safetensors_range(*m.file, e, at, piece, buf);
        h = fnv1a(buf, static_cast<size_t>(piece * es), h);
      }
    }
    return h;
  }
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
