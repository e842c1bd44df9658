// Host memory with per-category byte accounting (params, grads, optimizer,
// activations, buffers): every allocation is tagged so the engine can print
// and tests can assert how much each ZeRO stage keeps per rank.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zerorun {

enum class MemCategory : uint8_t { Params, Grads, Optimizer, Activations, Buffers, Count };
const char* mem_category_name(MemCategory c);

struct MemStats {
  std::array<int64_t, static_cast<size_t>(MemCategory::Count)> current{};
  std::array<int64_t, static_cast<size_t>(MemCategory::Count)> peak{};
  int64_t total_current = 0, total_peak = 0;
};

// Process-wide counters (one rank per process).
MemStats mem_stats();
void mem_reset_peaks();
void mem_record(MemCategory c, int64_t delta_bytes);

// RAII block of 64-byte aligned host memory, zero-initialised.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(size_t bytes, MemCategory cat);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return cat_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemCategory cat_ = MemCategory::Buffers;
};

}  // namespace zerorun
