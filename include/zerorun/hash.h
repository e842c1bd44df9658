// FNV-1a, the 64-bit fingerprint hash of rank agreement (config, model, data: src/engine/rank_agreement.cc) and of
// the data sources' contents (src/data). In core so that both layers reach it without data including the engine.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zerorun {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
// The hash of n bytes at data continuing from h (kFnvOffset: a new hash).
uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset);

}  // namespace zerorun
