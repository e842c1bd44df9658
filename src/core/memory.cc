// Aligned host allocation and the per-category memory counters.
#include "zerorun/memory.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "zerorun/error.h"

namespace zerorun {
namespace {
std::mutex g_mu;
MemStats g_stats;
}  // namespace

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Params:
      return "params";
    case MemCategory::Grads:
      return "grads";
    case MemCategory::Optimizer:
      return "optimizer";
    case MemCategory::Activations:
      return "activations";
    case MemCategory::Buffers:
      return "buffers";
    default:
      return "?";
  }
}

MemStats mem_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_stats;
}

void mem_reset_peaks() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_stats.peak = g_stats.current;
  g_stats.total_peak = g_stats.total_current;
}

void mem_record(MemCategory c, int64_t delta) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto i = static_cast<size_t>(c);
  g_stats.current[i] += delta;
  if (g_stats.current[i] > g_stats.peak[i]) g_stats.peak[i] = g_stats.current[i];
  g_stats.total_current += delta;
  if (g_stats.total_current > g_stats.total_peak) g_stats.total_peak = g_stats.total_current;
}

HostBuffer::HostBuffer(size_t bytes, MemCategory cat) : bytes_(bytes), cat_(cat) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  ptr_ = std::aligned_alloc(64, rounded);
  if (!ptr_) ZR_FAIL("out of host memory allocating ", bytes, " bytes for ", mem_category_name(cat));
  std::memset(ptr_, 0, rounded);
  mem_record(cat_, static_cast<int64_t>(bytes_));
}

HostBuffer::~HostBuffer() {
  if (ptr_) {
    std::free(ptr_);
    mem_record(cat_, -static_cast<int64_t>(bytes_));
  }
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), cat_(o.cat_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    this->~HostBuffer();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    cat_ = o.cat_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

}  // namespace zerorun
