// Aligned host allocation and the per-category memory counters.
#include "zerorun/memory.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "zerorun/device_memory.h"
#include "zerorun/error.h"
#include "zerorun/knobs.h"
#include "zerorun/platform.h"

namespace zerorun {
namespace {
std::mutex g_mu;
MemStats g_stats, g_dev_stats;
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

MemStats mem_stats(bool device) {
  std::lock_guard<std::mutex> lk(g_mu);
  return device ? g_dev_stats : g_stats;
}

void mem_reset_peaks() {
  std::lock_guard<std::mutex> lk(g_mu);
  for (MemStats* s : {&g_stats, &g_dev_stats}) {
    s->peak = s->current;
    s->total_peak = s->total_current;
  }
}

void mem_record(MemCategory c, int64_t delta, bool device) {
  std::lock_guard<std::mutex> lk(g_mu);
  MemStats& s = device ? g_dev_stats : g_stats;
  auto i = static_cast<size_t>(c);
  s.current[i] += delta;
  if (s.current[i] > s.peak[i]) s.peak[i] = s.current[i];
  s.total_current += delta;
  if (s.total_current > s.total_peak) s.total_peak = s.total_current;
}

namespace {
bool poison_uninit() {
  static const bool on = knobs().poison_uninit;
  return on;
}
}  // namespace

HostBuffer::HostBuffer(size_t bytes, MemCategory cat, Device dev, bool zero) : dev_(dev), bytes_(bytes), cat_(cat) {
  if (dev.is_cuda()) {
    ptr_ = cuda::device_alloc(bytes, dev.index, mem_category_name(cat));
    if (zero)
      cuda::device_memset0(ptr_, bytes);
    else if (poison_uninit())
      cuda::device_fill_ff(ptr_, bytes);
    mem_record(cat_, static_cast<int64_t>(bytes_), true);
    return;
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  ptr_ = platform::aligned_alloc(64, rounded);
  if (!ptr_) ZR_FAIL("out of host memory allocating ", bytes, " bytes for ", mem_category_name(cat));
  if (zero || poison_uninit()) std::memset(ptr_, zero ? 0 : 0xFF, rounded);
  mem_record(cat_, static_cast<int64_t>(bytes_));
}

HostBuffer::~HostBuffer() {
  if (!ptr_) return;
  if (dev_.is_cuda()) {
    cuda::device_free(ptr_, bytes_, dev_.index);
    mem_record(cat_, -static_cast<int64_t>(bytes_), true);
    return;
  }
  if (pinned_) cuda::host_unregister(ptr_);
  platform::aligned_free(ptr_);
  mem_record(cat_, -static_cast<int64_t>(bytes_));
}

bool HostBuffer::pin(std::string* why) {
  if (pinned_) return true;
  if (!ptr_ || dev_.is_cuda()) {
    if (why) *why = "not host memory";
    return false;
  }
  pinned_ = cuda::host_register(ptr_, bytes_, why);
  return pinned_;
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : ptr_(o.ptr_), dev_(o.dev_), bytes_(o.bytes_), cat_(o.cat_), pinned_(o.pinned_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
  o.pinned_ = false;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    this->~HostBuffer();
    ptr_ = o.ptr_;
    dev_ = o.dev_;
    bytes_ = o.bytes_;
    cat_ = o.cat_;
    pinned_ = o.pinned_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
    o.pinned_ = false;
  }
  return *this;
}

}  // namespace zerorun
