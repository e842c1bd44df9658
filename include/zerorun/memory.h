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

// Process-wide counters (one rank per process), host and device memory apart.
MemStats mem_stats(bool device = false);
void mem_reset_peaks();
void mem_record(MemCategory c, int64_t delta_bytes, bool device = false);
// Host buffers of 1 MiB and more come from the system and go back to it when freed (glibc: a fixed mmap
// threshold), so buffers freed every step do not stay resident; called by the Engine before it allocates.
void return_large_host_blocks();

enum class DeviceKind : uint8_t { CPU, CUDA };
struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::CUDA, i}; }
};

// RAII block of memory, zero-initialised: 64-byte aligned host memory, or
// device memory from the CUDA caching allocator.
class HostBuffer {
 public:
  HostBuffer() = default;
  // zero: fill with zeros; else leave uninitialised (filled with 0xFF bytes, NaN, when the
  // environment sets ZERORUN_POISON_UNINIT=1, as the tests do, so a read-before-write shows).
  HostBuffer(size_t bytes, MemCategory cat, Device dev = Device::cpu(), bool zero = true);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return cat_; }
  Device device() const { return dev_; }
  // Host memory only: page-locks it for direct copies to and from GPUs (undone when freed). False with the
  // reason in *why where it cannot be pinned.
  bool pin(std::string* why);
  bool pinned() const { return pinned_; }

 private:
  void* ptr_ = nullptr;
  Device dev_;
  size_t bytes_ = 0;
  MemCategory cat_ = MemCategory::Buffers;
  bool pinned_ = false;
};

}  // namespace zerorun
